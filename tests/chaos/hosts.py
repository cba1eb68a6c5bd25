"""Test hosts for the chaos storm: one Linux network namespace per process of the stack, so `web`, the
workers, `beat` and `webhooks` reach PostgreSQL, Redis, RabbitMQ, the sandbox, S3 and each other over real
links instead of one machine's loopback.

What `Hosts(["web", "worker1"], subnet="10.77.0.0/24", prefix="payonce-")` makes, inside `with`:

    root namespace                               veth pair    netns payonce-web
    bridge payonce-br 10.77.0.1/24 (the gateway)                  lo up, default via 10.77.0.1
      |- payonce-v0  <------------------------------------------>  eth0 10.77.0.11/24
      |                                                          netns payonce-worker1
      |- payonce-v1  <------------------------------------------>  eth0 10.77.0.12/24 (lo, route alike)

- Addresses: the gateway is the subnet's first address; host i (in the order given) gets the 11th + i.
  Every host reaches every other host and the gateway; the root namespace (the storm's load generator)
  reaches every host at its address. A root-namespace service bound to the gateway address (or to
  0.0.0.0) is reachable from every host as it is.
- Loopback services of the root namespace (PostgreSQL, Redis, RabbitMQ listen on 127.0.0.1 only) are
  made reachable by `forward(port)`: a socat process listening on gateway:port, one forked child per
  connection to 127.0.0.1:target. The listener never connects anything itself, so a target that
  restarts only fails the connections made while it was down; new ones work once it is back.
- Inside a host, 127.0.0.1 is that host's own loopback: point its settings at `gateway:port`.
- Name resolution: a host has no DNS server (the machine's is not reachable from the bridge, and a lookup would
  wait out its timeouts: Python's http.server does one at start). `ip netns exec` mounts
  /etc/netns/<netns>/{hosts,resolv.conf} over /etc's, and this module writes them: every host's name
  and "gateway" resolve from /etc/hosts, any other name fails at once (resolver on the host's loopback).
- `command(name, argv)` is `["ip", "netns", "exec", <netns>, *argv]`. `ip netns exec` execs argv, so the
  PID Popen returns is the process itself, and `start_new_session=True` makes it a process group leader
  that `os.killpg` reaches.

Names: the netns are `<prefix><name>`, the root-side links `<prefix>br` and `<prefix>v<i>` (Linux allows
15 characters, hence numbers, not names), the host side is always `eth0`. Each link and each host's eth0
carries the alias "payonce-hosts prefix=<prefix>", so runs whose prefixes start alike ("payonce-" and
"payonce-st-") never mistake each other's namespaces for their own.

Needs root (CAP_NET_ADMIN, and CAP_SYS_ADMIN for `ip netns`), `ip` (iproute2) and `socat`.
No sysctl and no firewall rule is changed: hosts talk over one bridge (layer 2) and to addresses of the
root namespace itself, so neither ip_forward nor rp_filter is involved. The one thing that could cut
hosts off from each other is br_netfilter (net.bridge.bridge-nf-call-iptables=1) together with an
iptables FORWARD chain that drops (Docker's does); `__enter__` warns when that can be the case.

Cleanup: `__exit__` (also `close()`, idempotent, and at interpreter exit if the caller never exits the
context) kills the forwarders by their PIDs (their process groups: the per-connection children too),
kills by PID any process the caller left running inside a host (SIGTERM, SIGKILL after 2 s), deletes
the veths, the namespaces, their /etc/netns/<netns> and the bridge. A run killed outright (SIGKILL, or
a SIGTERM nobody handles) leaves a state file in /run/payonce-hosts/<prefix>/; the next `__enter__` with
the same prefix removes what it lists (forwarders only if PID and start time still match) and anything
else carrying this prefix's alias, before it builds anything. A lock file there, which stays, stops two
live runs with one prefix from tearing each other down: the second gets a HostsError.

Self-test (as root, from the repository root):  .venv/bin/python -m tests.chaos.hosts --selftest
"""

from __future__ import annotations

import argparse
import atexit
import errno
import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

from tests.support.procs import free_port

NETNS_DIR = Path("/run/netns")  # where `ip netns` mounts named namespaces
NETNS_ETC = Path("/etc/netns")  # `ip netns exec NS` bind-mounts /etc/netns/NS/* over /etc/*
STATE_ROOT = Path("/run/payonce-hosts")
IFNAMSIZ = 15  # the kernel's limit on an interface name, without the NUL
FIRST_HOST_OFFSET = 11  # host i gets network address + 11 + i (10.77.0.11, .12, ...)
HOST_IFNAME = "eth0"
MARKER = "payonce-hosts prefix="  # + the prefix: the alias of every link made, the first line of /etc files


