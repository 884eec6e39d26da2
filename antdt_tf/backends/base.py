"""The ClusterBackend interface: where a job's tasks run, and what became of them.

A backend carries out launches and stops, and reports every task's state in one
vocabulary, whatever runs underneath (agents on loopback, agents on real hosts, Ray
actors, Kubernetes pods). The Controller and the job report speak only this vocabulary.

A task's life as a backend reports it::

    (launch) --> RUNNING --exit 0-------------------------------> SUCCEEDED
                    |----stop on request-----------------------> STOPPED
                    '----exit != 0 | signal | out of memory
                         | host lost | unschedulable-----------> FAILED (a Failure says how)

Launches are numbered: a task is ``job:index`` plus a generation, and a launch is
idempotent for the same name and generation (a retried launch returns the running task;
nothing runs twice). A backend refuses an older generation than one it knows (fencing),
so a controller that restarted and lost track can never stop or replace a newer launch.

Pure Python: no gRPC, no TensorFlow.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from typing import Mapping, Optional, Sequence

from antdt_tf.errors import StaleGeneration, TaskAlreadyRunning, UnknownTask, Unschedulable


class TaskState(enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"       # stopped on request: not a failure


class FailureKind(enum.Enum):
    EXITED = "exited"                 # exited on its own with a non-zero code
    KILLED = "killed"                 # ended by a signal nobody asked for
    HOST_LOST = "host_lost"           # its host (agent, node) is gone or unreachable
    OUT_OF_MEMORY = "out_of_memory"   # killed for passing its memory limit
    UNSCHEDULABLE = "unschedulable"   # no host could take it


@dataclasses.dataclass(frozen=True)
class Failure:
    kind: FailureKind
    exit_code: int = 0        # EXITED: the code; KILLED/OUT_OF_MEMORY: -signal number
    detail: str = ""

    def __str__(self) -> str:
        if self.kind is FailureKind.EXITED:
            what = f"exited with code {self.exit_code}"
        elif self.kind is FailureKind.KILLED:
            what = f"killed by signal {-self.exit_code}"
        else:
            what = self.kind.value.replace("_", " ")
        return f"{what} ({self.detail})" if self.detail else what


@dataclasses.dataclass(frozen=True, order=True)
class TaskName:
    """``job:index`` and the generation of its launch (>= 1)."""
    job: str
    index: int
    generation: int = 1

    def __post_init__(self):
        if self.job not in JOBS:
            raise ValueError(f"unknown job {self.job!r}; expected one of {JOBS}")
        if self.index < 0 or self.generation < 1:
            raise ValueError(f"task index must be >= 0 and generation >= 1, got "
                             f"{self.index}, {self.generation}")

    @property
    def key(self) -> tuple[str, int]:
        return self.job, self.index

    def __str__(self) -> str:
        return f"{self.job}:{self.index}#g{self.generation}"


JOBS = ("ps", "worker", "chief", "master")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a task may go: pinned to one host, or anywhere but ``avoid`` (a move)."""
    pin_to: str = ""
    avoid: frozenset = frozenset()

    def __post_init__(self):
        if self.pin_to and self.pin_to in self.avoid:
            raise ValueError(f"placement pins to {self.pin_to!r} and avoids it")

    def allows(self, host: str) -> bool:
        return (not self.pin_to or host == self.pin_to) and host not in self.avoid


@dataclasses.dataclass(frozen=True, eq=False)
class TaskSpec:
    """What to run: one of the known programs (``cluster_pb2.Program``) with its typed
    arguments (the message that goes with it, e.g. ``TfServerArgs``); the backend builds
    the command line from them, nobody passes flags or environment variables."""
    name: TaskName
    program: int
    args: object                    # a cluster_pb2 *Args message
    endpoint: str = ""              # host:port it serves on (from ClusterBackend.endpoint)
    memory_limit_bytes: int = 0     # 0: none

    def __post_init__(self):
        if not self.program:
            raise ValueError("TaskSpec needs a program")
        if self.memory_limit_bytes < 0:
            raise ValueError("memory_limit_bytes must be >= 0")
        if not hasattr(self.args, "SerializeToString"):
            raise ValueError("TaskSpec args must be the program's typed arguments message")


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    address: str              # where other hosts reach this host's tasks
    first_port: int = 0       # ports its tasks may serve on
    last_port: int = 0
    load: float = 0.0         # 1-minute load average per CPU (everything the host runs)


