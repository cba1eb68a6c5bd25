"""What the storm checks when it has settled, from the outside only: the jobs as the HTTP API shows them,
the sandbox's ledger (the ground truth of what was paid), the receiver's log, and the budget rows for the
cap (sampled while it ran). Each check adds a line to the one-screen summary and fails the storm if it
finds anything.

Money, in Decimal, never float:
- every ledger charge maps to exactly one attempt (by the upstream key it arrived with, and its
  request_id where the model takes one), of the same model, job and number;
- every attempt that claims a charge (it records a cost, or it succeeded) has exactly one, for the same
  amount; a charge on an attempt that claims none is allowed only on an `uncertain` attempt (payonce says
  it does not know, and a person decides), and is shown;
- payonce's recorded cost equals the ledger's, per attempt, per job and in total (the uncertain charges
  aside, shown beside it);
- a duplicate paid call: a second charge for the same work (a media job's render; a report's chapter or
  synthesis) that no fact from outside payonce excuses (check_second_charges): not a paid failure the
  sandbox itself records as `failed` within the policy.paid_retries the storm sent, not a person's retry
  the storm itself made, not an LLM chapter's own tries (3 a run). There must be none.

And that the storm did what it meant to: each aimed kill hit something in flight, and the capped client
was refused (BUDGET_EXCEEDED) at least once.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

import psycopg

from tests.support.traces import assert_calls_are_the_ledger, paid_calls, wait_for_the_ledger

BLIND = {"image-blind", "llm"}  # neither a key nor a lookup: only a person may pay again (llm: its 3 tries too)
# What each aimed kill (storm.Storm.aimed_kill) counts of the work it caught in flight.
AIMED_HIT = {"submit_in_flight": "calls_out", "answer_before_commit": "attempts_held",
             "upload_before_finish": "jobs_held"}
FAMILY_OF_MODEL = {"video-keyed": "keyed", "image-lookup": "lookup", "image-blind": "blind", "llm": "blind"}


@contextlib.contextmanager
def pg(url: str):
    """A connection of the storm's own: its application_name keeps it from the connections the storm cuts."""
    from tests.chaos.pgserver import CHECKER

    with psycopg.connect(url.replace("postgres://", "postgresql://"), connect_timeout=3,
                         application_name=CHECKER) as conn:
        yield conn


# -- reading a job -------------------------------------------------------------------------------------


def error_code(job: dict) -> str | None:
    return (job.get("error") or {}).get("code")


def at_rest(job: dict) -> bool:
    """Terminal, or waiting on a person after an uncertain submit."""
    return job["status"] in ("succeeded", "failed", "cancelled") or (
        job["status"] == "waiting" and error_code(job) == "UNCERTAIN_SUBMIT")


def signature(job: dict) -> str:
    """What a watcher sees change as a job makes progress."""
    attempts = ",".join(f"{a['number']}{a['state'][:3]}" for a in job["attempts"])
    chapters = sum(1 for c in job.get("chapters") or [] if c["status"] == "done")
    return f"{job['status']}|{attempts}|{chapters}"


def attempt_numbers(job: dict) -> list[int]:
    return sorted(a["number"] for a in job["attempts"])


def segments(job: dict) -> dict[str, list[dict]]:
    """A job's attempts grouped by the one thing each group pays for: the render, or each chapter and the
    synthesis of a report."""
    chapter_of = {}
    for chapter in job.get("chapters") or []:
        for attempt in chapter["attempts"]:
            chapter_of[attempt["upstream_key"]] = chapter["key"]
    groups = defaultdict(list)
    for attempt in sorted(job["attempts"], key=lambda a: a["number"]):
        groups[chapter_of.get(attempt["upstream_key"], "main")].append(attempt)
    return groups


def allowed_events(storm, final: dict) -> set[str]:
    """The events that may have happened besides the expected ones: a cancelled job may have waited on a
    person (needs_review) in the run it was cancelled in."""
    return {f"{job['id']}:{job['run']}:generation.needs_review"
            for job in final.values() if job and job["status"] == "cancelled"}


