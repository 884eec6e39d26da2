"""Policies: from the Monitor's view of the job to actions, when they pay off.

Write your own::

    from antdt_tf.controller import Policy, RelaunchWorker

    class RelaunchVerySlow(Policy):
        name = "relaunch-very-slow"
        def decide(self, obs):
            return [RelaunchWorker(worker=w.index, reason="4x slower")
                    for w in obs.workers if w.slowness >= 4 and not obs.busy_with(w)]

and run it with ``antdt-launch --policy=my_module:RelaunchVerySlow``. ``decide`` is
called about once a second; return ``[]`` to do nothing. The job runner never runs two
disruptive actions at once and ignores actions on a task that is still recovering from
the previous one.

The presets (AntDT's two, plus the baselines):

- ``static``: no action, and static data sharding (the dataset's shard order cut into one
  contiguous block per worker, as with per-worker file lists): what dynamic sharding is
  measured against.
- ``dynamic``: no action. Dynamic sharding alone: fast workers pull more shards, so
  transient and deterministic worker stragglers cost little in asynchronous training.
- ``antdt-nd`` (non-dedicated clusters: other jobs share the hosts, contention comes and
  goes): tail work-stealing on (an idle worker takes over the rest of a much slower
  worker's shard, one batch after its last report); transient stragglers are left to
  dynamic sharding; a *persistent* or
  *deterministic* worker straggler is killed and relaunched on another host, a
  persistent or deterministic PS straggler is replaced by a PS on another host — each
  only when the cost model says the job finishes sooner that way.
- ``antdt-dd`` (dedicated clusters: the hosts are the job's, slowness is mostly
  hardware): tail work-stealing on; deterministic stragglers are kept (moving to an equal host does not help;
  dynamic sharding already gives every worker work in proportion to its speed);
  *persistent* stragglers (a host that degraded during the job) are relaunched or
  replaced, again only when it pays.
"""

from __future__ import annotations

import dataclasses
import importlib
import statistics
from typing import Sequence

from antdt_tf.controller.actions import AdjustBatchSizes, Action, RelaunchWorker, ReplacePs
from antdt_tf.monitor.straggler import DETERMINISTIC, PERSISTENT


@dataclasses.dataclass(frozen=True)
class TaskView:
    job: str
    index: int
    straggler_class: str = "unknown"
    slowness: float = 0.0
    records_per_second: float = 0.0
    step_seconds: float = 0.0
    latency_ms: float = 0.0
    samples: int = 0


@dataclasses.dataclass
class CostModel:
    """What actions cost on this cluster, in seconds of the job's time. Starts from
    estimates; the job runner replaces them with what it measured (mean of the observed
    actions)."""
    relaunch_worker_seconds: float = 15.0   # kill -> the new worker trains again
    replace_ps_seconds: float = 30.0        # decision -> training again (all workers wait)
    min_gain_seconds: float = 2.0           # act only when it saves at least this much
    # a PS replacement also redoes the work since the last checkpoint (on average half
    # the checkpoint interval): the job runner sets it from --checkpoint_every_seconds
    redo_seconds: float = 0.0

    def relaunch_worker_gain(self, obs: "Observation", worker: int) -> float:
        """Seconds saved by relaunching ``worker`` (negative: it would cost time). While
        it restarts the others go on; afterwards it runs at the median worker rate."""
        rates = {w.index: w.records_per_second for w in obs.workers if w.records_per_second > 0}
        if worker not in rates or len(rates) < 2 or obs.remaining_records <= 0:
            return float("-inf")
        total, own = sum(rates.values()), rates[worker]
        peers = statistics.median(r for i, r in rates.items() if i != worker)
        c = self.relaunch_worker_seconds
        without = obs.remaining_records / total
        during = (total - own) * c
        if during >= obs.remaining_records:
            with_action = obs.remaining_records / max(total - own, 1e-9)
        else:
            with_action = c + (obs.remaining_records - during) / (total - own + max(peers, own))
        return without - with_action

    def replace_ps_gain(self, obs: "Observation", ps: int) -> float:
        """Seconds saved by replacing ``ps``; the whole job pauses for the replacement.
        Afterwards the job runs at least as fast as when every PS was healthy (the best
        job rate seen so far, if the PS was normal once), and at least as fast as when
        every step waits one round trip less on the slow PS (its excess latency taken out
        of the step time: a lower bound, steps touch a PS several times)."""
        views = {p.index: p for p in obs.ps if p.samples}
        steps = [w.step_seconds for w in obs.workers if w.step_seconds > 0]
        rate = sum(w.records_per_second for w in obs.workers)
        if ps not in views or len(views) < 1 or not steps or rate <= 0:
            return float("-inf")
        base = min(p.latency_ms for p in views.values())
        if len(views) == 1:   # alone: its own latency over its slowness is its baseline
            base = views[ps].latency_ms / max(views[ps].slowness, 1.0)
        excess = max(0.0, views[ps].latency_ms - base) / 1e3
        step = statistics.median(steps)
        rate_after = max(rate * step / max(step - excess, 0.1 * step),
                         obs.best_records_per_second)
        without = obs.remaining_records / rate
        return without - (self.replace_ps_seconds + self.redo_seconds
                          + obs.remaining_records / rate_after)


