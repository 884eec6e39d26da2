"""Process helpers shared by everything that starts child processes.

Children die with their parent, so a killed launcher, agent or test leaves no orphaned
servers behind. The parent puts its pid in the child's environment (``child_env``);
the child, when it imports ``antdt_tf``, asks Linux to SIGKILL it when that parent dies
(``PR_SET_PDEATHSIG``). This is done in the child, not in a ``preexec_fn``: running
Python between fork and exec in a multi-threaded gRPC process crashed children with
SIGSEGV here (gRPC skips its fork handlers while other threads are in gRPC).
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import sys
import time
from typing import Mapping, Optional

PARENT_ENV = "ANTDT_DIE_WITH_PARENT"
_PR_SET_PDEATHSIG = 1


def _set_pdeathsig() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def child_env(env: Optional[Mapping[str, str]] = None) -> dict:
    """The environment for a child antdt-tf process that must die with this process."""
    out = dict(os.environ if env is None else env)
    out[PARENT_ENV] = str(os.getpid())
    return out


def adopt_parent_death() -> None:
    """Run at ``antdt_tf`` import. If our parent asked (``child_env``), we get SIGKILL
    when it dies; if it is already gone, we leave at once. The variable is removed so
    our own children do not inherit a request that names our parent."""
    want = os.environ.pop(PARENT_ENV, "")
    if not want.isdigit() or not sys.platform.startswith("linux"):
        return
    _set_pdeathsig()
    if os.getppid() != int(want):   # the parent died before we got here
        os._exit(1)


def exit_now(code: int, message: str = "", program: str = "antdt") -> None:
    """Flushes and leaves at once. ClusterCoordinator's destructor waits for every failed
    task to come back (its failure handler keeps reconnecting), so a TF chief that lost a
    task would never exit normally; everything worth keeping is reported by then."""
    if message:
        print(f"{program}: {message}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def wait_until_free(address: str, timeout: float) -> None:
    """Returns when ``host:port`` can be bound (its old owner is gone)."""
    host, port = address.rsplit(":", 1)
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, int(port)))
                return
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"{address} still in use after {timeout:.0f}s")
        time.sleep(0.02)


def stand_by(ready_file: str, address: str, timeout: float, name: str) -> None:
    """Standby mode of a task that moves to another host: once imports are done (the
    slow part), write ``ready_file`` and wait until the task's old process released
    ``address``; the caller then binds it at once."""
    import pathlib

    pathlib.Path(ready_file).write_text(f"{os.getpid()}\n")
    print(f"[{name}] standing by for {address}", flush=True)
    wait_until_free(address, timeout)


def kill_group(proc) -> None:
    """SIGKILL to the process group of ``proc`` (a ``subprocess.Popen`` started with
    ``start_new_session``: only what we started) if it still runs, then reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def wait_for_port_file(proc, port_file, timeout: float, what: str, log_path) -> int:
    """The port a starting server (``proc``) wrote to ``port_file``; RuntimeError naming
    its log if it exits or takes longer than ``timeout``."""
    import pathlib

    port_file = pathlib.Path(port_file)
    deadline = time.monotonic() + timeout
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start; see {log_path}")
        time.sleep(0.05)
    return int(port_file.read_text())


def start_master(workdir, *flags: str, timeout: float = 60.0):
    """Starts an ``antdt-master`` process on a free loopback port, state in
    ``workdir/state``, log in ``workdir/master.log``; returns ``(process, address)``
    once it serves. For demos and benchmarks that need a real master process."""
    import pathlib
    import subprocess

    workdir = pathlib.Path(workdir)
    port_file = workdir / "port"
    with open(workdir / "master.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "antdt_tf.master", "--port=0", f"--port_file={port_file}",
             f"--state_dir={workdir / 'state'}", *flags], stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env=child_env())
    port = wait_for_port_file(proc, port_file, timeout, "antdt-master", workdir / "master.log")
    return proc, f"127.0.0.1:{port}"
