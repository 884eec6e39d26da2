"""What a job is: the ``JobSpec`` proto, its defaults, its checks, and where its tasks go.

``JobSpec`` (protos/antdt/v1/job.proto) is the one description of a job: antdt-launch
turns its flags into one (:func:`new_spec`, defaults from :data:`DEFAULTS`), any client
submits one, and the master's runner reads the same message through :class:`Job`, a
read-only view that adds what follows from it (``slots``, ``tf1``, the workdir as a
path). Both sides check a spec with the same :func:`validate`. Facts of a running job
(the tasks' current addresses, generations) live in the runner's own record, never in
the spec."""

from __future__ import annotations

import math
import pathlib

from antdt_tf import limits
from antdt_tf.agent.inject import Injection
from antdt_tf.agent.programs import PROGRAM_MODULE
from antdt_tf.controller.policy import CostModel
from antdt_tf.errors import InvalidRequest, shown
from antdt_tf.monitor.straggler import StragglerConfig
from antdt_tf.proto import job_pb2 as jpb


TF1_APIS = ("mts", "estimator")
SOURCE_ROOT = pathlib.Path(__file__).resolve().parent.parent.parent

# Every JobSpec default, by field (a field not named here defaults to the proto's zero:
# the data, the workdir, the checkpoint dir, the addresses). antdt-launch's flags take
# theirs from here; the Monitor's and the cost model's are their own classes' defaults.
DEFAULTS = {
    "api": "custom_loop", "mode": "async", "data_path": "pull", "backend": "local",
    "num_ps": 2, "num_workers": 3, "max_workers": 0,
    "epochs": 1, "batch_size": 256, "records_per_shard": 2048, "shuffle": True,
    "buckets": 1 << 16, "learning_rate": 0.2, "data_seed": 1,
    "checkpoint_every_shards": 16, "checkpoint_every_seconds": 10.0, "audit": False,
    "timeout_seconds": 1800.0, "max_restarts": 5, "host_timeout_seconds": 10.0,
    "policy": "antdt-nd", "controller_interval_seconds": 1.0,
    "straggler_window_seconds": StragglerConfig.window_seconds,
    "straggler_slow_ratio": StragglerConfig.slow_ratio,
    "straggler_persistent_after_seconds": StragglerConfig.persistent_after_seconds,
    "relaunch_cost_seconds": CostModel.relaunch_worker_seconds,
    "replace_ps_cost_seconds": CostModel.replace_ps_seconds,
    "min_gain_seconds": CostModel.min_gain_seconds,
}
_JOBS = ("chief", "ps", "worker")


def new_spec(**fields) -> jpb.JobSpec:
    """A JobSpec with :data:`DEFAULTS` and ``fields`` set (unchecked: see :func:`validate`).
    ``workdir`` may be a path, ``injections`` parsed :class:`Injection` objects, ``addresses``
    a ``{job: [host:port]}`` dict (the local backend's loopback addresses)."""
    injections = fields.pop("injections", ())
    addresses = fields.pop("addresses", {})
    values = {**DEFAULTS, **fields}
    if values.get("workdir") is not None:
        values["workdir"] = str(values["workdir"])
    spec = jpb.JobSpec(**{k: v for k, v in values.items() if v is not None})
    for inj in injections:
        spec.injections.add(kind=inj.kind, job=inj.job, index=inj.index, at=inj.at,
                            percent=inj.percent, until=inj.until or 0.0,
                            has_until=inj.until is not None, factor=inj.factor)
    for job, given in addresses.items():
        getattr(spec, f"{job}_addresses").extend(given)
    return spec


