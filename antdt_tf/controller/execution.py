"""ActionRun: one action the Controller carries out, as a state machine.

An action changes processes, so it takes time and can fail half-way; its run records
where it is, what it waits for, and what it cost::

    STARTING    the new task(s) start beside the old ones (a standby, new workers)
        |--------- ready --------------------------> RECOVERING
        '--------- not ready in time, or died -----> ABANDONED  (the old ones serve on)
    RECOVERING  the old task is gone; waiting for the job to work again
        '--------- the moved task trains again ----> DONE       (the cost is measured)

``AdjustBatchSizes`` is DONE at once; a scale-in goes to RECOVERING at once. An illegal
move raises :class:`IllegalTransition`. Pure Python: the master's job runner owns the
processes and drives the transitions (``antdt_tf.master.runner.executor``).
"""

from __future__ import annotations

import dataclasses
import enum
import pathlib
from typing import Optional

from antdt_tf.controller.actions import Action, AdjustBatchSizes, ScaleWorkers
from antdt_tf.errors import AntdtError


class ActionPhase(enum.Enum):
    STARTING = "starting"
    RECOVERING = "recovering"
    DONE = "done"
    ABANDONED = "abandoned"


TRANSITIONS = {
    ActionPhase.STARTING: {ActionPhase.RECOVERING, ActionPhase.ABANDONED},
    ActionPhase.RECOVERING: {ActionPhase.DONE},
    ActionPhase.DONE: set(),
    ActionPhase.ABANDONED: set(),
}


class IllegalTransition(AntdtError):
    """An action run was asked to move to a phase its state machine does not allow."""


@dataclasses.dataclass
class ActionRun:
    """One action in progress or finished. Times: ``t`` in seconds since the job's
    start (for the report), everything else on the caller's monotonic clock."""

    action: Action
    t: float
    started: float
    phase: ActionPhase = ActionPhase.STARTING
    history: list = dataclasses.field(default_factory=list)   # (phase, time, reason)
    # a move (RelaunchWorker / ReplacePs): host indices, the new launch's address, what
    # it replaces and how to tell it works
    from_host: int = -1
    to_host: int = -1
    endpoint: str = ""
    old_launch: object = None           # the TaskName of the launch being replaced
    old_incarnation: int = -1
    chief_restarts: int = 0
    # a scaling
    from_workers: int = 0
    to_workers: int = 0
    records_per_worker_before: tuple = ()
    # what the new tasks' readiness is read from, and whether the data is held meanwhile
    ready_files: tuple = ()
    hold: bool = False
    # measured along the way
    clock: float = 0.0                  # start of the current phase's disruption
    low_records: Optional[int] = None   # lowest record count since the switch
    training_since: Optional[float] = None
    standby_seconds: Optional[float] = None
    recovered_after_s: Optional[float] = None
    ended: Optional[float] = None

    def __post_init__(self):
        self.clock = self.clock or self.started
        self.history.append((self.phase, self.started, "started"))
        if isinstance(self.action, AdjustBatchSizes):
            self.phase, self.ended = ActionPhase.DONE, self.started
            self.history.append((self.phase, self.started, "batch sizes set"))

    @property
    def kind(self) -> str:
        return type(self.action).__name__

    @property
    def task(self) -> tuple[str, int]:
        return self.action.task

    @property
    def pending(self) -> bool:
        return self.phase in (ActionPhase.STARTING, ActionPhase.RECOVERING)

    def to(self, phase: ActionPhase, now: float, reason: str = "") -> None:
        if phase not in TRANSITIONS[self.phase]:
            raise IllegalTransition(f"{self.kind} {self.task}: {self.phase.value} -> "
                                    f"{phase.value} is not a legal move")
        if phase is ActionPhase.RECOVERING:
            self.standby_seconds = round(now - self.clock, 2)
            self.clock = now                 # the disruption starts now
        elif phase is ActionPhase.DONE:
            self.recovered_after_s = round(now - self.clock, 2)
        if phase in (ActionPhase.DONE, ActionPhase.ABANDONED):
            self.ended = now
        self.phase = phase
        self.history.append((phase, now, reason))

    def ready(self) -> bool:
        """Every ready file of the new tasks exists (shared-address standbys)."""
        return all(pathlib.Path(f).exists() for f in self.ready_files)

    def report(self) -> dict:
        """The action as the job report shows it."""
        job, index = self.task
        out = {"t": self.t, "action": self.kind, "job": job, "index": index,
               "reason": self.action.reason, "phase": self.phase.value}
        if isinstance(self.action, ScaleWorkers):
            out.update(from_workers=self.from_workers, to_workers=self.to_workers)
            if self.records_per_worker_before:
                out["records_per_worker_before"] = list(self.records_per_worker_before)
        elif isinstance(self.action, AdjustBatchSizes):
            out["batch_sizes"] = {str(w): b for w, b in self.action.sizes}
        else:
            out.update(from_host=self.from_host, to_host=self.to_host)
        if self.standby_seconds is not None:
            out["standby_seconds"] = self.standby_seconds
        if self.recovered_after_s is not None:
            out["recovered_after_s"] = self.recovered_after_s
        if self.phase is ActionPhase.ABANDONED:
            out["abandoned"] = True
        return out
