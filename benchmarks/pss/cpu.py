"""CPU seconds by process role during a run: where the CPU goes — the platform's
processes (PS, workers, chief) and antdt-tf's own (master, agents, launcher) — on a
machine where the CPU is the limit. Sampled from outside the processes (antdt-tf's job
runs in a network namespace of its own, in the same PID namespace)."""

from __future__ import annotations

import time

ROLES = ("ps", "worker", "chief", "master", "agent", "launcher")


def role_of(cmdline: list) -> str:
    """The role of a process of a run, from its command line ("": none of ours)."""
    cmd = " ".join(cmdline)
    if "antdt_tf.tf.server" in cmd or "antdt-tf-server" in cmd:
        return "ps" if "--job=ps" in cmd else "worker"
    if any(k in cmd for k in ("antdt_tf.tf.keras_trainer", "antdt_tf.tf.coordinator",
                              "--role=keras_chief", "--role=vanilla_chief")):
        return "chief"
    if "--role=tf1_worker" in cmd or "estimator_examples.train_mts" in cmd:
        return "worker"
    for needle, role in (("antdt_tf.master", "master"), ("antdt_tf.agent", "agent"),
                         ("antdt_tf.launch", "launcher")):
        if needle in cmd:
            return role
    return ""


class CpuByRole:
    """CPU seconds (user + system) per process role between two moments, from snapshots
    polled every ~0.25 s. The moments are picked afterwards (antdt-tf's training start
    is the master's, in its report). A process's CPU after its last snapshot is not
    seen."""

    def __init__(self):
        self.samples: list[tuple[float, dict]] = []   # (unix time, {pid: (role, cpu)})
        self._roles: dict[int, str] = {}

    def sample(self, procs) -> None:
        import psutil

        snap = {}
        for p in procs:
            try:
                if p.pid not in self._roles:
                    self._roles[p.pid] = role_of(p.cmdline())
                ct = p.cpu_times()
            except psutil.Error:
                continue
            if self._roles[p.pid]:
                snap[p.pid] = (self._roles[p.pid], ct.user + ct.system)
        self.samples.append((time.time(), snap))

    def between(self, t0: float, t1: float) -> dict:
        at0: dict[int, float] = {}
        at1: dict[int, tuple[str, float]] = {}
        for t, snap in self.samples:
            for pid, (role, cpu) in snap.items():
                if t <= t0:
                    at0[pid] = cpu
                if t <= t1:
                    at1[pid] = (role, cpu)
        out = dict.fromkeys(ROLES, 0.0)
        for pid, (role, cpu) in at1.items():
            out[role] += cpu - at0.get(pid, 0.0)
        return out


def process_tree(root_pid: int, extra=()) -> list:
    """``psutil.Process``es of ``root_pid``, its descendants and ``extra``."""
    import psutil

    try:
        root = psutil.Process(root_pid)
    except psutil.NoSuchProcess:
        return list(extra)
    try:
        children = root.children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    return [root] + children + list(extra)


def sample_while(cpu: CpuByRole, procs, running, what: str, timeout: float = 1800) -> None:
    """Samples ``procs()`` into ``cpu`` every 0.25 s while ``running()``."""
    deadline = time.monotonic() + timeout
    while running():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not finish")
        cpu.sample(procs())
        time.sleep(0.25)
