"""The operators' actions table (operators/actions.py) holds together: each row is reachable where it says
(an admin list that offers it, a permission that exists, an audit kind), and every command that takes an
action names a row. What each action does is tested through the admin and the CLI (test_admin_jobs.py,
test_cli.py, test_admin_permissions.py)."""

import importlib
import pkgutil

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission

from operators import adminkit, cli
from operators.actions import ACTIONS, BY_NAME
from operators.management import commands
from operators.models import OperatorActionKind


def test_each_action_has_its_own_name_and_list_action_name():
    assert len(BY_NAME) == len(ACTIONS)
    posted = [(action.offered_on, action.list_action) for action in ACTIONS]
    assert len(set(posted)) == len(posted)
    assert {action.kind for action in ACTIONS} <= set(OperatorActionKind)


def test_each_list_that_offers_actions_is_an_admin_and_each_action_is_offered_by_one():
    offering = [model_admin.offered_on for model_admin in admin.site._registry.values()
                if isinstance(model_admin, adminkit.ActionAdmin)]
    assert len(offering) == len(set(offering))
    assert set(offering) == {action.offered_on for action in ACTIONS}


@pytest.mark.django_db
def test_each_actions_permission_exists():
    for action in ACTIONS:
        app, codename = action.permission.split(".")
        assert Permission.objects.filter(content_type__app_label=app, codename=codename).exists(), action.name


def test_each_action_command_names_a_row_and_says_whom_it_is_for():
    taken = {}
    for module in pkgutil.iter_modules(commands.__path__):
        command = importlib.import_module(f"{commands.__name__}.{module.name}").Command
        if issubclass(command, cli.ActionCommand):
            taken[module.name] = command.action
            assert command().help == BY_NAME[command.action].help != ""
    # jobs_cancel, jobs_retry, jobs_replay, orders_rerun, replay_deliveries, dead_letters_replay
    assert len(taken) == 6 and set(taken.values()) <= set(BY_NAME)
