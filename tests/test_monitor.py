"""Monitor: BPT windows and the three straggler classes (pure Python, a synthetic clock),
and the same judgement served by a real master from real step reports over TF's RPC
wire messages."""

import pytest

from antdt_tf.monitor.straggler import (DETERMINISTIC, NORMAL, NOT_ENOUGH, PERSISTENT,
                                        TRANSIENT, BptWindow, StragglerClassifier,
                                        StragglerConfig)
from antdt_tf.monitor.view import ClusterView
from antdt_tf.proto import cluster_pb2 as cpb

CFG = StragglerConfig(window_seconds=4, persistent_after_seconds=6, min_samples=3,
                      slow_ratio=1.5, idle_gap_seconds=2)


def drive(classifier, seconds, slow_factor, start=0.0, step=0.1, workers=3, slow_worker=2,
          incarnation=1):
    """Every worker steps each `step` seconds; `slow_factor(t)` stretches worker 2's."""
    t, nxt = start, {w: start + step for w in range(workers)}
    judgements = []
    while t < start + seconds:
        t = round(t + step / 4, 6)
        for w in range(workers):
            if t >= nxt[w]:
                classifier.observe_step(w, incarnation, t, 256)
                f = slow_factor(t) if w == slow_worker else 1.0
                nxt[w] = t + step * f
        judged = {j.index: j for j in classifier.judge(t) if j.job == "worker"}
        if len(judged) == workers:
            judgements.append((t, judged))
    return judgements


def classes_of(judgements, worker=2):
    out = []
    for _, js in judgements:
        c = js[worker].straggler_class
        if not out or out[-1] != c:
            out.append(c)
    return out


def test_bpt_window_median_rate_and_idle_gaps():
    w = BptWindow(window_seconds=10, idle_gap_seconds=1)
    for t in (1.0, 1.1, 1.2, 1.4, 5.0, 5.1):   # 1.4 -> 5.0 is idle (waiting), not slowness
        w.add(t, 100)
    assert len(w) == 4
    assert w.step_seconds() == pytest.approx(0.1)
    assert w.records_per_second() == pytest.approx(400 / 0.5)
    w.trim(14.5)                                 # the window moves on
    assert len(w) == 1


def test_a_sparse_report_counts_its_steps_and_the_workers_own_time():
    """One report per lease (sparse reports): 8 steps of 32 records in 0.4 s of the
    worker's own time count as 8 steps of 0.05 s; the gap since the last report (which
    includes waiting between closures) does not matter."""
    w = BptWindow(window_seconds=10, idle_gap_seconds=1)
    w.add(1.0, 256, seconds=0.4, steps=8)
    w.add(3.0, 256, seconds=0.4, steps=8)
    assert len(w) == 16
    assert w.step_seconds() == pytest.approx(0.05)
    assert w.records_per_second() == pytest.approx(512 / 0.8)


def test_transient_burst_is_transient_then_normal_again():
    c = StragglerClassifier(CFG)
    js = drive(c, 20, lambda t: 4.0 if 6 <= t < 9 else 1.0)
    assert classes_of(js) == [NOT_ENOUGH, NORMAL, TRANSIENT, NORMAL]
    slow = [j[2].slowness for _, j in js if j[2].straggler_class == TRANSIENT]
    assert max(slow) > 2


def test_slow_after_being_normal_becomes_persistent():
    c = StragglerClassifier(CFG)
    js = drive(c, 25, lambda t: 4.0 if t >= 6 else 1.0)
    assert classes_of(js) == [NOT_ENOUGH, NORMAL, TRANSIENT, PERSISTENT]
    t_persistent = next(t for t, j in js if j[2].straggler_class == PERSISTENT)
    since = next(j[2].slow_since for t, j in js if j[2].straggler_class == PERSISTENT)
    assert t_persistent - since == pytest.approx(CFG.persistent_after_seconds, abs=0.1)
    assert all(j[w].straggler_class == NORMAL for _, j in js[-5:] for w in (0, 1))


def test_slow_from_the_start_is_deterministic():
    c = StragglerClassifier(CFG)
    js = drive(c, 20, lambda t: 2.5)
    assert classes_of(js) == [NOT_ENOUGH, TRANSIENT, DETERMINISTIC]


def test_a_relaunched_worker_starts_a_fresh_history():
    c = StragglerClassifier(CFG)
    drive(c, 20, lambda t: 2.5)
    js = drive(c, 12, lambda t: 1.0, start=20.0, incarnation=2)
    assert classes_of(js)[-1] == NORMAL
    assert js[-1][1][2].incarnation == 2


