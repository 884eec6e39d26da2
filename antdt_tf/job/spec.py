"""What a job is: its configuration, its checks, and where its tasks go.

The one home of a job's description for the launcher (flags -> ``JobConfig`` -> the
``JobSpec`` proto it submits) and the master (the proto it is sent -> ``JobConfig``
its runner reads); both check a spec with the same :func:`check_spec`."""

from __future__ import annotations

import dataclasses
import math
import pathlib

from antdt_tf import limits
from antdt_tf.agent.inject import Injection
from antdt_tf.controller.policy import CostModel
from antdt_tf.errors import InvalidRequest, shown
from antdt_tf.monitor.straggler import StragglerConfig


TF1_APIS = ("mts", "estimator")
SOURCE_ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


@dataclasses.dataclass
class JobConfig:
    num_ps: int
    num_workers: int
    num_hosts: int
    data: str
    eval_data: str
    epochs: int
    batch_size: int
    records_per_shard: int
    shuffle: bool
    buckets: int
    checkpoint_dir: str
    learning_rate: float
    checkpoint_every_shards: int
    audit: bool
    workdir: pathlib.Path
    injections: tuple[Injection, ...] = ()
    timeout_seconds: float = 1800
    max_restarts: int = 5
    data_seed: int = 1
    api: str = "custom_loop"
    data_path: str = "pull"
    checkpoint_every_seconds: float = 10.0
    policy: str = "antdt-nd"
    controller_interval_seconds: float = 1.0
    # the Monitor's and the cost model's own defaults (one home each)
    straggler_window_seconds: float = StragglerConfig.window_seconds
    straggler_slow_ratio: float = StragglerConfig.slow_ratio
    straggler_persistent_after_seconds: float = StragglerConfig.persistent_after_seconds
    relaunch_cost_seconds: float = CostModel.relaunch_worker_seconds
    replace_ps_cost_seconds: float = CostModel.replace_ps_seconds
    min_gain_seconds: float = CostModel.min_gain_seconds
    max_workers: int = 0
    mode: str = "async"
    estimator_python: str = ""
    backend: str = "local"
    master: str = ""
    host_timeout_seconds: float = 10.0
    ray_namespace: str = ""         # ray: the job's namespace
    task_ports: str = ""            # ray: "FIRST-LAST" (empty: the backend's default)
    # local: the loopback address of every task, picked by the submitter (job -> list)
    addresses: dict = dataclasses.field(default_factory=dict)

    @property
    def agents(self) -> bool:
        """Real hosts whose agents registered with the master (else simulated hosts on
        loopback, with the addresses the submitter picked, or Ray nodes)."""
        return self.backend == "agents"

    @property
    def ray(self) -> bool:
        """Ray nodes: every task an actor the master's RayBackend places."""
        return self.backend == "ray"

    @property
    def slots(self) -> int:
        return max(self.max_workers, self.num_workers)

    @property
    def tf1(self) -> bool:
        """TF1 between-graph: every worker trains (worker 0 is the chief); no coordinator."""
        return self.api in TF1_APIS


# every JobConfig default, by field: the launcher's flags take theirs from here
DEFAULTS = {f.name: f.default for f in dataclasses.fields(JobConfig)
            if f.default is not dataclasses.MISSING}


def skips_refused_leases(cfg) -> bool:
    """Whether the job's trainer stops applying a lease's batches once a report about it
    was refused (needed for tail stealing and backup leases): PullTrainer in async mode
    and the TF1 feed do; Keras and BSP rounds do not. ``cfg``: JobConfig or FLAGS."""
    return cfg.api in TF1_APIS or (cfg.api == "custom_loop" and cfg.mode == "async"
                                   and cfg.data_path == "pull")


def place(num_ps: int, num_workers: int, num_hosts: int) -> dict[tuple[str, int], int]:
    """Host index of every task: master and coordinator on host 0, PS and workers
    round-robin (PS first, so PS land on different hosts when there are enough)."""
    where = {("master", 0): 0, ("chief", 0): 0}
    tasks = [("ps", i) for i in range(num_ps)] + [("worker", i) for i in range(num_workers)]
    for n, task in enumerate(tasks):
        where[task] = n % num_hosts
    return where


