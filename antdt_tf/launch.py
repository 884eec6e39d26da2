"""antdt-launch: run a whole antdt-tf training job on this machine, with real processes.

Usage::

    antdt-launch --num_ps=2 --num_workers=3 --generate_records=200000 --audit \\
        --inject=slow:worker:2:x3@5s-40s --inject=kill:worker:1@30s --report_json=r.json

It starts one ``antdt-agent`` per simulated host (the local ``ClusterBackend``,
``antdt_tf.backends.local``) and, through that backend, the master
(``antdt-master`` with a state dir), the PS and worker ``tf.distribute.Server`` tasks and
the coordinator (``antdt-coordinator``). Every process change — start, kill, relaunch,
slowdown — is a request to the agent that owns the task. While the job runs it shows a
progress line (records, shards, records/s, ETA, each worker's share) and supervises:

- a worker that died is restarted on its address; TensorFlow re-joins it and re-runs its
  closure (the slot progress on the PS resumes the shard after its applied batches);
- a PS that died is restarted; the coordinator, which cannot continue without it, exits
  75 and is relaunched, restoring model and sharding state from the last shard-boundary
  checkpoint;
- a coordinator that died is relaunched (same restore);
- a master that died is restarted on its state dir.

At the end it prints a summary table and writes a JSON report (``--report_json``): JCT,
records/s, shards and records per worker, failures and recoveries, AUC, audit counts.
Exit code 0 when the job finished (and, with ``--audit``, every record was applied the
expected number of times up to one batch per injected failure), 1 otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import signal
import sys
import tempfile
import time
from typing import Optional

from absl import app, flags

from antdt_tf.agent.inject import Injection, parse_injection
from antdt_tf.errors import AntdtError, InvalidRequest

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_ps", 2, "Parameter server tasks.")
flags.DEFINE_integer("num_workers", 3, "Worker tasks at the start.")
flags.DEFINE_integer("max_workers", 0, "Worker slots the job may scale out to (pull data "
                     "path); 0 = --num_workers.")
flags.DEFINE_integer("num_hosts", 0, "Simulated hosts (one agent each); tasks are placed "
                     "round-robin. 0: one host per worker. --backend=agents: wait until "
                     "this many hosts registered with the master (0: 1).")
flags.DEFINE_enum("backend", "local", ["local", "agents"], "Where the tasks run: local = "
                  "simulated hosts on this machine (an agent each, on loopback; the launcher "
                  "starts the master); agents = the real hosts whose antdt-agent registered "
                  "with the running master at --master (see docs/backends.md).")
flags.DEFINE_string("master", "", "--backend=agents: host:port of the running antdt-master "
                    "the hosts' agents report to. Every process needs the job's token "
                    "($ANTDT_JOB_TOKEN) when it listens beyond loopback.")
flags.DEFINE_float("host_timeout_seconds", 10.0, "--backend=agents: a host whose agent was "
                   "not heard from for this long is lost; its tasks are relaunched on the "
                   "others.")
flags.DEFINE_enum("model", "deepfm", ["deepfm"], "The model to train.")
flags.DEFINE_enum("api", "custom_loop", ["custom_loop", "keras", "mts", "estimator"],
                  "How the job trains: custom_loop = antdt-coordinator (ClusterCoordinator "
                  "loop); keras = antdt-keras-trainer (tf-keras model.fit with the antdt "
                  "callback); TF1 between-graph, every worker a trainer (worker 0 the chief) "
                  "with the antdt SessionRunHooks: mts = MonitoredTrainingSession on this "
                  "TensorFlow, estimator = tf.estimator train_and_evaluate on TF 2.15 "
                  "(--estimator_python).")
flags.DEFINE_string("estimator_python", "", "--api=estimator: the TF 2.15 venv's Python "
                    "(default: .venv-tf215/bin/python of this source tree; make venv-tf215).")
flags.DEFINE_enum("mode", "async", ["async", "bsp"], "custom_loop + pull: async = every "
                  "worker applies its own steps (PSS's default); bsp = synchronous rounds, "
                  "one batch per worker applied together (stragglers then slow every "
                  "round: the presets adjust per-worker batch sizes, ADJUST_BS).")
flags.DEFINE_enum("data_path", "pull", ["pull", "closure"], "custom_loop only: pull = "
                  "workers lease shards from the master in their tf.data pipeline; closure = "
                  "the coordinator schedules one closure per shard.")
flags.DEFINE_float("checkpoint_every_seconds", 10.0, "Checkpoint this often (pull and keras).")
flags.DEFINE_string("data", "", "Training records (.adtr, see antdt-data). Empty: generate "
                    "--generate_records synthetic Criteo-format records into the workdir.")
flags.DEFINE_string("eval_data", "", "Held-out records for the final AUC (with --data).")
flags.DEFINE_integer("generate_records", 200_000, "Records to generate when --data is empty.")
flags.DEFINE_integer("eval_records", 20_000, "Held-out records to generate for the AUC.")
flags.DEFINE_integer("data_seed", 1, "Seed of the generated data.")
flags.DEFINE_integer("epochs", 1, "Epochs over the data.")
flags.DEFINE_integer("batch_size", 256, "Records per training step.")
flags.DEFINE_integer("records_per_shard", 2048, "Records per shard.")
flags.DEFINE_boolean("shuffle", True, "Shuffle the shard order of every epoch.")
flags.DEFINE_integer("buckets", 1 << 16, "Hash buckets of each embedding table.")
flags.DEFINE_float("learning_rate", 0.2, "SGD learning rate.")
flags.DEFINE_string("checkpoint_dir", "", "Shard-boundary checkpoints (default: "
                    "<workdir>/checkpoints).")
flags.DEFINE_integer("checkpoint_every_shards", 16, "Checkpoint after this many DONE shards.")
flags.DEFINE_string("report_json", "", "Write the job report here.")
flags.DEFINE_boolean("audit", False, "Count per record how often it was applied; the report "
                     "gives the records applied 0, 1 and 2+ times.")
flags.DEFINE_multi_string("inject", [], "Fault/straggler injection, repeatable: "
                          "kill:worker:1@30s, kill:ps:0@60s, kill:coordinator@45s, "
                          "kill:master@20s, slow:worker:2:x4@10s[-70s], slow:ps:0:x3@5s.")
flags.DEFINE_string("workdir", "", "Job directory (data, state, logs). Default: a new temp dir.")
flags.DEFINE_float("timeout_seconds", 1800, "Give up (exit 1) after this long.")
flags.DEFINE_integer("max_restarts", 5, "Restarts allowed per task before the job fails.")
flags.DEFINE_boolean("progress", True, "Show the live progress line.")
flags.DEFINE_string("policy", "antdt-nd", "Controller policy: static (static data sharding, "
                    "no action: the baseline), dynamic (dynamic sharding only, no action), "
                    "backup (dynamic sharding + speculative duplicates of slow workers' "
                    "leases: the backup-workers baseline), antdt-nd (non-dedicated clusters), antdt-dd (dedicated "
                    "clusters), or module:Class for your own (see antdt_tf.controller.policy).")
flags.DEFINE_float("controller_interval_seconds", 1.0, "How often the policy is asked.")
flags.DEFINE_float("straggler_window_seconds", 10.0, "Monitor window (see antdt-master).")
flags.DEFINE_float("straggler_slow_ratio", 1.5, "Monitor: slow = this many times slower than "
                   "the median worker / the fastest PS.")
flags.DEFINE_float("straggler_persistent_after_seconds", 30.0, "Monitor: slow episodes "
                   "longer than this are persistent (or deterministic).")
flags.DEFINE_float("relaunch_cost_seconds", 15.0, "Cost model: first estimate of a worker "
                   "relaunch (replaced by the measured time after the first one).")
flags.DEFINE_float("replace_ps_cost_seconds", 30.0, "Cost model: first estimate of the pause "
                   "a PS replacement costs (replaced by the measured pause).")
flags.DEFINE_float("min_gain_seconds", 2.0, "Cost model: act only when the job is expected "
                   "to finish at least this much sooner.")

log = logging.getLogger("antdt.launch")
EXIT_CLUSTER_UNAVAILABLE = 75   # the coordinator's "relaunch me" (see antdt_tf.tf.coordinator)


TF1_APIS = ("mts", "estimator")
TF1_PROGRAM = {"mts": "antdt-mts-worker", "estimator": "antdt-estimator-task"}
SOURCE_ROOT = pathlib.Path(__file__).resolve().parent.parent


@dataclasses.dataclass
class JobConfig:
    num_ps: int
    num_workers: int
    num_hosts: int
    data: str
    eval_data: str
    epochs: int
    batch_size: int
    records_per_shard: int
    shuffle: bool
    buckets: int
    checkpoint_dir: str
    learning_rate: float
    checkpoint_every_shards: int
    audit: bool
    workdir: pathlib.Path
    injections: tuple[Injection, ...] = ()
    timeout_seconds: float = 1800
    max_restarts: int = 5
    progress: bool = True
    data_seed: int = 1
    api: str = "custom_loop"
    data_path: str = "pull"
    checkpoint_every_seconds: float = 10.0
    policy: str = "antdt-nd"
    controller_interval_seconds: float = 1.0
    straggler_window_seconds: float = 10.0
    straggler_slow_ratio: float = 1.5
    straggler_persistent_after_seconds: float = 30.0
    relaunch_cost_seconds: float = 15.0
    replace_ps_cost_seconds: float = 30.0
    min_gain_seconds: float = 2.0
    max_workers: int = 0
    mode: str = "async"
    estimator_python: str = ""
    backend: str = "local"
    master: str = ""
    host_timeout_seconds: float = 10.0

    @property
    def agents(self) -> bool:
        """Real hosts through a running master (no master task of our own)."""
        return self.backend == "agents"

    @property
    def tf1(self) -> bool:
        """TF1 between-graph: every worker trains (worker 0 is the chief); no coordinator."""
        return self.api in TF1_APIS


def skips_refused_leases(cfg) -> bool:
    """Whether the job's trainer stops applying a lease's batches once a report about it
    was refused (needed for tail stealing and backup leases): PullTrainer in async mode
    and the TF1 feed do; Keras and BSP rounds do not. ``cfg``: JobConfig or FLAGS."""
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


def generate_data(workdir: pathlib.Path, train: int, held_out: int, seed: int):
    """Writes ``train`` + ``held_out`` records of one synthetic dataset (one hidden model)
    as two record files. Returns their paths."""
    from antdt_tf.data import criteo, records

    data_dir = workdir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    spec = criteo.SyntheticSpec(train + held_out, seed=seed)

    def part(lo: int, hi: int):
        first = 0
        for b in criteo.generate(spec):
            a, z = max(lo - first, 0), min(hi - first, len(b))
            if a < z:
                yield criteo.Batch(b.label[a:z], b.dense[a:z], b.sparse[a:z])
            first += len(b)

    paths = data_dir / "train.adtr", data_dir / "eval.adtr"
    records.write_records(paths[0], part(0, train))
    if held_out:
        records.write_records(paths[1], part(train, train + held_out))
    return str(paths[0]), str(paths[1]) if held_out else ""


class LocalJob:
    """One job: agents, master, PS, workers, coordinator, and the supervision loop."""

    def __init__(self, cfg: JobConfig):
        from antdt_tf.data.records import RecordFile
        from antdt_tf.tf.local_cluster import free_ports

        self.cfg = cfg
        self.num_records = RecordFile(cfg.data).num_records
        slots = max(cfg.max_workers, cfg.num_workers)
        if cfg.agents:
            # addresses come from the hosts' port ranges once the hosts are known
            self.master_address = cfg.master
            self.spec = {"chief": [""], "ps": [""] * cfg.num_ps, "worker": [""] * slots}
            self.host_names: list[str] = []
        else:
            ports = free_ports(2 + cfg.num_ps + slots)
            self.master_address = f"127.0.0.1:{ports[0]}"
            self.spec = {"chief": [f"127.0.0.1:{ports[1]}"],
                         "ps": [f"127.0.0.1:{p}" for p in ports[2:2 + cfg.num_ps]],
                         "worker": [f"127.0.0.1:{p}" for p in ports[2 + cfg.num_ps:]]}
            self.host_names = [f"host{h}" for h in range(cfg.num_hosts)]
        self.placement = place(cfg.num_ps, slots, cfg.num_hosts)
        self.active_workers = cfg.num_workers   # workers 0..n-1 train; the rest are spare slots
        self.backend = None               # the LocalBackend: one agent per simulated host
        self.issued: dict[tuple[str, int], int] = {}   # the last generation launched, per task
        self.current: dict[tuple[str, int], object] = {}   # the TaskName that serves, per task
        self.events: list[dict] = []
        self.t0 = time.monotonic()        # coordinator first started
        self.train_t0: Optional[float] = None   # first shard leased: the injection clock
        self.finished_at: Optional[float] = None  # the master first said every epoch done
        self.startup_seconds = 0.0
        self.train_started_unix = 0.0
        self.restarts: dict[tuple[str, int], int] = {}
        self.pending_faults: list[dict] = []  # failures waiting for training to resume
        self.coordinator_report_path = cfg.workdir / "coordinator_report.json"
        self._progress: Optional[_ProgressLine] = None
        from antdt_tf.controller import CostModel, load_policy

        self.policy = load_policy(cfg.policy)
        self.costs = CostModel(relaunch_worker_seconds=cfg.relaunch_cost_seconds,
                               replace_ps_seconds=cfg.replace_ps_cost_seconds,
                               min_gain_seconds=cfg.min_gain_seconds,
                               redo_seconds=cfg.checkpoint_every_seconds / 2)
        self.actions: list[dict] = []      # what the controller did, with outcomes
        self.standby_count = 0
        self.best_rate = 0.0     # the job's best records/s (every worker judged) so far
        self.batch_sizes: dict[int, int] = {}   # ADJUST_BS sizes in force (worker -> size)
        self.health: list = []             # the Monitor's latest TaskHealth list
        self.trainer_records: list[int] = []   # records per worker, the chief's latest report
        # [seconds since training started, records of worker 0, 1, ...] every 0.5 s
        self.timeline: list[list] = []

    # ------------------------------------------------------------------ processes

    def _event(self, what: str, **extra) -> dict:
        ev = {"t": round(time.monotonic() - self.t0, 2), "event": what, **extra}
        self.events.append(ev)
        line = f"[{ev['t']:6.1f}s] {what}"
        if self._progress is not None:
            self._progress.write(line)
        else:
            print(line, file=sys.stderr, flush=True)
        return ev

    def _start_agents(self) -> None:
        if self.cfg.agents:
            self._join_hosts()
            return
        from antdt_tf.backends.local import LocalBackend

        self.backend = LocalBackend(self.cfg.num_hosts, self.cfg.workdir,
                                    estimator_python=self.cfg.estimator_python,
                                    master=self.master_address)
        ports = {("master", 0): int(self.master_address.rsplit(":", 1)[1])}
        for job in ("chief", "ps", "worker"):
            for i, address in enumerate(self.spec[job]):
                ports[job, i] = int(address.rsplit(":", 1)[1])
        self.backend.reserve_endpoints(ports)

    def _join_hosts(self) -> None:
        """--backend=agents: the hosts whose agents report to the master; every task
        gets an address on its host."""
        from antdt_tf.backends.agents import AgentsBackend, MasterRendezvous

        cfg = self.cfg
        self.backend = AgentsBackend(MasterRendezvous(self.master_address),
                                     host_timeout=cfg.host_timeout_seconds)
        want = max(1, cfg.num_hosts)
        deadline = time.monotonic() + 120
        while len(hosts := self.backend.hosts()) < want:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(hosts)} of {want} hosts registered with the "
                                   f"master at {self.master_address} within 120 s "
                                   "(start antdt-agent --master=... on each host)")
            time.sleep(0.5)
        self.host_names = sorted(h.name for h in hosts)
        self.placement = place(cfg.num_ps, len(self.spec["worker"]), len(self.host_names))
        del self.placement["master", 0]     # the running master is not ours to start
        for (job, index), h in self.placement.items():
            self.spec[job][index] = self.backend.endpoint(job, index, self.host_names[h])
        self._event(f"{len(self.host_names)} host(s) registered: "
                    + ", ".join(f"{n} ({h.address})" for n, h in
                                sorted((h.name, h) for h in hosts)))

    def host_name(self, host: int) -> str:
        return self.host_names[host]

    def live_hosts(self) -> list[int]:
        """Indices of the hosts that are not lost."""
        live = {h.name for h in self.backend.hosts()}
        return [i for i, n in enumerate(self.host_names) if n in live]

    def task_name(self, job: str, index: int):
        """The launch of ``job:index`` that serves (a standby waiting to take over is a
        newer generation, not yet current)."""
        return self.current[job, index]

    def stop_task(self, job: str, index: int, kill: bool = False, grace_seconds: float = 10.0):
        """Stops the task's current launch (no other generation is touched)."""
        return self.backend.stop(self.task_name(job, index), kill=kill,
                                 grace_seconds=grace_seconds)

    def _task_args(self, job: str, index: int) -> tuple[str, list[str]]:
        cfg = self.cfg
        if job == "master":
            return "antdt-master", [
                f"--port={self.master_address.rsplit(':', 1)[1]}",
                f"--state_dir={cfg.workdir / 'master'}",
                f"--straggler_window_seconds={cfg.straggler_window_seconds}",
                f"--straggler_slow_ratio={cfg.straggler_slow_ratio}",
                f"--straggler_persistent_after_seconds={cfg.straggler_persistent_after_seconds}"]
        if cfg.tf1:
            return self._tf1_task_args(job, index)
        if job in ("ps", "worker"):   # servers know every worker slot
            return "antdt-tf-server", [f"--cluster={json.dumps(self.spec)}", f"--job={job}",
                                       f"--index={index}"]
        # the chief uses the active workers, a prefix of the slots (a task index means
        # the same task to the chief and to the server)
        cluster = json.dumps(dict(self.spec, worker=self.spec["worker"][:self.active_workers]))
        args = [f"--cluster={cluster}", f"--master={self.master_address}", "--dataset=train",
                f"--batch_size={cfg.batch_size}", f"--buckets={cfg.buckets}",
                f"--learning_rate={cfg.learning_rate}",
                f"--report_json={self.coordinator_report_path}",
                f"--checkpoint_dir={cfg.checkpoint_dir}",
                f"--checkpoint_every_seconds={cfg.checkpoint_every_seconds}"]
        if cfg.api == "custom_loop":
            args += [f"--checkpoint_every_shards={cfg.checkpoint_every_shards}",
                     f"--data_path={cfg.data_path}"]
            args.append(f"--tensorboard_dir={cfg.workdir / 'tensorboard'}")
            if cfg.data_path == "pull":
                args.append(f"--worker_slots={len(self.spec['worker'])}")
                args.append(f"--mode={cfg.mode}")
        if cfg.eval_data:
            args.append(f"--eval_data={cfg.eval_data}")
        if cfg.audit:
            args.append("--audit")
        return ("antdt-keras-trainer" if cfg.api == "keras" else "antdt-coordinator"), args

    def _tf1_task_args(self, job: str, index: int) -> tuple[str, list[str]]:
        """TF1 between-graph: PS servers, and one trainer per worker (worker 0 the chief,
        which also writes the report); the master's worker i is the launcher's."""
        cfg = self.cfg
        workers = self.spec["worker"][:self.active_workers]
        if cfg.api == "mts":
            cluster = {"ps": self.spec["ps"], "worker": workers}
            if job == "ps":
                return "antdt-tf-server", [f"--cluster={json.dumps(cluster)}", "--job=ps",
                                           f"--index={index}"]
            args = [f"--cluster={json.dumps(cluster)}", f"--task_index={index}",
                    f"--checkpoint_dir={cfg.checkpoint_dir}"]
        else:
            args = [f"--model_dir={cfg.checkpoint_dir}"]
        args += [f"--master={self.master_address}", "--dataset=train", f"--data={cfg.data}",
                 "--noregister", f"--batch_size={cfg.batch_size}", f"--buckets={cfg.buckets}",
                 f"--learning_rate={cfg.learning_rate}",
                 f"--save_secs={max(1, round(cfg.checkpoint_every_seconds))}",
                 f"--report_json={self.coordinator_report_path}"]
        if cfg.audit:
            args.append("--audit")
        if cfg.eval_data and index == 0 and job == "worker":
            args.append(f"--eval_data={cfg.eval_data}")
        return TF1_PROGRAM[cfg.api], args

    def _task_env(self, job: str, index: int) -> dict:
        """tf.estimator reads its task from TF_CONFIG: worker 0 is its chief, worker i
        its worker:i-1; the TF 2.15 venv runs this source tree."""
        if self.cfg.api != "estimator" or job not in ("ps", "worker"):
            return {}
        workers = self.spec["worker"][:self.active_workers]
        cluster = {"chief": workers[:1], "worker": workers[1:], "ps": self.spec["ps"]}
        task = ({"type": "ps", "index": index} if job == "ps" else
                {"type": "chief", "index": 0} if index == 0 else
                {"type": "worker", "index": index - 1})
        return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task}),
                "PYTHONPATH": str(SOURCE_ROOT)}

    def start_task(self, job: str, index: int, host: Optional[int] = None,
                   extra_args: tuple[str, ...] = (), standby: bool = False):
        """Launches the task's next generation on its host (or ``host``). ``standby``:
        the current launch keeps running until the new one takes over its address."""
        from antdt_tf.backends import TaskName, TaskSpec

        where = self.placement[job, index] if host is None else host
        endpoint = self.backend.endpoint(job, index, self.host_name(where))
        if job in self.spec and not standby:
            self.spec[job][index] = endpoint     # a task on another host: a new address
        program, args = self._task_args(job, index)
        if job in self.spec and standby and endpoint != self.spec[job][index]:
            # a standby on another host's address: its own cluster entry says so
            args = self._with_own_address(args, job, index, endpoint)
        generation = self.issued.get((job, index), 0) + 1
        name = TaskName(job, index, generation)
        spec = TaskSpec(name, program, tuple(args) + tuple(extra_args),
                        env=tuple(sorted(self._task_env(job, index).items())),
                        endpoint=endpoint)
        self.issued[job, index] = generation
        info = self.backend.launch(spec, self.host_name(where), allow_overlap=standby)
        self.current[job, index] = name
        return info

    def _with_own_address(self, args: list[str], job: str, index: int,
                          endpoint: str) -> list[str]:
        spec = {k: list(v) for k, v in self.spec.items()}
        spec[job][index] = endpoint
        return [f"--cluster={json.dumps(spec)}" if a.startswith("--cluster=") else a
                for a in args]

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
            self._start_agents()
            if not self.cfg.agents:
                self.start_task("master", 0)
            self._register_dataset()
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
            with ShardingClient(self.master_address, timeout=10) as admin, \
                    MonitorClient(self.master_address) as monitor:
                self._supervise(admin, monitor)
            return self._report()
        finally:
            self.shutdown()

    def _supervise(self, admin, monitor) -> None:
        from antdt_tf.backends import TaskState

        cfg = self.cfg
        pending = sorted(cfg.injections, key=lambda j: (j.percent, j.at))
        ended_slowdowns: list[Injection] = []
        progress = self._progress = _ProgressLine(self, admin, monitor, enabled=cfg.progress)
        deadline = time.monotonic() + cfg.timeout_seconds
        last_listed = last_decided = 0.0
        try:
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the job did not finish within {cfg.timeout_seconds:g}s")
                if self.train_t0 is None and progress.started:
                    self.train_t0 = time.monotonic()
                    self.train_started_unix = time.time()
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
                for fault in [f for f in self.pending_faults if records > f["records_before"]]:
                    fault["resumed_after_s"] = round(time.monotonic() - self.t0 - fault["t"], 2)
                    self.pending_faults.remove(fault)
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
        for act in [a for a in self.actions if "_pending" in a]:
            self._follow(act, records, now)
        if any("_pending" in a for a in self.actions):
            return     # one disruptive action at a time
        name = {v: k.lower() for k, v in cpb.TaskHealth.StragglerClass.items()}
        views = [TaskView(h.task.job, h.task.index,
                          name.get(h.straggler_class, "unknown").replace(
                              "straggler_class_unspecified", "unknown"),
                          h.slowness, h.records_per_second, h.step_seconds, h.latency_ms,
                          h.samples) for h in status.health]
        cooldown = self.cfg.straggler_window_seconds
        busy = frozenset((a["job"], a["index"]) for a in self.actions
                         if now - a.get("_done_at", now) < cooldown)
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
        """The least loaded host other than the task's own."""
        load = [0] * len(self.host_names)
        for (j, _), h in self.placement.items():
            if j in ("ps", "worker"):
                load[h] += 1
        here = self.placement[job, index]
        live = self.live_hosts()
        candidates = [h for h in live if h != here] or live or [here]
        return min(candidates, key=lambda h: (load[h], h))

    def _execute(self, action, records: int, status) -> None:
        """Starts an action: the new process first imports TF on the other host and
        stands by (``antdt-tf-server --standby_file``); :meth:`_follow` then kills the
        old one, and the new one binds the address within milliseconds."""
        from antdt_tf.controller import AdjustBatchSizes, RelaunchWorker, ReplacePs, ScaleWorkers

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
                        extra_args=(f"--standby_file={ready}",) if stable else ())
        old = [h.incarnation for h in status.health
               if h.task.job == job and h.task.index == index]
        self.actions.append({
            "t": ev["t"], "action": kind, "job": job, "index": index, "reason": action.reason,
            "from_host": src, "to_host": dst, "_pending": True, "_phase": "standby",
            "_ready": ready, "_t0": time.monotonic(), "_old_incarnation": old[0] if old else -1,
            "_old_launch": old_launch,
            "_endpoint": self.backend.endpoint(job, index, self.host_name(dst)),
            "_chief_restarts": self.restarts.get(("chief", 0), 0)})

    def _adjust_batch_sizes(self, action) -> None:
        """ADJUST_BS: the master hands the sizes out with each worker's next lease."""
        from antdt_tf.sharding.client import ShardingClient

        sizes = dict(action.sizes)
        with ShardingClient(self.master_address, timeout=10) as admin:
            admin.set_batch_sizes("train", sizes, replace=True)
        self.batch_sizes = sizes
        ev = self._event(f"controller ({self.policy.name}): AdjustBatchSizes "
                         f"{sizes}: {action.reason}", action="AdjustBatchSizes")
        self.actions.append({"t": ev["t"], "action": "AdjustBatchSizes", "job": "chief",
                             "index": 0, "reason": action.reason,
                             "batch_sizes": {str(w): b for w, b in sizes.items()},
                             "_done_at": time.monotonic()})

    def _scale(self, action) -> None:
        """Scale out: the new workers stand by first (:meth:`_follow` switches when all
        are ready). Scale in: switch at once."""
        n, slots = action.num_workers, len(self.spec["worker"])
        if not 1 <= n <= slots or n == self.active_workers:
            self._event(f"controller: ScaleWorkers to {n} ignored (slots: {slots}, "
                        f"running: {self.active_workers})")
            return
        ev = self._event(f"controller ({self.policy.name}): ScaleWorkers "
                         f"{self.active_workers} -> {n} workers: {action.reason}",
                         action="ScaleWorkers")
        act = {"t": ev["t"], "action": "ScaleWorkers", "job": "chief", "index": 0,
               "reason": action.reason, "from_workers": self.active_workers, "to_workers": n,
               "_pending": True, "_phase": "standby", "_t0": time.monotonic(), "_ready": []}
        for i in range(self.active_workers, n):
            self.standby_count += 1
            ready = self.cfg.workdir / f"standby-worker{i}-{self.standby_count}"
            self.start_task("worker", i, extra_args=(f"--standby_file={ready}",))
            act["_ready"].append(ready)
        self.actions.append(act)
        if n < self.active_workers:
            self._switch_scale(act)

    def _switch_scale(self, act: dict) -> None:
        """The chief goes (killed: the last checkpoint holds model and sharding state)
        and comes back with the new worker set, restoring; workers scaled away stop."""
        old, n = act["from_workers"], act["to_workers"]
        if act.pop("_hold", False):
            self._hold_data(False)
        act["records_per_worker_before"] = list(self.trainer_records)
        self.stop_task("chief", 0, kill=True)
        self.active_workers = n
        for i in range(n, old):
            self.stop_task("worker", i, grace_seconds=2)
            self._release_leases_of(i)
        self.start_task("chief", 0)
        act["_phase"] = "recovering"
        act["standby_seconds"] = round(time.monotonic() - act["_t0"], 2)
        act["_t0"] = time.monotonic()
        act["_chief_restarted"] = True

    def _standby_ready(self, act: dict) -> bool:
        """A standby on a shared address wrote its ready file; one on its own address
        serves it (the TF server bound its port)."""
        if self.backend.capabilities.stable_endpoints:
            return act["_ready"].exists()
        import socket

        host, port = act["_endpoint"].rsplit(":", 1)
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=0.5):
                return True
        except OSError:
            return False

    def _switch_over(self, act: dict) -> None:
        """The standby is ready: the old process goes (a kill: a relaunched worker redoes
        at most its batch in flight; a PS's state is in the last checkpoint)."""
        job, index = act["job"], act["index"]
        moved = self.spec[job][index] != act["_endpoint"]
        self.spec[job][index] = act["_endpoint"]
        self.backend.stop(act["_old_launch"], kill=True)
        self.placement[job, index] = act["to_host"]
        if job == "worker":
            self._release_leases_of(index)
        if moved and job == "worker":
            # a new address is a cluster change: the chief goes and comes back with it,
            # restoring from the last checkpoint (a moved PS makes the chief exit 75)
            self._event(f"worker:{index} moved to {act['_endpoint']}: restarting the chief "
                        "with the new cluster")
            self.stop_task("chief", 0, kill=True)
        act["_phase"] = "recovering"
        act["standby_seconds"] = round(time.monotonic() - act["_t0"], 2)
        act["_t0"] = time.monotonic()     # the disruption starts now

    def _follow(self, act: dict, records: int, now: float) -> None:
        """Standby ready -> switch over; done when the moved task works again: a
        relaunched worker's new incarnation reports steps; after a PS replacement,
        records progress again (the chief restored the last checkpoint, so the count
        first drops back to it)."""
        job, index = act["job"], act["index"]
        if act["action"] == "ScaleWorkers":
            if act["_phase"] == "standby":
                if all(r.exists() for r in act["_ready"]):
                    self._switch_scale(act)
                elif now - act["_t0"] > 120:
                    self._event("controller: the new workers did not get ready; "
                                "ScaleWorkers abandoned")
                    for i in range(act["from_workers"], act["to_workers"]):
                        self.stop_task("worker", i, kill=True)
                    if act.pop("_hold", False):
                        self._hold_data(False)
                    act.pop("_pending")
                    act["_done_at"] = now
                    act["abandoned"] = True
                return
            act["_low"] = min(act.get("_low", records), records)
            if records > act["_low"]:
                # scale-out: done when every added worker trains (its steps reach the
                # Monitor), not only when the restarted chief trains again
                since = act.setdefault("_training_since", now)
                stepping = {h.task.index for h in self.health
                            if h.task.job == "worker" and h.samples > 0}
                added = range(act["from_workers"], act["to_workers"])
                if all(i in stepping for i in added) or now - since > 60:
                    self._done(act, now)
            return
        if act["_phase"] == "standby":
            if self._standby_ready(act):
                self._switch_over(act)
                return
            standby = self._statuses().get((job, index))
            if standby is None or not standby.running or now - act["_t0"] > 120:
                self._event(f"controller: the standby {job}:{index} on host{act['to_host']} "
                            f"did not get ready; {act['action']} abandoned")
                self.stop_task(job, index, kill=True)
                self.current[job, index] = act["_old_launch"]   # the old one serves on
                act.pop("_pending")
                act["_done_at"] = now
                act["abandoned"] = True
            return
        done = False
        if job == "worker":
            done = any(h.task.job == "worker" and h.task.index == index
                       and h.incarnation != act["_old_incarnation"] and h.samples > 0
                       for h in self.health)
        elif self.restarts.get(("chief", 0), 0) > act["_chief_restarts"]:
            act["_low"] = min(act.get("_low", records), records)
            done = records > act["_low"]
        if done:
            self._done(act, now)

    def _done(self, act: dict, now: float) -> None:
        seconds = now - act.pop("_t0")
        act.pop("_pending")
        act["_done_at"] = now
        act["recovered_after_s"] = round(seconds, 2)
        what = (f"to {act['to_workers']} workers" if act["action"] == "ScaleWorkers"
                else f"{act['job']}:{act['index']}")
        self._event(f"controller: {act['action']} {what} done; "
                    f"training again after {seconds:.1f}s")
        if act["action"] in ("RelaunchWorker", "ReplacePs"):
            done_of_kind = [a["recovered_after_s"] for a in self.actions
                            if a["action"] == act["action"] and "recovered_after_s" in a]
            mean = sum(done_of_kind) / len(done_of_kind)
            if act["action"] == "RelaunchWorker":
                self.costs.relaunch_worker_seconds = mean
            else:
                self.costs.replace_ps_seconds = mean

    def _inject(self, inj: Injection) -> bool:
        """Carries out an injection; False: not now (a scaling waits for the action
        still running)."""
        if inj.kind == "scale":
            from antdt_tf.controller import ScaleWorkers

            if any("_pending" in a for a in self.actions):
                return False
            self._execute(ScaleWorkers(num_workers=inj.index, reason=f"injected: {inj}"),
                          self._records_done(), None)
            act = self.actions[-1] if self.actions else {}
            if act.get("_phase") == "standby":
                # hold the data while the new workers start, so that a job which would
                # end first (a fast machine, a small job) still sees the action
                act["_hold"] = self._hold_data(True)
            return True
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
        ev = self._event(f"{name} {how}; restarting it (restart {n})", task=name,
                         failure=how)
        ev["records_before"] = self._records_done()
        self.pending_faults.append(ev)
        if job == "worker":
            self._release_leases_of(index)
        if self.placement[key] not in self.live_hosts():
            # its host is lost: another host, another address
            self.placement[key] = self._other_host(job, index)
            self._event(f"{name} moves to {self.host_name(self.placement[key])}")
        address = self.spec[job][index] if job in self.spec else ""
        self.start_task(job, index)
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
                            self._event(f"worker:{worker}'s {n} leased shard(s) back to TODO")
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
        for ev in self.events:
            ev.pop("records_before", None)
        import psutil

        cpu = {}   # CPU seconds of every process of the job (latest incarnation of each task)
        try:
            for (job, index), st in sorted(self._statuses().items()):
                cpu[f"{job}:{index}"] = round(st.cpu_seconds, 2)
            for h in range(cfg.num_hosts if not cfg.agents else 0):   # ours, local
                t = psutil.Process(self.backend.agent_pid(self.host_name(h))).cpu_times()
                cpu[f"agent:host{h}"] = round(t.user + t.system, 2)
            t = psutil.Process().cpu_times()
            cpu["launcher"] = round(t.user + t.system, 2)
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
            "actions": [{k: v for k, v in a.items() if not k.startswith("_")}
                        for a in self.actions],
            "health": [_health_dict(h) for h in self.health],
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
            # each kill (injected, or a relaunch's) may redo the one batch in flight
            faults = len([j for j in cfg.injections if j.kind == "kill"]) + len(
                [a for a in self.actions if a["action"] == "RelaunchWorker"])
            bound = faults * cfg.batch_size
            off = audit.get("applied_other", 0)
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
        """Stops every task (chief first, master last), then the agents."""
        if self.backend is None:
            return
        for job in ("chief", "worker", "ps", "master"):
            for (j, i) in [k for k in self.current if k[0] == job]:
                try:
                    self.stop_task(j, i, grace_seconds=5)
                except AntdtError:
                    pass
        if self.cfg.agents:
            self.backend.close()      # the hosts' agents are not ours to stop
        else:
            self.backend.shutdown()


