"""A real TF2 ParameterServerStrategy job (1 PS, 2 workers, a coordinator: separate
processes) trains a DeepFM on a compact record file through the master; the audit
counter on the PS shows every record applied exactly once."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys

import pytest

from antdt_tf.data import criteo, records
from antdt_tf.sharding.client import ShardingClient
from antdt_tf.sharding.plan import DataFile, DatasetSpec
from antdt_tf.sharding.service import BackgroundMaster, ShardingServicer
from antdt_tf.sharding.state import ShardState

pytestmark = pytest.mark.slow
RECORDS, RPS = 8192, 512


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_pss_job_trains_every_record_exactly_once(tmp_path):
    data = tmp_path / "train.adtr"
    records.write_records(data, criteo.generate(criteo.SyntheticSpec(RECORDS, seed=1)))
    chief, ps0, w0, w1 = free_ports(4)
    cluster = {"chief": [f"127.0.0.1:{chief}"], "ps": [f"127.0.0.1:{ps0}"],
               "worker": [f"127.0.0.1:{w0}", f"127.0.0.1:{w1}"]}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    procs = []
    with BackgroundMaster(ShardingServicer(ShardState())) as master:
        try:
            ShardingClient(master.address).register_dataset(DatasetSpec(
                "train", records_per_shard=RPS, files=(DataFile(str(data), RECORDS),)))
            for job, index in (("ps", 0), ("worker", 0), ("worker", 1)):
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "antdt_tf.tf.server", f"--cluster={json.dumps(cluster)}",
                     f"--job={job}", f"--index={index}"], env=env, start_new_session=True,
                    stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{job}{index}.log", "wb")))
            report = tmp_path / "report.json"
            res = subprocess.run(
                [sys.executable, "-m", "antdt_tf.tf.coordinator", f"--cluster={json.dumps(cluster)}",
                 f"--master={master.address}", "--batch_size=256", "--buckets=4096", "--audit",
                 f"--report_json={report}"], env=env, capture_output=True, text=True, timeout=240)
            assert res.returncode == 0, res.stderr[-3000:]
            result = json.loads(report.read_text())
            progress = ShardingClient(master.address).progress("train").datasets[0]
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert result["records"] == RECORDS and result["shards"] == RECORDS // RPS
    assert result["audit"] == {"applied_0": 0, "applied_1": RECORDS, "applied_2plus": 0}
    assert progress.finished and progress.records_done_total == RECORDS
