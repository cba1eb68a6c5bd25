"""The upgrade storm (`make chaos-upgrade`): a release rolled out, and rolled back, with jobs in flight.

    python -m tests.chaos.upgrade [--seed N] [--jobs 150]

The stack starts on the previous release's code (deploy/previous-release, checked out by
tests/support/previous_release.py) and its schema; clients send media jobs and reports, with the
sandbox's faults and an operator's price change as the storm draws them (tests/chaos/plan.py; the storm's
kills, broker flush and PostgreSQL restart are left out, so that what goes wrong is the deploy's). Then,
while they run, as docs/operating.md "Upgrading with jobs in flight" says a deploy goes:

1. this release's `manage.py migrate`, while the old processes serve;
2. `web` onto the new code: a new process started beside the old one, the balancer in front
   (tests/chaos/balancer.py) switched to it, the old one stopped warm;
3. the workers, one at a time (a warm stop: running tasks finish, unacknowledged messages go back), then
   `webhooks` and `beat`;
4. the workers rolled back onto the old code, with the new schema in place, and forward again.

Half the reports are sent as paid orders (`POST /v1/orders`, with the buyer's email in the input too,
as the contract allows: a release once refused it), so orders cross the deploy as well.

It checks from the outside, with the storm's checks (tests/chaos/checks.py): every create answered
201/202 exists and ends, 0 duplicate paid calls, the books to the cent, every event delivered at least
once under its stable id, the cap and the running limits held, no 5xx. It prints the deploy's own figures:
each step's time and the jobs in flight at it, the 5xx answers and failed connections during the steps,
and the longest a job in flight waited for its next progress across a step."""

from __future__ import annotations

import sys
import threading
import time

from tests.chaos import checks
from tests.chaos.balancer import Balancer
from tests.chaos.stack import START_TIMEOUT_S, Stack
from tests.chaos.storm import OPEN, Storm, main, percentile
from tests.support import previous_release
from tests.support.procs import REPO_ROOT, ProcfileProcess, free_port

# What the plan draws that the upgrade storm keeps: the sandbox's faults, an operator's lowered price (its
# drift is checked) and a model disabled for a while. Kills, the broker flush, the PostgreSQL restart and
# the wrong models file are the other storm's: here the deploy is the fault.
KEPT = ("fault", "price", "model_enabled")
WORKERS = ("worker0", "worker1")
# (share of the submit window, step, the code it moves to): "new" is this checkout, "old" the previous release.
DEPLOY = (
    (0.10, "migrate", "new"),
    (0.20, "web", "new"),
    (0.30, "worker0", "new"), (0.36, "worker1", "new"),
    (0.42, "webhooks", "new"), (0.48, "beat", "new"),
    (0.58, "worker0", "old"), (0.64, "worker1", "old"),  # the rollback: old code on the new schema
    (0.76, "worker0", "new"), (0.82, "worker1", "new"),  # and forward again
)
WARM_STOP_S = 30  # a warm stop waits this long for running tasks before it kills


class UpgradeStack(Stack):
    """The storm's stack on the previous release's code, with a balancer in front of `web`."""

    def __init__(self, *args, old, **kwargs):
        super().__init__(*args, **kwargs)
        self.root = old  # manage.py and every payonce process start on the old code
        self.code = {}  # process -> "old" or "new", as it runs now
        self.backend = free_port()
        self.balancer: Balancer | None = None

    def start(self) -> None:
        self.balancer = Balancer(self.web_port, self.backend).start()
        super().start()
        self.code = {name: "old" for name in self.procs if name != "sandbox"}

    def _process(self, name, command=None, ready=None, **env):
        if name == "web":
            env.setdefault("PORT", self.backend)
        return super()._process(name, command, ready, **env)

    def move(self, name: str, root) -> None:
        """`name` onto the code at `root`: `web` beside itself and then switched to, the others stopped warm
        and started again."""
        if name == "web":
            old, port = self.procs["web"], free_port()
            new = ProcfileProcess("web", {"PORT": port}, base=self.env, log_dir=self.workdir, root=root,
                                  start_timeout=START_TIMEOUT_S).start()
            self.balancer.switch(port)
            self.procs["web"] = new
            old.stop(timeout=WARM_STOP_S)
            return
        proc = self.procs[name]
        proc.stop(timeout=WARM_STOP_S)
        proc.root = root
        proc.start()

    def stop(self, keep: bool = False) -> None:
        if self.balancer:
            self.balancer.stop()
        super().stop(keep)


