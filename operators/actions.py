"""The operators' actions, one row each: what an action acts on, the service it calls, who may take it and
how it is worded. The preview and the act (operators.operations), the admin (its list actions, bulk links,
buttons, confirmation page and permission checks: operators.adminkit.ActionAdmin) and the CLI (the commands
of operators.cli) all read ACTIONS; none of them names an action's statuses, permission or wording again.

A new action is one `Action` row here plus the service it calls (a plain function in the app that owns the
rows: jobs.services, webhooks.services ...). Offered on a list that already offers actions, the admin shows
it at once; a manage.py command for it is a module naming the row (jobs_cancel.py).

A price set, a drift cleared and a report template's live label moved are operators' decisions too
(operations.price_set, drifts_clear, template_live_set), but not rows here: the first is a form's save, the
second one billing statement that names who cleared it, the third one template and a version number, not a
set of rows with statuses. Each keeps its audit row and reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import models
from django.db.models import QuerySet

from jobs.models import OPEN_STATUSES, Job, JobStatus
from jobs.services import job_cancel, job_retry
from operators.models import OperatorActionKind
from webhooks.models import Delivery, DeliveryStatus
from webhooks.selectors import deliveries_of_jobs
from webhooks.services import delivery_replay

# The lists that offer actions: each admin that lists the rows (ActionAdmin.offered_on).
JOBS, ORDERS, DELIVERIES, DEAD_LETTERS = "jobs", "orders", "deliveries", "dead letters"

# What the CLI prints once an action is done ({skipped} is "" or what was left alone).
CHANGED_JOBS = "{display}: {acted} job(s) changed of {matched} matched{skipped}"


@dataclass(frozen=True)
class Action:
    """One operator action. Its target is a queryset of `rows` (the jobs a filter matches, the selected
    deliveries ...); it changes those in `statuses` (None: every matched row), each by one call of `each`,
    in that call's own transaction: a bulk action over 100,000 rows holds no long transaction, and a row
    another writer changed meanwhile is the service's zero-row branch, counted as skipped."""

    name: str  # unique: the admin's bulk URL (/admin/jobs/job/bulk/<name>/) and preview_jobs' `action`
    kind: OperatorActionKind  # what its audit row says it was (two replays share "replay")
    rows: type[models.Model]  # what its target is made of (Job, Delivery): each has `status` and `created_at`
    statuses: tuple[str, ...] | None  # the rows it changes; the others are counted as skipped
    each: Callable[[models.Model], bool]  # the service, once per row; False: the row was left as it was
    permission: str  # what the admin asks beside viewing the rows (the CLI's users hold the database: FOR_WHOM)
    offered_on: str  # the admin list that offers it (JOBS, ORDERS ...)
    list_action: str  # the name that list's action form posts
    label: str  # that list action's wording
    verb: str  # "Will <verb> N", "Yes, <verb> N", the buttons
    title: str  # the confirmation page's title
    loads: tuple[str, ...] = ()  # fields `each` reads beside the id
    # The deliveries it sends again, from the rows it acts on: a replay acts on those, not on the rows.
    replays: Callable[[QuerySet], QuerySet] | None = None
    # A person's decision to pay again: said before acting, with the worst case its new runs may reserve.
    pays_again: bool = False
    skipped_why: str = ""
    nothing_paid: str = ""
    done: str = "{acted} of {matched} changed"  # the admin's message after it
    said: str = CHANGED_JOBS  # the CLI's line after it
    help: str = ""  # its manage.py command's --help, where it has one

    def acting(self, rows: QuerySet) -> QuerySet:
        return rows.filter(status__in=self.statuses) if self.statuses is not None else rows

    def applies(self, row) -> bool:
        """Whether it would change this row (a job page shows only the buttons that would)."""
        return self.statuses is None or row.status in self.statuses

    def done_words(self, entry) -> str:
        """`done` for its audit row `entry`."""
        return self.done.format(acted=entry.acted, matched=entry.matched,
                                jobs="job" if entry.matched == 1 else "jobs")

    def said_words(self, entry) -> str:
        """`said` for its audit row `entry`."""
        skipped = entry.matched - entry.acted
        return self.said.format(
            display=entry.get_action_display(), acted=entry.acted, matched=entry.matched,
            skipped=f" ({skipped} skipped: not in a state this action changes)" if skipped > 0 else "")


# --- the services, as `each` calls them ---------------------------------------------------------------


def cancel(job: Job) -> bool:
    return job_cancel(job=job)  # False: a worker or another cancel ended it first


def retry(job: Job) -> bool:
    return job_retry(job=job) is not None  # None: no longer failed or waiting (another retry won)


def replay(delivery: Delivery) -> bool:
    delivery_replay(delivery=delivery)  # whatever its status: a delivered one too (receivers dedupe)
    return True


def themselves(deliveries: QuerySet) -> QuerySet:
    """A replay of chosen deliveries sends those very deliveries."""
    return deliveries


# --- the table ------------------------------------------------------------------------------------------

