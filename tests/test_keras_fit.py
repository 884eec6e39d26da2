"""tf-keras model.fit under ParameterServerStrategy fed by the master (antdt-keras-trainer,
real PS/worker/chief processes): exact audit, learning, a worker SIGKILL mid-fit, and a
chief SIGKILL + relaunch that restores model, optimizer and sharding state."""

import contextlib
import signal

import pytest

from antdt_tf.data import criteo, records
from antdt_tf.sharding.client import ShardingClient
from antdt_tf.sharding.plan import DataFile, DatasetSpec
from antdt_tf.sharding.service import BackgroundMaster, ShardingServicer
from antdt_tf.sharding.state import ShardState
from antdt_tf.tf.local_cluster import LocalCluster, run_local_job

pytestmark = pytest.mark.slow
KERAS = "antdt_tf.tf.keras_trainer"
N, EVAL = 24_576, 4_000


@contextlib.contextmanager
def keras_job(tmp_path):
    data, held_out = tmp_path / "train.adtr", tmp_path / "eval.adtr"
    batches = list(criteo.generate(criteo.SyntheticSpec(N + EVAL, seed=2)))
    records.write_records(data, [criteo.Batch(b.label[:N], b.dense[:N], b.sparse[:N])
                                 for b in batches])
    records.write_records(held_out, [criteo.Batch(b.label[N:], b.dense[N:], b.sparse[N:])
                                     for b in batches])
    with BackgroundMaster(ShardingServicer(ShardState())) as master, \
            LocalCluster(num_ps=1, num_workers=2, log_dir=tmp_path) as cluster, \
            ShardingClient(master.address) as admin:
        admin.register_dataset(DatasetSpec("train", records_per_shard=1024,
                                           files=(DataFile(str(data), N),)))
        yield master, cluster, admin, [f"--eval_data={held_out}"]


def test_fit_applies_every_record_once_and_learns(tmp_path):
    with keras_job(tmp_path) as (master, cluster, admin, flags):
        report = run_local_job(tmp_path, master.address, cluster, 256, buckets=4096,
                               timeout=240, flags=flags, module=KERAS)
        assert admin.progress("train").datasets[0].finished
    a = report["audit"]
    assert (a["applied_0"], a["applied_1"], a["applied_2plus"]) == (0, N, 0)
    assert report["records"] == N and sum(report["records_per_worker"]) == N
    assert min(report["shards_per_worker"]) > 0          # both workers pulled shards
    assert report["auc"] > 0.6


def test_fit_survives_a_worker_sigkill(tmp_path):
    killed = []
    with keras_job(tmp_path) as (master, cluster, admin, flags):
        def kill_once(_chief):
            if not killed and admin.progress("train").datasets[0].done_shards >= 6:
                cluster.kill("worker", 1)
                killed.append(True)
                cluster.start_task("worker", 1)   # back on its address; TF re-joins it
        report = run_local_job(tmp_path, master.address, cluster, 256, buckets=4096,
                               timeout=240, flags=flags, module=KERAS, on_poll=kill_once)
    assert killed
    a = report["audit"]
    assert a["applied_0"] == 0 and a["applied_other"] <= 256, a   # at most one batch


def test_chief_sigkill_and_relaunch_restore_model_and_data_position(tmp_path):
    with keras_job(tmp_path) as (master, cluster, admin, flags):
        flags = flags + [f"--checkpoint_dir={tmp_path / 'ckpt'}", "--checkpoint_every_seconds=1"]

        def kill_chief(chief):
            if admin.progress("train").datasets[0].done_shards >= 10:
                chief.send_signal(signal.SIGKILL)
        first = run_local_job(tmp_path, master.address, cluster, 256, buckets=4096,
                              timeout=240, flags=flags, module=KERAS, on_poll=kill_chief)
        assert first is None                                   # it was killed
        report = run_local_job(tmp_path, master.address, cluster, 256, buckets=4096,
                               timeout=240, flags=flags, module=KERAS)
    assert report["restored_from"]
    a = report["audit"]
    assert (a["applied_0"], a["applied_1"], a["applied_2plus"]) == (0, N, 0)
