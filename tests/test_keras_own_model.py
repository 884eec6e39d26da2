"""A user's own Keras model, train_step and data format (keras_examples.own_model:
tf.train.Example TFRecord files, its own per-record counter on the PS) under
ParameterServerStrategy with real PS/worker processes: a worker SIGKILLed while the
chief's main thread waits — longer than the master holds the dead worker's sparse
leases — is settled from the PS record when the chief comes back, not re-trained."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from antdt_tf.master.server import BackgroundMaster
from antdt_tf.procutil import child_env
from antdt_tf.sharding.client import ShardingClient, Task
from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import LeaseConfig, ShardState
from antdt_tf.tf.local_cluster import LocalCluster

pytestmark = pytest.mark.slow
ROOT = pathlib.Path(__file__).resolve().parents[1]
PER_FILE, BATCH, SETTLE = 6_000, 128, 4.0   # the chief renews every 1 s: 3 s of slack


def write_data(tmp_path) -> list[str]:
    code = ("import sys; from keras_examples.own_model import write_examples as w; "
            "[w(p, int(f), int(n), seed=int(f)) for p, f, n in zip(*[iter(sys.argv[1:])] * 3)]")
    paths = [str(tmp_path / f"part-{i}.tfrecord") for i in range(2)]
    args = [a for i, p in enumerate(paths) for a in (p, str(i * PER_FILE), str(PER_FILE))]
    subprocess.run([sys.executable, "-c", code, *args], check=True, cwd=ROOT,
                   env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT)))
    return paths


def test_own_model_and_data_exact_through_a_kill_while_the_chief_waits(tmp_path):
    paths = write_data(tmp_path)
    block = tmp_path / "block"
    state = ShardState(LeaseConfig(settle_seconds=SETTLE))
    with BackgroundMaster(ShardingServicer(state)) as master, \
            LocalCluster(num_ps=1, num_workers=2, log_dir=tmp_path) as cluster, \
            ShardingClient(master.address, timeout=10) as admin:
        report = tmp_path / "report.json"
        log_path = tmp_path / "chief.log"
        cmd = [sys.executable, str(ROOT / "tests" / "keras_own_chief.py"),
               f"--cluster={cluster.spec_json}", f"--master={master.address}",
               f"--data={','.join(paths)}", f"--batch_size={BATCH}",
               "--records_per_shard=2048", f"--block_file={block}",
               f"--report_json={report}"]
        env = dict(cluster.env, PYTHONPATH=str(ROOT))
        with open(log_path, "ab") as log:
            chief = subprocess.Popen(cmd, env=child_env(env), start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT)
        kept = []
        try:
            def sparse_lease_of_worker_1():
                snap = master.call(state.snapshot)
                return [r for d in snap.datasets for r in d.doing if r.sparse_reports
                        and (r.holder.type, r.holder.index) == ("worker", 1)]

            def held():
                return list(admin.progress("own").datasets[0].held)

            deadline = time.monotonic() + 240
            waiting = tmp_path / "block.waiting"
            # on progress: a third of the data done and worker 1 on a sparse lease while
            # the chief's main thread waits (else let it go on and try again)
            while True:
                assert chief.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "worker 1 never held a sparse lease"
                try:
                    p = admin.progress("own").datasets[0]
                except Exception:
                    p = None
                if p is None or p.records_done_total < 4_000 or not sparse_lease_of_worker_1():
                    time.sleep(0.05)
                    continue
                block.touch()
                while not waiting.exists():        # the chief's main thread waits from now
                    assert chief.poll() is None and time.monotonic() < deadline
                    time.sleep(0.02)
                if sparse_lease_of_worker_1():
                    break
                block.unlink()
                waiting.unlink()
            incarnation = sparse_lease_of_worker_1()[0].holder.incarnation
            cluster.kill("worker", 1)
            # what a supervisor does on a death (antdt-launch's runner does it too)
            admin.report_task_failure(Task("worker", 1, incarnation), reason="SIGKILL")
            cluster.start_task("worker", 1)
            assert held(), "the dead worker's sparse lease was not held"
            # the chief's keeper thread renews the hold: 3 x settle_seconds later the
            # lease is still held (without it, the master re-issues it from its count)
            until = time.monotonic() + 3 * SETTLE
            while time.monotonic() < until:
                kept.append(len(held()))
                time.sleep(0.1)
            block.unlink()
            chief.wait(timeout=240)
        finally:
            if chief.poll() is None:
                os.killpg(chief.pid, signal.SIGKILL)
                chief.wait()
        assert chief.returncode == 0, log_path.read_text()[-3000:]
        assert min(kept) >= 1, kept
        import json

        summary = json.loads(report.read_text())
    n = 2 * PER_FILE
    assert summary["finished"] and summary["records"] == n, summary
    assert summary["settled_held_leases"] >= 1, summary
    # the user's own counter: every record trained once, but for the one batch the
    # kill may have cut (trained again)
    assert summary["seen_0"] == 0, summary
    assert summary["seen_1"] >= n - BATCH and summary["seen_2plus"] <= BATCH, summary