_ENUMS = {"api": ("custom_loop", "keras", "mts", "estimator"), "mode": ("async", "bsp"),
          "data_path": ("pull", "closure"), "backend": ("local", "agents", "ray", "kubernetes")}
_SKIP = ("workdir", "injections", "addresses", "master")


def to_proto(cfg: JobConfig):
    """The JobSpec a client submits to the master."""
    from antdt_tf.proto import job_pb2 as jpb

    spec = jpb.JobSpec(workdir=str(cfg.workdir))
    for field in spec.DESCRIPTOR.fields:
        if field.name not in _SKIP and hasattr(cfg, field.name):
            setattr(spec, field.name, getattr(cfg, field.name))
    for inj in cfg.injections:
        spec.injections.add(kind=inj.kind, job=inj.job, index=inj.index, at=inj.at,
                            percent=inj.percent, until=inj.until or 0.0,
                            has_until=inj.until is not None, factor=inj.factor)
    for job in ("chief", "ps", "worker"):
        getattr(spec, f"{job}_addresses").extend(cfg.addresses.get(job, ()))
    return spec


# JobSpec's numbers: (lowest, highest) allowed; every double must be finite too
_INT_RANGES = {
    "num_ps": (1, limits.MAX_JOB_PS), "num_workers": (1, limits.MAX_JOB_WORKERS),
    "max_workers": (0, limits.MAX_JOB_WORKERS), "num_hosts": (1, limits.MAX_JOB_HOSTS),
    "epochs": (1, limits.MAX_EPOCHS), "batch_size": (1, limits.MAX_BATCH_SIZE),
    "records_per_shard": (1, 2**31 - 1), "buckets": (1, limits.MAX_JOB_BUCKETS),
    "checkpoint_every_shards": (1, 2**31 - 1), "max_restarts": (0, limits.MAX_RESTARTS),
    "data_seed": (-2**31, 2**31 - 1)}
_POSITIVE = ("learning_rate", "timeout_seconds", "controller_interval_seconds",
             "checkpoint_every_seconds")
_STRING_LISTS = ("chief_addresses", "ps_addresses", "worker_addresses")


def _check_ranges(spec) -> None:
    """Every field of a JobSpec within its documented range (docs/security.md,
    "Requests the master refuses"): numbers finite and bounded, strings bounded and
    without NUL, lists bounded."""
    for field in spec.DESCRIPTOR.fields:
        name, value = field.name, getattr(spec, field.name)
        if name in _INT_RANGES:
            lo, hi = _INT_RANGES[name]
            if value < lo:
                raise InvalidRequest(f"JobSpec.{name} must be >= {lo}, got {value}")
            if value > hi:
                raise InvalidRequest(f"JobSpec.{name} must be <= {hi}, got {value}")
        elif field.type == field.TYPE_DOUBLE:
            if not (math.isfinite(value) and 0 <= value <= limits.MAX_SECONDS):
                raise InvalidRequest(f"JobSpec.{name} must be a finite number in "
                                     f"[0, {limits.MAX_SECONDS:g}], got {value}")
            if name in _POSITIVE and not value > 0:
                raise InvalidRequest(f"JobSpec.{name} must be > 0, got {value}")
        elif field.type == field.TYPE_STRING:
            values = list(value) if name in _STRING_LISTS else [value]
            if len(values) > limits.MAX_JOB_WORKERS:
                raise InvalidRequest(f"JobSpec.{name}: {len(values)} entries, at most "
                                     f"{limits.MAX_JOB_WORKERS} allowed")
            for v in values:
                if len(v) > limits.MAX_STRING_CHARS or "\0" in v:
                    raise InvalidRequest(f"JobSpec.{name} {shown(v)} is longer than "
                                         f"{limits.MAX_STRING_CHARS} characters or holds "
                                         "a NUL character")
    if len(spec.injections) > limits.MAX_INJECTIONS:
        raise InvalidRequest(f"JobSpec: {len(spec.injections)} injections, at most "
                             f"{limits.MAX_INJECTIONS} allowed")
    for i in spec.injections:
        if i.kind not in ("kill", "slow", "scale") or i.job not in ("worker", "ps", "chief",
                                                                     "master"):
            raise InvalidRequest(f"JobSpec injection: kind {shown(i.kind)} / job "
                                 f"{shown(i.job)} unknown (kill|slow|scale of "
                                 "worker|ps|chief|master)")
        if not 0 <= i.index <= limits.MAX_JOB_WORKERS:
            raise InvalidRequest(f"JobSpec injection index must be in "
                                 f"[0, {limits.MAX_JOB_WORKERS}], got {i.index}")
        for name in ("at", "until", "factor"):
            value = getattr(i, name)
            if not (math.isfinite(value) and 0 <= value <= limits.MAX_SECONDS):
                raise InvalidRequest(f"JobSpec injection {name} must be a finite number in "
                                     f"[0, {limits.MAX_SECONDS:g}], got {value}")