class UpgradeStorm(Storm):
    @staticmethod
    def submit_s(jobs: int) -> float:
        # Ten steps of 3 to 13 s each (a worker's warm stop and start, web's start beside itself) take about
        # a minute: the window is long enough that jobs are still sent, and in flight, at the last one.
        return max(90.0, jobs / 2)

    def __init__(self, args):
        super().__init__(args)
        self.release = previous_release.previous()
        self.old = previous_release.worktree()
        self.plan.events = [event for event in self.plan.events if event.kind in KEPT]
        self.steps: list[dict] = []
        self.orders = 0  # answers to orders

    def make_stack(self) -> Stack:
        args = self.args
        if args.hosts:
            raise SystemExit("the upgrade storm runs on one host (no --hosts)")
        print(f"upgrade: from {self.release.version} ({self.release.commit[:12]}) to this checkout", flush=True)
        return UpgradeStack(broker=args.broker, database=args.database, redis_db=args.redis_db, redis=args.redis,
                            old=self.old)

    def _storm(self) -> bool:
        deploy = threading.Thread(target=self._deploy, name="deploy", daemon=True)
        deploy.start()
        try:
            ok = super()._storm()
        finally:
            deploy.join()
        return self._report() and ok

    # -- orders --------------------------------------------------------------------------------------

    def _post(self, job) -> None:
        """Every other report is a paid order: its payment is the job's key, and its answer's `job_id` is
        the job the checks follow (an order sent again is the same order, 200, and the same job)."""
        if job.family != "report" or job.n % 2:
            return super()._post(job)
        report = job.body["input"]
        body = {"payment_id": job.key, "run_id": job.key, "product": "storm-report", "email": report["email"],
                "input": {"subject": report["subject"], "chapters": report["chapters"], "email": report["email"]}}
        if self._create(job, "/v1/orders", body, {}, accepted=(200, 201), id_field="job_id"):
            with self.lock:
                self.orders += 1

    # -- the deploy ----------------------------------------------------------------------------------

    def _deploy(self) -> None:
        roots = {"old": self.old, "new": REPO_ROOT}
        for share, name, code in DEPLOY:
            self.at(share * self.args.submit_s)
            step = {"step": f"{name} -> {code}", "at": time.time(), "in_flight": self._in_flight()}
            try:
                with self.procs_lock:
                    if name == "migrate":
                        self.stack.root = REPO_ROOT  # manage.py from now on is the new release's
                        step["migrations"] = self._migrate()
                    else:
                        self.stack.move(name, roots[code])
                        self.stack.code[name] = code
            except Exception as exc:  # a step that fails fails the storm
                with self.lock:
                    self.record.unexpected.append((f"deploy {name} -> {code}", "error", repr(exc)[:400]))
            step["took"] = time.time() - step["at"]
            self.steps.append(step)
            print(f"upgrade: {step['step']} at {step['at'] - self.t0:.1f} s took {step['took']:.1f} s, "
                  f"{step['in_flight']} jobs in flight" + (f", {step['migrations']} migrations applied"
                                                           if "migrations" in step else ""), flush=True)

    def _migrate(self) -> int:
        """The new release's migrations, as an operator runs them (with MIGRATE_LOCK_TIMEOUT_S): how many
        it applied."""
        out = self.stack.manage("migrate", "--noinput")
        return sum(1 for line in out.splitlines() if line.strip().startswith("Applying "))

    def _in_flight(self) -> int:
        try:
            with checks.pg(self.stack.local_database_url) as conn:
                return conn.execute("SELECT count(*) FROM jobs_job WHERE status = ANY(%s)", [list(OPEN)]).fetchone()[0]
        except Exception:
            return -1

    # -- its figures ---------------------------------------------------------------------------------

    def _report(self) -> bool:
        """The deploy's figures; fails when a step did not run or a process ended on the wrong code."""
        ok = True
        windows = [(step["at"], step["at"] + step["took"] + 2.0) for step in self.steps]
        during = lambda t: any(start <= self.t0 + t <= end for start, end in windows)  # noqa: E731
        errors_5xx = [error for error in self.record.server_errors if during(error[0])]
        # A job left waiting on a person (an uncertain submit) waits for the person, not the deploy: it is
        # not counted, nor is one a person retried after the settle.
        final = {job["id"]: job for job in self._final_jobs().values() if job}
        on_a_person = {job_id for job_id, job in final.items()
                       if job["status"] == "waiting" and checks.error_code(job) == "UNCERTAIN_SUBMIT"}
        on_a_person |= set(self.record.retries)
        waits = []
        for step in self.steps:
            for job_id, history in list(self.record.progress.items()):
                if job_id in on_a_person:
                    continue
                before = [sig for t, sig in history if t <= step["at"]]
                if not before or before[-1] == "ended":
                    continue
                after = [t for t, sig in history if t > step["at"]]
                if after:
                    waits.append(after[0] - step["at"])
        print(f"orders: {sum(1 for job in self.plan.jobs if job.family == 'report' and not job.n % 2)} reports sent as "
              f"paid orders, {self.orders} answers (an order sent again is the same order: 200)", flush=True)
        print(f"deploy: {len(self.steps)} steps of {len(DEPLOY)}; jobs in flight at each: "
              + ", ".join(f"{step['step']} {step['in_flight']}" for step in self.steps), flush=True)
        print(f"deploy: 5xx answers during the steps {len(errors_5xx)} (in all {len(self.record.server_errors)}); "
              f"POSTs that failed before an answer and were sent again: {dict(self.record.post_errors) or 'none'}; "
              f"connections the balancer found no web for: {self.stack.balancer.refused}", flush=True)
        print(f"deploy: a job in flight at a step next progressed after p50 {_round(percentile(waits, 0.5))} s, "
              f"p99 {_round(percentile(waits, 0.99))} s, longest {_round(max(waits) if waits else None)} s "
              f"({len(waits)} waits; {len(on_a_person)} jobs left waiting on a person not counted)", flush=True)
        if len(self.steps) != len(DEPLOY):
            print("UPGRADE: FAIL (a step did not run)")
            ok = False
        codes = dict(self.stack.code)
        if set(codes.values()) != {"new"}:
            print(f"UPGRADE: FAIL (processes left on the old code: {codes})")
            ok = False
        if errors_5xx:
            print(f"UPGRADE: FAIL ({len(errors_5xx)} 5xx answers during the steps: {errors_5xx[:3]})")
            ok = False
        print("UPGRADE: " + ("PASS" if ok else "FAIL"), flush=True)
        return ok


def _round(value):
    return None if value is None else round(value, 1)


if __name__ == "__main__":
    sys.exit(main(storm=UpgradeStorm, prog="python -m tests.chaos.upgrade", database="payonce_upgrade", jobs=150))
