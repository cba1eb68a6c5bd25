"""manage.py client_limits: read or set a client's limits (docs/api.md, "Limits"), as the admin's client page does."""

from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.core.exceptions import ValidationError

from accounts.services import client_set_limits
from operators import cli

DEFAULT = "default"


def _number(kind):
    def parse(raw: str):
        if raw == DEFAULT:
            return None
        try:
            return kind(raw)
        except (ValueError, InvalidOperation):
            raise ValueError(f"{raw!r} is not a number (or '{DEFAULT}')") from None
    return parse


class Command(cli.OperatorCommand):
    help = ("A client's limits: jobs in progress at once (--max-running), its weight in the rotation of fair "
            "dispatch (--weight), creates per second and burst (--creates-per-s, --create-burst) and the monthly "
            f"cap (--monthly-cap-usd). With no option, prints them; '{DEFAULT}' sets one back to its setting. "
            "Prints the limits in force as JSON.")

    OPTIONS = {"max_running": int, "weight": int, "creates_per_s": Decimal, "create_burst": int,
               "monthly_cap_usd": Decimal}

    def add_arguments(self, parser):
        parser.add_argument("client", help="a client's id, or its exact name")
        for name in self.OPTIONS:
            parser.add_argument(f"--{name.replace('_', '-')}", default=None)

    def handle(self, *args, client, **options):
        found = cli.one_client(client)
        values = {}
        for name, kind in self.OPTIONS.items():
            raw = options.get(name)
            if raw is None:
                continue
            try:
                values[name] = _number(kind)(raw.strip())
            except ValueError as exc:
                raise cli.refused(f"--{name.replace('_', '-')}: {exc}") from None
            if name == "weight" and values[name] is None:
                values[name] = 1  # the weight's default is the column's, not a setting's
        if values:
            try:
                client_set_limits(client=found, **values)
            except ValidationError as exc:
                problems = "; ".join(f"--{field.replace('_', '-')}: {' '.join(msgs)}"
                                     for field, msgs in exc.message_dict.items())
                raise cli.refused(f"{problems}; nothing was changed") from None
        cli.print_json(self.stdout, {
            "client_id": str(found.id), "name": found.name,
            "max_running": found.max_running if found.max_running is not None else settings.CLIENT_MAX_RUNNING,
            "weight": found.weight,
            "creates_per_s": str(found.creates_per_s if found.creates_per_s is not None else settings.CLIENT_CREATES_PER_S),
            "create_burst": found.create_burst if found.create_burst is not None else settings.CLIENT_CREATE_BURST,
            "monthly_cap_usd": str(found.monthly_cap_usd if found.monthly_cap_usd is not None
                                   else settings.BUDGET_MONTHLY_CAP_USD),
            "defaults": sorted(name for name in ("max_running", "creates_per_s", "create_burst", "monthly_cap_usd")
                               if getattr(found, name) is None),
        })
