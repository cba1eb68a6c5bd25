"""What the operators' commands share (manage.py submit, watch, spend, jobs_cancel, jobs_retry, jobs_replay,
orders_rerun, replay_deliveries, dead_letters_replay): the job filter's arguments, client lookup, exit codes,
following a job live, and how an action is previewed, refused or done. Every action goes through operators.operations, the
functions the admin calls, so the CLI and the admin act and count the same way.

Exit codes: 0 done (a job that succeeded), 1 a job that failed or was cancelled, 2 refused (a bad
argument, an unknown id, a body the API would refuse: nothing was changed), 3 a job waiting for a person,
130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import getpass
import json
import sys
import time
import uuid
from datetime import datetime
from datetime import timezone as dt_timezone

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db.models import QuerySet
from django.utils.dateparse import parse_datetime

from accounts.models import Client
from jobs.kinds import KINDS
from jobs.models import Job, JobStatus
from jobs.selectors import job_snapshot
from operators.actions import ACTIONS, BY_NAME, Action
from operators.models import OperatorAction
from operators.operations import JobFilter, OperationRefused, Preview, action_preview, action_take, client_ids

EXIT_OK, EXIT_FAILED, EXIT_REFUSED, EXIT_WAITING, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
# How a followed job's end maps to the exit code of `watch` (`submit --wait` exits 0 only on success).
EXIT_FOR = {JobStatus.SUCCEEDED: EXIT_OK, JobStatus.FAILED: EXIT_FAILED, JobStatus.CANCELLED: EXIT_FAILED,
            JobStatus.WAITING: EXIT_WAITING}
SAMPLE_SHOWN = 10  # ids a human-readable preview prints (the JSON has the preview's whole sample)


def refused(message: str) -> CommandError:
    """An error of the operator's request: one line on stderr, exit 2, never a traceback."""
    return CommandError(message, returncode=EXIT_REFUSED)


# Who the commands are for. The admin checks a permission per action (a staff user may read jobs without
# being able to retry them); the CLI cannot: whoever runs manage.py on the machine holds the database's
# credentials and so could do anything. Give people who should hold only some actions the admin.
FOR_WHOM = ("For the machine's operators: whoever can run manage.py here holds the database's credentials, so "
            "the admin's per-action permissions (view_job, "
            f"{', '.join(dict.fromkeys(action.permission.split('.')[1] for action in ACTIONS))}) "
            "do not apply. Give a person who may only read, or may not pay again, an admin account instead.")


class OperatorCommand(BaseCommand):
    """A command whose refusals (operators.operations' OperationRefused included) exit 2 with one clear line.
    Every one of them says in its --help whom it is for (FOR_WHOM)."""

    def create_parser(self, prog_name, subcommand, **kwargs):
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.epilog = FOR_WHOM
        return parser

    def execute(self, *args, **options):
        try:
            return super().execute(*args, **options)
        except OperationRefused as exc:
            raise refused(str(exc)) from None


def console(stream, **kwargs):
    """A rich console on `stream` (the real file under Django's OutputWrapper, which would add a newline to
    every chunk rich writes). A terminal only when the stream is one: rich also honours FORCE_COLOR and
    TTY_COMPATIBLE, and a pipe or a file must never get cursor moves or colours."""
    from rich.console import Console

    raw = getattr(stream, "_out", stream)
    tty = bool(getattr(raw, "isatty", lambda: False)())
    if not tty:
        kwargs.setdefault("width", 160)  # rich's 80 columns would fold a table of ids and amounts
    return Console(file=raw, force_terminal=tty, no_color=not tty, highlight=False, **kwargs)


def print_json(stream, data) -> None:
    stream.write(json.dumps(data, default=str))


# --- clients --------------------------------------------------------------------------------------------


def clients_named(name_or_id: str) -> list[Client]:
    """The clients a --client value names: one by id, or every client with that exact name."""
    clients = list(Client.objects.filter(id__in=client_ids(name_or_id)).order_by("name", "id"))
    if not clients:
        raise refused(f"no client has the id {name_or_id}")
    return clients


def one_client(name_or_id: str) -> Client:
    clients = clients_named(name_or_id)
    if len(clients) > 1:
        raise refused(f"{len(clients)} clients are named {name_or_id!r}: give one's id "
                      f"({', '.join(str(client.id) for client in clients[:5])})")
    return clients[0]


