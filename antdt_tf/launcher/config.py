"""What a job is: its configuration, where its tasks go, and its generated data."""

from __future__ import annotations

import dataclasses
import pathlib

from antdt_tf.agent.inject import Injection
EXIT_CLUSTER_UNAVAILABLE = 75   # the coordinator's "relaunch me" (see antdt_tf.tf.coordinator)


TF1_APIS = ("mts", "estimator")
TF1_PROGRAM = {"mts": "antdt-mts-worker", "estimator": "antdt-estimator-task"}
SOURCE_ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


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