def expected_events(storm, final: dict) -> set[str]:
    """The webhook-ids the storm's jobs must have delivered: each run's end (a run a person retried
    ended waiting on an uncertain submit, so its event was needs_review)."""
    events = set()
    for job in final.values():
        if not job:
            continue
        for run in range(1, job["run"]):
            events.add(f"{job['id']}:{run}:generation.needs_review")
        if job["status"] in ("succeeded", "failed", "cancelled"):
            events.add(f"{job['id']}:{job['run']}:generation.{job['status']}")
        elif at_rest(job):
            events.add(f"{job['id']}:{job['run']}:generation.needs_review")
    return events


# -- the checks ----------------------------------------------------------------------------------------


@dataclass
class Result:
    failures: list[str] = field(default_factory=list)
    figures: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures

    def fail(self, message: str) -> None:
        self.failures.append(message)


def run_all(storm, final: dict, ledger: dict, generations: dict) -> Result:
    """`generations`: the sandbox's own record of each charged render (sandbox_generations)."""
    result = Result()
    check_jobs(storm, final, result)
    check_books(storm, final, ledger, result)
    check_second_charges(storm, final, ledger, generations, result)
    check_deliveries(storm, final, result)
    check_cap(storm, final, result)
    check_running_limits(storm, result)
    check_catalog(storm, result)
    check_landed(storm, final, result)
    check_traces(storm, ledger, result)
    recovery(storm, result)
    for what in storm.record.unexpected:
        result.fail(f"unexpected: {what}")
    # A 503 (PostgreSQL restarting: DATABASE_UNAVAILABLE, with Retry-After) is an answer a client
    # retries; any other 5xx is a bug.
    for error in [e for e in storm.record.server_errors if e[3] != 503][:5]:
        result.fail(f"a {error[3]} answer: {error}")
    return result


def check_traces(storm, ledger: dict, result: Result) -> None:
    """With --traces: the paid calls of the traces are the ledger (tests/support/traces.py), through every
    kill, flush and restart of the storm."""
    if getattr(storm, "otlp", None) is None:
        return
    charges = ledger["charges"]
    try:
        spans = wait_for_the_ledger(storm.otlp, charges, timeout=30)
        by_key = assert_calls_are_the_ledger(spans, charges)
    except AssertionError as failed:
        result.fail(f"traces: {str(failed)[:1500]}")
        return
    recovered = sum(1 for key_spans in by_key.values() for span in key_spans
                    if span["attributes"].get("payonce.recovered"))
    result.figures["traces"] = (f"{len(paid_calls(spans))} paid-call spans ({recovered} emitted by the execution that "
                                f"took a call over) for {len(charges)} charges; {len({s['trace_id'] for s in spans})} "
                                f"traces, {len(spans)} spans")


def check_jobs(storm, final: dict, result: Result) -> None:
    record = storm.record
    # A job refused at submit because its model was disabled (storm.Storm._refused_as_disabled) has no row:
    # its client was told (422), so it is not lost. Any other key with no job is.
    refused = storm.record.refused_disabled
    lost = [job.key for job in storm.plan.jobs if final.get(job.key) is None and job.key not in refused]
    result.figures["refused, model disabled"] = sum(1 for job in storm.plan.jobs
                                                    if final.get(job.key) is None and job.key in refused)
    for key, answers in record.answers.items():
        if len({job_id for _, job_id in answers}) != 1:
            result.fail(f"one key, two jobs: {key} {answers}")
    stuck = [job for job in final.values() if job and not at_rest(job)]
    for key in lost[:5]:
        result.fail(f"lost: {key} (no job answered, or it cannot be read)")
    for job in stuck[:5]:
        result.fail(f"stuck: {job['id']} {job['status']} {error_code(job)}")
    if len(lost) > 5 or len(stuck) > 5:
        result.fail(f"... {len(lost)} lost and {len(stuck)} stuck in all")
    result.figures["lost"], result.figures["stuck"] = len(lost), len(stuck)
    result.figures["end states"] = Counter(
        f"{job['status']}" + (f" {error_code(job)}" if error_code(job) else "") for job in final.values() if job)
    replays = Counter(status for answers in record.answers.values() for status, _ in answers)
    result.figures["answers"] = replays


