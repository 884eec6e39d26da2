"""AgentsBackend: tasks on hosts that each run an ``antdt-agent``.

Hosts come from a directory: the agents that report to the master (the rendezvous:
``antdt-agent --master=ADDR --advertise=HOST_ADDR`` on every host), or a fixed list of
agent addresses (the local backend's simulated hosts). Every call goes to the agent
that owns the task; task states come from the agents themselves, so a new backend over
the same hosts (a restarted master) sees what runs and launches nothing twice.

A host is lost when its agent has not answered (or, through the master, not reported)
for ``host_timeout`` seconds: every task it had is then FAILED with ``HOST_LOST`` (an
agent's tasks die with it, so a lost agent means lost tasks). A host whose agent comes
back (a new agent process) is live again, with no tasks.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from typing import Callable, Optional

from antdt_tf.agent.client import AgentClient
from antdt_tf.backends.base import (Capabilities, ClusterBackend, Failure, FailureKind, Host,
                                    TaskInfo, TaskName, TaskSpec, TaskState, admit_launch,
                                    classify_exit, latest)
from antdt_tf.errors import AntdtError, StaleGeneration, Unschedulable, UnknownTask
from antdt_tf.proto import cluster_pb2 as cpb

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class AgentRecord:
    """One host as the directory knows it."""
    host: Host
    agent_address: str
    heard_seconds_ago: float = 0.0    # the directory's own notion of freshness


def task_info(host: str, s: cpb.TaskStatus, name: Optional[TaskName] = None) -> TaskInfo:
    """A supervisor's ``TaskStatus`` (an agent's, a Ray task actor's) in the backend
    vocabulary."""
    name = name or TaskName(s.task.job, s.task.index, max(1, s.generation))
    if s.state == cpb.TaskStatus.RUNNING:
        state, failure = TaskState.RUNNING, None
    else:
        state, failure = classify_exit(s.exit_code, s.state == cpb.TaskStatus.STOPPED,
                                       s.out_of_memory)
    return TaskInfo(name, host, state, failure, s.endpoint, s.pid, s.started_unix,
                    s.ended_unix, s.log_path, s.cpu_seconds, s.rss_bytes, s.slowdown)


class StaticHosts:
    """A fixed list of agent addresses; each agent names its host (ListTasks)."""

    def __init__(self, agent_addresses: list[str]):
        self.addresses = list(agent_addresses)

    def agents(self, clients: Callable[[str], AgentClient]) -> list[AgentRecord]:
        out = []
        for address in self.addresses:
            try:
                r = clients(address).list(timeout=2.0)
            except AntdtError:
                continue         # not answering: the backend's timeout decides
            out.append(AgentRecord(Host(r.host, r.advertise, r.first_task_port,
                                        r.last_task_port, r.load_per_cpu), address))
        return out


class MasterRendezvous:
    """The agents that report to the master (``ClusterMonitor.ReportAgent``)."""

    def __init__(self, master):
        """``master``: the master's address, or a MonitorClient of it the caller owns (the
        job runner's, which calls its master in process)."""
        from antdt_tf.monitor.client import MonitorClient

        self._own = isinstance(master, str)
        self.monitor = MonitorClient(master) if self._own else master

    def agents(self, clients) -> list[AgentRecord]:
        status = self.monitor.status()
        return [AgentRecord(Host(a.host, a.advertise, a.first_task_port, a.last_task_port,
                                 a.load_per_cpu),
                            a.agent_address, max(0.0, status.unix_time - a.unix_time))
                for a in status.agents]

    def close(self) -> None:
        if self._own:
            self.monitor.close()


