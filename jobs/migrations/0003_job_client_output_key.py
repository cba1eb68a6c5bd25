"""Output keys are claimed by their job at create: unique per client
(docs/design.md, "The output key: read back before paying").

Before this, two jobs of one client could name one key (the second failed OUTPUT_KEY_CONFLICT after
paying). Such rows may exist in a database made by an earlier build: every job but the earliest of each
key gets its key marked, so the constraint can be added; those jobs ended long ago (their key was taken)
and keep their record.
"""

from django.db import migrations, models


def mark_duplicate_claims(apps, schema_editor):
    schema_editor.execute(
        """
        UPDATE jobs_job j SET output_key = left(j.output_key, 900) || '~duplicate-' || j.id
          FROM (SELECT id, row_number() OVER (PARTITION BY client_id, output_key ORDER BY created_at, id) AS n
                  FROM jobs_job) ranked
         WHERE ranked.id = j.id AND ranked.n > 1
        """
    )


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0002_steps_and_leases"),
    ]

    operations = [
        migrations.RunPython(mark_duplicate_claims, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(fields=("client", "output_key"), name="job_client_output_key"),
        ),
    ]