def check_books(storm, final: dict, ledger: dict, result: Result) -> None:
    attempts = {}  # upstream key -> (job, attempt)
    for job in final.values():
        if job:
            for attempt in job["attempts"]:
                attempts[attempt["upstream_key"]] = (job, attempt)
    paid = defaultdict(list)
    for charge in ledger["charges"]:
        metadata = charge.get("metadata") or {}
        key = metadata.get("upstream_key")
        if key not in attempts:
            result.fail(f"a charge with no attempt: {charge}")
            continue
        job, attempt = attempts[key]
        if charge.get("request_id") is not None and charge["request_id"] != key:
            result.fail(f"request_id and upstream_key disagree: {charge}")
        if (attempt["provider"], attempt["model"]) != ("sandbox", charge["model"]) or \
                metadata.get("payonce_job") != job["id"] or metadata.get("payonce_attempt") != attempt["number"]:
            result.fail(f"a charge that names another attempt: {charge} vs {attempt}")
        paid[key].append(charge)

    recorded, uncertain_paid = Decimal(0), Decimal(0)
    uncertain_charged = 0
    for key, (job, attempt) in attempts.items():
        charges = paid.get(key, [])
        if len(charges) > 1:
            result.fail(f"attempt {key} charged {len(charges)} times")
        claims = attempt["cost_usd"] is not None or attempt["state"] == "succeeded"
        if claims and len(charges) != 1:
            result.fail(f"attempt {key} ({attempt['state']}) claims a charge; the ledger has {len(charges)}")
        if not claims and charges:
            if attempt["state"] == "uncertain":
                uncertain_charged += 1
                uncertain_paid += Decimal(charges[0]["amount_usd"])
            else:
                result.fail(f"attempt {key} ({attempt['state']}) was charged but does not say so")
        if attempt["cost_usd"] is not None:
            cost = Decimal(attempt["cost_usd"])
            recorded += cost
            if charges and Decimal(charges[0]["amount_usd"]) != cost:
                result.fail(f"attempt {key} records {cost}, the ledger charged {charges[0]['amount_usd']}")
    for job in final.values():
        if job:
            mine = sum((Decimal(c["amount_usd"]) for a in job["attempts"] if a["cost_usd"] is not None
                        for c in paid.get(a["upstream_key"], [])), Decimal(0))
            if Decimal(job["cost"]["total_usd"]) != mine:
                result.fail(f"job {job['id']} costs {job['cost']['total_usd']}, its charges {mine}")
    total = sum((Decimal(c["amount_usd"]) for c in ledger["charges"]), Decimal(0))
    if total != Decimal(ledger["total_usd"]):
        result.fail(f"the ledger's total {ledger['total_usd']} is not its charges' {total}")
    if recorded + uncertain_paid != total:
        result.fail(f"payonce recorded {recorded} + uncertain {uncertain_paid} != ledger {total}")

    result.figures.update({
        "charges": len(ledger["charges"]), "dollars": total, "recorded": recorded,
        "uncertain charged": (uncertain_charged, uncertain_paid), "attempts": len(attempts),
    })


def person_retries(storm, job_id: str) -> int:
    """How many times the storm itself POSTed /v1/jobs/{id}/retry and was answered (its own record)."""
    return 1 if job_id in storm.record.retries else 0


def paid_retries(storm, key: str) -> int:
    """The job's policy.paid_retries as the storm sent it (its plan), 0 when it sent none."""
    plan = next(job for job in storm.plan.jobs if job.key == key)
    return int((plan.body.get("policy") or {}).get("paid_retries", 0))


