# An attempt's answers get columns of their own (Attempt.uploaded_inputs, Attempt.output_url), so that
# Attempt.request keeps what went out and nothing else; the answers recorded so far move out of it.

from django.db import migrations, models

FORWARD = """
UPDATE executor_attempt
   SET uploaded_inputs = request->'inputs',
       output_url = request->>'output_url',
       request = request - 'inputs' - 'output_url' - 'answered_succeeded'
 WHERE request ?| array['inputs', 'output_url', 'answered_succeeded']
"""
# Backwards, as the code before it read them: the answer carried the finished work when a running attempt has
# its output.
BACKWARD = """
UPDATE executor_attempt
   SET request = request
       || CASE WHEN uploaded_inputs IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('inputs', uploaded_inputs) END
       || CASE WHEN output_url IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('output_url', output_url) END
       || CASE WHEN output_url IS NOT NULL AND state = 'running'
               THEN '{"answered_succeeded": true}'::jsonb ELSE '{}'::jsonb END
 WHERE uploaded_inputs IS NOT NULL OR output_url IS NOT NULL
"""


class Migration(migrations.Migration):

    dependencies = [
        ("executor", "0006_uncertain_reservations_unpriced"),
    ]

    operations = [
        migrations.AddField(model_name="attempt", name="uploaded_inputs", field=models.JSONField(blank=True, null=True)),
        migrations.AddField(model_name="attempt", name="output_url", field=models.TextField(blank=True, null=True)),
        migrations.RunSQL(FORWARD, BACKWARD),
    ]