def balanced_batch_sizes(obs: "Observation", min_size: int = 8) -> dict[int, int]:
    """ADJUST_BS: per-worker batch sizes in proportion to measured speed, summing to the
    global batch (``batch_size`` times the workers); {} while a worker is unmeasured."""
    rates = {w.index: w.records_per_second for w in obs.workers}
    if not rates or obs.batch_size <= 0 or min(rates.values()) <= 0:
        return {}
    total_batch, total_rate = obs.batch_size * len(rates), sum(rates.values())
    sizes = {w: max(min_size, int(total_batch * r / total_rate)) for w, r in rates.items()}
    fastest = max(rates, key=rates.get)          # rounding remainder to the fastest
    sizes[fastest] = max(min_size, total_batch - sum(s for w, s in sizes.items() if w != fastest))
    return sizes


def round_seconds(obs: "Observation", sizes: dict[int, int]) -> float:
    """A BSP round's length with these batch sizes: its slowest worker's step."""
    return max(sizes.get(w.index, obs.batch_size) / w.records_per_second for w in obs.workers)


@dataclasses.dataclass(frozen=True)
class Observation:
    now: float
    workers: tuple[TaskView, ...]
    ps: tuple[TaskView, ...]
    remaining_records: int
    costs: CostModel
    busy: frozenset = frozenset()    # (job, index) with an action in flight or cooling down
    best_records_per_second: float = 0.0   # the job's best rate so far (all workers)
    mode: str = "async"              # "async" or "bsp" (synchronous rounds)
    batch_size: int = 0              # every worker's default records per batch
    batch_sizes: tuple[tuple[int, int], ...] = ()   # the Controller's sizes in force

    def busy_with(self, task: TaskView) -> bool:
        return (task.job, task.index) in self.busy


class Policy:
    """Observes, returns actions. Subclass and override :meth:`decide`."""
    name = "policy"
    sharding = "dynamic"    # how the job runner registers the data: "dynamic" or "static"
    tail_stealing = False   # the master lets idle workers take over slow workers' leases
    backup_leases = False   # the master gives idle workers duplicates of slow workers' leases

    def decide(self, obs: Observation) -> Sequence[Action]:
        raise NotImplementedError


class DynamicOnly(Policy):
    name = "dynamic"

    def decide(self, obs: Observation) -> Sequence[Action]:
        return []


class StaticSharding(DynamicOnly):
    name = "static"
    sharding = "static"


class BackupWorkers(DynamicOnly):
    """The classic answer to stragglers, as a baseline: dynamic sharding, and a worker
    that runs out of data gets a speculative duplicate of the rest of a much slower
    worker's lease; the first to finish the shard wins, the other stops at its next
    batch. What both trained is applied twice (asynchronous SGD cannot take an update
    back): the audit shows the price. No other action."""
    name = "backup"
    backup_leases = True


