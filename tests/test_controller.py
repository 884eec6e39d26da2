"""Controller policies and their cost model (pure Python): which straggler class
triggers which action under AntDT-ND and AntDT-DD, and only when it pays off."""

import sys
import types

import pytest

from antdt_tf.controller import (AdjustBatchSizes, AntDTDD, AntDTND, CostModel, DynamicOnly,
                                 Observation, Policy, RelaunchWorker, ReplacePs, TaskView,
                                 balanced_batch_sizes, load_policy)


def worker(i, cls="normal", slowness=1.0, rate=10_000.0, batch=256):
    return TaskView("worker", i, cls, slowness, rate, batch / rate, samples=50)


def ps(i, cls="normal", slowness=1.0, latency=2.0):
    return TaskView("ps", i, cls, slowness, latency_ms=latency, samples=10)


def obs(workers, pss=(), remaining=2_000_000, costs=None, busy=frozenset(), **extra):
    return Observation(now=0.0, workers=tuple(workers), ps=tuple(pss),
                       remaining_records=remaining, costs=costs or CostModel(), busy=busy,
                       **extra)


SLOW_WORKER = [worker(0), worker(1), worker(2, "persistent", 4.0, 2_500.0)]


def bsp(workers, sizes=(), remaining=2_000_000, busy=frozenset()):
    return obs(workers, remaining=remaining, busy=busy, mode="bsp", batch_size=256,
               batch_sizes=tuple(sizes))


def test_adjust_bs_sizes_follow_speed_and_keep_the_global_batch():
    hetero = [worker(0), worker(1, "deterministic", 2.0, 5_000.0), worker(2)]
    sizes = balanced_batch_sizes(bsp(hetero))
    assert sum(sizes.values()) == 3 * 256
    assert sizes[1] == pytest.approx(sizes[0] / 2, abs=2) and sizes[0] == pytest.approx(
        sizes[2], abs=2)
    unmeasured = TaskView("worker", 3, samples=2)
    assert balanced_batch_sizes(bsp(hetero + [unmeasured])) == {}
    for policy in (AntDTDD(), AntDTND()):    # in BSP, both presets first rebalance
        (action,) = policy.decide(bsp(hetero))
        assert isinstance(action, AdjustBatchSizes) and dict(action.sizes) == sizes
        assert "rounds 51 -> 31 ms" in action.reason
        # in force already (rounds balanced): nothing more to gain from ADJUST_BS
        assert not any(isinstance(a, AdjustBatchSizes)
                       for a in policy.decide(bsp(hetero, sizes=sizes.items())))
    assert AntDTDD().decide(obs(hetero)) == []          # async: dynamic sharding balances
    assert AntDTDD().decide(bsp(hetero, busy=frozenset({("chief", 0)}))) == []
    assert AntDTDD().decide(bsp(hetero, remaining=2_000)) == []     # too little left
    assert DynamicOnly().decide(bsp(hetero)) == []      # the baselines never act


def test_relaunch_gain_follows_the_arithmetic():
    o = obs(SLOW_WORKER, remaining=2_000_000, costs=CostModel(relaunch_worker_seconds=10))
    # without: 2e6 / 22,500 = 88.9 s; with: 10 s at 20,000/s, then 1.8e6 at 30,000/s = 70 s
    assert o.costs.relaunch_worker_gain(o, 2) == pytest.approx(88.889 - 70.0, abs=0.01)
    short = obs(SLOW_WORKER, remaining=100_000, costs=CostModel(relaunch_worker_seconds=10))
    assert short.costs.relaunch_worker_gain(short, 2) < 0     # ends before it would pay


def test_nd_relaunches_persistent_and_deterministic_workers_dd_only_persistent():
    assert AntDTND().decide(obs(SLOW_WORKER)) == [RelaunchWorker(
        worker=2, reason=AntDTND().decide(obs(SLOW_WORKER))[0].reason)]
    assert "persistent straggler" in AntDTND().decide(obs(SLOW_WORKER))[0].reason
    assert isinstance(AntDTDD().decide(obs(SLOW_WORKER))[0], RelaunchWorker)
    hardware = [worker(0), worker(1), worker(2, "deterministic", 4.0, 2_500.0)]
    assert isinstance(AntDTND().decide(obs(hardware))[0], RelaunchWorker)
    assert AntDTDD().decide(obs(hardware)) == []     # an equal host would not be faster


