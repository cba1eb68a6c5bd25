"""The admin's side of jobs.operations: the one confirmation page every operator action shows (count
preview, what it pays, a required reason) and the message after it, shared by the jobs, orders and dead
letter admins."""

import uuid

from django.contrib import messages
from django.template.response import TemplateResponse
from django.urls import reverse

from jobs.operations import OperationRefused


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
    default wording does not fit (a replay of chosen deliveries counts deliveries, not jobs)."""
    link = reverse("admin:jobs_operatoraction_change", args=[entry.id])
    if done:
        pass
    elif entry.action == "replay":  # a job replay is counted in deliveries, over the jobs matched
        done = f"{entry.acted} deliveries sent again, over {entry.matched} job{'s' if entry.matched != 1 else ''}"
    else:
        done = f"{entry.acted} of {entry.matched} changed"
    model_admin.message_user(request, f"{entry.get_action_display()}: {done}. Audit row: {link}",
                             messages.SUCCESS if entry.acted else messages.WARNING)


def act_or_refuse(request, act):
    """Run `act()` (a jobs.operations call); an OperationRefused (no reason ...) becomes the page's error
    instead of a 500. Returns (entry, error)."""
    try:
        return act(), ""
    except OperationRefused as exc:
        return None, str(exc)


def is_uuid(value) -> bool:
    """An object id in an admin URL: anything else is a 404, never a database error."""
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True
