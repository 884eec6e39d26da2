"""Issue 17, "No request may break the master": the cases that broke it, against a real
master (in-process over gRPC with a state dir, and the antdt-master process)."""

import signal

import grpc
import pytest

from antdt_tf.errors import CorruptState, MAX_MESSAGE_CHARS
from antdt_tf.master.server import BackgroundMaster
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.sharding.plan import DatasetSpec
from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import LeaseConfig, ShardState
from antdt_tf.sharding.store import StateStore, open_state
from procs import MasterProcess, run_master_once

INT64_MAX = 2**63 - 1
SERVICE = "/antdt.v1.ShardingService/"


def start(state_dir, port=0):
    state, store = ShardState(LeaseConfig()), StateStore(state_dir)
    open_state(store, state)
    return BackgroundMaster(ShardingServicer(state, store), port=port).start()


def call(address, method, request, response_cls):
    with grpc.insecure_channel(address) as ch:
        fn = ch.unary_unary(SERVICE + method, request_serializer=lambda m: m.SerializeToString(),
                            response_deserializer=response_cls.FromString)
        return fn(request, timeout=10)


def register(address, spec):
    return call(address, "RegisterDataset", pb.RegisterDatasetRequest(spec=spec),
                pb.RegisterDatasetResponse)


def progress(address):
    return call(address, "GetProgress", pb.GetProgressRequest(), pb.GetProgressResponse)


def refused(address, spec):
    with pytest.raises(grpc.RpcError) as info:
        register(address, spec)
    return info.value


GOOD = pb.DatasetSpec(name="train", records_per_shard=10, num_records=100, num_epochs=1)
OVERFLOWING = [
    pb.DatasetSpec(name="big", records_per_shard=1, num_epochs=1,
                   files=[pb.DataFile(path="a", num_records=INT64_MAX)]),
    pb.DatasetSpec(name="big2", records_per_shard=1, num_epochs=1,
                   files=[pb.DataFile(path="a", num_records=INT64_MAX)] * 2),
    pb.DatasetSpec(name="big3", records_per_shard=INT64_MAX, num_epochs=1,
                   files=[pb.DataFile(path="a", num_records=2**62)] * 3),
    pb.DatasetSpec(name="big4", records_per_shard=1, num_epochs=1, num_records=INT64_MAX),
]


@pytest.mark.parametrize("spec", OVERFLOWING, ids=lambda s: s.name)
def test_overflowing_sizes_are_refused_before_the_journal_and_restart_works(tmp_path, spec):
    m = start(tmp_path / "state")
    register(m.address, GOOD)
    before = progress(m.address)
    err = refused(m.address, spec)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert "records" in err.details()
    assert progress(m.address) == before
    call(m.address, "SaveState", pb.SaveStateRequest(), pb.SaveStateResponse)  # works
    # kill -9: the journal is replayed (no final snapshot); nothing of the refused spec
    store = m.server.servicer.store
    m.server.servicer.store = None
    m.stop()
    store.close()   # closes the journal and lock without writing a snapshot
    m2 = start(tmp_path / "state")
    try:
        assert [d.name for d in progress(m2.address).datasets] == ["train"]
    finally:
        m2.stop()


def test_a_name_with_a_trailing_newline_is_refused(tmp_path):
    m = start(tmp_path / "state")
    try:
        for name in ("train\n", "train\n\n", "\ntrain", "train\r", "tr\0ain"):
            err = refused(m.address, pb.DatasetSpec(name=name, records_per_shard=1,
                                                    num_records=5, num_epochs=1))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "dataset name" in err.details()
        assert not progress(m.address).datasets
    finally:
        m.stop()


def test_a_huge_name_is_invalid_argument_with_a_short_message(tmp_path):
    m = start(tmp_path / "state")
    try:
        huge = "x" * (1 << 20)
        err = refused(m.address, pb.DatasetSpec(name=huge, records_per_shard=1,
                                                num_records=5, num_epochs=1))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(err.details()) < 300 and "1048576 chars" in err.details()
        # elsewhere too: an unknown dataset, a task type, a path
        with pytest.raises(grpc.RpcError) as info:
            call(m.address, "GetProgress", pb.GetProgressRequest(dataset=huge),
                 pb.GetProgressResponse)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert len(info.value.details()) < 300
        register(m.address, GOOD)
        with pytest.raises(grpc.RpcError) as info:
            call(m.address, "GetShard", pb.GetShardRequest(
                dataset="train", task=pb.TaskId(type=huge, index=0)), pb.GetShardResponse)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(info.value.details()) < 300
        err = refused(m.address, pb.DatasetSpec(
            name="p", records_per_shard=1, num_epochs=1,
            files=[pb.DataFile(path="/" + huge, num_records=5)]))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(err.details()) <= MAX_MESSAGE_CHARS
    finally:
        m.stop()


def _journal_a_bad_event(state_dir):
    """A state dir whose journal holds an event this master cannot replay (as an older
    master that accepted the overflowing spec wrote it)."""
    state, store = ShardState(LeaseConfig()), StateStore(state_dir)
    open_state(store, state)
    state.register_dataset(DatasetSpec("train", records_per_shard=10, num_records=100))
    store.append(pb.JournalEntry(time=1.0, register=OVERFLOWING[1]))
    store.close()


def test_an_unreplayable_journal_is_corrupt_state_in_process(tmp_path):
    _journal_a_bad_event(tmp_path / "state")
    with pytest.raises(CorruptState, match="does not apply"):
        open_state(StateStore(tmp_path / "state"), ShardState())
    state, store = ShardState(), StateStore(tmp_path / "state")
    open_state(store, state, discard_corrupt=True)
    assert state.datasets == [] and list((tmp_path / "state").glob("corrupt-*/journal.*.log"))
    store.close()


@pytest.mark.slow
def test_antdt_master_process_refuses_overflow_and_restarts_from_its_journal(tmp_path):
    state_dir = tmp_path / "state"
    m = MasterProcess(tmp_path / "m", state_dir=state_dir).start()
    try:
        register(m.address, GOOD)
        for spec in OVERFLOWING:
            assert refused(m.address, spec).code() == grpc.StatusCode.INVALID_ARGUMENT
        before = progress(m.address)
        assert m.kill(signal.SIGKILL) == -signal.SIGKILL    # the journal must replay
        m.start()
        assert progress(m.address) == before
    finally:
        m.stop()


@pytest.mark.slow
def test_antdt_master_reports_an_unreplayable_journal_cleanly(tmp_path):
    state_dir = tmp_path / "state"
    _journal_a_bad_event(state_dir)
    res = run_master_once(["--port=0", f"--state_dir={state_dir}"])
    assert res.returncode == 3, res.stderr
    assert "does not apply" in res.stderr and "Traceback" not in res.stderr
    assert "--discard_corrupt_state" in res.stderr
    m = MasterProcess(tmp_path / "m", state_dir=state_dir,
                      flags=["--discard_corrupt_state"]).start()
    try:
        assert not progress(m.address).datasets
        assert list(state_dir.glob("corrupt-*/journal.*.log"))
    finally:
        m.stop()
