"""A real ``tf.estimator.Estimator`` (TF 2.15 + tensorflow-estimator, in .venv-tf215:
``make venv-tf215``; ``make test`` runs this file there) trained ``train_and_evaluate``-
style on a PS cluster of real processes through antdt-tf's hooks: shards split by
speed with every record applied once, a worker SIGKILL mid-shard, and a chief restart
that restores model and sharding state together. Skipped under TF 2.21 (no
tf.estimator there); the MonitoredTrainingSession tests cover that version."""

import json
import sys
import time

import pytest

pytest.importorskip("tensorflow_estimator", reason="needs TF 2.15's venv: make venv-tf215")

from antdt_tf.sharding.client import ShardingClient  # noqa: E402
from antdt_tf.master.server import BackgroundMaster  # noqa: E402
from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import ShardState  # noqa: E402
from jobs import Tf1Job, train_progress, write_data  # noqa: E402
from waiting import wait_for  # noqa: E402

pytestmark = pytest.mark.slow
EVAL, BATCH = 2_000, 256


def estimator_job(tmp_path, master, data, flags):
    return Tf1Job(tmp_path / "job", master.address, data, flags=flags, python=sys.executable,
                  program="estimator")


def test_estimator_workers_at_different_speeds_apply_every_record_once(tmp_path):
    from antdt_tf.agent.throttle import CpuThrottle

    n = 98_304
    data, held_out = write_data(tmp_path, n, EVAL, seed=21)
    with BackgroundMaster(ShardingServicer(ShardState())) as master, \
            ShardingClient(master.address) as admin, \
            estimator_job(tmp_path, master, data, ["--audit", f"--eval_data={held_out}"]) as job:
        wait_for(lambda: (p := train_progress(admin)) is not None
                 and len([t for t in p.tasks if t.records_done]) == 2, 180, "both training")
        start = {t.task.index: t.records_done for t in admin.progress("train").tasks}
        slowed_from = time.time()
        with CpuThrottle(job.procs["worker", 1].pid, factor=4):
            report = job.wait_workers(240)
    a = report["audit"]
    assert (a["applied_0"], a["applied_1"], a["applied_2plus"]) == (0, n, 0), a
    per = dict(enumerate(report["records_per_worker"]))
    assert per[0] + per[1] == n, per
    assert report["checkpoints_with_state"] >= 1 and report["auc"] > 0.6
    worker = [json.loads(line) for line in
              (tmp_path / "job" / "worker1.log").read_text().splitlines()
              if line.startswith('{"task": "worker:0"')][-1]
    assert worker["records"] == per[1] and report["records"] == per[0]
    slowed = {w: per[w] - start[w] for w in per}     # since worker 1 was slowed
    assert slowed[0] > slowed[1], (start, per)        # the fast one did more ...
    # ... in proportion to the speeds this machine gave them (as in
    # test_estimator_hooks): the fast worker's last step ended at most a few of the slow
    # worker's lease times, measured in this run, before the slow worker's; static
    # sharding would leave it idle for dozens of them
    slow_lease_seconds = (worker["last_step_unix"] - slowed_from) / max(1.0, slowed[1] / 1024)
    fast_idle = worker["last_step_unix"] - report["last_step_unix"]
    assert fast_idle < 3 * slow_lease_seconds, (fast_idle, slow_lease_seconds, start, per)


def test_estimator_worker_sigkill_mid_shard_loses_nothing(tmp_path):
    n = 65_536
    data, _ = write_data(tmp_path, n, EVAL, seed=22)
    with BackgroundMaster(ShardingServicer(ShardState())) as master, \
            ShardingClient(master.address) as admin, \
            estimator_job(tmp_path, master, data, ["--audit"]) as job:
        wait_for(lambda: (p := train_progress(admin)) is not None and p.datasets[0].done_shards >= 12
                 and any(t.task.index == 1 and t.records_done for t in p.tasks), 180,
                 "12 shards, worker 1 training")
        job.kill("worker", 1)
        job.start_worker(1)
        report = job.wait_workers(240)
    a = report["audit"]
    assert a["applied_0"] == 0 and a["applied_other"] <= BATCH, a


def test_estimator_chief_restart_restores_model_and_sharding_state(tmp_path):
    n = 65_536
    data, _ = write_data(tmp_path, n, EVAL, seed=23)
    with BackgroundMaster(ShardingServicer(ShardState())) as master, \
            ShardingClient(master.address) as admin, \
            estimator_job(tmp_path, master, data, ["--audit", "--save_secs=1"]) as job:
        ckpt = tmp_path / "job" / "ckpt"
        wait_for(lambda: (p := train_progress(admin)) is not None and p.datasets[0].done_shards >= 12
                 and len(list(ckpt.glob("model.ckpt-*.index"))) >= 2, 180,
                 "12 shards and two checkpoints")
        job.kill("worker", 0)
        job.start_worker(0)
        report = job.wait_workers(240)
    assert report["restored_sharding_state"]
    a = report["audit"]
    assert a["applied_0"] == 0 and a["applied_2plus"] <= 8 * BATCH, a