class Job:
    """A checked JobSpec as the runner and the launcher read it: every spec field by its
    name, plus what follows from them. Read-only (a job's spec does not change once
    submitted); :meth:`replace` gives a changed copy to a submitter still filling it in."""

    __slots__ = ("spec",)

    def __init__(self, spec: jpb.JobSpec):
        object.__setattr__(self, "spec", spec)

    @classmethod
    def of(cls, spec: jpb.JobSpec) -> "Job":
        """``spec`` as a job the master takes; InvalidRequest saying what is wrong (the
        master refuses the job, nothing starts)."""
        validate(spec)
        check_addresses(spec)
        return cls(spec)

    def __getattr__(self, name):
        if name in jpb.JobSpec.DESCRIPTOR.fields_by_name:
            return getattr(self.spec, name)
        raise AttributeError(f"a job has no {name!r}")

    def __setattr__(self, name, value):
        raise AttributeError(f"a job's spec is read-only ({name}); use Job.replace")

    def replace(self, **fields) -> "Job":
        """A copy with ``fields`` changed (``workdir`` may be a path, ``addresses`` a
        ``{job: [host:port]}`` dict, ``files`` the data files as ``[(path, records)]``)."""
        spec = jpb.JobSpec()
        spec.CopyFrom(self.spec)
        if "files" in fields:
            del spec.data_files[:]
            spec.data_files.extend(jpb.DataFileSpec(path=p, num_records=n)
                                   for p, n in fields.pop("files"))
        if "workdir" in fields:
            fields["workdir"] = str(fields["workdir"])
        for job, given in fields.pop("addresses", {}).items():
            del getattr(spec, f"{job}_addresses")[:]
            getattr(spec, f"{job}_addresses").extend(given)
        for name, value in fields.items():
            setattr(spec, name, value)
        return Job(spec)

    @property
    def workdir(self) -> pathlib.Path:
        return pathlib.Path(self.spec.workdir)

    @property
    def injections(self) -> tuple[Injection, ...]:
        return tuple(Injection(i.kind, i.job, i.index, i.at,
                               i.until if i.has_until else None, i.factor or 1.0, i.percent)
                     for i in self.spec.injections)

    @property
    def addresses(self) -> dict[str, list[str]]:
        """The local backend's submitted loopback address of every task, by job (empty
        elsewhere: there addresses are chosen where the tasks land)."""
        return {job: list(getattr(self.spec, f"{job}_addresses")) for job in _JOBS}

    @property
    def files(self) -> list[tuple[str, int]]:
        """The job's data as ``[(path, records)]`` (the submitter counted them); empty
        for a spec that names one .adtr file in ``data`` (counted where it is read)."""
        return [(f.path, f.num_records) for f in self.spec.data_files]

    @property
    def program_roots(self) -> tuple[str, ...]:
        """Where the job's own code lies (a program file's directory, a module's
        code_dir; none for antdt-tf's own trainers): the agents a job starts itself (local,
        Ray) run programs from there only."""
        if self.spec.program.endswith(".py"):
            return (str(pathlib.PurePosixPath(self.spec.program).parent),)
        return (self.spec.code_dir,) if self.spec.code_dir else ()

    @property
    def read_roots(self) -> tuple[str, ...]:
        """The directories of the job's data (training, held out, every data file): what
        the agents a job starts itself let its tasks read."""
        return tuple(sorted({str(pathlib.Path(p).resolve().parent) for p in
                             (self.spec.data, self.spec.eval_data,
                              *(f.path for f in self.spec.data_files)) if p}))

    def count_records(self) -> int:
        """Records per epoch: the data files' counts (the submitter counted them), else
        the .adtr file's header (DataError/OSError when it cannot be read here)."""
        if self.spec.data_files:
            return sum(f.num_records for f in self.spec.data_files)
        from antdt_tf.data.records import RecordFile

        return RecordFile(self.spec.data).num_records

    @property
    def agents(self) -> bool:
        """Real hosts whose agents registered with the master (else simulated hosts on
        loopback, with the addresses the submitter picked, or Ray nodes)."""
        return self.spec.backend == "agents"

    @property
    def ray(self) -> bool:
        """Ray nodes: every task an actor the master's RayBackend places."""
        return self.spec.backend == "ray"

    @property
    def slots(self) -> int:
        return max(self.spec.max_workers, self.spec.num_workers)

    @property
    def tf1(self) -> bool:
        """TF1 between-graph: every worker trains (worker 0 is the chief); no coordinator."""
        return self.spec.api in TF1_APIS

    def __repr__(self) -> str:
        return f"Job({self.spec.api} on {self.spec.backend}, workdir {self.spec.workdir})"


def skips_refused_leases(cfg) -> bool:
    """Whether the job's trainer stops applying a lease's batches once a report about it
    was refused (needed for tail stealing and backup leases): PullTrainer in async mode
    and the TF1 feed do; Keras and BSP rounds do not. a Job, a JobSpec or FLAGS."""
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


