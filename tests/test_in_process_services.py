"""The job runner is a thread of the master: it calls the master's services in process,
on the server's event loop (rpc.LoopStub), with the same typed clients, the same after-
call work and the same errors as a gRPC caller, and no channel to itself."""

import threading

import pytest

from antdt_tf import errors
from antdt_tf.master.job_control import JobControl
from antdt_tf.master.server import BackgroundMaster
from antdt_tf.monitor.client import MonitorClient
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.sharding.client import ShardingClient, Task
from antdt_tf.sharding.plan import DatasetSpec
from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import LeaseConfig, ShardState
from antdt_tf.sharding.store import StateStore, open_state


class ThreadRecordingServicer(ShardingServicer):
    after_calls = 0

    def GetProgress(self, req):
        self.seen_on = threading.current_thread().name
        return super().GetProgress(req)

    def after_call(self):
        self.after_calls += 1
        super().after_call()


def start(tmp_path):
    state, store = ShardState(LeaseConfig()), StateStore(tmp_path / "state")
    open_state(store, state)
    control = JobControl(str(tmp_path / "jobs"))
    return BackgroundMaster(ThreadRecordingServicer(state, store),
                            job_control=control).start(), control


@pytest.fixture
def master(tmp_path):
    m, control = start(tmp_path)
    yield m, control
    m.stop()


def test_the_runner_s_clients_call_the_master_on_its_loop_with_no_channel(master):
    m, control = master
    assert control.services is not None          # set by the server that serves the jobs
    admin = ShardingClient(m.address, stub=control.services.sharding)
    assert admin._channel is None
    admin.register_dataset(DatasetSpec("train", records_per_shard=10, num_records=100))
    progress = admin.progress("train")
    assert m.server.servicer.seen_on == "antdt-master"    # the loop's thread, not ours
    assert progress.datasets[0].shards_per_epoch == 10
    # a gRPC caller sees what the in-process call did, and the reverse
    with ShardingClient(m.address, task=Task("worker", 0)) as worker:
        shard = worker.get_shard("train")
        worker.report_done(shard.shard)
    assert admin.progress("train").datasets[0].done_shards == 1
    monitor = MonitorClient(stub=control.services.monitor)
    assert monitor.status() is not None
    monitor.close()
    admin.close()


def test_domain_errors_reach_the_runner_typed_and_change_nothing(master):
    m, control = master
    admin = ShardingClient(m.address, stub=control.services.sharding)
    with pytest.raises(errors.UnknownDataset):
        admin.set_paused("nope", True)
    admin.register_dataset(DatasetSpec("train", records_per_shard=10, num_records=100))
    with pytest.raises(errors.InvalidRequest, match="batch size of worker 0"):
        admin.set_batch_sizes("train", {0: -1})
    with pytest.raises(errors.DatasetConflict):
        admin.register_dataset(DatasetSpec("train", records_per_shard=20, num_records=100))
    assert admin.progress("train").datasets[0].shards_per_epoch == 10


def test_in_process_calls_get_the_after_call_work_and_are_durable(tmp_path):
    m, control = start(tmp_path)
    admin = ShardingClient(m.address, stub=control.services.sharding)
    admin.register_dataset(DatasetSpec("train", records_per_shard=10, num_records=100))
    admin.set_paused("train", True)
    assert m.server.servicer.after_calls == 2
    m.stop()
    m, control = start(tmp_path)          # the same state dir: what the runner did is kept
    try:
        admin = ShardingClient(m.address, stub=control.services.sharding)
        assert admin.progress("train").datasets[0].shards_per_epoch == 10
        with ShardingClient(m.address, task=Task("worker", 0)) as worker:
            # the hold is soft state (not journaled): a restarted master serves again
            assert worker.get_shard("train").status == pb.GetShardResponse.SHARD
    finally:
        m.stop()
