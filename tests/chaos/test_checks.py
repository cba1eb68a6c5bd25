"""The storm's checks (tests/chaos/checks.py) fed made-up outcomes: a second charge is excused only by a
fact from outside payonce (the sandbox's own record of the render, the policy and the person's retries
the storm itself sent, an LLM call's 3 tries), never by what payonce wrote about its attempt; an aimed
kill must hit work in flight, and the capped client must have been refused.

No stack, no database: each test builds the jobs as the API would show them, the sandbox's ledger and
its generations, and the storm's own record, and runs the check on them."""

from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace

from tests.chaos import checks
from tests.chaos.plan import JobPlan
from tests.chaos.storm import Record

PRICE = {"video-keyed": "0.400000", "image-lookup": "0.040000", "image-blind": "0.040000", "llm": "0.010000"}


class Outcome:
    """The end of a made-up storm: `final` (the jobs), `ledger`, `generations` and a `storm` with its plan
    and its record."""

    def __init__(self):
        self.final, self.plans, self.charges, self.generations = {}, [], [], {}
        self.storm = SimpleNamespace(record=Record(), plan=SimpleNamespace(jobs=self.plans))

    def _charge(self, job_id: str, number: int, upstream_key: str, model: str, sandbox_status: str | None) -> None:
        n = len(self.charges) + 1
        gen_id = f"gen_{n:06d}" if model != "llm" else f"msg_{n:06d}"
        self.charges.append({
            "id": f"ch_{n:06d}", "model": model, "amount_usd": PRICE[model], "generation_id": gen_id,
            "request_id": upstream_key if model in ("video-keyed", "llm") else None,
            "metadata": {"upstream_key": upstream_key, "payonce_job": job_id, "payonce_attempt": number},
        })
        if model != "llm":
            self.generations[gen_id] = {"id": gen_id, "model": model, "status": sandbox_status}

    def media(self, key: str, attempts: list[tuple], *, paid_retries: int | None = None,
              retried_before: int | None = None, client: str = "alpha", status: str = "succeeded",
              error: str | None = None) -> dict:
        """attempts: (model, payonce's state, payonce's cost or None, the sandbox's status of its charged
        render or None when the sandbox never charged it). retried_before: the storm made a person's
        retry when the attempts numbered below it existed."""
        job_id = f"job-{key}"
        policy = {"attempts_per_model": 3}
        if paid_retries is not None:
            policy["paid_retries"] = paid_retries
        self.plans.append(JobPlan(len(self.plans), client, key, {"kind": "media", "policy": policy}, 0.0, "media"))
        rows = []
        for number, (model, state, cost, sandbox_status) in enumerate(attempts, start=1):
            upstream_key = f"{key}-{number}"
            rows.append({"number": number, "state": state, "cost_usd": cost, "upstream_key": upstream_key,
                         "provider": "sandbox", "model": model})
            if sandbox_status is not None:
                self._charge(job_id, number, upstream_key, model, sandbox_status)
        if retried_before is not None:
            self.storm.record.retries[job_id] = list(range(1, retried_before))
        job = {"id": job_id, "kind": "media", "status": status, "run": 2 if retried_before else 1,
               "error": {"code": error} if error else None, "attempts": rows, "chapters": None, "policy": policy}
        self.final[key] = job
        return job

    def report(self, key: str, calls_per_chapter: dict[str, int]) -> dict:
        """One run; each chapter's LLM call charged `n` times (n attempts, each charged)."""
        job_id = f"job-{key}"
        self.plans.append(JobPlan(len(self.plans), "beta", key, {"kind": "report"}, 0.0, "report"))
        rows, chapters, number = [], [], 0
        for chapter, calls in calls_per_chapter.items():
            mine = []
            for call in range(calls):
                number += 1
                upstream_key = f"{key}-{number}"
                last = call == calls - 1
                row = {"number": number, "state": "succeeded" if last else "uncertain",
                       "cost_usd": PRICE["llm"] if last else None, "upstream_key": upstream_key,
                       "provider": "sandbox", "model": "llm"}
                rows.append(row)
                mine.append({"upstream_key": upstream_key})
                self._charge(job_id, number, upstream_key, "llm", None)
            chapters.append({"key": chapter, "status": "done", "attempts": mine})
        job = {"id": job_id, "kind": "report", "status": "succeeded", "run": 1, "error": None,
               "attempts": rows, "chapters": chapters, "policy": {}}
        self.final[key] = job
        return job

    @property
    def ledger(self) -> dict:
        total = sum((Decimal(c["amount_usd"]) for c in self.charges), Decimal(0))
        return {"charges": self.charges, "total_usd": str(total)}

    def second_charges(self) -> checks.Result:
        result = checks.Result()
        checks.check_second_charges(self.storm, self.final, self.ledger, self.generations, result)
        return result