def demo_client() -> Client:
    """The client `make run` makes (manage.py demo_client keeps its id and key in var/demo_client.json)."""
    path = settings.VAR_DIR / "demo_client.json"
    try:
        client_id = json.loads(path.read_text())["client_id"]
    except (OSError, ValueError, KeyError):
        client_id = None
    client = Client.objects.filter(id=client_id).first() if client_id else None
    if client is None:
        raise refused(f"no demo client ({path} names none in this database): `make run` or "
                      "`manage.py demo_client` creates it, or name a client with --client NAME_OR_ID")
    return client


# --- the job filter -------------------------------------------------------------------------------------


def add_job_filter_arguments(parser) -> None:
    group = parser.add_argument_group("which jobs (every filter given must match; no filter needs --all)")
    group.add_argument("--status", default="", help=f"one of {', '.join(JobStatus.values)}")
    group.add_argument("--client", default="", help="a client's id, or its exact name")
    group.add_argument("--model", default="", help="provider/model: jobs whose model chain names it")
    group.add_argument("--kind", default="", help="media or report")
    group.add_argument("--month", default="", help="YYYY-MM: jobs created in that UTC month")
    group.add_argument("--search", default="",
                       help="a job id, an upstream key payonce-<job>-<n>, key=value of metadata, or an idempotency key")
    group.add_argument("--id", action="append", dest="ids", default=[], metavar="JOB_ID",
                       help="a job id (repeatable)")


def job_filter(options) -> tuple[JobFilter, QuerySet]:
    """The JobFilter of the options and the jobs it matches, its every id and client known (an unknown one
    is refused, not taken for a filter that matches nothing)."""
    text = {name: (options[name] or "").strip() for name in ("status", "client", "model", "kind", "month", "search")}
    chosen = JobFilter(**text, ids=[ident.strip() for ident in options["ids"]])
    jobs = chosen.jobs()  # raises OperationRefused for a bad status, kind, month or id
    if chosen.client:
        clients_named(chosen.client)
    if chosen.ids:
        known = {str(ident) for ident in Job.objects.filter(id__in=[uuid.UUID(i) for i in chosen.ids])
                 .values_list("id", flat=True)}
        unknown = [ident for ident in chosen.ids if str(uuid.UUID(ident)) not in known]
        if unknown:
            raise refused(f"no job has the id {', '.join(unknown[:5])}")
    return chosen, jobs


def refuse_everything(options, *, filtered: bool, what: str = "job") -> None:
    """A target with no filter matches every row: only with --all, said on purpose."""
    if not filtered and not options["all"]:
        raise refused(f"no filter given: this would act on every {what}. Narrow it (see --help), "
                      f"or give --all to mean every {what}.")


# --- acting ---------------------------------------------------------------------------------------------


def add_action_arguments(parser, *, every: str = "job") -> None:
    group = parser.add_argument_group("the action")
    group.add_argument("--reason", default="", help="why (kept on the audit row); required unless --dry-run")
    group.add_argument("--who", default="", help="who acts, for the audit row (default: the OS user)")
    group.add_argument("--dry-run", action="store_true",
                       help="print the preview (how many match, how many it changes) and change nothing")
    group.add_argument("--json", action="store_true", help="print the preview, or the audit row, as JSON")
    group.add_argument("--all", action="store_true",
                       help=f"act on every {every} when no filter is given (refused without it)")


def who_acts(options) -> str:
    who = (options["who"] or "").strip()
    if who:
        return who
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name in the environment nor in the password database
        raise refused("cannot tell who acts: name yourself with --who") from None


def audit_as_dict(entry: OperatorAction) -> dict:
    return {"id": str(entry.id), "action": entry.action, "who": entry.who, "via": entry.via,
            "target": entry.target, "reason": entry.reason, "matched": entry.matched, "acted": entry.acted,
            "detail": entry.detail, "started_at": _iso(entry.started_at), "finished_at": _iso(entry.finished_at)}


def _iso(value) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