def _health_dict(h) -> dict:
    from antdt_tf.proto import cluster_pb2 as cpb

    out = {"task": f"{h.task.job}:{h.task.index}",
           "class": cpb.TaskHealth.StragglerClass.Name(h.straggler_class).lower(),
           "slowness": round(h.slowness, 2), "samples": h.samples}
    if h.task.job == "worker":
        out.update(step_seconds=round(h.step_seconds, 4),
                   records_per_second=round(h.records_per_second, 1))
    else:
        out["latency_ms"] = round(h.latency_ms, 2)
    return out


def _slow_marks(health) -> dict[str, str]:
    """'worker:2' -> 'persistent x3.9' for every task the Monitor finds slow."""
    from antdt_tf.proto import cluster_pb2 as cpb

    slow = (cpb.TaskHealth.TRANSIENT, cpb.TaskHealth.PERSISTENT, cpb.TaskHealth.DETERMINISTIC)
    return {f"{h.task.job}:{h.task.index}":
            f"{cpb.TaskHealth.StragglerClass.Name(h.straggler_class).lower()} x{h.slowness:.1f}"
            for h in health if h.straggler_class in slow}


class _ProgressLine:
    """Records done / total, shards, records/s, ETA and each worker's share: a tqdm bar
    on a terminal, a plain line every ``plain_every`` seconds otherwise (logs, CI)."""

    def __init__(self, job: LocalJob, admin, monitor, enabled: bool, plain_every: float = 5.0):
        from tqdm import tqdm

        self.job, self.admin, self.monitor = job, admin, monitor
        self.total = job.num_records * job.cfg.epochs
        self.tty = enabled and sys.stderr.isatty()
        self.enabled = enabled
        self.bar = tqdm(total=self.total, unit="rec", unit_scale=True, dynamic_ncols=True,
                        disable=not self.tty, mininterval=0.5, file=sys.stderr,
                        desc="training")
        self.records = 0
        self.last = 0.0
        self.last_plain = 0.0
        self.plain_every = plain_every
        self.first_progress: Optional[tuple[float, int]] = None
        self.started = False
        self.finished = False

    def write(self, text: str) -> None:
        if self.tty:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def update(self, final: bool = False) -> int:
        if not final and time.monotonic() - self.last < 0.5:
            return self.records
        self.last = now = time.monotonic()
        try:
            full = self.admin.progress("train")
            p = full.datasets[0]
            status = self.monitor.status()
        except AntdtError:
            return self.records    # master restarting: keep the last numbers
        self.started = self.started or bool(p.doing_shards or p.done_shards or p.epoch
                                            or p.finished)
        self.finished = p.finished
        total_shards = p.shards_per_epoch * p.num_epochs
        shards = total_shards if p.finished else p.shards_per_epoch * p.epoch + p.done_shards
        per_worker = [w.records for w in status.trainer.workers] or [
            t.records_done for t in sorted((t for t in full.tasks if t.task.type == "worker"),
                                           key=lambda t: t.task.index)]
        total = sum(per_worker) or 1
        marks = _slow_marks(status.health)
        share = " ".join(f"w{i}:{r / total:.0%}" + (f"({marks[f'worker:{i}']})"
                                                    if f"worker:{i}" in marks else "")
                         for i, r in enumerate(per_worker))
        share += "".join(f" {t}({m})" for t, m in marks.items() if t.startswith("ps"))
        self.bar.set_postfix_str(f"shards {shards}/{total_shards} [{share}]", refresh=False)
        self.bar.update(p.records_done_total - self.records)
        self.records = p.records_done_total
        if self.job.train_t0 is not None and status.trainer.workers:
            self.job.timeline.append([round(now - self.job.train_t0, 2)] + [
                w.records for w in status.trainer.workers])
        if self.records and self.first_progress is None:
            self.first_progress = (now, self.records)
        if self.enabled and not self.tty and (final or now - self.last_plain >= self.plain_every):
            self.last_plain = now
            rate, eta = 0.0, "?"
            if self.first_progress and now > self.first_progress[0]:
                rate = (self.records - self.first_progress[1]) / (now - self.first_progress[0])
                if rate > 0:
                    eta = f"{(self.total - self.records) / rate:.0f}s"
            print(f"[{now - self.job.t0:6.1f}s] {self.records:,}/{self.total:,} records "
                  f"({self.records / self.total:.0%}), shards {shards}/{total_shards}, "
                  f"{rate:,.0f} rec/s, ETA {eta}, per worker [{share}]",
                  file=sys.stderr, flush=True)
        return self.records

    def close(self) -> None:
        self.bar.close()


