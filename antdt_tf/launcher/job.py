"""JobRunner: one job's tasks, started, supervised and acted on through a ClusterBackend.

It runs inside the master (``antdt_tf.master.job_control``): the hosts are the agents
that registered with the master — simulated hosts on loopback, each task at the address
the submitter reserved for it (``backend=local``), or real hosts, each task at an
address of its host (``backend=agents``). It starts the tasks, restarts what died (a
task whose host is lost comes back on another host, at a new address: the chief then
restarts with the new cluster and restores), carries out injections and the
Controller's actions (each an ``ActionRun``), and builds the report.

After a master restart a runner *resumes*: it adopts the launches the agents run (the
newest generation of each task; a half-done move's newer standby is stopped), so
nothing is launched twice, and restarts only what died meanwhile.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from typing import Optional

from antdt_tf.agent.inject import Injection
from antdt_tf.errors import AntdtError, InvalidRequest
from antdt_tf.launcher.config import (EXIT_CLUSTER_UNAVAILABLE, JobConfig, place,
                                      skips_refused_leases)
from antdt_tf.launcher.faults import FaultClock
from antdt_tf.launcher.progress import ProgressLine
from antdt_tf.launcher.report import health_dict
from antdt_tf.launcher.taskspecs import TaskContext, task_args


class JobRunner:
    """One job: agents, master, PS, workers, coordinator, and the supervision loop."""

    def __init__(self, cfg: JobConfig, master_address: str, on_event=None,
                 resume: Optional[dict] = None, backend_factory=None):
        """``master_address``: the master this runner runs in (the tasks reach it there);
        ``on_event(event)``: every event, to persist; ``resume``: the state a previous
        runner of this job saved (``saved_state()``), to carry on after a restart;
        ``backend_factory()``: the job's backend where the master's operator configures
        it (Kubernetes: ``antdt-master --kubernetes_*``)."""
        self.backend_factory = backend_factory
        from antdt_tf.data.records import RecordFile

        self.cfg = cfg
        self.num_records = RecordFile(cfg.data).num_records
        slots = cfg.slots
        self.master_address = master_address
        self.on_event = on_event
        self.resume = resume
        # agents: addresses come from the hosts' port ranges once the hosts are known;
        # local: the loopback addresses the submitter reserved
        self.spec = {job: list(cfg.addresses.get(job) or [""] * n)
                     for job, n in (("chief", 1), ("ps", cfg.num_ps), ("worker", slots))}
        self.host_names: list[str] = []
        self.placement = place(cfg.num_ps, slots, cfg.num_hosts)
        self.active_workers = cfg.num_workers   # workers 0..n-1 train; the rest are spare slots
        self.backend = None               # AgentsBackend / LoopbackAgentsBackend (_join_hosts)
        self.cluster_version = 0          # of the JobCluster published to the master
        self.issued: dict[tuple[str, int], int] = {}   # the last generation launched, per task
        self.current: dict[tuple[str, int], object] = {}   # the TaskName that serves, per task
        self.events: list[dict] = []
        self.t0 = time.monotonic()        # coordinator first started
        self.train_t0: Optional[float] = None   # first shard leased: the injection clock
        self.finished_at: Optional[float] = None  # the master first said every epoch done
        self.startup_seconds = 0.0
        self.train_started_unix = 0.0
        self.restarts: dict[tuple[str, int], int] = {}
        # restarts decided (and counted) whose launch may not have happened yet: the
        # generation each will launch; a resumed runner launches what is missing
        self.restarting: dict[tuple[str, int], int] = {}
        self.pending_faults: list = []     # FaultClock of failures not yet regained
        self.coordinator_report_path = cfg.workdir / "coordinator_report.json"
        self._progress: Optional[ProgressLine] = None
        from antdt_tf.controller import CostModel, load_policy

        self.policy = load_policy(cfg.policy)
        self.costs = CostModel(relaunch_worker_seconds=cfg.relaunch_cost_seconds,
                               replace_ps_seconds=cfg.replace_ps_cost_seconds,
                               min_gain_seconds=cfg.min_gain_seconds,
                               redo_seconds=cfg.checkpoint_every_seconds / 2)
        self.actions: list = []            # ActionRun: what the controller did, with outcomes
        self.standby_count = 0
        self.best_rate = 0.0     # the job's best records/s (every worker judged) so far
        self.batch_sizes: dict[int, int] = {}   # ADJUST_BS sizes in force (worker -> size)
        self.health: list = []             # the Monitor's latest TaskHealth list
        self.joined_hosts: list[str] = []  # hosts that joined mid-job, not yet used
        self.trainer_records: list[int] = []   # records per worker, the chief's latest report
        # [seconds since training started, records of worker 0, 1, ...] every 0.5 s
        self.timeline: list[list] = []
        self.injected: list[str] = []          # injections carried out (str of each)
        self.t0_unix = time.time()

    # ------------------------------------------------------------------ processes

    def _event(self, what: str, **extra) -> dict:
        ev = {"t": round(time.monotonic() - self.t0, 2), "event": what, **extra}
        self.events.append(ev)
        if self.on_event is not None:
            self.on_event(ev)
        line = f"[{ev['t']:6.1f}s] {what}"
        if self._progress is not None:
            self._progress.write(line)
        else:
            print(line, file=sys.stderr, flush=True)
        return ev

    def _join_hosts(self) -> None:
        """The hosts whose agents report to the master; every task gets an address on
        its host (local: the one reserved for it)."""
        from antdt_tf.backends.agents import AgentsBackend, MasterRendezvous
        from antdt_tf.backends.local import LoopbackAgentsBackend

        cfg = self.cfg
        if self.backend_factory is not None:
            self.backend = self.backend_factory()
        elif cfg.ray:
            self.backend = self._ray_backend()
        elif cfg.agents:
            self.backend = AgentsBackend(MasterRendezvous(self.master_address),
                                         host_timeout=cfg.host_timeout_seconds)
        else:
            directory = MasterRendezvous(self.master_address)
            self.backend = LoopbackAgentsBackend(directory, {
                (job, i): int(a.rsplit(":", 1)[1]) for job, addresses in self.spec.items()
                for i, a in enumerate(addresses)}, host_timeout=cfg.host_timeout_seconds)
        want = max(1, cfg.num_hosts)
        deadline = time.monotonic() + 120
        while len(hosts := self.backend.hosts()) < want:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"only {len(hosts)} of {want} hosts " + (
                        "are alive nodes of the Ray cluster within 120 s" if cfg.ray else
                        "are Ready nodes of the Kubernetes cluster within 120 s"
                        if cfg.backend == "kubernetes" else
                        f"registered with the master at {self.master_address} within "
                        "120 s (start antdt-agent --master=... on each host)"))
            time.sleep(0.2)
        self.host_names = sorted(h.name for h in hosts)
        self.placement = place(cfg.num_ps, len(self.spec["worker"]), len(self.host_names))
        del self.placement["master", 0]     # the master runs us
        for (job, index), h in self.placement.items():
            self.spec[job][index] = self.backend.endpoint(job, index, self.host_names[h])
        self._event(f"{len(self.host_names)} host(s) registered: "
                    + ", ".join(f"{n} ({h.address})" for n, h in
                                sorted((h.name, h) for h in hosts)))

    def _ray_backend(self):
        """The job's actors on the Ray cluster this master is a driver of (``RAY_ADDRESS``,
        set by the master's own actor; else the cluster of this machine)."""
        import os
        import pathlib

        from antdt_tf.backends.ray import DEFAULT_TASK_PORTS, RayBackend
        from antdt_tf.launcher.config import task_port_range

        cfg = self.cfg
        data = {str(pathlib.Path(p).resolve().parent) for p in (cfg.data, cfg.eval_data) if p}
        return RayBackend(
            cfg.ray_namespace, os.environ.get("RAY_ADDRESS", "auto"),
            log_dir=str(cfg.workdir / "ray"),
            job_roots=tuple(str(r) for r in (cfg.workdir, cfg.checkpoint_dir) if r),
            read_roots=tuple(sorted(data)), estimator_python=cfg.estimator_python,
            task_ports=(task_port_range(cfg.task_ports) if cfg.task_ports
                        else DEFAULT_TASK_PORTS))

    def host_name(self, host: int) -> str:
        return self.host_names[host]

    def live_hosts(self) -> list[int]:
        """Indices of the hosts that are not lost (hosts that joined meanwhile are added
        to the job's hosts, :meth:`_note_joined`)."""
        hosts = self.backend.hosts()
        self._note_joined(hosts)
        live = {h.name for h in hosts}
        return [i for i, n in enumerate(self.host_names) if n in live]

    def _note_joined(self, hosts) -> None:
        """Hosts the cluster gained since the job started (a Ray node added, an agent
        registered): they become the job's, and a job with worker slots to spare
        (``--max_workers``) scales out onto them (:meth:`_control`)."""
        new = sorted(h.name for h in hosts if h.name not in self.host_names)
        if new:
            self.host_names.extend(new)
            self.joined_hosts.extend(new)
            self._event(f"host(s) joined: {', '.join(new)}")

    def task_name(self, job: str, index: int):
        """The launch of ``job:index`` that serves (a standby waiting to take over is a
        newer generation, not yet current)."""
        return self.current[job, index]

    def stop_task(self, job: str, index: int, kill: bool = False, grace_seconds: float = 10.0):
        """Stops the task's current launch (no other generation is touched)."""
        return self.backend.stop(self.task_name(job, index), kill=kill,
                                 grace_seconds=grace_seconds)

    def _context(self) -> TaskContext:
        return TaskContext(self.cfg, self.spec, self.active_workers, self.master_address,
                           self.coordinator_report_path)

    def start_task(self, job: str, index: int, host: Optional[int] = None,
                   standby_file: str = "", standby: bool = False):
        """Launches the task's next generation on its host (or ``host``). ``standby``:
        the current launch keeps running until the new one takes over its address."""
        from antdt_tf.backends import TaskName, TaskSpec

        where = self.placement[job, index] if host is None else host
        endpoint = self.backend.endpoint(job, index, self.host_name(where))
        if job in self.spec and not standby:
            self.spec[job][index] = endpoint     # a task on another host: a new address
        # a standby on another host's address: its own cluster entry says so
        own = (endpoint if job in self.spec and standby and endpoint != self.spec[job][index]
               else "")
        program, args = task_args(self._context(), job, index, standby_file=standby_file,
                                  own_endpoint=own)
        if job == "chief" and not self.cfg.tf1:
            self._publish_cluster()
        generation = self.issued.get((job, index), 0) + 1
        name = TaskName(job, index, generation)
        spec = TaskSpec(name, program, args, endpoint=endpoint)
        self.issued[job, index] = generation
        info = self.backend.launch(spec, self.host_name(where), allow_overlap=standby)
        self.current[job, index] = name
        return info

    def _publish_cluster(self) -> None:
        """The chief's cluster (the active workers, a prefix of the slots: a task index
        means the same task to the chief and to the server), to the master."""
        from antdt_tf.monitor.client import MonitorClient

        self.cluster_version += 1
        with MonitorClient(self.master_address, timeout=30) as monitor:
            monitor.set_job_cluster(self.cluster_version, dict(
                self.spec, worker=self.spec["worker"][:self.active_workers]))

    def _register_dataset(self) -> None:
        from antdt_tf.sharding.client import ShardingClient
        from antdt_tf.sharding.plan import DataFile, DatasetSpec

        with ShardingClient(self.master_address, timeout=60) as admin:
            admin.register_dataset(DatasetSpec(
                "train", records_per_shard=self.cfg.records_per_shard,
                num_epochs=self.cfg.epochs, shuffle=self.cfg.shuffle, seed=self.cfg.data_seed,
                files=(DataFile(self.cfg.data, self.num_records),),
                static_workers=(self.cfg.num_workers
                                if getattr(self.policy, "sharding", "dynamic") == "static"
                                else 0),
                # PullTrainer and the TF1 feed skip the batches of a lease whose report
                # was refused (Keras and BSP do not)
                tail_stealing=(getattr(self.policy, "tail_stealing", False)
                               and skips_refused_leases(self.cfg)),
                backup_leases=(getattr(self.policy, "backup_leases", False)
                               and skips_refused_leases(self.cfg))))

    # ------------------------------------------------------------------ the job

    def run(self) -> dict:
        from antdt_tf.monitor.client import MonitorClient
        from antdt_tf.sharding.client import ShardingClient

        try:
            self._join_hosts()
            # idempotent for the same spec: after a restart it may not have been done yet
            self._register_dataset()
            if self.resume is not None:
                self._adopt(self.resume)
            else:
                self._start_tasks()
            with ShardingClient(self.master_address, timeout=10) as admin, \
                    MonitorClient(self.master_address) as monitor:
                self._supervise(admin, monitor)
            return self._report()
        finally:
            self.shutdown()

    def _start_tasks(self) -> None:
        for i in range(len(self.spec["ps"])):
            self.start_task("ps", i)
        if self.cfg.tf1:
            self.t0 = time.monotonic()
        for i in range(self.active_workers):
            self.start_task("worker", i)
        if self.cfg.tf1:
            self._event(f"{self.active_workers} TF1 trainers started (worker 0 is the chief)")
        else:
            self.t0 = time.monotonic()
            self.start_task("chief", 0)
            self._event("coordinator started")

    def _supervise(self, admin, monitor) -> None:
        from antdt_tf.backends import TaskState

        cfg = self.cfg
        # a master's own kill is the submitter's to carry out (it runs the master);
        # injections done before a master restart are not done again
        pending = sorted((j for j in cfg.injections
                          if j.job != "master" and str(j) not in self.injected),
                         key=lambda j: (j.percent, j.at))
        ended_slowdowns: list[Injection] = []
        progress = self._progress = ProgressLine(self, admin, monitor, enabled=cfg.progress)
        deadline = time.monotonic() + cfg.timeout_seconds
        last_listed = last_decided = 0.0
        try:
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the job did not finish within {cfg.timeout_seconds:g}s")
                if self.train_t0 is None and progress.started:
                    self.train_t0 = time.monotonic()
                    self.train_started_unix = time.time()
                    self.on_event and self.on_event(None)     # save the clock
                    self.startup_seconds = self.train_t0 - self.t0
                    self._event("training started (first shard leased); injection clock starts")
                now = time.monotonic() - (self.train_t0 or float("inf"))
                done_percent = 100.0 * progress.records / max(1, progress.total)
                for inj in list(pending):
                    due = (self.train_t0 is not None and done_percent >= inj.at
                           if inj.percent else inj.at <= now)
                    if due and self._inject(inj):     # False: deferred to a later round
                        pending.remove(inj)
                for inj in [j for j in cfg.injections if j.kind == "slow" and j.until
                            and j.until <= now and j not in ended_slowdowns]:
                    ended_slowdowns.append(inj)
                    self._event(f"slowdown of {inj.task} ended")
                # the agents' task lists every 500 ms (exits) and the master's progress
                # every 500 ms: both cost the job CPU (the JCT comes from the master's own
                # journal times, not from this polling)
                if time.monotonic() - last_listed >= 0.5:
                    last_listed = time.monotonic()
                    statuses = self._statuses()
                    chief = statuses.get(("worker", 0) if cfg.tf1 else ("chief", 0))
                    if chief is not None and chief.state is TaskState.SUCCEEDED:
                        progress.update(final=True)
                        self._event("chief finished" if cfg.tf1 else "coordinator finished")
                        return
                    for key, status in sorted(statuses.items(), key=lambda kv: (
                            kv[0][0] == "chief", kv[0])):    # the chief last: it needs
                        if key[0] == "worker" and key[1] >= self.active_workers:  # addresses
                            continue    # a slot scaled away
                        if cfg.tf1 and key[0] == "worker" and status.state is TaskState.SUCCEEDED:
                            continue    # a TF1 trainer that finished its data
                        if not status.running:
                            self._recover(key, status, statuses)
                records = progress.update()
                if self.finished_at is None and progress.finished:
                    self.finished_at = time.monotonic()
                now = time.monotonic()
                self.pending_faults = [f for f in self.pending_faults
                                       if not f.observe(now, records)]
                if (self.train_t0 is not None and not progress.finished
                        and time.monotonic() - last_decided >= cfg.controller_interval_seconds):
                    last_decided = time.monotonic()
                    self._control(monitor, records)
                time.sleep(0.25)
        finally:
            progress.close()
            self._progress = None

    def _statuses(self) -> dict:
        """The current launch of every task, as the backend reports it."""
        self.backend.tasks()      # one refresh from the agents
        return {key: info for key, name in self.current.items()
                if (info := self.backend.launch_info(name)) is not None}

    # ------------------------------------------------------------------ controller

    def _control(self, monitor, records: int) -> None:  # noqa: C901 (one round, in order)
        """One controller round: follow the actions in flight, then ask the policy."""
        from antdt_tf.controller import Observation, TaskView
        from antdt_tf.proto import cluster_pb2 as cpb

        try:
            status = monitor.status()
        except AntdtError:
            return     # master restarting: decide next time
        self.health = list(status.health)
        self.trainer_records = [w.records for w in status.trainer.workers]
        now = time.monotonic()
        for act in [a for a in self.actions if a.pending]:
            self._follow(act, records, now)
        if any(a.pending for a in self.actions):
            return     # one disruptive action at a time
        self.live_hosts()
        if self.joined_hosts and not self.cfg.tf1:
            hosts, self.joined_hosts = self.joined_hosts, []
            n = min(len(self.spec["worker"]), self.active_workers + len(hosts))
            if n > self.active_workers:
                from antdt_tf.controller import ScaleWorkers

                self._scale(ScaleWorkers(num_workers=n, reason=f"host(s) {', '.join(hosts)} "
                                         "joined the cluster"), onto=hosts)
                return
        name = {v: k.lower() for k, v in cpb.TaskHealth.StragglerClass.items()}
        views = [TaskView(h.task.job, h.task.index,
                          name.get(h.straggler_class, "unknown").replace(
                              "straggler_class_unspecified", "unknown"),
                          h.slowness, h.records_per_second, h.step_seconds, h.latency_ms,
                          h.samples) for h in status.health]
        cooldown = self.cfg.straggler_window_seconds
        busy = frozenset(a.task for a in self.actions
                         if a.ended is None or now - a.ended < cooldown)
        if self.cfg.tf1:
            # TF1: worker 0 is the chief (moving it restarts the job from a checkpoint),
            # and the PS have no latency probes (no coordinator): workers only
            busy |= {("worker", 0)} | {("ps", i) for i in range(self.cfg.num_ps)}
        rate = sum(v.records_per_second for v in views if v.job == "worker")
        if all(v.samples for v in views if v.job == "worker"):
            self.best_rate = max(self.best_rate, rate)
        obs = Observation(now=time.time(), workers=tuple(v for v in views if v.job == "worker"),
                          ps=tuple(v for v in views if v.job == "ps"),
                          remaining_records=max(0, self.num_records * self.cfg.epochs - records),
                          costs=self.costs, busy=busy, best_records_per_second=self.best_rate,
                          mode=self.cfg.mode, batch_size=self.cfg.batch_size,
                          batch_sizes=tuple(sorted(self.batch_sizes.items())))
        try:
            actions = list(self.policy.decide(obs))
        except Exception as e:  # a user policy's bug must not take the job down
            self._event(f"controller: policy {self.policy.name!r} failed: {e!r}")
            return
        for action in actions:
            job, index = action.task
            if (job, index) in busy or (job, index) not in self.placement:
                continue
            self._execute(action, records, status)
            return

    def _other_host(self, job: str, index: int) -> int:
        """A live host other than the task's own: the fewest of the job's PS and
        workers, then the least busy (its load per CPU)."""
        from antdt_tf.backends import Placement

        self.live_hosts()               # hosts that joined count too
        tasks = {n: 0 for n in self.host_names}
        for (j, _), h in self.placement.items():
            if j in ("ps", "worker"):
                tasks[self.host_names[h]] += 1
        here = self.host_name(self.placement[job, index])
        try:
            name = self.backend.place(Placement(avoid=frozenset({here})), load=tasks)
        except AntdtError:          # no other live host: stay
            return self.placement[job, index]
        return self.host_names.index(name)

    def _execute(self, action, records: int, status) -> None:
        """Starts an action: the new process first imports TF on the other host and
        stands by (``antdt-tf-server --standby_file``); :meth:`_follow` then kills the
        old one, and the new one binds the address within milliseconds."""
        from antdt_tf.controller import AdjustBatchSizes, RelaunchWorker, ReplacePs, ScaleWorkers
        from antdt_tf.controller.execution import ActionRun

        job, index = action.task
        kind = type(action).__name__
        if isinstance(action, ScaleWorkers):
            self._scale(action)
            return
        if isinstance(action, AdjustBatchSizes):
            self._adjust_batch_sizes(action)
            return
        if not isinstance(action, (RelaunchWorker, ReplacePs)) or (
                self.cfg.tf1 and not isinstance(action, RelaunchWorker)):
            raise InvalidRequest(f"the launcher cannot carry out {kind}"
                                 + (f" with --api={self.cfg.api}" if self.cfg.tf1 else ""))
        src, dst = self.placement[job, index], self._other_host(job, index)
        ev = self._event(f"controller ({self.policy.name}): {kind} {job}:{index} "
                         f"host{src} -> host{dst}: {action.reason}", action=kind)
        self.standby_count += 1
        ready = self.cfg.workdir / f"standby-{job}{index}-{self.standby_count}"
        old_launch = self.task_name(job, index)
        stable = self.backend.capabilities.stable_endpoints
        self.start_task(job, index, host=dst, standby=True,
                        standby_file=str(ready) if stable else "")
        old = [h.incarnation for h in status.health
               if h.task.job == job and h.task.index == index]
        self.actions.append(ActionRun(
            action, ev["t"], time.monotonic(), from_host=src, to_host=dst,
            ready_files=(ready,) if stable else (), old_launch=old_launch,
            old_incarnation=old[0] if old else -1,
            endpoint=self.backend.endpoint(job, index, self.host_name(dst)),
            chief_restarts=self.restarts.get(("chief", 0), 0)))

    def _least_loaded_host(self) -> int:
        """The live host with the fewest of the job's running PS and workers."""
        tasks = {n: 0 for n in self.host_names}
        for (j, i), h in self.placement.items():
            if j == "ps" or (j == "worker" and i < self.active_workers):
                tasks[self.host_names[h]] += 1
        return self.host_names.index(self.backend.place(load=tasks))

    def _adjust_batch_sizes(self, action) -> None:
        """ADJUST_BS: the master hands the sizes out with each worker's next lease."""
        from antdt_tf.sharding.client import ShardingClient

        sizes = dict(action.sizes)
        with ShardingClient(self.master_address, timeout=10) as admin:
            admin.set_batch_sizes("train", sizes, replace=True)
        self.batch_sizes = sizes
        ev = self._event(f"controller ({self.policy.name}): AdjustBatchSizes "
                         f"{sizes}: {action.reason}", action="AdjustBatchSizes")
        from antdt_tf.controller.execution import ActionRun

        self.actions.append(ActionRun(action, ev["t"], time.monotonic()))

    def _scale(self, action, onto: tuple = ()) -> None:
        """Scale out: the new workers stand by first (:meth:`_follow` switches when all
        are ready), on the hosts ``onto`` (hosts that joined), else — where a task's
        address depends on its host — on the hosts with the fewest of the job's tasks.
        Scale in: switch at once."""
        n, slots = action.num_workers, len(self.spec["worker"])
        if not 1 <= n <= slots or n == self.active_workers:
            self._event(f"controller: ScaleWorkers to {n} ignored (slots: {slots}, "
                        f"running: {self.active_workers})")
            return
        ev = self._event(f"controller ({self.policy.name}): ScaleWorkers "
                         f"{self.active_workers} -> {n} workers: {action.reason}",
                         action="ScaleWorkers")
        from antdt_tf.controller.execution import ActionRun

        ready = []
        for k, i in enumerate(range(self.active_workers, n)):
            if onto:
                self.placement["worker", i] = self.host_names.index(onto[k % len(onto)])
            elif not self.backend.capabilities.stable_endpoints:
                self.placement["worker", i] = self._least_loaded_host()
            self.standby_count += 1
            ready.append(self.cfg.workdir / f"standby-worker{i}-{self.standby_count}")
            self.start_task("worker", i, standby_file=str(ready[-1]))
        act = ActionRun(action, ev["t"], time.monotonic(), from_workers=self.active_workers,
                        to_workers=n, ready_files=tuple(ready))
        self.actions.append(act)
        if n < self.active_workers:
            self._switch_scale(act)

    def _switch_scale(self, act) -> None:
        """The chief goes (killed: the last checkpoint holds model and sharding state)
        and comes back with the new worker set, restoring; workers scaled away stop."""
        from antdt_tf.controller.execution import ActionPhase

        old, n = act.from_workers, act.to_workers
        if act.hold:
            act.hold = False
            self._hold_data(False)
        act.records_per_worker_before = tuple(self.trainer_records)
        self.stop_task("chief", 0, kill=True)
        self.active_workers = n
        for i in range(n, old):
            self.stop_task("worker", i, grace_seconds=2)
            self._release_leases_of(i)
        self.start_task("chief", 0)
        act.to(ActionPhase.RECOVERING, time.monotonic(), "the chief restarts with "
               f"{n} workers")

    def _standby_ready(self, act) -> bool:
        """A standby on a shared address wrote its ready file; one on its own address
        serves it (the TF server bound its port)."""
        if act.ready_files:
            return act.ready()
        import socket

        host, port = act.endpoint.rsplit(":", 1)
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=0.5):
                return True
        except OSError:
            return False

    def _switch_over(self, act) -> None:
        """The standby is ready: the old process goes (a kill: a relaunched worker redoes
        at most its batch in flight; a PS's state is in the last checkpoint)."""
        from antdt_tf.controller.execution import ActionPhase

        job, index = act.task
        moved = self.spec[job][index] != act.endpoint
        self.spec[job][index] = act.endpoint
        self.backend.stop(act.old_launch, kill=True)
        self.placement[job, index] = act.to_host
        if job == "worker":
            self._release_leases_of(index)
        if moved and job == "worker":
            # a new address is a cluster change: the chief goes and comes back with it,
            # restoring from the last checkpoint (a moved PS makes the chief exit 75)
            self._event(f"worker:{index} moved to {act.endpoint}: restarting the chief "
                        "with the new cluster")
            self.stop_task("chief", 0, kill=True)
        act.to(ActionPhase.RECOVERING, time.monotonic(), "the old process killed")

    def _follow(self, act, records: int, now: float) -> None:
        """Standby ready -> switch over; done when the moved task works again: a
        relaunched worker's new incarnation reports steps; after a PS replacement,
        records progress again (the chief restored the last checkpoint, so the count
        first drops back to it)."""
        from antdt_tf.controller import ScaleWorkers
        from antdt_tf.controller.execution import ActionPhase

        job, index = act.task
        if act.phase is ActionPhase.STARTING:
            if self._standby_ready(act):
                if isinstance(act.action, ScaleWorkers):
                    self._switch_scale(act)
                else:
                    self._switch_over(act)
                return
            if isinstance(act.action, ScaleWorkers):
                if now - act.started > 120:
                    self._event("controller: the new workers did not get ready; "
                                "ScaleWorkers abandoned")
                    for i in range(act.from_workers, act.to_workers):
                        self.stop_task("worker", i, kill=True)
                    if act.hold:
                        act.hold = False
                        self._hold_data(False)
                    act.to(ActionPhase.ABANDONED, now, "new workers not ready in 120 s")
                return
            standby = self._statuses().get((job, index))
            if standby is None or not standby.running or now - act.started > 120:
                self._event(f"controller: the standby {job}:{index} on host{act.to_host} "
                            f"did not get ready; {act.kind} abandoned")
                self.stop_task(job, index, kill=True)
                self.current[job, index] = act.old_launch   # the old one serves on
                act.to(ActionPhase.ABANDONED, now, "standby not ready or died")
            return
        done = False
        if isinstance(act.action, ScaleWorkers):
            act.low_records = min(act.low_records if act.low_records is not None
                                  else records, records)
            if records > act.low_records:
                # scale-out: done when every added worker trains (its steps reach the
                # Monitor), not only when the restarted chief trains again
                if act.training_since is None:
                    act.training_since = now
                stepping = {h.task.index for h in self.health
                            if h.task.job == "worker" and h.samples > 0}
                added = range(act.from_workers, act.to_workers)
                done = all(i in stepping for i in added) or now - act.training_since > 60
        elif job == "worker":
            done = any(h.task.job == "worker" and h.task.index == index
                       and h.incarnation != act.old_incarnation and h.samples > 0
                       for h in self.health)
        elif self.restarts.get(("chief", 0), 0) > act.chief_restarts:
            act.low_records = min(act.low_records if act.low_records is not None
                                  else records, records)
            done = records > act.low_records
        if done:
            self._done(act, now)

    def _done(self, act, now: float) -> None:
        from antdt_tf.controller import RelaunchWorker, ReplacePs, ScaleWorkers
        from antdt_tf.controller.execution import ActionPhase

        act.to(ActionPhase.DONE, now, "training again")
        what = (f"to {act.to_workers} workers" if isinstance(act.action, ScaleWorkers)
                else f"{act.task[0]}:{act.task[1]}")
        self._event(f"controller: {act.kind} {what} done; "
                    f"training again after {act.recovered_after_s:.1f}s")
        if isinstance(act.action, (RelaunchWorker, ReplacePs)):
            done_of_kind = [a.recovered_after_s for a in self.actions
                            if a.kind == act.kind and a.recovered_after_s is not None]
            mean = sum(done_of_kind) / len(done_of_kind)
            if isinstance(act.action, RelaunchWorker):
                self.costs.relaunch_worker_seconds = mean
            else:
                self.costs.replace_ps_seconds = mean

    def _inject(self, inj: Injection) -> bool:
        """Carries out an injection; False: not now (a scaling waits for the action
        still running)."""
        if inj.kind == "scale":
            from antdt_tf.controller import ScaleWorkers

            from antdt_tf.controller.execution import ActionPhase

            if any(a.pending for a in self.actions):
                return False
            self._execute(ScaleWorkers(num_workers=inj.index, reason=f"injected: {inj}"),
                          self._records_done(), None)
            self.injected.append(str(inj))
            act = self.actions[-1] if self.actions else None
            if act is not None and act.phase is ActionPhase.STARTING:
                # hold the data while the new workers start, so that a job which would
                # end first (a fast machine, a small job) still sees the action
                act.hold = self._hold_data(True)
            return True
        self.injected.append(str(inj))
        if inj.kind == "kill":
            st = self.stop_task(inj.job, inj.index, kill=True)
            self._event(f"injected: SIGKILL {inj.task} (pid {st.pid})", injected=str(inj))
        else:
            duration = (inj.until - inj.at) if inj.until else 0.0
            self.backend.slow_down(self.task_name(inj.job, inj.index), inj.factor, duration)
            self._event(f"injected: {inj}", injected=str(inj))
        return True

    def _recover(self, key, status, statuses) -> None:
        job, index = key
        name = "coordinator" if job == "chief" else f"{job}:{index}"
        from antdt_tf.backends import FailureKind, TaskState

        failure = status.failure
        if status.state is TaskState.STOPPED:
            how = "killed"
        elif failure is None:
            how = "exit 0"
        elif failure.kind is FailureKind.EXITED:
            how = f"exit {failure.exit_code}"
        elif failure.kind is FailureKind.KILLED:
            how = f"signal {signal.Signals(-failure.exit_code).name}"
        else:
            how = str(failure)
        if (job == "chief" and failure is not None and failure.kind is FailureKind.EXITED
                and failure.exit_code == EXIT_CLUSTER_UNAVAILABLE):
            # wait until every PS and worker runs again, then relaunch (it restores)
            if any(not s.running for k, s in statuses.items() if k[0] in ("ps", "worker")):
                return
        n = self.restarts.get(key, 0) + 1
        if n > self.cfg.max_restarts:
            raise RuntimeError(f"{name} failed {n} times ({how}); giving up. Log: "
                               f"{status.log_path}")
        self.restarts[key] = n
        self.restarting[key] = self.issued.get(key, 0) + 1
        ev = self._event(f"{name} {how}; restarting it (restart {n})", task=name,
                         failure=how)
        self.pending_faults.append(FaultClock(ev, time.monotonic(), self._records_done()))
        if job == "worker":
            self._release_leases_of(index)
        if self.placement[key] not in self.live_hosts():
            # its host is lost: another host, another address
            self.placement[key] = self._other_host(job, index)
            self._event(f"{name} moves to {self.host_name(self.placement[key])}")
        address = self.spec[job][index] if job in self.spec else ""
        self.start_task(job, index)
        self.restarting.pop(key, None)
        if job == "chief":
            records = self._records_done()
            for fault in self.pending_faults:
                fault.chief_started(records)
        if (job == "worker" and index < self.active_workers and not self.cfg.tf1
                and self.spec[job][index] != address):
            # TF re-joins a worker only at its old address: the chief comes back with
            # the new cluster and restores the last checkpoint
            self._event(f"{name} has a new address: restarting the chief with the new "
                        "cluster")
            if statuses.get(("chief", 0)) is not None and statuses["chief", 0].running:
                self.stop_task("chief", 0, kill=True)

    def _hold_data(self, hold: bool) -> bool:
        """Holds (no new lease) or resumes the job's dataset; True when it took effect."""
        from antdt_tf.sharding.client import ShardingClient

        try:
            with ShardingClient(self.master_address, timeout=10) as c:
                c.set_paused("train", hold)
        except AntdtError as e:
            self._event(f"could not {'hold' if hold else 'resume'} the data: {e}")
            return False
        self._event("data held while the injected action starts its tasks" if hold
                    else "data resumed")
        return True

    def _release_leases_of(self, worker: int) -> None:
        """A dead worker's pipeline held leases (pull path): give them back now rather
        than when their lease runs out, so the live workers take them over."""
        from antdt_tf.sharding.client import ShardingClient, Task

        try:
            with ShardingClient(self.master_address, timeout=5) as c:
                for t in c.progress("train").tasks:
                    if t.task.type == "worker" and t.task.index == worker and t.state != "dead":
                        n = c.report_task_failure(Task("worker", worker, t.task.incarnation),
                                                  reason="process died (agent)")
                        if n:
                            self._event(f"worker:{worker}'s {n} lease(s) released (back to "
                                        "TODO; sparse ones held for the chief to settle)")
        except AntdtError as e:
            self._event(f"could not release worker:{worker}'s leases: {e}")

    def _master_progress(self, timeout: float = 5):
        """The master's GetProgress of the job's dataset, None while it is down."""
        from antdt_tf.sharding.client import ShardingClient

        try:
            with ShardingClient(self.master_address, timeout=timeout) as c:
                return c.progress("train")
        except AntdtError:
            return None

    def _dataset_progress(self, timeout: float = 5):
        p = self._master_progress(timeout)
        return p.datasets[0] if p is not None else None

    def _records_done(self) -> int:
        p = self._dataset_progress(timeout=2)
        return p.records_done_total if p is not None else 0

    def _report(self) -> dict:
        cfg = self.cfg
        end = self.finished_at or time.monotonic()
        jct = end - (self.train_t0 or self.t0)
        progress = self._master_progress()
        final = progress.datasets[0] if progress is not None else None
        if final is not None and final.started_unix and final.finished_unix:
            # exact: the master's journal times, not our polling
            jct = final.finished_unix - final.started_unix
            self.train_started_unix = final.started_unix
        coord = json.loads(self.coordinator_report_path.read_text())
        total = self.num_records * cfg.epochs
        for fault in self.pending_faults:
            fault.close()
        import psutil

        cpu = {}   # CPU seconds of every process of the job (latest incarnation of each task)
        try:
            for (job, index), st in sorted(self._statuses().items()):
                cpu[f"{job}:{index}"] = round(st.cpu_seconds, 2)
            t = psutil.Process().cpu_times()
            cpu["master"] = round(t.user + t.system, 2)
        except (AntdtError, psutil.Error):
            pass
        report = {
            "jct_seconds": round(jct, 3),   # first shard issued -> every record applied
            "startup_seconds": round(self.startup_seconds, 2),
            "train_started_unix": self.train_started_unix,
            "records": total,
            "records_per_second": round(total / jct, 1),
            "num_ps": cfg.num_ps, "num_workers": cfg.num_workers,
            "num_hosts": len(self.host_names), "backend": cfg.backend,
            "hosts": {f"{j}:{i}": self.host_name(h) for (j, i), h in sorted(self.placement.items())},
            "epochs": cfg.epochs, "batch_size": cfg.batch_size,
            "records_per_shard": cfg.records_per_shard,
            "shards_per_worker": coord.get("shards_per_worker", []),
            "records_per_worker": coord.get("records_per_worker", []),
            "auc": coord.get("auc"), "logloss": coord.get("logloss"),
            "injections": [str(j) for j in cfg.injections],
            "failures": [ev for ev in self.events if "failure" in ev],
            "events": self.events,
            "restarts": {f"{j}:{i}": n for (j, i), n in self.restarts.items()},
            "cpu_seconds": cpu,
            "coordinator": coord,
            "policy": self.policy.name,
            "mode": cfg.mode,
            "batch_sizes": {str(w): b for w, b in self.batch_sizes.items()},
            "actions": getattr(self, "adopted_actions", []) + [a.report() for a in self.actions],
            "health": [health_dict(h) for h in self.health],
            "timeline": self.timeline,
            # lease remainders idle workers took over (tail work-stealing)
            "stolen_leases": final.stolen_leases if final is not None else 0,
            "backup_leases": final.backup_leases if final is not None else 0,
            # what the master counted per task (its latest incarnation), from every
            # worker's own reports: exact, unlike the chief's sampled counters
            "master_records_per_task": {
                f"{t.task.type}:{t.task.index}": t.records_done
                for t in (progress.tasks if progress is not None else ())},
        }
        if "audit" in coord:
            audit = dict(coord["audit"])
            # each kill may redo the one batch in flight: injected, a relaunch's, or a
            # fault from outside (a worker or PS that died on its own, a lost host; an
            # injected kill's failure reads "killed" and is counted once, above)
            outside = [ev for ev in self.events if ev.get("failure") not in (None, "killed")
                       and ev.get("task", "").startswith(("worker:", "ps:"))]
            faults = len([j for j in cfg.injections if j.kind == "kill"]) + len(
                [a for a in self.actions if a.kind == "RelaunchWorker"]) + len(outside)
            bound = faults * cfg.batch_size
            # a torn step (Keras audit: begun, cut by the kill, trained again) was
            # partly applied twice: it counts against the same one-batch bound
            off = audit.get("applied_other", 0) + audit.get("torn", 0)
            audit["allowed_off_records"] = bound
            audit["ok"] = off <= bound
            if final is not None and final.backup_leases:
                # backup workers apply what both copies trained twice, by design: their
                # contract is only that nothing is lost
                audit["duplicates_by_design"] = True
                audit["ok"] = audit.get("applied_0", 0) <= bound
            report["audit"] = audit
        return report

    def shutdown(self) -> None:
        """Stops every task (chief first), then lets go of the backend (the hosts' agents
        are not the runner's)."""
        if self.backend is None:
            return
        for job in ("chief", "worker", "ps"):
            for (j, i) in [k for k in self.current if k[0] == job]:
                try:
                    self.stop_task(j, i, grace_seconds=5)
                except AntdtError:
                    pass
        release = getattr(self.backend, "release_all", None)
        if release is not None:      # Ray: no actor of the job outlives it
            release()
        self.backend.close()

    # ------------------------------------------------------------------ restart

    def saved_state(self) -> dict:
        """What a runner of this job needs to carry on after a master restart (JSON)."""
        return {"restarts": [[j, i, n] for (j, i), n in self.restarts.items()],
                "restarting": [[j, i, g] for (j, i), g in self.restarting.items()],
                "events": [dict(e)
                           for e in self.events],
                "actions": [a.report() for a in self.actions if not a.pending],
                "active_workers": self.active_workers,
                "cluster_version": self.cluster_version,
                "injected": list(self.injected),
                "batch_sizes": {str(w): b for w, b in self.batch_sizes.items()},
                "t0_unix": self.t0_unix,
                "train_started_unix": self.train_started_unix}

    def _adopt(self, saved: dict) -> None:
        """Carry on a job after a master restart: what was done stays done (restarts,
        events, actions, injections), and the launches the agents run are this job's
        (the newest generation of each task), so nothing is launched twice. A move
        that was half done (its new launch standing by beside the old one) is
        abandoned: the newer launch is stopped, the old one serves on."""
        now = time.monotonic()
        self.t0 = now - (time.time() - saved.get("t0_unix", time.time()))
        self.t0_unix = saved.get("t0_unix", self.t0_unix)
        if saved.get("train_started_unix"):
            self.train_started_unix = saved["train_started_unix"]
            self.train_t0 = now - (time.time() - self.train_started_unix)
        self.restarts = {(j, i): n for j, i, n in saved.get("restarts", [])}
        self.events = list(saved.get("events", []))
        self.adopted_actions = list(saved.get("actions", []))
        self.active_workers = saved.get("active_workers", self.active_workers)
        self.injected = list(saved.get("injected", []))
        self.batch_sizes = {int(w): b for w, b in saved.get("batch_sizes", {}).items()}
        from antdt_tf.monitor.client import MonitorClient

        with MonitorClient(self.master_address) as monitor:   # survives in the state dir
            published = monitor.job_cluster()
            self.cluster_version = max(saved.get("cluster_version", 0), published.version)
        self.backend.tasks()
        adopted = []
        for key, launches in sorted(self.backend.launches_by_task().items()):
            running = [info for info in launches if info.running]
            keep = min(running, key=lambda i: i.name.generation) if running else max(
                launches, key=lambda i: i.name.generation)
            for extra in running:
                if extra is not keep:     # a standby of a move the old master began
                    self.backend.stop(extra.name, kill=True)
                    self._event(f"resume: stopped {extra.name} on {extra.host} (a move the "
                                "previous master had not finished)")
            self.issued[key] = max(i.name.generation for i in launches)
            self.current[key] = keep.name
            if keep.host in self.host_names and key in self.placement:
                self.placement[key] = self.host_names.index(keep.host)
            if key[0] in self.spec and keep.endpoint:
                self.spec[key[0]][key[1]] = keep.endpoint
            adopted.append(f"{keep.name}@{keep.host}" + ("" if keep.running else " (ended)"))
        for key in [k for k in self.placement if k not in self.current
                    and not (k[0] == "worker" and k[1] >= self.active_workers)]:
            self.start_task(*key)          # never launched before the restart
        for j, i, generation in saved.get("restarting", []):
            if (j, i) in self.placement and self.issued.get((j, i), 0) < generation:
                # the previous master counted this restart but died before launching it
                self.start_task(j, i)
                self._event(f"resume: launched the restart of {j}:{i} the previous master "
                            "had begun")
        self._event(f"resumed after a master restart: adopted {', '.join(adopted) or 'nothing'}")
        chief = self.current.get(("chief", 0))
        if (chief is not None and not self.cfg.tf1 and published.version
                and (list(published.ps) != self.spec["ps"]
                     or list(published.worker) != self.spec["worker"][:self.active_workers])):
            # a move the previous master switched over before it restarted the chief: the
            # chief comes back with the cluster as it is (and restores)
            self._event("resume: the chief's cluster is out of date; restarting the chief")
            self.stop_task("chief", 0, kill=True)
