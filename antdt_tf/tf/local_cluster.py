"""LocalCluster: the PS and worker tasks of a PSS cluster as processes on this machine.

A stand-in for the per-host agents (which will own these processes in a multi-host
job): it picks free loopback ports, starts one ``antdt_tf.tf.server`` process per task
in its own process group, and kills exactly those processes by process group.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
from typing import Optional

from antdt_tf.procutil import child_env


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports it hands out by itself (bind to 0, outgoing
    connections)."""
    try:
        lo, hi = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999   # Linux's default


def free_ports(n: int, host: str = "127.0.0.1", lowest: int = 10000,
               rng: Optional[random.Random] = None) -> list[int]:
    """``n`` distinct ports that can be bound on ``host`` now, for servers started a
    little later. Picked *below* the kernel's ephemeral range: a port taken from that
    range (bind to 0) and released is free for anyone binding to 0 or connecting out
    until our server binds it — seen: an agent's own port-0 server got a TF worker's
    port, and the chief's ``GetStatus`` reached the agent ("Method not found"). Below
    the range only an explicit bind can take it. Falls back to the ephemeral range when
    nothing is free below it."""
    rng = rng or random.Random()
    low_hi = _ephemeral_range()[0]
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    picked: list[int] = []
    for _ in range(50 * n):
        if len(picked) == n or low_hi <= lowest:
            break
        port = rng.randrange(lowest, low_hi)
        if port in picked:
            continue
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue   # in use (or reserved): try another
        picked.append(port)
    while len(picked) < n:   # nothing (left) below the ephemeral range
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in picked:
            picked.append(port)
    return picked


class LocalCluster:
    """``with LocalCluster(num_ps=1, num_workers=2, log_dir=d) as c: c.spec``"""

    def __init__(self, num_ps: int, num_workers: int, log_dir: str | os.PathLike,
                 host: str = "127.0.0.1"):
        ports = free_ports(1 + num_ps + num_workers, host)
        self.spec = {"chief": [f"{host}:{ports[0]}"],
                     "ps": [f"{host}:{p}" for p in ports[1:1 + num_ps]],
                     "worker": [f"{host}:{p}" for p in ports[1 + num_ps:]]}
        self.log_dir = pathlib.Path(log_dir)
        self.procs: dict[tuple[str, int], subprocess.Popen] = {}
        self.env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")

    @property
    def spec_json(self) -> str:
        return json.dumps(self.spec)

    def start_task(self, job: str, index: int) -> subprocess.Popen:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{job}{index}.log", "ab") as log:
            self.procs[job, index] = subprocess.Popen(
                [sys.executable, "-m", "antdt_tf.tf.server", f"--cluster={self.spec_json}",
                 f"--job={job}", f"--index={index}"], env=child_env(self.env), start_new_session=True,
                stdout=subprocess.DEVNULL, stderr=log)
        return self.procs[job, index]

    def start(self) -> "LocalCluster":
        for job in ("ps", "worker"):
            for index in range(len(self.spec[job])):
                self.start_task(job, index)
        return self

    def kill(self, job: str, index: int, sig: int = signal.SIGKILL) -> None:
        proc: Optional[subprocess.Popen] = self.procs.get((job, index))
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, sig)
            proc.wait()

    def stop(self) -> None:
        for job, index in list(self.procs):
            self.kill(job, index)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def run_local_job(workdir: str | os.PathLike, master_address: str, cluster: LocalCluster,
                  batch_size: int, audit: bool = True, buckets: int = 1 << 16,
                  timeout: float = 600.0, on_poll=None, flags=(),
                  module: str = "antdt_tf.tf.coordinator") -> Optional[dict]:
    """Runs ``module`` (``antdt_tf.tf.coordinator`` or ``antdt_tf.tf.keras_trainer``) against ``cluster`` and the master until it
    exits; ``on_poll(proc)`` is called every 50 ms meanwhile (fault injection in tests).
    Returns the coordinator's JSON report, with its log under ``"log"``, or None if the
    coordinator was SIGKILLed (by ``on_poll``)."""
    import time

    workdir = pathlib.Path(workdir)
    report = workdir / "report.json"
    log_path = workdir / "coordinator.log"
    cmd = [sys.executable, "-m", module, f"--cluster={cluster.spec_json}",
           f"--master={master_address}", f"--batch_size={batch_size}", f"--buckets={buckets}",
           f"--report_json={report}", *flags] + (["--audit"] if audit else [])
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, env=child_env(cluster.env), start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
            if on_poll is not None:
                on_poll(proc)
        if proc.poll() is None:
            raise TimeoutError(f"coordinator still running after {timeout}s; see {log_path}")
        if proc.returncode == -signal.SIGKILL:
            return None
        if proc.returncode != 0:
            raise RuntimeError(f"coordinator exited {proc.returncode}:\n"
                               f"{log_path.read_text()[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    result = json.loads(report.read_text())
    result["log"] = log_path.read_text()
    return result
