# Client and ClientAPIKey move to the accounts app (accounts/migrations/0001_initial.py takes them, rows and
# tables included): a job's foreign key points at accounts' client, and jobs lets go of the two models in
# its state. Nothing in the database changes here.
#
# jobs' state may drop the client only once no model's state still points at it: every app's foreign key
# to it has moved first (billing 0010, webhooks 0006, orders 0003), hence those dependencies, the one on
# orders (above jobs) included.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0007_operatoraction_moves_to_operators"),
        ("accounts", "0001_initial"),
        ("billing", "0010_client_moves_to_accounts"),
        ("webhooks", "0006_client_moves_to_accounts"),
        ("orders", "0003_client_moves_to_accounts"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="job",
                    name="client",
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="jobs",
                                            to="accounts.client"),
                ),
                migrations.DeleteModel(name="ClientAPIKey"),
                migrations.DeleteModel(name="Client"),
            ],
            database_operations=[],
        ),
    ]
