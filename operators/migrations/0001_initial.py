# OperatorAction moves from jobs to operators with its rows: this migration only takes it into the
# operators app's state, on the table jobs made (jobs_operatoraction); 0002 renames the table.

import uuid

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ("jobs", "0006_permissions"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="OperatorAction",
                    fields=[
                        ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ("action", models.CharField(choices=[("cancel", "Cancel"), ("retry", "Retry"), ("replay", "Replay"),
                                                             ("rerun", "Rerun"), ("replay_dead", "Replay Dead")],
                                                    max_length=16)),
                        ("who", models.CharField(max_length=150)),
                        ("via", models.CharField(max_length=16)),
                        ("target", models.TextField()),
                        ("reason", models.TextField()),
                        ("matched", models.PositiveIntegerField()),
                        ("acted", models.PositiveIntegerField(default=0)),
                        ("detail", models.JSONField(default=dict)),
                        ("started_at", models.DateTimeField(default=django.utils.timezone.now)),
                        ("finished_at", models.DateTimeField(blank=True, null=True)),
                    ],
                    options={
                        "db_table": "jobs_operatoraction",
                        "ordering": ["-started_at"],
                        "indexes": [models.Index(fields=["-started_at"], name="operator_action_started")],
                        "constraints": [models.CheckConstraint(condition=models.Q(("reason", ""), _negated=True),
                                                               name="operator_action_reason_required")],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