@dataclasses.dataclass(frozen=True)
class TaskInfo:
    name: TaskName
    host: str
    state: TaskState
    failure: Optional[Failure] = None
    endpoint: str = ""
    pid: int = 0
    started_unix: float = 0.0
    ended_unix: float = 0.0
    log_path: str = ""
    cpu_seconds: float = 0.0
    rss_bytes: int = 0
    slowdown: float = 1.0
    uid: str = ""             # what identifies this run where there is no pid (a pod's uid)

    @property
    def running(self) -> bool:
        return self.state is TaskState.RUNNING


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a backend offers beyond the basics.

    stable_endpoints: a task relaunched anywhere keeps its address (TF's PSS re-joins a
        worker only at its old address; without this a move is a cluster change).
    host_pinning: ``Placement.pin_to`` / ``avoid`` are honoured.
    fault_injection: ``kill`` and ``slow_down`` act on a task's real process.
    """
    stable_endpoints: bool = False
    host_pinning: bool = True
    fault_injection: bool = True


class ClusterBackend(abc.ABC):
    """Launches, stops and watches the tasks of one job."""

    capabilities: Capabilities = Capabilities()

    @abc.abstractmethod
    def hosts(self) -> list[Host]:
        """The live hosts, by name."""

    @abc.abstractmethod
    def endpoint(self, job: str, index: int, host: str) -> str:
        """The ``address:port`` task ``job:index`` will serve on when launched on ``host``
        (the same for every host when ``capabilities.stable_endpoints``)."""

    @abc.abstractmethod
    def launch(self, spec: TaskSpec, host: str, allow_overlap: bool = False) -> TaskInfo:
        """Starts ``spec`` on ``host``. Idempotent for the same name and generation.
        Refused (StaleGeneration) for an older generation than one the backend knows,
        and (TaskAlreadyRunning) while another generation of the task still runs —
        unless ``allow_overlap``: a standby that takes over when the old one is killed."""

    @abc.abstractmethod
    def stop(self, name: TaskName, kill: bool = False, grace_seconds: float = 10.0) -> TaskInfo:
        """Stops that launch (SIGKILL at once with ``kill``: a fault); refused
        (StaleGeneration) when a newer generation of the task runs there."""

    @abc.abstractmethod
    def tasks(self) -> dict[tuple[str, int], TaskInfo]:
        """The latest generation of every task the backend knows, by ``(job, index)``:
        from the hosts themselves, so a new backend object over the same hosts (a
        restarted master) sees what runs (reconcile)."""

    def launch_info(self, name: TaskName) -> Optional[TaskInfo]:
        """The state of exactly this launch as of the last ``tasks()`` (None: never
        seen). An older generation can still run beside a newer one that stands by."""
        info = self.tasks().get(name.key)
        return info if info is not None and info.name == name else None

    def launches_by_task(self) -> dict[tuple[str, int], list[TaskInfo]]:
        """Every launch known now, by task: an older generation may still run beside a
        newer one that stands by (a move a previous master began). What a restarted
        master adopts. Default: the latest generation of each task only."""
        return {key: [info] for key, info in self.tasks().items()}

    def release_all(self) -> None:
        """The end of a job: whatever of it the backend still holds goes (Ray: its
        actors; Kubernetes: its pods and Services). Default: nothing beyond the
        tasks the runner stopped."""

    def slow_down(self, name: TaskName, factor: float, duration_seconds: float = 0.0) -> TaskInfo:
        """Fault injection: the task gets 1/factor of its CPU (factor 1: full speed)."""
        raise NotImplementedError(f"{type(self).__name__} cannot slow tasks down")

    def place(self, placement: Placement = Placement(),
              load: Optional[dict[str, int]] = None) -> str:
        """A live host that ``placement`` allows: the fewest of the job's tasks (``load``:
        tasks per host; default: the running ones), then the least busy host (its load
        per CPU: other jobs on a shared host); Unschedulable when there is none."""
        hosts = {h.name: h for h in self.hosts()}
        live = list(hosts)
        allowed = [h for h in live if placement.allows(h)]
        if not allowed:
            raise Unschedulable(f"no live host for placement {placement} (live hosts: "
                                f"{sorted(live) or 'none'})")
        if load is None:
            load = {}
            for info in self.tasks().values():
                if info.running:
                    load[info.host] = load.get(info.host, 0) + 1
        return min(allowed, key=lambda h: (load.get(h, 0), round(hosts[h].load, 1), h))

    def close(self) -> None:
        """Releases the backend's own resources (not the job's tasks)."""


def classify_exit(exit_code: int, stopped_on_request: bool, out_of_memory: bool
                  ) -> tuple[TaskState, Optional[Failure]]:
    """A process's end in the backend vocabulary (shared by the process-based backends)."""
    if stopped_on_request:
        return TaskState.STOPPED, None
    if out_of_memory:
        return TaskState.FAILED, Failure(FailureKind.OUT_OF_MEMORY, exit_code)
    if exit_code == 0:
        return TaskState.SUCCEEDED, None
    if exit_code < 0:
        return TaskState.FAILED, Failure(FailureKind.KILLED, exit_code)
    return TaskState.FAILED, Failure(FailureKind.EXITED, exit_code)


