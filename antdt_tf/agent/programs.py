"""The programs an agent runs, and the command line it builds for each from a typed
``StartTaskRequest``.

A caller of the agent names a program (an enum) and gives typed arguments; the agent
writes every flag itself. So a caller cannot pass a flag the program was not meant to
get here (``--flagfile``, ``--port_file``), cannot set an environment variable (which
alone makes a Python interpreter run any command at start-up), and every path it gives
must lie under the agent's job root (``--job_root``; data it only reads may also lie
under ``--read_roots``). Anything else is refused with the reason (InvalidRequest), and
nothing is started.

Pure: no gRPC server, no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import re
from typing import Callable, Iterable

from antdt_tf.errors import InvalidRequest
from antdt_tf.proto import cluster_pb2 as cpb

SOURCE_ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
_ADDRESS = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.\-]{0,252}):[0-9]{1,5}\Z")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-/]{0,127}\Z")
_MAX_TEXT = 4096


def _show(value: str) -> str:
    """A caller's value in an error message, bounded."""
    return repr(value if len(value) <= 80 else value[:77] + "...")


@dataclasses.dataclass(frozen=True)
class PathPolicy:
    """Where a task's paths may point: ``job_roots`` (read and write: the job's directory,
    its checkpoints) and ``read_roots`` (read only: training data). Symlinks are resolved
    before the check, so a link inside a root that points out of it is refused too."""
    job_roots: tuple
    read_roots: tuple = ()
    # where the jobs' own programs may be run from (antdt-agent --program_roots)
    program_roots: tuple = ()

    def __post_init__(self):
        if not self.job_roots or not all(os.path.isabs(r) for r in
                                         (*self.job_roots, *self.read_roots,
                                          *self.program_roots)):
            raise ValueError("an agent needs a job root; roots must be absolute paths")

    def _under(self, path: str, roots: Iterable[str]) -> bool:
        real = os.path.realpath(path)
        for root in roots:
            root = os.path.realpath(root)
            if real == root or real.startswith(root.rstrip("/") + "/"):
                return True
        return False

    def check(self, what: str, path: str, read_only: bool = False) -> str:
        if not path:
            return path
        if "\0" in path or len(path) > _MAX_TEXT:
            raise InvalidRequest(f"{what}: not a usable path")
        if not os.path.isabs(path):
            raise InvalidRequest(f"{what} must be an absolute path, got {_show(path)}")
        roots = (*self.job_roots, *self.read_roots) if read_only else self.job_roots
        if not self._under(path, roots):
            allowed = " or ".join(_show(r) for r in roots)
            raise InvalidRequest(f"{what} {_show(path)} is outside the job root of this agent "
                                 f"(must be under {allowed}; see antdt-agent --job_root"
                                 f"{' and --read_roots' if read_only else ''})")
        return path

    def program(self, what: str, path: str) -> str:
        """A job's own code (a program file or a module's directory): an absolute path
        that exists, under a program root once symlinks are resolved."""
        if "\0" in path or len(path) > _MAX_TEXT or not os.path.isabs(path):
            raise InvalidRequest(f"{what} must be an absolute path, got {_show(path)}")
        if not self.program_roots:
            raise InvalidRequest(f"{what} {_show(path)}: this agent runs no job's own "
                                 "programs (its operator allows them with antdt-agent "
                                 "--program_roots)")
        if not self._under(path, self.program_roots):
            allowed = " or ".join(_show(r) for r in self.program_roots)
            raise InvalidRequest(f"{what} {_show(path)} is outside the program roots of "
                                 f"this agent (must be under {allowed}, symlinks resolved; "
                                 "see antdt-agent --program_roots)")
        if not os.path.exists(path):
            raise InvalidRequest(f"{what} {_show(path)} does not exist on this host")
        return path


def _address(what: str, value: str, required: bool = True) -> str:
    if not value and not required:
        return value
    if not _ADDRESS.match(value) or int(value.rsplit(":", 1)[1]) > 65535:
        raise InvalidRequest(f"{what} must be host:port, got {_show(value)}")
    return value


def _name(what: str, value: str) -> str:
    if not _NAME.match(value):
        raise InvalidRequest(f"{what} must match {_NAME.pattern[:-2]}, got {_show(value)}")
    return value


