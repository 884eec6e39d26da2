"""JobRunner: one job's tasks, started, supervised and acted on through a ClusterBackend.

It runs inside the master (``antdt_tf.master.job_control``): the hosts are the agents
that registered with the master — simulated hosts on loopback, each task at the address
the submitter reserved for it (``backend=local``), or real hosts, each task at an
address of its host (``backend=agents``), Ray nodes or Kubernetes pods. It starts the
tasks (``tasks``), restarts what died (``recovery``; a task whose host is lost comes
back on another host, at a new address: the chief then restarts with the new cluster
and restores), carries out injections and the Controller's actions (``executor``, each
an ``ActionRun``), and builds the report (``report``).

After a master restart a runner *resumes* (``resume``): it adopts the launches the
agents run, so nothing is launched twice, and restarts only what died meanwhile.

This module holds the runner's record (its state, :meth:`JobRunner.__init__`) and its
loop (:meth:`JobRunner._supervise`: observe -> decide -> act, every 250 ms).
"""

from __future__ import annotations

import sys
import time
from typing import Optional

from antdt_tf.errors import AntdtError
from antdt_tf.job.spec import Job, place
from antdt_tf.master.runner.executor import ActionExecutor
from antdt_tf.master.runner.progress import JobProgress
from antdt_tf.master.runner.recovery import Recovery
from antdt_tf.master.runner.report import build_report
from antdt_tf.master.runner.resume import Resume
from antdt_tf.master.runner.tasks import TaskLaunching

LIST_EVERY = 0.5    # seconds between the agents' task lists (exits) and progress polls
TICK = 0.25         # seconds between rounds of the loop