class HostsError(RuntimeError):
    """The hosts could not be built, or a forwarder could not start; the message carries the tool's words."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise HostsError(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None if it is
    gone or a zombie. A PID plus its start time names one process even after the PID is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)", which may contain spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _alive(pid: int) -> bool:
    return _start_time(pid) is not None


def _terminate(pids: list[int], *, group: bool, grace_s: float = 2.0) -> None:
    """SIGTERM each PID (or its process group), SIGKILL whatever still runs after grace_s."""
    kill = os.killpg if group else os.kill
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.01)
        if not any(_alive(pid) for pid in pids):
            return


def _pids_in_netns(netns_path: Path) -> list[int]:
    """PIDs whose network namespace is the one mounted at netns_path (what `ip netns pids` does)."""
    try:
        target = os.stat(netns_path)
    except FileNotFoundError:
        return []
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            ns = os.stat(f"/proc/{entry.name}/ns/net")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if (ns.st_dev, ns.st_ino) == (target.st_dev, target.st_ino) and int(entry.name) != os.getpid():
            pids.append(int(entry.name))
    return pids


def _listening(address: str, port: int, *, pid: int | None = None) -> bool:
    """Whether a TCP socket of the root namespace listens on address:port, and if pid is given, one that
    process holds (another listener on the port is not the forwarder). Read from /proc/net/tcp, so the
    check opens no connection through a forwarder to its target."""
    want = f"{int.from_bytes(socket.inet_aton(address), sys.byteorder):08X}:{port:04X}"
    with open("/proc/net/tcp") as table:
        next(table)
        inodes = {fields[9] for fields in map(str.split, table) if fields[1] == want and fields[3] == "0A"}
    if pid is None or not inodes:
        return bool(inodes)
    try:
        held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    except (FileNotFoundError, ProcessLookupError):
        return False
    return any(f"socket:[{inode}]" in held for inode in inodes)


def filtering_report() -> dict:
    """The settings that decide whether packets between hosts could be filtered or dropped."""

    def read(path: str) -> str | None:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return None

    return {
        "net.ipv4.ip_forward": read("/proc/sys/net/ipv4/ip_forward"),
        "net.ipv4.conf.all.rp_filter": read("/proc/sys/net/ipv4/conf/all/rp_filter"),
        "net.ipv4.conf.default.rp_filter": read("/proc/sys/net/ipv4/conf/default/rp_filter"),
        "net.bridge.bridge-nf-call-iptables": read("/proc/sys/net/bridge/bridge-nf-call-iptables"),
        "iptables tables loaded": (read("/proc/net/ip_tables_names") or "").split(),
        "nf_tables loaded": Path("/sys/module/nf_tables").exists(),
    }


class Hosts:
    """Test hosts: one network namespace per name, each linked by a veth pair to a bridge in the root
    namespace. Made by this run, removed by it (and leftovers of a crashed run removed at start)."""

    def __init__(self, names: list[str], subnet: str = "10.77.0.0/24", prefix: str = "payonce-"):
        if not names or len(set(names)) != len(names):
            raise ValueError(f"host names must be given and distinct: {names!r}")
        for name in names:
            if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", name):
                raise ValueError(f"host name {name!r}: lower-case letters, digits, '-' and '_' only")
        if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", prefix):
            raise ValueError(f"prefix {prefix!r}: lower-case letters, digits, '-', '_' and '.' only")
        if len(f"{prefix}v{len(names) - 1}") > IFNAMSIZ or len(f"{prefix}br") > IFNAMSIZ:
            raise ValueError(f"prefix {prefix!r} too long for interface names of {IFNAMSIZ} characters")
        self.names = list(names)
        self.prefix = prefix
        self.network = ipaddress.ip_network(subnet)
        if self.network.version != 4 or self.network.num_addresses < FIRST_HOST_OFFSET + len(names) + 1:
            raise ValueError(f"subnet {subnet} must be IPv4 with room for {len(names)} hosts from .11")
        self.gateway = str(self.network.network_address + 1)
        self._addresses = {
            name: str(self.network.network_address + FIRST_HOST_OFFSET + i) for i, name in enumerate(names)
        }
        self.bridge = f"{prefix}br"
        self._netns = {name: f"{prefix}{name}" for name in names}
        self._veth = {name: f"{prefix}v{i}" for i, name in enumerate(names)}  # root side
        self._peer = {name: f"{prefix}p{i}" for i, name in enumerate(names)}  # until renamed eth0 in netns
        self.marker = MARKER + prefix
        self.state_dir = STATE_ROOT / prefix
        self._state_file = self.state_dir / "state.json"
        self._lock_fd: int | None = None
        self._forwarders: dict[int, dict] = {}  # port -> {"target", "pid", "start_time", "popen"}
        # What this run made, so that close() removes exactly that (the state file lists what it meant to
        # make, for the next run to find after a crash).
        self._made_netns: list[str] = []
        self._made_links: list[str] = []
        self._guard = threading.Lock()
        self._entered = False
        self._owner_pid = os.getpid()

    # -- the interface -------------------------------------------------------------------------------------

    def address(self, name: str) -> str:
        return self._addresses[name]

    def netns_name(self, name: str) -> str:
        return self._netns[name]

    def command(self, name: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self._netns[name], *argv]

    def forward(self, port: int, target_port: int | None = None) -> str:
        """Make 127.0.0.1:target_port (a service of the root namespace: PostgreSQL, Redis, RabbitMQ) reachable
        from every host at gateway:port, through a TCP forwarder (socat) listening on the gateway address;
        returns "gateway:port". Called before `__enter__`, the forwarder starts there."""
        target = target_port or port
        with self._guard:
            known = self._forwarders.get(port)
            if known is not None:
                if known["target"] != target:
                    raise HostsError(f"{self.gateway}:{port} already forwards to 127.0.0.1:{known['target']}")
                return f"{self.gateway}:{port}"
            self._forwarders[port] = {"target": target, "pid": None, "start_time": None, "popen": None}
            if self._entered:
                self._start_forwarder(port)
        return f"{self.gateway}:{port}"

    def __enter__(self) -> "Hosts":
        if os.geteuid() != 0:
            raise HostsError("tests.chaos.hosts needs root (network namespaces, veths, a bridge)")
        self._owner_pid = os.getpid()
        self._take_lock()
        try:
            self._remove_leftovers()
            self._check_subnet_is_free()
            self._warn_if_bridge_traffic_may_be_filtered()
            # Written before anything exists, so a crash at any step below leaves a list of what to remove.
            self._write_state()
            self._build()
            self._entered = True
            atexit.register(self.close)
            with self._guard:
                for port in list(self._forwarders):
                    self._start_forwarder(port)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop forwarders and hosts' processes by PID, delete veths, netns, bridge. Safe to call twice, and
        after a `__enter__` that failed halfway."""
        if os.getpid() != self._owner_pid:
            return  # a forked child (inheriting the lock and atexit) must not tear down its parent's hosts
        atexit.unregister(self.close)
        self._entered = False
        with self._guard:
            forwarders = [f for f in self._forwarders.values() if f["pid"] is not None]
            _terminate([f["pid"] for f in forwarders if _start_time(f["pid"]) == f["start_time"]], group=True)
            for forwarder in forwarders:
                if forwarder["popen"] is not None:
                    forwarder["popen"].wait()  # reap it: no zombie left behind
                forwarder.update(pid=None, start_time=None, popen=None)
        if self._lock_fd is None:
            return  # never entered, or already closed: nothing of ours can exist
        self._remove(netns=self._made_netns, links=self._made_links)
        self._made_netns, self._made_links = [], []
        self._state_file.unlink(missing_ok=True)
        for log in self.state_dir.glob("forward-*.log"):
            log.unlink(missing_ok=True)
        os.close(self._lock_fd)  # releases the flock; the empty lock file stays (unlinking it would race)
        self._lock_fd = None

    # -- building ------------------------------------------------------------------------------------------

    def _build(self) -> None:
        """1. the bridge with the gateway address, up; 2. per host: a netns, a veth pair with one end in it,
        the root end on the bridge and up, and inside lo up, eth0 with the host's address, default route."""
        plen = self.network.prefixlen
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made_links.append(self.bridge)
        _ip("link", "set", "dev", self.bridge, "alias", self.marker)
        _ip("addr", "add", f"{self.gateway}/{plen}", "dev", self.bridge)
        _ip("link", "set", "dev", self.bridge, "up")
        for name in self.names:
            ns, veth, peer = self._netns[name], self._veth[name], self._peer[name]
            _ip("netns", "add", ns)
            self._made_netns.append(ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
            self._made_links += [veth, peer]
            _ip("link", "set", "dev", veth, "alias", self.marker)
            _ip("link", "set", "dev", peer, "netns", ns)
            _ip("-n", ns, "link", "set", "dev", peer, "name", HOST_IFNAME)
            _ip("-n", ns, "link", "set", "dev", HOST_IFNAME, "alias", self.marker)
            _ip("link", "set", "dev", veth, "master", self.bridge)
            _ip("link", "set", "dev", veth, "up")
            _ip("-n", ns, "link", "set", "dev", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{self._addresses[name]}/{plen}", "dev", HOST_IFNAME)
            _ip("-n", ns, "link", "set", "dev", HOST_IFNAME, "up")
            _ip("-n", ns, "route", "add", "default", "via", self.gateway)
            self._write_etc(ns)

    def _write_etc(self, ns: str) -> None:
        etc = NETNS_ETC / ns
        etc.mkdir(parents=True, exist_ok=True)
        lines = [f"# {self.marker}", "127.0.0.1 localhost", "::1 localhost", f"{self.gateway} gateway"]
        lines += [f"{address} {name}" for name, address in self._addresses.items()]
        (etc / "hosts").write_text("\n".join(lines) + "\n")
        # Nothing answers DNS on the host's loopback: a lookup of an unknown name fails at once.
        (etc / "resolv.conf").write_text(f"# {self.marker}\nnameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

    def _start_forwarder(self, port: int) -> None:
        forwarder = self._forwarders[port]
        log_path = self.state_dir / f"forward-{port}.log"
        # backlog: socat's default of 5 drops SYNs when a storm's workers all reconnect at once.
        # No timeout: Celery and pooled database connections idle for long and must stay open.
        argv = [
            "socat",
            f"TCP-LISTEN:{port},bind={self.gateway},reuseaddr,fork,backlog=128,nodelay",
            f"TCP:127.0.0.1:{forwarder['target']},nodelay",
        ]
        # stderr to a file, never an unread pipe: while the target is down socat logs every refused
        # connection, and a full pipe would stop the forwarder.
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True
            )
        forwarder.update(pid=popen.pid, start_time=_start_time(popen.pid), popen=popen)
        self._write_state()
        deadline = time.monotonic() + 5
        while not _listening(self.gateway, port, pid=popen.pid):
            if popen.poll() is not None or time.monotonic() > deadline:
                popen.kill()
                popen.wait()
                del self._forwarders[port]  # so that a later forward(port) tries again
                self._write_state()
                said = log_path.read_text().strip() or "not listening"
                raise HostsError(f"forwarder {self.gateway}:{port}: {said}")
            time.sleep(0.01)

    # -- state, leftovers, teardown ------------------------------------------------------------------------

    def _take_lock(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holder = self._read_state().get("pid", "?")
            raise HostsError(
                f"hosts with prefix {self.prefix!r} are in use by a live run (pid {holder}); use another prefix"
            ) from None
        self._lock_fd = fd

    def _read_state(self) -> dict:
        try:
            return json.loads(self._state_file.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def _write_state(self) -> None:
        state = {
            "pid": os.getpid(),
            "subnet": str(self.network),
            "netns": list(self._netns.values()),
            "links": self._our_link_names(),
            "forwarders": [
                {"port": port, "pid": f["pid"], "start_time": f["start_time"]}
                for port, f in self._forwarders.items()
                if f["pid"] is not None
            ],
        }
        temporary = self._state_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(state))
        temporary.replace(self._state_file)

    def _our_link_names(self) -> list[str]:
        return [self.bridge, *self._veth.values(), *self._peer.values()]

    def _remove_leftovers(self) -> None:
        """What a crashed run with this prefix left: its forwarders (by recorded PID and start time, so a
        reused PID is never killed), and its netns and links, found by its state file or by the alias."""
        state = self._read_state()
        leftover_forwarders = [
            f["pid"] for f in state.get("forwarders", []) if f["pid"] and _start_time(f["pid"]) == f["start_time"]
        ]
        _terminate(leftover_forwarders, group=True)
        netns = set()
        for path in NETNS_DIR.glob(f"{self.prefix}*") if NETNS_DIR.is_dir() else []:
            alias = self._alias(HOST_IFNAME, netns=path.name) or ""
            # Listed by the crashed run and not marked by another prefix's run (a crash before the alias
            # was set leaves none), or marked as this prefix's.
            listed = path.name in state.get("netns", []) and not alias.startswith(MARKER)
            if listed or alias == self.marker:
                netns.add(path.name)
        for path in NETNS_ETC.glob(f"{self.prefix}*") if NETNS_ETC.is_dir() else []:
            try:
                ours = (path / "hosts").read_text().startswith(f"# {self.marker}\n")
            except OSError:
                ours = False
            if ours:
                netns.add(path.name)
        links = set(state.get("links", []))
        link_name = re.compile(re.escape(self.prefix) + r"(br|[vp]\d+)")
        for link in json.loads(_ip("-j", "link", "show").stdout or "[]"):
            name = link["ifname"]
            if link_name.fullmatch(name) and (name in links or link.get("ifalias") == self.marker):
                links.add(name)
        self._remove(netns=sorted(netns), links=sorted(links))
        self._state_file.unlink(missing_ok=True)

    @staticmethod
    def _alias(ifname: str, *, netns: str) -> str | None:
        result = _ip("-n", netns, "-j", "link", "show", "dev", ifname, check=False)
        if result.returncode != 0 or not result.stdout.strip():
            return None
        return json.loads(result.stdout)[0].get("ifalias")

    @staticmethod
    def _remove(*, netns: list[str], links: list[str]) -> None:
        """1. kill what still runs inside the namespaces (a netns with a process in it outlives its
        `ip netns delete`, veth and all); 2. delete the links, which takes the veth pairs down at once (a
        deleted netns frees its devices later, asynchronously); 3. delete the namespaces."""
        _terminate([pid for ns in netns for pid in _pids_in_netns(NETNS_DIR / ns)], group=False)
        existing = {link["ifname"] for link in json.loads(_ip("-j", "link", "show").stdout or "[]")}
        # The veths first: deleting the bridge before them would only detach them.
        # Every step is tried even if one fails; what failed is raised at the end.
        failures = []
        for link in sorted(links, key=lambda name: name.endswith("br")):
            if link in existing:
                result = _ip("link", "delete", "dev", link, check=False)
                if result.returncode != 0 and "Cannot find device" not in result.stderr:
                    failures.append(f"ip link delete {link}: {result.stderr.strip()}")
        for ns in netns:
            if (NETNS_DIR / ns).exists():
                result = _ip("netns", "delete", ns, check=False)
                if result.returncode != 0:
                    failures.append(f"ip netns delete {ns}: {result.stderr.strip()}")
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        try:
            NETNS_ETC.rmdir()  # only if empty: another tool's namespaces may keep files there
        except OSError:
            pass
        if failures:
            raise HostsError("; ".join(failures))

    def _check_subnet_is_free(self) -> None:
        for link in json.loads(_ip("-j", "-4", "addr", "show").stdout or "[]"):
            for info in link.get("addr_info", []):
                other = ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False)
                if other.overlaps(self.network):
                    raise HostsError(f"subnet {self.network} overlaps {other} on {link['ifname']}; pick another")
        for route in json.loads(_ip("-j", "-4", "route", "show").stdout or "[]"):
            if route["dst"] == "default":
                continue
            if ipaddress.ip_network(route["dst"], strict=False).overlaps(self.network):
                raise HostsError(f"subnet {self.network} overlaps the route to {route['dst']}; pick another")

    @staticmethod
    def _warn_if_bridge_traffic_may_be_filtered() -> None:
        report = filtering_report()
        if report["net.bridge.bridge-nf-call-iptables"] == "1" and (
            report["iptables tables loaded"] or report["nf_tables loaded"]
        ):
            warnings.warn(
                "net.bridge.bridge-nf-call-iptables=1 with netfilter loaded: traffic between hosts passes "
                "the FORWARD chain, and a DROP there (Docker's) cuts hosts off from each other",
                stacklevel=3,
            )

    def __repr__(self) -> str:
        hosts = ", ".join(f"{name}={self._addresses[name]}" for name in self.names)
        return f"Hosts(gateway={self.gateway}, {hosts}, prefix={self.prefix!r})"


# -- self-test ---------------------------------------------------------------------------------------------

SELFTEST_PREFIX = "payonce-st-"  # not the storm's "payonce-": the self-test may run beside a storm
SELFTEST_SUBNET = "10.77.250.0/24"
SELFTEST_NAMES = ["web", "worker1", "worker2"]
REPO_ROOT = Path(__file__).resolve().parents[2]

# Run inside a host: `python -c PROBE kind args...`; prints one JSON line.
PROBE = r"""
import json, socket, sys, urllib.request
kind, args = sys.argv[1], sys.argv[2:]
if kind == "http":
    print(json.dumps(urllib.request.urlopen(args[0], timeout=3).read().decode()))
elif kind == "tcp":
    try:
        s = socket.create_connection((args[0], int(args[1])), timeout=2)
        s.sendall(b"ping\n")
        s.settimeout(2)
        print(json.dumps({"answer": s.recv(100).decode()}))
    except OSError as error:
        print(json.dumps({"error": type(error).__name__}))
elif kind == "names":
    import time
    started, answer = time.monotonic(), {}
    for name in ("web", "gateway", "no-such-host.invalid"):
        try:
            answer[name] = socket.gethostbyname(name)
        except socket.gaierror:
            answer["unknown" if name.endswith(".invalid") else name] = "gaierror"
    answer["seconds"] = round(time.monotonic() - started, 3)
    print(json.dumps(answer))
elif kind == "postgres":
    import psycopg
    pids = []
    for _ in range(2):  # a connection, closed, then a new one through the same forwarder
        with psycopg.connect(host=args[0], port=int(args[1]), dbname="postgres", connect_timeout=3) as conn:
            pids.append(conn.execute("SELECT 1, pg_backend_pid(), inet_client_addr()::text").fetchone())
    print(json.dumps(pids))
elif kind == "redis":
    import redis
    answers = []
    for _ in range(2):
        client = redis.Redis(host=args[0], port=int(args[1]), socket_timeout=3)
        answers.append([client.ping(), client.client_id()])
        client.close()
    print(json.dumps(answers))
"""


class SelftestFailure(AssertionError):
    pass


def _check(condition: bool, what: str, detail: object = "") -> None:
    if not condition:
        raise SelftestFailure(f"FAIL {what}: {detail}")
    print(f"ok   {what}" + (f"  ({detail})" if detail != "" else ""), flush=True)


def _probe(hosts: Hosts, name: str, *args: str) -> object:
    result = subprocess.run(
        hosts.command(name, [sys.executable, "-c", PROBE, *args]), capture_output=True, text=True, timeout=20
    )
    if result.returncode != 0:
        raise SelftestFailure(f"FAIL probe {args} in {name}: {result.stderr.strip()}")
    return json.loads(result.stdout)


class _EchoServer:
    """A root-namespace TCP service that answers each line with "echo:" + the line, restartable on one port."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._sock: socket.socket | None = None

    def start(self) -> "_EchoServer":
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((self.host, self.port))
        self._sock.listen(16)
        threading.Thread(target=self._serve, args=(self._sock,), daemon=True).start()
        return self

    def _serve(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    conn.sendall(b"echo:" + conn.recv(100))
                except OSError:
                    pass

    def stop(self) -> None:
        self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def _netns_left(prefix: str) -> list[str]:
    return sorted(p.name for p in NETNS_DIR.glob(f"{prefix}*")) if NETNS_DIR.is_dir() else []


def _etc_left(prefix: str) -> list[str]:
    return sorted(str(p) for p in NETNS_ETC.glob(f"{prefix}*")) if NETNS_ETC.is_dir() else []


def _links_left(prefix: str) -> list[str]:
    links = json.loads(_ip("-j", "link", "show").stdout)
    return [link["ifname"] for link in links if link["ifname"].startswith(prefix)]


def _crash_child(prefix: str, subnet: str, forward_port: int) -> None:
    """Build hosts, start a forwarder and a process inside one, then die by SIGKILL: no cleanup runs."""
    hosts = Hosts(SELFTEST_NAMES, subnet=subnet, prefix=prefix).__enter__()
    hosts.forward(forward_port, 6379)
    # Not on this process's stdout: the parent reads that pipe to its end.
    sleeper = subprocess.Popen(
        hosts.command("worker1", ["sleep", "60"]),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    forwarder = hosts._forwarders[forward_port]["pid"]
    print(json.dumps({"forwarder": forwarder, "sleeper": sleeper.pid}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def selftest(prefix: str = SELFTEST_PREFIX, subnet: str = SELFTEST_SUBNET) -> None:
    import http.server
    import tempfile
    import urllib.request

    started = time.monotonic()
    print(f"network settings (read, none changed): {json.dumps(filtering_report())}", flush=True)

    # Given a run that crashed with hosts, a forwarder and a process inside a host left behind,
    crash_port = free_port()
    child = subprocess.run(
        [sys.executable, "-m", "tests.chaos.hosts", "--crash-child", str(crash_port), "--prefix", prefix,
         "--subnet", subnet],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=30,
    )
    _check(child.returncode == -signal.SIGKILL, "crashed run died by SIGKILL", child.stderr.strip()[-300:])
    orphans = json.loads(child.stdout)
    _check(
        len(_netns_left(prefix)) == 3 and _alive(orphans["forwarder"]) and _alive(orphans["sleeper"]),
        "crashed run left netns, links, /etc/netns files, a forwarder and a process in a host",
        f"netns {_netns_left(prefix)}, links {len(_links_left(prefix))}, /etc/netns {len(_etc_left(prefix))}, "
        f"pids {orphans}",
    )

    hosts = Hosts(SELFTEST_NAMES, subnet=subnet, prefix=prefix)
    pg_at = hosts.forward(5432)  # PostgreSQL, Redis: the shared services on 127.0.0.1
    redis_at = hosts.forward(6379)
    echo_port = free_port()
    echo_at = hosts.forward(echo_port)
    web_server = None
    root_server = None
    try:
        # when a new run with the same prefix enters,
        with hosts:
            _check(
                not _alive(orphans["forwarder"]) and not _alive(orphans["sleeper"]),
                "leftovers of the crashed run removed at __enter__ (forwarder and in-host process killed)",
                orphans,
            )
            _check(len(_netns_left(prefix)) == 3, "3 hosts built", repr(hosts))

            for name in hosts.names:
                ns = hosts.netns_name(name)
                links = {l["ifname"]: l for l in json.loads(_ip("-n", ns, "-j", "addr", "show").stdout)}
                routes = json.loads(_ip("-n", ns, "-j", "route", "show").stdout)
                addresses = [a["local"] for a in links[HOST_IFNAME]["addr_info"] if a["family"] == "inet"]
                _check(
                    "UP" in links["lo"]["flags"] and "UP" in links[HOST_IFNAME]["flags"]
                    and addresses == [hosts.address(name)]
                    and {"dst": "default", "gateway": hosts.gateway} in [
                        {"dst": r["dst"], "gateway": r.get("gateway")} for r in routes
                    ],
                    f"{name}: lo up, eth0 up with {hosts.address(name)}, default via {hosts.gateway}",
                )

            # a tiny HTTP server inside `web`, started the way the storm starts processes
            docroot = tempfile.mkdtemp()
            token = f"hello from web {os.getpid()}"
            Path(docroot, "token").write_text(token)
            web_server = subprocess.Popen(
                hosts.command("web", [sys.executable, "-m", "http.server", "--bind", hosts.address("web"),
                                      "--directory", docroot, "8080"]),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )
            url = f"http://{hosts.address('web')}:8080/token"
            deadline = time.monotonic() + 10
            while True:
                try:
                    from_root = urllib.request.urlopen(url, timeout=1).read().decode()
                    break
                except OSError:
                    if time.monotonic() > deadline or web_server.poll() is not None:
                        raise
                    time.sleep(0.05)
            cmdline = Path(f"/proc/{web_server.pid}/cmdline").read_bytes().split(b"\0")
            web_netns = os.stat(NETNS_DIR / hosts.netns_name("web"))
            in_netns = os.stat(f"/proc/{web_server.pid}/ns/net").st_ino == web_netns.st_ino
            _check(
                b"http.server" in cmdline and b"netns" not in cmdline and in_netns
                and os.getpgid(web_server.pid) == web_server.pid,
                "Popen's PID is the server itself (ip netns exec execs), in web's netns, its own group leader",
                f"pid {web_server.pid}: {b' '.join(cmdline[:3]).decode()}",
            )
            _check(from_root == token, f"root namespace -> web at {url}")
            names = _probe(hosts, "worker1", "names")
            _check(
                names["web"] == hosts.address("web") and names["gateway"] == hosts.gateway
                and names["unknown"] == "gaierror" and names["seconds"] < 1,
                "worker1 resolves web and gateway from its /etc/hosts, an unknown name fails at once", names,
            )
            _check(_probe(hosts, "worker1", "http", url) == token, f"worker1 -> web at {url}")

            # a root-namespace service bound to the gateway (as the sandbox, moto and webhook receivers are)
            class Answer(http.server.BaseHTTPRequestHandler):
                def do_GET(self):
                    body = f"root saw {self.client_address[0]}".encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

                def log_message(self, *args):
                    pass

            root_server = http.server.ThreadingHTTPServer((hosts.gateway, 0), Answer)
            threading.Thread(target=root_server.serve_forever, daemon=True).start()
            root_url = f"http://{hosts.gateway}:{root_server.server_address[1]}/"
            answer = _probe(hosts, "worker2", "http", root_url)
            _check(answer == f"root saw {hosts.address('worker2')}",
                   f"worker2 -> root-namespace service on {root_url} (seen from its own address)", answer)

            isolated = _probe(hosts, "worker2", "tcp", "127.0.0.1", "6379")
            _check("error" in isolated, "worker2's 127.0.0.1 is its own: the root's Redis is not there", isolated)

            rows = _probe(hosts, "worker1", "postgres", *pg_at.split(":"))
            _check(
                [row[0] for row in rows] == [1, 1] and rows[0][1] != rows[1][1],
                f"worker1 -> PostgreSQL via forwarder {pg_at}: SELECT 1, closed, new connection SELECT 1",
                f"backend pids {rows[0][1]}, {rows[1][1]}; PostgreSQL saw the forwarder's {rows[0][2]}",
            )
            answers = _probe(hosts, "worker2", "redis", *redis_at.split(":"))
            _check(
                [a[0] for a in answers] == [True, True] and answers[0][1] != answers[1][1],
                f"worker2 -> Redis via forwarder {redis_at}: PING, closed, new connection PING",
                f"client ids {answers[0][1]}, {answers[1][1]}",
            )

            # the forwarder outlives its target: down, then back on the same port
            echo = _EchoServer("127.0.0.1", echo_port).start()
            forwarder_pid = hosts._forwarders[echo_port]["pid"]
            before = _probe(hosts, "worker1", "tcp", *echo_at.split(":"))
            echo.stop()
            down = _probe(hosts, "worker1", "tcp", *echo_at.split(":"))
            echo = _EchoServer("127.0.0.1", echo_port).start()
            after = _probe(hosts, "worker1", "tcp", *echo_at.split(":"))
            echo.stop()
            _check(
                before == {"answer": "echo:ping\n"} and down.get("answer", "") == "" and after == before
                and _alive(forwarder_pid),
                f"forwarder {echo_at} survives its target restarting (same socat pid {forwarder_pid})",
                f"up {before}, down {down}, back {after}",
            )

            os.killpg(web_server.pid, signal.SIGTERM)
            _check(web_server.wait(timeout=5) == -signal.SIGTERM, "killpg(Popen's PID) stopped web's server")

            forwarder_pids = [f["pid"] for f in hosts._forwarders.values()]
            # and a process the caller left running inside a host is stopped at exit
            left_running = subprocess.Popen(hosts.command("worker2", ["sleep", "60"]), start_new_session=True)
    finally:
        if root_server is not None:
            root_server.shutdown()
            root_server.server_close()
        if web_server is not None and web_server.poll() is None:
            web_server.kill()
            web_server.wait()

    _check(left_running.wait(timeout=5) in (-signal.SIGTERM, -signal.SIGKILL),
           "a process left running inside a host was stopped at exit", left_running.returncode)
    _check(not any(_alive(pid) for pid in forwarder_pids), "forwarders killed by their PIDs", forwarder_pids)
    _check(_netns_left(prefix) == [], f"ip netns list: no {prefix}* left")
    _check(_links_left(prefix) == [], f"ip link: no {prefix}* left")
    _check(_etc_left(prefix) == [], f"no /etc/netns/{prefix}* left")
    _check(not _listening(hosts.gateway, 5432), f"nothing listens on {pg_at} any more")
    hosts.close()
    hosts.__exit__(None, None, None)
    _check(_netns_left(prefix) == [] and _links_left(prefix) == [], "close() again is a no-op (idempotent)")
    print(f"selftest passed in {time.monotonic() - started:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.hosts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--selftest", action="store_true", help="build 3 hosts, check them, tear them down")
    parser.add_argument("--prefix", default=SELFTEST_PREFIX)
    parser.add_argument("--subnet", default=SELFTEST_SUBNET)
    parser.add_argument("--crash-child", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.crash_child:
        _crash_child(args.prefix, args.subnet, args.crash_child)
        return 1
    if not args.selftest:
        parser.print_help()
        return 2
    if os.geteuid() != 0:
        print("the self-test needs root: network namespaces, veths and a bridge", file=sys.stderr)
        return 1
    try:
        selftest(args.prefix, args.subnet)
    except SelftestFailure as failure:
        print(failure, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
