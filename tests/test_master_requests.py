"""Property test (issue 17): a real master, over real gRPC, under random well-typed and
malformed requests to every service it serves, restarted from its state dir between
rounds. Whatever the requests:

- no call is answered UNKNOWN, INTERNAL or RESOURCE_EXHAUSTED;
- every error message is bounded;
- a refused call leaves the master's state as it was;
- the master comes back from its state dir (after a clean stop or a kill) with the
  progress it had.

Deterministic (derandomize); ``ANTDT_REQUEST_EXAMPLES=1000`` runs more cases (~6 s per 100).
"""

import math
import os

import grpc
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from antdt_tf.errors import MAX_MESSAGE_CHARS
from antdt_tf.master.job_control import JobControl
from antdt_tf.master.server import BackgroundMaster
from antdt_tf.monitor.service import ClusterMonitorServicer
from antdt_tf.monitor.view import ClusterView
from antdt_tf.proto import cluster_pb2 as cpb
from antdt_tf.proto import job_pb2 as jpb
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.proto import tf_rpc_pb2 as tpb
from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import LeaseConfig, ShardState
from antdt_tf.sharding.store import StateStore, open_state

FORBIDDEN = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL,
             grpc.StatusCode.RESOURCE_EXHAUSTED}

# ---------------------------------------------------------------- field values

I32 = [0, 1, -1, 2, 7, 2**31 - 1, -2**31, 1_000_000, 1_000_001]
I64 = I32 + [2**63 - 1, -2**63, 2**40, 2**40 + 1, 2**53, 2**62, 2**62 + 1]
U64 = [0, 1, 2, 2**63, 2**64 - 1]
DOUBLES = [0.0, 1.0, -1.0, 0.5, math.nan, math.inf, -math.inf, 1e308, 5e-324]


def i32():
    return st.sampled_from(I32) | st.integers(-3, 20)


def i64():
    return st.sampled_from(I64) | st.integers(-3, 120)


def u64():
    return st.sampled_from(U64) | st.integers(0, 20)


def dbl():
    return st.sampled_from(DOUBLES) | st.floats(-10, 1e6, allow_nan=False)


def text():
    """Names: mostly the few that exist, else odd ones (newlines, NUL, unicode, huge)."""
    return st.sampled_from(["train", "other", "worker", "ps", "chief", "a", "", "train\n",
                            "x" * 200_000, "tr\0ain", "127.0.0.1:1", "/tmp/x"]) | st.text(
        max_size=20)


def dataset():
    """Mostly the registered dataset, so that calls reach past the lookup."""
    return st.sampled_from(["train", "train", "train", "other"]) | text()


def task_id():
    return st.builds(pb.TaskId, type=st.sampled_from(["worker", "worker", "chief"]) | text(),
                     index=st.sampled_from([0, 1, 2]) | i32(),
                     incarnation=st.sampled_from([0, 0, 1]) | i64())


def dataset_spec():
    files = st.lists(st.builds(pb.DataFile, path=text(), num_records=i64()), max_size=3)
    return st.builds(pb.DatasetSpec, name=text(), num_records=i64(), files=files,
                     records_per_shard=i64(), num_epochs=i32(), shuffle=st.booleans(),
                     seed=u64(), static_workers=i32(), tail_stealing=st.booleans(),
                     backup_leases=st.booleans())


def remainder():
    return st.builds(pb.ShardRemainder, shard_id=i64(), offset=i64(), failures=i32(),
                     lease_id=i64(), holder=task_id(), applied=i64(), lease_seconds=dbl(),
                     backup_of=i64(), sparse_reports=st.booleans(), held=st.booleans())


def sharding_state():
    ds = st.builds(pb.DatasetState, spec=dataset_spec(), epoch=i32(), cursor=i64(),
                   requeued=st.lists(remainder(), max_size=2),
                   doing=st.lists(remainder(), max_size=2),
                   poisoned=st.lists(remainder(), max_size=1),
                   records_done_epoch=i64(), records_done_total=i64(),
                   seconds_per_record=dbl(), stolen_leases=i64(), backup_leases=i64())
    return st.builds(pb.ShardingState, format_version=st.sampled_from([1, 1, 1, 0, 2]),
                     datasets=st.lists(ds, max_size=2), next_lease_id=i64())


