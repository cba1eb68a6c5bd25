"""Two invariants of the engine that were `assert`s (which `python -O` removes) are explicit raises:
a done mark written inside the work's transaction needs that transaction, and a purge of reports is
one transaction."""

import pytest

from jobs.engine.steps import DoneMark
from jobs.kinds.report import reports


def test_a_done_mark_in_the_works_transaction_refuses_to_run_outside_one():
    with pytest.raises(RuntimeError, match="the mark commits with the work's own transaction"):
        DoneMark(ctx=None, name="submit", step_id=1, owner="nobody").in_transaction({"done": True})


def test_a_purge_of_reports_refuses_to_run_outside_a_transaction():
    with pytest.raises(RuntimeError, match="a purge is one transaction"):
        reports.reports_purge_input(job_ids=[])