def check_second_charges(storm, final: dict, ledger: dict, generations: dict, result: Result) -> None:
    """Every second charge for the same work (a media job's render, a report's chapter or synthesis) is a
    duplicate paid call unless a fact from outside payonce excuses it:

    - a paid failure: the sandbox's own record of the charge before it (GET /v1/generations/{id}) says
      `failed`; then at most policy.paid_retries (as the storm sent it) times in each run;
    - a person's retry: the first charge of a run the storm itself started (POST /v1/jobs/{id}/retry),
      after a paid failure, or on a blind model (image-blind: neither key nor lookup);
    - an LLM chapter's own tries: at most 3 charges in each run (DESIGN 7: a chapter's LLM call makes up
      to 3 attempts on 5xx and network errors).

    Which run a charge belongs to is read from the charge's own metadata (payonce_attempt, as the
    sandbox recorded it) against the attempt numbers the storm saw when it made the retry; nothing
    payonce says about an attempt's state excuses a charge.
    """
    keys_of = {job["id"]: key for key, job in final.items() if job}
    segment_of = {}  # upstream key -> (job id, segment)
    for job in final.values():
        if job:
            for segment, group in segments(job).items():
                for attempt in group:
                    segment_of[attempt["upstream_key"]] = (job["id"], segment)
    work = defaultdict(list)  # (job id, segment) -> its charges, in the sandbox's order
    for charge in ledger["charges"]:
        where = segment_of.get((charge.get("metadata") or {}).get("upstream_key"))
        if where is not None:  # a charge with no attempt fails check_books
            work[where].append(charge)

    duplicates, figures = [], Counter()
    for (job_id, segment), charges in work.items():
        before_retry = storm.record.retries.get(job_id)

        def run_of(charge) -> int:
            number = (charge.get("metadata") or {}).get("payonce_attempt")
            return 1 if before_retry is None or number in before_retry else 2

        allowance = paid_retries(storm, keys_of[job_id])
        in_run, paid_again_in_run = Counter(), Counter()
        for n, charge in enumerate(charges):
            run = run_of(charge)
            in_run[run] += 1
            if n == 0:
                continue
            earlier = charges[n - 1]
            new_run = run > run_of(earlier) and in_run[run] == 1 and person_retries(storm, job_id) >= run - 1
            if charge["model"] == "llm":
                if in_run[run] == 1 and new_run:
                    figures["person paid again"] += 1
                elif in_run[run] <= 3:
                    figures["rule paid again"] += 1
                else:
                    duplicates.append((job_id, segment, charge["id"], f"LLM charge {in_run[run]} of run {run}"))
                continue
            failed = (generations.get(earlier.get("generation_id")) or {}).get("status") == "failed"
            if failed and paid_again_in_run[run] < allowance:
                paid_again_in_run[run] += 1
                figures["paid failures paid again"] += 1
            elif new_run and (failed or earlier["model"] in BLIND):
                figures["person paid again"] += 1
            else:
                sandbox_says = (generations.get(earlier.get("generation_id")) or {}).get("status", "unread")
                duplicates.append((job_id, segment, charge["id"], f"after {earlier['id']} ({earlier['model']}, "
                                   f"{sandbox_says} at the sandbox), paid_retries {allowance}, run {run}"))
    for duplicate in duplicates[:5]:
        result.fail(f"duplicate paid call: {duplicate}")
    if len(duplicates) > 5:
        result.fail(f"... {len(duplicates)} duplicate paid calls in all")
    result.figures.update({
        "duplicate paid calls": len(duplicates), "paid failures then a new attempt": figures["paid failures paid again"],
        "person paid again": figures["person paid again"], "rule paid again": figures["rule paid again"],
    })


def sandbox_generations(sandbox_url: str, ledger: dict) -> dict:
    """The sandbox's own record (GET /v1/generations/{id}) of every charged render: id -> its view. A
    fault left pending on `poll` may answer a read: each is read again until it answers 200."""
    import time

    import requests

    out = {}
    for charge in ledger["charges"]:
        gen_id = charge.get("generation_id") or ""
        if not gen_id.startswith("gen_"):
            continue  # an LLM message: no generation to read
        for _ in range(20):
            try:
                response = requests.get(f"{sandbox_url}/v1/generations/{gen_id}", timeout=10)
                if response.status_code == 200:
                    out[gen_id] = response.json()
                    break
            except requests.RequestException:
                pass
            time.sleep(0.25)
    return out


