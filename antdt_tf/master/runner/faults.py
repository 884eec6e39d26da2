"""How long a failure cost the job, read off the master's count of trained records.

Two durations, because they differ as soon as a recovery restores a checkpoint: the
restore drops the count back to the checkpoint's, so the job is *training again* long
before it has *regained* the work the failure lost (re-trained back to the count at the
failure). A report that gave only one of them either hid the redone work or made the
restart look slower than it was.
"""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass
class FaultClock:
    """One failure's recovery. ``event`` (the report's failure entry) gets
    ``training_again_after_s`` and ``regained_after_s`` (seconds after ``at``)."""
    event: dict
    at: float                       # monotonic time of the failure
    before: int                     # records counted at the failure
    low: Optional[int] = None       # the count's low since the last (re)start
    last: Optional[int] = None
    again_at: Optional[float] = None

    def __post_init__(self):
        self.low = self.last = self.before

    def chief_started(self, records: int) -> None:
        """The recovery (re)started the chief: training again means growth after it (a
        surviving worker's late report before the restore does not count)."""
        self.low = self.last = records
        self.again_at = None

    def observe(self, now: float, records: int) -> bool:
        """One reading of the count; True once the lost work is regained (done)."""
        if records < self.last:          # a restore: training starts over from here
            self.again_at = None
        self.low = min(self.low, records)
        self.last = records
        if self.again_at is None and records > self.low:
            self.again_at = now
        if records > self.before:
            self.again_at = self.again_at if self.again_at is not None else now
            self.event["regained_after_s"] = round(now - self.at, 2)
            self._note_again()
            return True
        return False

    def close(self) -> None:
        """The job ended first: what was seen (``regained_after_s`` stays absent)."""
        self._note_again()

    def _note_again(self) -> None:
        if self.again_at is not None:
            self.event["training_again_after_s"] = round(self.again_at - self.at, 2)
