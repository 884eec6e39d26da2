"""tf-keras model.fit under ParameterServerStrategy fed by the master (antdt-keras-trainer,
real PS/worker/chief processes): exact audit, learning, a worker SIGKILL mid-fit, and a
chief SIGKILL + relaunch that restores model, optimizer and sharding state."""

import contextlib
import signal

import pytest

from antdt_tf.tf.local_cluster import run_local_job
from jobs import local_pss_job
from waiting import wait_for

pytestmark = pytest.mark.slow
KERAS = "antdt_tf.tf.keras_trainer"
N, EVAL = 24_576, 4_000


@contextlib.contextmanager
def keras_job(tmp_path):
    with local_pss_job(tmp_path, N, EVAL, seed=2) as (master, cluster, admin, flags):
        yield master, cluster, admin, flags


def count_reports(master) -> list:
    """Counts the master's accepted ``antdt.report`` calls (its Monitor hook, kept)."""
    calls, observe = [], master.server.tf_rpc.on_step

    def counted(*args):
        calls.append(args)
        return observe(*args)
    master.server.tf_rpc.on_step = counted
    return calls


@pytest.mark.parametrize("sparse", [True, False], ids=["sparse_reports", "per_step_reports"])
def test_fit_applies_every_record_once_and_learns(tmp_path, sparse):
    with keras_job(tmp_path) as (master, cluster, admin, flags):
        reports = count_reports(master)
        report = run_local_job(tmp_path, master.address, cluster, 256, buckets=4096,
                               timeout=240, module=KERAS, flags=flags + [
                                   "--sparse_reports" if sparse else "--nosparse_reports"])
        assert admin.progress("train").datasets[0].finished
    a = report["audit"]
    assert (a["applied_0"], a["applied_1"], a["applied_2plus"]) == (0, N, 0)
    assert report["records"] == N and sum(report["records_per_worker"]) == N
    assert min(report["shards_per_worker"]) > 0          # both workers pulled shards
    assert report["auc"] > 0.6
    steps = N // 256
    if sparse:   # one report per lease, per batch only for the epoch's tail
        assert len(reports) < 0.6 * steps, len(reports)
    else:
        assert len(reports) >= steps            # one per trained batch


@pytest.mark.parametrize("spe", [1, 16], ids=["1_step", "16_steps_per_execution"])
def test_fit_survives_a_worker_sigkill(tmp_path, spe):
    """With sparse reports (the default) the master holds the dead worker's lease and
    the callback settles it from the PS record: still at most one batch repeated (the
    master's own count would repeat up to the lease's reported-but-unsent batches) —
    counting a step the kill cut (begun, not every update landed: ``torn``), at one
    step per closure and at 16."""
    killed = []
    with keras_job(tmp_path) as (master, cluster, admin, flags):
        def sparse_leases_of_worker_1():
            state = master.call(master.server.servicer.state.snapshot)
            return sum(1 for d in state.datasets for r in d.doing if r.sparse_reports
                       and (r.holder.type, r.holder.index) == ("worker", 1))

        def kill_once(_chief):
            if not killed and admin.progress("train").datasets[0].done_shards >= 6:
                killed.append(sparse_leases_of_worker_1())
                cluster.kill("worker", 1)
                cluster.start_task("worker", 1)   # back on its address; TF re-joins it
        report = run_local_job(tmp_path, master.address, cluster, 256, buckets=4096,
                               timeout=240, module=KERAS, on_poll=kill_once,
                               flags=flags + [f"--steps_per_execution={spe}"])
    assert killed
    a = report["audit"]
    # at most one batch: applied twice in full, or cut by the kill and trained again
    assert a["applied_0"] == 0 and a["applied_other"] + a["torn"] <= 256, a
    # it held a sparse lease at the kill: the master held it and the chief settled it
    # from the record (a lease still reported per batch is re-issued from the master's
    # own count, which is exact for it)
    if killed[0]:
        assert report["settled_held_leases"] >= 1, report


def test_a_refused_lease_is_skipped(tmp_path, caplog):
    """Leases of 1 s: a worker stopped (SIGSTOP) until the master has let its leases
    expire loses them; the master re-issues them from its count; after SIGCONT the
    worker's next report is refused and it skips the rest of that lease (sample weight
    0, not counted), so each refusal repeats at most the one batch in flight (per-batch
    reports: the case where the master can refuse mid-lease; the first steps' tracing
    can cost a lease too). The stop ends on what the master did, not after a fixed
    time: on a loaded machine its expiry may come late."""
    import os

    from antdt_tf.sharding.state import LeaseConfig

    caplog.set_level("WARNING", logger="antdt_tf.sharding.tf_rpc")
    stopped = []
    lease = LeaseConfig(min_seconds=1.0, initial_seconds=1.0, max_seconds=1.0)
    with local_pss_job(tmp_path, N, EVAL, seed=2, lease=lease) as (
            master, cluster, admin, flags):
        def held_by_worker_1() -> set:
            """Lease ids worker 1 holds at the master (DOING)."""
            state = master.call(master.server.servicer.state.snapshot)
            return {r.lease_id for d in state.datasets for r in d.doing
                    if (r.holder.type, r.holder.index) == ("worker", 1)}

        def failures_of_worker_1() -> int:
            """Its failures at the master: FAILED reports, deaths and expired leases."""
            return sum(t.failures for t in admin.progress("train").tasks
                       if (t.task.type, t.task.index) == ("worker", 1))

        def stop_once(_chief):
            if stopped or admin.progress("train").datasets[0].done_shards < 6:
                return
            pid = cluster.procs["worker", 1].pid
            os.kill(pid, signal.SIGSTOP)
            try:
                held, failures = held_by_worker_1(), failures_of_worker_1()
                if not held:
                    return      # between two leases: nothing to lose, stop it later
                wait_for(lambda: not held & held_by_worker_1(), 120,
                         f"the master to take back worker 1's leases {sorted(held)}")
                # expired (a report sent just before the stop may have finished one:
                # then nothing was taken from it, and it is stopped again later)
                if failures_of_worker_1() > failures:
                    stopped.append(sorted(held))
            finally:
                os.kill(pid, signal.SIGCONT)
        report = run_local_job(tmp_path, master.address, cluster, 256, buckets=4096,
                               timeout=240, module=KERAS, on_poll=stop_once,
                               flags=flags + ["--nosparse_reports"])
    import re

    refused = [re.search(r"lease (\d+)", r.getMessage().split("not counted:", 1)[1])[1]
               for r in caplog.records if "not counted:" in r.getMessage()]
    assert stopped and refused
    # each refused lease was refused once: the worker reported nothing of it again
    # (without the skip: a refusal per remaining batch, every one applied twice)
    assert len(refused) == len(set(refused)), refused
    a = report["audit"]
    assert a["applied_0"] == 0, a
    assert a["applied_2plus"] <= 256 * len(refused), (a, refused)


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