def _check_combinations(spec) -> None:
    """What the job's parts can do together: which API runs on which backend, what
    scaling, BSP rounds, the TF1 hooks and the preset policies need. One place, so a
    spec sent to the master directly is refused exactly as antdt-launch refuses it
    (whose messages read ``--flag`` for ``JobSpec.flag``)."""
    from antdt_tf.controller.policy import PRESETS, PolicyTraits

    scaling = spec.max_workers > spec.num_workers
    kills_master = any(i.job == "master" for i in spec.injections)
    if spec.backend in ("agents", "kubernetes", "ray") and (
            spec.api != "custom_loop" or (scaling and spec.backend != "ray")):
        page = {"agents": "backends", "kubernetes": "kubernetes", "ray": "ray"}[spec.backend]
        raise InvalidRequest(f"JobSpec.backend={spec.backend} runs JobSpec.api=custom_loop "
                             "jobs" + ("" if spec.backend == "ray" else
                                       " without JobSpec.max_workers") +
                             f" for now (docs/{page}.md)")
    if spec.backend == "agents":
        if kills_master:
            raise InvalidRequest("JobSpec.backend=agents: the master is not the launcher's "
                                 "to kill (it runs on its own host)")
        if not spec.host_timeout_seconds > 0:
            raise InvalidRequest("JobSpec.host_timeout_seconds must be > 0")
    if spec.backend == "kubernetes" and spec.injections:
        raise InvalidRequest("JobSpec.backend=kubernetes: fault injection is not done to a "
                             "cluster's pods (JobSpec.inject)")
    if spec.max_workers and spec.max_workers < spec.num_workers:
        raise InvalidRequest("JobSpec.max_workers must be 0 or >= JobSpec.num_workers")
    if scaling and (spec.api != "custom_loop" or spec.data_path != "pull"):
        raise InvalidRequest("scaling (JobSpec.max_workers) needs JobSpec.api=custom_loop "
                             "JobSpec.data_path=pull")
    if spec.mode == "bsp" and (spec.api != "custom_loop" or spec.data_path != "pull"
                               or scaling):
        raise InvalidRequest("JobSpec.mode=bsp needs JobSpec.api=custom_loop "
                             "JobSpec.data_path=pull and no JobSpec.max_workers (a round has "
                             "one batch per worker at start)")
    if spec.api in TF1_APIS:
        # the hooks carry out RelaunchWorker (a non-chief worker moves to another host),
        # tail stealing and ADJUST_BS sizes; PS replacement and scaling drive the TF2
        # coordinator and have no TF1 counterpart here
        for i in spec.injections:
            if i.job in ("chief", "ps") or i.kind == "scale":
                raise InvalidRequest(f"JobSpec.api={spec.api}: injection {i.kind}:{i.job}:"
                                     f"{i.index} is not supported (kill:worker:0 kills the "
                                     "chief; kill:master, kill:worker and slow:worker work)")
    if spec.policy in PRESETS:      # a user's policy: where it is loaded (check_traits)
        check_traits(spec, PolicyTraits.of(PRESETS[spec.policy]()))


