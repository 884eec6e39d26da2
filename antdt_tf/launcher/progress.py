"""The live progress line: records, shards, records/s, ETA, each worker's share."""

from __future__ import annotations

import sys
import time
from typing import Optional

from antdt_tf.errors import AntdtError
from antdt_tf.sharding.client import leasing_started


def slow_marks(health) -> dict[str, str]:
    """'worker:2' -> 'persistent x3.9' for every task the Monitor finds slow."""
    from antdt_tf.proto import cluster_pb2 as cpb

    slow = (cpb.TaskHealth.TRANSIENT, cpb.TaskHealth.PERSISTENT, cpb.TaskHealth.DETERMINISTIC)
    return {f"{h.task.job}:{h.task.index}":
            f"{cpb.TaskHealth.StragglerClass.Name(h.straggler_class).lower()} x{h.slowness:.1f}"
            for h in health if h.straggler_class in slow}


class ProgressLine:
    """Records done / total, shards, records/s, ETA and each worker's share: a tqdm bar
    on a terminal, a plain line every ``plain_every`` seconds otherwise (logs, CI)."""

    def __init__(self, job, admin, monitor, enabled: bool, plain_every: float = 5.0):
        from tqdm import tqdm

        self.job, self.admin, self.monitor = job, admin, monitor
        self.total = job.num_records * job.cfg.epochs or None   # None: not known here
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
        self.started = self.started or leasing_started(p)
        self.finished = p.finished
        total_shards = p.shards_per_epoch * p.num_epochs
        if self.total is None and p.records_per_epoch:   # the data is not readable here
            self.total = p.records_per_epoch * p.num_epochs
            self.bar.total = self.total
        shards = total_shards if p.finished else p.shards_per_epoch * p.epoch + p.done_shards
        per_worker = [w.records for w in status.trainer.workers] or [
            t.records_done for t in sorted((t for t in full.tasks if t.task.type == "worker"),
                                           key=lambda t: t.task.index)]
        total = sum(per_worker) or 1
        marks = slow_marks(status.health)
        share = " ".join(f"w{i}:{r / total:.0%}" + (f"({marks[f'worker:{i}']})"
                                                    if f"worker:{i}" in marks else "")
                         for i, r in enumerate(per_worker))
        share += "".join(f" {t}({m})" for t, m in marks.items() if t.startswith("ps"))
        self.bar.set_postfix_str(f"shards {shards}/{total_shards} [{share}]", refresh=False)
        self.bar.update(p.records_done_total - self.records)
        self.records = p.records_done_total
        if self.records and self.first_progress is None:
            self.first_progress = (now, self.records)
        if self.enabled and not self.tty and (final or now - self.last_plain >= self.plain_every):
            self.last_plain = now
            rate, eta = 0.0, "?"
            if self.first_progress and now > self.first_progress[0]:
                rate = (self.records - self.first_progress[1]) / (now - self.first_progress[0])
                if rate > 0 and self.total:
                    eta = f"{(self.total - self.records) / rate:.0f}s"
            print(f"[{now - self.job.t0:6.1f}s] {self.records:,}/{self.total or 0:,} records "
                  f"({self.records / (self.total or 1):.0%}), shards {shards}/{total_shards}, "
                  f"{rate:,.0f} rec/s, ETA {eta}, per worker [{share}]",
                  file=sys.stderr, flush=True)
        return self.records

    def close(self) -> None:
        self.bar.close()
