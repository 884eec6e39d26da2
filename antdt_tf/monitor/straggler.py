"""Batch processing time windows and straggler classification (pure Python).

Where the numbers come from (measured where they are true):

- **Workers**: every trained batch is reported to the master by the worker itself (the
  pull pipeline's ``antdt.report`` after each step). The time between two reports of one
  worker is its batch processing time (BPT) as the job feels it: compute, PS round trips,
  scheduling gaps. Gaps longer than ``idle_gap_seconds`` are idle time (waiting for data,
  restarting), not slowness, and are left out.
- **Parameter servers**: a PS has no batches; what matters is how long workers wait on
  it. The trainer probes every PS with a tiny variable read about once a second and
  reports the latency; the mean (without the worst sample) over twice the window, from
  at least 4 probes (the newest 4 for up to six windows, when probes come slowly), is
  the PS's latency.

Classification (AntDT's three classes, decided per task over a sliding window):

- a worker is *slow* when the median rate of all workers is ``slow_ratio`` times its own
  rate or more; a PS is slow when its latency is ``slow_ratio`` times the baseline (the
  fastest PS now; a lone PS is compared with its own best window) and at least
  ``ps_min_excess_ms`` above it. A PS of a job with several PS is judged only while a
  peer has enough probes too: alone-against-itself would blame one PS for load that hits
  every task (a restarting chief, a busy host), which is what a job with one PS has to
  live with, not one with peers;
- **transient**: slow for less than ``persistent_after_seconds`` (a burst; dynamic
  sharding already absorbs it, acting would cost more than it saves);
- **persistent**: slow for ``persistent_after_seconds`` or longer after having been
  normal (contention that arrived and stays: worth moving the task);
- **deterministic**: slow from its first window on and for ``persistent_after_seconds``
  or longer (weaker hardware: moving does not help on a dedicated cluster, re-balancing
  does).

A new incarnation (relaunched worker) starts a fresh window and history; so do all PS
when a new chief incarnation reports (a PS replacement, PS failure or rescale rebuilt the
cluster: the old probes describe processes that are gone).
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from typing import Optional

NOT_ENOUGH, NORMAL, TRANSIENT, PERSISTENT, DETERMINISTIC = (
    "unknown", "normal", "transient", "persistent", "deterministic")
CLASSES = (NOT_ENOUGH, NORMAL, TRANSIENT, PERSISTENT, DETERMINISTIC)


@dataclasses.dataclass(frozen=True)
class StragglerConfig:
    window_seconds: float = 10.0
    slow_ratio: float = 1.5
    persistent_after_seconds: float = 30.0
    min_samples: int = 5
    idle_gap_seconds: float = 2.0
    ps_min_excess_ms: float = 5.0

    def __post_init__(self):
        if self.window_seconds <= 0 or self.persistent_after_seconds < 0:
            raise ValueError("window_seconds must be > 0 and persistent_after_seconds >= 0")
        if self.slow_ratio <= 1.0:
            raise ValueError(f"slow_ratio must be > 1, got {self.slow_ratio}")
        if self.min_samples < 1 or self.idle_gap_seconds <= 0:
            raise ValueError("min_samples must be >= 1 and idle_gap_seconds > 0")


class _TimeWindow:
    """Samples whose first element is their time, kept for ``window_seconds``."""

    def __init__(self, window_seconds: float):
        self.window_seconds = window_seconds
        self._samples: collections.deque[tuple] = collections.deque()

    def trim(self, now: float) -> None:
        while self._samples and self._samples[0][0] < now - self.window_seconds:
            self._samples.popleft()

    def __len__(self) -> int:
        return len(self._samples)


class BptWindow(_TimeWindow):
    """One worker's recent reports: (end time, seconds, records, steps). A report may
    cover several steps (sparse reports: one per lease); its length is its steps."""

    def __init__(self, window_seconds: float, idle_gap_seconds: float):
        super().__init__(window_seconds)
        self.idle_gap_seconds = idle_gap_seconds
        self._last: Optional[float] = None

    def add(self, now: float, records: int, seconds: Optional[float] = None,
            steps: int = 1) -> None:
        """``steps`` steps of ``records`` in all ended ``now``. Their time is
        ``seconds`` if the worker measured it (BSP: rounds make arrival gaps equal; the
        custom loop's reports), else the gap since the previous report (a gap over
        ``idle_gap_seconds`` is idle, not work)."""
        steps = max(1, steps)
        if seconds is not None:
            if seconds > 0:
                self._samples.append((now, seconds, records, steps))
        elif self._last is not None and 0 < now - self._last <= self.idle_gap_seconds:
            self._samples.append((now, now - self._last, records, steps))
        self._last = now
        self.trim(now)

    def __len__(self) -> int:
        """Steps in the window (what ``min_samples`` counts)."""
        return sum(s[3] for s in self._samples)

    def step_seconds(self) -> float:
        return statistics.median(s[1] / s[3] for s in self._samples) if self._samples else 0.0

    def records_per_second(self) -> float:
        busy = sum(s[1] for s in self._samples)
        return sum(s[2] for s in self._samples) / busy if busy > 0 else 0.0


class LatencyWindow(_TimeWindow):
    """One PS's recent probe latencies (ms): (time, latency)."""

    def __init__(self, window_seconds: float, min_samples: int):
        super().__init__(window_seconds)
        self.min_samples = min_samples
        self.best = float("inf")   # lowest full-window mean so far: a lone PS's baseline

    def trim(self, now: float) -> None:
        """Drops probes older than the window, but keeps the newest ``min_samples`` for
        up to three windows: probes come with the chief's reports, which a loaded chief
        sends less often — exactly when a slow PS needs judging."""
        while self._samples and self._samples[0][0] < now - self.window_seconds and (
                len(self._samples) > self.min_samples
                or self._samples[0][0] < now - 3 * self.window_seconds):
            self._samples.popleft()

    def add(self, now: float, latency_ms: float) -> None:
        self._samples.append((now, latency_ms))
        self.trim(now)
        if len(self._samples) >= self.min_samples:
            self.best = min(self.best, self.mean())

    def mean(self) -> float:
        """Mean without the single worst sample: what workers wait on average (a PS that
        is stopped 2/3 of the time answers fast 1/3 of the time: a median would hide a
        lot), robust against one hiccup."""
        values = sorted(s[1] for s in self._samples)
        if len(values) >= 5:
            values = values[:-1]
        return sum(values) / len(values) if values else 0.0


