"""The flags and environment of every task of a job, per API: the master, PS and worker
servers, the PSS chief (custom loop or Keras), and the TF1 trainers (MonitoredTrainingSession
or tf.estimator, every worker a trainer, worker 0 the chief)."""

from __future__ import annotations

import dataclasses
import json
import pathlib

from antdt_tf.launcher.config import SOURCE_ROOT, TF1_PROGRAM, JobConfig


@dataclasses.dataclass(frozen=True)
class TaskContext:
    """What the builders need to know of the job right now."""
    cfg: JobConfig
    spec: dict                      # job -> addresses (every worker slot)
    active_workers: int             # workers 0..n-1 train; the rest are spare slots
    master_address: str
    coordinator_report_path: pathlib.Path


def task_args(ctx: TaskContext, job: str, index: int) -> tuple[str, list[str]]:
    """The program and flags of ``job:index`` for the job's API."""
    cfg = ctx.cfg
    if job == "master":
        return "antdt-master", [
            f"--port={ctx.master_address.rsplit(':', 1)[1]}",
            f"--state_dir={cfg.workdir / 'master'}",
            f"--straggler_window_seconds={cfg.straggler_window_seconds}",
            f"--straggler_slow_ratio={cfg.straggler_slow_ratio}",
            f"--straggler_persistent_after_seconds={cfg.straggler_persistent_after_seconds}"]
    if cfg.tf1:
        return tf1_task_args(ctx, job, index)
    if job in ("ps", "worker"):   # servers know every worker slot
        return "antdt-tf-server", [f"--cluster={json.dumps(ctx.spec)}", f"--job={job}",
                                   f"--index={index}"]
    # the chief uses the active workers, a prefix of the slots (a task index means
    # the same task to the chief and to the server)
    # no --cluster: the chief reads the cluster the launcher published to the master
    # (start_task), so one that comes back after a move gets the new addresses
    args = [f"--master={ctx.master_address}", "--dataset=train",
            f"--batch_size={cfg.batch_size}", f"--buckets={cfg.buckets}",
            f"--learning_rate={cfg.learning_rate}",
            f"--report_json={ctx.coordinator_report_path}",
            f"--checkpoint_dir={cfg.checkpoint_dir}",
            f"--checkpoint_every_seconds={cfg.checkpoint_every_seconds}"]
    if cfg.api == "custom_loop":
        args += [f"--checkpoint_every_shards={cfg.checkpoint_every_shards}",
                 f"--data_path={cfg.data_path}"]
        args.append(f"--tensorboard_dir={cfg.workdir / 'tensorboard'}")
        if cfg.data_path == "pull":
            args.append(f"--worker_slots={len(ctx.spec['worker'])}")
            args.append(f"--mode={cfg.mode}")
    if cfg.eval_data:
        args.append(f"--eval_data={cfg.eval_data}")
    if cfg.audit:
        args.append("--audit")
    return ("antdt-keras-trainer" if cfg.api == "keras" else "antdt-coordinator"), args

def tf1_task_args(ctx: TaskContext, job: str, index: int) -> tuple[str, list[str]]:
    """TF1 between-graph: PS servers, and one trainer per worker (worker 0 the chief,
    which also writes the report); the master's worker i is the launcher's."""
    cfg = ctx.cfg
    workers = ctx.spec["worker"][:ctx.active_workers]
    if cfg.api == "mts":
        cluster = {"ps": ctx.spec["ps"], "worker": workers}
        if job == "ps":
            return "antdt-tf-server", [f"--cluster={json.dumps(cluster)}", "--job=ps",
                                       f"--index={index}"]
        args = [f"--cluster={json.dumps(cluster)}", f"--task_index={index}",
                f"--checkpoint_dir={cfg.checkpoint_dir}"]
    else:
        args = [f"--model_dir={cfg.checkpoint_dir}"]
    args += [f"--master={ctx.master_address}", "--dataset=train", f"--data={cfg.data}",
             "--noregister", f"--batch_size={cfg.batch_size}", f"--buckets={cfg.buckets}",
             f"--learning_rate={cfg.learning_rate}",
             f"--save_secs={max(1, round(cfg.checkpoint_every_seconds))}",
             f"--report_json={ctx.coordinator_report_path}"]
    if cfg.audit:
        args.append("--audit")
    if cfg.eval_data and index == 0 and job == "worker":
        args.append(f"--eval_data={cfg.eval_data}")
    return TF1_PROGRAM[cfg.api], args

def task_env(ctx: TaskContext, job: str, index: int) -> dict:
    """tf.estimator reads its task from TF_CONFIG: worker 0 is its chief, worker i
    its worker:i-1; the TF 2.15 venv runs this source tree."""
    if ctx.cfg.api != "estimator" or job not in ("ps", "worker"):
        return {}
    workers = ctx.spec["worker"][:ctx.active_workers]
    cluster = {"chief": workers[:1], "worker": workers[1:], "ps": ctx.spec["ps"]}
    task = ({"type": "ps", "index": index} if job == "ps" else
            {"type": "chief", "index": 0} if index == 0 else
            {"type": "worker", "index": index - 1})
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task}),
            "PYTHONPATH": str(SOURCE_ROOT)}
