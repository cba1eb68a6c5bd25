# The moved OperatorAction gets the operators app's own table name (jobs_operatoraction ->
# operators_operatoraction; its index and constraint keep their names), and its content type moves with
# it, so the permissions already granted on the audit rows stay granted.

from django.db import migrations


def content_type_to_operators(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    if not ContentType.objects.filter(app_label="operators", model="operatoraction").exists():
        ContentType.objects.filter(app_label="jobs", model="operatoraction").update(app_label="operators")


def content_type_to_jobs(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    if not ContentType.objects.filter(app_label="jobs", model="operatoraction").exists():
        ContentType.objects.filter(app_label="operators", model="operatoraction").update(app_label="jobs")


class Migration(migrations.Migration):

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("operators", "0001_initial"),
        ("jobs", "0007_operatoraction_moves_to_operators"),
    ]

    operations = [
        migrations.AlterModelTable(name="operatoraction", table=None),
        migrations.RunPython(content_type_to_operators, content_type_to_jobs),
    ]
