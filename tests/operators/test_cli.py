"""The operators' CLI (operators/cli.py and its commands) against the real test database: in process
through call_command, and as real `manage.py` processes (exit codes, what a pipe and a terminal get). The
actions must act and count as operators.operations does for the admin: one audit row, only the matching rows."""

import io
import json
import os
import pty
import signal
import subprocess
import sys
import uuid
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from accounts.models import Client
from billing import services as billing
from billing.selectors import month_spend
from executor.models import Attempt
from jobs import selectors
from jobs.kinds.report import reports
from jobs.models import Job, JobStatus
from jobs.services import client_create, job_finish
from operators.models import OperatorAction
from operators.operations import retry_worst_case
from tests.conftest import WEBHOOK_TEST_ENV, media_body
from tests.support.commands import ctrl_c_as_a_terminal, manage
from tests.support.procs import REPO_ROOT, process_env
from tests.support.webhook_receiver import WebhookReceiver
from tests.support.orders import order_body, post_order
from webhooks.models import Delivery, DeliveryStatus, Endpoint

pytestmark = pytest.mark.django_db(transaction=True)  # the manage.py processes read what the test wrote


def command(name: str, *args) -> tuple[int, str, str]:
    """call_command, as (exit code, stdout, stderr): a refusal is its CommandError's code, an outcome
    (a failed job ...) its SystemExit's."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command(name, *args, stdout=out, stderr=err)
        code = 0
    except CommandError as exc:
        code = exc.returncode
        err.write(str(exc))
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue(), err.getvalue()


def a_job(client_id, status=JobStatus.QUEUED, *, kind="media", models=("sandbox/video-keyed",), **fields) -> Job:
    """A job row in a given state, as the runner would have left it."""
    job_id = uuid.uuid4()
    body = media_body()
    defaults = dict(id=job_id, client_id=client_id, idempotency_key=str(job_id), request_hash="0" * 64, kind=kind,
                    model_chain=list(models), input=body["input"], policy={"attempts_per_model": 3},
                    output_key=f"outputs/{job_id}/output.mp4", status=status)
    return Job.objects.create(**{**defaults, **fields})


def statuses(*jobs) -> list[str]:
    return [Job.objects.get(id=job.id).status for job in jobs]


def no_traceback(done: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout, done.stderr


# --- submit ---------------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_submit_refuses_what_the_api_refuses_with_its_error_and_writes_nothing(api):
    body = media_body(models=["sandbox/nope"])
    answer = api.create(body, key="cli-1")
    assert answer.status_code == 422

    done = manage("submit", "--model", "sandbox/nope", "--prompt", body["input"]["prompt"], "--render-s", "1",
                  "--client", "acme", "--key", "cli-1", "--json")
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert json.loads(done.stderr.strip().splitlines()[-1]) == answer.json()  # the API's own error body
    human = manage("submit", "--model", "sandbox/nope", "--prompt", "x", "--client", "acme")
    assert human.returncode == 2 and "INVALID_REQUEST" in human.stderr
    assert "Unknown model(s): sandbox/nope." in human.stderr
    no_traceback(human)
    # A media job without a prompt, and a report model for a media job: the serializer's words, exit 2.
    missing = manage("submit", "--model", "sandbox/video-keyed", "--client", "acme")
    assert missing.returncode == 2 and "prompt" in missing.stderr
    wrong_kind = manage("submit", "--model", "sandbox/llm", "--prompt", "x", "--client", "acme")
    assert wrong_kind.returncode == 2 and "Not a media model: sandbox/llm." in wrong_kind.stderr
    assert Job.objects.count() == 0


def test_submit_uses_the_demo_client_and_without_one_says_how_to_make_it(db, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    code, out, err = command("submit", "--model", "sandbox/video-keyed", "--prompt", "a lighthouse")
    assert code == 2 and "demo_client" in err and out == ""
    assert Job.objects.count() == 0

    call_command("demo_client", stdout=io.StringIO())  # what `make run` does first
    demo = json.loads((tmp_path / "demo_client.json").read_text())
    code, out, err = command("submit", "--model", "sandbox/video-keyed", "--prompt", "a lighthouse",
                             "--metadata", "campaign=spring", "--json")
    assert code == 0, err
    shown = json.loads(out)
    job = Job.objects.get(id=shown["id"])
    assert str(job.client_id) == demo["client_id"] and job.metadata == {"campaign": "spring"}
    uuid.UUID(shown["idempotency_key"])  # a fresh uuid, printed with the job
    # The same key and body again is the same job, and the human form says so.
    code, out, _ = command("submit", "--model", "sandbox/video-keyed", "--prompt", "a lighthouse",
                           "--metadata", "campaign=spring", "--key", shown["idempotency_key"])
    assert code == 0 and f"Job {job.id} replayed" in out and Job.objects.count() == 1
    # The same key with another body is the API's 409, exit 2.
    code, _, err = command("submit", "--model", "sandbox/video-keyed", "--prompt", "another",
                           "--key", shown["idempotency_key"])
    assert code == 2 and "IDEMPOTENCY_CONFLICT" in err and Job.objects.count() == 1


@pytest.mark.e2e
def test_submit_wait_runs_the_job_on_a_real_worker_and_prints_it(jobs_worker, ledger, api):
    done = manage("submit", "--model", "sandbox/video-keyed", "--prompt", "a lighthouse", "--render-s", "1",
                  "--client", api.client_id, "--wait", "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)  # one JSON document: the job as it ended
    assert shown["status"] == "succeeded" and shown["output"]
    assert shown == {k: v for k, v in api.job(shown["id"]).items() if k != "waiting"}  # GET alone adds `waiting`
    charges = ledger.ledger()["charges"]
    assert len(charges) == 1

    again = manage("submit", "--model", "sandbox/video-keyed", "--prompt", "a lighthouse", "--render-s", "1",
                   "--client", api.client_id, "--key", shown["idempotency_key"], "--wait")
    assert again.returncode == 0, again.stderr
    assert f"Job {shown['id']} replayed" in again.stdout and f"Job {shown['id']} succeeded" in again.stdout
    assert "\x1b" not in again.stdout  # a pipe: no bar, no colours
    assert ledger.ledger()["charges"] == charges and Job.objects.count() == 1


# --- watch ----------------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_watch_json_follows_a_running_job_to_its_terminal_snapshot(jobs_worker, ledger, api):
    # Long enough that `manage.py watch` is up (seconds on a loaded machine) before the job ends.
    answer = api.create(media_body(input={"prompt": "a slow render", "render_s": 10}), key="watched")
    job_id = answer.json()["id"]
    done = manage("watch", job_id, "--json", timeout=90)
    assert done.returncode == 0, done.stderr
    snapshots = [json.loads(line) for line in done.stdout.splitlines()]
    assert snapshots[-1]["status"] == "succeeded"
    assert len(snapshots) >= 2 and snapshots[0]["status"] in ("queued", "running")  # followed, not read at the end
    assert all(a != b for a, b in zip(snapshots, snapshots[1:]))  # a line only when something changed
    _, final = selectors.job_snapshot(client_id=api.client_id, job_id=job_id)
    assert snapshots[-1] == final  # the event stream's own snapshot
    assert final["cost"]["total_usd"] == api.job(job_id)["cost"]["total_usd"] != "0.000000"


@pytest.mark.e2e
def test_watch_of_an_ended_job_exits_by_its_outcome_and_a_pipe_gets_no_control_codes(api):
    failed = a_job(api.client_id, JobStatus.FAILED, error={"code": "EXHAUSTED", "message": "every model refused"})
    waiting = a_job(api.client_id, JobStatus.WAITING,
                    error={"code": "UNCERTAIN_SUBMIT", "message": "may or may not have been accepted"})
    cancelled = a_job(api.client_id, JobStatus.CANCELLED)

    # FORCE_COLOR would make rich colour a pipe; the CLI looks at the stream itself.
    done = manage("watch", str(failed.id), FORCE_COLOR=1)
    assert done.returncode == 1, done.stderr
    assert "\x1b" not in done.stdout and "\r" not in done.stdout
    assert "failed" in done.stdout and "EXHAUSTED: every model refused" in done.stdout

    held = manage("watch", str(waiting.id))
    assert held.returncode == 3, held.stderr
    assert "A person must decide" in held.stdout and f"jobs_retry --id {waiting.id}" in held.stdout
    assert "may or may not have been accepted" in held.stdout
    assert command("watch", str(cancelled.id))[0] == 1
    held_json = manage("watch", str(waiting.id), "--json")
    assert held_json.returncode == 3 and json.loads(held_json.stdout)["status"] == "waiting"
    assert "A person must decide" in held_json.stderr

    unknown = manage("watch", str(uuid.uuid4()))
    assert unknown.returncode == 2 and "no job has the id" in unknown.stderr
    no_traceback(unknown)


@pytest.mark.e2e
def test_watch_on_a_terminal_draws_a_live_bar(api):
    """The other side of the test above: on a terminal rich draws (so the pipe test can fail)."""
    failed = a_job(api.client_id, JobStatus.FAILED, error={"code": "EXHAUSTED", "message": "no"})
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "manage.py", "watch", str(failed.id)], cwd=REPO_ROOT,
                            env=process_env(), stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the process ended
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 1
    assert b"\x1b[" in seen and "━".encode() in seen  # cursor and colour codes, and the bar itself


@pytest.mark.e2e
def test_ctrl_c_stops_watching_and_leaves_the_job_alone(api):
    job = a_job(api.client_id, JobStatus.QUEUED)  # no worker: it stays queued
    # SIGINT as a terminal leaves it: a suite started in the background (`.ci/run &`) ignores SIGINT, a
    # child inherits that, and Python then installs no KeyboardInterrupt handler at all.
    proc = subprocess.Popen([sys.executable, "manage.py", "watch", str(job.id)], cwd=REPO_ROOT, env=process_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_as_a_terminal)
    first = proc.stdout.readline()  # one line per change: the first snapshot
    assert "queued" in first
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Stopped watching" in err and "Traceback" not in err
    assert statuses(job) == ["queued"]


# --- spend ----------------------------------------------------------------------------------------------


def test_spend_shows_each_clients_month_as_month_spend_does(db):
    acme = Client.objects.create(name="acme", monthly_cap_usd=Decimal("5"))
    zeta = Client.objects.create(name="zeta")
    job, other = a_job(acme.id), a_job(zeta.id)
    now = timezone.now()
    last_month = billing.month_of(now.replace(day=1) - timedelta(days=1))
    for key, amount in (("a", "0.40"), ("b", "0.30"), ("c", "0.20")):
        assert billing.reserve(client_id=acme.id, job_id=job.id, key=key, model="sandbox/video-keyed", amount=Decimal(amount),
                               guard="true")
    billing.settle(key="a", cost=Decimal("0.25"))
    billing.settle(key="b", cost=None)  # unpriced: all of its reservation is spent
    assert billing.reserve(client_id=zeta.id, job_id=other.id, key="z", model="sandbox/image-lookup",
                           amount=Decimal("1.5"), guard="true", at=datetime.combine(last_month, datetime.min.time(), dt_timezone.utc))
    billing.settle(key="z", cost=Decimal("1.25"))

    code, out, err = command("spend", "--json")
    assert code == 0, err
    shown = json.loads(out)
    this_month = billing.month_of(now)
    assert shown["month"] == f"{this_month:%Y-%m}"
    # The clients that reserved this month (zeta reserved only last month), as GET /v1/spend shows each.
    assert shown["clients"] == [{"client_id": str(acme.id), "name": "acme", **month_spend(acme, this_month)}]
    assert (shown["clients"][0]["spent_usd"], shown["clients"][0]["reserved_usd"],
            shown["clients"][0]["unpriced_attempts"], shown["clients"][0]["headroom_usd"]) == (
        "0.550000", "0.200000", 1, "4.250000")
    code, out, _ = command("spend", "--json", "--month", f"{last_month:%Y-%m}")
    assert json.loads(out)["clients"] == [{"client_id": str(zeta.id), "name": "zeta", **month_spend(zeta, last_month)}]
    assert json.loads(out)["clients"][0]["spent_usd"] == "1.250000"
    code, out, _ = command("spend", "--json", "--client", "zeta")  # named: shown with nothing spent
    assert [(row["name"], row["spent_usd"], row["headroom_usd"]) for row in json.loads(out)["clients"]] == [
        ("zeta", "0.000000", month_spend(zeta, this_month)["cap_usd"])]

    code, out, _ = command("spend", "--client", "acme")
    assert code == 0
    assert "acme" in out and "0.550000" in out and "4.250000" in out and "zeta" not in out
    assert "sandbox/video-keyed" in out  # the per-model table under --client
    assert command("spend", "--month", "2026-13")[0] == 2
    assert command("spend", "--client", "nobody")[0] == 2


# --- bulk actions: cancel, retry, replay ------------------------------------------------------------------


@pytest.fixture
def fleet(db):
    """acme: two queued, one running, one succeeded; globex: one queued."""
    acme, globex = Client.objects.create(name="acme"), Client.objects.create(name="globex")
    jobs = {"queued": [a_job(acme.id), a_job(acme.id)], "running": a_job(acme.id, JobStatus.RUNNING),
            "succeeded": a_job(acme.id, JobStatus.SUCCEEDED), "other": a_job(globex.id)}
    return acme, globex, jobs


def test_cancel_dry_run_previews_and_changes_nothing(fleet):
    _, _, jobs = fleet
    code, out, err = command("jobs_cancel", "--status", "queued", "--client", "acme", "--dry-run", "--json")
    assert code == 0, err
    preview = json.loads(out)
    assert (preview["dry_run"], preview["matched"], preview["acting"], preview["skipped"]) == (True, 2, 2, 0)
    assert set(preview["sample"]) == {str(job.id) for job in jobs["queued"]}
    code, out, _ = command("jobs_cancel", "--client", "acme", "--dry-run")
    assert code == 0 and "matched 4; would change 3; skipped 1" in out and "nothing was changed" in out
    assert statuses(*jobs["queued"], jobs["running"], jobs["other"]) == ["queued", "queued", "running", "queued"]
    assert OperatorAction.objects.count() == 0


@pytest.mark.e2e
def test_cancel_changes_only_the_matching_jobs_and_writes_one_audit_row(fleet):
    _, _, jobs = fleet
    done = manage("jobs_cancel", "--status", "queued", "--client", "acme", "--reason", "stuck behind a bad deploy",
                  "--who", "alice", "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    [row] = OperatorAction.objects.all()
    assert (row.action, row.who, row.via, row.reason, row.matched, row.acted) == (
        "cancel", "alice", "cli", "stuck behind a bad deploy", 2, 2)
    assert row.finished_at is not None and shown["id"] == str(row.id) and shown["acted"] == 2
    assert "status=queued" in row.target and "client=acme" in row.target
    assert statuses(*jobs["queued"]) == ["cancelled", "cancelled"]
    # Another client's queued job, and acme's jobs in other states, are left alone.
    assert statuses(jobs["other"], jobs["running"], jobs["succeeded"]) == ["queued", "running", "succeeded"]


def test_the_who_defaults_to_the_os_user(fleet):
    import getpass

    code, out, err = command("jobs_cancel", "--id", str(fleet[2]["running"].id), "--reason", "by hand")
    assert code == 0, err
    assert OperatorAction.objects.get().who == getpass.getuser() and "1 job(s) changed of 1 matched" in out


@pytest.mark.e2e
def test_an_action_without_a_reason_exits_2_and_changes_nothing(fleet):
    _, _, jobs = fleet
    done = manage("jobs_cancel", "--status", "queued", "--client", "acme")
    assert done.returncode == 2 and "--reason" in done.stderr
    no_traceback(done)
    assert command("jobs_cancel", "--status", "queued", "--reason", "   ")[0] == 2
    assert statuses(*jobs["queued"]) == ["queued", "queued"] and OperatorAction.objects.count() == 0


@pytest.mark.e2e
def test_no_filter_is_refused_unless_all_is_given(fleet):
    _, _, jobs = fleet
    done = manage("jobs_cancel", "--reason", "clean up")
    assert done.returncode == 2 and "--all" in done.stderr
    no_traceback(done)
    assert command("jobs_retry", "--dry-run")[0] == 2
    assert "--all" in manage("jobs_cancel", "--help").stdout
    assert statuses(*jobs["queued"], jobs["other"]) == ["queued"] * 3 and OperatorAction.objects.count() == 0

    code, out, err = command("jobs_cancel", "--all", "--reason", "maintenance", "--json")
    assert code == 0, err
    assert (json.loads(out)["matched"], json.loads(out)["acted"]) == (5, 4)  # every open job, the ended one skipped
    assert statuses(*jobs["queued"], jobs["running"], jobs["other"], jobs["succeeded"]) == (
        ["cancelled"] * 4 + ["succeeded"])


@pytest.mark.e2e
def test_unknown_ids_and_bad_filters_exit_2_without_a_traceback(fleet):
    done = manage("jobs_cancel", "--id", "not-a-job", "--reason", "r")  # one as a real process, as operators run it
    assert done.returncode == 2, done.stderr
    no_traceback(done)
    for args in (["--id", str(uuid.uuid4())], ["--status", "sleeping"], ["--kind", "film"], ["--client", "nobody"],
                 ["--client", str(uuid.uuid4())], ["--month", "2026-13"]):
        code, _, err = command("jobs_cancel", *args, "--reason", "r")  # in process: the same refusals, 1 s faster each
        assert code == 2 and "Traceback" not in err, (args, err)
    assert OperatorAction.objects.count() == 0


def test_retry_says_it_pays_again_with_its_worst_case_then_retries_only_failed_and_waiting(db):
    acme = Client.objects.create(name="acme")
    failed = a_job(acme.id, JobStatus.FAILED, models=("sandbox/video-keyed", "sandbox/image-lookup"))
    waiting = a_job(acme.id, JobStatus.WAITING)
    done_job = a_job(acme.id, JobStatus.SUCCEEDED)
    worst = retry_worst_case(failed) + retry_worst_case(waiting)
    assert worst > 0

    code, out, _ = command("jobs_retry", "--client", "acme", "--dry-run", "--json")
    preview = json.loads(out)
    assert (preview["matched"], preview["acting"], Decimal(preview["worst_case_usd"])) == (3, 2, worst)
    assert statuses(failed, waiting) == ["failed", "waiting"] and OperatorAction.objects.count() == 0

    code, out, err = command("jobs_retry", "--client", "acme", "--reason", "the provider is back")
    assert code == 0, err
    warning, result = out.index("This pays again"), out.index("Retry: 2 job(s) changed of 3 matched")
    assert warning < result and f"${worst}" in out  # said before acting, with the worst case
    assert statuses(failed, waiting, done_job) == ["queued", "queued", "succeeded"]
    assert [Job.objects.get(id=j.id).run for j in (failed, waiting)] == [2, 2]
    [row] = OperatorAction.objects.all()
    assert (row.action, row.matched, row.acted, Decimal(row.detail["worst_case_usd"])) == ("retry", 3, 2, worst)


# --- orders and dead letters ----------------------------------------------------------------------------


def failed_report_of(api, payment: str, product: str) -> dict:
    """A paid order whose report job failed after its chapters were seeded."""
    order = post_order(api, order_body(payment=payment, run=f"run-{payment}", product=product)).json()
    job = Job.objects.get(id=order["job_id"])
    reports.report_load(job=job)
    assert job_finish(job_id=job.id, status=JobStatus.FAILED, error={"code": "CHAPTER_FAILED", "message": "x"})
    return order


def test_orders_rerun_reruns_only_the_chosen_orders_reports(api):
    first = failed_report_of(api, "pi_1", "natal-chart")
    second = failed_report_of(api, "pi_2", "natal-chart")
    third = failed_report_of(api, "pi_3", "transits")

    code, out, _ = command("orders_rerun", "--product", "natal-chart", "--dry-run", "--json")
    preview = json.loads(out)
    assert (preview["matched"], preview["acting"]) == (2, 2) and Decimal(preview["worst_case_usd"]) > 0
    assert preview["action"] == "rerun"

    code, out, err = command("orders_rerun", "--order", first["id"], "--reason", "the buyer asked")
    assert code == 0, err
    assert "This pays again" in out
    runs = {o["payment_id"]: (Job.objects.get(id=o["job_id"]).status, Job.objects.get(id=o["job_id"]).run)
            for o in (first, second, third)}
    assert runs == {"pi_1": ("queued", 2), "pi_2": ("failed", 1), "pi_3": ("failed", 1)}
    [row] = OperatorAction.objects.all()
    assert (row.action, row.matched, row.acted, row.target) == ("rerun", 1, 1, "orders: ids=1 selected")

    assert command("orders_rerun", "--order", str(uuid.uuid4()), "--reason", "r")[0] == 2
    assert command("orders_rerun", "--order", first["id"], "--product", "transits", "--reason", "r")[0] == 2
    assert command("orders_rerun", "--reason", "r")[0] == 2  # no filter, no --all
    assert OperatorAction.objects.count() == 1


def dead_letter(client_id) -> Delivery:
    """A job's event that was tried until the dispatcher gave up (a receiver that kept answering 500)."""
    job = a_job(client_id, JobStatus.RUNNING, webhook_url="https://hooks.example.com/payonce")
    assert job_finish(job_id=job.id, status=JobStatus.FAILED, error={"code": "X", "message": "x"})
    delivery = Delivery.objects.get(job_id=job.id)
    assert Delivery.objects.filter(id=delivery.id, status=DeliveryStatus.PENDING).update(
        status=DeliveryStatus.DEAD, attempts=8, last_status_code=500, last_error="HTTP 500")
    delivery.refresh_from_db()
    return delivery