def _positive(what: str, value, allow_zero: bool = False):
    ok = value >= 0 if allow_zero else value > 0
    if not ok or (isinstance(value, float) and not math.isfinite(value)):
        raise InvalidRequest(f"{what} must be {'>= 0' if allow_zero else '> 0'} and finite, "
                             f"got {value}")
    return value


def _cluster(what: str, cluster: cpb.ClusterAddresses, jobs: tuple) -> dict:
    out = {}
    for job, addresses in cluster.jobs.items():
        if job not in jobs:
            raise InvalidRequest(f"{what}: unknown job {_show(job)}; expected {jobs}")
        if len(addresses.address) > 10_000:
            raise InvalidRequest(f"{what}: too many {job} addresses")
        out[job] = [_address(f"{what} {job} address", a) for a in addresses.address]
    if not out.get("ps") or not out.get("worker"):
        raise InvalidRequest(f"{what} needs ps and worker addresses")
    return out


def _flag(name: str, value) -> str:
    if isinstance(value, bool):
        return f"--{name}" if value else f"--no{name}"
    return f"--{name}={value}"


@dataclasses.dataclass(frozen=True)
class Command:
    """What the agent executes: ``python -m module *argv`` with ``env`` added to the
    agent's own environment (built by the agent, never taken from the caller)."""
    module: str
    argv: tuple
    env: tuple = ()
    estimator: bool = False      # runs under the agent's TF 2.15 interpreter


def _tf_server(args: cpb.TfServerArgs, paths: PathPolicy) -> Command:
    cluster = _cluster("tf_server.cluster", args.cluster, ("ps", "worker", "chief"))
    if args.job not in ("ps", "worker"):
        raise InvalidRequest(f"tf_server.job must be ps or worker, got {_show(args.job)}")
    if not 0 <= args.index < len(cluster[args.job]):
        raise InvalidRequest(f"tf_server.index {args.index} is not a {args.job} of the cluster")
    argv = [_flag("cluster", json.dumps(cluster)), _flag("job", args.job),
            _flag("index", args.index)]
    if args.standby_file:
        argv.append(_flag("standby_file", paths.check("tf_server.standby_file",
                                                      args.standby_file)))
    return Command("antdt_tf.tf.server", tuple(argv))


def _chief(args: cpb.ChiefArgs, paths: PathPolicy, keras: bool) -> Command:
    argv = [_flag("master", _address("chief.master", args.master)),
            _flag("dataset", _name("chief.dataset", args.dataset)),
            _flag("batch_size", _positive("chief.batch_size", args.batch_size)),
            _flag("buckets", _positive("chief.buckets", args.buckets)),
            _flag("learning_rate", _positive("chief.learning_rate", args.learning_rate)),
            _flag("checkpoint_every_seconds",
                  _positive("chief.checkpoint_every_seconds", args.checkpoint_every_seconds,
                            allow_zero=True))]
    for field in ("report_json", "checkpoint_dir"):
        if getattr(args, field):
            argv.append(_flag(field, paths.check(f"chief.{field}", getattr(args, field))))
    if args.eval_data:
        argv.append(_flag("eval_data", paths.check("chief.eval_data", args.eval_data,
                                                   read_only=True)))
    if args.audit:
        argv.append("--audit")
    if keras:
        return Command("antdt_tf.tf.keras_trainer", tuple(argv))
    if args.data_path not in ("", "pull", "closure"):
        raise InvalidRequest(f"chief.data_path must be pull or closure, got "
                             f"{_show(args.data_path)}")
    if args.mode not in ("", "async", "bsp"):
        raise InvalidRequest(f"chief.mode must be async or bsp, got {_show(args.mode)}")
    if args.data_path:
        argv.append(_flag("data_path", args.data_path))
    if args.mode:
        argv.append(_flag("mode", args.mode))
    if args.checkpoint_every_shards:
        argv.append(_flag("checkpoint_every_shards",
                          _positive("chief.checkpoint_every_shards",
                                    args.checkpoint_every_shards)))
    if args.worker_slots:
        argv.append(_flag("worker_slots", _positive("chief.worker_slots", args.worker_slots)))
    if args.tensorboard_dir:
        argv.append(_flag("tensorboard_dir", paths.check("chief.tensorboard_dir",
                                                         args.tensorboard_dir)))
    return Command("antdt_tf.tf.coordinator", tuple(argv))


