"""Real TF2 ParameterServerStrategy jobs (PS, workers and the coordinator are separate
processes) train a DeepFM on a compact record file through the master; the audit
counter on the PS shows how often every record was applied."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from antdt_tf.data import criteo, records
from antdt_tf.sharding.client import ShardingClient
from antdt_tf.sharding.plan import DataFile, DatasetSpec
from antdt_tf.sharding.service import BackgroundMaster, ShardingServicer
from antdt_tf.sharding.state import ShardState

pytestmark = pytest.mark.slow


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run_job(tmp_path, num_records, records_per_shard, batch_size, kill_worker_after_shards=None):
    """Runs master + 1 PS + 2 workers + coordinator; optionally SIGKILLs worker 1 once
    that many shards are DONE. Returns (report, final progress, shards done at kill)."""
    data = tmp_path / "train.adtr"
    records.write_records(data, criteo.generate(criteo.SyntheticSpec(num_records, seed=1)))
    chief, ps0, w0, w1 = free_ports(4)
    cluster = json.dumps({"chief": [f"127.0.0.1:{chief}"], "ps": [f"127.0.0.1:{ps0}"],
                          "worker": [f"127.0.0.1:{w0}", f"127.0.0.1:{w1}"]})
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    servers, killed_at = {}, None
    with BackgroundMaster(ShardingServicer(ShardState())) as master:
        admin = ShardingClient(master.address)
        try:
            admin.register_dataset(DatasetSpec("train", records_per_shard=records_per_shard,
                                               files=(DataFile(str(data), num_records),)))
            for job, index in (("ps", 0), ("worker", 0), ("worker", 1)):
                servers[f"{job}{index}"] = subprocess.Popen(
                    [sys.executable, "-m", "antdt_tf.tf.server", f"--cluster={cluster}",
                     f"--job={job}", f"--index={index}"], env=env, start_new_session=True,
                    stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{job}{index}.log", "wb"))
            report = tmp_path / "report.json"
            coordinator = subprocess.Popen(
                [sys.executable, "-m", "antdt_tf.tf.coordinator", f"--cluster={cluster}",
                 f"--master={master.address}", f"--batch_size={batch_size}", "--buckets=4096",
                 "--audit", f"--report_json={report}"], env=env, start_new_session=True,
                stdout=subprocess.DEVNULL, stderr=open(tmp_path / "coordinator.log", "wb"))
            deadline = time.monotonic() + 240
            while coordinator.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
                if kill_worker_after_shards is not None and killed_at is None:
                    done = admin.progress("train").datasets[0].done_shards
                    if done >= kill_worker_after_shards:
                        os.killpg(servers["worker1"].pid, signal.SIGKILL)   # a process we started
                        killed_at = done
            assert coordinator.wait(timeout=10) == 0, \
                (tmp_path / "coordinator.log").read_text()[-3000:]
            progress = admin.progress("train").datasets[0]
        finally:
            for p in servers.values():
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            admin.close()
    return json.loads(report.read_text()), progress, killed_at, \
        (tmp_path / "coordinator.log").read_text()


def test_pss_job_trains_every_record_exactly_once(tmp_path):
    report, progress, _, _ = run_job(tmp_path, 8192, 512, 256)
    assert report["records"] == 8192 and report["shards"] == 16
    assert report["audit"] == {"applied_0": 0, "applied_1": 8192, "applied_2plus": 0}
    assert progress.finished and progress.records_done_total == 8192


def test_worker_sigkill_mid_shard_costs_at_most_one_batch(tmp_path):
    """The killed worker's closure is re-run elsewhere and resumes after the batches it
    had applied: at most one batch (128 records) is applied twice, none is lost."""
    n, shards = 24_576, 48
    report, progress, killed_at, log = run_job(tmp_path, n, n // shards, 128,
                                               kill_worker_after_shards=8)
    assert killed_at is not None and killed_at < shards, "the kill must land mid-run"
    assert "Putting back a closure after it failed" in log   # a shard was really re-run
    audit = report["audit"]
    assert audit["applied_0"] == 0
    assert audit["applied_2plus"] <= 128
    assert audit["applied_1"] + audit["applied_2plus"] == n
    assert report["records"] == n and progress.finished
