"""`make run`'s readiness of beat (config.devrun): a beat started again on an unchanged schedule is seen
as up, as the first one is (issue 38: a second `make run` waited 120 s and said beat did not answer)."""

import time

import pytest

from config import devrun
from config.celery import beat_started_mark
from tests.support.procs import ProcfileProcess

pytestmark = pytest.mark.e2e


def started_within(schedule: str, since: float, timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if devrun._beat_started(schedule, since):
            return time.monotonic()
        time.sleep(0.1)
    return None


def test_beat_started_again_on_the_same_schedule_is_seen_as_up(tmp_path):
    schedule = str(tmp_path / "celerybeat-schedule")
    beat = ProcfileProcess("beat", {"PAYONCE_VAR_DIR": tmp_path}, ready="")
    try:
        for run in range(2):
            since = time.time() - 1  # as devrun takes it, just before honcho starts the processes
            assert not devrun._beat_started(schedule, since)  # the last run's mark is older
            launched = time.monotonic()
            beat.launch()
            seen = started_within(schedule, since, timeout=30)
            assert seen is not None, f"run {run + 1}: beat not seen as up\n{beat.output(beat.offset)[-3000:]}"
            print(f"run {run + 1}: beat seen as up {seen - launched:.2f} s after its start")
            assert beat.alive
            beat.stop()
            time.sleep(1.1)  # the next run's `since` is past this one's mark
    finally:
        beat.kill()
    assert beat_started_mark(schedule).read_text().split()[0].isdigit()  # the pid of the last beat
