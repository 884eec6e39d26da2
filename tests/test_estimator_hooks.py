"""TF1 between-graph training (MonitoredTrainingSession on TF 2.21) through antdt-tf's
SessionRunHooks (antdt_tf.estimator), with real PS and worker processes: shards split by
speed, a worker SIGKILL mid-shard, a chief SIGKILL + restart that restores model and
sharding state together — the audit counts every record's applications on the PS."""

import json
import pathlib
import subprocess
import sys
import time

import pytest

from antdt_tf.sharding.client import ShardingClient
from antdt_tf.master.server import BackgroundMaster
from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import ShardState
from jobs import Tf1Job, train_progress, write_data
from waiting import wait_for

pytestmark = pytest.mark.slow
EVAL = 2_000
BATCH = 256


def done_shards(admin) -> int:
    p = train_progress(admin)
    return p.datasets[0].done_shards if p is not None else 0


def test_two_workers_at_different_speeds_split_the_data_and_apply_it_once(tmp_path):
    from antdt_tf.agent.throttle import CpuThrottle

    n = 98_304
    data, held_out = write_data(tmp_path, n, EVAL, seed=11)
    with BackgroundMaster(ShardingServicer(ShardState())) as master, \
            ShardingClient(master.address) as admin, \
            Tf1Job(tmp_path / "job", master.address, data,
                   flags=["--audit", f"--eval_data={held_out}"]) as job:
        # both train first (a throttled TensorFlow start-up would take the whole job)
        wait_for(lambda: len([t for t in admin.progress().tasks if t.records_done]) == 2
                 if done_shards(admin) else False, 120, "both workers training")
        start = {t.task.index: t.records_done for t in admin.progress("train").tasks}
        slowed_from = time.time()
        with CpuThrottle(job.procs["worker", 1].pid, factor=4):
            report = job.wait_workers(240)
        assert admin.progress("train").datasets[0].finished
    a = report["audit"]
    assert (a["applied_0"], a["applied_1"], a["applied_2plus"]) == (0, n, 0), a
    per = dict(enumerate(report["records_per_worker"]))
    assert per[0] + per[1] == n, per
    worker1 = [json.loads(line) for line in
               (tmp_path / "job" / "worker1.log").read_text().splitlines()
               if line.startswith('{"worker": 1')][-1]
    slowed = {w: per[w] - start[w] for w in per}     # since worker 1 was slowed
    assert slowed[0] > slowed[1], (start, per)        # the fast one did more ...
    # ... in proportion to the speeds this machine gave them: neither sat idle while
    # the other had data left. The fast worker's last step ended at most a few of the
    # slow worker's leases (its last one, one leased ahead) before the slow worker's:
    # the slow worker's lease time is measured in this run, so the bound grows with the
    # machine's slowness. An even split (static sharding) would leave the fast worker
    # idle for much of the run: (1 - 1/speedup) of it, dozens of lease times.
    slow_lease_seconds = (worker1["last_step_unix"] - slowed_from) / max(1.0, slowed[1] / 1024)
    fast_idle = worker1["last_step_unix"] - report["last_step_unix"]
    assert fast_idle < 3 * slow_lease_seconds, (fast_idle, slow_lease_seconds, start, per)
    assert report["auc"] > 0.6
    # the non-chief did not sit out TF's 30 s wait for the chief's session: its first
    # step came right after the chief's (it cannot start before the chief initialized
    # the model), whatever TF's start-up took on this machine
    assert worker1["first_step_unix"] - report["first_step_unix"] < 10, (worker1, report)
    assert worker1["records"] == per[1] and report["records"] == per[0]   # hooks' counts
    # sparse reports: leases the master did not want per batch were reported once
    # (shards of 1024 records = 4 batches), and their count still adds up exactly
    assert report["reports"] < report["steps"], report


