"""The deployment starting points in deploy/ cannot drift from the Procfile and the settings tables.

- every Procfile process has a systemd unit (the sandbox has none, for the reason docs/operating.md gives),
  and each unit runs `deploy/procfile-exec <name>`, which runs exactly the Procfile's line, read at start:
  checked by printing it and by starting `web` and `worker` through it;
- the env example names every setting of docs/api.md's and docs/operating.md's settings tables, and
  nothing else;
- the Containerfile copies requirements.txt and installs from it, runs as a user of its own, and its
  ENTRYPOINT and CMD start any Procfile process (no docker engine runs here: it is read, not built);
- the unit files parse, carry the keys a unit needs, and pass `systemd-analyze verify` where it is
  installed.
"""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import requests
from django.conf import settings

from tests.support.procs import REPO_ROOT, ProcfileProcess, free_port

DEPLOY = REPO_ROOT / "deploy"
PROCFILE = REPO_ROOT / "Procfile"
OPERATING = REPO_ROOT / "docs" / "operating.md"
API = REPO_ROOT / "docs" / "api.md"
INSTALL_DIR = "/opt/payonce"  # where the units expect the checkout (docs/operating.md, "systemd units")
ENV_FILE = "/etc/payonce/payonce.env"
# Procfile processes with no unit, each for the reason docs/operating.md gives in these words.
NO_UNIT = {"sandbox": "The sandbox gets no unit"}


def procfile() -> dict[str, str]:
    processes = {}
    for line in PROCFILE.read_text().splitlines():
        match = re.match(r"^([a-z]+):\s*(.+)$", line)
        if match:
            processes[match.group(1)] = match.group(2).strip()
    return processes


def unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """A systemd unit file: each section's (key, value) pairs in order (a key may repeat, as Environment= does)."""
    sections, current = {}, None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
            continue
        assert current is not None, f"{path.name}: {line!r} before any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: {line!r} is not Key=Value"
        current.append((key.strip(), value.strip()))
    return sections


def values(sections: dict, section: str, key: str) -> list[str]:
    return [value for name, value in sections.get(section, []) if name == key]


def procfile_exec_print(name: str) -> str:
    done = subprocess.run([str(DEPLOY / "procfile-exec"), "--print", name], capture_output=True, text=True,
                          timeout=10)
    assert done.returncode == 0, done.stderr
    return done.stdout.rstrip("\n")


# --- units and the Procfile ---------------------------------------------------------------------------------


def test_every_procfile_process_has_a_unit_or_a_documented_reason_not_to():
    units = {path.name.removeprefix("payonce-").removesuffix(".service") for path in DEPLOY.glob("payonce-*.service")}
    processes = set(procfile())

    assert processes - units == set(NO_UNIT), "a Procfile process without a unit in deploy/"
    assert units - processes == {"migrate"}, "a unit for a process the Procfile does not have"
    for reason in NO_UNIT.values():
        assert reason in OPERATING.read_text()


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(set(procfile()) - set(NO_UNIT)))
def test_each_unit_runs_the_procfile_line_of_its_process(name):
    sections = unit(DEPLOY / f"payonce-{name}.service")

    assert values(sections, "Service", "ExecStart") == [f"{INSTALL_DIR}/deploy/procfile-exec {name}"]
    assert values(sections, "Service", "WorkingDirectory") == [INSTALL_DIR]
    # What that ExecStart runs: the Procfile's line, word for word, as the Procfile says it today.
    assert procfile_exec_print(name) == procfile()[name]


