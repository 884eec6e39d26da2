"""The master's job service over real gRPC: a bad JobSpec is refused with the reason and
nothing is kept; a valid one is persisted, a retried submit answers the same job,
another job is refused; a master on the same state dir resumes the running job; a
corrupt job file stops it. (The runner itself is exercised by every launch test.)"""


import grpc
import pytest

from antdt_tf.data import criteo, records
from antdt_tf.errors import CorruptState, InvalidRequest, JobConflict
from antdt_tf.job.spec import new_spec
from antdt_tf.launcher.follow import JobClient
from antdt_tf.master.job_control import JobControl
from antdt_tf.master.server import BackgroundMaster
from antdt_tf.proto import job_pb2 as jpb
from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import ShardState


class RecordingJobControl(JobControl):
    """Records what it would run instead of starting a runner (no hosts here)."""

    def _spawn(self, resume):
        self.spawned = getattr(self, "spawned", []) + [resume]


def spec(tmp_path, **change) -> jpb.JobSpec:
    data = tmp_path / "train.adtr"
    if not data.exists():
        records.write_records(data, criteo.generate(criteo.SyntheticSpec(1000, seed=1)))
    out = new_spec(num_ps=1, num_workers=2, num_hosts=2, data=str(data), batch_size=64,
                   records_per_shard=100, buckets=64, checkpoint_dir=str(tmp_path / "ckpt"),
                   learning_rate=0.1, checkpoint_every_shards=4, audit=True,
                   workdir=tmp_path / "job",
                   addresses={"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"],
                              "worker": ["127.0.0.1:3", "127.0.0.1:4"]})
    for k, v in change.items():
        setattr(out, k, v)
    return out


@pytest.mark.parametrize("change,message", [
    ({"api": "pytorch"}, "JobSpec.api must be one of"),
    ({"num_workers": 0}, "num_workers must be >= 1"),
    ({"workdir": "relative/dir"}, "absolute path"),
    ({"data": "/no/such/file.adtr"}, "JobSpec.data"),
    ({"batch_size": -5}, "batch_size must be >= 1"),
    # a user policy imports its module into the master: only modules its operator allowed
    ({"policy": "os:system"}, "imports user policies only from the modules its operator"),
])
def test_a_bad_spec_is_refused_with_the_reason_and_nothing_is_kept(tmp_path, change, message):
    control = RecordingJobControl(str(tmp_path / "state"))
    with BackgroundMaster(ShardingServicer(ShardState()), job_control=control) as m:
        client = JobClient(m.address, timeout=10)
        with pytest.raises(InvalidRequest, match=message) as e:
            client.submit(spec(tmp_path, **change))
        assert e.value.__cause__.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert client.get().state == jpb.JobStatus.STATE_UNSPECIFIED
        client.close()
    assert not (tmp_path / "state" / "job.pb").exists()
    assert not getattr(control, "spawned", [])


@pytest.mark.parametrize("change,launch_flags", [
    ({"api": "keras", "backend": "kubernetes"},
     ["--api=keras", "--backend=kubernetes", "--namespace=n", "--data=/d/train.adtr",
      "--workdir=/w/j1"]),
    ({"max_workers": 4, "backend": "agents"},
     ["--max_workers=4", "--backend=agents", "--master=127.0.0.1:7470"]),
    ({"api": "mts", "policy": "static"}, ["--api=mts", "--policy=static"]),
    ({"mode": "bsp", "policy": "backup"}, ["--mode=bsp", "--policy=backup"]),
    ({"max_workers": 4, "api": "keras"}, ["--max_workers=4", "--api=keras"]),
    ({"checkpoint_every_shards": 0}, ["--checkpoint_every_shards=0"]),
])
def test_the_master_refuses_a_spec_exactly_as_the_launcher_does(tmp_path, change,
                                                                launch_flags):
    """One set of checks (antdt_tf.job.spec.validate): a JobSpec sent to the master
    directly gets the launcher's refusal, word for word (JobSpec.x for --x)."""
    import subprocess
    import sys

    control = RecordingJobControl(str(tmp_path / "state"))
    with BackgroundMaster(ShardingServicer(ShardState()), job_control=control) as m:
        client = JobClient(m.address, timeout=10)
        with pytest.raises(InvalidRequest) as e:
            client.submit(spec(tmp_path, **change))
        client.close()
    master_says = str(e.value)
    launched = subprocess.run([sys.executable, "-m", "antdt_tf.launch", "--dry_run",
                               "--num_workers=2", "--num_ps=1", *launch_flags],
                              capture_output=True, text=True, timeout=60)
    assert launched.returncode == 2, launched.stderr
    launcher_says = launched.stderr.strip().split("antdt-launch: error: ", 1)[1]
    assert master_says.replace("JobSpec.", "--") == launcher_says, (master_says,
                                                                    launcher_says)
    assert not getattr(control, "spawned", [])


def test_submit_is_idempotent_another_job_conflicts_and_a_restart_resumes(tmp_path):
    state = tmp_path / "state"
    control = RecordingJobControl(str(state))
    good = spec(tmp_path)
    with BackgroundMaster(ShardingServicer(ShardState()), job_control=control) as m:
        client = JobClient(m.address, timeout=10)
        assert client.submit(good).state == jpb.JobStatus.RUNNING
        assert client.submit(good).state == jpb.JobStatus.RUNNING      # a retried submit
        with pytest.raises(JobConflict):
            client.submit(spec(tmp_path, batch_size=32))
        with pytest.raises(InvalidRequest):
            client.get(events_from=-1)
        client.close()
    assert control.spawned == [None]                  # one runner, for the first submit
    control._on_event({"t": 1.5, "event": "worker:0 exit 1; restarting it (restart 1)"})
    again = RecordingJobControl(str(state))            # a master started on the same dir
    assert again.spec == good and again.state == jpb.JobStatus.RUNNING
    assert [e.text for e in again.events] == ["worker:0 exit 1; restarting it (restart 1)"]
    again.start()
    assert again.recoveries == 1 and again.spawned == [{}]   # resumed, not started anew


def test_a_corrupt_job_file_stops_the_master(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "job.pb").write_bytes(b"\xff\xfe garbage")
    with pytest.raises(CorruptState, match="job"):
        JobControl(str(state))
