"""What a policy can ask for. Each one is carried out by the master's job runner through
the cluster backend (``antdt_tf.master.runner.executor``)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Action:
    reason: str = ""

    @property
    def task(self) -> tuple[str, int]:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class RelaunchWorker(Action):
    """Kill a worker and start it again on another host (its leases go back to TODO at
    once and resume from their applied offsets: at most the batch in flight is redone)."""
    worker: int = 0

    @property
    def task(self) -> tuple[str, int]:
        return "worker", self.worker


@dataclasses.dataclass(frozen=True)
class ReplacePs(Action):
    """Start a PS task on another host in place of a slow one. The chief rebuilds its
    strategy and restores model and sharding state from the last shard-boundary
    checkpoint, so nothing is lost or applied twice; the job pauses meanwhile."""
    ps: int = 0

    @property
    def task(self) -> tuple[str, int]:
        return "ps", self.ps


@dataclasses.dataclass(frozen=True)
class ScaleWorkers(Action):
    """Run with ``num_workers`` workers from now on (up to the job's worker slots). New
    workers start on their hosts first; then the chief is restarted with the new cluster
    and restores model and sharding state from the last checkpoint (exact); workers
    scaled away are stopped after the chief let go of them."""
    num_workers: int = 0

    @property
    def task(self) -> tuple[str, int]:
        return "chief", 0


@dataclasses.dataclass(frozen=True)
class AdjustBatchSizes(Action):
    """ADJUST_BS: records per batch by worker, ``((worker, size), ...)``, in proportion
    to measured speed with the global batch kept constant. The master hands each size
    out with the worker's next lease (a step boundary): no restart, nothing redone."""
    sizes: tuple[tuple[int, int], ...] = ()

    @property
    def task(self) -> tuple[str, int]:
        return "chief", 0
