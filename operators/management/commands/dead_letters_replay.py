"""manage.py dead_letters_replay: send dead webhook deliveries again (operators.operations.dead_letters_replay, as
the admin's dead letter replay): the exact stored envelope under the same webhook-id; nothing is paid."""

from operators import cli
from operators.operations import dead_letters_preview, dead_letters_replay
from webhooks.models import Delivery


class Command(cli.OperatorCommand):
    help = ("Replay dead letters (deliveries that used up their retries), chosen by --id (repeatable), --client "
            "and/or --since; the retry schedule starts again. Deliveries that are not dead are counted and "
            "skipped. A reason and one audit row. No filter at all is refused unless --all is given. "
            "--dry-run previews. (replay_deliveries, the older command, replays any delivery and keeps no "
            "audit row.)")

    def add_arguments(self, parser):
        group = parser.add_argument_group("which deliveries")
        group.add_argument("--id", action="append", dest="ids", default=[], metavar="DELIVERY_ID",
                           help="a delivery id, the webhook-id receivers saw (repeatable)")
        group.add_argument("--client", default="", help="a client's id, or its exact name")
        group.add_argument("--since", default="", help="created at or after this ISO 8601 time (with its offset)")
        cli.add_action_arguments(parser, every="dead letter")

    def handle(self, *args, ids, client, since, **options):
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
        cli.refuse_everything(options, filtered=bool(parts), what="dead letter")
        target = "dead letters: " + (", ".join(parts) or "every delivery")
        cli.run_action(self, options,
                       preview=lambda: dead_letters_preview(deliveries=deliveries, target=target),
                       act=lambda **who: dead_letters_replay(deliveries=deliveries, target=target, **who))