def test_transient_stragglers_are_left_to_dynamic_sharding():
    burst = [worker(0), worker(1), worker(2, "transient", 4.0, 2_500.0)]
    assert AntDTND().decide(obs(burst)) == [] and AntDTDD().decide(obs(burst)) == []


def test_no_action_when_it_would_not_pay_or_the_task_is_busy():
    assert AntDTND().decide(obs(SLOW_WORKER, remaining=50_000)) == []
    assert AntDTND().decide(obs(SLOW_WORKER, busy=frozenset({("worker", 2)}))) == []
    assert DynamicOnly().decide(obs(SLOW_WORKER)) == []


def test_a_slow_ps_is_replaced_first_and_only_when_it_pays():
    workers = [worker(i, rate=5_000.0) for i in range(3)]      # 51 ms per step
    slow_ps = [ps(0, "persistent", 12.0, 25.0), ps(1)]
    (action,) = AntDTND().decide(obs(workers + [worker(3, "persistent", 4, 1_250.0)],
                                     slow_ps, remaining=3_000_000))
    assert action == ReplacePs(ps=0, reason=action.reason)
    o = obs(workers, slow_ps, remaining=3_000_000)
    # step 51.2 ms, 23 ms of it waiting on ps:0 -> 1.82x faster after; 200 s -> 30 + 110 s
    assert o.costs.replace_ps_gain(o, 0) == pytest.approx(200 - (30 + 200 * 28.2 / 51.2),
                                                          abs=0.5)
    assert AntDTND().decide(obs(workers, slow_ps, remaining=100_000)) == []
    # the job ran 2.5x faster before the PS slowed down: that is the rate to expect back
    fast_before = Observation(0.0, tuple(workers), tuple(slow_ps), 3_000_000, CostModel(),
                              best_records_per_second=37_500.0)
    assert fast_before.costs.replace_ps_gain(fast_before, 0) == pytest.approx(
        200 - (30 + 80), abs=0.5)
    redo = Observation(0.0, tuple(workers), tuple(slow_ps), 3_000_000,
                       CostModel(redo_seconds=5.0), best_records_per_second=37_500.0)
    assert redo.costs.replace_ps_gain(redo, 0) == pytest.approx(200 - (30 + 5 + 80), abs=0.5)
    assert AntDTDD().decide(obs(workers, [ps(0, "deterministic", 12.0, 25.0), ps(1)],
                                remaining=3_000_000)) == []


def test_load_policy_by_name_or_module_class_with_clear_errors():
    assert isinstance(load_policy("antdt-nd"), AntDTND)
    assert isinstance(load_policy("antdt-dd"), AntDTDD)
    assert isinstance(load_policy("dynamic"), DynamicOnly)
    mod = types.ModuleType("my_policies")

    class RelaunchVerySlow(Policy):
        name = "very-slow"

        def decide(self, o):
            return [RelaunchWorker(worker=w.index) for w in o.workers if w.slowness >= 4]

    mod.RelaunchVerySlow, mod.NotAPolicy = RelaunchVerySlow, object
    sys.modules["my_policies"] = mod
    try:
        custom = load_policy("my_policies:RelaunchVerySlow")
        assert custom.decide(obs(SLOW_WORKER)) == [RelaunchWorker(worker=2)]
        with pytest.raises(ValueError, match="no decide"):
            load_policy("my_policies:NotAPolicy")
        with pytest.raises(ValueError, match="cannot load"):
            load_policy("my_policies:Missing")
    finally:
        del sys.modules["my_policies"]
    with pytest.raises(ValueError, match="unknown policy 'fast'"):
        load_policy("fast")
    with pytest.raises(ValueError, match="cannot load"):
        load_policy("no_such_module_xyz:Policy")


def test_policy_traits_read_a_duck_typed_policy_with_the_base_defaults():
    """A user's policy need not subclass Policy: what it leaves out has Policy's value,
    and a sharding mode the master does not know is refused when the job is checked."""
    from antdt_tf.controller import AntDTND, PolicyTraits, StaticSharding

    class Bare:
        def decide(self, obs):
            return []

    class Odd(Bare):
        sharding = "round-robin"

    assert PolicyTraits.of(Bare()) == PolicyTraits("dynamic", False, False)
    assert PolicyTraits.of(StaticSharding()).sharding == "static"
    assert PolicyTraits.of(AntDTND()).tail_stealing is AntDTND.tail_stealing
    with pytest.raises(ValueError, match="sharding must be"):
        PolicyTraits.of(Odd())
