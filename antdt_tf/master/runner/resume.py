"""Resume: a master restarted on its state dir carries on the job it ran. Part of
:class:`~antdt_tf.master.runner.JobRunner`: :meth:`Resume.saved_state` is what the
master saves on every event (``job_state.json``), :meth:`Resume._adopt` what a new
runner does with it."""

from __future__ import annotations

import time


class Resume:
    """The runner's state across a master restart."""

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
        published = self.monitor.job_cluster()    # survives in the master's state dir
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