def check_deliveries(storm, final: dict, result: Result) -> None:
    import json

    receiver = storm.receiver
    client_of_job = {}
    for plan in storm.plan.jobs:
        job = final.get(plan.key)
        if job:
            client_of_job[job["id"]] = plan.client
    expected = expected_events(storm, final)
    requests_ = list(receiver.requests)
    acked, seen_as = set(), {}
    bad_signature = 0
    for r in requests_:
        if not (r.verified and getattr(r, "own_secret", False)):
            bad_signature += 1
        try:
            body = json.loads(r.body)
        except ValueError:
            result.fail(f"a delivery that is not JSON: {r.body[:100]!r}")
            continue
        if body.get("id") != r.webhook_id:
            result.fail(f"webhook-id {r.webhook_id} carries envelope {body.get('id')}")
        seen_as.setdefault(r.webhook_id, (body.get("type"), (body.get("data") or {}).get("id")))
        if seen_as[r.webhook_id] != (body.get("type"), (body.get("data") or {}).get("id")):
            result.fail(f"webhook-id {r.webhook_id} sent as two different events")
        job_id = (body.get("data") or {}).get("id")
        if r.path != f"/hooks/{client_of_job.get(job_id)}":
            result.fail(f"job {job_id}'s event went to {r.path}")
        if r.status < 300:
            acked.add(r.webhook_id)
    if bad_signature:
        result.fail(f"{bad_signature} deliveries not signed with their client's secret")
    missing, extra = expected - acked, set(seen_as) - expected - allowed_events(storm, final)
    for event in sorted(missing)[:5]:
        result.fail(f"never delivered: {event}")
    for event in sorted(extra)[:5]:
        result.fail(f"an event for something that did not happen: {event}")
    after_ack = Counter()
    first_ack = {}
    for r in requests_:
        if r.webhook_id in first_ack:
            after_ack[r.webhook_id] += 1
        elif r.status < 300:
            first_ack[r.webhook_id] = r
    result.figures.update({
        "events expected": len(expected), "events delivered": len(acked & expected), "deliveries": len(requests_),
        "deliveries failed by the receiver": sum(1 for r in requests_ if r.status >= 300),
        "redelivered after a 2xx": sum(after_ack.values()), "missing": len(missing),
    })


def _spend(storm, client: str) -> dict:
    """GET /v1/spend as a careful client reads it: a 503 (web's pooled connection was just cut, or the
    database restarts: DATABASE_UNAVAILABLE) is asked again after its Retry-After."""
    for _ in range(20):
        response = storm.api("GET", client, "/v1/spend")
        if response.status_code != 503:
            break
        time.sleep(min(float(response.headers.get("Retry-After") or 1), 2.0))
    assert response.status_code == 200, (client, response.status_code, response.text[:300])
    return response.json()


# A settle's drift is first seen at its transaction's start (now()); a reservation whose statement ran
# while that transaction was still open did not see the floor yet. It was in flight too: this is how long.
DRIFT_COMMIT_SLACK_S = 2.0


def drift_margins(storm, result: Result) -> dict[str, Decimal]:
    """What a price drift lets each client's month past its cap: the money its attempts settled above their
    reservations by. Every such attempt must have been reserved before its model's drift was first seen
    (in flight then): one reserved after it would mean the floor did not hold."""
    names = {creds["client_id"]: name for name, creds in storm.clients.items()}
    with pg(storm.stack.local_database_url) as conn:
        rows = conn.execute(
            "SELECT b.client_id::text, r.model, r.key, r.amount, r.spent, r.created_at, d.first_seen_at"
            "  FROM billing_reservation r JOIN billing_budgetmonth b ON b.id = r.budget_id"
            "  LEFT JOIN billing_pricedrift d ON d.model = r.model"
            " WHERE r.state = 'settled' AND r.spent > r.amount").fetchall()
    margins: dict[str, Decimal] = defaultdict(Decimal)
    in_flight = 0
    for client_id, model, key, amount, spent, created_at, first_seen in rows:
        if first_seen is None:
            result.fail(f"{key} settled at {spent} over its reservation of {amount}, and no drift of {model} is recorded")
        elif (created_at - first_seen).total_seconds() > DRIFT_COMMIT_SLACK_S:
            result.fail(f"{key} was reserved at {amount} after {model}'s drift was first seen, and settled at {spent}")
        margins[names.get(client_id, client_id)] += spent - amount
        in_flight += 1
    result.figures["drift in flight"] = in_flight
    return margins