def run_action(command: BaseCommand, options, action: Action, *, rows: QuerySet, target: str) -> None:
    """The steps every action command takes, in order (the action: a row of operators.actions):

    1. a missing reason is refused before anything is read (a dry run needs none);
    2. --dry-run prints the preview (operators.operations.action_preview) and stops: nothing changed, no
       audit row;
    3. an action that pays again (a retry, a re-run) says so, with its worst case, before it acts;
    4. operators.operations.action_take writes the audit row, acts, and finishes the row; its result is
       printed.
    """
    as_json, out = options["json"], command.stdout
    if not options["dry_run"] and not options["reason"].strip():
        raise refused("--reason is required: say why (it is kept on the audit row), or preview with --dry-run")
    if options["dry_run"]:
        shown = action_preview(action, rows=rows, target=target)
        if as_json:
            print_json(out, {"dry_run": True, **shown.as_dict()})
        else:
            for line in preview_lines(shown):
                out.write(line)
            out.write("Dry run: nothing was changed and no audit row was written.")
        return
    who = who_acts(options)
    if action.pays_again:
        shown = action_preview(action, rows=rows, target=target)
        # Said before acting; on stderr with --json, so stdout stays one JSON document.
        (command.stderr if as_json else out).write(
            f"This pays again: {shown.acting} job(s) start a new run. Steps already done are read back, not "
            f"paid; the rest may reserve at worst ${shown.worst_case_usd} in total.")
    entry = action_take(action, rows=rows, target=target, who=who, via="cli", reason=options["reason"])
    if as_json:
        print_json(out, audit_as_dict(entry))
        return
    out.write(f"{action.said_words(entry)}. Audit row {entry.id} (by {entry.who}: {entry.reason!r}).")


def preview_lines(preview: Preview) -> list[str]:
    lines = [f"{preview.action} over {preview.target}:",
             f"  matched {preview.matched}; would change {preview.acting}; skipped {preview.skipped}"]
    if preview.deliveries is not None:
        lines.append(f"  deliveries sent again (same webhook-id, nothing paid): {preview.deliveries}")
    if preview.worst_case_usd is not None:
        lines.append(f"  pays again: at worst ${preview.worst_case_usd} reserved for the new runs")
    if preview.sample:
        more = len(preview.sample) > SAMPLE_SHOWN or preview.acting > len(preview.sample)
        lines.append("  first: " + ", ".join(str(s) for s in preview.sample[:SAMPLE_SHOWN]) + (" ..." if more else ""))
    return lines


def parse_since(since: str | None) -> datetime | None:
    if not since:
        return None
    when = parse_datetime(since)
    if when is None or when.tzinfo is None:
        raise refused(f"--since {since!r}: give an ISO 8601 time with its offset, e.g. 2026-11-29T10:00:00Z")
    return when


# --- following a job (watch, submit --wait) -------------------------------------------------------------


def steps_in_recipe(kind: str) -> int:
    """How many named steps a run of this kind goes through (a report's chapters are counted apart)."""
    declared = KINDS.get(kind)
    return sum(len(stage.steps) for stage in declared.recipe.stages) if declared else 0


def follow(job: Job, *, stdout, stderr, as_json: bool, quiet: bool = False) -> str:
    """Follow a job as GET /v1/jobs/{id}/events does (jobs.selectors.job_snapshot every SSE_INTERVAL_S,
    something printed only when the snapshot changed) until it ends or waits for a person. Returns the
    status it stopped at ("interrupted" on Ctrl-C). `as_json`: one JSON line per snapshot; `quiet`:
    nothing printed; otherwise a live bar (on a terminal) and one line per change."""
    show = console(stdout)
    bar = None if (as_json or quiet or not show.is_terminal) else _progress(show)
    task = bar.add_task(job.status, total=None, cost="$0.000000") if bar else None
    total_steps = steps_in_recipe(job.kind)

    def shown_each_change() -> str:
        shown = None
        while True:
            found = job_snapshot(client_id=job.client_id, job_id=job.id)
            if found is None:  # deleted meanwhile (a purge): nothing more will come
                return "gone"
            _, snapshot = found
            if snapshot != shown:
                if as_json:
                    stdout.write(json.dumps(snapshot, separators=(",", ":")))
                    stdout.flush()  # a line as it happens, also into a pipe (watch --json | jq)
                elif not quiet:
                    (bar.console if bar else show).print(change_line(shown, snapshot, total_steps), soft_wrap=True)
                    if bar:
                        done, total = progress_of(snapshot, total_steps)
                        bar.update(task, description=snapshot["status"], completed=done, total=total,
                                   cost=cost_text(snapshot))
                shown = snapshot
            if snapshot["status"] in EXIT_FOR:
                return snapshot["status"]
            time.sleep(settings.SSE_INTERVAL_S)

    if bar:
        bar.start()
    try:
        status = shown_each_change()
    except KeyboardInterrupt:
        status = "interrupted"
    finally:
        if bar:
            bar.stop()  # before anything else is written: the bar's line is finished, the cursor shown
    if status == "interrupted":
        stderr.write(f"Stopped watching; the job goes on (manage.py watch {job.id}).")
    return status


