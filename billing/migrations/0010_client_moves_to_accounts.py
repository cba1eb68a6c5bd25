# The client moved to the accounts app (accounts/migrations/0001_initial.py): a budget month's foreign key
# points at it there. State only: its table is still jobs_client, so the constraint is unchanged.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0001_initial"),
        ("billing", "0009_model_price_states_amount"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="budgetmonth",
                    name="client",
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="budget_months",
                                            to="accounts.client"),
                ),
            ],
            database_operations=[],
        ),
    ]
