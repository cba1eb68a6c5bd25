"""Client and ClientAPIKey moved from jobs to accounts by state alone (accounts/migrations/0001_initial.py):
a database migrated before the move keeps its rows, and the permissions granted on clients and keys
follow them to their new app label."""

import io

import pytest
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from accounts.models import Client, ClientAPIKey
from jobs.services import client_create

BEFORE = [("accounts", None), ("jobs", "0007_operatoraction_moves_to_operators")]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


@pytest.mark.django_db
def test_a_database_from_before_the_move_keeps_its_clients_keys_and_granted_permissions():
    # Given a database as it was before the move: clients in jobs' state, a group granted a client
    # permission under the label jobs.
    made = client_create(name="acme")
    migrate(BEFORE)
    ContentType.objects.clear_cache()
    client_type = ContentType.objects.get(app_label="jobs", model="client")
    support = Group.objects.create(name="support")
    support.permissions.add(Permission.objects.get(content_type=client_type, codename="change_client"))

    # When it migrates past the move,
    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
    ContentType.objects.clear_cache()

    # then the same rows are accounts' and the group's permission is accounts.change_client.
    assert ContentType.objects.get(id=client_type.id).app_label == "accounts"
    assert not ContentType.objects.filter(app_label="jobs", model__in=["client", "clientapikey"]).exists()
    assert [f"{p.content_type.app_label}.{p.codename}" for p in support.permissions.all()] == ["accounts.change_client"]
    client = Client.objects.get(id=made["client_id"])
    assert ClientAPIKey.objects.get_from_key(made["api_key"]).client == client


@pytest.mark.django_db  # makemigrations reads the applied migrations to check their history
def test_the_models_and_the_migrations_state_agree():
    # A move by state alone is right only if Django's state after it is the models as written: no
    # migration left to make, in any app (`makemigrations --check` exits 1 when one is).
    call_command("makemigrations", "--check", "--dry-run", stdout=io.StringIO())