def _progress(show):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description:<10}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[cost]}"), TimeElapsedColumn(), console=show)


def progress_of(snapshot: dict, total_steps: int) -> tuple[int, int]:
    """(done, total) for the bar: a report's chapters once it has them, else the run's steps."""
    if "chapters" in snapshot:
        return snapshot["chapters"]["done"], snapshot["chapters"]["total"]
    done = sum(1 for step in snapshot["steps"] if step["status"] == "done")
    return done, max(total_steps, len(snapshot["steps"]), 1)


def cost_text(snapshot: dict) -> str:
    cost = snapshot["cost"]
    unpriced = f" + {cost['unpriced_attempts']} unpriced" if cost["unpriced_attempts"] else ""
    return f"${cost['total_usd']}{unpriced}"


def change_line(before: dict | None, after: dict, total_steps: int) -> str:
    """One line for one change: the time, the status, what moved, the progress and the cost so far."""
    seen = {step["name"]: step["status"] for step in (before or {}).get("steps", [])}
    if before is not None and before["run"] != after["run"]:
        seen = {}
    moved = [f"{step['name']} {step['status']}" for step in after["steps"] if seen.get(step["name"]) != step["status"]]
    done, total = progress_of(after, total_steps)
    unit = "chapters" if "chapters" in after else "steps"
    at = datetime.now(dt_timezone.utc).strftime("%H:%M:%S")
    return (f"{at}  {after['status']:<9}  run {after['run']}  {unit} {done}/{total}  cost {cost_text(after)}"
            + (f"  ({', '.join(moved)})" if moved else ""))


def end_lines(job: dict) -> list[str]:
    """What a person reads when a followed job stops (job: jobs.api.serializers.job_as_dict)."""
    cost = job["cost"]
    lines = [f"Job {job['id']} {job['status']} (run {job['run']}), cost ${cost['total_usd']}"
             + (f" and {cost['unpriced_attempts']} unpriced attempt(s)" if cost["unpriced_attempts"] else "")]
    if job["status"] == JobStatus.SUCCEEDED and job.get("output"):
        lines.append(f"  output: {json.dumps(job['output'])}")
    if job.get("error"):
        lines.append(f"  {job['error'].get('code')}: {job['error'].get('message')}")
    if job["status"] == JobStatus.WAITING:
        lines.append("  A person must decide: was the uncertain call accepted (and charged)? Check the provider "
                     "for the upstream key above. Then either pay again under a new key:")
        lines.append(f"    manage.py jobs_retry --id {job['id']} --reason '...'")
        lines.append("  or stop it:")
        lines.append(f"    manage.py jobs_cancel --id {job['id']} --reason '...'")
    return lines


def write_lines(stream, lines) -> None:
    for line in lines:
        stream.write(line)


def exit_with(code: int) -> None:
    """End a command with an exit code that is an outcome, not an error (a failed job: 1, waiting: 3)."""
    if code:
        sys.stdout.flush()
        raise SystemExit(code)


class ActionCommand(OperatorCommand):
    """A command that takes one action of operators.actions (`action`, its name), worded by its row."""

    action: str = ""

    @property
    def taken(self) -> Action:
        return BY_NAME[self.action]

    @property
    def help(self) -> str:
        return self.taken.help


class JobActionCommand(ActionCommand):
    """jobs_cancel, jobs_retry, jobs_replay: an action over every job the filter matches."""

    def add_arguments(self, parser):
        add_job_filter_arguments(parser)
        add_action_arguments(parser)

    def handle(self, *args, **options):
        chosen, jobs = job_filter(options)
        refuse_everything(options, filtered=chosen != JobFilter())
        run_action(self, options, self.taken, rows=jobs, target=chosen.describe())
