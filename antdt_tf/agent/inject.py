"""Fault and straggler injections, as the launcher's ``--inject`` flag spells them.

::

    kill:worker:1@30s           SIGKILL worker 1, 30 s after training started
    kill:ps:0@60s               SIGKILL ps 0
    kill:coordinator@45s        SIGKILL the coordinator (chief)
    kill:master@20s             SIGKILL the master
    slow:worker:2:x4@10s        worker 2 gets 1/4 of its CPU time from 10 s on
    slow:ps:0:x3@10s-70s        ps 0 at 1/3 speed from 10 s to 70 s
    scale:workers:4@30s         scale to 4 workers at 30 s (the cluster scheduler granted
                                or reclaimed hosts; up to --max_workers)
    kill:worker:1@25%           SIGKILL worker 1 once 25 % of the job's records are done
    scale:workers:3@1%          scale out once 1 % of the records are done

Times are seconds after training started (the master leased the first shard), so
they do not depend on how long the processes took to start; ``N%`` triggers on progress
instead (the master's count of records done), the same on a slow or a fast machine.
A scaling waits for the action before it; while its new workers start, the job's data is
held (no new lease), so the job cannot end before the action is carried out. Every injection is carried out
by the agent that owns the task: a kill is a real SIGKILL of its process group, a
slowdown is SIGSTOP/SIGCONT duty cycling (:class:`~antdt_tf.agent.throttle.CpuThrottle`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

from antdt_tf.errors import InvalidRequest

_TASK = r"(?P<job>worker|ps|coordinator|chief|master)(?::(?P<index>\d+))?"
_TIME = r"(?P<at>\d+(?:\.\d+)?)(?P<unit>s|%)?(?:-(?P<until>\d+(?:\.\d+)?)s?)?"
_KILL = re.compile(rf"^kill:{_TASK}@{_TIME}$")
_SLOW = re.compile(rf"^slow:{_TASK}:x(?P<factor>\d+(?:\.\d+)?)@{_TIME}$")
_SCALE = re.compile(r"^scale:workers:(?P<count>\d+)@(?P<at>\d+(?:\.\d+)?)(?P<unit>s|%)?$")
_INDEXED = ("worker", "ps")


@dataclasses.dataclass(frozen=True)
class Injection:
    kind: str                 # "kill", "slow" or "scale"
    job: str                  # "worker", "ps", "chief" or "master"
    index: int                # scale: the number of workers to scale to
    at: float                 # seconds after training started (first shard leased)
    until: Optional[float] = None   # slow only: back to full speed then (None: never)
    factor: float = 1.0             # slow only
    percent: bool = False           # ``at`` is a percentage of the job's records done

    @property
    def when(self) -> str:
        return f"{self.at:g}%" if self.percent else f"{self.at:g}s"

    @property
    def task(self) -> str:
        return f"{self.job}:{self.index}"

    def __str__(self):
        if self.kind == "kill":
            return f"kill {self.task} at {self.when}"
        if self.kind == "scale":
            return f"scale to {self.index} workers at {self.when}"
        span = f"{self.at:g}s-{self.until:g}s" if self.until is not None else f"{self.when} on"
        return f"slow {self.task} x{self.factor:g} {span}"


def parse_injection(text: str, num_ps: int, num_workers: int,
                    max_workers: int = 0) -> Injection:
    """Parses one ``--inject`` value; raises InvalidRequest saying what is wrong."""
    text = text.strip()
    m = _SCALE.match(text)
    if m is not None:
        count, limit = int(m["count"]), max(max_workers, num_workers)
        if not 1 <= count <= limit:
            raise InvalidRequest(f"--inject={text!r}: can scale to 1..{limit} workers "
                                 "(raise --max_workers for more)")
        return Injection("scale", "worker", count, float(m["at"]), percent=m["unit"] == "%")
    m = _KILL.match(text) or _SLOW.match(text)
    if m is None:
        raise InvalidRequest(
            f"--inject={text!r}: expected kill:<task>@<T>s, slow:<task>:x<F>@<T>s[-<T2>s] or "
            "scale:workers:<N>@<T>s, task = worker:<i> | ps:<i> | coordinator | master "
            "(e.g. kill:worker:1@30s, slow:worker:2:x4@10s-70s, scale:workers:4@30s)")
    job = "chief" if m["job"] in ("coordinator", "chief") else m["job"]
    if job in _INDEXED and m["index"] is None:
        raise InvalidRequest(f"--inject={text!r}: {job} needs an index, e.g. {job}:0")
    if job not in _INDEXED and m["index"] not in (None, "0"):
        raise InvalidRequest(f"--inject={text!r}: there is only one {m['job']}")
    index = int(m["index"] or 0)
    count = {"worker": num_workers, "ps": num_ps}.get(job, 1)
    if index >= count:
        raise InvalidRequest(f"--inject={text!r}: {job}:{index} does not exist "
                             f"(the job has {count} {job} task(s))")
    at = float(m["at"])
    until = float(m["until"]) if m["until"] is not None else None
    kind = "kill" if text.startswith("kill:") else "slow"
    if kind == "kill" and until is not None:
        raise InvalidRequest(f"--inject={text!r}: a kill happens at one time, not a range")
    percent = m["unit"] == "%"
    if percent and (until is not None or at > 100):
        raise InvalidRequest(f"--inject={text!r}: a progress trigger is one percentage "
                             "in [0, 100], not a range (ranges are in seconds)")
    if until is not None and until <= at:
        raise InvalidRequest(f"--inject={text!r}: the end {until:g}s is not after {at:g}s")
    factor = float(m["factor"]) if kind == "slow" else 1.0
    if kind == "slow" and factor < 1:
        raise InvalidRequest(f"--inject={text!r}: the slowdown factor must be >= 1")
    if kind == "slow" and job == "master":
        raise InvalidRequest(f"--inject={text!r}: slowing the master is not supported "
                             "(it is not a training task)")
    return Injection(kind, job, index, at, until, factor, percent)