def check_running_limits(storm, result: Result) -> None:
    """A client's jobs in progress never above its running limit at any sample (jobs.dispatch), and none
    holding a slot once the storm has settled: every slot taken was given back."""
    for breach in storm.record.slot_breaches[:5]:
        result.fail(f"more jobs in progress than the client's running limit: {breach}")
    with pg(storm.stack.local_database_url) as conn:
        left = conn.execute("SELECT count(*) FROM jobs_job WHERE holds_slot").fetchone()[0]
    if left:
        result.fail(f"{left} jobs still hold a slot of their client's running limit after the storm settled")
    result.figures["most in progress at once (sampled)"] = dict(storm.record.slot_most)


def check_cap(storm, final: dict, result: Result) -> None:
    """spent + reserved <= cap at every sample and at the end, each client's cap raised only by the margin
    a price drift allows (drift_margins), which the summary prints."""
    record = storm.record
    margins = drift_margins(storm, result)
    over = [(t, name, excess) for t, name, excess in record.cap_breaches if excess > margins.get(name, 0)]
    for breach in over[:5]:
        result.fail(f"spent + reserved > cap + its drift margin {margins.get(breach[1], 0)}: {breach}")
    if record.cap_samples < max(5, int(storm.elapsed["total"] * 0.5)):
        result.fail(f"only {record.cap_samples} cap samples in {storm.elapsed['total']:.0f} s")
    from tests.chaos.storm import CAPS

    result.figures["drift margins"] = {name: margins.get(name, Decimal(0)) for name in CAPS}
    result.figures["most over the cap"] = {name: max([excess for _, who, excess in record.cap_breaches if who == name],
                                                     default=Decimal(0)) for name in CAPS}
    for name in CAPS:
        spend = _spend(storm, name)
        allowed = Decimal(spend["cap_usd"]) + margins.get(name, Decimal(0))
        if Decimal(spend["spent_usd"]) + Decimal(spend["reserved_usd"]) > allowed:
            result.fail(f"{name}'s spend at the end is over its cap and drift margin ({allowed}): {spend}")
        jobs = [final[plan.key] for plan in storm.plan.jobs if plan.client == name and final.get(plan.key)]
        mine = sum((Decimal(job["cost"]["total_usd"]) for job in jobs), Decimal(0))
        unpriced = sum(job["cost"]["unpriced_attempts"] for job in jobs)
        # Spent is the jobs' recorded cost, plus, for each attempt nobody could price, its reservation.
        # The jobs count every attempt nobody could price; the spend only those a person (or the rule
        # for cheap calls) has decided about: an uncertain attempt's money is reserved until then.
        if spend["unpriced_attempts"] > unpriced:
            result.fail(f"{name}'s spend counts {spend['unpriced_attempts']} unpriced attempts, its jobs {unpriced}")
        if Decimal(spend["spent_usd"]) < mine or (unpriced == 0 and Decimal(spend["spent_usd"]) != mine):
            result.fail(f"{name}'s spend says {spend['spent_usd']}, its jobs cost {mine} ({unpriced} unpriced)")
        result.figures[f"spend {name}"] = spend
    result.figures["cap samples"] = (record.cap_samples, record.cap_gaps, len(over))