def test_controller_actions_reach_tf1_workers_at_step_boundaries(tmp_path):
    """ADJUST_BS: a batch size set on the master applies from the worker's next lease.
    Tail stealing: an idle fast worker takes the rest of the slowed worker's long lease;
    the slowed worker's next report is refused, its pipeline skips the lease's other
    batches (stop at a batch boundary), and every record is still applied once."""
    from antdt_tf.agent.throttle import CpuThrottle
    from antdt_tf.sharding.plan import DataFile, DatasetSpec

    n = 131_072
    data, _ = write_data(tmp_path, n, EVAL, seed=14)
    with BackgroundMaster(ShardingServicer(ShardState())) as master, \
            ShardingClient(master.address) as admin:
        # 4 long shards: the fast worker finishes the other three while the slowed one
        # is still inside its first, so the master lets it take that lease's rest
        admin.register_dataset(DatasetSpec("train", records_per_shard=32_768, tail_stealing=True,
                                           files=(DataFile(str(data), n),)))
        with Tf1Job(tmp_path / "job", master.address, data,
                    flags=["--audit", "--noregister"]) as job:
            admin.set_batch_sizes("train", {1: 128})
            wait_for(lambda: len([t for t in admin.progress().tasks if t.records_done]) == 2,
                     120, "both workers training")
            with CpuThrottle(job.procs["worker", 1].pid, factor=4):
                report = job.wait_workers(240)
        final = admin.progress("train").datasets[0]
    a = report["audit"]
    assert (a["applied_0"], a["applied_1"], a["applied_2plus"]) == (0, n, 0), a
    assert final.stolen_leases >= 1, report
    worker1 = [json.loads(line) for line in
               (tmp_path / "job" / "worker1.log").read_text().splitlines()
               if line.startswith('{"worker": 1')][-1]
    assert worker1["refused_reports"] >= 1, worker1
    # every batch had the ADJUST_BS size (a refused batch is counted by the steal)
    assert worker1["records"] == 128 * (worker1["steps"] - worker1["refused_reports"]), worker1


def test_a_worker_sigkill_mid_shard_loses_nothing_and_repeats_at_most_one_batch(tmp_path):
    n = 65_536
    data, held_out = write_data(tmp_path, n, EVAL, seed=12)
    with BackgroundMaster(ShardingServicer(ShardState())) as master, \
            ShardingClient(master.address) as admin, \
            Tf1Job(tmp_path / "job", master.address, data, flags=["--audit"]) as job:
        # mid-shard: worker 1 holds a lease (CI once killed it between two leases, and
        # then there was nothing to re-issue and no failure to count)
        wait_for(lambda: done_shards(admin) >= 12 and any(
            t.task.index == 1 and t.doing_shards for t in admin.progress("train").tasks),
            120, "12 shards and worker 1 holding one")
        old = next(t.task.incarnation for t in admin.progress("train").tasks
                   if t.task.index == 1)
        job.kill("worker", 1)               # its lease stays DOING
        # (a lease finished and reported just before the kill leaves none: CI saw it)
        held_at_kill = any(t.task.index == 1 and t.doing_shards
                           for t in admin.progress("train").tasks)
        # no new lease until the relaunched worker asks: on a busy machine its TF start
        # took so long that the others had trained everything (nothing left to prove)
        admin.set_paused("train", True)
        job.start_worker(1)                 # relaunched: a new incarnation takes it back
        wait_for(lambda: any(t.task.index == 1 and t.task.incarnation != old
                             for t in admin.progress("train").tasks),
                 120, "the relaunched worker 1 to ask for a lease")
        admin.set_paused("train", False)
        report = job.wait_workers(240)
        tasks = {t.task.index: t for t in admin.progress("train").tasks}
    a = report["audit"]
    assert a["applied_0"] == 0 and a["applied_other"] <= BATCH, a
    assert tasks[1].records_done > 0
    if held_at_kill:
        # every lease here has sparse reports (no tail stealing): the master held the
        # dead incarnation's lease, and the chief settled it from the PS record
        assert tasks[1].failures >= 1 and report["settled_held_leases"] >= 1, report


