# OperatorAction moves to the operators app (operators/migrations/0001_initial.py takes it, rows and
# table included): jobs only lets go of it in its state; nothing in the database changes here.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0006_permissions"),
        ("operators", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="OperatorAction")],
            database_operations=[],
        ),
    ]