def duplicates(result: checks.Result) -> list[str]:
    return [failure for failure in result.failures if failure.startswith("duplicate paid call")]


# -- the made-up outcomes the audit found passing ------------------------------------------------------


def test_a_render_paid_twice_is_a_duplicate_when_the_sandbox_says_the_first_one_succeeded():
    # Given payonce marked the first attempt "failed with a cost", while the sandbox rendered it
    outcome = Outcome()
    outcome.media("k1", [("video-keyed", "failed", PRICE["video-keyed"], "succeeded"),
                         ("video-keyed", "succeeded", PRICE["video-keyed"], "succeeded")], paid_retries=1)
    # Then payonce's word excuses nothing: the second charge is a duplicate paid call
    result = outcome.second_charges()
    assert len(duplicates(result)) == 1 and result.figures["duplicate paid calls"] == 1
    assert result.figures["paid failures then a new attempt"] == 0


def test_a_render_the_sandbox_failed_paid_again_with_paid_retries_0_is_a_duplicate():
    outcome = Outcome()
    outcome.media("k1", [("video-keyed", "failed", PRICE["video-keyed"], "failed"),
                         ("video-keyed", "succeeded", PRICE["video-keyed"], "succeeded")])  # no paid_retries: 0
    result = outcome.second_charges()
    assert result.figures["duplicate paid calls"] == 1 and not result.ok


def test_a_render_the_sandbox_failed_three_times_with_paid_retries_1_has_one_duplicate():
    # The old executor's fail_render: paid, failed, paid again, failed, paid again (3 charges).
    outcome = Outcome()
    outcome.media("k1", [("video-keyed", "failed", PRICE["video-keyed"], "failed")] * 2
                  + [("video-keyed", "succeeded", PRICE["video-keyed"], "succeeded")], paid_retries=1)
    result = outcome.second_charges()
    assert result.figures["paid failures then a new attempt"] == 1
    assert result.figures["duplicate paid calls"] == 1 and not result.ok


def test_a_report_chapter_charged_6_times_in_one_run_is_3_duplicates():
    outcome = Outcome()
    outcome.report("r1", {"chapter-1": 6, "chapter-2": 1})
    result = outcome.second_charges()
    assert result.figures["rule paid again"] == 2  # charges 2 and 3: the call's own tries
    assert result.figures["duplicate paid calls"] == 3 and len(duplicates(result)) == 3


def test_a_blind_render_charged_twice_without_a_person_retry_is_a_duplicate():
    # payonce calls the first attempt uncertain: only a person's retry (made by the storm) may pay again
    outcome = Outcome()
    outcome.media("b1", [("image-blind", "uncertain", None, "succeeded"),
                         ("image-blind", "succeeded", PRICE["image-blind"], "succeeded")])
    result = outcome.second_charges()
    assert result.figures["duplicate paid calls"] == 1 and not result.ok


def test_a_keyed_render_paid_again_after_a_person_retry_is_a_duplicate():
    # A key (or a lookup) finds the first render: a person's retry excuses a second charge only on a blind
    # model, or after a render the sandbox failed.
    outcome = Outcome()
    outcome.media("k2", [("video-keyed", "uncertain", None, "succeeded"),
                         ("video-keyed", "succeeded", PRICE["video-keyed"], "succeeded")], retried_before=2)
    assert outcome.second_charges().figures["duplicate paid calls"] == 1