@pytest.mark.e2e
def test_procfile_exec_runs_every_process_exactly_as_its_procfile_line_and_refuses_an_unknown_one():
    for name, command in procfile().items():
        assert procfile_exec_print(name) == command
    for wrong in ("nope", "web worker", "../web", ""):
        done = subprocess.run([str(DEPLOY / "procfile-exec"), *wrong.split(" ")], capture_output=True, text=True,
                              timeout=10)
        assert done.returncode == 64 and "procfile-exec" in done.stderr, (wrong, done)


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_procfile_exec_starts_web_and_worker_as_their_units_do():
    """The command of the units and the image, started for real: `web` on the PORT its unit sets, `worker`
    up and consuming (its ready line)."""
    web_unit = unit(DEPLOY / "payonce-web.service")
    port_set = [v for v in values(web_unit, "Service", "Environment") if re.search(r"\bPORT=\d+", v)]
    assert port_set, "payonce-web.service must set PORT (honcho gives one; systemd does not)"

    port = free_port()
    web = ProcfileProcess("web", {"PORT": port}, command=f"{DEPLOY}/procfile-exec web").start()
    worker = ProcfileProcess("worker", {"WORKER_CONCURRENCY": 2}, command=f"{DEPLOY}/procfile-exec worker")
    try:
        assert requests.get(f"http://127.0.0.1:{port}/v1/schema", timeout=10).status_code == 200
        # exec all the way down: the unit's main process is the server itself, which systemd signals.
        assert "uvicorn" in Path(f"/proc/{web.pid}/cmdline").read_bytes().decode().replace("\0", " ")
        worker.start()
        assert "celery" in Path(f"/proc/{worker.pid}/cmdline").read_bytes().decode()
    finally:
        worker.stop()
        web.stop()


def test_units_carry_what_a_service_needs_and_migrations_run_once_per_release_not_per_process():
    for path in sorted(DEPLOY.glob("payonce-*.service")):
        sections = unit(path)
        assert values(sections, "Unit", "Description"), path.name
        assert values(sections, "Service", "User") == ["payonce"], f"{path.name} runs as root"
        assert values(sections, "Service", "EnvironmentFile") == [ENV_FILE], path.name
        assert not values(sections, "Service", "ExecStartPre"), f"{path.name}: nothing runs before the process"
        if path.name == "payonce-migrate.service":
            assert values(sections, "Service", "Type") == ["oneshot"]
            assert values(sections, "Service", "ExecStart") == [f"{INSTALL_DIR}/.venv/bin/python manage.py migrate --noinput"]
            assert "Install" not in sections, "started by hand once per release, never enabled at boot"
            continue
        assert values(sections, "Service", "Restart") == ["always"], path.name
        assert values(sections, "Install", "WantedBy") == ["payonce.target"], path.name
        # No process waits for, or starts, the migrations: several web processes would race them.
        assert "migrate" not in " ".join(value for _, value in sections["Unit"]), path.name

    worker = unit(DEPLOY / "payonce-worker.service")
    longest_call = settings.PROVIDER_CONNECT_TIMEOUT_S + settings.LLM_READ_TIMEOUT_S
    assert float(values(worker, "Service", "TimeoutStopSec")[0]) > longest_call  # a warm shutdown ends its calls
    assert unit(DEPLOY / "payonce.target")["Install"] == [("WantedBy", "multi-user.target")]


@pytest.mark.e2e
def test_units_pass_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:  # macOS and minimal images have none; the unit files are still parsed and checked above
        pytest.skip("systemd-analyze is not installed on this machine")
    # The units name /opt/payonce and /etc/payonce: pointed at this checkout and an empty env file, so
    # verify checks that each command exists and is executable.
    (tmp_path / "payonce.env").write_text("")
    names = []
    for path in [*DEPLOY.glob("payonce-*.service"), DEPLOY / "payonce.target"]:
        text = path.read_text().replace(INSTALL_DIR, str(REPO_ROOT)).replace(ENV_FILE, str(tmp_path / "payonce.env"))
        (tmp_path / path.name).write_text(text)
        names.append(path.name)
    # `make test` always runs from this checkout's .venv, so this skip is met only by a pytest started
    # otherwise; verify would then fail on a missing interpreter, not on a unit.
    if not (REPO_ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv in this checkout: the migrate unit's python cannot be verified")

    done = subprocess.run([analyze, "verify", *names], cwd=tmp_path, capture_output=True, text=True, timeout=60)

    # An unknown key or section is only a warning (exit 0): any output at all fails.
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr


# --- the env example and the settings tables -----------------------------------------------------------------


def table_settings(path: Path) -> set[str]:
    """The names in the first column of every table whose first header is `variable`."""
    names, in_table = set(), False
    for line in path.read_text().splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0] == "variable":
            in_table = True
        elif in_table and not set(cells[0]) <= set("-: "):
            names.update(re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[0]))
    return names


