# The Order model moves from billing to orders with its rows: this migration only takes it into the
# orders app's state, on the table billing made (billing_order); 0002 renames the table.

import uuid

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ("billing", "0005_permissions"),
        ("jobs", "0006_permissions"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Order",
                    fields=[
                        ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ("payment_id", models.CharField(max_length=255)),
                        ("run_id", models.CharField(max_length=255)),
                        ("product", models.CharField(max_length=100)),
                        ("input", models.JSONField()),
                        ("email", models.CharField(max_length=254)),
                        ("request_hash", models.CharField(max_length=64)),
                        ("status", models.CharField(choices=[("paid", "Paid"), ("duplicate", "Duplicate")], max_length=16)),
                        ("mailed_at", models.DateTimeField(blank=True, null=True)),
                        ("mailed_to", models.CharField(blank=True, db_default="", default="", max_length=254,
                                                       verbose_name="link mailed to")),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        ("client", models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="orders",
                                                     to="jobs.client")),
                        ("duplicate_of", models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT,
                                                           related_name="duplicates", to="orders.order")),
                        ("job", models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT,
                                                     related_name="order", to="jobs.job")),
                    ],
                    options={
                        "db_table": "billing_order",
                        "ordering": ["-created_at"],
                        "permissions": [("rerun_order", "Can re-run orders' reports (pays again)")],
                        "constraints": [
                            models.UniqueConstraint(fields=("client", "payment_id"), name="order_client_payment"),
                            models.UniqueConstraint(condition=models.Q(("status", "paid")), fields=("client", "run_id", "product"),
                                                    name="order_one_paid_per_run_product"),
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
