"""BSP mode (antdt_tf.tf.bsp) with real PS/worker/chief processes: rounds apply every
record exactly once, also through a worker SIGKILL mid-round; ADJUST_BS batch sizes set
on the master reach the workers' rounds at a step boundary."""

import contextlib

import pytest

from antdt_tf.tf.local_cluster import run_local_job
from jobs import local_pss_job

pytestmark = pytest.mark.slow
N, EVAL, BATCH = 8_192, 4_000, 128


@contextlib.contextmanager
def bsp_job(tmp_path):
    with local_pss_job(tmp_path, N, EVAL, seed=5) as (master, cluster, admin, flags):
        yield master, cluster, admin, ["--mode=bsp", *flags]


def test_bsp_rounds_apply_every_record_once_and_adjusted_batch_sizes_take_effect(tmp_path):
    with bsp_job(tmp_path) as (master, cluster, admin, flags):
        adjusted = []

        def adjust(_chief):
            if not adjusted and admin.progress("train").datasets[0].done_shards >= 2:
                adjusted.append(admin.set_batch_sizes("train", {0: 192, 1: 64}))
        report = run_local_job(tmp_path, master.address, cluster, BATCH, buckets=4096,
                               timeout=300, flags=flags, on_poll=adjust)
    a = report["audit"]
    assert (a["applied_0"], a["applied_1"], a["applied_2plus"]) == (0, N, 0)
    assert report["mode"] == "bsp" and report["refused_reports"] == 0
    # one batch per worker per round (fewer when a worker had no lease at that moment)
    assert report["rounds"] >= N // (2 * 192)
    seen = {int(w): {int(s) for s in sizes} for w, sizes in report["batch_sizes_seen"].items()}
    assert BATCH in seen[0] and BATCH in seen[1]          # before the adjustment
    assert 192 in seen[0] and 64 in seen[1]               # after it
    assert report["auc"] > 0.6


def test_bsp_survives_a_worker_sigkill_exactly(tmp_path):
    """Nothing is reported before the chief applied the round: a worker killed
    mid-round loses its staged batch, which the master re-issues — exact, not ±1 batch."""
    killed = []
    with bsp_job(tmp_path) as (master, cluster, admin, flags):
        def kill_once(_chief):
            if not killed and admin.progress("train").datasets[0].done_shards >= 3:
                cluster.kill("worker", 1)
                killed.append(True)
                cluster.start_task("worker", 1)
        report = run_local_job(tmp_path, master.address, cluster, BATCH, buckets=4096,
                               timeout=300, flags=flags, on_poll=kill_once)
    assert killed
    a = report["audit"]
    assert (a["applied_0"], a["applied_1"], a["applied_2plus"]) == (0, N, 0)