def test_a_chief_restart_restores_the_model_and_the_sharding_state_together(tmp_path):
    n = 65_536
    data, held_out = write_data(tmp_path, n, EVAL, seed=13)
    with BackgroundMaster(ShardingServicer(ShardState())) as master, \
            ShardingClient(master.address) as admin, \
            Tf1Job(tmp_path / "job", master.address, data,
                   flags=["--audit", "--save_secs=1"]) as job:
        ckpt = tmp_path / "job" / "ckpt"
        wait_for(lambda: done_shards(admin) >= 12 and len(list(ckpt.glob("*.index"))) >= 2,
                 120, "12 shards and a checkpoint")
        job.kill("worker", 0)
        before = admin.progress("train").datasets[0].records_done_total
        job.start_worker(0)
        report = job.wait_workers(240)
    assert report["restored_sharding_state"] and before > 0
    a = report["audit"]
    # the audit counter is restored with the model: nothing the master counts as done
    # is missing from it; what other workers trained while the checkpoint was written
    # (and their batch in flight when the master rolled back) is trained again
    assert a["applied_0"] == 0, a
    assert a["applied_2plus"] <= 8 * BATCH, a


LAUNCH_BIN = str(pathlib.Path(sys.executable).parent / "antdt-launch")
ROOT = pathlib.Path(__file__).resolve().parent.parent


def launch_tf1(tmp_path, api, *flags):
    report = tmp_path / "report.json"
    out = subprocess.run([LAUNCH_BIN, f"--api={api}", "--num_ps=1", "--generate_records=60000",
                          "--policy=dynamic",
                          "--eval_records=2000", "--audit", "--noprogress",
                          f"--workdir={tmp_path / 'job'}", f"--report_json={report}",
                          "--timeout_seconds=240", *flags],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:] + out.stdout[-2000:]
    return json.loads(report.read_text()), out.stdout + out.stderr


def test_antdt_launch_mts_relaunches_a_straggler_and_a_killed_worker(tmp_path):
    """AntDT-ND on TF1 workers: the 4x-slowed worker 2 is judged a persistent straggler
    from its report times and moved to another host (standby, then switch); the killed
    worker 1 is restarted; each costs at most its batch in flight."""
    report, out = launch_tf1(tmp_path, "mts", "--num_workers=3", "--policy=antdt-nd",
                             "--generate_records=800000", "--straggler_window_seconds=3",
                             "--straggler_persistent_after_seconds=2",
                             "--relaunch_cost_seconds=1", "--min_gain_seconds=0.5",
                             "--inject=kill:worker:1@1s", "--inject=slow:worker:2:x4@0s")
    assert report["policy"] == "antdt-nd"
    restarts = dict(report["restarts"])
    assert restarts.pop("worker:1", 0) == 1, report["restarts"]       # the kill
    # under load TensorFlow itself may fail a step of the moved worker (seen in CI: "The
    # same RunGraph request was received twice"): it exits and is restarted like any
    # worker, and the audit's bound counts it; nothing else restarts
    assert set(restarts) <= {"worker:2"}, report["restarts"]
    assert all(ev["failure"].startswith("exit") for ev in report["failures"]
               if ev.get("task") == "worker:2"), report["failures"]
    moved = [a for a in report["actions"] if a["action"] == "RelaunchWorker"]
    assert [(a["job"], a["index"]) for a in moved] == [("worker", 2)], report["actions"]
    # switched over: the standby on the other host took the address and the old process
    # was killed, its leases given back (the job may end before the new one trains)
    assert moved[0]["from_host"] != moved[0]["to_host"] and "standby_seconds" in moved[0]
    audit = report["audit"]
    assert audit["applied_0"] == 0 and audit["ok"], audit     # <= 1 batch twice per move
    assert report["auc"] > 0.6 and "chief finished" in out


@pytest.mark.skipif(not (ROOT / ".venv-tf215" / "bin" / "python").exists(),
                    reason="needs TF 2.15's venv: make venv-tf215")
def test_antdt_launch_runs_the_estimator_example_on_tf215_through_a_kill(tmp_path):
    # 200k records: with sparse reports 60k were done in ~1 s, before the kill came
    report, out = launch_tf1(tmp_path, "estimator", "--num_workers=2",
                             "--generate_records=200000", "--inject=kill:worker:1@1s")
    assert report["restarts"] == {"worker:1": 1}
    assert report["audit"]["applied_0"] == 0 and report["audit"]["ok"], report["audit"]
    assert report["coordinator"]["task"] == "chief:0" and report["auc"] > 0.6