def _tf1_trainer(args: cpb.Tf1TrainerArgs, paths: PathPolicy, estimator: bool) -> Command:
    cluster = _cluster("tf1_trainer.cluster", args.cluster, ("ps", "worker"))
    job = args.job or "worker"
    if job not in ("worker", "ps") or (job == "ps" and not estimator):
        raise InvalidRequest(f"tf1_trainer.job must be worker{' or ps' if estimator else ''}, "
                             f"got {_show(args.job)}")
    if not 0 <= args.task_index < len(cluster[job]):
        raise InvalidRequest(f"tf1_trainer.task_index {args.task_index} is not a {job} of "
                             "the cluster")
    if not args.data:
        raise InvalidRequest("tf1_trainer.data is required")
    argv = [_flag("master", _address("tf1_trainer.master", args.master)),
            _flag("dataset", _name("tf1_trainer.dataset", args.dataset)),
            _flag("data", paths.check("tf1_trainer.data", args.data, read_only=True)),
            _flag("register", args.register),
            _flag("batch_size", _positive("tf1_trainer.batch_size", args.batch_size)),
            _flag("buckets", _positive("tf1_trainer.buckets", args.buckets)),
            _flag("learning_rate", _positive("tf1_trainer.learning_rate", args.learning_rate)),
            _flag("save_secs", _positive("tf1_trainer.save_secs", args.save_secs))]
    checkpoint = paths.check("tf1_trainer.checkpoint_dir", args.checkpoint_dir)
    if args.report_json:
        argv.append(_flag("report_json", paths.check("tf1_trainer.report_json",
                                                     args.report_json)))
    if args.eval_data:
        argv.append(_flag("eval_data", paths.check("tf1_trainer.eval_data", args.eval_data,
                                                   read_only=True)))
    if args.standby_file:
        argv.append(_flag("standby_file", paths.check("tf1_trainer.standby_file",
                                                      args.standby_file)))
    if args.audit:
        argv.append("--audit")
    if not estimator:
        argv += [_flag("cluster", json.dumps(cluster)), _flag("task_index", args.task_index)]
        if checkpoint:
            argv.append(_flag("checkpoint_dir", checkpoint))
        return Command("estimator_examples.train_mts", tuple(argv))
    # tf.estimator reads its task from TF_CONFIG: worker 0 is its chief, worker i its
    # worker:i-1. The agent writes it (and the path to this source tree, which the TF
    # 2.15 interpreter runs) itself.
    if checkpoint:
        argv.append(_flag("model_dir", checkpoint))
    workers = cluster["worker"]
    i = args.task_index
    task = ({"type": "ps", "index": i} if job == "ps" else
            {"type": "chief", "index": 0} if i == 0 else {"type": "worker", "index": i - 1})
    tf_config = {"cluster": {"chief": workers[:1], "worker": workers[1:], "ps": cluster["ps"]},
                 "task": task}
    return Command("estimator_examples.train_estimator", tuple(argv),
                   env=(("TF_CONFIG", json.dumps(tf_config)),
                        ("PYTHONPATH", str(SOURCE_ROOT))), estimator=True)


def _probe(args: cpb.ProbeTaskArgs, paths: PathPolicy, bind_host: str = "") -> Command:
    endpoint = _address("probe.endpoint", args.endpoint, required=False)
    if endpoint and bind_host:
        endpoint = f"{bind_host}:{endpoint.rsplit(':', 1)[1]}"
    argv = [_flag("endpoint", endpoint)]
    if args.name:
        if len(args.name) > 128 or "\0" in args.name:
            raise InvalidRequest("probe.name must be at most 128 characters")
        argv.append(_flag("name", args.name))
    if args.HasField("exit_after_seconds"):
        argv.append(_flag("exit_after_seconds", _positive(
            "probe.exit_after_seconds", args.exit_after_seconds, allow_zero=True)))
    if not 0 <= args.exit_code <= 255:
        raise InvalidRequest(f"probe.exit_code must be in [0, 255], got {args.exit_code}")
    argv.append(_flag("exit_code", args.exit_code))
    if args.allocate_mb:
        argv.append(_flag("allocate_mb", _positive("probe.allocate_mb", args.allocate_mb)))
    return Command("antdt_tf.agent.probe_task", tuple(argv))


