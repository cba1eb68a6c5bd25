"""manage.py spend: what each client spent in a month, as GET /v1/spend answers it (billing.selectors.month_spend)."""

from decimal import Decimal

from django.utils import timezone

from accounts.models import Client
from billing.months import month_of, parse_month
from billing.selectors import money, month_spend
from operators import cli


class Command(cli.OperatorCommand):
    help = ("Spend per client for a month (default: the current UTC month): spent, reserved, unpriced attempts, "
            "cap and headroom, the figures GET /v1/spend answers, for every client that reserved that month; "
            "with --client, that client and its spend per model. A table, or JSON with --json.")

    def add_arguments(self, parser):
        parser.add_argument("--month", default="", help="YYYY-MM (UTC); default: the current month")
        parser.add_argument("--client", default="",
                            help="a client's id, or its exact name (default: every client that reserved that month)")
        parser.add_argument("--json", action="store_true", help='{"month", "clients": [{"client_id", "name", ...}]}')

    def handle(self, *args, month, client, **options):
        try:
            first = parse_month(month.strip()) if month.strip() else month_of(timezone.now())  # as GET /v1/spend
        except ValueError as exc:
            raise cli.refused(f"--month {month!r}: {exc}") from None
        if client.strip():
            clients = cli.clients_named(client.strip())  # shown even with nothing spent: its whole cap is free
        else:  # the clients with a budget row that month (the admin's spend page lists the same)
            clients = list(Client.objects.filter(budget_months__month=first).order_by("name", "id"))
        rows = [{"client_id": str(each.id), "name": each.name, **month_spend(each, first)} for each in clients]
        if options["json"]:
            cli.print_json(self.stdout, {"month": f"{first:%Y-%m}", "clients": rows})
            return
        self.table(rows, month=f"{first:%Y-%m}", per_model=bool(client.strip()))

    def table(self, rows: list[dict], *, month: str, per_model: bool) -> None:
        from rich.table import Table

        show = cli.console(self.stdout)
        table = Table(title=f"Spend in {month} (UTC), USD", show_footer=len(rows) > 1)
        total = {name: sum((Decimal(row[name]) for row in rows), Decimal(0))
                 for name in ("spent_usd", "reserved_usd", "cap_usd", "headroom_usd")}
        table.add_column("Client", footer="every client")
        table.add_column("Id")
        for name, title in (("spent_usd", "Spent"), ("reserved_usd", "Reserved")):
            table.add_column(title, justify="right", footer=money(total[name]))
        table.add_column("Unpriced", justify="right", footer=str(sum(row["unpriced_attempts"] for row in rows)))
        for name, title in (("cap_usd", "Cap"), ("headroom_usd", "Headroom")):
            table.add_column(title, justify="right", footer=money(total[name]))
        for row in rows:
            table.add_row(row["name"], row["client_id"], row["spent_usd"], row["reserved_usd"],
                          str(row["unpriced_attempts"]), row["cap_usd"], row["headroom_usd"])
        show.print(table)
        if not per_model:
            return
        for row in rows:
            models = Table(title=f"{row['name']} by model", show_footer=False)
            for title, justify in (("Model", "left"), ("Spent", "right"), ("Attempts", "right"),
                                   ("Unpriced", "right")):
                models.add_column(title, justify=justify)
            for line in row["by_model"]:
                models.add_row(line["model"], line["spent_usd"], str(line["attempts"]), str(line["unpriced_attempts"]))
            if not row["by_model"]:
                models.add_row("(no attempts this month)", "", "", "")
            show.print(models)
