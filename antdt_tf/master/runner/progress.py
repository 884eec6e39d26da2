"""The runner's view of the job's progress: what the loop needs (records done, total,
started, finished) and the job's timeline (records per worker over time, for the
report). No UI: the launcher draws the progress line from the master's answers
(``antdt_tf.launcher.progress``); the master's log gets a plain line now and then."""

from __future__ import annotations

import sys
import time

from antdt_tf.errors import AntdtError
from antdt_tf.sharding.client import leasing_started

LOG_EVERY = 10.0      # seconds between progress lines in the master's log


class JobProgress:
    """Polls the master's ``GetProgress`` (and the Monitor's trainer view) at most every
    0.5 s; the runner's ``timeline`` gets one row per poll once training started."""

    def __init__(self, job, admin, monitor):
        self.job, self.admin, self.monitor = job, admin, monitor
        self.total = job.num_records * job.cfg.epochs
        self.records = 0
        self.started = False
        self.finished = False
        self.last = 0.0
        self.last_logged = 0.0

    def update(self, final: bool = False) -> int:
        """The records done (the last known count while the master is unreachable)."""
        if not final and time.monotonic() - self.last < 0.5:
            return self.records
        self.last = now = time.monotonic()
        try:
            p = self.admin.progress("train").datasets[0]
            workers = self.monitor.status().trainer.workers
        except AntdtError:
            return self.records    # master restarting: keep the last numbers
        self.started = self.started or leasing_started(p)
        self.finished = p.finished
        self.records = p.records_done_total
        job = self.job
        if job.train_t0 is not None and workers:
            job.timeline.append([round(now - job.train_t0, 2)] + [w.records for w in workers])
        if final or now - self.last_logged >= LOG_EVERY:
            self.last_logged = now
            print(f"[{now - job.t0:6.1f}s] {self.records:,}/{self.total:,} records, "
                  f"{p.done_shards}/{p.shards_per_epoch} shards of epoch {p.epoch + 1}"
                  f"/{p.num_epochs}", file=sys.stderr, flush=True)
        return self.records