def test_ps_latency_against_the_fastest_ps_and_a_lone_ps_against_itself():
    c = StragglerClassifier(CFG)
    for k in range(30):
        t = float(k)
        c.observe_ps_latency(0, t, 25.0 if k >= 8 else 2.0)   # stopped 2/3 of the time
        c.observe_ps_latency(1, t, 2.0 + (k % 3) * 0.2)
        judged = {j.index: j for j in c.judge(t) if j.job == "ps"}
        if k == 12:
            assert judged[0].straggler_class == TRANSIENT
            assert judged[1].straggler_class == NORMAL
    assert judged[0].straggler_class == PERSISTENT and judged[0].slowness > 8
    alone = StragglerClassifier(CFG)
    for k in range(30):
        alone.observe_ps_latency(0, float(k), 30.0 if k >= 10 else 3.0)
        (j,) = alone.judge(float(k))   # judged every second, as the master does
    assert j.straggler_class == PERSISTENT
    # load that slows every PS alike is nobody's fault
    both = StragglerClassifier(CFG)
    for k in range(30):
        for p in (0, 1):
            both.observe_ps_latency(p, float(k), 20.0 if k >= 10 else 2.0)
    assert {j.straggler_class for j in both.judge(29.0)} == {NORMAL}


def test_a_ps_whose_peers_lack_probes_is_not_judged_against_itself():
    """Two PS; after a new chief the windows start over. While only ps:1 has probes
    again, it must not be compared with its own best (a loaded, restarting cluster made
    it look 1.8x slower than its quiet past: CI saw the healthy PS replaced)."""
    c = StragglerClassifier(CFG)
    for k in range(20):
        c.observe_ps_latency(0, float(k), 2.0)
        c.observe_ps_latency(1, float(k), 2.0)
    c.forget_ps()
    for k in range(20, 60):
        c.observe_ps_latency(1, float(k), 12.0)    # 6x its quiet past, no peer probes
        judged = {j.index: j for j in c.judge(float(k)) if j.job == "ps"}
        assert judged[1].straggler_class == NOT_ENOUGH and judged[1].slowness == 0
    assert 0 not in judged
    for k in range(60, 70):                         # the peer is back: compared again
        c.observe_ps_latency(0, float(k), 12.0)
        c.observe_ps_latency(1, float(k), 12.0)
    assert {j.straggler_class for j in c.judge(69.0)} == {NORMAL}


def test_a_new_chief_restarts_the_ps_windows():
    view = ClusterView(clock=lambda: now[0], straggler=CFG)
    now = [0.0]
    for k in range(1, 30):
        now[0] = float(k)
        view.report_trainer(cpb.TrainerReport(
            task=cpb.TaskRef(job="chief"), incarnation=1, seq=k,
            ps_latency=[cpb.PsLatency(ps=0, latency_ms=30.0 if k > 5 else 2.0),
                        cpb.PsLatency(ps=1, latency_ms=2.0)]))
        view.tick()
    assert {h.task.index: h for h in view.health()}[0].straggler_class == \
        cpb.TaskHealth.PERSISTENT
    now[0] = 31.0     # ps:0 replaced; the restarted chief reports
    view.report_trainer(cpb.TrainerReport(
        task=cpb.TaskRef(job="chief"), incarnation=2, seq=1,
        ps_latency=[cpb.PsLatency(ps=0, latency_ms=2.0), cpb.PsLatency(ps=1, latency_ms=2.0)]))
    health = {h.task.index: h for h in view.health()}
    assert health[0].samples == 1 and health[0].straggler_class == \
        cpb.TaskHealth.STRAGGLER_CLASS_UNSPECIFIED


def test_slow_probes_still_judge_a_slow_ps():
    """A loaded chief reports every 5 s: 2 probes fit the 8 s PS window, fewer than the
    3 needed, but the newest 3 (within three windows) still judge the PS."""
    c = StragglerClassifier(CFG)
    for k in range(0, 60, 5):
        c.observe_ps_latency(0, float(k), 40.0)
        c.observe_ps_latency(1, float(k), 4.0)
        judged = {j.index: j for j in c.judge(float(k)) if j.job == "ps"}
    assert judged[0].samples == 3 and judged[0].straggler_class == DETERMINISTIC
    assert judged[1].straggler_class == NORMAL


def test_small_absolute_ps_differences_are_not_stragglers():
    c = StragglerClassifier(CFG)
    for k in range(20):
        c.observe_ps_latency(0, float(k), 0.5)
        c.observe_ps_latency(1, float(k), 1.5)     # 3x, but only 1 ms
    assert {j.straggler_class for j in c.judge(19.0)} == {NORMAL}