@dataclasses.dataclass
class TaskJudgement:
    job: str
    index: int
    straggler_class: str = NOT_ENOUGH
    slowness: float = 0.0
    step_seconds: float = 0.0
    records_per_second: float = 0.0
    latency_ms: float = 0.0
    slow_since: float = 0.0
    samples: int = 0
    incarnation: int = 0


class _History:
    """Per task: when its current slow episode began, and whether it was ever normal."""

    __slots__ = ("slow_since", "was_normal")

    def __init__(self):
        self.slow_since: Optional[float] = None
        self.was_normal = False

    def judge(self, slow: bool, now: float, horizon: float) -> tuple[str, float]:
        if not slow:
            self.was_normal = True
            self.slow_since = None
            return NORMAL, 0.0
        if self.slow_since is None:
            self.slow_since = now
        if now - self.slow_since < horizon:
            return TRANSIENT, self.slow_since
        return (PERSISTENT if self.was_normal else DETERMINISTIC), self.slow_since


class StragglerClassifier:
    """Feeds on step reports (workers) and probe latencies (PS); ``judge(now)`` classifies."""

    def __init__(self, config: StragglerConfig = StragglerConfig()):
        self.config = config
        self._bpt: dict[int, BptWindow] = {}
        self._incarnation: dict[int, int] = {}
        self._latency: dict[int, LatencyWindow] = {}
        self._ps_seen: set[int] = set()   # every PS ever probed: is a PS alone?
        self._history: dict[tuple[str, int], _History] = {}
        # probes come at most once a second (less when the chief is busy): a PS is judged
        # over twice the window, from at least 4 probes
        self._ps_min_samples = min(config.min_samples, 4)

    def observe_step(self, worker: int, incarnation: int, now: float, records: int,
                     seconds: Optional[float] = None, steps: int = 1) -> None:
        if self._incarnation.get(worker) != incarnation:
            # a new process (maybe on another host): its history starts over
            self._incarnation[worker] = incarnation
            self._bpt[worker] = BptWindow(self.config.window_seconds,
                                          self.config.idle_gap_seconds)
            self._history.pop(("worker", worker), None)
        self._bpt[worker].add(now, records, seconds, steps)

    def observe_ps_latency(self, ps: int, now: float, latency_ms: float) -> None:
        self._ps_seen.add(ps)
        self._latency.setdefault(ps, LatencyWindow(
            2 * self.config.window_seconds, self._ps_min_samples)).add(now, latency_ms)

    def forget_ps(self) -> None:
        """A new chief probes from now on: every PS's window and history start over."""
        self._latency.clear()
        for key in [k for k in self._history if k[0] == "ps"]:
            del self._history[key]

    def judge(self, now: float) -> list[TaskJudgement]:
        cfg = self.config
        out = []
        rates = {}
        for w, win in sorted(self._bpt.items()):
            win.trim(now)
            if len(win) >= cfg.min_samples:
                rates[w] = win.records_per_second()
        median_rate = statistics.median(rates.values()) if len(rates) >= 2 else 0.0
        for w, win in sorted(self._bpt.items()):
            j = TaskJudgement("worker", w, samples=len(win), step_seconds=win.step_seconds(),
                              records_per_second=win.records_per_second(),
                              incarnation=self._incarnation[w])
            if w in rates and median_rate > 0 and rates[w] > 0:
                j.slowness = median_rate / rates[w]
                hist = self._history.setdefault(("worker", w), _History())
                j.straggler_class, j.slow_since = hist.judge(
                    j.slowness >= cfg.slow_ratio, now, cfg.persistent_after_seconds)
            out.append(j)
        latencies = {}
        for p, win in sorted(self._latency.items()):
            win.trim(now)
            if len(win) >= self._ps_min_samples:
                latencies[p] = win.mean()
        for p, win in sorted(self._latency.items()):
            j = TaskJudgement("ps", p, samples=len(win), latency_ms=win.mean())
            # with peers, the fastest PS now (load that slows all of them is not one
            # PS's fault); the only PS of the job, its own best window so far; a PS
            # whose peers lack probes now (refilling after a restart) is not judged
            if len(latencies) >= 2:
                base = min(latencies.values())
            else:
                base = win.best if len(self._ps_seen) == 1 else 0.0
            if p in latencies and 0 < base < float("inf"):
                j.slowness = latencies[p] / base
                slow = (j.slowness >= cfg.slow_ratio
                        and latencies[p] - base >= cfg.ps_min_excess_ms)
                hist = self._history.setdefault(("ps", p), _History())
                j.straggler_class, j.slow_since = hist.judge(
                    slow, now, cfg.persistent_after_seconds)
            out.append(j)
        return out