class JobRunner(TaskLaunching, ActionExecutor, Recovery, Resume):
    """One job: its tasks, the supervision loop, the Controller's actions, the report.
    The parts are mixins over one record (the attributes set here), each in its own
    module; only the loop and the record are here."""

    def __init__(self, cfg: Job, master_address: str, services, on_event=None,
                 resume: Optional[dict] = None, backend_factory=None):
        """``master_address``: the master this runner runs in (the tasks reach it there);
        ``services``: that master's services in this process (``server.MasterServices``);
        ``on_event(event)``: every event, to persist; ``resume``: the state a previous
        runner of this job saved (``saved_state()``), to carry on after a restart;
        ``backend_factory()``: the job's backend where the master's operator configures
        it (Kubernetes: ``antdt-master --kubernetes_*``)."""
        self.backend_factory = backend_factory
        self.cfg = cfg
        self.num_records = cfg.count_records()
        slots = cfg.slots
        self.master_address = master_address
        self.services = services
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
        self._progress: Optional[JobProgress] = None    # while supervising
        self.admin = self.monitor = None      # the master's sharding and monitor clients
        self.ended_slowdowns: list[str] = []   # injected slowdowns whose end was noted
        self.adopted_actions: list = []        # actions a previous master finished
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

    def _event(self, what: str, **extra) -> dict:
        ev = {"t": round(time.monotonic() - self.t0, 2), "event": what, **extra}
        self.events.append(ev)
        if self.on_event is not None:
            self.on_event(ev)
        print(f"[{ev['t']:6.1f}s] {what}", file=sys.stderr, flush=True)   # the master's log
        return ev

    # ------------------------------------------------------------------ the job

    def run(self) -> dict:
        """Hosts, dataset, tasks (or the adopted ones after a master restart), the loop,
        the report; every task stopped at the end, also on failure."""
        from antdt_tf.monitor.client import MonitorClient
        from antdt_tf.sharding.client import ShardingClient

        # the master's services, called in this process on its event loop
        self.admin = ShardingClient(self.master_address, timeout=10,
                                    stub=self.services.sharding)
        self.monitor = MonitorClient(timeout=30, stub=self.services.monitor)
        try:
            self._join_hosts()
            # idempotent for the same spec: after a restart it may not have been done yet
            self._register_dataset()
            if self.resume is not None:
                self._adopt(self.resume)
            else:
                self._start_tasks()
            self._supervise(self.admin, self.monitor)
            return self._report()
        finally:
            self.shutdown()
            self.admin.close()
            self.monitor.close()

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
        """The loop: observe (task states, the master's progress), recover what died,
        carry out the injections that are due, ask the Controller, until the chief
        finished."""
        cfg = self.cfg
        # a master's own kill is the submitter's to carry out (it runs the master);
        # injections done before a master restart are not done again
        pending = sorted((j for j in cfg.injections
                          if j.job != "master" and str(j) not in self.injected),
                         key=lambda j: (j.percent, j.at))
        progress = self._progress = JobProgress(self, admin, monitor)
        deadline = time.monotonic() + cfg.timeout_seconds
        last_listed = last_decided = 0.0
        try:
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the job did not finish within {cfg.timeout_seconds:g}s")
                self._note_training_started(progress)
                self._inject_due(pending, progress)
                # the agents' task lists (exits) and the master's progress cost the job
                # CPU: every LIST_EVERY (the JCT comes from the master's own journal
                # times, not from this polling)
                if time.monotonic() - last_listed >= LIST_EVERY:
                    last_listed = time.monotonic()
                    if self._chief_finished_or_recover(progress):
                        return
                records = progress.update()
                if self.finished_at is None and progress.finished:
                    self.finished_at = time.monotonic()
                now = time.monotonic()
                self.pending_faults = [f for f in self.pending_faults
                                       if not f.observe(now, records)]
                if (self.train_t0 is not None and not progress.finished
                        and now - last_decided >= cfg.controller_interval_seconds):
                    last_decided = now
                    self._control(monitor, records)
                time.sleep(TICK)
        finally:
            self._progress = None

    def _note_training_started(self, progress) -> None:
        """The first shard leased starts the injection clock (and the JCT)."""
        if self.train_t0 is None and progress.started:
            self.train_t0 = time.monotonic()
            self.train_started_unix = time.time()
            self.on_event and self.on_event(None)     # save the clock
            self.startup_seconds = self.train_t0 - self.t0
            self._event("training started (first shard leased); injection clock starts")

    def _chief_finished_or_recover(self, progress) -> bool:
        """True when the chief finished; else every task that is not running is
        recovered (the chief last: it needs the others' addresses)."""
        from antdt_tf.backends import TaskState

        cfg = self.cfg
        statuses = self._statuses()
        chief = statuses.get(("worker", 0) if cfg.tf1 else ("chief", 0))
        if chief is not None and chief.state is TaskState.SUCCEEDED:
            progress.update(final=True)
            self._event("chief finished" if cfg.tf1 else "coordinator finished")
            return True
        for key, status in sorted(statuses.items(),
                                  key=lambda kv: (kv[0][0] == "chief", kv[0])):
            if key[0] == "worker" and key[1] >= self.active_workers:
                continue    # a slot scaled away
            if cfg.tf1 and key[0] == "worker" and status.state is TaskState.SUCCEEDED:
                continue    # a TF1 trainer that finished its data
            if not status.running:
                self._recover(key, status, statuses)
        return False

    def _statuses(self) -> dict:
        """The current launch of every task, as the backend reports it."""
        self.backend.tasks()      # one refresh from the agents
        return {key: info for key, name in self.current.items()
                if (info := self.backend.launch_info(name)) is not None}

    def _report(self) -> dict:
        """Gathers what the report needs from the master and the backend, once."""
        import json

        import psutil

        progress = self._master_progress()
        # the chief's summary (a job's own program may write none)
        path = self.coordinator_report_path
        coordinator = json.loads(path.read_text()) if path.exists() else {}
        for fault in self.pending_faults:
            fault.close()
        cpu = {}   # CPU seconds of every process of the job (latest incarnation of each task)
        try:
            for (job, index), st in sorted(self._statuses().items()):
                cpu[f"{job}:{index}"] = round(st.cpu_seconds, 2)
            t = psutil.Process().cpu_times()
            cpu["master"] = round(t.user + t.system, 2)
        except (AntdtError, psutil.Error):
            pass
        return build_report(self, progress=progress, coordinator=coordinator,
                            cpu_seconds=cpu, now=time.monotonic())

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
        self.backend.release_all()      # Ray, Kubernetes: nothing of the job outlives it
        self.backend.close()