def tensor():
    dims = st.lists(st.builds(tpb.TfTensorShape.Dim, size=i64()), max_size=2)
    return st.builds(
        tpb.TfTensor, dtype=st.sampled_from([tpb.DT_INT64, tpb.DT_STRING, tpb.DT_INT32,
                                             tpb.DT_FLOAT, 0]),
        tensor_shape=st.builds(tpb.TfTensorShape, dim=dims),
        int64_val=st.lists(i64(), max_size=3), int_val=st.lists(i32(), max_size=3),
        string_val=st.lists(st.sampled_from([b"train", b"\xff\xfe", b"x" * 1000]) | st.binary(
            max_size=10), max_size=2),
        tensor_content=st.sampled_from([b"", b"\x01" * 7, b"\x00" * 8, b"\x01" * 16]))


def job_spec():
    inj = st.builds(jpb.InjectionSpec, kind=text(), job=text(), index=i32(), at=dbl(),
                    until=dbl(), factor=dbl())
    return st.builds(
        jpb.JobSpec, api=st.sampled_from(["custom_loop", "keras", "x"]), mode=st.just("async"),
        data_path=st.just("pull"), backend=st.sampled_from(["local", "agents"]),
        num_ps=i32(), num_workers=i32(), max_workers=i32(), num_hosts=i32(),
        data=st.sampled_from(["", "/nonexistent/train.adtr", "x" * 5000, "\0"]),
        epochs=i32(), batch_size=i32(), records_per_shard=i32(), buckets=i32(),
        learning_rate=dbl(), timeout_seconds=dbl(), checkpoint_every_seconds=dbl(),
        workdir=st.sampled_from(["", "/tmp/antdt-never", "rel", "/" + "y" * 5000]),
        injections=st.lists(inj, max_size=2), max_restarts=i32(),
        chief_addresses=st.lists(text(), max_size=2))


# ---------------------------------------------------------------- calls

SHARDING = "/antdt.v1.ShardingService/"
MONITOR = "/antdt.v1.ClusterMonitor/"
JOBS = "/antdt.v1.JobService/"
TF_RPC = "/tensorflow.rpc.RpcService/"


def _t64(values):
    return tpb.TfTensor(dtype=tpb.DT_INT64, int64_val=[values])


def tf_typed():
    """Well-typed TF-RPC calls (right dtypes and arity) with random values."""
    ds = dataset().map(lambda d: tpb.TfTensor(dtype=tpb.DT_STRING, string_val=[d.encode()]))
    small = st.integers(0, 3) | i64()
    scalar = small.map(_t64)

    def vec(dtype, values):
        field = "int64_val" if dtype == tpb.DT_INT64 else "int_val"
        return tpb.TfTensor(dtype=dtype, tensor_shape=tpb.TfTensorShape(
            dim=[tpb.TfTensorShape.Dim(size=len(values))]), **{field: values})
    n = st.integers(0, 3)
    report = n.flatmap(lambda k: st.tuples(
        ds, scalar, scalar, st.lists(st.integers(1, 12) | i64(), min_size=k, max_size=k),
        st.lists(st.integers(0, 8), min_size=k, max_size=k),
        st.lists(st.integers(0, 1), min_size=k, max_size=k),
        st.lists(st.integers(0, 5) | i64(), min_size=k, max_size=k)).map(
        lambda a: ("antdt.report", [a[0], a[1], a[2], vec(tpb.DT_INT64, a[3]),
                                    vec(tpb.DT_INT64, a[4]), vec(tpb.DT_INT32, a[5]),
                                    vec(tpb.DT_INT64, a[6])])))
    return st.one_of(
        st.tuples(st.just("antdt.open"), st.tuples(ds, scalar).map(list)),
        st.tuples(st.just("antdt.open"), st.tuples(ds, scalar, scalar).map(list)),
        st.tuples(st.just("antdt.next"), st.tuples(ds, scalar, scalar, scalar,
                                                   st.just(_t64(0))).map(list)),
        st.tuples(st.just("antdt.step"), st.tuples(ds, scalar, scalar, scalar,
                                                   scalar).map(list)),
        report,
    ).map(lambda mc: (TF_RPC + "Call", tpb.TfCallRequest(method=mc[0], input_tensors=mc[1])))


def tf_call():
    good = st.builds(lambda m, ts: tpb.TfCallRequest(method=m, input_tensors=ts),
                     st.sampled_from(["antdt.open", "antdt.next", "antdt.report",
                                      "antdt.step", "nope", "y" * 100_000]),
                     st.lists(tensor(), max_size=9))
    return good.map(lambda r: (TF_RPC + "Call", r))


