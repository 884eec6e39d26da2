"""Real TF2 ParameterServerStrategy jobs (PS, workers and the coordinator are separate
processes) train a DeepFM on a compact record file through the master; the audit
counter on the PS shows how often every record was applied."""

import contextlib
import os
import signal

import pytest

from antdt_tf.data import criteo, records
from antdt_tf.sharding.client import ShardingClient
from antdt_tf.sharding.plan import DataFile, DatasetSpec
from antdt_tf.master.server import BackgroundMaster
from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import ShardState
from antdt_tf.tf.local_cluster import LocalCluster, run_local_job

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def pss_cluster(tmp_path, num_records, records_per_shard, seed=1, master_address=None):
    """Record file + master (in-process unless ``master_address``) + 1 PS + 2 workers,
    with the dataset registered. Yields (master address, cluster, admin client)."""
    data = tmp_path / "train.adtr"
    records.write_records(data, criteo.generate(criteo.SyntheticSpec(num_records, seed=seed)))
    with contextlib.ExitStack() as stack:
        if master_address is None:
            master_address = stack.enter_context(
                BackgroundMaster(ShardingServicer(ShardState()))).address
        cluster = stack.enter_context(LocalCluster(num_ps=1, num_workers=2, log_dir=tmp_path))
        admin = stack.enter_context(ShardingClient(master_address))
        admin.register_dataset(DatasetSpec("train", records_per_shard=records_per_shard,
                                           files=(DataFile(str(data), num_records),)))
        yield master_address, cluster, admin


def exact(report, n):
    """Every one of the n records applied exactly once (one epoch)."""
    a = report["audit"]
    return (a["applied_0"], a["applied_1"], a["applied_2plus"], a["applied_expected"]) == \
        (0, n, 0, n)


def run_job(tmp_path, num_records, records_per_shard, batch_size, kill_worker_after_shards=None,
            flags=()):
    """Runs master + 1 PS + 2 workers + coordinator; optionally SIGKILLs worker 1 once
    that many shards are DONE. Returns (report, final progress, shards done at kill,
    coordinator log)."""
    killed_at, holding = [], []
    with pss_cluster(tmp_path, num_records, records_per_shard) as (master, cluster, admin):

        def maybe_kill(_coordinator):
            if kill_worker_after_shards is not None and not killed_at:
                done = admin.progress("train").datasets[0].done_shards
                if done >= kill_worker_after_shards:
                    holding.extend(t.doing_shards for t in admin.progress("train").tasks
                                   if (t.task.type, t.task.index) == ("worker", 1))
                    cluster.kill("worker", 1)
                    killed_at.append(done)

        report = run_local_job(tmp_path, master, cluster, batch_size, buckets=4096,
                               timeout=240, on_poll=maybe_kill, flags=flags)
        progress = admin.progress("train").datasets[0]
    report["killed_worker_leases"] = sum(holding)   # leases it held just before the kill
    return report, progress, (killed_at or [None])[0], report["log"]


@pytest.mark.parametrize("data_path", ["pull", "closure"])
def test_pss_job_trains_every_record_exactly_once(tmp_path, data_path):
    report, progress, _, _ = run_job(tmp_path, 8192, 512, 256, flags=[f"--data_path={data_path}"])
    assert report["records"] == 8192 and report["shards"] == 16
    # both workers pulled work; the per-worker split adds up
    assert sum(report["shards_per_worker"]) == 16 and min(report["shards_per_worker"]) > 0
    assert sum(report["records_per_worker"]) == 8192
    assert exact(report, 8192)
    assert progress.finished and progress.records_done_total == 8192


def test_worker_sigkill_mid_shard_costs_at_most_one_batch(tmp_path):
    """The killed worker's closure is re-run elsewhere and resumes after the batches it
    had applied: at most one batch (128 records) is applied twice, none is lost."""
    n, shards = 12_288, 24
    report, progress, killed_at, log = run_job(tmp_path, n, n // shards, 128,
                                               kill_worker_after_shards=6)
    assert killed_at is not None and killed_at < shards, "the kill must land mid-run"
    assert "Putting back a closure after it failed" in log   # a shard was really re-run
    # sparse reports (the default): the dead worker's leases were held by the master and
    # settled from the offsets its steps recorded on the PS (when the kill landed while
    # it held a lease; between two leases there is nothing to settle — seen once)
    if report["killed_worker_leases"]:
        assert "settled" in log and "held lease(s) of a dead or silent worker" in log
    audit = report["audit"]
    assert audit["applied_0"] == 0
    assert audit["applied_2plus"] <= 128
    assert audit["applied_1"] + audit["applied_2plus"] == n
    assert report["records"] == n and progress.finished


