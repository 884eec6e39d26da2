"""RayBackend: a job's tasks as Ray actors on the nodes of a Ray cluster.

Every TF task (PS, worker, chief) is one **detached, named actor** in the job's
namespace (``antdt:<job>:<index>:g<generation>``), pinned to one node
(``NodeAffinitySchedulingStrategy(soft=False)``) and started with ``max_restarts=0``:
antdt-tf's Controller decides about restarts, never Ray. The actor supervises the TF
process as its child (the agent's :class:`~antdt_tf.agent.supervisor.TaskSupervisor`,
the same typed ``StartTask`` and path rules), so a kill, a throttle and the exit code
reach exactly that process. Detached, because the actors must outlive the master that
created them: a restarted master lists them by name and adopts them.

Hosts are the cluster's alive nodes, named by their ``antdt-host`` label
(``ray start --labels='{"antdt-host": "h1"}'``), else ``node-<id prefix>``. A move
("any node but this one") is a launch pinned to the node ``ClusterBackend.place``
picked with that node avoided. Endpoints are the node's address and a port of
``task_ports``, a range outside Ray's own ports (its workers use 10002-19999 unless
``--min/max-worker-port`` say otherwise; its other servers use ephemeral ports).

Node loss: the actor's death says why. ``ActorDiedError`` because its node died (the
GCS missed the raylet's health checks) is ``HOST_LOST``; a dead actor process is
``KILLED``. An actor whose raylet vanished kills its TF process and leaves at once (a
raylet SIGKILLed does not take its worker processes along; a TF worker still applying
updates after its host was declared lost would apply them twice).

Ray's settings that matter (set them explicitly; docs/ray.md):

- the address a node advertises: ``ray start --node-ip-address=<the host's cluster
  address>`` (tests: 127.0.0.1; never a machine's LAN address by accident);
- authentication: ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` on every node and
  driver (``ray_settings.RAY_ENV``);
- no dashboard (``--include-dashboard=false``), no usage stats;
- how fast a dead node is noticed: ``RAY_health_check_*`` (``ray_settings.FAST_HEALTH_CHECKS``).

Ray pickles its own calls; what antdt-tf sends through them is typed (serialized
``antdt.v1`` messages), as on every other path.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import random
import threading
import time
from typing import Optional

from antdt_tf.backends.ray_settings import DEFAULT_TASK_PORTS, HOST_LABEL, RAY_ENV

for _k, _v in RAY_ENV.items():     # before Ray's import (ray_settings says why)
    os.environ.setdefault(_k, _v)

import ray  # noqa: E402 (after its settings)

from antdt_tf.agent.client import start_request
from antdt_tf.backends.agents import task_info
from antdt_tf.backends.base import (Capabilities, ClusterBackend, Failure, FailureKind, Host,
                                    TaskInfo, TaskName, TaskSpec, TaskState, admit_launch,
                                    latest, refuse_fenced_stop, refuse_unknown_stop)
from antdt_tf.errors import AntdtError, UnknownTask, Unschedulable
from antdt_tf.proto import cluster_pb2 as cpb

log = logging.getLogger(__name__)

ACTOR_PREFIX = "antdt:"
# the job's own secrets a task process needs (its token, its TLS files): the only
# environment an actor is given
JOB_ENV = ("ANTDT_JOB_TOKEN", "ANTDT_TLS_CERT", "ANTDT_TLS_KEY", "ANTDT_TLS_CA",
           "ANTDT_TLS_SERVER_NAME")
# what a Ray worker process has in its environment that a Ray driver started from it
# must not inherit (it would take itself for that worker)
_RAY_WORKER_ENV = ("RAY_JOB_ID", "RAY_RAYLET_PID", "RAY_CLIENT_MODE",
                   "RAY_LD_PRELOAD_ON_WORKERS")


def actor_name(name: TaskName) -> str:
    return f"{ACTOR_PREFIX}{name.job}:{name.index}:g{name.generation}"


def task_name_of(actor: str) -> Optional[TaskName]:
    """The task an actor name stands for (None: not a task actor of ours)."""
    if not actor.startswith(ACTOR_PREFIX):
        return None
    try:
        job, index, gen = actor[len(ACTOR_PREFIX):].split(":")
        return TaskName(job, int(index), int(gen.lstrip("g")))
    except ValueError:
        return None


def driver_env(gcs_address: str) -> dict:
    """This (Ray worker) process's environment for a child that connects to the cluster
    as a driver of its own."""
    env = {k: v for k, v in os.environ.items() if k not in _RAY_WORKER_ENV}
    env["RAY_ADDRESS"] = gcs_address
    return env


def connect(address: str = "auto", namespace: str = "") -> bool:
    """Joins the Ray cluster at ``address`` as a driver (no-op when this process already
    is one); True when this call connected."""
    if ray.is_initialized():
        return False
    if os.environ.get("RAY_AUTH_MODE") == "token" and not os.environ.get("RAY_AUTH_TOKEN") \
            and not os.environ.get("RAY_AUTH_TOKEN_PATH") \
            and not os.path.exists(os.path.expanduser("~/.ray/auth_token")):
        raise Unschedulable("the Ray cluster's token is not set: export RAY_AUTH_TOKEN "
                            "(or RAY_AUTH_TOKEN_PATH) as on every node (docs/ray.md)")
    try:
        ray.init(address=address or "auto", namespace=namespace or None,
                 log_to_driver=False, logging_level=logging.WARNING, include_dashboard=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise Unschedulable(f"cannot join the Ray cluster at {address or 'auto'}: {e}") from e
    return True


def watch_raylet(on_gone) -> None:
    """Calls ``on_gone`` and leaves once this worker's raylet (its parent) is gone."""
    raylet = os.getppid()

    def watch():
        while os.getppid() == raylet:
            time.sleep(0.2)
        try:
            on_gone()
        finally:
            os._exit(1)
    threading.Thread(target=watch, name="antdt-raylet-watch", daemon=True).start()


