# The moved models' content types follow them (jobs.client -> accounts.client, jobs.clientapikey ->
# accounts.clientapikey): a permission row is keyed by its content type, so the permissions already
# granted on clients and keys (view_client, change_clientapikey, ...) stay granted. On a fresh database
# there is nothing to move yet (content types are made after migrating), and this does nothing.

from django.db import migrations

MODELS = ("client", "clientapikey")


def move_content_types(apps, source: str, target: str):
    ContentType = apps.get_model("contenttypes", "ContentType")
    for model in MODELS:
        # A content type already made under the target label (post_migrate ran on a half-moved state)
        # keeps its permissions; the old one is left for `remove_stale_contenttypes`.
        if not ContentType.objects.filter(app_label=target, model=model).exists():
            ContentType.objects.filter(app_label=source, model=model).update(app_label=target)


def content_types_to_accounts(apps, schema_editor):
    move_content_types(apps, "jobs", "accounts")


def content_types_to_jobs(apps, schema_editor):
    move_content_types(apps, "accounts", "jobs")


class Migration(migrations.Migration):

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("accounts", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(content_types_to_accounts, content_types_to_jobs),
    ]