class AgentsBackend(ClusterBackend):
    capabilities = Capabilities(stable_endpoints=False, host_pinning=True,
                                fault_injection=True)

    def __init__(self, directory, host_timeout: float = 10.0, call_timeout: float = 30.0):
        self.directory = directory
        self.host_timeout = host_timeout
        self.call_timeout = call_timeout
        self._lock = threading.RLock()
        self._clients: dict[str, AgentClient] = {}
        self._agents: dict[str, AgentRecord] = {}      # live hosts by name
        self._last_heard: dict[str, float] = {}        # host -> monotonic time
        self._lost: dict[str, float] = {}              # host -> when it was declared lost
        self._known: dict[tuple[str, int], TaskInfo] = {}   # latest launch, per task
        self._launches: dict[TaskName, TaskInfo] = {}       # every launch an agent lists
        self._endpoints: dict[tuple[str, int], tuple[str, str]] = {}  # task -> (host, addr)
        self._refreshed = 0.0

    # ------------------------------------------------------------------ hosts

    def _client(self, address: str) -> AgentClient:
        with self._lock:
            c = self._clients.get(address)
            if c is None:
                c = self._clients[address] = AgentClient(address, timeout=self.call_timeout)
            return c

    def _refresh_hosts(self) -> None:
        now = time.monotonic()
        try:
            records = self.directory.agents(self._client)
        except AntdtError as e:       # the master is restarting: keep what we know
            log.warning("host directory unavailable: %s", e)
            records = None
        with self._lock:
            if records is not None:
                for r in records:
                    heard = now - r.heard_seconds_ago
                    old = self._agents.get(r.host.name)
                    if r.host.name in self._lost:
                        if old is not None and old.agent_address == r.agent_address:
                            continue       # the same (lost) agent's last report
                        del self._lost[r.host.name]    # a new agent: the host is back
                        log.info("host %s is back (agent %s)", r.host.name, r.agent_address)
                    self._agents[r.host.name] = r
                    self._last_heard[r.host.name] = max(self._last_heard.get(r.host.name, 0),
                                                        heard)
            for name in list(self._agents):
                if name in self._lost:
                    continue
                if now - self._last_heard.get(name, now) > self.host_timeout:
                    self._lost[name] = now
                    log.warning("host %s lost: no word from its agent for %.0f s", name,
                                self.host_timeout)
            self._refreshed = now

    def hosts(self) -> list[Host]:
        self._refresh_hosts()
        with self._lock:
            return [r.host for n, r in sorted(self._agents.items()) if n not in self._lost]

    def _agent_of(self, host: str) -> AgentClient:
        with self._lock:
            record = self._agents.get(host)
            if record is None or host in self._lost:
                raise Unschedulable(f"host {host!r} is not a live host (live: "
                                    f"{sorted(set(self._agents) - set(self._lost))})")
            return self._client(record.agent_address)

    def endpoint(self, job: str, index: int, host: str) -> str:
        """The task's address on ``host``: the same as before when it was there before (a
        restart on its host keeps its address, and TF re-joins it), else a port of the
        host's task range that no other task of the job was given."""
        self.hosts()
        with self._lock:
            before = self._endpoints.get((job, index))
            if before is not None and before[0] == host:
                return before[1]
            record = self._agents.get(host)
            if record is None:
                raise Unschedulable(f"unknown host {host!r}")
            h = record.host
            used = {int(e.rsplit(":", 1)[1]) for where, e in self._endpoints.values()
                    if where == host}
            used |= {int(i.endpoint.rsplit(":", 1)[1]) for i in self._known.values()
                     if i.host == host and i.endpoint}
            free = [p for p in range(h.first_port, h.last_port + 1) if p not in used]
            if not h.address or not free:
                raise Unschedulable(f"host {host!r} offers no task port (advertise "
                                    f"{h.address!r}, ports {h.first_port}-{h.last_port})")
            # random, not the lowest: a port a crashed task could not bind is not retried
            address = f"{h.address}:{random.choice(free[:512])}"
            self._endpoints[job, index] = (host, address)
            return address

    # ------------------------------------------------------------------ tasks

    def _info(self, host: str, s: cpb.TaskStatus) -> TaskInfo:
        return task_info(host, s)

    def _list_host(self, host: str) -> Optional[list[TaskInfo]]:
        try:
            agent = self._agent_of(host)
            statuses = agent.list(timeout=min(5.0, self.host_timeout)).tasks
        except (AntdtError, Unschedulable):
            return None
        with self._lock:
            self._last_heard[host] = time.monotonic()
        return [self._info(host, s) for s in statuses]

    def tasks(self) -> dict[tuple[str, int], TaskInfo]:
        live = [h.name for h in self.hosts()]
        seen: list[TaskInfo] = []
        answered = set()
        for host in live:
            infos = self._list_host(host)
            if infos is not None:
                answered.add(host)
                seen.extend(infos)
        with self._lock:
            lost = set(self._lost)
            self._launches.update((i.name, i) for i in seen)
            current = latest(seen)
            for key, old in list(self._known.items()):
                new = current.get(key)
                if new is not None and new.name.generation >= old.name.generation:
                    continue
                if old.host in lost or (old.host in answered and old.running
                                        and (new is None or new.host != old.host)):
                    # its host is gone, or its agent restarted and no longer has it
                    current[key] = dataclasses.replace(
                        old, state=TaskState.FAILED,
                        failure=Failure(FailureKind.HOST_LOST, 0, f"host {old.host}"))
                elif new is None or new.name.generation < old.name.generation:
                    current[key] = old     # not heard this round (a slow agent)
            self._known = dict(current)
            return dict(current)

    def launch(self, spec: TaskSpec, host: str, allow_overlap: bool = False) -> TaskInfo:
        key = spec.name.key
        same = admit_launch(self.tasks().get(key), spec, host, allow_overlap)
        if same is not None:
            return same               # idempotent: the same launch
        status = self._agent_of(host).start(
            spec.name.job, spec.name.index, spec.program, spec.args,
            generation=spec.name.generation, endpoint=spec.endpoint,
            memory_limit_bytes=spec.memory_limit_bytes)
        info = self._info(host, status)
        with self._lock:
            self._known[key] = self._launches[spec.name] = info
        return info

    def launch_info(self, name: TaskName) -> Optional[TaskInfo]:
        with self._lock:
            newest = self._known.get(name.key)
            if newest is not None and newest.name == name:
                return newest
            info = self._launches.get(name)
            if info is not None and info.running and info.host in self._lost:
                return dataclasses.replace(info, state=TaskState.FAILED, failure=Failure(
                    FailureKind.HOST_LOST, 0, f"host {info.host}"))
            return info

    def launches_by_task(self) -> dict[tuple[str, int], list[TaskInfo]]:
        """Every launch the hosts list now, by task: an older generation may still run
        beside a newer one that stands by (a move a previous controller began)."""
        self.tasks()
        with self._lock:
            out: dict[tuple[str, int], list[TaskInfo]] = {}
            for name in self._launches:
                out.setdefault(name.key, []).append(self.launch_info(name))
            return out

    def _owner(self, name: TaskName) -> tuple[str, AgentClient]:
        """The host of exactly this launch (an older generation may still run on another
        host while a standby of the next waits to take over)."""
        with self._lock:
            found = self._launches.get(name)
        if found is None:
            newest = self.tasks().get(name.key)
            with self._lock:
                found = self._launches.get(name)
            if found is None:
                if newest is not None and newest.name.generation > name.generation:
                    raise StaleGeneration(f"{name}: the task's current launch is "
                                          f"{newest.name} on {newest.host}")
                raise UnknownTask(f"no host runs {name}")
        return found.host, self._agent_of(found.host)

    def stop(self, name: TaskName, kill: bool = False, grace_seconds: float = 10.0) -> TaskInfo:
        host, agent = self._owner(name)
        status = agent.stop(name.job, name.index, kill=kill, grace_seconds=grace_seconds,
                            generation=name.generation)
        info = self._info(host, status)
        with self._lock:
            self._launches[name] = info
            if self._known.get(name.key, info).name == name:
                self._known[name.key] = info
        return info

    def slow_down(self, name: TaskName, factor: float, duration_seconds: float = 0.0) -> TaskInfo:
        host, agent = self._owner(name)
        return self._info(host, agent.throttle(name.job, name.index, factor, duration_seconds))

    def close(self) -> None:
        with self._lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()
        close = getattr(self.directory, "close", None)
        if close is not None:
            close()
