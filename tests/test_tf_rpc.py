"""The master answers TensorFlow's own RPC ops (tensorflow.rpc.RpcService): a real
master, real TF ops as a worker's pipeline calls them, and bad calls rejected with the
matching tf.errors type without changing anything."""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import grpc  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from antdt_tf.proto import tf_rpc_pb2 as tpb  # noqa: E402
from antdt_tf.sharding.client import ShardingClient  # noqa: E402
from antdt_tf.sharding.plan import DatasetSpec  # noqa: E402
from antdt_tf.master.server import BackgroundMaster  # noqa: E402
from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import ShardState  # noqa: E402
from antdt_tf.tf import accounting, master_rpc, pull  # noqa: E402

I64, I32, STR = tf.int64, tf.int32, tf.string


@pytest.fixture
def master():
    with BackgroundMaster(ShardingServicer(ShardState())) as m:
        with ShardingClient(m.address) as admin:
            admin.register_dataset(DatasetSpec("d", records_per_shard=100, num_records=250))
        m.servicer = m.server.servicer
        m.server.tf_rpc.wait_seconds = 0.2
        yield m


def call(master, method, args, tout):
    client = master_rpc.rpc_client(master.address, 5000, "test")
    return [t.numpy() for t in master_rpc.rpc_call(client, method, args, tout, 5000)]


def c64(v):
    return tf.constant(v, tf.int64)


def test_open_next_report_end_with_tf_ops(master):
    (inc,) = call(master, "antdt.open", [tf.constant("d"), c64(3)], [I64])
    assert inc > 0
    leases = []
    while True:
        status, lease, shard, epoch, path, file_start, start, length, size, sparse = call(
            master, "antdt.next", [tf.constant("d"), c64(3), c64(inc), c64(len(leases) + 1)],
            master_rpc.NEXT_TYPES)
        if status != master_rpc.STATUS_SHARD:
            break
        leases.append((lease, shard, epoch, length))
    # all three shards are leased to worker 3 now; nothing is free: WAIT (long poll)
    assert status == master_rpc.STATUS_WAIT and sorted(n for *_, n in leases) == [50, 100, 100]
    master.server.tf_rpc.wait_seconds = 30     # a BSP round's call does not wait for it
    t0 = time.monotonic()
    status, *_ = call(master, "antdt.next", [tf.constant("d"), c64(3), c64(inc),
                                             c64(len(leases) + 2), c64(0)], master_rpc.NEXT_TYPES)
    assert status == master_rpc.STATUS_WAIT and time.monotonic() - t0 < 10
    master.server.tf_rpc.wait_seconds = 0.2
    lease, shard, epoch, length = leases[0]
    (rejected,) = call(master, "antdt.report", [
        tf.constant("d"), c64(3), c64(inc), c64([lease]), c64([shard]),
        tf.constant([epoch], tf.int32), c64([length - 10])], [I64])
    assert rejected == 0
    task = [t for t in master.call(master.servicer.state.progress, "d").tasks][0]
    assert (task.task.type, task.task.index, task.doing_shards) == ("worker", 3, 3)
    for lease, shard, epoch, length in leases:
        call(master, "antdt.report", [tf.constant("d"), c64(3), c64(inc), c64([lease]),
                                      c64([shard]), tf.constant([epoch], tf.int32),
                                      c64([length])], [I64])
    progress = master.call(master.servicer.state.progress, "d").datasets[0]
    assert progress.finished and progress.records_done_total == 250
    status, *_ = call(master, "antdt.next", [tf.constant("d"), c64(3), c64(inc), c64(99)],
                      master_rpc.NEXT_TYPES)
    assert status == master_rpc.STATUS_END


def test_a_new_incarnation_takes_back_the_old_ones_leases(master):
    nxt = master_rpc.NEXT_TYPES
    (old,) = call(master, "antdt.open", [tf.constant("d"), c64(0)], [I64])
    first = call(master, "antdt.next", [tf.constant("d"), c64(0), c64(old), c64(1)], nxt)
    retried = call(master, "antdt.next", [tf.constant("d"), c64(0), c64(old), c64(1)], nxt)
    assert retried[1] == first[1]          # same request id: the same lease, not a second
    call(master, "antdt.report", [tf.constant("d"), c64(0), c64(old), c64([first[1]]),
                                  c64([first[2]]), tf.constant([first[3]], tf.int32),
                                  c64([30])], [I64])
    (new,) = call(master, "antdt.open", [tf.constant("d"), c64(0)], [I64])
    assert new > old
    # the open itself replaced the old incarnation: its lease is back, from its offset
    p = master.call(master.servicer.state.progress, "d").datasets[0]
    assert p.doing_shards == 0 and p.records_done_total == 30
    again = call(master, "antdt.next", [tf.constant("d"), c64(0), c64(new), c64(1)], nxt)
    # the same shard again, resuming after the 30 records the old incarnation applied
    assert again[2] == first[2] and again[6] == first[6] + 30 and again[7] == first[7] - 30
    (rejected,) = call(master, "antdt.report", [
        tf.constant("d"), c64(0), c64(old), c64([first[1]]), c64([first[2]]),
        tf.constant([first[3]], tf.int32), c64([40])], [I64])
    # a late report of the replaced incarnation is refused and not counted
    assert rejected == 1
    lease = master.call(master.servicer.state.progress, "d").datasets[0]
    assert lease.records_done_total == 30     # the 30 reported before, not the stale 40