def check_traits(spec, traits) -> None:
    """What the policy's way of serving the data needs of the job (``traits``: its
    ``controller.PolicyTraits``)."""
    if traits.sharding == "static" and (spec.max_workers > spec.num_workers
                                        or spec.api != "custom_loop"
                                        or spec.data_path != "pull"):
        raise InvalidRequest("JobSpec.policy=static (static sharding) needs "
                             "JobSpec.api=custom_loop JobSpec.data_path=pull and no "
                             "JobSpec.max_workers")
    if traits.backup_leases and not skips_refused_leases(spec):
        raise InvalidRequest(f"JobSpec.policy={spec.policy} (backup workers) needs a trainer "
                             "that stops a lease whose duplicate finished first: "
                             "JobSpec.api=custom_loop JobSpec.mode=async "
                             "JobSpec.data_path=pull, or JobSpec.api=mts|estimator")


def check_spec(spec) -> None:
    """InvalidRequest saying what is wrong with a JobSpec (its addresses aside), else
    nothing: the master refuses such a job (:func:`from_proto`), and antdt-launch refuses
    it before it creates anything (``to_proto`` of its provisional config)."""
    for name, allowed in _ENUMS.items():
        if getattr(spec, name) not in allowed:
            raise InvalidRequest(f"JobSpec.{name} must be one of {allowed}, got "
                                 f"{shown(getattr(spec, name))}")
    _check_ranges(spec)
    _check_combinations(spec)
    if not spec.workdir or not pathlib.Path(spec.workdir).is_absolute():
        raise InvalidRequest(f"JobSpec.workdir must be an absolute path, got "
                             f"{shown(spec.workdir)}")
    if not spec.data:
        raise InvalidRequest("JobSpec.data is empty")
    if spec.backend == "ray" and not spec.ray_namespace:
        raise InvalidRequest("JobSpec.ray_namespace is empty (the ray backend names the "
                             "job's actors there)")
    if spec.task_ports:
        task_port_range(spec.task_ports)


def default_namespace(workdir) -> str:
    """A job's Ray namespace: one per workdir, so a job and its actors find each other."""
    import hashlib

    return "antdt-" + hashlib.sha1(str(workdir).encode()).hexdigest()[:12]


def task_port_range(text: str) -> tuple[int, int]:
    """``"FIRST-LAST"`` as a port range; InvalidRequest when it is none."""
    first, _, last = text.partition("-")
    try:
        lo, hi = int(first), int(last)
    except ValueError:
        raise InvalidRequest(f"task ports {shown(text)}: expected FIRST-LAST, e.g. "
                             "23000-23999") from None
    if not 1024 <= lo <= hi <= 65535:
        raise InvalidRequest(f"task ports {shown(text)}: a range within 1024-65535")
    return lo, hi


def from_proto(spec) -> JobConfig:
    """A submitted JobSpec as the job's configuration; InvalidRequest saying what is wrong
    (the master refuses the job, nothing starts)."""
    names = {f.name for f in dataclasses.fields(JobConfig)}
    kwargs = {f.name: getattr(spec, f.name) for f in spec.DESCRIPTOR.fields
              if f.name in names and f.name not in _SKIP}
    check_spec(spec)
    injections = tuple(
        Injection(i.kind, i.job, i.index, i.at, i.until if i.has_until else None,
                  i.factor or 1.0, i.percent) for i in spec.injections)
    slots = max(kwargs["max_workers"], kwargs["num_workers"])
    addresses = {}
    if kwargs["backend"] == "local":
        addresses = {"chief": list(spec.chief_addresses), "ps": list(spec.ps_addresses),
                     "worker": list(spec.worker_addresses)}
        want = {"chief": 1, "ps": kwargs["num_ps"], "worker": slots}
        for job, n in want.items():
            if len(addresses[job]) != n or not all(":" in a for a in addresses[job]):
                raise InvalidRequest(f"JobSpec: the local backend needs {n} host:port "
                                     f"{job} address(es), got {len(addresses[job])}: "
                                     f"{shown(addresses[job])}")
    return JobConfig(workdir=pathlib.Path(spec.workdir), injections=injections,
                     addresses=addresses, **kwargs)