def test_an_aimed_kill_that_hit_nothing_and_a_cap_that_never_refused_fail():
    outcome = Outcome()
    outcome.media("c1", [("image-lookup", "succeeded", PRICE["image-lookup"], "succeeded")], client="capped")
    outcome.storm.record.aimed = [{"aim": "submit_in_flight", "at": 3.0, "calls_out": 2},
                                  {"aim": "answer_before_commit", "at": 9.0, "attempts_held": 0}]
    result = checks.Result()
    checks.check_landed(outcome.storm, outcome.final, result)
    assert result.failures == [
        "an aimed kill that hit nothing in flight: {'aim': 'answer_before_commit', 'at': 9.0, 'attempts_held': 0}",
        "the capped client was never refused (no job of its ended BUDGET_EXCEEDED): its cap did not bind",
    ]


def test_a_cap_its_client_never_came_near_is_said_not_failed_and_one_it_reached_must_refuse():
    outcome = Outcome()
    outcome.media("c1", [("image-lookup", "succeeded", PRICE["image-lookup"], "succeeded")], client="capped")
    far = checks.Result()
    far.figures["spend capped"] = {"spent_usd": "1.090820", "reserved_usd": "0.000000", "cap_usd": "1.80"}
    checks.check_landed(outcome.storm, outcome.final, far)
    assert far.failures == [] and "not reached" in far.figures["capped refused"]
    near = checks.Result()
    near.figures["spend capped"] = {"spent_usd": "1.500000", "reserved_usd": "0.100000", "cap_usd": "1.80"}
    checks.check_landed(outcome.storm, outcome.final, near)
    assert near.failures == [
        "the capped client was never refused (no job of its ended BUDGET_EXCEEDED): its cap did not bind"]


# -- an honest storm ------------------------------------------------------------------------------------


def test_an_honest_outcome_passes_with_each_allowance_counted():
    outcome = Outcome()
    # paid once
    outcome.media("k1", [("video-keyed", "succeeded", PRICE["video-keyed"], "succeeded")])
    # an unanswered send (not charged), then the same key: one charge
    outcome.media("k2", [("video-keyed", "failed", None, None),
                         ("video-keyed", "succeeded", PRICE["video-keyed"], "succeeded")])
    # a paid failure the sandbox records as failed, paid again once under paid_retries 1
    outcome.media("k3", [("video-keyed", "failed", PRICE["video-keyed"], "failed"),
                         ("video-keyed", "succeeded", PRICE["video-keyed"], "succeeded")], paid_retries=1)
    # a paid failure with paid_retries 0, retried by the person (the storm's own retry)
    outcome.media("k4", [("video-keyed", "failed", PRICE["video-keyed"], "failed"),
                         ("video-keyed", "succeeded", PRICE["video-keyed"], "succeeded")], retried_before=2)
    # a blind render left uncertain, retried by the person
    outcome.media("b1", [("image-blind", "uncertain", None, "succeeded"),
                         ("image-blind", "succeeded", PRICE["image-blind"], "succeeded")], retried_before=2)
    # a chapter's LLM call paid 3 times (its 3 tries), the others once
    outcome.report("r1", {"chapter-1": 3, "chapter-2": 1, "chapter-3": 2})
    # the cap refused one of the capped client's jobs; every aimed kill caught something
    outcome.media("c1", [], client="capped", status="failed", error="BUDGET_EXCEEDED")
    outcome.storm.record.aimed = [{"aim": "submit_in_flight", "at": 3.0, "calls_out": 2},
                                  {"aim": "answer_before_commit", "at": 9.0, "attempts_held": 1},
                                  {"aim": "upload_before_finish", "at": 15.0, "jobs_held": 4}]

    result = outcome.second_charges()
    checks.check_landed(outcome.storm, outcome.final, result)

    assert result.ok, result.failures
    assert result.figures["duplicate paid calls"] == 0
    assert result.figures["paid failures then a new attempt"] == 1  # k3
    assert result.figures["person paid again"] == 2  # k4, b1
    assert result.figures["rule paid again"] == 3  # r1: chapter-1 twice, chapter-3 once
    assert result.figures["capped refused"] == 1
