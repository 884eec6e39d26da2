"""TaskSupervisor: the processes one agent owns, and what happened to them.

Pure process management (no gRPC, no TensorFlow): start a known program for a task,
stop or kill it by its process group, throttle it, and describe every task as a
``TaskStatus``. Each task runs in its own session (process group), so a kill reaches
exactly the processes this agent started and nothing else on the host.

Launches are numbered (``generation``) so that a controller that retries, or one that
restarted and lost track, never runs a task twice and never stops a newer launch:

    start(g) while g runs or after it ran -> that launch's status (idempotent)
    start(g) while an older one runs      -> TaskAlreadyRunning (stop it first)
    start(g) / stop(g) when the agent
             knows a newer generation     -> StaleGeneration (nothing changes)

A task may get a memory limit: when the RSS of its process tree passes it, the agent
kills the task and reports ``out_of_memory`` (what a container runtime's limit does).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from typing import Optional

import psutil

from antdt_tf.agent.programs import PathPolicy, command_for
from antdt_tf.agent.throttle import CpuThrottle
from antdt_tf.errors import (InvalidRequest, StaleGeneration, TaskAlreadyRunning,
                             UnknownTask)
from antdt_tf.procutil import child_env
from antdt_tf.proto import cluster_pb2 as cpb

JOBS = ("ps", "worker", "chief", "master")


@dataclasses.dataclass
class _Task:
    ref: tuple[str, int]
    proc: subprocess.Popen
    log_path: str
    starts: int
    started: float
    stopped_on_request: bool = False
    ended: float = 0.0
    throttle: Optional[CpuThrottle] = None
    throttle_timer: Optional[threading.Timer] = None
    cpu_seconds: float = 0.0
    rss_bytes: int = 0
    cpu_share: float = 0.0
    sampled: float = 0.0
    generation: int = 0
    endpoint: str = ""
    memory_limit: int = 0
    out_of_memory: bool = False


class TaskSupervisor:
    """Thread-safe. ``on_change(status)`` is called (from the polling thread) whenever a
    task exits, so exits are reported at once, not at the next periodic report."""

    def __init__(self, log_dir: str | os.PathLike, on_change=None, poll_seconds: float = 0.1,
                 estimator_python: str = "", paths: Optional[PathPolicy] = None):
        self.paths = paths or PathPolicy((os.path.abspath(log_dir),))
        self.estimator_python = estimator_python or sys.executable
        self.log_dir = pathlib.Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._tasks: dict[tuple[str, int], _Task] = {}
        self._lock = threading.Lock()
        self._on_change = on_change
        self._closed = threading.Event()
        self._poller = threading.Thread(target=self._poll, args=(poll_seconds,),
                                        name="agent-poll", daemon=True)
        self._poller.start()

    # ------------------------------------------------------------------ requests

    @staticmethod
    def _key(ref: cpb.TaskRef) -> tuple[str, int]:
        if ref.job not in JOBS:
            raise InvalidRequest(f"unknown job {ref.job!r}; expected one of {JOBS}")
        if ref.index < 0:
            raise InvalidRequest(f"task index must be >= 0, got {ref.index}")
        return ref.job, ref.index

    def _get(self, ref: cpb.TaskRef) -> _Task:
        key = self._key(ref)
        task = self._tasks.get(key)
        if task is None:
            raise UnknownTask(f"this agent never started {key[0]}:{key[1]}")
        return task

    def start(self, req: cpb.StartTaskRequest) -> cpb.TaskStatus:
        key = self._key(req.task)
        command = command_for(req, self.paths)   # typed: the agent writes every flag
        if req.generation < 0 or req.memory_limit_bytes < 0:
            raise InvalidRequest("generation and memory_limit_bytes must be >= 0")
        with self._lock:
            old = self._tasks.get(key)
            if old is not None and req.generation < old.generation:
                raise StaleGeneration(
                    f"{key[0]}:{key[1]} generation {req.generation} is older than the "
                    f"generation {old.generation} this agent knows; not started")
            if old is not None and req.generation == old.generation and req.generation > 0:
                return self._status(old)    # a retried launch: running, or it ran and ended
            if old is not None and old.proc.poll() is None:
                raise TaskAlreadyRunning(f"{key[0]}:{key[1]} is running (pid {old.proc.pid}, "
                                         f"generation {old.generation}); stop it before "
                                         "starting it again")
            log_path = self.log_dir / f"{key[0]}{key[1]}.log"
            # the agent's own environment (its token and TLS files among it), never the
            # caller's: a variable alone can make an interpreter run anything
            env = dict(os.environ, **dict(command.env))
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            program = cpb.Program.Name(req.program)
            with open(log_path, "ab") as log:
                log.write(f"\n=== start {time.strftime('%H:%M:%S')} generation "
                          f"{req.generation} {program} {' '.join(command.argv)}\n".encode())
                log.flush()
                python = self.estimator_python if command.estimator else sys.executable
                proc = subprocess.Popen([python, "-m", command.module, *command.argv],
                                        env=child_env(env),
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                        start_new_session=True)
            task = _Task(key, proc, str(log_path), (old.starts if old else 0) + 1, time.time(),
                         generation=req.generation, endpoint=req.endpoint,
                         memory_limit=req.memory_limit_bytes)
            self._tasks[key] = task
            return self._status(task)

    def stop(self, req: cpb.StopTaskRequest) -> cpb.TaskStatus:
        with self._lock:
            task = self._get(req.task)
            if req.generation > 0 and req.generation != task.generation:
                raise StaleGeneration(
                    f"stop of {task.ref[0]}:{task.ref[1]} generation {req.generation}, but "
                    f"this agent runs generation {task.generation}; nothing stopped")
            task.stopped_on_request = task.stopped_on_request or task.proc.poll() is None
        self._end_throttle(task)
        if task.proc.poll() is None:
            if req.kill:
                self._killpg(task, signal.SIGKILL)
            else:
                self._killpg(task, signal.SIGTERM)
                try:
                    task.proc.wait(req.grace_seconds or 10.0)
                except subprocess.TimeoutExpired:
                    self._killpg(task, signal.SIGKILL)
            task.proc.wait()
            task.ended = task.ended or time.time()
        with self._lock:
            return self._status(task)

    def throttle(self, req: cpb.ThrottleTaskRequest) -> cpb.TaskStatus:
        if not req.slowdown >= 1.0:   # also rejects NaN
            raise InvalidRequest(f"slowdown must be >= 1, got {req.slowdown}")
        if not req.duration_seconds >= 0:
            raise InvalidRequest(f"duration_seconds must be >= 0, got {req.duration_seconds}")
        with self._lock:
            task = self._get(req.task)
            if task.proc.poll() is not None:
                raise InvalidRequest(f"{task.ref[0]}:{task.ref[1]} is not running")
        self._end_throttle(task)
        if req.slowdown > 1.0:
            task.throttle = CpuThrottle(task.proc.pid, req.slowdown).start()
            if req.duration_seconds > 0:
                task.throttle_timer = threading.Timer(req.duration_seconds,
                                                      self._end_throttle, args=(task,))
                task.throttle_timer.daemon = True
                task.throttle_timer.start()
        with self._lock:
            return self._status(task)

    def list(self) -> list[cpb.TaskStatus]:
        with self._lock:
            return [self._status(t) for _, t in sorted(self._tasks.items())]

    def close(self) -> None:
        """Stops every task (SIGTERM, then SIGKILL after 5 s)."""
        self._closed.set()
        for task in list(self._tasks.values()):
            if task.proc.poll() is None:
                self.stop(cpb.StopTaskRequest(task=cpb.TaskRef(job=task.ref[0],
                                                               index=task.ref[1]),
                                              grace_seconds=5.0))

    def kill_all(self) -> None:
        """SIGKILLs every task's process group at once, waiting for nothing: for an owner
        that is about to vanish (a Ray actor whose node died), so no task outlives it."""
        for task in list(self._tasks.values()):
            if task.proc.poll() is None:
                self._killpg(task, signal.SIGKILL)

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _killpg(task: _Task, sig: int) -> None:
        try:
            os.killpg(task.proc.pid, sig)   # the task's own session: only what we started
        except ProcessLookupError:
            pass

    @staticmethod
    def _end_throttle(task: _Task) -> None:
        if task.throttle_timer is not None:
            task.throttle_timer.cancel()
            task.throttle_timer = None
        if task.throttle is not None:
            task.throttle.stop()
            task.throttle = None

    def _status(self, task: _Task) -> cpb.TaskStatus:
        code = task.proc.poll()
        if code is None:
            state = cpb.TaskStatus.RUNNING
        elif task.stopped_on_request:
            state = cpb.TaskStatus.STOPPED
        else:
            state = cpb.TaskStatus.EXITED
        return cpb.TaskStatus(
            task=cpb.TaskRef(job=task.ref[0], index=task.ref[1]), state=state,
            pid=task.proc.pid, exit_code=code or 0, starts=task.starts,
            cpu_seconds=task.cpu_seconds, rss_bytes=task.rss_bytes,
            slowdown=task.throttle.factor if task.throttle else 1.0,
            started_unix=task.started, ended_unix=task.ended, log_path=task.log_path,
            cpu_share=task.cpu_share, generation=task.generation, endpoint=task.endpoint,
            out_of_memory=task.out_of_memory)

    def _sample(self, task: _Task, now: float) -> None:
        try:
            p = psutil.Process(task.proc.pid)
            t = p.cpu_times()
            cpu = t.user + t.system + t.children_user + t.children_system
            task.rss_bytes = p.memory_info().rss + sum(
                c.memory_info().rss for c in p.children(recursive=True))
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            return
        if task.memory_limit and task.rss_bytes > task.memory_limit and not task.out_of_memory:
            task.out_of_memory = True       # reported once it has exited
            self._killpg(task, signal.SIGKILL)
        if task.sampled and now > task.sampled:
            task.cpu_share = max(0.0, (cpu - task.cpu_seconds) / (now - task.sampled))
        task.cpu_seconds, task.sampled = cpu, now

    def _poll(self, poll_seconds: float) -> None:
        last_sample = 0.0
        while not self._closed.wait(poll_seconds):
            changed = []
            now = time.time()
            sample = now - last_sample >= 1.0
            with self._lock:
                for task in self._tasks.values():
                    running = task.proc.poll() is None
                    if not running and not task.ended:
                        task.ended = now
                        self._end_throttle(task)
                        changed.append(self._status(task))
                    elif running and (sample or task.memory_limit):
                        # a limited task every poll: a fast allocation must not
                        # outrun a once-a-second sample
                        self._sample(task, now)
            if sample:
                last_sample = now
            for status in changed:
                if self._on_change is not None:
                    self._on_change(status)
