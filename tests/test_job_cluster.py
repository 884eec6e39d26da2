"""The job's TF addresses on the master: the launcher publishes them (versioned), the
chief reads them; stale or malformed writes change nothing; a restarted master keeps
them; a corrupt file stops the master with a clear error. Real gRPC, real processes."""

import subprocess
import sys

import pytest

from antdt_tf.errors import InvalidRequest
from antdt_tf.monitor.client import MonitorClient
from antdt_tf.monitor.service import ClusterMonitorServicer
from antdt_tf.monitor.view import ClusterView
from antdt_tf.procutil import start_master
from antdt_tf.master.server import BackgroundMaster
from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import ShardState

SPEC = {"chief": ["10.0.0.1:2000"], "ps": ["10.0.0.2:2001"],
        "worker": ["10.0.0.3:2002", "10.0.0.4:2003"]}


def test_publish_read_and_refuse_stale_or_malformed(tmp_path):
    view = ClusterView(cluster_file=str(tmp_path / "job_cluster.pb"))
    with BackgroundMaster(ShardingServicer(ShardState()),
                          monitor=ClusterMonitorServicer(view)) as m, \
            MonitorClient(m.address) as c:
        assert c.job_cluster().version == 0            # nothing yet
        assert c.set_job_cluster(2, SPEC).version == 2
        moved = dict(SPEC, worker=["10.0.0.3:2002", "10.0.0.9:2010"])
        assert list(c.set_job_cluster(1, moved).worker) == SPEC["worker"]   # stale: ignored
        assert list(c.set_job_cluster(3, moved).worker) == moved["worker"]
        for bad in (dict(SPEC, ps=[]), dict(SPEC, chief=["no-port"])):
            with pytest.raises(InvalidRequest):
                c.set_job_cluster(4, bad)
        with pytest.raises(InvalidRequest):
            c.set_job_cluster(0, SPEC)
        got = c.job_cluster()
        assert (got.version, list(got.worker)) == (3, moved["worker"])
    again = ClusterView(cluster_file=str(tmp_path / "job_cluster.pb"))   # a restart
    assert again.job_cluster().version == 3
    assert list(again.job_cluster().worker) == moved["worker"]


def test_a_restarted_master_process_keeps_the_cluster_and_refuses_a_corrupt_one(tmp_path):
    proc, address = start_master(tmp_path)
    try:
        with MonitorClient(address) as c:
            c.set_job_cluster(1, SPEC)
    finally:
        proc.kill()          # SIGKILL: the file was written before the answer
        proc.wait()
    (tmp_path / "port").unlink()
    proc, address = start_master(tmp_path)
    try:
        with MonitorClient(address) as c:
            assert list(c.job_cluster().ps) == SPEC["ps"]
    finally:
        proc.terminate()
        proc.wait(30)
    (tmp_path / "state" / "job_cluster.pb").write_bytes(b"\xff\xff not a proto")
    out = subprocess.run([sys.executable, "-m", "antdt_tf.master", "--port=0",
                          f"--state_dir={tmp_path / 'state'}"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 3 and "job_cluster.pb" in out.stderr
