# The client moved to the accounts app (accounts/migrations/0001_initial.py): an endpoint's and a
# delivery's foreign keys point at it there. State only: its table is still jobs_client, so the
# constraints are unchanged.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0001_initial"),
        ("webhooks", "0005_permissions"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="delivery",
                    name="client",
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="deliveries",
                                            to="accounts.client"),
                ),
                migrations.AlterField(
                    model_name="endpoint",
                    name="client",
                    field=models.OneToOneField(on_delete=django.db.models.deletion.CASCADE,
                                               related_name="webhook_endpoint", to="accounts.client"),
                ),
            ],
            database_operations=[],
        ),
    ]
