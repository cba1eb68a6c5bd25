# Client and ClientAPIKey move from jobs to accounts with their rows: this migration only takes them into
# the accounts app's state, on the tables jobs made (jobs_client, jobs_clientapikey), which keep their
# names (Meta.db_table). Nothing in the database changes here. The move, in order:
#   1. here: accounts' state gains the two models (jobs' state still has its own);
#   2. billing 0010, webhooks 0006, orders 0003: each foreign key to the client points at accounts' model
#      (state only: the constraints already name jobs_client);
#   3. jobs 0008: Job.client likewise, then jobs' state lets go of the two models;
#   4. accounts 0002: the content types follow, so the permissions granted on clients and keys stay.

import uuid

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    # The migration that created the two tables (no later one of jobs changed them).
    dependencies = [
        ("jobs", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Client",
                    fields=[
                        ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ("name", models.CharField(max_length=200)),
                        ("monthly_cap_usd", models.DecimalField(blank=True, decimal_places=6, max_digits=12, null=True)),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now, editable=False)),
                    ],
                    options={
                        "db_table": "jobs_client",
                    },
                ),
                migrations.CreateModel(
                    name="ClientAPIKey",
                    fields=[
                        ("id", models.CharField(editable=False, max_length=150, primary_key=True, serialize=False,
                                                unique=True)),
                        ("prefix", models.CharField(editable=False, max_length=8, unique=True)),
                        ("hashed_key", models.CharField(editable=False, max_length=150)),
                        ("created", models.DateTimeField(auto_now_add=True, db_index=True)),
                        ("name", models.CharField(default=None, help_text="A free-form name for the API key. Need not be unique. 50 characters max.", max_length=50)),
                        ("revoked", models.BooleanField(blank=True, default=False, help_text="If the API key is revoked, clients cannot use it anymore. (This cannot be undone.)")),
                        ("expiry_date", models.DateTimeField(blank=True, help_text="Once API key expires, clients cannot use it anymore.", null=True, verbose_name="Expires")),
                        ("client", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="api_keys",
                                                     to="accounts.client")),
                    ],
                    options={
                        "verbose_name": "client API key",
                        "verbose_name_plural": "client API keys",
                        "db_table": "jobs_clientapikey",
                        "ordering": ("-created",),
                        "abstract": False,
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
