"""payonce's admin site (docs/operating.md, "The admin"): Django's own, with three things an operator meets
changed. Installed as the `admin` app (PayonceAdminConfig, in INSTALLED_APPS in place of
django.contrib.admin), so `admin.site` and every `admin.register` are this site.

- A refusal (PermissionDenied in an admin view) is an admin page naming the permission the user lacks,
  not the API's JSON 403 (config.urls' handler403 answers every other path, and still does).
- A NUL byte anywhere in an admin request (the path, the query string: a list's search or filter, a bulk
  action's filter; a posted field) is a 400 page before any view runs: PostgreSQL stores no NUL in text,
  and a query carrying one raised a DataError, a 500.
- The index lists what operators use most first: jobs and clients, dead letters, models and prices.

Admin 404s stay as Django answers them (config.urls' handler404: the JSON body of every unknown path):
a missing row is rarely met from the admin's own links, and a 404 says nothing a person needs to act on.
"""

from functools import wraps

from django.contrib.admin import AdminSite
from django.contrib.admin.apps import AdminConfig
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse

# The index's order: the apps operators open most, first (the rest keep Django's alphabetical order after
# them); within an app, its models in this order, then the others.
APP_ORDER = ("jobs", "accounts", "webhooks", "executor", "billing", "orders", "operators")
MODEL_ORDER = {
    "jobs": ("Job",),
    "accounts": ("Client", "ClientAPIKey"),
    "webhooks": ("DeadLetter", "Delivery", "Endpoint"),
    "executor": ("ModelConfig",),
    "billing": ("PriceDrift", "BudgetMonth"),
}


class PayonceAdminSite(AdminSite):
    site_header = "payonce admin"  # not "Django administration": the operator is in payonce's admin
    site_title = "payonce admin"
    index_title = "Jobs, money and deliveries"

    def admin_view(self, view, cacheable=False):
        """Every admin view (the site's and each ModelAdmin's own URLs go through here): a NUL byte is a
        400 page, and a refusal the admin's 403 page; the rest is Django's (login, csrf, no cache)."""
        inner = super().admin_view(view, cacheable)

        @wraps(view)
        def guarded(request, *args, **kwargs):
            if has_nul(request):
                return self.bad_request(request)
            try:
                return inner(request, *args, **kwargs)
            except PermissionDenied as exc:
                return self.refused(request, exc)

        return guarded

    def refused(self, request, exc: PermissionDenied):
        """The admin's 403 page: which permission the user needs (the raise's own words where it says
        them, else the one Django's view checks for this URL), and who to ask."""
        needed = str(exc) or self.permission_for(request)
        return TemplateResponse(request, "admin/payonce/refused.html", {
            **self.each_context(request), "title": "Permission needed", "needed": needed,
        }, status=403)

    def bad_request(self, request):
        return TemplateResponse(request, "admin/payonce/bad_request.html", {
            **self.each_context(request), "title": "Bad request",
        }, status=400)

    def permission_for(self, request) -> str:
        """The permission Django's own view of this URL checks: view for a list, a page or its history
        (change too is enough), add, change for a posted page, delete."""
        name = getattr(request.resolver_match, "url_name", "") or ""
        for model in self._registry:
            opts = model._meta
            prefix = f"{opts.app_label}_{opts.model_name}_"
            if not name.startswith(prefix):
                continue
            view = name.removeprefix(prefix)
            action = {"add": "add", "delete": "delete"}.get(view, "change" if request.method == "POST" else "view")
            return f"You need {opts.app_label}.{action}_{opts.model_name}"
        return "You do not have the permission this page needs"

    def get_app_list(self, request, app_label=None):
        apps = super().get_app_list(request, app_label)
        rank = {label: index for index, label in enumerate(APP_ORDER)}
        apps.sort(key=lambda app: (rank.get(app["app_label"], len(APP_ORDER)), app["name"]))
        for app in apps:
            order = MODEL_ORDER.get(app["app_label"], ())
            app["models"].sort(key=lambda model: (order.index(model["object_name"])
                                                  if model["object_name"] in order else len(order), model["name"]))
        return apps


def has_nul(request) -> bool:
    """Whether a NUL byte is in the request's path, a query parameter's name or value, or a posted field
    (a file's bytes are not text, and are not looked at)."""
    if "\x00" in request.path_info:
        return True
    for params in (request.GET, request.POST) if request.method == "POST" else (request.GET,):
        for name, values in params.lists():
            if "\x00" in name or any("\x00" in value for value in values):
                return True
    return False


class PayonceAdminConfig(AdminConfig):
    """django.contrib.admin with payonce's site as the default one (config.settings' INSTALLED_APPS)."""

    default_site = "operators.adminsite.PayonceAdminSite"
