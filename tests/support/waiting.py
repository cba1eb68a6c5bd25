"""Waiting, by polling, for a job (through the API) or any condition to come true; failing with what was
seen when it does not in time."""

import time


def wait_for(api, job_id: str, statuses: set[str], timeout: float = 30.0) -> tuple[dict, list[str]]:
    """Poll GET /v1/jobs/{id} until the job is in one of `statuses`; returns it and the states seen."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = api.job(job_id)
        if not seen or seen[-1] != job["status"]:
            seen.append(job["status"])
        if job["status"] in statuses:
            return job, seen
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still {seen[-1]!r} after {timeout}s (seen {seen})")


def wait_until(predicate, timeout: float = 15.0, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{message} not met within {timeout}s")
