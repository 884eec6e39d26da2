"""The gRPC service in-process on a loopback port, driven by real gRPC clients."""

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from antdt_tf import errors
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.sharding.client import ShardingClient, Task
from antdt_tf.sharding.plan import DatasetSpec
from antdt_tf.master.server import BackgroundMaster
from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import LeaseConfig, ShardState
from antdt_tf.sharding.store import StateStore, open_state

SPEC = DatasetSpec("train", records_per_shard=10, num_records=100, shuffle=True, seed=5)


@pytest.fixture
def master():
    with BackgroundMaster(ShardingServicer(ShardState(LeaseConfig()))) as m:
        yield m


@pytest.fixture
def client(master):
    with ShardingClient(master.address, Task("worker", 0), timeout=10) as c:
        c.register_dataset(SPEC)
        yield c


def snapshot_bytes(master):
    return master.call(lambda: master.server.servicer.state.snapshot().SerializeToString(
        deterministic=True))


def test_pull_report_and_progress_over_grpc(client):
    seen = []
    for shard in client.shards("train"):   # DONE is reported when the body finishes
        seen.append((shard.start, shard.length))
    assert sorted(seen) == [(i, 10) for i in range(0, 100, 10)]
    p = client.progress("train")
    assert p.datasets[0].finished and p.datasets[0].records_done_epoch == 100
    assert p.tasks[0].shards_done == 10 and p.tasks[0].state == "active"


def test_report_with_get_next_is_one_round_trip_per_shard(client):
    resp = client.get_shard("train")
    count = 0
    while resp.status == pb.GetShardResponse.SHARD:
        count += 1
        resp = client.report_done(resp.shard, get_next=True).next
    assert count == 10 and resp.status == pb.GetShardResponse.END