def call():
    c = lambda path, strategy: strategy.map(lambda m: (path, m))  # noqa: E731
    good_spec = st.builds(pb.DatasetSpec, name=st.sampled_from(["train", "other"]),
                          num_records=st.integers(1, 50), records_per_shard=st.integers(1, 10),
                          num_epochs=st.integers(1, 2), shuffle=st.booleans())
    lease = st.integers(1, 12) | i64()
    return st.one_of(
        tf_typed(),
        c(SHARDING + "RegisterDataset", st.builds(pb.RegisterDatasetRequest,
                                                  spec=good_spec | dataset_spec())),
        c(SHARDING + "GetShard", st.builds(pb.GetShardRequest, dataset=dataset(),
                                           task=task_id(), request_id=u64())),
        c(SHARDING + "ReportShard", st.builds(
            pb.ReportShardRequest, dataset=dataset(), task=task_id(), lease_id=lease,
            shard_id=st.integers(0, 10) | i64(), epoch=st.integers(0, 1) | i32(),
            outcome=st.integers(0, 4), records_processed=st.integers(0, 10) | i64(),
            error_message=text(), get_next=st.booleans(), next_request_id=u64())),
        c(SHARDING + "ReportTaskFailure", st.builds(pb.ReportTaskFailureRequest,
                                                    task=task_id(), reason=text())),
        c(SHARDING + "GetProgress", st.builds(pb.GetProgressRequest, dataset=dataset())),
        c(SHARDING + "SetBatchSizes", st.builds(
            pb.SetBatchSizesRequest, dataset=dataset(), replace=st.booleans(),
            batch_sizes=st.dictionaries(i32(), i32(), max_size=3))),
        c(SHARDING + "SetPaused", st.builds(pb.SetPausedRequest, dataset=dataset(),
                                            paused=st.booleans())),
        c(SHARDING + "SaveState", st.builds(pb.SaveStateRequest,
                                            datasets=st.lists(text(), max_size=2))),
        c(SHARDING + "RestoreState", st.builds(pb.RestoreStateRequest, state=sharding_state())),
        c(SHARDING + "ApplyLeaseRecord", st.builds(pb.LeaseRecord, dataset=dataset(),
                                                   lease_id=lease, holder=task_id(),
                                                   records_applied=i64())),
        c(SHARDING + "KeepHeldLeases", st.builds(pb.KeepHeldLeasesRequest, dataset=dataset())),
        c(MONITOR + "ReportAgent", st.builds(
            cpb.AgentReport, host=text(), agent_address=text(), seq=i64(), unix_time=dbl(),
            advertise=text(), first_task_port=i32(), last_task_port=i32(),
            load_per_cpu=dbl(), tasks=st.lists(st.builds(
                cpb.TaskStatus, task=st.builds(cpb.TaskRef, job=text(), index=i32()),
                cpu_seconds=dbl(), slowdown=dbl(), log_path=text()), max_size=2))),
        c(MONITOR + "ReportTrainer", st.builds(
            cpb.TrainerReport, task=st.builds(cpb.TaskRef, job=text(), index=i32()),
            incarnation=i64(), seq=i64(), unix_time=dbl(),
            workers=st.lists(st.builds(cpb.WorkerStats, worker=i32(), shards=i64(),
                                       records=i64()), max_size=2),
            ps_latency=st.lists(st.builds(cpb.PsLatency, ps=i32(), latency_ms=dbl()),
                                max_size=2))),
        c(MONITOR + "GetClusterStatus", st.just(cpb.ClusterStatusRequest())),
        c(MONITOR + "SetJobCluster", st.builds(
            cpb.JobCluster, version=i64(), chief=st.lists(text(), max_size=2),
            ps=st.lists(text(), max_size=2), worker=st.lists(text(), max_size=2))),
        c(MONITOR + "GetJobCluster", st.just(cpb.GetJobClusterRequest())),
        c(JOBS + "SubmitJob", st.builds(jpb.SubmitJobRequest, spec=job_spec())),
        c(JOBS + "GetJob", st.builds(jpb.GetJobRequest, events_from=i64())),
        tf_call(),
        # malformed: random bytes to any method
        st.tuples(st.sampled_from([SHARDING + "RegisterDataset", SHARDING + "GetShard",
                                   SHARDING + "RestoreState", MONITOR + "ReportAgent",
                                   MONITOR + "SetJobCluster", JOBS + "SubmitJob",
                                   TF_RPC + "Call"]),
                  st.binary(max_size=40)),
    )


