"""Local jobs for the multi-process tests: generated train + held-out data, an
in-process master, and real PS/worker processes (TF2 PSS, or TF1 between-graph)."""

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

from antdt_tf.data import criteo, records
from antdt_tf.procutil import child_env
from antdt_tf.sharding.client import ShardingClient
from antdt_tf.sharding.plan import DataFile, DatasetSpec
from antdt_tf.master.server import BackgroundMaster
from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import ShardState
from antdt_tf.tf.local_cluster import LocalCluster
from waiting import wait_for

ROOT = pathlib.Path(__file__).resolve().parent.parent


def train_progress(admin):
    """The master's progress of dataset ``train``, None until it is registered (the
    chief registers it)."""
    try:
        return admin.progress("train")
    except Exception:
        return None


def wait_for_records(master: str, launcher, count: int, timeout: float = 300) -> None:
    """Returns once the master at ``master`` counts ``count`` records done (the job
    registered and trained that far) while ``launcher`` runs: a trigger on progress, not
    on time."""
    from antdt_tf.errors import AntdtError

    with ShardingClient(master, timeout=10) as admin:
        def done() -> bool:
            assert launcher.poll() is None, "the launcher ended first"
            try:
                return admin.progress("train").datasets[0].records_done_total >= count
            except AntdtError:
                return False    # not registered yet, or the master restarting
        wait_for(done, timeout, f"{count} records done", interval=0.1)


def write_data(tmp_path, num_records: int, eval_records: int, seed: int):
    """``(train, held_out)`` record files from one hidden model."""
    data, held_out = tmp_path / "train.adtr", tmp_path / "eval.adtr"
    train, evaluation, seen = [], [], 0
    for b in criteo.generate(criteo.SyntheticSpec(num_records + eval_records, seed=seed)):
        k = max(0, min(len(b.label), num_records - seen))    # this block's training part
        train.append(criteo.Batch(b.label[:k], b.dense[:k], b.sparse[:k]))
        evaluation.append(criteo.Batch(b.label[k:], b.dense[k:], b.sparse[k:]))
        seen += len(b.label)
    records.write_records(data, train)
    records.write_records(held_out, evaluation)
    return data, held_out


@contextlib.contextmanager
def local_pss_job(tmp_path, num_records: int, eval_records: int, seed: int,
                  records_per_shard: int = 1024, num_workers: int = 2, lease=None):
    """Yields ``(master, cluster, admin, flags)``; ``flags`` point the chief at the
    held-out data. ``lease``: the master's ``LeaseConfig`` (default: its own)."""
    data, held_out = write_data(tmp_path, num_records, eval_records, seed)
    n = num_records
    state = ShardState(lease) if lease is not None else ShardState()
    with BackgroundMaster(ShardingServicer(state)) as master, \
            LocalCluster(num_ps=1, num_workers=num_workers, log_dir=tmp_path) as cluster, \
            ShardingClient(master.address) as admin:
        admin.register_dataset(DatasetSpec("train", records_per_shard=records_per_shard,
                                           files=(DataFile(str(data), n),)))
        yield master, cluster, admin, [f"--eval_data={held_out}"]


class Tf1Job:
    """A TF1 between-graph job as real processes, each in its own process group, killed
    and restarted by PID. Worker 0 is the chief and writes ``report.json``.

    ``program="mts"``: PS servers plus one ``estimator_examples.train_mts`` process per
    worker (server + MonitoredTrainingSession), cluster ``{ps, worker}``.
    ``program="estimator"``: every task (chief = worker 0, ``worker:i-1`` = worker i,
    ps) runs ``estimator_examples.train_estimator`` with its own ``TF_CONFIG``
    (``train_and_evaluate``), cluster ``{chief, worker, ps}``."""

    def __init__(self, workdir, master: str, data, num_workers: int = 2, num_ps: int = 1,
                 flags=(), python: str = sys.executable, program: str = "mts"):
        from antdt_tf.tf.local_cluster import free_ports

        self.dir = pathlib.Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        ports = free_ports(num_ps + num_workers)
        self.program = program
        workers = [f"127.0.0.1:{p}" for p in ports[num_ps:]]
        self.spec = {"ps": [f"127.0.0.1:{p}" for p in ports[:num_ps]]}
        if program == "mts":
            self.spec["worker"] = workers
        else:
            self.spec.update(chief=workers[:1], worker=workers[1:])
        self.num_workers = num_workers
        self.master, self.data, self.flags, self.python = master, data, list(flags), python
        self.procs: dict[tuple[str, int], subprocess.Popen] = {}
        self.env = child_env(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES=""))
        self.report_path = self.dir / "report.json"

    def _spawn(self, key, cmd, tf_task=None):
        env = self.env
        if tf_task is not None:
            env = dict(env, TF_CONFIG=json.dumps({"cluster": self.spec, "task": {
                "type": tf_task[0], "index": tf_task[1]}}), PYTHONPATH=str(ROOT))
        with open(self.dir / f"{key[0]}{key[1]}.log", "ab") as log:
            self.procs[key] = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True)
        return self.procs[key]

    def _estimator_cmd(self):
        return [self.python, "-m", "estimator_examples.train_estimator", f"--master={self.master}",
                f"--data={self.data}", f"--model_dir={self.dir / 'ckpt'}",
                f"--report_json={self.report_path}", *self.flags]

    def start_worker(self, i: int) -> subprocess.Popen:
        if self.program == "estimator":
            task = ("chief", 0) if i == 0 else ("worker", i - 1)
            return self._spawn(("worker", i), self._estimator_cmd(), tf_task=task)
        return self._spawn(("worker", i), [
            self.python, "-m", "estimator_examples.train_mts", f"--cluster={json.dumps(self.spec)}",
            f"--task_index={i}", f"--master={self.master}", f"--data={self.data}",
            f"--checkpoint_dir={self.dir / 'ckpt'}", f"--report_json={self.report_path}",
            *self.flags])

    def start(self) -> "Tf1Job":
        for k in range(len(self.spec["ps"])):
            if self.program == "estimator":
                self._spawn(("ps", k), self._estimator_cmd(), tf_task=("ps", k))
            else:
                self._spawn(("ps", k), [self.python, "-m", "antdt_tf.tf.server",
                                        f"--cluster={json.dumps(self.spec)}", "--job=ps",
                                        f"--index={k}"])
        for i in range(self.num_workers):
            self.start_worker(i)
        return self

    def kill(self, job: str, i: int) -> None:
        proc = self.procs[job, i]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def wait_workers(self, timeout: float) -> dict:
        """Waits for every worker to exit 0; returns the chief's report."""
        deadline = time.monotonic() + timeout
        for i in range(self.num_workers):
            proc = self.procs["worker", i]
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            log = (self.dir / f"worker{i}.log").read_text()[-3000:]
            assert proc.returncode == 0, f"worker {i} exited {proc.returncode}:\n{log}"
        return json.loads(self.report_path.read_text())

    def stop(self) -> None:
        for key, proc in self.procs.items():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
