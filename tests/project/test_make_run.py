"""`make install` then `make run` from a fresh copy of the repository, as a user who is not root (the
suite run as root runs them as `nobody`, with a HOME of its own), on a database and a broker of their
own: the stack comes up, prints the demo key and lines again once every process answers, and serves the
demo; its output is plain log lines, with no routine lines of the periodic tasks and a console mail as
readable lines. Then Ctrl-C stops every process."""

import getpass
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import pytest
import requests
from psycopg import sql

from tests.support import redis_server
from tests.support.procs import REPO_ROOT, free_port, per_worker
from tests.support.commands import ctrl_c_as_a_terminal
from tests.support.reports import report_body

pytestmark = pytest.mark.e2e
BROKER_URL = redis_server.url(14)  # no other test uses it
DATABASE = per_worker("payonce_make_run")
UP = "==> payonce is up: every process answers."


def server_url(name: str) -> str:
    """A URL of the suite's PostgreSQL server for the database `name`."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    # Named, not left to libpq: with no user it connects as the login user, which is `nobody` there.
    user = db["USER"] or getpass.getuser()
    auth = user + (f":{db['PASSWORD']}" if db["PASSWORD"] else "") + "@"
    return f"postgres://{auth}{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{name}"


def drop_database() -> None:
    with psycopg.connect(server_url("postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))


@pytest.fixture
def clone():
    """The repository's files as git has them (tracked and new, not ignored: no .venv, no var/), in a
    directory a user who is not root may write, with a HOME of that user's own."""
    root = Path(tempfile.mkdtemp(prefix="payonce-make-run-"))
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO_ROOT,
                           capture_output=True, check=True).stdout.split(b"\0")
    tree = root / "payonce"
    for name in filter(None, files):
        source = REPO_ROOT / os.fsdecode(name)
        if source.is_file():  # a tracked file deleted in the working tree is not there
            (tree / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / os.fsdecode(name))
    (root / "home").mkdir()
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", "nobody:", str(root)], check=True)
        root.chmod(0o755)
    drop_database()
    yield tree
    drop_database()
    shutil.rmtree(root, ignore_errors=True)


def as_user(argv: list[str]) -> list[str]:
    """The command as `nobody` when the suite runs as root; as the (non-root) user otherwise."""
    return ["runuser", "-u", "nobody", "--", *argv] if os.geteuid() == 0 else argv


class Output:
    """A process's merged stdout and stderr, read as it comes."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc):
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, what, timeout: float, after: int = -1) -> int:
        """The index of the first line after `after` that `what` accepts."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for index, line in enumerate(list(self.lines)):
                if index > after and what(line):
                    return index
            time.sleep(0.2)
        raise AssertionError(f"not seen within {timeout} s; the output ends:\n" + "\n".join(self.lines[-60:]))