def check_catalog(storm, result: Result) -> None:
    """What the operators changed landed, and was held to: the wrong models file was refused by the
    processes that read it and the right one loaded again (their counters, on /metrics); the lowered
    price drifted (its row is there) and the model's reservations then took the floor (drift_margins)."""
    from tests.chaos.plan import LOWERED_MODEL
    from tests.chaos.storm import MODELS_FILE_WRONG_S

    with pg(storm.stack.local_database_url) as conn:
        drift = conn.execute("SELECT first_seen_at, reserved_usd, highest_cost_usd, drifts FROM billing_pricedrift"
                             " WHERE model = %s", [LOWERED_MODEL]).fetchone()
    if drift is None:
        result.fail(f"the storm priced {LOWERED_MODEL} below what the sandbox charges, and no drift was seen")
    else:
        result.figures["drift"] = (round(drift[0].timestamp() - storm.t0, 1), drift[1], drift[2], drift[3])
    refused = storm.record.models_file_refused
    if refused is not None and not refused:
        result.fail(f"the models file was written wrong and no process refused it within {MODELS_FILE_WRONG_S} s")
    result.figures["models file"] = (f"refused by {refused:g} processes before it was put right" if refused
                                     else "not counted (no metrics Redis)" if refused is None else "never refused")
    result.figures["catalog"] = [f"{round(t - storm.t0, 1)} s {what}" for t, what in storm.record.catalog]


def check_landed(storm, final: dict, result: Result) -> None:
    """The storm made the faults it claims: every aimed kill caught work in flight (a kill that hit idle
    workers tests nothing), and the capped client's cap refused at least one job."""
    for aim in storm.record.aimed:
        if not aim.get(AIMED_HIT[aim["aim"]]):
            result.fail(f"an aimed kill that hit nothing in flight: {aim}")
    refused = sum(1 for plan in storm.plan.jobs if plan.client == "capped" and final.get(plan.key)
                  and error_code(final[plan.key]) == "BUDGET_EXCEEDED")
    spend = result.figures.get("spend capped")  # check_cap's reading, when it ran
    if not refused and spend:
        asked, cap = Decimal(spend["spent_usd"]) + Decimal(spend["reserved_usd"]), Decimal(spend["cap_usd"])
        if asked < cap * Decimal("0.8"):
            # This seed's jobs for the capped client asked for well under its cap (an operator's lowered price
            # among them, or cheap kinds drawn): nothing was due a refusal, so nothing was tested, and
            # check_cap still holds the client under its cap. Said, not failed.
            result.figures["capped refused"] = f"0 (its jobs asked ${asked} of its ${cap} cap: not reached)"
            return
    if not refused:
        result.fail("the capped client was never refused (no job of its ended BUDGET_EXCEEDED): its cap did not bind")
    result.figures["capped refused"] = refused


def recovery(storm, result: Result) -> None:
    """After the broker flush and the PostgreSQL restart: how long until each job that was in flight
    showed progress again (its status, an attempt, a chapter: what a watcher of the API sees)."""
    from tests.chaos.storm import percentile

    record = storm.record
    for name, started in (("broker flush", record.events.get("broker flush")),
                          ("postgres restart", record.events.get("postgres restart"))):
        if started is None:
            continue
        waits = []
        for history in record.progress.values():
            before = [sig for t, sig in history if t <= started]
            if not before or before[-1] == "ended":
                continue
            after = [t for t, sig in history if t > started]
            if after:
                waits.append(after[0] - started)
        result.figures[f"recovery after {name}"] = (len(waits), percentile(waits, 0.5), percentile(waits, 0.99))
    if "postgres back" in record.events:
        result.figures["postgres down"] = record.events["postgres back"] - record.events["postgres restart"]


# -- the screen ----------------------------------------------------------------------------------------