def test_health_service_reports_serving(master):
    with grpc.insecure_channel(master.address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for service in ("", "antdt.v1.ShardingService"):
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_save_and_restore_state_round_trip_through_bytes(client, master):
    shard = client.get_shard("train").shard
    client.report_done(shard)
    held = client.get_shard("train").shard
    saved = client.save_state(["train"])
    assert isinstance(saved, bytes)
    client.report_done(held)
    resp = client.restore_state(saved)
    assert list(resp.datasets) == ["train"] and resp.requeued_shards == 1
    with pytest.raises(errors.LeaseNotHeld):
        client.report_done(held)
    assert client.get_shard("train").shard.shard_id == held.shard_id


@pytest.mark.parametrize("call,code,error", [
    (lambda c: c.get_shard("nope"), grpc.StatusCode.NOT_FOUND, errors.UnknownDataset),
    (lambda c: c.get_shard("train", Task("Worker!", 0)), grpc.StatusCode.INVALID_ARGUMENT,
     errors.InvalidRequest),
    (lambda c: c.register_dataset(DatasetSpec("train", records_per_shard=20, num_records=100)),
     grpc.StatusCode.ALREADY_EXISTS, errors.DatasetConflict),
    (lambda c: c.register_dataset(pb.DatasetSpec(name="x", records_per_shard=0, num_records=5,
                                                  num_epochs=1)),
     grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidRequest),
    (lambda c: c.register_dataset(pb.DatasetSpec(name="x", records_per_shard=5, num_records=-5,
                                                  num_epochs=1)),
     grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidRequest),
    (lambda c: c.report_task_failure(Task("worker", 7)), grpc.StatusCode.NOT_FOUND,
     errors.UnknownTask),
    (lambda c: c.restore_state(pb.ShardingState(format_version=2)),
     grpc.StatusCode.FAILED_PRECONDITION, errors.IncompatibleState),
    (lambda c: c.restore_state(b"\xff\xff\xff"), None, errors.IncompatibleState),
])
def test_bad_calls_get_a_specific_status_and_change_nothing(client, master, call, code, error):
    client.get_shard("train")
    before = snapshot_bytes(master)
    with pytest.raises(error) as info:
        call(client)
    if code is not None:
        assert info.value.__cause__.code() == code
        assert str(info.value)  # an actionable message, not empty
    assert snapshot_bytes(master) == before


def test_stale_incarnation_and_foreign_lease_are_failed_precondition(client, master):
    shard = client.get_shard("train").shard
    relaunched = Task("worker", 0, incarnation=1)
    client.get_shard("train", relaunched)            # the old incarnation is replaced
    with pytest.raises(errors.StaleIncarnation) as info:
        client.report_done(shard)
    assert info.value.__cause__.code() == grpc.StatusCode.FAILED_PRECONDITION
    other = client.get_shard("train", Task("worker", 1)).shard
    with pytest.raises(errors.LeaseNotHeld) as info:
        client.report_done(other, task=relaunched)
    assert info.value.__cause__.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_malformed_bytes_are_invalid_argument_not_a_crash(client, master):
    before = snapshot_bytes(master)
    with grpc.insecure_channel(master.address) as ch:
        raw = ch.unary_unary("/antdt.v1.ShardingService/GetShard",
                             request_serializer=lambda b: b, response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\x0a\xff\xff\xff\xff\x0f", timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed" in info.value.details()
        unknown = ch.unary_unary("/antdt.v2.ShardingService/GetShard",
                                 request_serializer=lambda b: b, response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as info:
            unknown(b"", timeout=5)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert snapshot_bytes(master) == before
    assert client.get_shard("train").status == pb.GetShardResponse.SHARD  # still serving


def test_persistent_master_restart_in_process_keeps_leases(tmp_path):
    def start():
        state, store = ShardState(LeaseConfig()), StateStore(tmp_path / "s")
        open_state(store, state)
        return BackgroundMaster(ShardingServicer(state, store)).start()

    m = start()
    c = ShardingClient(m.address, Task("worker", 0), timeout=10)
    c.register_dataset(SPEC)
    done = c.get_shard("train").shard
    c.report_done(done)
    held = c.get_shard("train").shard
    m.stop()
    m2 = start()
    c2 = ShardingClient(m2.address, Task("worker", 0), timeout=10)
    assert c2.report_done(done).result == pb.ReportShardResponse.DUPLICATE
    assert c2.report_done(held).result == pb.ReportShardResponse.ACCEPTED
    assert c2.progress("train").datasets[0].done_shards == 2
    c.close()
    c2.close()
    m2.stop()


def test_stream_has_the_unary_semantics_and_errors(client, master):
    with client.stream() as stream:
        resp = stream.get_shard("train")
        first = resp.shard
        seen = 0
        while resp.status == pb.GetShardResponse.SHARD:
            seen += 1
            resp = stream.report_done(resp.shard, get_next=True).next
        assert seen == 10 and resp.status == pb.GetShardResponse.END
        assert stream.report_done(first).result == pb.ReportShardResponse.DUPLICATE
        with pytest.raises(errors.UnknownDataset):
            stream.get_shard("nope")
        bogus = pb.Shard(dataset="train", lease_id=999, shard_id=first.shard_id, length=10)
        with pytest.raises(errors.LeaseNotHeld):
            stream.report_done(bogus)
        assert stream.get_shard("train").status == pb.GetShardResponse.END  # still open
    assert client.progress("train").datasets[0].records_done_epoch == 100


def test_stream_answers_malformed_messages_in_stream(master):
    with grpc.insecure_channel(master.address) as ch:
        raw = ch.stream_stream("/antdt.v1.ShardingService/ShardStream",
                               request_serializer=lambda b: b,
                               response_deserializer=pb.ShardStreamResponse.FromString)
        responses = list(raw(iter([b"\x0a\xff\xff\xff\xff\x0f", b""]), timeout=5))
    assert [r.error.type for r in responses] == ["InvalidRequest", "InvalidRequest"]
    assert "malformed" in responses[0].error.message
    assert responses[0].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]


def test_stream_reconnects_across_a_master_restart(tmp_path):
    def start(port=0):
        state, store = ShardState(LeaseConfig()), StateStore(tmp_path / "s")
        open_state(store, state)
        return BackgroundMaster(ShardingServicer(state, store), port=port).start()

    m = start()
    c = ShardingClient(m.address, Task("worker", 0), timeout=20)
    c.register_dataset(SPEC)
    stream = c.stream()
    held = stream.get_shard("train").shard
    port = m.server.port
    m.stop()
    m = start(port)
    assert stream.report_done(held, get_next=True).result == pb.ReportShardResponse.ACCEPTED
    assert c.progress("train").datasets[0].done_shards == 1
    stream.close()
    c.close()
    m.stop()


def test_leaving_the_pull_loop_gives_the_shard_back_at_once(client):
    with client.stream() as stream:
        for shard in stream.shards("train"):
            break
        again = stream.get_shard("train").shard
    assert (again.shard_id, again.attempt) == (shard.shard_id, 1)
    with pytest.raises(ZeroDivisionError):
        for shard in client.shards("train"):
            1 / 0
    p = client.progress("train")
    assert p.datasets[0].done_shards == 0 and p.tasks[0].failures == 2


def test_a_paused_dataset_issues_no_lease_until_resumed(client, master):
    first = client.get_shard("train")
    assert first.status == pb.GetShardResponse.SHARD
    assert client.set_paused("train", True) is True
    assert client.progress("train").datasets[0].paused
    held = client.get_shard("train")
    assert held.status == pb.GetShardResponse.WAIT and held.retry_after_seconds > 0
    # the lease already out is trained and reported as usual
    client.report_done(first.shard)
    with pytest.raises(errors.UnknownDataset):
        client.set_paused("nope", True)
    assert client.set_paused("train", False) is False
    assert not client.progress("train").datasets[0].paused
    assert client.get_shard("train").status == pb.GetShardResponse.SHARD


def test_the_held_lease_keeper_keeps_a_dead_workers_lease_until_it_stops():
    """HeldLeaseKeeper (a trainer's thread, no TF): while it runs, the master keeps the
    dead worker's sparse lease past ``settle_seconds`` (the trainer's main thread may be
    in a long join); after it stops, the lease expires into TODO from the master's count."""
    import time

    from antdt_tf.sharding.client import HeldLeaseKeeper

    state = ShardState(LeaseConfig(settle_seconds=2.0))   # renewed every 0.1 s
    with BackgroundMaster(ShardingServicer(state)) as m, \
            ShardingClient(m.address, timeout=10) as admin:
        admin.register_dataset(SPEC)
        shard = m.call(lambda: state.get_shard("train", pb.TaskId(type="worker", index=0),
                                               sparse_ok=True).shard)
        assert shard.sparse_reports
        admin.report_task_failure(Task("worker", 0))

        def held():
            return [h.lease_id for h in admin.progress("train").datasets[0].held]
        assert held() == [shard.lease_id]
        with HeldLeaseKeeper(m.address, ["train"], every_seconds=0.1) as keeper:
            calls = keeper.calls
            while keeper.calls < calls + 40:     # 40 renewals ~ 2x settle_seconds
                assert held() == [shard.lease_id]
                time.sleep(0.05)
        deadline = time.monotonic() + 60
        while held() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not held()
        assert admin.progress("train").datasets[0].records_done_total == 0
        with pytest.raises(errors.UnknownDataset):
            admin.keep_held_leases("nope")