def latest(infos: Sequence[TaskInfo]) -> dict[tuple[str, int], TaskInfo]:
    """The newest generation of each task (a running one wins a tie)."""
    out: dict[tuple[str, int], TaskInfo] = {}
    for info in infos:
        old = out.get(info.name.key)
        if old is None or (info.name.generation, info.running) > (old.name.generation,
                                                                   old.running):
            out[info.name.key] = info
    return out


def admit_launch(known: Optional[TaskInfo], spec: TaskSpec, host: str,
                 allow_overlap: bool) -> Optional[TaskInfo]:
    """The launch rules of every backend, given the task's newest launch ``known``: the
    same launch again is that launch (idempotent; returned), an older generation is
    refused (StaleGeneration), and so is a newer one while the old one runs
    (TaskAlreadyRunning) unless ``allow_overlap``. None: the launch may go ahead."""
    if known is None:
        return None
    if spec.name.generation < known.name.generation:
        raise StaleGeneration(f"launch of {spec.name}: generation {known.name.generation} "
                              f"of the task exists (on {known.host})")
    if spec.name.generation == known.name.generation:
        if known.host != host:
            raise StaleGeneration(f"{spec.name} was launched on {known.host}, not {host}")
        return known
    if known.running and not allow_overlap:
        raise TaskAlreadyRunning(f"{known.name} still runs on {known.host}; stop it before "
                                 f"launching {spec.name}")
    return None


def refuse_unknown_stop(name: TaskName, newest: Optional[TaskInfo], missing: str):
    """A stop of a launch the backend does not know: StaleGeneration when a newer
    generation of the task is the current one, else UnknownTask(``missing``)."""
    if newest is not None and newest.name.generation > name.generation:
        raise StaleGeneration(f"{name}: the task's current launch is {newest.name} on "
                              f"{newest.host}")
    raise UnknownTask(missing)


def refuse_fenced_stop(name: TaskName, info: TaskInfo,
                       launches: Mapping[TaskName, TaskInfo]) -> None:
    """The stop rule of every backend, as on a host: a newer launch of the task that runs
    where ``name`` ran fences it off (StaleGeneration; nothing is stopped)."""
    newer = [i for n, i in launches.items() if n.key == name.key
             and n.generation > name.generation and i.running and i.host == info.host]
    if newer:
        raise StaleGeneration(f"{name}: {newer[0].name} runs on {info.host} now; nothing "
                              "stopped")
