"""The admin's side of operators.operations: the one confirmation page every operator action shows (count
preview, what it pays, a required reason) and the message after it, shared by the jobs, orders and dead
letter admins; ActionAdmin, which offers a list's actions from operators.actions (list actions, permission
checks, the confirmation); and the cells of the wide lists (short ids, client names, compact times)."""

import functools
import uuid

from django.contrib import messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from operators import actions as table  # not `actions`: ActionAdmin.actions is the list actions
from operators import operations
from operators.actions import Action
from operators.operations import OperationRefused


def confirm_page(request, admin_site, *, title: str, verb: str, preview, hidden, post_url: str = "",
                 back_url: str = "", back_label: str = "", pays_again: bool = False, skipped_why: str = "",
                 nothing_paid: str = "", reason_error: str = ""):
    """Render the confirmation. `hidden` is a list of (name, value) posted back with it (the action and
    the selection, or nothing when the target is in the URL's query string)."""
    return TemplateResponse(request, "admin/payonce/confirm.html", {
        **admin_site.each_context(request), "title": title, "verb": verb, "preview": preview,
        "hidden": list(hidden), "post_url": post_url or request.get_full_path(), "back_url": back_url,
        "back_label": back_label, "pays_again": pays_again, "skipped_why": skipped_why,
        "nothing_paid": nothing_paid, "reason_error": reason_error, "reason": request.POST.get("reason", ""),
    })


def confirmed(request) -> bool:
    return request.method == "POST" and request.POST.get("confirm") == "yes"


def acted_message(model_admin, request, entry, *, done: str = "") -> None:
    """The message after an action, linking to its audit row. `done` says what changed where the
    default wording does not fit (a replay counts deliveries: operators.actions' `done`)."""
    link = reverse("admin:operators_operatoraction_change", args=[entry.id])
    done = done or f"{entry.acted} of {entry.matched} changed"
    model_admin.message_user(request, f"{entry.get_action_display()}: {done}. Audit row: {link}",
                             messages.SUCCESS if entry.acted else messages.WARNING)


def act_or_refuse(request, act):
    """Run `act()` (a operators.operations call); an OperationRefused (no reason ...) becomes the page's error
    instead of a 500. Returns (entry, error)."""
    try:
        return act(), ""
    except OperationRefused as exc:
        return None, str(exc)


def confirm_or_act(model_admin, request, *, act, preview, back: str, done_url: str = "", done=None, **page):
    """Every operator action's one flow: on a confirmed POST, `act(who=..., reason=...)` (a operators.operations
    call that writes the audit row), its message (`done(entry)`: what changed, where the default wording
    does not fit), and a redirect to `done_url` (else `back`); otherwise, or when the action was refused
    (no reason ...), the confirmation page with `preview()` and the error. `page` is the rest of
    confirm_page's wording (title, verb, hidden, back_label, pays_again ...)."""
    error = ""
    if confirmed(request):
        entry, error = act_or_refuse(request, lambda: act(who=request.user.get_username(),
                                                          reason=request.POST.get("reason", "")))
        if entry is not None:
            acted_message(model_admin, request, entry, done=done(entry) if done else "")
            return redirect(done_url or back)
    return confirm_page(request, model_admin.admin_site, preview=preview(), back_url=back, reason_error=error, **page)


def confirm_action(model_admin, request, action: Action, rows, *, target: str, hidden, back: str,
                   done_url: str = ""):
    """confirm_or_act for an action of operators.actions over `rows`, worded by its row."""
    return confirm_or_act(
        model_admin, request, back=back, done_url=done_url, done=action.done_words,
        act=lambda **who_and_reason: operations.action_take(action, rows=rows, target=target, via="admin",
                                                            **who_and_reason),
        preview=lambda: operations.action_preview(action, rows=rows, target=target),
        title=action.title, verb=action.verb, hidden=hidden, back_label=action.offered_on.capitalize(),
        pays_again=action.pays_again, skipped_why=action.skipped_why, nothing_paid=action.nothing_paid)


@functools.cache
def list_actions(where: str) -> tuple:
    """The Django list actions of the actions offered on `where` (operators.actions), each named as its
    list's form posts it and handing the selection to the admin's act_on_selection."""

    def list_action(action: Action):
        def run(model_admin, request, queryset):
            return model_admin.act_on_selection(request, queryset, action)

        run.__name__ = action.list_action
        run.short_description = action.label
        return run

    return tuple(list_action(action) for action in table.offered_on(where))