CHOICES = {"api": ("custom_loop", "keras", "mts", "estimator"), "mode": ("async", "bsp"),
          "data_path": ("pull", "closure"), "backend": ("local", "agents", "ray", "kubernetes")}
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
            values = [value] if isinstance(value, str) else list(value)
            if len(values) > limits.MAX_JOB_WORKERS:
                raise InvalidRequest(f"JobSpec.{name}: {len(values)} entries, at most "
                                     f"{limits.MAX_JOB_WORKERS} allowed")
            for v in values:
                if len(v) > limits.MAX_STRING_CHARS or "\0" in v:
                    raise InvalidRequest(f"JobSpec.{name} {shown(v)} is longer than "
                                         f"{limits.MAX_STRING_CHARS} characters or holds "
                                         "a NUL character")
    if len(spec.data_files) > limits.MAX_FILES:
        raise InvalidRequest(f"JobSpec: {len(spec.data_files)} data files, at most "
                             f"{limits.MAX_FILES} allowed")
    for f in spec.data_files:
        if not f.path or len(f.path) > limits.MAX_PATH_CHARS or "\0" in f.path:
            raise InvalidRequest(f"JobSpec data file {shown(f.path)}: not a usable path")
        if not 1 <= f.num_records <= limits.MAX_RECORDS_PER_EPOCH:
            raise InvalidRequest(f"JobSpec data file {shown(f.path)}: num_records must be "
                                 f"in [1, {limits.MAX_RECORDS_PER_EPOCH}], got "
                                 f"{f.num_records}")
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
    if spec.backend in ("kubernetes", "ray") and spec.api != "custom_loop":
        page = {"kubernetes": "kubernetes", "ray": "ray"}[spec.backend]
        raise InvalidRequest(f"JobSpec.backend={spec.backend} runs JobSpec.api=custom_loop "
                             f"jobs for now (docs/{page}.md)")
    if spec.backend == "kubernetes" and spec.program:
        raise InvalidRequest("JobSpec.backend=kubernetes: a job's own program runs on "
                             "local, agents and ray for now (docs/program.md)")
    if scaling and spec.backend in ("agents", "kubernetes"):
        page = {"agents": "backends", "kubernetes": "kubernetes"}[spec.backend]
        raise InvalidRequest(f"JobSpec.backend={spec.backend} runs jobs without "
                             f"JobSpec.max_workers for now (docs/{page}.md)")
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


def validate(spec) -> None:
    """InvalidRequest saying what is wrong with a JobSpec (its addresses aside), else
    nothing: the master refuses such a job (:meth:`Job.of`), and antdt-launch refuses it
    before it creates anything (its provisional spec, messages reading ``--flag``)."""
    for name, allowed in CHOICES.items():
        if getattr(spec, name) not in allowed:
            raise InvalidRequest(f"JobSpec.{name} must be one of {allowed}, got "
                                 f"{shown(getattr(spec, name))}")
    _check_ranges(spec)
    _check_combinations(spec)
    if not spec.workdir or not pathlib.Path(spec.workdir).is_absolute():
        raise InvalidRequest(f"JobSpec.workdir must be an absolute path, got "
                             f"{shown(spec.workdir)}")
    if not spec.data and not spec.data_files:
        raise InvalidRequest("JobSpec.data and JobSpec.data_files are empty")
    _check_program(spec)
    if spec.backend == "ray" and not spec.ray_namespace:
        raise InvalidRequest("JobSpec.ray_namespace is empty (the ray backend names the "
                             "job's actors there)")
    if spec.task_ports:
        task_port_range(spec.task_ports)


def _check_program(spec) -> None:
    """A job's own program is named the way an agent can run it (where it lies is the
    agent's to check: under its --program_roots, on that host)."""
    if not spec.program:
        if spec.program_args or spec.code_dir:
            raise InvalidRequest("JobSpec.program_args and JobSpec.code_dir go with "
                                 "JobSpec.program")
        if not spec.data:
            raise InvalidRequest("JobSpec.data is empty: antdt-tf's own trainers read one "
                                 ".adtr file (a program of your own reads JobSpec.data_files)")
        return
    if spec.program.endswith(".py"):
        if not pathlib.PurePosixPath(spec.program).is_absolute():
            raise InvalidRequest(f"JobSpec.program {shown(spec.program)} must be an "
                                 "absolute path (every host runs it from there)")
        if spec.code_dir:
            raise InvalidRequest("JobSpec.code_dir goes with a module program "
                                 "(pkg.module[:function]); a file runs from its directory")
    elif not PROGRAM_MODULE.match(spec.program):     # what an agent will run
        raise InvalidRequest(f"JobSpec.program must be /abs/path/file.py or "
                             f"pkg.module[:function], got {shown(spec.program)}")
    elif spec.code_dir and not pathlib.PurePosixPath(spec.code_dir).is_absolute():
        raise InvalidRequest(f"JobSpec.code_dir {shown(spec.code_dir)} must be an absolute "
                             "path")
    if not spec.data_files:
        raise InvalidRequest("JobSpec.data_files is empty: a job's own program trains on "
                             "files the submitter counted (antdt-launch --data)")


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


def check_addresses(spec) -> None:
    """The local backend's tasks keep the loopback addresses their submitter picked: one
    host:port for every slot (InvalidRequest otherwise)."""
    if spec.backend != "local":
        return
    slots = max(spec.max_workers, spec.num_workers)
    for job, n in {"chief": 1, "ps": spec.num_ps, "worker": slots}.items():
        given = list(getattr(spec, f"{job}_addresses"))
        if len(given) != n or not all(":" in a for a in given):
            raise InvalidRequest(f"JobSpec: the local backend needs {n} host:port {job} "
                                 f"address(es), got {len(given)}: {shown(given)}")