def summary_table(report: dict) -> str:
    rows = [("worker", "shards", "records", "share")]
    total = sum(report["records_per_worker"]) or 1
    for i, (s, r) in enumerate(zip(report["shards_per_worker"], report["records_per_worker"])):
        rows.append((f"worker:{i}", str(s), str(r), f"{r / total:.1%}"))
    width = [max(len(r[c]) for r in rows) for c in range(4)]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, width)) for row in rows]
    lines.append("")
    lines.append(f"JCT {report['jct_seconds']:.1f} s, {report['records_per_second']:,.0f} "
                 f"records/s, {report['records']:,} records")
    if report.get("auc") is not None:
        lines.append(f"AUC {report['auc']:.4f}, logloss {report['logloss']:.4f} "
                     f"(held-out, {report['coordinator'].get('eval_records', 0):,} records)")
    if report.get("stolen_leases"):
        lines.append(f"tail work-stealing: {report['stolen_leases']} lease remainder(s) "
                     "taken over by idle workers")
    if report.get("backup_leases"):
        lines.append(f"backup workers: {report['backup_leases']} speculative duplicate(s) of "
                     "slow workers' lease remainders (first finisher wins)")
    for ev in report["failures"]:
        resumed = ev.get("resumed_after_s")
        lines.append(f"failure at {ev['t']:.1f}s: {ev['event']}"
                     + (f" — training resumed {resumed:.1f}s later" if resumed is not None
                        else ""))
    for act in report.get("actions", []):
        after = act.get("recovered_after_s")
        if act["action"] == "ScaleWorkers":
            what = f"{act['from_workers']} -> {act['to_workers']} workers"
        elif act["action"] == "AdjustBatchSizes":
            what = "batch sizes " + ", ".join(f"w{w}:{b}" for w, b in act["batch_sizes"].items())
        else:
            what = f"{act['job']}:{act['index']} host{act['from_host']} -> host{act['to_host']}"
        lines.append(f"controller at {act['t']:.1f}s: {act['action']} {what} ({act['reason']})"
                     + (f" — working again {after:.1f}s later" if after is not None else ""))
    if "audit" in report:
        a = report["audit"]
        lines.append(f"audit: applied exactly {a['expected_times']}x: {a['applied_expected']:,}, "
                     f"0x: {a['applied_0']:,}, 1x: {a['applied_1']:,}, 2+x: "
                     f"{a['applied_2plus']:,} (off: {a['applied_other']:,}, allowed "
                     f"{a['allowed_off_records']:,}"
                     + ("; duplicates are the backup workers' price"
                        if a.get("duplicates_by_design") else "")
                     + f") -> {'OK' if a['ok'] else 'FAILED'}")
    return "\n".join(lines)