@pytest.mark.parametrize("bad", [dict(slow_ratio=1.0), dict(window_seconds=0),
                                 dict(min_samples=0), dict(persistent_after_seconds=-1)])
def test_bad_config_is_refused(bad):
    with pytest.raises(ValueError):
        StragglerConfig(**bad)


def test_the_master_judges_workers_from_their_step_reports():
    """Real master, real gRPC, TF's own RPC ops as the workers' pipelines call them: three
    workers report trained batches; one reports 4x less often. GetClusterStatus names it
    with its class and speed.

    The master times a report by its arrival on its clock; here that clock is the
    test's: it moves 20 ms between rounds of reports, so the master sees exactly the
    rhythm the test sends however long the calls take on a loaded machine (the windows'
    arithmetic is the synthetic-clock tests' above; this one is the wiring, from TF's
    ops through the master's Monitor to GetClusterStatus)."""
    import tensorflow as tf

    from antdt_tf.monitor.client import MonitorClient
    from antdt_tf.monitor.service import ClusterMonitorServicer
    from antdt_tf.monitor.view import ClusterView, straggler_class_name
    from antdt_tf.sharding.client import ShardingClient
    from antdt_tf.sharding.plan import DatasetSpec
    from antdt_tf.master.server import BackgroundMaster
    from antdt_tf.sharding.service import ShardingServicer
    from antdt_tf.sharding.state import ShardState
    from antdt_tf.tf import master_rpc

    now = [1000.0]
    tick_seconds = 0.02
    cfg = StragglerConfig(window_seconds=2, persistent_after_seconds=0.6, min_samples=3)
    monitor_servicer = ClusterMonitorServicer(ClusterView(clock=lambda: now[0], straggler=cfg))
    with BackgroundMaster(ShardingServicer(ShardState()), monitor=monitor_servicer) as master, \
            ShardingClient(master.address) as admin, MonitorClient(master.address) as monitor:
        admin.register_dataset(DatasetSpec("d", num_records=1_000_000, records_per_shard=10_000))
        client = master_rpc.rpc_client(master.address, 5000, "test")
        i64 = lambda v: tf.constant(v, tf.int64)  # noqa: E731

        def call(method, args, tout):
            return [t.numpy() for t in master_rpc.rpc_call(client, method, args, tout, 5000)]

        name, leases = tf.constant("d"), []
        for w in range(3):
            (inc,) = call("antdt.open", [name, i64(w)], [tf.int64])
            _, lease, shard, epoch, *_ = call(
                "antdt.next", [name, i64(w), i64(inc), i64(1)], master_rpc.NEXT_TYPES)
            leases.append((inc, lease, shard, epoch))
        applied, seen = [0, 0, 0], []
        for tick in range(80):
            for w, (inc, lease, shard, epoch) in enumerate(leases):
                if w != 2 or tick % 4 == 0:
                    applied[w] += 100
                    (rejected,) = call("antdt.report", [
                        name, i64(w), i64(inc), i64([lease]), i64([shard]),
                        tf.constant([epoch], tf.int32), i64([applied[w]])], [tf.int64])
                    assert rejected == 0
            # someone watching the job (the launcher's Controller asks every round)
            health = {(h.task.job, h.task.index): h for h in monitor.status().health}
            slow_class = straggler_class_name(health["worker", 2].straggler_class)
            if not seen or seen[-1][1] != slow_class:
                seen.append((round(now[0] - 1000.0, 2), slow_class))
            now[0] += tick_seconds
    slow = health["worker", 2]
    # not judged until it has min_samples steps in its window (4 reports: 12 rounds),
    # slow from then on, deterministic once that lasted persistent_after_seconds
    assert [c for _, c in seen] == ["unknown", "transient", "deterministic"], seen
    (_, _), (slow_at, _), (class_at, _) = seen
    assert slow_at == pytest.approx(12 * tick_seconds)
    # (the clock's float steps may land a hair short of 0.6 s: then the next round)
    assert -1e-9 < class_at - (slow_at + cfg.persistent_after_seconds) < 2 * tick_seconds, seen
    assert slow.straggler_class == cpb.TaskHealth.DETERMINISTIC
    assert slow.slowness == pytest.approx(4.0)
    assert health["worker", 0].straggler_class == cpb.TaskHealth.NORMAL
    assert health["worker", 0].records_per_second == pytest.approx(100 / tick_seconds)
    assert slow.records_per_second == pytest.approx(100 / (4 * tick_seconds))
    assert slow.step_seconds == pytest.approx(4 * tick_seconds)
    assert health["worker", 0].step_seconds == pytest.approx(tick_seconds)