class _Acting(Policy):
    """Relaunch/replace the tasks of the classes ``act_on`` when the cost model says so;
    PS first (a slow PS slows every worker), one action per decision. In BSP mode,
    first ADJUST_BS: cheap and reversible, it follows the measured rates of every worker
    (whatever their class) when it shortens the rounds by ``rebalance_ratio`` and saves
    ``min_gain_seconds`` over the rest of the job."""
    worker_classes: frozenset = frozenset()
    ps_classes: frozenset = frozenset()
    adjust_batch_sizes = True
    rebalance_ratio = 0.10

    def _adjust(self, obs: Observation) -> Sequence[Action]:
        if (obs.mode != "bsp" or not self.adjust_batch_sizes
                or ("chief", 0) in obs.busy):
            return []
        sizes = balanced_batch_sizes(obs)
        if not sizes:
            return []
        now, after = round_seconds(obs, dict(obs.batch_sizes)), round_seconds(obs, sizes)
        rounds_left = obs.remaining_records / (obs.batch_size * len(sizes))
        gain = rounds_left * (now - after)
        if after > (1 - self.rebalance_ratio) * now or gain < obs.costs.min_gain_seconds:
            return []
        rates = ", ".join(f"worker {w.index} {w.records_per_second:.0f}/s"
                          for w in sorted(obs.workers, key=lambda t: t.index))
        return [AdjustBatchSizes(sizes=tuple(sorted(sizes.items())), reason=(
            f"BSP rounds {now * 1e3:.0f} -> {after * 1e3:.0f} ms with batch sizes in "
            f"proportion to speed ({rates}); saves ~{gain:.0f}s"))]

    def decide(self, obs: Observation) -> Sequence[Action]:
        adjust = self._adjust(obs)
        if adjust:
            return adjust
        costs = obs.costs
        for p in sorted(obs.ps, key=lambda t: -t.slowness):
            if p.straggler_class in self.ps_classes and not obs.busy_with(p):
                gain = costs.replace_ps_gain(obs, p.index)
                if gain >= costs.min_gain_seconds:
                    return [ReplacePs(ps=p.index, reason=(
                        f"{p.straggler_class} PS straggler: {p.latency_ms:.1f} ms per read, "
                        f"{p.slowness:.1f}x its baseline; saves ~{gain:.0f}s"))]
        for w in sorted(obs.workers, key=lambda t: -t.slowness):
            if w.straggler_class in self.worker_classes and not obs.busy_with(w):
                gain = costs.relaunch_worker_gain(obs, w.index)
                if gain >= costs.min_gain_seconds:
                    return [RelaunchWorker(worker=w.index, reason=(
                        f"{w.straggler_class} straggler: {w.slowness:.1f}x slower than the "
                        f"median worker; saves ~{gain:.0f}s"))]
        return []


class AntDTND(_Acting):
    name = "antdt-nd"
    tail_stealing = True
    worker_classes = frozenset({PERSISTENT, DETERMINISTIC})
    ps_classes = frozenset({PERSISTENT, DETERMINISTIC})


class AntDTDD(_Acting):
    name = "antdt-dd"
    tail_stealing = True
    worker_classes = frozenset({PERSISTENT})
    ps_classes = frozenset({PERSISTENT})


PRESETS = {p.name: p for p in (StaticSharding, DynamicOnly, BackupWorkers, AntDTND, AntDTDD)}


@dataclasses.dataclass(frozen=True)
class PolicyTraits:
    """How a policy wants the data served, read once from the policy (a user's policy
    need not subclass :class:`Policy`: what it leaves out has the base class's value)."""
    sharding: str = Policy.sharding
    tail_stealing: bool = Policy.tail_stealing
    backup_leases: bool = Policy.backup_leases

    @classmethod
    def of(cls, policy) -> "PolicyTraits":
        traits = cls(**{f.name: getattr(policy, f.name, getattr(Policy, f.name))
                        for f in dataclasses.fields(cls)})
        if traits.sharding not in ("dynamic", "static"):
            raise ValueError(f"policy {getattr(policy, 'name', policy)!r}: sharding must be "
                             f"'dynamic' or 'static', got {traits.sharding!r}")
        return traits


def load_policy(spec: str) -> Policy:
    """A preset by name (``static``, ``dynamic``, ``backup``, ``antdt-nd``, ``antdt-dd``) or
    ``module:Class``."""
    if spec in PRESETS:
        return PRESETS[spec]()
    if ":" not in spec:
        raise ValueError(f"unknown policy {spec!r}: use one of {sorted(PRESETS)} or "
                         "module:Class for your own")
    module_name, _, cls_name = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load policy {spec!r}: {e}") from e
    policy = cls()
    if not callable(getattr(policy, "decide", None)):
        raise ValueError(f"policy {spec!r} has no decide(observation) method")
    return policy
