# The provider's expected duration (the first poll waits for it) and the index a provider's callback is
# found by (docs/design.md, "Waiting costs little"). The index is built concurrently: attempts keep being written
# meanwhile.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('executor', '0004_attempt_answer'),
        ('jobs', '0004_reports'),
    ]

    operations = [
        migrations.AddField(
            model_name='attempt',
            name='expected_s',
            field=models.FloatField(blank=True, null=True),
        ),
        AddIndexConcurrently(
            model_name='attempt',
            index=models.Index(fields=['provider', 'upstream_id'], name='attempt_upstream_id'),
        ),
    ]
