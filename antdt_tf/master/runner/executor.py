"""Carrying out the Controller's actions (and the injected faults) for the runner.

Each action is an ``ActionRun`` (``antdt_tf.controller.execution``) that the loop
follows round by round: a relaunched worker or a replaced PS first stands by on its new
host (TF imported, address taken over when the old process goes), then the chief comes
back with the new cluster where an address changed, and the action is done when the
moved task works again. Part of :class:`~antdt_tf.master.runner.JobRunner`: it reads and
changes the runner's record (placement, spec, actions, costs, batch sizes).
"""

from __future__ import annotations

import time

from antdt_tf.agent.inject import Injection
from antdt_tf.errors import AntdtError, InvalidRequest


class ActionExecutor:
    """The Controller's round and every action it starts, followed to its end."""

    def _control(self, monitor, records: int) -> None:  # noqa: C901 (one round, in order)
        """One controller round: follow the actions in flight, then ask the policy."""
        from antdt_tf.controller import Observation, TaskView
        from antdt_tf.monitor.view import straggler_class_name

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
        views = [TaskView(h.task.job, h.task.index, straggler_class_name(h.straggler_class),
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
            raise InvalidRequest(f"the job runner cannot carry out {kind}"
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
        sizes = dict(action.sizes)
        self.admin.set_batch_sizes("train", sizes, replace=True)
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

    # ------------------------------------------------------------------ injections

    def _inject_due(self, pending: list, progress) -> None:
        """Carries out the injections that are due (by seconds since training started or
        by the share of records done); notes the slowdowns that ended."""
        now = time.monotonic() - (self.train_t0 or float("inf"))
        done_percent = 100.0 * progress.records / max(1, progress.total)
        for inj in list(pending):
            due = (self.train_t0 is not None and done_percent >= inj.at
                   if inj.percent else inj.at <= now)
            if due and self._inject(inj):     # False: deferred to a later round
                pending.remove(inj)
        for inj in [j for j in self.cfg.injections if j.kind == "slow" and j.until
                    and j.until <= now and str(j) not in self.ended_slowdowns]:
            self.ended_slowdowns.append(str(inj))
            self._event(f"slowdown of {inj.task} ended")

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
