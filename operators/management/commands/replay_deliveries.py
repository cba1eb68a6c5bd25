"""manage.py replay_deliveries: send webhook deliveries again (operators.actions' "replay_deliveries", or with
--dead "replay_dead", as the admin's replays): the exact stored envelope under the same webhook-id, the retry
schedule from its start; nothing is paid. A reason and one audit row."""

from operators import cli
from operators.actions import BY_NAME
from webhooks.models import Delivery


class Command(cli.ActionCommand):
    action = "replay_deliveries"
    # Only the dead letters among the chosen deliveries (dead_letters_replay is this command with it fixed).
    dead_only = False

    def add_arguments(self, parser):
        group = parser.add_argument_group("which deliveries")
        group.add_argument("--id", action="append", dest="ids", default=[], metavar="DELIVERY_ID",
                           help="a delivery id, the webhook-id receivers saw (repeatable)")
        group.add_argument("--client", default="", help="a client's id, or its exact name")
        group.add_argument("--since", default="", help="created at or after this ISO 8601 time (with its offset)")
        if not self.dead_only:
            group.add_argument("--dead", action="store_true", help="only the dead letters among them")
        cli.add_action_arguments(parser, every=self.noun)

    @property
    def noun(self) -> str:
        return "dead letter" if self.dead_only else "delivery"

    def handle(self, *args, ids, client, since, **options):
        dead_only = self.dead_only or options.get("dead", False)
        deliveries, parts = Delivery.objects.all(), []
        if ids:
            ids = [ident.strip() for ident in ids]
            known = set(Delivery.objects.filter(id__in=ids).values_list("id", flat=True))
            unknown = [ident for ident in ids if ident not in known]
            if unknown:
                raise cli.refused(f"no delivery has the id {', '.join(unknown[:5])}")
            deliveries = deliveries.filter(id__in=ids)
            parts.append(f"ids={len(ids)} selected")
        if client:
            deliveries = deliveries.filter(client__in=cli.clients_named(client))
            parts.append(f"client={client}")
        when = cli.parse_since(since)
        if when is not None:
            deliveries = deliveries.filter(created_at__gte=when)
            parts.append(f"since={since}")
        cli.refuse_everything(options, filtered=bool(parts), what=self.noun)
        target = ("dead letters: " if dead_only else "deliveries: ") + (", ".join(parts) or "every delivery")
        cli.run_action(self, options, BY_NAME["replay_dead"] if dead_only else self.taken, rows=deliveries,
                       target=target)
