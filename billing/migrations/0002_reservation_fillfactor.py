"""Room on every page of billing_reservation: settling a reservation rewrites its row, and with space on
the same page (and no indexed column changed) PostgreSQL does it as a HOT update, touching no index."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0001_initial"),
    ]

    operations = [
        migrations.RunSQL("ALTER TABLE billing_reservation SET (fillfactor = 70)",
                          "ALTER TABLE billing_reservation RESET (fillfactor)"),
    ]
