"""Real hosts on one machine: Linux network namespaces joined by a bridge.

``NetnsHosts(n)`` makes ``n`` namespaces, each with its own address in 198.18.0.0/24
(198.18.0.10, .11, ...: our own test hosts, never anything else), veth-paired to a
bridge in the root namespace that holds 198.18.0.1. The namespaces have no route beyond
that subnet. A process started with ``popen(i, argv)`` runs on host ``i``: it binds and
is reached at that host's address. ``kill_host(i)`` SIGKILLs every process of the
namespace (all of them started by the test). Everything is removed on exit, also when
the test failed, and namespaces a crashed earlier run left behind are removed first.

Needs root (CI runs as root) and iproute2's ``ip``; ``available()`` says whether both
are there.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

from antdt_tf.procutil import kill_group

PREFIX = "antdt"      # namespaces: antdt<pid>k<n>h<i>
IF_PREFIX = "ad"     # interfaces (at most 15 characters): ad<pid>k<n>br, ad<pid>k<n>v<i>
SUBNET = "198.18.0"
BRIDGE_ADDRESS = f"{SUBNET}.1"


def available() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    if shutil.which("ip") is None:
        return False, "iproute2's ip is not installed"
    return True, ""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _pids_in(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False).stdout.split()
    return [int(p) for p in out if p.isdigit()]


def remove_stale() -> None:
    """Removes namespaces and bridges of earlier runs whose test process is gone."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if not ns.startswith(PREFIX):
            continue
        owner = ns[len(PREFIX):].split("k", 1)[0]
        if owner.isdigit() and _alive(int(owner)):
            continue
        for pid in _pids_in(ns):
            _kill(pid)
        _ip("netns", "del", ns, check=False)
    for line in _ip("-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        name = line.split(":")[1].strip() if ":" in line else ""
        owner = (name[len(IF_PREFIX):].split("k", 1)[0]
                 if name.startswith(IF_PREFIX) and name.endswith("br") else "")
        if owner.isdigit() and not _alive(int(owner)):
            _ip("link", "del", name, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class NetnsHosts:
    _made = 0      # a new set of names for every instance: a deleted namespace's veth
                   # may still exist for a moment after ``ip netns del``

    def __init__(self, n: int):
        if not 1 <= n <= 8:
            raise ValueError("1 to 8 hosts")
        self.n = n
        NetnsHosts._made = (NetnsHosts._made + 1) % 100
        tag = f"{os.getpid()}k{NetnsHosts._made}"
        self.bridge = f"{IF_PREFIX}{tag}br"
        self.names = [f"{PREFIX}{tag}h{i}" for i in range(n)]
        self.addresses = [f"{SUBNET}.{10 + i}" for i in range(n)]
        self._veth = [(f"{IF_PREFIX}{tag}v{i}", f"{IF_PREFIX}{tag}p{i}") for i in range(n)]
        self.procs: list[subprocess.Popen] = []
        if len(self.bridge) > 15 or any(len(v) > 15 for pair in self._veth for v in pair):
            raise ValueError("interface names too long for this pid")

    def __enter__(self) -> "NetnsHosts":
        remove_stale()
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for ns, address, (outer, inner) in zip(self.names, self.addresses, self._veth):
                _ip("netns", "add", ns)
                _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                _ip("link", "set", inner, "netns", ns)
                _ip("link", "set", outer, "master", self.bridge)
                _ip("link", "set", outer, "up")
                _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inner)
                _ip("-n", ns, "link", "set", inner, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def popen(self, i: int, argv: list[str], **kwargs) -> subprocess.Popen:
        """Starts ``argv`` on host ``i`` (``ip netns exec`` execs it: the pid is argv's)."""
        kwargs.setdefault("start_new_session", True)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(["ip", "netns", "exec", self.names[i], *argv], **kwargs)
        self.procs.append(proc)
        return proc

    def pids(self, i: int) -> list[int]:
        return _pids_in(self.names[i])

    def kill_host(self, i: int) -> list[int]:
        """SIGKILLs every process on host ``i`` at once (a host lost); returns the pids."""
        pids = self.pids(i)
        for pid in pids:
            _kill(pid)
        deadline = time.monotonic() + 10
        while any(_alive(p) and not _zombie(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        for proc in self.procs:
            if proc.pid in pids:
                proc.wait()
        return pids

    def close(self) -> None:
        for i in range(self.n):
            for pid in self.pids(i):
                _kill(pid)
        for proc in self.procs:
            kill_group(proc)
        for ns, (outer, _) in zip(self.names, self._veth):
            _ip("link", "del", outer, check=False)     # the pair goes with it
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", self.bridge, check=False)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def job_security(directory, setenv) -> None:
    """A job token and a throw-away CA whose certificate names the bridge and the first
    16 namespace hosts, in the environment (``setenv(name, value)``, e.g. pytest's
    ``monkeypatch.setenv``): every process of the cluster and the test's clients then
    authenticate with both, as they must beyond loopback."""
    import secrets

    from antdt_tf import auth

    setenv(auth.TOKEN_ENV, secrets.token_hex(16))
    hosts = [BRIDGE_ADDRESS, *(f"{SUBNET}.{10 + i}" for i in range(16)), "127.0.0.1",
             "localhost"]          # localhost: a local job's master over its Unix socket
    tls = auth.make_job_ca(directory, hosts=hosts)
    for name, var in auth.TLS_ENV.items():
        setenv(var, getattr(tls, name))


def start_antdt_cluster(net: NetnsHosts, workdir, *master_flags: str,
                        report_seconds: float = 0.5, job_root=None,
                        agent_flags: tuple = ()) -> str:
    """An antdt-master on the bridge address (state in ``workdir/master``) and an
    ``antdt-agent`` on every host, registering with it; returns the master's address.
    The agents run tasks whose paths lie under ``job_root`` (default: ``workdir``) —
    the job's workdir, checkpoints and data must be there.
    ``agent_flags``: more flags for every agent (e.g. ``--program_roots``).
    The caller sets the job's token and TLS files first (``job_security``: the master
    and the agents listen beyond loopback).
    Logs: ``workdir/cluster.log``; every process is in ``net.procs`` (closed with it)."""
    import pathlib
    import sys

    from antdt_tf.procutil import child_env, wait_for_port_file

    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    port_file = workdir / "master.port"
    log = open(workdir / "cluster.log", "ab")
    net.procs.append(subprocess.Popen(
        [sys.executable, "-m", "antdt_tf.master", f"--bind={BRIDGE_ADDRESS}", "--port=0",
         f"--port_file={port_file}", f"--state_dir={workdir / 'master'}", *master_flags],
        stdout=log, stderr=log, start_new_session=True, env=child_env()))
    port = wait_for_port_file(net.procs[-1], port_file, 60, "antdt-master",
                              workdir / "cluster.log")
    master = f"{BRIDGE_ADDRESS}:{port}"
    for i, address in enumerate(net.addresses):
        (workdir / f"h{i}").mkdir(exist_ok=True)
        net.popen(i, [sys.executable, "-m", "antdt_tf.agent.agent", f"--host_name=h{i}",
                      f"--bind={address}", f"--advertise={address}", "--port=7471",
                      f"--master={master}", f"--report_seconds={report_seconds}",
                      "--task_ports=21000-21999", f"--task_log_dir={workdir / f'h{i}'}",
                      f"--job_root={job_root or workdir}", *agent_flags],
                  stdout=log, stderr=log, env=child_env())
    log.close()
    return master