# ---------------------------------------------------------------- the master


class NoRunJobControl(JobControl):
    """Never starts a runner (a job that got through would run nothing here)."""

    def _spawn(self, resume):
        self.spawned = True


class Master:
    def __init__(self, state_dir):
        self.dir = state_dir
        self.state = ShardState(LeaseConfig())
        self.store = StateStore(state_dir)
        open_state(self.store, self.state)
        self.view = ClusterView(cluster_file=os.path.join(state_dir, "job_cluster.pb"))
        self.jobs = NoRunJobControl(state_dir)
        self.bg = BackgroundMaster(ShardingServicer(self.state, self.store),
                                   monitor=ClusterMonitorServicer(self.view),
                                   job_control=self.jobs).start()
        self.channel = grpc.insecure_channel(self.bg.address)

    def send(self, path, request):
        data = request if isinstance(request, bytes) else request.SerializeToString()
        fn = self.channel.unary_unary(path, request_serializer=lambda b: b,
                                      response_deserializer=lambda b: b)
        try:
            fn(data, timeout=20)
            return None
        except grpc.RpcError as e:
            return e

    def fingerprint(self):
        """Everything a request may change (soft state included)."""
        def read():
            servicer = self.bg.server.servicer
            status = self.view.status()
            status.ClearField("unix_time")
            for a in status.agents:
                a.ClearField("unix_time")
            status.trainer.ClearField("unix_time")
            status.ClearField("health")
            return (self.state.snapshot().SerializeToString(deterministic=True),
                    repr(sorted((k, sorted(v.items()))
                                for k, v in servicer.batch_sizes.items())),
                    repr(sorted(servicer.paused)),
                    status.SerializeToString(deterministic=True),
                    self.view.job_cluster().SerializeToString(deterministic=True),
                    self.jobs.spec.SerializeToString(deterministic=True)
                    if self.jobs.spec is not None else b"")
        return self.bg.call(read)

    def durable_progress(self):
        """GetProgress over gRPC, without the soft state a restart does not keep."""
        fn = self.channel.unary_unary(SHARDING + "GetProgress",
                                      request_serializer=lambda m: m.SerializeToString(),
                                      response_deserializer=pb.GetProgressResponse.FromString)
        out = fn(pb.GetProgressRequest(), timeout=20)
        for d in out.datasets:
            for field in ("batch_sizes", "paused", "started_unix", "finished_unix"):
                d.ClearField(field)
        return out

    def stop(self, kill: bool):
        self.channel.close()
        if kill:   # like SIGKILL: no final snapshot, the journal is replayed
            self.bg.server.servicer.store = None
            self.bg.stop()
            self.store.close()
        else:
            self.bg.stop()


@settings(max_examples=int(os.environ.get("ANTDT_REQUEST_EXAMPLES", "60")), deadline=None,
          derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(rounds=st.lists(st.tuples(st.lists(call(), min_size=1, max_size=12), st.booleans()),
                       min_size=1, max_size=3))
def test_no_request_breaks_the_master(tmp_path_factory, rounds):
    state_dir = str(tmp_path_factory.mktemp("state"))
    m = Master(state_dir)
    try:
        # a dataset that exists, so that well-typed calls reach deep paths too
        m.send(SHARDING + "RegisterDataset", pb.RegisterDatasetRequest(spec=pb.DatasetSpec(
            name="train", num_records=40, records_per_shard=5, num_epochs=2)))
        for calls, kill in rounds:
            for path, request in calls:
                before = m.fingerprint()
                err = m.send(path, request)
                event(f"{path.rsplit('/', 1)[1]}: {'OK' if err is None else err.code().name}")
                if err is None:
                    continue
                what = f"{path} {str(request)[:300]!r}"
                assert err.code() not in FORBIDDEN, f"{what}: {err.code()} {err.details()}"
                assert len(err.details() or "") <= MAX_MESSAGE_CHARS + 10, what
                assert m.fingerprint() == before, f"{what} was refused but changed the state"
            progress = m.durable_progress()
            m.stop(kill)
            m = Master(state_dir)     # must come up from its own state dir
            assert m.durable_progress() == progress
    finally:
        m.stop(kill=False)
