# The moved Order gets the orders app's own table name (billing_order -> orders_order; its constraints and
# indexes keep their names), and its content type moves with it, so the permissions already granted on
# orders (view_order, rerun_order) stay granted.

from django.db import migrations


def content_type_to_orders(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    if not ContentType.objects.filter(app_label="orders", model="order").exists():
        ContentType.objects.filter(app_label="billing", model="order").update(app_label="orders")


def content_type_to_billing(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    if not ContentType.objects.filter(app_label="billing", model="order").exists():
        ContentType.objects.filter(app_label="orders", model="order").update(app_label="billing")


class Migration(migrations.Migration):

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("orders", "0001_initial"),
        ("billing", "0006_order_moves_to_orders"),
    ]

    operations = [
        migrations.AlterModelTable(name="order", table=None),
        migrations.RunPython(content_type_to_orders, content_type_to_billing),
    ]