# What job_retry's conditional update accepts: a retry or a re-run changes only these.
RETRYABLE = (JobStatus.FAILED, JobStatus.WAITING)
REPLAY_PAYS_NOTHING = ("a replay sends the stored envelope again under the same webhook-id (receivers dedupe on "
                       "it); no provider is called.")
FILTER_HELP = "No filter at all is refused unless --all is given. --dry-run previews."

ACTIONS = (
    Action(
        name="cancel", kind=OperatorActionKind.CANCEL, rows=Job, statuses=OPEN_STATUSES, each=cancel, loads=("run",),
        permission="jobs.cancel_job", offered_on=JOBS, list_action="cancel_selected",
        label="Cancel the selected jobs…", verb="cancel", title="Cancel jobs", skipped_why="already ended",
        help="Cancel every queued, running or waiting job the filter matches (ended jobs are skipped), with a "
             f"reason and one audit row. {FILTER_HELP}"),
    Action(
        name="retry", kind=OperatorActionKind.RETRY, rows=Job, statuses=RETRYABLE, each=retry,
        permission="jobs.retry_job", offered_on=JOBS, list_action="retry_selected",
        label="Retry the selected jobs (pays again)…", verb="retry", title="Retry jobs", pays_again=True,
        skipped_why="only failed or waiting jobs are retried; succeeded and cancelled ones stay ended",
        help="Retry every failed or waiting job the filter matches: each starts a new run, which PAYS AGAIN "
             "(its done steps are read back, not paid); the worst case it may reserve is printed first. A reason "
             f"and one audit row. {FILTER_HELP}"),
    Action(
        name="replay", kind=OperatorActionKind.REPLAY, rows=Job, statuses=None, each=replay,
        replays=deliveries_of_jobs, permission="webhooks.replay_delivery", offered_on=JOBS,
        list_action="replay_selected", label="Replay the selected jobs' deliveries…",
        verb="replay the deliveries of", title="Replay the deliveries of jobs",
        nothing_paid="a replay sends the stored envelopes again under the same webhook-id; no provider is called.",
        done="{acted} deliveries sent again, over {matched} {jobs}",
        said="Replay: {acted} deliveries sent again ({matched} matched)",
        help="Send every webhook delivery of the matching jobs again (the exact stored envelope, the same "
             "webhook-id: receivers dedupe on it); nothing is paid. A reason and one audit row. "
             f"{FILTER_HELP}"),
    Action(
        # A retry of orders' report jobs, from the orders: its own permission and wording.
        name="rerun", kind=OperatorActionKind.RERUN, rows=Job, statuses=RETRYABLE, each=retry,
        permission="orders.rerun_order", offered_on=ORDERS, list_action="rerun",
        label="Re-run the reports (pays again)…", verb="re-run", title="Re-run reports", pays_again=True,
        skipped_why="only failed or waiting reports are re-run; a duplicate order has no report of its own",
        help="Re-run the report jobs of paid orders, chosen by --order ID (repeatable) or by --product, --month "
             "and --client. Only failed or waiting reports start again; their written chapters are kept and the "
             f"rest PAY AGAIN (the worst case is printed first). A reason and one audit row. {FILTER_HELP}"),
    Action(
        name="replay_deliveries", kind=OperatorActionKind.REPLAY, rows=Delivery, statuses=None, each=replay,
        replays=themselves, permission="webhooks.replay_delivery", offered_on=DELIVERIES,
        list_action="replay", label="Replay: send the stored envelope again, same webhook-id…", verb="replay",
        title="Replay deliveries", nothing_paid=REPLAY_PAYS_NOTHING,
        done="{acted} of {matched} deliveries sent again",
        said="Replay: {acted} deliveries sent again ({matched} matched)",
        help="Replay deliveries, whatever their status (a receiver that lost a delivered one: receivers dedupe on "
             "webhook-id), chosen by --id (repeatable), --client and/or --since; with --dead, only the dead "
             f"letters among them. A reason and one audit row. {FILTER_HELP}"),
    Action(
        name="replay_dead", kind=OperatorActionKind.REPLAY_DEAD, rows=Delivery, statuses=(DeliveryStatus.DEAD,),
        each=replay, replays=themselves, permission="webhooks.replay_delivery",
        offered_on=DEAD_LETTERS, list_action="replay_selected", label="Replay the selected dead letters…",
        verb="replay", title="Replay dead letters", nothing_paid=REPLAY_PAYS_NOTHING,
        skipped_why="not dead: delivered, or already being sent again",
        said="Replay of dead letters: {acted} sent again of {matched} matched",
        help="Replay dead letters (deliveries that used up their retries), chosen by --id (repeatable), --client "
             "and/or --since; the retry schedule starts again. Deliveries that are not dead are counted and "
             f"skipped. A reason and one audit row. {FILTER_HELP}"),
)

BY_NAME = {action.name: action for action in ACTIONS}


def offered_on(where: str) -> tuple[Action, ...]:
    return tuple(action for action in ACTIONS if action.offered_on == where)