class TaskActor:
    """One TF task of a job, inside a detached Ray actor on its node."""

    def __init__(self, job_env: dict, log_dir: str, job_roots: tuple, read_roots: tuple,
                 estimator_python: str = "", program_roots: tuple = ()):
        from antdt_tf.agent.programs import PathPolicy
        from antdt_tf.agent.supervisor import TaskSupervisor

        unknown = set(job_env) - set(JOB_ENV)
        if unknown:
            raise ValueError(f"a task actor takes only the job's {JOB_ENV}, not {unknown}")
        os.environ.update(job_env)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.supervisor = TaskSupervisor(
            log_dir, estimator_python=estimator_python,
            paths=PathPolicy(tuple(job_roots) or (log_dir,), tuple(read_roots),
                             tuple(program_roots)))
        # children are forked from this one long-lived thread: their parent-death signal
        # follows the thread that forked them
        self._spawner = concurrent.futures.ThreadPoolExecutor(1, "antdt-spawn")
        watch_raylet(self.supervisor.kill_all)

    def start(self, request: bytes) -> tuple[bytes, str]:
        req = cpb.StartTaskRequest.FromString(request)
        status = self._spawner.submit(self.supervisor.start, req).result()
        return status.SerializeToString(), self.node_id

    def stop(self, request: bytes) -> tuple[bytes, str]:
        status = self.supervisor.stop(cpb.StopTaskRequest.FromString(request))
        return status.SerializeToString(), self.node_id

    def throttle(self, request: bytes) -> tuple[bytes, str]:
        status = self.supervisor.throttle(cpb.ThrottleTaskRequest.FromString(request))
        return status.SerializeToString(), self.node_id

    def status(self) -> tuple[bytes, str]:
        tasks = self.supervisor.list()
        return (tasks[0].SerializeToString() if tasks else b""), self.node_id


_remote_classes: dict = {}


def remote_class(cls):
    """``cls`` as a Ray actor class (made once per process)."""
    if cls not in _remote_classes:
        _remote_classes[cls] = ray.remote(cls)
    return _remote_classes[cls]


