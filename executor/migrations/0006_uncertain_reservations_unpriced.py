# A reservation held for an attempt whose outcome nobody knows now says so itself (Reservation.unpriced,
# written with the attempt's end: billing.services.hold_unpriced), so billing counts unpriced attempts
# without reading the executor's table. The ones held before this migration are marked here.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("executor", "0005_attempt_expected_s"),
        ("billing", "0006_order_moves_to_orders"),
    ]

    operations = [
        migrations.RunSQL(
            "UPDATE billing_reservation r SET unpriced = true FROM executor_attempt a"
            " WHERE a.upstream_key = r.key AND a.state = 'uncertain' AND r.state = 'held' AND NOT r.unpriced",
            migrations.RunSQL.noop,
        ),
    ]