def test_make_install_then_make_run_serve_the_demo_for_a_user_who_is_not_root(clone):
    home = clone.parent / "home"
    port, sandbox_port = free_port(), free_port()
    env = {
        "HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
        "DATABASE_URL": server_url(DATABASE), "BROKER_URL": BROKER_URL, "PORT": str(port),
        "SANDBOX_PORT": str(sandbox_port), "PYTHONUNBUFFERED": "1",
        # The periodic tasks every second, so a minute's worth of their routine lines would show.
        "SWEEP_INTERVAL_S": "1", "WEBHOOK_DRAIN_INTERVAL_S": "1",
    }
    env["PATH"] = ":".join(part for part in env["PATH"].split(":") if ".venv" not in part)  # not the suite's venv
    installed = subprocess.run(as_user(["make", "install"]), cwd=clone, env=env, capture_output=True, text=True,
                               timeout=600)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    # The stack only: the test packages are make test's.
    assert subprocess.run([str(clone / ".venv/bin/python"), "-c", "import pytest"], capture_output=True).returncode != 0
    assert subprocess.run([str(clone / ".venv/bin/python"), "-c", "import playwright"], capture_output=True).returncode != 0

    run = subprocess.Popen(as_user(["make", "run"]), cwd=clone, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True,
                           preexec_fn=ctrl_c_as_a_terminal)  # Ctrl-C reaches it even from a suite run in the background
    output = Output(run)
    try:
        up = output.wait_for(lambda line: line == UP, timeout=180)
        demo = (clone / "var/demo.txt").read_text()
        assert (clone / "var/demo.txt").stat().st_mode & 0o077 == 0  # it holds the key
        shown = output.wait_for(lambda line: "The admin:" in line, timeout=10, after=up)
        assert "\n".join(output.lines[up + 1:shown + 1]) + "\n" == demo  # printed again, after every process is up
        key = re.search(r"API key:\s+(\S+)", demo).group(1)
        assert "a polling client" in demo

        # The printed curl line, twice: one job (201, then 202).
        line = next(text.strip() for text in demo.splitlines() if "Idempotency-Key: demo-first-render" in text)
        answers = [subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=30).stdout
                   for _ in range(2)]
        assert [answer.strip().rsplit("\n", 1)[1] for answer in answers] == ["HTTP 201", "HTTP 202"]
        render = json.loads(answers[0].strip().rsplit("\n", 1)[0])["id"]

        base, bearer = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {key}"}
        created = requests.post(f"{base}/v1/jobs", json=report_body(chapters=["sun", "moon"]),
                                headers={**bearer, "Idempotency-Key": "make-run-report"}, timeout=10)
        assert created.status_code == 201, created.text
        report = created.json()["id"]
        for job_id in (render, report):
            deadline = time.monotonic() + 90
            while (job := requests.get(f"{base}/v1/jobs/{job_id}", headers=bearer, timeout=10).json())["status"] != "succeeded":
                assert job["status"] in ("queued", "running") and time.monotonic() < deadline, job
                time.sleep(0.3)
        report_link = job["output"]["link"]  # the last job waited for: the report
        ledger = requests.get(f"http://127.0.0.1:{sandbox_port}/ledger", timeout=10).json()
        assert [charge["model"] for charge in ledger["charges"]].count("video-keyed") == 1  # one render, once

        # beat and the worker ran the periodic tasks (billing.fold folded every settled reservation) ...
        deadline = time.monotonic() + 30
        with psycopg.connect(server_url(DATABASE)) as conn:
            while conn.execute("SELECT count(*) FROM billing_reservation WHERE NOT folded").fetchone()[0]:
                assert time.monotonic() < deadline, "billing.fold never ran"
                time.sleep(0.5)
                conn.rollback()
            assert conn.execute("SELECT count(*) FROM billing_reservation").fetchone()[0] >= 2
            # ... and a polling client's jobs wrote no delivery.
            assert conn.execute("SELECT count(*) FROM webhooks_delivery").fetchone()[0] == 0
        mail = output.wait_for(lambda line: "payonce.mail" in line, timeout=30, after=up)
        time.sleep(1)  # the rest of the worker's lines
    finally:
        os.killpg(run.pid, signal.SIGINT)  # Ctrl-C: make, the launcher, honcho and every process
        try:
            run.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    lines = output.lines
    ran = lines[up:]

    # Plain lines, not JSON; none of Celery's lines about the periodic tasks.
    assert not [line for line in ran if re.search(r"\|\s*\{\"", line)]
    assert not [line for line in ran if re.search(r"Sending due task|(jobs\.sweep|webhooks\.drain|billing\.fold)\[", line)]
    # The console mail as readable lines, with its report link whole (EMAIL_CONSOLE_LINKS, as the README
    # says); nothing through celery.redirected.
    assert not [line for line in lines if "celery.redirected" in line]
    # The mail is read as its own record: the lines of the process that wrote it (honcho merges every
    # process's output), up to that process's next record (a line opening with its time).
    writer = lines[mail].partition("|")[0].split()[-1]
    written = [line.partition("| ")[2] for line in lines[mail:] if line.partition("|")[0].split()[-1:] == [writer]]
    record = written[:1] + list(itertools.takewhile(lambda line: not re.match(r"\d{4}-\d\d-\d\d \d\d:", line),
                                                     written[1:]))
    text = "\n".join(record)
    assert "To: ada@example.com" in text and "Subject: " in text
    # The same link, whole: the mail's is signed when the mail is written and the job's output's when the
    # job ends, so their timestamps may differ by a second; what the link names (the token's payload, up to
    # its first colon) is the same.
    base, _, token = report_link.partition("/r/")
    assert f"{base}/r/{token.partition(':')[0]}:" in text and "[redacted]" not in text, (report_link, text)
    # Ctrl-C stopped every process: none holds the web port.
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/admin/login/", timeout=2)

    # A second `make run` on the same checkout: up well within devrun's 120 s (beat seen as started, not
    # judged by its schedule file's time), and the demo key printed again, the same one.
    again = subprocess.Popen(as_user(["make", "run"]), cwd=clone, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True,
                             preexec_fn=ctrl_c_as_a_terminal)
    second = Output(again)
    started = time.monotonic()
    try:
        up_again = second.wait_for(lambda line: line == UP, timeout=60)
        took = time.monotonic() - started
        shown = second.wait_for(lambda line: "The admin:" in line, timeout=10, after=up_again)
    finally:
        os.killpg(again.pid, signal.SIGINT)
        try:
            again.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(again.pid, signal.SIGKILL)
            again.wait()
    printed = "\n".join(second.lines[up_again + 1:shown + 1])
    assert re.search(r"API key:\s+(\S+)", printed).group(1) == key, printed
    assert not [line for line in second.lines if "still do not answer" in line]
    print(f"second make run: up in {took:.1f} s")
