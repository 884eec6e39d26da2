"""Simulated hosts on this machine, one ``antdt-agent`` each, on loopback.

The embedded default (``make demo``). Every simulated host shares loopback, so a task
keeps its ``127.0.0.1:port`` wherever it is relaunched (stable endpoints): a moved
worker is re-joined by TensorFlow without a cluster change.

- :class:`LoopbackAgentsBackend`: the backend over such agents (found through the
  master or a list), each task at the loopback address reserved for it — what the
  master's job control uses.
- :class:`LocalBackend`: the same, and it starts (and owns) the agents itself — what
  ``antdt-launch`` uses to provide the hosts, and the conformance suite. Losing a host
  (fault injection) SIGKILLs its agent; the agent's tasks die with it.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

from antdt_tf.backends.agents import AgentsBackend, StaticHosts
from antdt_tf.backends.base import Capabilities
from antdt_tf.procutil import child_env, kill_group, wait_for_port_file


class LoopbackAgentsBackend(AgentsBackend):
    """Agents on loopback: every task has one address, given up front (``ports``) or
    picked on first use."""

    capabilities = Capabilities(stable_endpoints=True, host_pinning=True, fault_injection=True)

    def __init__(self, directory, ports: dict = None, host_timeout: float = 10.0):
        super().__init__(directory, host_timeout=host_timeout)
        self._ports: dict[tuple[str, int], int] = dict(ports or {})

    def endpoint(self, job: str, index: int, host: str) -> str:
        """The task's own loopback port, the same on every simulated host."""
        from antdt_tf.tf.local_cluster import free_ports

        with self._lock:
            if (job, index) not in self._ports:
                taken = set(self._ports.values())
                self._ports[job, index] = next(p for p in iter(lambda: free_ports(1)[0], None)
                                               if p not in taken)
            return f"127.0.0.1:{self._ports[job, index]}"


class LocalBackend(LoopbackAgentsBackend):
    def __init__(self, num_hosts: int, workdir, estimator_python: str = "",
                 master: str = "", host_timeout: float = 10.0, start_timeout: float = 60.0,
                 job_roots: tuple = (), read_roots: tuple = (), network=None,
                 program_roots: tuple = ()):
        """``job_roots``: where tasks may write besides ``workdir`` (e.g. a checkpoint
        directory elsewhere); ``read_roots``: where they may read data from;
        ``program_roots``: where the job's own program may run from;
        ``network``: a PrivateNetwork the agents (and so their tasks) run in — then only
        processes in it reach them, this object's own calls included."""
        self.network = network
        if num_hosts < 1:
            raise ValueError(f"num_hosts must be >= 1, got {num_hosts}")
        self.workdir = pathlib.Path(workdir)
        self._roots = [",".join(str(pathlib.Path(r).resolve()) for r in (workdir, *job_roots)),
                       ",".join(str(pathlib.Path(r).resolve()) for r in read_roots),
                       ",".join(str(pathlib.Path(r).resolve()) for r in program_roots)]
        self.procs: dict[str, subprocess.Popen] = {}
        addresses = []
        try:
            for h in range(num_hosts):
                addresses.append(self._start_agent(f"host{h}", master, estimator_python,
                                                   start_timeout))
        except BaseException:
            self.shutdown()
            raise
        super().__init__(StaticHosts(addresses), host_timeout=host_timeout)

    def _start_agent(self, name: str, master: str, estimator_python: str,
                     timeout: float) -> str:
        port_file = self.workdir / f"agent-{name}.port"
        port_file.unlink(missing_ok=True)
        host_dir = self.workdir / name
        host_dir.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "antdt_tf.agent.agent", f"--host_name={name}",
                "--port=0", f"--port_file={port_file}", f"--task_log_dir={host_dir}",
                "--advertise=127.0.0.1", f"--estimator_python={estimator_python}",
                f"--job_root={self._roots[0]}", f"--read_roots={self._roots[1]}",
                f"--program_roots={self._roots[2]}"]
        if master:
            args.append(f"--master={master}")
        if self.network is not None:
            args = self.network.command(args)
        with open(host_dir / "agent.log", "ab") as out:
            proc = self.procs[name] = subprocess.Popen(
                args, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                start_new_session=True, env=child_env())
        port = wait_for_port_file(proc, port_file, timeout, f"agent {name}",
                                  host_dir / "agent.log")
        return f"127.0.0.1:{port}"

    def lose_host(self, name: str) -> None:
        """Fault injection: SIGKILL the host's agent (its tasks die with it)."""
        kill_group(self.procs[name])

    def shutdown(self, grace_seconds: float = 15.0) -> None:
        """Stops the agents (each stops its tasks: SIGTERM, then SIGKILL)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(grace_seconds)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.close()

    def close(self) -> None:
        if hasattr(self, "_clients"):
            super().close()
