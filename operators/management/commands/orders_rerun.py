"""manage.py orders_rerun: run paid orders' report jobs again (operators.actions' "rerun", as the admin's
per-order re-run): the chapters already written are read back, the rest are paid again."""

import uuid

from jobs.models import Job
from operators import cli
from operators.operations import month_range
from orders.models import Order, OrderStatus


class Command(cli.ActionCommand):
    action = "rerun"

    def add_arguments(self, parser):
        group = parser.add_argument_group("which orders (--order, or any of the others)")
        group.add_argument("--order", action="append", dest="orders", default=[], metavar="ORDER_ID",
                           help="an order id (repeatable)")
        group.add_argument("--product", default="", help="orders of this product")
        group.add_argument("--month", default="", help="YYYY-MM: orders paid in that UTC month")
        group.add_argument("--client", default="", help="a client's id, or its exact name")
        cli.add_action_arguments(parser, every="paid order")

    def handle(self, *args, orders, product, month, client, **options):
        if orders and (product or month or client):
            raise cli.refused("give either --order ids or --product/--month/--client, not both")
        paid = Order.objects.filter(status=OrderStatus.PAID, job__isnull=False)
        parts = []
        if orders:
            try:
                ids = [uuid.UUID(order.strip()) for order in orders]
            except ValueError:
                raise cli.refused("--order takes order ids") from None
            known = set(Order.objects.filter(id__in=ids).values_list("id", flat=True))
            unknown = [str(ident) for ident in ids if ident not in known]
            if unknown:
                raise cli.refused(f"no order has the id {', '.join(unknown[:5])}")
            paid = paid.filter(id__in=ids)
            parts.append(f"ids={len(ids)} selected")
        if product:
            paid = paid.filter(product=product)
            parts.append(f"product={product}")
        if month:
            first, after = month_range(month)
            paid = paid.filter(created_at__gte=first, created_at__lt=after)
            parts.append(f"month={month}")
        if client:
            paid = paid.filter(client__in=cli.clients_named(client))
            parts.append(f"client={client}")
        cli.refuse_everything(options, filtered=bool(parts), what="paid order")
        target = "orders: " + (", ".join(parts) or "every paid order")
        jobs = Job.objects.filter(id__in=paid.values("job_id"))
        cli.run_action(self, options, self.taken, rows=jobs, target=target)
