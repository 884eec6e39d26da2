"""The job's hosts, addresses and launches. Part of
:class:`~antdt_tf.master.runner.JobRunner`: the hosts come from the backend (agents that
registered, Ray nodes, Kubernetes nodes), every task gets an address on its host (local:
the one the submitter reserved), and each launch is a new generation of a task
(``TaskName``), so that a restarted master can tell what runs."""

from __future__ import annotations

import time
from typing import Optional

from antdt_tf.job.spec import place, skips_refused_leases
from antdt_tf.master.runner.taskspecs import TaskContext, task_args


class TaskLaunching:
    """Hosts, placement and launches of the job's tasks."""

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
            self.backend = AgentsBackend(MasterRendezvous(self.monitor),
                                         host_timeout=cfg.host_timeout_seconds)
        else:
            directory = MasterRendezvous(self.monitor)
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

        from antdt_tf.backends.ray import DEFAULT_TASK_PORTS, RayBackend
        from antdt_tf.job.spec import task_port_range

        cfg = self.cfg
        return RayBackend(
            cfg.ray_namespace, os.environ.get("RAY_ADDRESS", "auto"),
            log_dir=str(cfg.workdir / "ray"),
            job_roots=tuple(str(r) for r in (cfg.workdir, cfg.checkpoint_dir) if r),
            read_roots=cfg.read_roots, estimator_python=cfg.estimator_python,
            program_roots=cfg.program_roots,
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
        self.cluster_version += 1
        self.monitor.set_job_cluster(self.cluster_version, dict(
            self.spec, worker=self.spec["worker"][:self.active_workers]))

    def _register_dataset(self) -> None:
        """The job's data, served as the policy wants it (idempotent for one spec)."""
        from antdt_tf.controller import PolicyTraits
        from antdt_tf.sharding.plan import DataFile, DatasetSpec

        traits = PolicyTraits.of(self.policy)
        # PullTrainer and the TF1 feed skip the batches of a lease whose report was
        # refused (Keras and BSP do not): only they may have leases stolen or backed up
        skips = skips_refused_leases(self.cfg)
        self.admin.register_dataset(DatasetSpec(
            "train", records_per_shard=self.cfg.records_per_shard,
            num_epochs=self.cfg.epochs, shuffle=self.cfg.shuffle, seed=self.cfg.data_seed,
            files=(tuple(DataFile(p, n) for p, n in self.cfg.files)
                   or (DataFile(self.cfg.data, self.num_records),)),
            static_workers=self.cfg.num_workers if traits.sharding == "static" else 0,
            tail_stealing=traits.tail_stealing and skips,
            backup_leases=traits.backup_leases and skips))