def test_coordinator_sigkill_restores_model_and_sharding_state_together(tmp_path):
    """The coordinator checkpoints model + sharding state every 4 shards (closure path) or
    0.3 s (pull path); SIGKILLed mid-run and relaunched on the same cluster, it restores
    both and finishes with every record applied exactly once in the final model."""
    n, rps = 16_384, 512
    flags = [f"--checkpoint_dir={tmp_path / 'ckpt'}", "--checkpoint_every_shards=4",
             "--checkpoint_every_seconds=0.3"]
    with pss_cluster(tmp_path, n, rps, seed=2) as (master, cluster, admin):
        killed = []

        def kill_coordinator(proc):
            # after a boundary checkpoint beyond the initial one (ckpt-1) was written and
            # recorded as the latest (the index file comes before the manager's record)
            ckpt = tmp_path / "ckpt"
            if (not killed and admin.progress("train").datasets[0].done_shards >= 4
                    and (ckpt / "checkpoint").exists()
                    and not tf_latest_checkpoint(ckpt).endswith("ckpt-1")):
                os.killpg(proc.pid, signal.SIGKILL)   # a process we started
                killed.append(admin.progress("train").datasets[0].done_shards)

        assert run_local_job(tmp_path, master, cluster, 256, buckets=4096, timeout=240,
                             on_poll=kill_coordinator, flags=flags) is None
        assert killed and killed[0] < n // rps
        latest = tf_latest_checkpoint(tmp_path / "ckpt")
        assert not latest.endswith("ckpt-1"), "a shard-boundary checkpoint was written"
        report = run_local_job(tmp_path, master, cluster, 256, buckets=4096,
                               timeout=240, flags=flags)
        progress = admin.progress("train").datasets[0]
    assert report["restored_from"] == latest
    assert exact(report, n)
    assert progress.finished and progress.records_done_total >= n


def tf_latest_checkpoint(directory):
    """The newest checkpoint named in the manager's index file (no TF import needed)."""
    text = (directory / "checkpoint").read_text()
    name = text.split('model_checkpoint_path: "', 1)[1].split('"', 1)[0]
    return name if name.startswith("/") else str(directory / name)


def test_master_sigkill_during_training_loses_and_repeats_nothing(tmp_path):
    """The master (a real antdt-master process with a state_dir) is SIGKILLed while the
    PSS job trains and restarted on the same port: the coordinator's calls wait and
    retry, leases held across the restart stay valid, every record applied once."""
    from procs import MasterProcess

    n, rps = 16_384, 512
    master = MasterProcess(tmp_path / "m", state_dir=tmp_path / "state").start()
    restarted = []
    try:
        with pss_cluster(tmp_path, n, rps, seed=3, master_address=master.address) as (
                address, cluster, admin):

            def kill_master(_coordinator):
                if not restarted and admin.progress("train").datasets[0].done_shards >= 10:
                    master.kill(signal.SIGKILL)
                    master.start()          # same port, same state_dir
                    restarted.append(True)

            report = run_local_job(tmp_path, address, cluster, 256, buckets=4096,
                                   timeout=240, on_poll=kill_master)
            progress = admin.progress("train").datasets[0]
    finally:
        master.stop()
    assert restarted
    assert exact(report, n)
    assert progress.finished and progress.records_done_total == n


def test_ps_sigkill_exits_75_and_the_relaunch_restores_from_the_last_boundary(tmp_path):
    """A PS dies: the coordinator exits 75 (relaunch me); with the PS back on its
    address, the relaunched coordinator restores model (the PS state) and sharding state
    from the last shard-boundary checkpoint and finishes with an exact audit."""
    n, rps = 16_384, 512
    flags = [f"--checkpoint_dir={tmp_path / 'ckpt'}", "--checkpoint_every_shards=4",
             "--checkpoint_every_seconds=1"]
    with pss_cluster(tmp_path, n, rps, seed=4) as (master, cluster, admin):
        killed = []

        def kill_ps(_coordinator):
            if not killed and admin.progress("train").datasets[0].done_shards >= 10:
                cluster.kill("ps", 0)
                killed.append(True)

        with pytest.raises(RuntimeError, match="coordinator exited 75"):
            run_local_job(tmp_path, master, cluster, 256, buckets=4096, timeout=240,
                          on_poll=kill_ps, flags=flags)
        assert killed
        cluster.start_task("ps", 0)       # a new PS on the same address
        report = run_local_job(tmp_path, master, cluster, 256, buckets=4096,
                               timeout=240, flags=flags)
        progress = admin.progress("train").datasets[0]
    assert report["restored_from"]
    assert exact(report, n)
    assert progress.finished


def test_a_slowed_worker_ends_up_with_fewer_shards(tmp_path):
    """Worker 1 gets a quarter of its CPU (SIGSTOP/SIGCONT duty cycling) for the whole
    run: pulling gives the fast worker most shards, and the audit stays exact."""
    from antdt_tf.agent.throttle import CpuThrottle

    n, rps = 8_192, 256
    with pss_cluster(tmp_path, n, rps, seed=5) as (master, cluster, admin), \
            CpuThrottle(cluster.procs["worker", 1].pid, factor=4):
        report = run_local_job(tmp_path, master, cluster, 128, buckets=4096,
                               timeout=240)
    fast, slow = report["shards_per_worker"]
    assert fast + slow == n // rps
    assert fast > 1.5 * slow, report["shards_per_worker"]
    assert exact(report, n)