def pinned(node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


@dataclasses.dataclass
class _Node:
    node_id: str
    name: str
    address: str
    alive: bool


class RayBackend(ClusterBackend):
    """The tasks of one job (one Ray namespace) on a Ray cluster."""

    capabilities = Capabilities(stable_endpoints=False, host_pinning=True,
                                fault_injection=True)

    def __init__(self, namespace: str, address: str = "auto", log_dir: str = "",
                 job_roots: tuple = (), read_roots: tuple = (), estimator_python: str = "",
                 task_ports: tuple = DEFAULT_TASK_PORTS, call_timeout: float = 60.0,
                 status_timeout: float = 2.0, job_env: Optional[dict] = None,
                 program_roots: tuple = ()):
        """``namespace``: the job's Ray namespace (its actors' names live there; a new
        backend on the same namespace adopts them); ``log_dir``: where each host's task
        logs go (``log_dir/<host>/<job><index>.log``); ``job_roots``/``read_roots``: where
        tasks may write / read (the agent's path rules); ``program_roots``: where the
        job's own program may run from (a path every node sees); ``job_env``: the job's token and
        TLS files for the task processes (default: this process's, :data:`JOB_ENV`)."""
        if not namespace:
            raise ValueError("RayBackend needs the job's namespace")
        first, last = task_ports
        if not 1024 <= first <= last <= 65535:
            raise ValueError(f"task ports must be a range within 1024-65535, got {task_ports}")
        self._owns_connection = connect(address, namespace)
        if ray.get_runtime_context().namespace != namespace:
            raise ValueError(f"this process is a Ray driver in namespace "
                             f"{ray.get_runtime_context().namespace!r}, not the job's "
                             f"{namespace!r}")
        self.namespace = namespace
        self.log_dir = log_dir or os.path.join(os.getcwd(), "ray-tasks")
        self.job_roots = tuple(str(r) for r in job_roots) or (self.log_dir,)
        self.read_roots = tuple(str(r) for r in read_roots)
        self.estimator_python = estimator_python
        self.program_roots = tuple(str(r) for r in program_roots)
        self.task_ports = (first, last)
        self.call_timeout, self.status_timeout = call_timeout, status_timeout
        self.job_env = dict(job_env) if job_env is not None else {
            k: os.environ[k] for k in JOB_ENV if os.environ.get(k)}
        self._lock = threading.RLock()
        self._nodes: dict[str, _Node] = {}             # node id -> node (dead ones too)
        self._actors: dict[TaskName, object] = {}      # live actor handles
        self._last: dict[TaskName, TaskInfo] = {}      # every launch's latest info
        self._ended: set[TaskName] = set()             # launches whose actor is gone
        self._endpoints: dict[tuple[str, int], tuple[str, str]] = {}  # task -> (host, addr)

    # ------------------------------------------------------------------ hosts

    def _refresh_nodes(self) -> dict[str, _Node]:
        nodes = {}
        for n in ray.nodes():
            labels = n.get("Labels") or {}
            nodes[n["NodeID"]] = _Node(n["NodeID"], labels.get(HOST_LABEL)
                                       or f"node-{n['NodeID'][:8]}",
                                       n["NodeManagerAddress"], bool(n["Alive"]))
        with self._lock:
            self._nodes.update(nodes)
            return dict(self._nodes)

    def hosts(self) -> list[Host]:
        first, last = self.task_ports
        return sorted((Host(n.name, n.address, first, last) for n in
                       self._refresh_nodes().values() if n.alive), key=lambda h: h.name)

    def _node(self, host: str) -> _Node:
        for n in self._refresh_nodes().values():
            if n.name == host and n.alive:
                return n
        raise Unschedulable(f"host {host!r} is not a live node of the Ray cluster (live: "
                            f"{[h.name for h in self.hosts()]})")

    def _host_of(self, node_id: str) -> str:
        with self._lock:
            node = self._nodes.get(node_id)
        if node is None:
            node = self._refresh_nodes().get(node_id)
        return node.name if node is not None else f"node-{node_id[:8]}"

    def endpoint(self, job: str, index: int, host: str) -> str:
        """The task's address on ``host``: the same as before when it was there before,
        else a port of ``task_ports`` no other task of the job has at that address."""
        node = self._node(host)
        with self._lock:
            before = self._endpoints.get((job, index))
            if before is None:         # a restarted master: the task's newest launch
                launches = sorted((n.generation, i.host, i.endpoint)
                                  for n, i in self._last.items()
                                  if n.key == (job, index) and i.endpoint)
                if launches:
                    before = self._endpoints[job, index] = launches[-1][1:]
            if before is not None and before[0] == host:
                return before[1]
            used = {int(e.rsplit(":", 1)[1]) for _, e in self._endpoints.values()
                    if e.rsplit(":", 1)[0] == node.address}
            used |= {int(i.endpoint.rsplit(":", 1)[1]) for i in self._last.values()
                     if i.endpoint and i.endpoint.rsplit(":", 1)[0] == node.address}
            free = [p for p in range(self.task_ports[0], self.task_ports[1] + 1)
                    if p not in used]
            if not free:
                raise Unschedulable(f"no free task port on {host} ({node.address}, ports "
                                    f"{self.task_ports[0]}-{self.task_ports[1]})")
            # random, not the lowest: a port a crashed task could not bind is not retried
            address = f"{node.address}:{random.choice(free[:512])}"
            self._endpoints[job, index] = (host, address)
            return address

    # ------------------------------------------------------------------ tasks

    def _info(self, name: TaskName, raw: bytes, node_id: str) -> TaskInfo:
        host = self._host_of(node_id)
        if not raw:                # the actor runs but never started its task
            return TaskInfo(name, host, TaskState.FAILED,
                            Failure(FailureKind.EXITED, 0, "never started"))
        return task_info(host, cpb.TaskStatus.FromString(raw), name)

    def _actor_gone(self, name: TaskName, error: Exception) -> None:
        """The actor of ``name`` died: its task ended with it (HOST_LOST when its node
        died, KILLED otherwise), unless it had ended before."""
        with self._lock:
            self._actors.pop(name, None)
            self._ended.add(name)
            old = self._last.get(name)
            if old is not None and not old.running:
                return
            text = str(error)
            node_died = "node has died" in text or (
                old is not None and not any(n.alive and n.name == old.host
                                            for n in self._nodes.values()))
            failure = (Failure(FailureKind.HOST_LOST, 0, f"host {old.host if old else '?'}")
                       if node_died else
                       Failure(FailureKind.KILLED, -9, "its Ray actor died: "
                               + _cause(text)))
            base = old or TaskInfo(name, "?", TaskState.FAILED)
            self._last[name] = dataclasses.replace(base, state=TaskState.FAILED,
                                                   failure=failure, ended_unix=time.time())

    def _discover(self) -> None:
        """Adopts the job's task actors this object has not seen (a restarted master)."""
        try:
            names = ray.util.list_named_actors()
        except Exception as e:  # noqa: BLE001 (the GCS unreachable: keep what we know)
            log.warning("cannot list the job's actors: %s", e)
            return
        for actor in names:
            name = task_name_of(actor)
            with self._lock:
                if name is None or name in self._actors or name in self._ended:
                    continue
            try:
                handle = ray.get_actor(actor, namespace=self.namespace)
            except ValueError:
                continue          # gone meanwhile
            with self._lock:
                self._actors.setdefault(name, handle)

    def tasks(self) -> dict[tuple[str, int], TaskInfo]:
        self._refresh_nodes()
        self._discover()
        with self._lock:
            handles = dict(self._actors)
        refs = {name: h.status.remote() for name, h in handles.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs),
                            timeout=self.status_timeout) if refs else ([], [])
        ready = set(ready)
        for name, ref in refs.items():
            if ref not in ready:
                continue         # not answering now: its node's fate decides
            try:
                raw, node_id = ray.get(ref)
            except (ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError) as e:
                if isinstance(e, ray.exceptions.ActorDiedError):
                    self._actor_gone(name, e)
                continue
            with self._lock:
                self._last[name] = self._info(name, raw, node_id)
        with self._lock:
            live_hosts = {n.name for n in self._nodes.values() if n.alive}
            for name, info in list(self._last.items()):
                if info.running and info.host not in live_hosts:
                    # its node is dead while its actor has not been declared dead yet
                    self._actor_gone(name, RuntimeError("node has died"))
            return latest(list(self._last.values()))

    def launch_info(self, name: TaskName) -> Optional[TaskInfo]:
        with self._lock:
            return self._last.get(name)

    def launches_by_task(self) -> dict[tuple[str, int], list[TaskInfo]]:
        """Every launch known, by task (an older generation may run beside a standby)."""
        self.tasks()
        with self._lock:
            out: dict[tuple[str, int], list[TaskInfo]] = {}
            for name, info in self._last.items():
                if name in self._actors or info.running:
                    out.setdefault(name.key, []).append(info)
            return out

    def launch(self, spec: TaskSpec, host: str, allow_overlap: bool = False) -> TaskInfo:
        key = spec.name.key
        same = admit_launch(self.tasks().get(key), spec, host, allow_overlap)
        if same is not None:
            return same               # idempotent: the same launch
        node = self._node(host)
        self._release_ended(key)
        actor = remote_class(TaskActor).options(
            name=actor_name(spec.name), namespace=self.namespace, lifetime="detached",
            get_if_exists=True, num_cpus=0, max_restarts=0, max_task_retries=0,
            max_concurrency=8, scheduling_strategy=pinned(node.node_id),
        ).remote(self.job_env, os.path.join(self.log_dir, host), self.job_roots,
                 self.read_roots, self.estimator_python, self.program_roots)
        request = start_request(spec.name.job, spec.name.index, spec.program, spec.args,
                                spec.name.generation, spec.endpoint, spec.memory_limit_bytes)
        try:
            raw, node_id = ray.get(actor.start.remote(request.SerializeToString()),
                                   timeout=self.call_timeout)
        except ray.exceptions.GetTimeoutError as e:
            ray.kill(actor)
            raise Unschedulable(f"{spec.name}: its actor did not start on {host} within "
                                f"{self.call_timeout:g} s") from e
        except ray.exceptions.ActorDiedError as e:
            raise Unschedulable(f"{spec.name}: its actor died on {host}: "
                                f"{_cause(str(e))}") from e
        except ray.exceptions.RayTaskError as e:
            ray.kill(actor)     # refused (a bad request): the actor holds nothing
            raise e.as_instanceof_cause() if isinstance(e.cause, AntdtError) else e
        info = self._info(spec.name, raw, node_id)
        with self._lock:
            self._actors[spec.name] = actor
            self._last[spec.name] = info
        return info

    def _release_ended(self, key: tuple[str, int]) -> None:
        """Lets go of the actors of the task's older launches that ended (they hold
        nothing but their final status, which this object keeps)."""
        with self._lock:
            done = [(n, h) for n, h in self._actors.items()
                    if n.key == key and not self._last.get(n, _RUNNING).running]
            for name, _ in done:
                self._actors.pop(name)
                self._ended.add(name)
        for _, handle in done:
            ray.kill(handle)

    def _handle(self, name: TaskName):
        with self._lock:
            handle = self._actors.get(name)
            info = self._last.get(name)
        if handle is None and info is None:
            newest = self.tasks().get(name.key)
            with self._lock:
                handle, info = self._actors.get(name), self._last.get(name)
            if handle is None and info is None:
                refuse_unknown_stop(name, newest, f"no actor runs {name}")
        if info is not None:
            with self._lock:
                launches = dict(self._last)
            refuse_fenced_stop(name, info, launches)
        return handle, info

    def stop(self, name: TaskName, kill: bool = False, grace_seconds: float = 10.0) -> TaskInfo:
        handle, info = self._handle(name)
        if handle is None:
            return info               # its actor is gone: so is its task
        request = cpb.StopTaskRequest(task=cpb.TaskRef(job=name.job, index=name.index),
                                      kill=kill, grace_seconds=grace_seconds,
                                      generation=name.generation)
        try:
            raw, node_id = ray.get(handle.stop.remote(request.SerializeToString()),
                                   timeout=grace_seconds + self.call_timeout)
        except (ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError,
                ray.exceptions.GetTimeoutError) as e:
            self._actor_gone(name, e)
            with self._lock:
                return self._last[name]
        info = self._info(name, raw, node_id)
        with self._lock:
            self._last[name] = info
            self._actors.pop(name, None)
            self._ended.add(name)
        ray.kill(handle)             # the task ended: its actor's work is done
        return info

    def slow_down(self, name: TaskName, factor: float, duration_seconds: float = 0.0) -> TaskInfo:
        handle, _ = self._handle(name)
        if handle is None:
            raise UnknownTask(f"{name} does not run")
        request = cpb.ThrottleTaskRequest(task=cpb.TaskRef(job=name.job, index=name.index),
                                          slowdown=factor, duration_seconds=duration_seconds)
        try:
            raw, node_id = ray.get(handle.throttle.remote(request.SerializeToString()),
                                   timeout=self.call_timeout)
        except ray.exceptions.RayTaskError as e:
            raise e.as_instanceof_cause() if isinstance(e.cause, AntdtError) else e
        info = self._info(name, raw, node_id)
        with self._lock:
            self._last[name] = info
        return info

    def release_all(self) -> None:
        """Kills every actor of the job (its tasks die with them): the end of a job."""
        self._discover()
        with self._lock:
            handles = list(self._actors.items())
            self._actors.clear()
        for name, handle in handles:
            self._ended.add(name)
            ray.kill(handle)

    def close(self) -> None:
        if self._owns_connection and ray.is_initialized():
            ray.shutdown()


_RUNNING = TaskInfo(TaskName("worker", 0), "", TaskState.RUNNING)


def _cause(text: str) -> str:
    """The line of a Ray death message that says why."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    why = [ln for ln in lines if ln.startswith("The actor is dead because")
           or ln.startswith("The actor died because")]
    return (why or lines[-1:] or ["unknown"])[0][:300]