@pytest.mark.parametrize("method,args,tout,error", [
    ("antdt.open", lambda: [tf.constant("nope"), c64(0)], [I64], tf.errors.NotFoundError),
    ("antdt.open", lambda: [c64(1), c64(0)], [I64], tf.errors.InvalidArgumentError),
    ("antdt.open", lambda: [tf.constant("d")], [I64], tf.errors.InvalidArgumentError),
    ("antdt.open", lambda: [tf.constant("d"), c64(-1)], [I64], tf.errors.InvalidArgumentError),
    ("antdt.open", lambda: [tf.constant("d"), c64(0), c64(2)], [I64],
     tf.errors.InvalidArgumentError),
    ("antdt.fly", lambda: [], [I64], tf.errors.NotFoundError),
    ("antdt.report", lambda: [tf.constant("d"), c64(0), c64(1), c64([1, 2]), c64([1]),
                              tf.constant([0], tf.int32), c64([1])], [I64],
     tf.errors.InvalidArgumentError),
    ("antdt.report", lambda: [tf.constant("d"), c64(0), c64(1), c64([1]), c64([1]),
                              tf.constant([0], tf.int32), c64([1]), c64(-3), c64(1)], [I64],
     tf.errors.InvalidArgumentError),
    ("antdt.next", lambda: [tf.constant("d"), c64(0), c64(1), c64(1), c64(-1)],
     master_rpc.NEXT_TYPES, tf.errors.InvalidArgumentError),
    ("antdt.step", lambda: [tf.constant("d"), c64(0), c64(1), c64(-5), c64(10)], [I64],
     tf.errors.InvalidArgumentError),
    ("antdt.step", lambda: [tf.constant("nope"), c64(0), c64(1), c64(5), c64(10)], [I64],
     tf.errors.NotFoundError),
    ("antdt.step", lambda: [tf.constant("d"), c64(0), c64(1), tf.constant(1.5), c64(10)],
     [I64], tf.errors.InvalidArgumentError),
])
def test_bad_calls_raise_the_matching_tf_error(master, method, args, tout, error):
    with pytest.raises(error):
        call(master, method, args(), tout)
    assert master.call(master.servicer.state.progress, "d").datasets[0].doing_shards == 0


def test_adjusted_batch_sizes_reach_the_next_lease(master):
    """ADJUST_BS: the Controller's size for a worker comes with that worker's next
    lease (0 = its own); other workers keep theirs; bad sizes change nothing."""
    with ShardingClient(master.address) as admin:
        assert admin.set_batch_sizes("d", {1: 48}) == {1: 48}
        for bad in ({1: 0}, {-1: 8}, {2: 1 << 30}):
            with pytest.raises(Exception, match="batch size|worker index"):
                admin.set_batch_sizes("d", bad)
        with pytest.raises(Exception, match="unknown dataset"):
            admin.set_batch_sizes("nope", {1: 8})
        assert admin.progress("d").datasets[0].batch_sizes == {1: 48}
        sizes = {}
        for w in (0, 1):
            (inc,) = call(master, "antdt.open", [tf.constant("d"), c64(w)], [I64])
            sizes[w] = call(master, "antdt.next", [tf.constant("d"), c64(w), c64(inc), c64(1)],
                            master_rpc.NEXT_TYPES)[8]
        assert sizes == {0: 0, 1: 48}
        assert admin.set_batch_sizes("d", {0: 16}, replace=True) == {0: 16}