def config_from_flags() -> JobConfig:
    if FLAGS.num_ps < 1 or FLAGS.num_workers < 1:
        raise app.UsageError("--num_ps and --num_workers must be >= 1")
    if not FLAGS.learning_rate > 0:
        raise app.UsageError("--learning_rate must be > 0")
    if FLAGS.num_hosts < 0:
        raise app.UsageError("--num_hosts must be >= 0")
    if FLAGS.backend == "agents":
        if not FLAGS.master:
            raise app.UsageError("--backend=agents needs --master=HOST:PORT (the running "
                                 "antdt-master the hosts' agents report to)")
        if FLAGS.api != "custom_loop" or FLAGS.max_workers > FLAGS.num_workers:
            raise app.UsageError("--backend=agents runs --api=custom_loop jobs without "
                                 "--max_workers for now (docs/backends.md)")
        if any(t.startswith("kill:master") for t in FLAGS.inject):
            raise app.UsageError("--backend=agents: the master is not the launcher's to "
                                 "kill (it runs on its own host)")
        if FLAGS.host_timeout_seconds <= 0:
            raise app.UsageError("--host_timeout_seconds must be > 0")
    elif FLAGS.master:
        raise app.UsageError("--master goes with --backend=agents (the local backend "
                             "starts its own master)")
    if FLAGS.max_workers and FLAGS.max_workers < FLAGS.num_workers:
        raise app.UsageError("--max_workers must be 0 or >= --num_workers")
    if FLAGS.max_workers > FLAGS.num_workers and (FLAGS.api != "custom_loop"
                                                  or FLAGS.data_path != "pull"):
        raise app.UsageError("scaling (--max_workers) needs --api=custom_loop "
                             "--data_path=pull")
    if FLAGS.mode == "bsp" and (FLAGS.api != "custom_loop" or FLAGS.data_path != "pull"
                                or FLAGS.max_workers > FLAGS.num_workers):
        raise app.UsageError("--mode=bsp needs --api=custom_loop --data_path=pull and no "
                             "--max_workers (a round has one batch per worker at start)")
    for name in ("epochs", "batch_size", "records_per_shard", "buckets"):
        if getattr(FLAGS, name) < 1:
            raise app.UsageError(f"--{name} must be >= 1")
    try:
        injections = tuple(parse_injection(t, FLAGS.num_ps, FLAGS.num_workers,
                                           FLAGS.max_workers) for t in FLAGS.inject)
    except InvalidRequest as e:
        raise app.UsageError(str(e)) from e
    policy_name, estimator_python = FLAGS.policy, ""
    if FLAGS.api in TF1_APIS:
        # the hooks carry out RelaunchWorker (a non-chief worker moves to another host),
        # tail stealing and ADJUST_BS sizes; PS replacement and scaling drive the TF2
        # coordinator and have no TF1 counterpart here
        for inj in injections:
            if inj.job in ("chief", "ps") or inj.kind == "scale":
                raise app.UsageError(f"--api={FLAGS.api}: injection {inj} is not supported "
                                     "(kill:worker:0 kills the chief; kill:master, kill:worker "
                                     "and slow:worker work)")
        if FLAGS.policy == "static":
            raise app.UsageError(f"--api={FLAGS.api}: --policy=static (static sharding) needs "
                                 "--api=custom_loop")
        if FLAGS.api == "estimator":
            estimator_python = FLAGS.estimator_python or str(
                SOURCE_ROOT / ".venv-tf215" / "bin" / "python")
            if not os.access(estimator_python, os.X_OK):
                raise app.UsageError(f"--api=estimator needs TF 2.15's venv: {estimator_python} "
                                     "not found (run: make venv-tf215, or pass "
                                     "--estimator_python)")
    try:
        from antdt_tf.controller import load_policy
        from antdt_tf.monitor.straggler import StragglerConfig

        policy = load_policy(policy_name)
        StragglerConfig(window_seconds=FLAGS.straggler_window_seconds,
                        slow_ratio=FLAGS.straggler_slow_ratio,
                        persistent_after_seconds=FLAGS.straggler_persistent_after_seconds)
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    if getattr(policy, "sharding", "dynamic") == "static" and (
            FLAGS.max_workers > FLAGS.num_workers or FLAGS.api != "custom_loop"
            or FLAGS.data_path != "pull"):
        raise app.UsageError("--policy=static (static sharding) needs --api=custom_loop "
                             "--data_path=pull and no --max_workers")
    if getattr(policy, "backup_leases", False) and not skips_refused_leases(FLAGS):
        raise app.UsageError(f"--policy={FLAGS.policy} (backup workers) needs a trainer that "
                             "stops a lease whose duplicate finished first: --api=custom_loop "
                             "--mode=async --data_path=pull, or --api=mts|estimator")
    if FLAGS.controller_interval_seconds <= 0 or min(
            FLAGS.relaunch_cost_seconds, FLAGS.replace_ps_cost_seconds) < 0:
        raise app.UsageError("--controller_interval_seconds must be > 0 and the cost "
                             "estimates >= 0")
    workdir = pathlib.Path(FLAGS.workdir or tempfile.mkdtemp(prefix="antdt-job-"))
    if (workdir / "master").exists() or (workdir / "checkpoints").exists():
        raise app.UsageError(f"--workdir={workdir} holds a previous job's master state or "
                             "checkpoints; use a new directory (or delete it)")
    workdir.mkdir(parents=True, exist_ok=True)
    data, eval_data = FLAGS.data, FLAGS.eval_data
    if data:
        from antdt_tf.data.records import RecordFile
        try:
            RecordFile(data)
            if eval_data:
                RecordFile(eval_data)
        except (AntdtError, OSError) as e:
            raise app.UsageError(f"cannot use the data: {e}") from e
    else:
        if FLAGS.generate_records < 1:
            raise app.UsageError("--generate_records must be >= 1 (or pass --data)")
        print(f"generating {FLAGS.generate_records:,} + {FLAGS.eval_records:,} synthetic "
              f"records into {workdir / 'data'}", file=sys.stderr)
        data, eval_data = generate_data(workdir, FLAGS.generate_records, FLAGS.eval_records,
                                        FLAGS.data_seed)
    ckpt = FLAGS.checkpoint_dir or str(workdir / "checkpoints")
    return JobConfig(
        num_ps=FLAGS.num_ps, num_workers=FLAGS.num_workers,
        num_hosts=FLAGS.num_hosts or (1 if FLAGS.backend == "agents" else FLAGS.num_workers),
        data=data, eval_data=eval_data, backend=FLAGS.backend, master=FLAGS.master,
        host_timeout_seconds=FLAGS.host_timeout_seconds,
        epochs=FLAGS.epochs, batch_size=FLAGS.batch_size,
        records_per_shard=FLAGS.records_per_shard, shuffle=FLAGS.shuffle,
        buckets=FLAGS.buckets, checkpoint_dir=ckpt, learning_rate=FLAGS.learning_rate,
        api=FLAGS.api, data_path=FLAGS.data_path, mode=FLAGS.mode,
        checkpoint_every_seconds=FLAGS.checkpoint_every_seconds,
        checkpoint_every_shards=FLAGS.checkpoint_every_shards, audit=FLAGS.audit,
        workdir=workdir, injections=injections, timeout_seconds=FLAGS.timeout_seconds,
        max_restarts=FLAGS.max_restarts, progress=FLAGS.progress, data_seed=FLAGS.data_seed,
        policy=policy_name, controller_interval_seconds=FLAGS.controller_interval_seconds,
        straggler_window_seconds=FLAGS.straggler_window_seconds,
        straggler_slow_ratio=FLAGS.straggler_slow_ratio,
        straggler_persistent_after_seconds=FLAGS.straggler_persistent_after_seconds,
        relaunch_cost_seconds=FLAGS.relaunch_cost_seconds,
        replace_ps_cost_seconds=FLAGS.replace_ps_cost_seconds,
        min_gain_seconds=FLAGS.min_gain_seconds, max_workers=FLAGS.max_workers,
        estimator_python=estimator_python)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    cfg = config_from_flags()
    where = (f"the hosts registered with {cfg.master}" if cfg.agents
             else f"{cfg.num_hosts} simulated host(s)")
    print(f"antdt-launch: {cfg.num_ps} PS, {cfg.num_workers} workers on {where}; "
          f"workdir {cfg.workdir}", file=sys.stderr)
    for inj in cfg.injections:
        print(f"  inject: {inj}", file=sys.stderr)
    try:
        report = LocalJob(cfg).run()
    except (RuntimeError, TimeoutError, AntdtError) as e:
        print(f"antdt-launch: the job failed: {e}\n  logs: {cfg.workdir}/host*/", file=sys.stderr)
        return 1
    print(summary_table(report))
    if FLAGS.report_json:
        pathlib.Path(FLAGS.report_json).write_text(json.dumps(report, indent=2))
        print(f"report: {FLAGS.report_json}")
    return 0 if report.get("audit", {}).get("ok", True) else 1


def run():
    app.run(main)


if __name__ == "__main__":
    run()