# antdt-tf's own trainers and example programs, run from the installed package (no
# program root needed: they are antdt-tf's code, as trusted as the agent itself)
BUILTIN_PROGRAMS = ("antdt_tf.tf.coordinator", "antdt_tf.tf.keras_trainer",
                    "estimator_examples.train_mts", "estimator_examples.train_estimator",
                    "keras_examples.ranker")
PROGRAM_MODULE = re.compile(
    r"[A-Za-z_]\w{0,63}(?:\.[A-Za-z_]\w{0,63}){0,15}(?::[A-Za-z_]\w{0,63})?\Z")
_ROLES = {"custom_loop": ("chief",), "keras": ("chief",), "mts": ("worker",),
          "estimator": ("worker", "ps")}


def module_file(code_dir: str, module: str) -> str:
    """Where ``module`` lives under ``code_dir``: its ``.py`` file, or its package's
    ``__main__.py`` / ``__init__.py``."""
    base = os.path.join(code_dir, *module.split("."))
    for candidate in (base + ".py", os.path.join(base, "__main__.py"),
                      os.path.join(base, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return ""


def _program_spec(args: cpb.UserProgramArgs, paths: PathPolicy) -> tuple[str, tuple]:
    """The program to run (a checked file path, or a module) and its import path."""
    program = args.program
    if program.endswith(".py"):
        if args.code_dir:
            raise InvalidRequest("user_program.code_dir goes with a module program, not a "
                                 f"file ({_show(program)} runs from its own directory)")
        path = paths.program("user_program.program", program)
        if not os.path.isfile(path):
            raise InvalidRequest(f"user_program.program {_show(program)} is not a file")
        return path, ()
    if not PROGRAM_MODULE.match(program):
        raise InvalidRequest(f"user_program.program must be /abs/path/file.py or "
                             f"pkg.module[:function], got {_show(program)}")
    module = program.partition(":")[0]
    if not args.code_dir:
        if module not in BUILTIN_PROGRAMS:
            raise InvalidRequest(f"user_program.program {_show(program)} needs its "
                                 "code_dir (the directory its package is in), or is one of "
                                 f"antdt-tf's own: {', '.join(BUILTIN_PROGRAMS)}")
        return program, ()
    code_dir = paths.program("user_program.code_dir", args.code_dir)
    found = module_file(code_dir, module)
    if not found:
        raise InvalidRequest(f"user_program.program: module {_show(module)} is not in "
                             f"code_dir {_show(code_dir)}")
    paths.program("user_program.program", found)   # a symlink out of the roots is refused
    return program, (code_dir,)


def _user_program(args: cpb.UserProgramArgs, paths: PathPolicy, generation: int) -> Command:
    from antdt_tf import program as contract

    if args.api not in _ROLES:
        raise InvalidRequest(f"user_program.api must be one of {tuple(_ROLES)}, got "
                             f"{_show(args.api)}")
    if args.role not in _ROLES[args.api]:
        raise InvalidRequest(f"user_program.role must be one of {_ROLES[args.api]} for "
                             f"api={args.api}, got {_show(args.role)}")
    if len(args.argv) > 1000 or any(len(a) > _MAX_TEXT for a in args.argv):
        raise InvalidRequest("user_program.argv: at most 1000 arguments of at most "
                             f"{_MAX_TEXT} characters")
    program, import_path = _program_spec(args, paths)
    jobs = ("chief", "ps", "worker") if args.api in ("custom_loop", "keras") else ("ps", "worker")
    cluster = _cluster("user_program.cluster", args.cluster, jobs)
    if args.api in ("custom_loop", "keras") and len(cluster.get("chief", ())) != 1:
        raise InvalidRequest("user_program.cluster needs one chief address")
    if not 0 <= args.index < len(cluster["worker" if args.role == "worker" else args.role]):
        raise InvalidRequest(f"user_program.index {args.index} is not a {args.role} of the "
                             "cluster")
    if args.api == "estimator":     # Estimator's own roles: worker 0 is its chief
        workers = cluster["worker"]
        task = ({"type": "ps", "index": args.index} if args.role == "ps" else
                {"type": "chief", "index": 0} if args.index == 0 else
                {"type": "worker", "index": args.index - 1})
        cluster = {"chief": workers[:1], "worker": workers[1:], "ps": cluster["ps"]}
    else:
        task = {"type": args.role, "index": args.index}
    ctx = contract.Context(
        master=_address("user_program.master", args.master),
        dataset=_name("user_program.dataset", args.dataset),
        checkpoint_dir=paths.check("user_program.checkpoint_dir", args.checkpoint_dir),
        checkpoint_every_seconds=_positive("user_program.checkpoint_every_seconds",
                                           args.checkpoint_every_seconds, allow_zero=True),
        report_json=paths.check("user_program.report_json", args.report_json),
        api=args.api, role=args.role, index=args.index, generation=generation,
        worker_slots=args.worker_slots, audit=args.audit,
        tf_config={"cluster": cluster, "task": task})
    env = contract.environment(ctx)
    if args.standby_file:
        env[contract.STANDBY_FILE_ENV] = paths.check("user_program.standby_file",
                                                     args.standby_file)
        env[contract.STANDBY_ADDRESS_ENV] = cluster[task["type"]][task["index"]]
    python_path = [*import_path]
    if args.api == "estimator":     # the TF 2.15 interpreter runs this source tree too
        python_path.append(str(SOURCE_ROOT))
    if python_path:
        env["PYTHONPATH"] = os.pathsep.join(python_path)
    return Command("antdt_tf.program_main", (program, *args.argv),
                   env=tuple(sorted(env.items())), estimator=args.api == "estimator")


# program -> (the oneof field its arguments go in, how its command line is built)
@dataclasses.dataclass(frozen=True)
class _Start:
    """What a builder may need besides the program's arguments."""
    paths: PathPolicy
    bind_host: str = ""
    generation: int = 0


_BUILDERS: dict[int, tuple[str, Callable]] = {
    cpb.TF_SERVER: ("tf_server", lambda a, s: _tf_server(a, s.paths)),
    cpb.PSS_CHIEF: ("chief", lambda a, s: _chief(a, s.paths, keras=False)),
    cpb.KERAS_CHIEF: ("chief", lambda a, s: _chief(a, s.paths, keras=True)),
    cpb.MTS_TRAINER: ("tf1_trainer", lambda a, s: _tf1_trainer(a, s.paths, estimator=False)),
    cpb.ESTIMATOR_TRAINER: ("tf1_trainer",
                            lambda a, s: _tf1_trainer(a, s.paths, estimator=True)),
    cpb.PROBE_TASK: ("probe", lambda a, s: _probe(a, s.paths, s.bind_host)),
    cpb.USER_PROGRAM: ("user_program", lambda a, s: _user_program(a, s.paths, s.generation)),
}
PROGRAM_NAMES = tuple(cpb.Program.Name(p) for p in _BUILDERS)


def command_for(req: cpb.StartTaskRequest, paths: PathPolicy, bind_host: str = "") -> Command:
    """The command line of a start request, or InvalidRequest saying what is wrong.

    ``bind_host``: where a task that serves a port binds when that is not the host of its
    advertised endpoint -- a pod binds its own IP (Kubernetes expands ``$(ANTDT_POD_IP)``
    in a container's args), not the Service name it is reached by. Every backend builds
    its command here, so this is the one place a task's start-up is written."""
    entry = _BUILDERS.get(req.program)
    if entry is None:
        raise InvalidRequest(f"unknown program {req.program}; an agent runs only "
                             f"{', '.join(PROGRAM_NAMES)}")
    field, build = entry
    given = req.WhichOneof("args")
    if given != field:
        raise InvalidRequest(f"{cpb.Program.Name(req.program)} takes its arguments in "
                             f"'{field}', got {given or 'none'}")
    command = build(getattr(req, field), _Start(paths, bind_host, req.generation))
    if any("\0" in a or len(a) > 1_000_000 for a in command.argv):
        raise InvalidRequest("an argument is not usable (NUL byte or over 1 MB)")
    return command
