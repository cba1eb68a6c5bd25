"""The storm (`make chaos`): 500 paid jobs from 3 clients while the sandbox misbehaves in every way it
can, workers die at random and at the dangerous moments, the broker loses every message, PostgreSQL (the
storm's own server) restarts and cuts the processes' connections, the sandbox crashes and the webhook
worker dies; then a settle, and checks from the outside
only: the HTTP API, the sandbox's ledger, the receiver's log and the budget rows for the cap.

    python -m tests.chaos [--seed N] [--jobs 500] [--broker redis|amqp] [--hosts]

Exits 0 when every check passes, 1 when one fails (the seed is printed first: `--seed` replays it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal

import requests

from tests.chaos import checks
from tests.chaos.plan import CLIENTS, Event, JobPlan, Plan, make_plan
from tests.chaos.receiver import FlakyReceiver
from tests.chaos.stack import Stack
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.traces import traced

CAPS = {"alpha": "100000", "beta": "100000", "capped": "4"}  # the third client's cap binds
# Each client's limits, set by an operator's command (manage.py client_limits): jobs in progress at once and
# its weight in the rotation of fair dispatch. beta's limit binds in every storm; the capped client keeps
# the defaults (CLIENT_MAX_RUNNING).
LIMITS = {"alpha": {"max_running": 12, "weight": 2}, "beta": {"max_running": 3, "weight": 1}, "capped": {}}


def caps_for(jobs: int) -> dict[str, str]:
    """The monthly caps: the capped client's scaled down in a small storm ($0.03 a job, at most $4), so
    that it binds at every size (checks.check_landed fails a storm where it never refused a job): its
    third of 60 jobs asks for about $4 in all."""
    return {**CAPS, "capped": str(min(Decimal(CAPS["capped"]), Decimal(jobs) * Decimal("0.03")).quantize(Decimal("0.01")))}
OPEN = ("queued", "running", "waiting")
AIMED_TRIES = 6  # set-ups of an aimed kill before it kills whatever it caught (checks.check_landed judges)
TERMINAL = ("succeeded", "failed", "cancelled")
# How long after a model is enabled again a process may still refuse it (MODELS_CACHE_S 1 s, and a second).
CATALOG_LAG_S = 3.0
MODELS_FILE_WRONG_S = 15.0
# What operators change (storm.Storm._catalog), on a thread of their own.
CATALOG_KINDS = ("models_file", "model_enabled", "price")


@dataclass
class Record:
    """What the storm saw, for the checks and the figures."""

    answers: dict = field(default_factory=lambda: defaultdict(list))  # key -> [(status, job id)]
    post_errors: Counter = field(default_factory=Counter)  # how POSTs failed before they got an answer
    job_ids: dict = field(default_factory=dict)  # key -> job id
    unexpected: list = field(default_factory=list)
    faults: Counter = field(default_factory=Counter)
    kills: Counter = field(default_factory=Counter)
    aimed: list = field(default_factory=list)
    events: dict = field(default_factory=dict)  # name -> time it happened
    cuts: list = field(default_factory=list)  # connections cut at each cut_connections event
    cap_samples: int = 0
    cap_gaps: int = 0  # samples that could not be read (PostgreSQL restarting)
    cap_breaches: list = field(default_factory=list)
    slot_breaches: list = field(default_factory=list)  # (t, client, jobs holding a slot) above its running limit
    slot_most: Counter = field(default_factory=Counter)  # client -> the most of its jobs in progress at one sample
    cancels: Counter = field(default_factory=Counter)
    retries: dict = field(default_factory=dict)  # job id -> attempt numbers that existed at the person's retry
    progress: dict = field(default_factory=lambda: defaultdict(list))  # job id -> [(t, signature)]
    server_errors: list = field(default_factory=list)
    disabled: set = field(default_factory=set)  # models disabled right now (the Models page, as the storm set it)
    enabled_again: dict = field(default_factory=dict)  # model -> when the storm enabled it again
    refused_disabled: dict = field(default_factory=dict)  # key -> the disabled model its POST was refused for
    catalog: list = field(default_factory=list)  # (t, what) the storm changed in the catalog and the prices
    models_file_refused: float | None = None  # processes that refused the wrong models file (None: not counted)


class Storm:
    @staticmethod
    def submit_s(jobs: int) -> float:
        return max(20.0, jobs / 6)  # about 6 jobs a second

    def __init__(self, args):
        self.args = args
        self.plan: Plan = make_plan(args.seed, args.jobs, args.submit_s)
        self.caps = caps_for(args.jobs)
        self.record = Record()
        self.stop_chaos = threading.Event()
        self.stop_sampling = threading.Event()
        self.local = threading.local()
        self.hosts = None
        self.lock = threading.Lock()
        # One hand on the processes at a time: a kill's restart in the background, an aimed kill, the heal.
        self.procs_lock = threading.Lock()
        self.restarts: list[threading.Thread] = []

    # -- the run -----------------------------------------------------------------------------------

    def run(self) -> int:
        args = self.args
        print(f"chaos: CHAOS_SEED={args.seed} jobs={args.jobs} broker={args.broker} hosts={int(args.hosts)}",
              flush=True)
        if args.hosts:
            from tests.chaos.hosts import Hosts

            self.hosts = Hosts(["web", "worker0", "worker1", "webhooks", "beat"]).__enter__()
        self.stack = self.make_stack()
        self.otlp = None
        ok = False
        try:
            if args.traces:  # every process exports its spans to a receiver of the storm's (checks.check_traces)
                self.otlp = OtlpReceiver(out=self.stack.workdir / "spans.jsonl").start()
                self.stack.env.update(traced(self.otlp))
                self.stack.local_env.update(traced(self.otlp))
            self.stack.prepare()
            self.receiver = FlakyReceiver(args.seed, host=self.stack.service_host).__enter__()
            self.clients = {}
            for name in CLIENTS:
                url = self.receiver.url_for(name)
                creds = self.stack.create_client(f"{name}-{args.seed}", url, self.caps[name])
                if LIMITS[name]:
                    self.stack.manage("client_limits", creds["client_id"],
                                      *[arg for key, value in LIMITS[name].items()
                                        for arg in (f"--{key.replace('_', '-')}", str(value))])
                self.receiver.add_client(name, creds["webhook_secret"])
                self.clients[name] = creds
            self.stack.start()
            self.t0 = time.time()
            ok = self._storm()
        finally:
            self.stop_chaos.set()
            self.stop_sampling.set()
            if self.otlp is not None:
                self.otlp.stop()
            self.stack.stop(keep=args.keep or not ok)
            if self.hosts:
                self.hosts.__exit__(None, None, None)
        return 0 if ok else 1

    def make_stack(self) -> Stack:
        args = self.args
        return Stack(broker=args.broker, database=args.database, redis_db=args.redis_db, hosts=self.hosts,
                     redis=args.redis)

    def _storm(self) -> bool:
        sampler = threading.Thread(target=self._sample_caps, daemon=True)
        tracker = threading.Thread(target=self._track, daemon=True)
        # The operators act on a clock of their own, beside the chaos: in one line behind its blocking
        # events (a sandbox crash waited out, an aimed kill set up again), seed 3's lowered price landed at
        # 24 s of 25, after the last render of its model, and the drift it must cause had nothing to show on.
        operated = [event for event in self.plan.events if event.kind in CATALOG_KINDS]
        chaos = threading.Thread(target=self._chaos, args=([event for event in self.plan.events
                                                            if event.kind not in CATALOG_KINDS],), daemon=True)
        operators = threading.Thread(target=self._chaos, args=(operated,), daemon=True)
        for thread in (sampler, tracker, chaos, operators):
            thread.start()
        with ThreadPoolExecutor(max_workers=12) as pool:
            futures = [pool.submit(self._send, job) for job in self.plan.jobs]
            for future in futures:
                future.result()
        submitted = time.time()
        chaos.join()
        operators.join()
        self._heal()
        self.settled_s = self._settle(self.args.settle_s)
        self._person_retries()
        self.settled_s = self._settle(self.args.settle_s)
        self._wait_deliveries(timeout=120)
        self.stop_sampling.set()
        sampler.join(timeout=5)
        tracker.join(timeout=5)
        self.elapsed = {"submit": submitted - self.t0, "total": time.time() - self.t0}
        final = self._final_jobs()
        ledger = requests.get(f"{self.stack.sandbox_url}/ledger", timeout=30).json()
        generations = checks.sandbox_generations(self.stack.sandbox_url, ledger)
        result = checks.run_all(self, final, ledger, generations)
        print(checks.summary(self, final, ledger, result), flush=True)
        if not result.ok:  # what the checks read, beside the processes' logs, for the post-mortem
            (self.stack.workdir / "final.json").write_text(json.dumps(
                {"jobs": final, "ledger": ledger, "generations": generations, "failures": result.failures,
                 "deliveries": [{"id": r.webhook_id, "status": r.status, "path": r.path, "at": r.arrived}
                                for r in self.receiver.requests]}, indent=1, default=str))
        return result.ok

    def at(self, offset: float) -> None:
        """Sleep until `offset` seconds after the storm started."""
        delay = self.t0 + offset - time.time()
        if delay > 0:
            time.sleep(delay)

    # -- clients -----------------------------------------------------------------------------------

    def session(self) -> requests.Session:
        if not hasattr(self.local, "session"):
            self.local.session = requests.Session()
        return self.local.session

    def api(self, method: str, client: str, path: str, **kwargs) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.clients[client]['api_key']}", **kwargs.pop("headers", {})}
        response = self.session().request(method, f"{self.stack.web_url}{path}", headers=headers,
                                          timeout=kwargs.pop("timeout", 15), **kwargs)
        if response.status_code >= 500:
            with self.lock:
                self.record.server_errors.append((round(time.time() - self.t0, 1), method, path.split("?")[0][:40],
                                                  response.status_code, response.text[:200]))
        return response

    def _post(self, job: JobPlan) -> None:
        """POST the job as a careful client does: on no answer or a 5xx, again with the same key."""
        self._create(job, "/v1/jobs", job.body, {"Idempotency-Key": job.key}, accepted=(201, 202), id_field="id")

    def _create(self, job: JobPlan, path: str, body: dict, headers: dict, *, accepted: tuple, id_field: str) -> bool:
        """POST `body` to `path` until it is answered: on no answer or a 5xx, again, the same; the job the answer
        names (its `id_field`) is the one the checks follow for `job`. Whether it was accepted."""
        deadline = time.monotonic() + 120
        while True:
            try:
                response = self.api("POST", job.client, path, json=body, headers=headers)
            except requests.RequestException as exc:
                self.record.post_errors[type(exc).__name__] += 1
            else:
                if response.status_code in accepted:
                    job_id = response.json()[id_field]
                    with self.lock:
                        self.record.answers[job.key].append((response.status_code, job_id))
                        self.record.job_ids.setdefault(job.key, job_id)
                    return True
                if response.status_code < 500 and response.status_code != 429:
                    refused_for = self._refused_as_disabled(job, response)
                    with self.lock:
                        if refused_for:  # a new job on a model an operator disabled: refused, as it should be
                            self.record.refused_disabled[job.key] = refused_for
                        else:
                            self.record.unexpected.append((job.key, response.status_code, response.text[:300]))
                    return False
                self.record.post_errors[f"http_{response.status_code}"] += 1
            if time.monotonic() > deadline:
                with self.lock:
                    self.record.unexpected.append((job.key, "no answer", "gave up after 120 s"))
                return False
            time.sleep(0.5)

    def _refused_as_disabled(self, job: JobPlan, response: requests.Response) -> str | None:
        """The disabled model a 422 refused this new job for, or None: a 422 on its `models` alone, naming
        a model the storm has disabled, or enabled again less than CATALOG_LAG_S ago (each process reads
        the Models page within MODELS_CACHE_S). A replay of a key whose job exists is never one: it is
        judged by its hash (202), whatever the catalog says now."""
        if response.status_code != 422:
            return None
        fields = (response.json().get("error") or {}).get("fields") or {}
        if set(fields) != {"models"}:
            return None
        with self.lock:
            suspects = self.record.disabled | {model for model, at in self.record.enabled_again.items()
                                               if time.time() - at < CATALOG_LAG_S}
        words = " ".join(map(str, fields["models"]))
        return next((model for model in job.body.get("models", []) if model in suspects and model in words), None)

    def _send(self, job: JobPlan) -> None:
        self.at(job.at)
        self._post(job)
        later = sorted(x for x in (("resend", job.resend_after), ("cancel", job.cancel_after)) if x[1] is not None)
        for what, after in sorted(later, key=lambda x: x[1]):
            self.at(job.at + after)
            if what == "resend":
                self._post(job)
            else:
                self._cancel(job)

    def _cancel(self, job: JobPlan) -> None:
        job_id = self.record.job_ids.get(job.key)
        if job_id is None:
            return
        for _ in range(60):
            try:
                response = self.api("POST", job.client, f"/v1/jobs/{job_id}/cancel")
            except requests.RequestException:
                time.sleep(0.5)
                continue
            if response.status_code < 500:
                code = (response.json().get("error") or {}).get("code") if response.status_code != 200 else "cancelled"
                self.record.cancels[code] += 1
                return
            time.sleep(0.5)

    # -- chaos -------------------------------------------------------------------------------------

    def _chaos(self, events: list[Event]) -> None:
        for event in events:
            self.at(event.at)
            try:
                self._do(event)
            except Exception as exc:  # a fault that could not be made is reported, and fails the storm
                with self.lock:
                    self.record.unexpected.append((f"chaos {event.kind}", "error", repr(exc)[:300]))

    def _do(self, event: Event) -> None:
        stack, record = self.stack, self.record
        if event.kind == "fault":
            self._fault([event.detail])
        elif event.kind == "kill":
            self._kill([f"worker{event.detail['worker']}"], down_s=event.detail["down_s"])
            record.kills["worker, at random"] += 1
        elif event.kind == "aimed_kill":
            self.aimed_kill(event.detail["aim"])
        elif event.kind == "crash_sandbox":
            stack.crash_sandbox()
            record.events["sandbox crash"] = time.time()
            record.kills["sandbox server"] += 1
        elif event.kind == "flush_broker":
            stack.flush_broker()
            record.events["broker flush"] = time.time()
        elif event.kind == "kill_webhooks":
            self._kill(["webhooks"], down_s=1.0)
            record.kills["webhooks worker"] += 1
        elif event.kind == "cut_connections":
            record.cuts.append(stack.cut_connections())
        elif event.kind in CATALOG_KINDS:
            self._catalog(event)
        elif event.kind == "restart_postgres":
            if self.args.no_pg_restart:
                return
            started = time.time()
            back = stack.restart_postgres()
            record.events["postgres restart"] = started
            record.events["postgres back"] = back

    def _catalog(self, event: Event) -> None:
        """What an operator changes while jobs run: the models file (written wrong, then right: every
        process keeps the good one meanwhile), a model's `enabled` on the Models page, a price on it (the
        rows the admin's form writes, written to the storm's database)."""
        detail, now = event.detail, time.time()
        if event.kind == "models_file":
            self.stack.write_models_file(valid=False)
            threading.Thread(target=self._models_file_right_once_refused, daemon=True).start()
            what = "models file wrong"
        elif event.kind == "model_enabled":
            with self.lock:  # said before it is written: a POST refused a moment later is one it explains
                self.record.disabled.add(detail["model"])
            self._write("INSERT INTO executor_modelconfig (name, enabled, provider, kind, content_type, note, "
                        "updated_at) VALUES (%s, %s, '', '', '', 'the storm', now()) ON CONFLICT (name) DO UPDATE "
                        "SET enabled = EXCLUDED.enabled, updated_at = now()", [detail["model"], detail["enabled"]])
            if detail["enabled"]:
                with self.lock:
                    self.record.disabled.discard(detail["model"])
                    self.record.enabled_again[detail["model"]] = time.time()
            what = f"{'enabled' if detail['enabled'] else 'disabled'} {detail['model']}"
        else:
            self._write("INSERT INTO billing_modelprice (model, free, per_unit_usd, unit, note, updated_at) VALUES "
                        "(%s, false, %s, 'render', 'the storm: lower than the sandbox charges', now()) "
                        "ON CONFLICT (model) DO UPDATE SET per_unit_usd = EXCLUDED.per_unit_usd, updated_at = now()",
                        [detail["model"], detail["per_unit"]])
            what = f"priced {detail['model']} at ${detail['per_unit']}"
        with self.lock:
            self.record.catalog.append((now, what))

    def _models_file_right_once_refused(self) -> None:
        """The wrong models file stays until a process has refused it (payonce_models_file_total, rejected:
        each process reads the file again within MODELS_CACHE_S as it works), at most MODELS_FILE_WRONG_S;
        then it is put right, as an operator would."""
        deadline, refused = time.time() + MODELS_FILE_WRONG_S, None
        while time.time() < deadline and not refused:
            try:
                counted = [line for line in self.stack.metrics().splitlines()
                           if line.startswith('payonce_models_file_total{outcome="rejected"}')]
            except requests.RequestException:
                counted = []  # the web process busy or PostgreSQL restarting: look again
            if counted:
                refused = float(counted[0].split()[-1])
            time.sleep(0.5)
        self.stack.write_models_file(valid=True)
        with self.lock:  # what /metrics said then (the broker flush may empty the counters later)
            self.record.models_file_refused = refused
            self.record.catalog.append((time.time(), "models file right"))

    def _write(self, sql: str, params: list) -> None:
        """One statement on the storm's database, as the admin's save does, tried again while PostgreSQL is
        coming back from its restart."""
        for _ in range(40):
            try:
                with checks.pg(self.stack.local_database_url) as conn:
                    conn.execute(sql, params)
                return
            except Exception:  # PostgreSQL restarting or a cut connection: try again
                time.sleep(0.5)
        raise RuntimeError(f"could not write: {sql[:80]}")

    def _fault(self, faults: list[dict], *, first: bool = False) -> None:
        """Add faults to the sandbox's queue; `first` puts them before the pending ones (an aimed kill's
        hold must catch the next calls, not wait behind the faults the storm has piled up)."""
        for _ in range(40):  # the sandbox may be coming back from its crash
            try:
                response = requests.post(f"{self.stack.sandbox_url}/control/faults",
                                         json={"faults": faults, "first": first}, timeout=10)
                break
            except requests.ConnectionError:
                time.sleep(0.25)
        response.raise_for_status()
        for fault in faults:
            self.record.faults[f"{fault['action']} on {fault['on']}"] += fault["times"]

    def _kill(self, names: list[str], down_s: float | None = 0.5) -> None:
        """SIGKILL the processes, and start them again `down_s` later (None: the caller starts them), in the
        background: the chaos goes on meanwhile. Waited for in line, each restart (a worker takes seconds
        to be ready) pushed every later event back, and the aimed kills of seed 371040 ran 6 and 20 s after
        their time, when the jobs had all been sent and there was nothing in flight to hit."""
        procs = [self.stack.procs[name] for name in names]
        with self.procs_lock:
            for proc in procs:
                proc.kill()
        if down_s is None:
            return

        def restart():
            time.sleep(down_s)
            try:
                self._start(names)
            except Exception as exc:  # a process that cannot come back fails the storm
                with self.lock:
                    self.record.unexpected.append(("restart " + ", ".join(names), "error", repr(exc)[:300]))

        thread = threading.Thread(target=restart, name=f"restart-{'-'.join(names)}", daemon=True)
        thread.start()
        self.restarts.append(thread)

    def aimed_kill(self, aim: str) -> None:
        """Kill every worker at one of the dangerous moments, made to happen from the outside:

        - submit_in_flight: the sandbox holds the next submits (`delay`), and the workers die while the
          calls are out;
        - answer_before_commit: the rows of the attempts being submitted are locked (FOR UPDATE) while the
          sandbox holds their calls, so each worker has the provider's answer (charged) and waits to
          commit it when it dies;
        - upload_before_finish: the rows of the running media jobs are locked, so a worker that has just
          uploaded an output waits to write the finish, and dies there.
        """
        workers = [name for name in self.stack.procs if name.startswith("worker")]
        landed = {"aim": aim, "at": round(time.time() - self.t0, 1)}
        # Each aim is set up again (up to TRIES times) until it catches work in flight: a kill of idle
        # workers tests nothing, and checks.check_landed fails a storm whose aimed kill hit nothing.
        for landed["tries"] in range(1, AIMED_TRIES + 1):
            if aim == "submit_in_flight":
                self._fault([{"model": "*", "action": "delay", "on": "submit", "seconds": 3, "times": 3}], first=True)
                self._target(landed)
                time.sleep(1.5)
                landed["calls_out"] = self._in_flight_submits()
                if landed["calls_out"] or landed["tries"] == AIMED_TRIES:
                    self._kill(workers, down_s=0.5)
                    break
            elif aim == "answer_before_commit":
                self._fault([{"model": "*", "action": "delay", "on": "submit", "seconds": 1, "times": 3}], first=True)
                if self._target(landed):  # held once its intent is committed
                    deadline = time.monotonic() + 2
                    while not self._in_flight_submits() and time.monotonic() < deadline:
                        time.sleep(0.05)
                else:
                    time.sleep(0.3)
                with checks.pg(self.stack.local_database_url) as conn:
                    rows = conn.execute("SELECT id FROM executor_attempt WHERE state = 'submitting' "
                                        "FOR UPDATE SKIP LOCKED").fetchall()
                    landed["attempts_held"] = len(rows)
                    if rows or landed["tries"] == AIMED_TRIES:
                        time.sleep(2.0)  # the held calls are answered; the workers wait on the locked rows
                        self._kill(workers, down_s=None)
                        conn.rollback()
                        self._start(workers)
                        break
                    conn.rollback()
            elif aim == "upload_before_finish":
                if self._target(landed):
                    time.sleep(1.0)  # sent, and rendering
                with checks.pg(self.stack.local_database_url) as conn:
                    before = self.stack.outputs()
                    rows = conn.execute("SELECT id FROM jobs_job WHERE status IN ('running', 'waiting') "
                                        "AND kind = 'media' FOR UPDATE SKIP LOCKED").fetchall()
                    landed["jobs_held"] = len(rows)
                    if rows or landed["tries"] == AIMED_TRIES:
                        time.sleep(2.5)  # renders end, outputs are uploaded, the finishes wait on the locked rows
                        landed["uploaded_not_finished"] = len(self.stack.outputs() - before)
                        self._kill(workers, down_s=None)
                        conn.rollback()
                        self._start(workers)
                        break
                    conn.rollback()
            time.sleep(0.5)
        self.record.aimed.append(landed)
        self.record.kills[f"workers, aimed: {aim}"] += 1

    def _target(self, landed: dict) -> bool:
        """From an aim's second try on, a render of the aim's own to catch (a keyed one, from the uncapped
        client, checked as every job is): on a slow machine an aim can come after the plan's last job has
        ended (seeds 1 and 965774 on a machine at half speed: a submit_in_flight at 21 to 24 s of a 20 s
        window, with nothing left to submit, six tries running). Returns whether it sent one."""
        if landed["tries"] < 2:
            return False
        n = len(self.plan.jobs)
        body = {"kind": "media", "models": ["sandbox/video-keyed"],
                "input": {"prompt": f"aimed kill target {n}", "render_s": 2}, "metadata": {"storm": "aim", "n": n}}
        job = JobPlan(n, "alpha", f"storm{self.args.seed}-aim-{n}", body, round(time.time() - self.t0, 3), "keyed")
        with self.lock:
            self.plan.jobs.append(job)
        self._post(job)
        landed["targets"] = landed.get("targets", 0) + 1
        return True

    def _start(self, names: list[str]) -> None:
        """Start the processes that are down (another hand may have started one already). A process started
        while the models file is wrong refuses to start, naming the problem (it has no good file in memory
        to keep, as a running one has): started again, as a supervisor does, until the file is put right;
        any other failure to start fails the storm."""
        with self.procs_lock:
            for name in names:
                deadline = time.monotonic() + MODELS_FILE_WRONG_S + 10
                while not self.stack.procs[name].alive:
                    try:
                        self.stack.procs[name].start()
                    except RuntimeError as exc:
                        if "MODELS_FILE" not in str(exc) or time.monotonic() > deadline:
                            raise
                        with self.lock:
                            self.record.kills["starts refused: the models file was wrong"] += 1
                        time.sleep(0.5)

    def _in_flight_submits(self) -> int:
        with checks.pg(self.stack.local_database_url) as conn:
            return conn.execute("SELECT count(*) FROM executor_attempt WHERE state = 'submitting'").fetchone()[0]

    def _heal(self) -> None:
        """After the storm: every restart done, and every process up (a kill's restart may have lost a
        race with another kill)."""
        for thread in self.restarts:
            thread.join()
        self._start(list(self.stack.procs))

    # -- watching ----------------------------------------------------------------------------------

    def _sample_caps(self) -> None:
        """Every second: spent + reserved <= cap for every client, read from the budget rows. A sample over
        the cap is kept; checks.check_cap judges it against the margin a price drift allows (the money
        the attempts in flight when it was first seen overshot their reservations by)."""
        caps = {name: Decimal(cap) for name, cap in self.caps.items()}
        names = {creds["client_id"]: name for name, creds in self.clients.items()}
        while not self.stop_sampling.wait(1.0):
            try:
                with checks.pg(self.stack.local_database_url) as conn:
                    rows = conn.execute("SELECT client_id::text, month, spent, reserved FROM billing_budgetmonth").fetchall()
                    slots = conn.execute("SELECT client_id::text, count(*) FROM jobs_job WHERE holds_slot"
                                         " GROUP BY client_id").fetchall()
            except Exception:
                self.record.cap_gaps += 1
                continue
            self.record.cap_samples += 1
            for client_id, month, spent, reserved in rows:
                name = names.get(client_id)
                if name and spent + reserved > caps[name]:
                    self.record.cap_breaches.append((round(time.time() - self.t0, 1), name, spent + reserved - caps[name]))
            # Each client's jobs in progress, never above its running limit (jobs.dispatch).
            for client_id, holding in slots:
                name = names.get(client_id)
                self.record.slot_most[name] = max(self.record.slot_most[name], holding)
                limit = LIMITS.get(name, {}).get("max_running")
                if limit and holding > limit:
                    self.record.slot_breaches.append((round(time.time() - self.t0, 1), name, holding))

    def _track(self) -> None:
        """Every second, each client's open jobs as the API lists them: when each job last changed."""
        while not self.stop_sampling.wait(1.0):
            now = time.time()
            seen = {}
            try:
                for client in CLIENTS:
                    for status in OPEN:
                        cursor = ""
                        while True:
                            page = self.api("GET", client, f"/v1/jobs?status={status}&limit=200&cursor={cursor}")
                            if page.status_code != 200:
                                raise RuntimeError(page.status_code)
                            body = page.json()
                            for job in body["results"]:
                                seen[job["id"]] = checks.signature(job)
                            if not body["next"]:
                                break
                            cursor = body["next"].split("cursor=")[1].split("&")[0]
            except Exception:
                continue  # an unreadable moment (PostgreSQL restarting): the next sample tells
            with self.lock:
                for job_id in set(self.record.job_ids.values()):
                    signature = seen.get(job_id, "ended")
                    history = self.record.progress[job_id]
                    if not history or history[-1][1] != signature:
                        history.append((now, signature))

    def _settle(self, timeout: float) -> float:
        """Wait until every job is terminal or waiting on a person; returns how long it took."""
        started = time.time()
        while time.time() - started < timeout:
            jobs = self._final_jobs()
            if all(checks.at_rest(job) for job in jobs.values() if job):
                return time.time() - started
            time.sleep(2)
        return time.time() - started

    def _person_retries(self) -> None:
        """A person looks at the jobs waiting on an uncertain submit and retries some of them (seeded)."""
        rng = random.Random(f"retries-{self.args.seed}")
        for (key, job) in sorted(self._final_jobs(by_key=True).items()):
            if job and job["status"] == "waiting" and (job.get("error") or {}).get("code") == "UNCERTAIN_SUBMIT":
                if rng.random() < self.plan.retry_share:
                    client = self._client_of(key)
                    numbers = checks.attempt_numbers(job)
                    response = self.api("POST", client, f"/v1/jobs/{job['id']}/retry")
                    if response.status_code in (200, 202):
                        self.record.retries[job["id"]] = numbers
                    else:
                        self.record.unexpected.append((key, response.status_code, response.text[:300]))

    def _wait_deliveries(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            expected = checks.expected_events(self, self._final_jobs())
            acked = {r.webhook_id for r in list(self.receiver.requests) if r.status < 300}
            if expected <= acked:
                return
            time.sleep(2)

    def _client_of(self, key: str) -> str:
        return next(job.client for job in self.plan.jobs if job.key == key)

    def _final_jobs(self, by_key: bool = False) -> dict:
        """Every job the storm was answered for, read through the API (None where it cannot be read)."""
        out = {}
        for job in self.plan.jobs:
            job_id = self.record.job_ids.get(job.key)
            body = None
            if job_id:
                for _ in range(5):
                    try:
                        response = self.api("GET", job.client, f"/v1/jobs/{job_id}")
                        if response.status_code == 200:
                            body = response.json()
                            break
                    except requests.RequestException:
                        pass
                    time.sleep(0.5)
            out[job.key if by_key else job.key] = body
        return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main(argv=None, storm=Storm, prog="python -m tests.chaos", database="payonce_chaos", jobs=500) -> int:
    """`storm`: the storm to run (the upgrade storm, tests/chaos/upgrade.py, is one), with its defaults."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(10**6)))
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("CHAOS_JOBS", jobs)))
    parser.add_argument("--submit-s", type=float, default=None, help="jobs arrive over this many seconds")
    parser.add_argument("--settle-s", type=float, default=240)
    parser.add_argument("--broker", choices=("redis", "amqp"), default=os.environ.get("BROKER", "redis") or "redis")
    parser.add_argument("--hosts", action="store_true", default=os.environ.get("HOSTS") == "1")
    parser.add_argument("--database", default=database,
                        help="the database's name in the storm's own PostgreSQL server, and the RabbitMQ vhost's")
    parser.add_argument("--redis-db", type=int, default=5)
    parser.add_argument("--redis", default="127.0.0.1:6379",
                        help="host:port of the loopback Redis whose --redis-db is the broker (the suite passes its own)")
    parser.add_argument("--no-pg-restart", action="store_true", help="never restart the storm's PostgreSQL")
    parser.add_argument("--keep", action="store_true", help="keep the logs")
    parser.add_argument("--traces", action="store_true",
                        help="export every process's spans to a receiver, and check that its paid calls are the ledger")
    args = parser.parse_args(argv)
    if args.traces and args.hosts:
        parser.error("--traces runs its receiver on loopback: not with --hosts")
    if args.submit_s is None:
        args.submit_s = storm.submit_s(args.jobs)
    return storm(args).run()
