"""`make run`'s launcher: honcho starts every process of the Procfile, and once each of them answers this
prints the demo client's key and curl lines again (written by `manage.py demo_client` to
var/demo.txt), since by then the processes' start-up lines have scrolled them away.

Ready means: `web` answers HTTP, the sandbox answers its ledger, both Celery workers answer a ping, and
beat has set up its schedule since the start (its started mark, config.celery.Scheduler). Ctrl-C reaches
honcho (the same process group), which stops every process; this waits for it and exits with its status.

    python -m config.devrun -p 8000   # the arguments are honcho's, after `start -f Procfile`
"""

import os
import signal
import subprocess
import sys
import time

import requests

from config.celery import app, beat_started_mark

READY_WITHIN_S = 120.0


def _web_answers(base_url: str) -> bool:
    return _answers(f"{base_url}/admin/login/")  # a page for anyone: no 401 warning in the log


def _answers(url: str) -> bool:
    try:
        requests.get(url, timeout=1)
        return True
    except requests.RequestException:
        return False


def _workers_answer() -> set[str]:
    """Which of the two queues' workers answer a ping (named jobs@... and webhooks@... by the Procfile)."""
    try:
        replies = app.control.ping(timeout=1.0)
    except Exception:  # the broker is not there yet, or went away: nobody answered
        return set()
    return {name.partition("@")[0] for reply in replies for name in reply}


def _beat_started(schedule_file: str, since: float) -> bool:
    """beat rewrote its started mark (config.celery.Scheduler) since `since`: the mark holds its time."""
    try:
        started = float(beat_started_mark(schedule_file).read_text().split()[1])
    except (OSError, IndexError, ValueError):  # not there yet (a first run), or from an older version
        return False
    return started >= since


def waiting_for(settings, since: float) -> list[str]:
    """The processes that do not answer yet."""
    missing = []
    if not _web_answers(settings.PUBLIC_BASE_URL):
        missing.append("web")
    missing += sorted({"jobs", "webhooks"} - _workers_answer())
    if not _beat_started(settings.CELERY_BEAT_SCHEDULE_FILENAME, since):
        missing.append("beat")
    if not _answers(f"{settings.SANDBOX_URL}/ledger"):
        missing.append("sandbox")
    return [{"jobs": "worker"}.get(name, name) for name in missing]


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.conf import settings

    since = time.time() - 1
    honcho = subprocess.Popen([sys.executable, "-m", "honcho", "start", "-f", "Procfile", *argv])
    # Ctrl-C is for honcho, which stops the processes; this one waits for it to finish doing so.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    deadline = time.monotonic() + READY_WITHIN_S
    while honcho.poll() is None:
        missing = waiting_for(settings, since)
        if not missing:
            demo = settings.VAR_DIR / "demo.txt"
            text = demo.read_text() if demo.exists() else ""
            print(f"\n==> payonce is up: every process answers.\n{text}", flush=True)
            break
        if time.monotonic() > deadline:
            print(f"\n==> after {READY_WITHIN_S:.0f} s these still do not answer: {', '.join(missing)} "
                  "(their lines above say why)", flush=True)
            break
        time.sleep(0.5)
    return honcho.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
