"""The chief's side of ``model.fit`` between checkpoints: pacing the scheduled steps and
settling the leases of dead or silent workers.

Under PSS the batch hooks run on the chief's main thread when a step is *scheduled*.
:class:`StepPacer` keeps only a few steps scheduled beyond the executed ones, so that
when the data ends only that many padding steps are already queued. :class:`LeaseSettler`
asks the master how the data goes and (sparse reports) settles the leases it holds for
dead or silent workers from the PS lease record
(:func:`~antdt_tf.tf.accounting.apply_lease_records`) — also while the pacer waits: a
step can wait seconds for a worker PSS is recovering, or for the one lease only the
settle can give back.
"""

from __future__ import annotations

import collections
import time

import tensorflow as tf

from antdt_tf.sharding.client import HeldLeaseKeeper
from antdt_tf.tf import tf_internals
from antdt_tf.tf.accounting import apply_lease_records


class LeaseSettler:
    """Asks the master for the dataset's progress and, with a lease record
    (``lease_record``: set once the step's variables exist), settles the leases it holds.

    ``settled``: how many held leases were settled so far. ``every_seconds``: how often
    :meth:`due` says to settle (well under the master's ``--settle_seconds``)."""

    def __init__(self, client, master: str, dataset: str, every_seconds: float):
        self.client, self.master, self.dataset = client, master, dataset
        self.every_seconds = every_seconds
        self.lease_record = None
        self.settled = 0
        self.last_check = time.monotonic()
        self._keeper = None

    def due(self) -> bool:
        return time.monotonic() - self.last_check >= self.every_seconds

    def settle(self, drained: bool = False):
        """Settles the held leases (``drained``: every scheduled step has finished —
        before a checkpoint — so also bring the master's count of every live lease up to
        the model, last batch included). Returns ``(held leases, finished)``."""
        progress = self.client.progress(self.dataset).datasets[0]
        self.last_check = time.monotonic()
        if self.lease_record is not None and (progress.held or drained):
            apply_lease_records(self.client.apply_lease_record, self.dataset,
                                self.lease_record.numpy()[:-1], progress.held,
                                drained=drained)
            self.settled += len(progress.held)
        return len(progress.held), progress.finished

    def start_keeping(self) -> None:
        """The master keeps dead workers' sparse leases for this chief however long its
        main thread waits (a save's join, an evaluation, another callback)."""
        if self.lease_record is not None and self._keeper is None:
            self._keeper = HeldLeaseKeeper(self.master, [self.dataset],
                                           every_seconds=self.every_seconds).start()

    def stop_keeping(self) -> None:
        if self._keeper is not None:
            self._keeper.stop()
            self._keeper = None


class StepPacer:
    """Holds the scheduled steps' logs (``RemoteValue``\\ s) and waits until at most
    ``limit`` of them are unfinished."""

    def __init__(self, max_ahead: int):
        self.max_ahead = max_ahead
        self.limit = max_ahead
        self._ahead = collections.deque()

    def start(self, steps_per_execution: int, num_workers: int) -> None:
        """With ``steps_per_execution`` > 1 at least two executions per worker stay
        scheduled, so that no worker waits for the chief."""
        self.limit = max(-(-self.max_ahead // steps_per_execution), 2 * num_workers)

    def clear(self) -> None:
        """Forgets the scheduled steps (after a drain: all finished)."""
        self._ahead.clear()

    def add(self, logs, while_waiting) -> None:
        """Adds a scheduled step and waits as :meth:`wait` does."""
        self._ahead.append(logs)
        self.wait(while_waiting)

    def wait(self, while_waiting) -> None:
        """Waits until at most ``limit`` scheduled steps are unfinished, calling
        ``while_waiting()`` about every 10 ms meanwhile (the settles).

        It waits for *any* scheduled step to finish, not for the oldest: steps finish out
        of order, and waiting for the oldest — a straggler's — let the fast workers
        empty the queue and idle until it came back (measured: 0.7 s of a 7 s job with
        worker 2 slowed 4x, slower than bare ``model.fit``, which queues every step at
        once). It watches each step's completion event, the one TF's own ``fetch`` waits
        on (TF-private; without it, it falls back to fetching the oldest): no copy, no
        remote read on another thread — the settles' PS reads stay on this one."""
        while len(self._ahead) > self.limit:
            events = [tf_internals.completion_event(s) for s in self._ahead]
            if any(e is None for e in events):
                try:
                    self._ahead.popleft().fetch()   # waits for that step (main thread)
                except tf.errors.OpError:
                    # the step ran on a worker that died since: its result cannot be
                    # copied, but the step is done (or re-run elsewhere); only pacing here
                    pass
                continue
            self._ahead = collections.deque(
                s for s, e in zip(self._ahead, events) if not e.is_set())
            if len(self._ahead) <= self.limit:
                return
            tf_internals.completion_event(self._ahead[0]).wait(0.01)
            while_waiting()