def env_example() -> tuple[dict[str, str], set[str]]:
    """(the lines set, every name named set or commented out) of deploy/payonce.env.example."""
    set_lines, named = {}, set()
    for line in (DEPLOY / "payonce.env.example").read_text().splitlines():
        match = re.match(r"^(#?)([A-Z][A-Z0-9_]*)=(.*)$", line)
        if match:
            named.add(match.group(2))
            if not match.group(1):
                set_lines[match.group(2)] = match.group(3)
        else:
            assert not line.strip() or line.startswith("#"), f"not KEY=VALUE nor a comment: {line!r}"
    return set_lines, named


def test_the_env_example_names_every_setting_of_the_settings_tables():
    documented = table_settings(API) | table_settings(OPERATING)
    assert len(documented) > 80  # the tables were read
    _, named = env_example()

    assert documented - named == set(), "settings the docs' tables name that deploy/payonce.env.example lacks"


def test_the_env_example_names_only_settings_something_reads():
    set_lines, named = env_example()
    code = (REPO_ROOT / "config" / "settings.py").read_text() + OPERATING.read_text() + API.read_text()
    assert {name for name in named if name not in code} == set(), "a name nothing reads or documents"
    for must in ("DATABASE_URL", "BROKER_URL", "SECRET_KEY", "ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS",
                 "PUBLIC_BASE_URL", "OUTPUT_STORE_URL", "METRICS_TOKEN"):
        assert set_lines.get(must), f"{must} must be set in production: the example sets it"
    assert "DEBUG" not in set_lines and set_lines["SECRET_KEY"] == "CHANGE-ME"


# --- the Containerfile -------------------------------------------------------------------------------------


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Containerfile, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (DEPLOY / "Containerfile").read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def test_the_containerfile_installs_requirements_and_runs_as_a_user_of_its_own():
    steps = instructions()
    words = [word for word, _ in steps]
    assert words[0] == "FROM"
    copy_requirements = steps.index(("COPY", "requirements.txt ./"))
    install = next(i for i, (word, rest) in enumerate(steps) if word == "RUN" and "pip install -r requirements.txt" in rest)
    copy_all = steps.index(("COPY", ". ."))
    assert copy_requirements < install < copy_all  # dependencies in a layer code changes do not rebuild
    user = [rest for word, rest in steps if word == "USER"]
    assert user and user[-1] not in ("root", "0") and words.index("USER") > copy_all
    workdir = [rest for word, rest in steps if word == "WORKDIR"][-1]
    env = " ".join(rest for word, rest in steps if word == "ENV")
    assert f"PATH={workdir}/.venv/bin:" in env and re.search(r"\bPORT=\d+", env)  # the Procfile's names, a PORT
    # The host's virtualenv and state never reach the image (COPY . . would put this .venv over the image's).
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git", "var", ".env"} <= set(ignored)


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(procfile()))
def test_the_containerfiles_entrypoint_starts_each_procfile_process(name):
    steps = dict(instructions())
    entrypoint, cmd = json.loads(steps["ENTRYPOINT"]), json.loads(steps["CMD"])  # exec form: PID 1 is the process
    assert cmd == ["web"] and entrypoint == ["deploy/procfile-exec"]
    workdir = [rest for word, rest in instructions() if word == "WORKDIR"][-1]

    # `docker run IMAGE <name>` runs ENTRYPOINT + [name] in WORKDIR, where COPY . . put this checkout.
    done = subprocess.run([*entrypoint, "--print", name], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)

    assert workdir == "/app" and done.returncode == 0 and done.stdout.rstrip("\n") == procfile()[name]


def test_every_deploy_file_the_operating_guide_names_exists():
    named = set(re.findall(r"`(deploy/[A-Za-z0-9_.\-]+)`", OPERATING.read_text()))
    assert {"deploy/Containerfile", "deploy/payonce.env.example", "deploy/procfile-exec"} <= named
    assert {path for path in named if not (REPO_ROOT / path).exists()} == set()