class ActionAdmin:
    """A list that offers the actions of operators.actions whose `offered_on` is its own, mixed in before
    admin.ModelAdmin: their list actions, and each offered (and run) only to holders of its permission
    beside the list's view permission (`may`). A subclass says how a selection becomes the action's rows
    and target (act_on_selection) and may add pages of its own that call confirm_action."""

    offered_on = ""

    @property
    def actions(self):
        return list_actions(self.offered_on)

    def offered(self) -> tuple[Action, ...]:
        return table.offered_on(self.offered_on)

    def offered_action(self, name: str) -> Action | None:
        return next((action for action in self.offered() if action.name == name), None)

    def may(self, request, action: Action) -> bool:
        return self.has_view_permission(request) and request.user.has_perm(action.permission)

    def refuse_unless_may(self, request, action: Action) -> None:
        """The confirmation page (GET) as well as the act (POST): both need the permission."""
        if not self.may(request, action):
            opts = self.model._meta
            raise PermissionDenied(f"You need {opts.app_label}.view_{opts.model_name} and {action.permission}")

    def get_actions(self, request):
        # Django's response_action runs only what this returns: an action whose permission the user lacks
        # is neither shown nor run (refuse_unheld_action answers its POST 403).
        held = super().get_actions(request)
        for action in self.offered():
            if not self.may(request, action):
                held.pop(action.list_action, None)
        return held

    def changelist_view(self, request, extra_context=None):
        refuse_unheld_action(self, request)
        return super().changelist_view(request, extra_context)


class RecordAdmin:
    """A record that is read, never written, in the admin (an audit row, a price drift): no add, no change,
    no delete. Mixed in before admin.ModelAdmin."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def refuse_unheld_action(model_admin, request) -> None:
    """A list action posted by a user who does not hold its permission is a 403, not Django's silent list
    page ("no action selected"): nothing is acted either way, and this answer says why."""
    action = request.POST.get("action") if request.method == "POST" else None
    if action and action not in model_admin.get_actions(request):
        opts = model_admin.model._meta
        raise PermissionDenied(f"You need the permission of the action {action!r} on {opts.verbose_name_plural}")


def selection(request, action: str) -> tuple[bool, list[str], list[tuple[str, str]]]:
    """What a list action posted: whether it is "select all" of the filter, the selected ids, and the
    fields the confirmation posts back so the same action runs on the same rows."""
    across = request.POST.get("select_across") == "1"
    selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
    hidden = [("action", action), ("select_across", "1" if across else "0"), ("index", "0")]
    return across, selected, hidden + [(ACTION_CHECKBOX_NAME, ident) for ident in selected]


def describe_filter(params) -> str:
    """A list's filter as the audit row keeps it (status=paid, event=generation.failed, client=...)."""
    return ", ".join(f"{name.removesuffix('__exact').removesuffix('__id')}={value}"
                     for name, value in params.items() if name not in ("o", "p", "_changelist_filters"))


def is_uuid(value) -> bool:
    """An object id in an admin URL: anything else is a 404, never a database error."""
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


# --- the wide lists' cells (jobs, orders): one line a row on a 1366 px laptop screen ----------------------

# The wide lists give the app sidebar's 300 px to their columns (Home, in the breadcrumbs, leads to every
# other page). Their cells are styled by admin/payonce/compact_list.html.
WIDE_LIST = {"is_nav_sidebar_enabled": False}


def short_id(value) -> str:
    """An id's first 8 characters; the whole id in its title (and in the link it sits in)."""
    return format_html('<span class="short-id" title="{}">{}</span>', value, str(value)[:8])


def clipped(text: str, *, title: str = "") -> str:
    """A long name cut to the column's width by the stylesheet, whole in its title."""
    return format_html('<span class="clip" title="{}">{}</span>', title or text, text)


def client_cell(client) -> str:
    """A client by name (its id in the title): two clients may share a name, never an id."""
    return clipped(client.name, title=f"{client.name} ({client.id})")


def compact_time(value) -> str | None:
    """YYYY-MM-DD HH:MM in the admin's time zone, to the second in the title; None shows the list's dash."""
    if value is None:
        return None
    local = timezone.localtime(value)
    return format_html('<time datetime="{}" title="{}">{}</time>', value.isoformat(),
                       f"{local:%Y-%m-%d %H:%M:%S %Z}", f"{local:%Y-%m-%d %H:%M}")