def test_dead_letters_replay_previews_then_resends_only_the_chosen_dead_letters(db):
    acme = Client.objects.get(id=client_create(name="acme")["client_id"])
    globex = Client.objects.get(id=client_create(name="globex")["client_id"])
    mine, also_mine, theirs = dead_letter(acme.id), dead_letter(acme.id), dead_letter(globex.id)

    code, out, err = command("dead_letters_replay", "--client", "acme", "--dry-run", "--json")
    assert code == 0, err
    preview = json.loads(out)
    assert (preview["matched"], preview["acting"], preview["deliveries"]) == (2, 2, 2)
    assert set(preview["sample"]) == {mine.id, also_mine.id}
    assert OperatorAction.objects.count() == 0

    code, out, err = command("dead_letters_replay", "--id", mine.id, "--reason", "the receiver is fixed", "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["action"], shown["matched"], shown["acted"]) == ("replay_dead", 1, 1)
    after = {d.id: d.status for d in Delivery.objects.all()}
    assert after == {mine.id: "pending", also_mine.id: "dead", theirs.id: "dead"}
    assert OperatorAction.objects.count() == 1

    assert command("dead_letters_replay", "--reason", "r")[0] == 2  # every delivery needs --all
    assert command("dead_letters_replay", "--id", "nope", "--reason", "r")[0] == 2
    assert command("dead_letters_replay", "--since", "yesterday", "--reason", "r")[0] == 2
    assert OperatorAction.objects.count() == 1


def test_replay_deliveries_is_the_same_audited_door_for_any_delivery(db):
    acme = Client.objects.get(id=client_create(name="acme")["client_id"])
    dead, delivered = dead_letter(acme.id), dead_letter(acme.id)
    Delivery.objects.filter(id=delivered.id).update(status=DeliveryStatus.DELIVERED)

    assert command("replay_deliveries", "--client", "acme")[0] == 2  # no reason, no replay
    assert OperatorAction.objects.count() == 0
    code, out, err = command("replay_deliveries", "--client", "acme", "--reason", "the receiver lost them", "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["action"], shown["matched"], shown["acted"]) == ("replay", 2, 2)
    assert {d.id: d.status for d in Delivery.objects.all()} == {dead.id: "pending", delivered.id: "pending"}
    assert OperatorAction.objects.get().reason == "the receiver lost them"


@pytest.mark.e2e
def test_replay_calls_no_provider_and_resends_each_delivery_with_its_webhook_id(jobs_worker, webhooks_worker,
                                                                                  ledger, api):
    with WebhookReceiver(api.webhook_secret) as receiver:
        Endpoint.objects.filter(client_id=api.client_id).update(url=receiver.url)
        made = manage("submit", "--model", "sandbox/video-keyed", "--prompt", "a lighthouse", "--render-s", "1",
                      "--client", api.client_id, "--wait", "--json")
        assert made.returncode == 0, made.stderr
        job_id = json.loads(made.stdout)["id"]
        delivery = Delivery.objects.get(job_id=job_id)
        receiver.wait_for(lambda: len(receiver.for_id(delivery.id)) == 1, message="the first delivery")
        calls, attempts = ledger.calls(), Attempt.objects.filter(job_id=job_id).count()

        done = manage("jobs_replay", "--id", job_id, "--reason", "the receiver lost it", "--json",
                      **WEBHOOK_TEST_ENV)
        assert done.returncode == 0, done.stderr
        assert (json.loads(done.stdout)["action"], json.loads(done.stdout)["acted"]) == ("replay", 1)
        receiver.wait_for(lambda: len(receiver.for_id(delivery.id)) == 2, message="the replay")

        first, again = receiver.for_id(delivery.id)
        assert again.webhook_id == first.webhook_id == delivery.id and again.body == first.body and again.verified
        assert ledger.calls() == calls  # no provider was called, not even a poll
        assert Attempt.objects.filter(job_id=job_id).count() == attempts
    assert OperatorAction.objects.get().acted == 1