def test_bsp_step_times_measured_on_the_worker_feed_the_monitor(master):
    (inc,) = call(master, "antdt.open", [tf.constant("d"), c64(2)], [I64])
    for _ in range(6):    # all at once: arrival gaps say nothing, the worker's clock does
        call(master, "antdt.step", [tf.constant("d"), c64(2), c64(inc), c64(100),
                                    c64(250_000)], [I64])
    view = master.server.monitor.view
    judged = {j.index: j for j in view.classifier.judge(time.time()) if j.job == "worker"}
    assert judged[2].samples == 6
    assert judged[2].records_per_second == pytest.approx(400.0)
    (new,) = call(master, "antdt.open", [tf.constant("d"), c64(2)], [I64])
    call(master, "antdt.next", [tf.constant("d"), c64(2), c64(new), c64(1)], master_rpc.NEXT_TYPES)
    with pytest.raises(tf.errors.FailedPreconditionError):   # a replaced incarnation
        call(master, "antdt.step", [tf.constant("d"), c64(2), c64(inc), c64(1), c64(1)], [I64])


def test_malformed_bytes_are_invalid_argument(master):
    with grpc.insecure_channel(master.address) as ch:
        raw = ch.unary_unary("/tensorflow.rpc.RpcService/Call")
        with pytest.raises(grpc.RpcError) as e:
            raw(b"\x0a\xff\xff\xff", timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        listed = ch.unary_unary("/tensorflow.rpc.RpcService/List",
                                response_deserializer=tpb.TfListResponse.FromString)(b"", timeout=10)
        assert {m.method for m in listed.registered_methods} == {
            "antdt.open", "antdt.next", "antdt.report", "antdt.step"}


def _ancestors(op):
    seen, todo = set(), [op]
    while todo:
        o = todo.pop()
        for parent in [t.op for t in o.inputs] + list(o.control_inputs):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def test_the_report_waits_for_every_update_of_the_step(master):
    """Auto control dependencies order ops per resource only: the report RPC must be
    ordered after the step's updates explicitly, or a worker killed between the two has
    reported records the model never saw."""
    v, audit = tf.Variable(1.0), tf.Variable(tf.zeros([4], tf.int32))
    meta = {"lease": c64([1]), "shard": c64([0]), "epoch": tf.constant([0]),
            "applied": c64([4]), "length": c64([100]), "worker": c64(0),
            "incarnation": c64(1)}

    def step():
        v.assign_sub(0.5)
        audit.scatter_add(tf.IndexedSlices(tf.ones([2], tf.int32), c64([0, 1])))
        return v.read_value()

    awaited = []

    @tf.function
    def train():
        _, effects = accounting.run_step(step)
        awaited.extend(op.type for op in effects)
        with tf.control_dependencies(effects):
            accounting.report_applied(master.address, "d", meta, timeout_ms=5000)

    graph = train.get_concrete_function().graph
    # the writes are awaited, the step's reads are not (a PS read crossing to the
    # worker per step for nothing)
    assert sorted(awaited) == ["AssignSubVariableOp", "ResourceScatterAdd"], awaited
    updates = [op for op in graph.get_operations()
               if op.type in ("AssignSubVariableOp", "ResourceScatterAdd")]
    assert len(updates) == 2
    # the first attempt's call, and the conditional retries (nested in an If)
    calls = [op for op in graph.get_operations() if op.type == "RpcCall"]
    retries = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
    assert len(calls) == 1 and retries
    assert all(set(updates) <= _ancestors(op) for op in calls + retries)


def test_sparse_reports_open_next_report_and_the_held_lease(master):
    """A sparse-capable incarnation gets sparse leases; a relaunch gets the other parity
    (two PS records per worker slot, by parity) and holds the old one's sparse lease
    until the trainer settles it; a report may carry the worker's own step time."""
    d = tf.constant("d")
    (inc,) = call(master, "antdt.open", [d, c64(5), c64(1)], [I64])
    status, lease, shard, epoch, *_, sparse = call(
        master, "antdt.next", [d, c64(5), c64(inc), c64(1)], master_rpc.NEXT_TYPES)
    assert status == master_rpc.STATUS_SHARD and sparse == 1
    steps = []
    master.server.tf_rpc.on_step = lambda *a: steps.append(a)
    (rejected,) = call(master, "antdt.report", [d, c64(5), c64(inc), c64([lease]), c64([shard]),
                                                tf.constant([epoch], tf.int32), c64([40]),
                                                c64(250_000), c64(5)], [I64])
    assert rejected == 0 and steps == [(5, inc, 40, 0.25, 5)]
    (again,) = call(master, "antdt.open", [d, c64(5)], [I64])
    assert (again - inc) % 2 == 1
    # held from the open on (before the new incarnation asks for anything): the chief
    # can settle it while the new pipeline has not pulled yet
    held = master.call(master.servicer.state.progress, "d").datasets[0].held
    assert [(h.lease_id, h.holder.incarnation, h.applied) for h in held] == [(lease, inc, 40)]
    *_, sparse = call(master, "antdt.next", [d, c64(5), c64(again), c64(1)], master_rpc.NEXT_TYPES)
    assert sparse == 0                              # opened without sparse = 1
    held = master.call(master.servicer.state.progress, "d").datasets[0].held
    assert [(h.lease_id, h.holder.incarnation, h.applied) for h in held] == [(lease, inc, 40)]
    with ShardingClient(master.address) as admin:
        assert admin.apply_lease_record("d", lease, held[0].holder, 70)
        assert not admin.apply_lease_record("d", lease, held[0].holder, 80)
        p = admin.progress("d").datasets[0]
    assert not p.held and p.records_done_total == 70


def test_pulled_batches_carry_each_record_once_from_its_place_with_its_id_and_position(
        tmp_path):
    """pull_dataset's batches, as a worker trains them: every record of the file once,
    decoded from its own place in the file, with its ``record_id`` and ``applied`` (its
    1-based position in its lease) — leases that are not a multiple of the batch size,
    and the Controller's batch size for a later lease (ADJUST_BS)."""
    import numpy as np

    from antdt_tf.data import criteo, records
    from antdt_tf.data.records import RecordFile
    from antdt_tf.sharding.plan import DataFile

    n = 250
    path = str(tmp_path / "f.adtr")
    records.write_records(path, criteo.generate(criteo.SyntheticSpec(n, seed=3)))
    expected = RecordFile(path).read(0, n)
    with BackgroundMaster(ShardingServicer(ShardState())) as m:
        with ShardingClient(m.address) as admin:
            admin.register_dataset(DatasetSpec("f", records_per_shard=100,
                                               files=(DataFile(path, n),)))
            batches = []
            for batch in pull.pull_dataset(m.address, "f", 32, worker=0):
                batches.append({k: v.numpy() for k, v in batch.items() if k != "antdt"}
                               | {"lease": batch["antdt"]["lease"].numpy(),
                                  "applied": batch["antdt"]["applied"].numpy(),
                                  "length": batch["antdt"]["length"].numpy()})
                if len(batches) == 1:     # from the next lease on: 24 a batch
                    admin.set_batch_sizes("f", {0: 24})
                assert accounting.report_applied(m.address, "f", batch["antdt"]).numpy() == 0
    ids = np.concatenate([b["record_id"] for b in batches])
    assert sorted(ids.tolist()) == list(range(n))                 # each record once
    for key in ("label", "dense", "sparse"):                      # read from its place
        np.testing.assert_array_equal(np.concatenate([b[key] for b in batches]),
                                      getattr(expected, key)[ids])
    sizes, positions = {}, {}      # per lease, in the order the leases came
    for b in batches:
        lease = int(b["lease"][0])
        assert (b["lease"] == lease).all() and (b["length"] == b["length"][0]).all()
        sizes.setdefault(lease, []).append(len(b["record_id"]))
        positions.setdefault(lease, []).extend(b["applied"].tolist())
        start = b["record_id"] - b["applied"]      # the lease's first record id, less 1
        assert (start == start[0]).all()
    assert sorted(len(a) for a in positions.values()) == [50, 100, 100]
    for i, (lease, applied) in enumerate(positions.items()):
        assert applied == list(range(1, len(applied) + 1))
        size = 32 if i == 0 else 24                # the Controller's size from lease 2 on
        whole, rest = divmod(len(applied), size)
        assert sizes[lease] == [size] * whole + ([rest] if rest else [])


@pytest.mark.parametrize("sparse_reports", [False, True])
def test_the_report_rule_and_its_graph_twin_agree(sparse_reports):
    """One report rule for every per-step trainer: the TF1 hooks' (Python) and the graph
    ops of PullTrainer and the Keras step give the same answer in every case."""
    from antdt_tf.sharding.tf_rpc_client import report_due

    cases = [(s, a, n) for s in (0, 1) for n in (1, 8, 100) for a in range(0, n + 1)]
    graph = [bool(accounting.report_due_tensor(sparse_reports, c64(s), c64(a), c64(n)).numpy())
             for s, a, n in cases]
    python = [report_due(sparse_reports, s, a, n) for s, a, n in cases]
    assert graph == python
    # the rule itself: per batch without sparse reports; with them the lease's last
    # batch and every batch of a lease the master wants per batch
    assert all(python) if not sparse_reports else python == [
        s == 0 or a >= n for s, a, n in cases]