def summary(storm, final: dict, ledger: dict, result: Result) -> str:
    f, record, args = result.figures, storm.record, storm.args
    lines = [
        "",
        f"== payonce storm  CHAOS_SEED={args.seed}  jobs={args.jobs}  broker={args.broker}  "
        f"hosts={'netns' if args.hosts else 'one'}  {storm.elapsed['total']:.0f} s "
        f"(jobs sent over {storm.elapsed['submit']:.0f} s) ==",
        "faults injected: " + ", ".join(f"{k} x{v}" for k, v in sorted(record.faults.items())),
        "kills: " + ", ".join(f"{k} x{v}" for k, v in sorted(record.kills.items()))
        + f"; broker flushed x{int('broker flush' in record.events)}; postgres restarted "
          f"x{int('postgres restart' in record.events)}; connections cut x{len(record.cuts)} "
          f"({sum(record.cuts)} backends)",
        "aimed kills: " + "; ".join(", ".join(f"{k}={v}" for k, v in aim.items() if k != "aim") + f" ({aim['aim']})"
                                    for aim in record.aimed),
        "POSTs: " + ", ".join(f"{k} x{v}" for k, v in sorted(f["answers"].items())) + "; failed and sent again: "
        + (", ".join(f"{k} x{v}" for k, v in sorted(record.post_errors.items())) or "none")
        + f"; cancels: {dict(record.cancels)}; person retries: {len(record.retries)}",
        f"5xx answers seen: {len(record.server_errors)}"
        + (f" (first: {record.server_errors[0]})" if record.server_errors else ""),
        "jobs by end state: " + ", ".join(f"{k} {v}" for k, v in sorted(f["end states"].items())),
        f"lost {f['lost']}  stuck {f['stuck']}  refused at submit, model disabled {f['refused, model disabled']}",
        "operators: " + "; ".join(f["catalog"]) + f"; the wrong models file: {f['models file']}",
        "price drift: " + (f"first seen at {f['drift'][0]} s, reserved {f['drift'][1]}, "
                           f"highest cost {f['drift'][2]}, {f['drift'][3]} settles over" if f.get("drift") else "none")
        + f"; {f['drift in flight']} attempts in flight at it; margin over the cap: "
        + ", ".join(f"{name} {margin}" for name, margin in f["drift margins"].items())
        + "; most over the cap sampled: " + ", ".join(f"{name} {excess}" for name, excess in f["most over the cap"].items()),
        f"ledger: {f['charges']} charges, ${f['dollars']}; payonce recorded ${f['recorded']}; "
        f"uncertain and charged: {f['uncertain charged'][0]} (${f['uncertain charged'][1]})",
        f"duplicate paid calls {f['duplicate paid calls']}; paid failures (failed at the sandbox) paid again "
        f"within policy.paid_retries: {f['paid failures then a new attempt']}; paid again after a person's retry "
        f"{f['person paid again']}; LLM calls paid again within their 3 tries {f['rule paid again']}",
        *([f"traces: {f['traces']}"] if "traces" in f else []),
        f"webhooks: {f['events delivered']}/{f['events expected']} events delivered, {f['deliveries']} deliveries, "
        f"{f['deliveries failed by the receiver']} failed by the receiver, {f['redelivered after a 2xx']} "
        f"redelivered after a 2xx (deduped by webhook-id); missing {f['missing']}",
        "cap: {} samples, {} unreadable, {} over the cap and its drift margin; capped refused {} jobs; ".format(
            *f["cap samples"], f.get("capped refused"))
        + "; ".join(f"{name} spent {f[f'spend {name}']['spent_usd']} reserved {f[f'spend {name}']['reserved_usd']} "
                    f"cap {f[f'spend {name}']['cap_usd']}" for name in ("alpha", "beta", "capped")),
    ]
    for name in ("broker flush", "postgres restart"):
        figure = f.get(f"recovery after {name}")
        if figure:
            n, p50, p99 = figure
            lines.append(f"recovery after {name}: {n} jobs in flight, progress again p50 "
                         f"{p50 if p50 is None else round(p50, 1)} s, p99 {p99 if p99 is None else round(p99, 1)} s"
                         + (f" (down {f['postgres down']:.1f} s)" if name == "postgres restart" and "postgres down" in f else ""))
    lines.append("RESULT: " + ("PASS" if result.ok else f"FAIL ({len(result.failures)})"))
    lines.extend(f"  - {failure}" for failure in result.failures[:25])
    return "\n".join(lines)
