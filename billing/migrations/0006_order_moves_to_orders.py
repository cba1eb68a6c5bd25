# The Order model moves to the orders app (orders/migrations/0001_initial.py takes it, rows and table
# included): billing only lets go of it in its state; nothing in the database changes here.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0005_permissions"),
        ("orders", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="Order")],
            database_operations=[],
        ),
    ]
