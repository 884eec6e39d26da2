"""The typed start arguments of every task of a job, per API: PS and worker servers, the
PSS chief (custom loop or Keras), and the TF1 trainers (MonitoredTrainingSession or
tf.estimator, every worker a trainer, worker 0 the chief). The agent that runs a task
writes its command line from these (``antdt_tf.agent.programs``)."""

from __future__ import annotations

import dataclasses
import pathlib

from antdt_tf.job.spec import Job
from antdt_tf.proto import cluster_pb2 as cpb


@dataclasses.dataclass(frozen=True)
class TaskContext:
    """What the builders need to know of the job right now."""
    cfg: Job
    spec: dict                      # job -> addresses (every worker slot)
    active_workers: int             # workers 0..n-1 train; the rest are spare slots
    master_address: str
    coordinator_report_path: pathlib.Path


def cluster_addresses(spec: dict) -> cpb.ClusterAddresses:
    out = cpb.ClusterAddresses()
    for job, addresses in spec.items():
        out.jobs[job].address.extend(addresses)
    return out


def task_args(ctx: TaskContext, job: str, index: int, standby_file: str = "",
              own_endpoint: str = ""):
    """The program (``cpb.Program``) and typed arguments of ``job:index`` for the job's
    API. ``own_endpoint``: a standby serving at another address than the task's slot in
    the cluster (its own cluster entry says so); ``standby_file``: it waits for it."""
    cfg = ctx.cfg
    if cfg.tf1:
        return tf1_task_args(ctx, job, index, standby_file)
    if job == "chief" and cfg.program:
        return cpb.USER_PROGRAM, program_args(ctx, "chief", 0, cluster_addresses(
            {"chief": ctx.spec["chief"], "ps": ctx.spec["ps"],
             "worker": ctx.spec["worker"][:ctx.active_workers]}))
    if job in ("ps", "worker"):   # servers know every worker slot
        spec = {k: list(v) for k, v in ctx.spec.items()}
        if own_endpoint:
            spec[job][index] = own_endpoint
        return cpb.TF_SERVER, cpb.TfServerArgs(cluster=cluster_addresses(spec), job=job,
                                               index=index, standby_file=standby_file)
    # the chief uses the active workers, a prefix of the slots (a task index means the
    # same task to the chief and to the server); it has no cluster argument: it reads the
    # cluster the runner published to the master, so one that comes back after a move
    # gets the new addresses
    args = cpb.ChiefArgs(master=ctx.master_address, dataset="train",
                         batch_size=cfg.batch_size, buckets=cfg.buckets,
                         learning_rate=cfg.learning_rate,
                         report_json=str(ctx.coordinator_report_path),
                         checkpoint_dir=str(cfg.checkpoint_dir),
                         checkpoint_every_seconds=cfg.checkpoint_every_seconds,
                         eval_data=str(cfg.eval_data or ""), audit=cfg.audit)
    if cfg.api == "keras":
        return cpb.KERAS_CHIEF, args
    args.checkpoint_every_shards = cfg.checkpoint_every_shards
    args.data_path = cfg.data_path
    args.tensorboard_dir = str(cfg.workdir / "tensorboard")
    if cfg.data_path == "pull":
        args.worker_slots = len(ctx.spec["worker"])
        args.mode = cfg.mode
    return cpb.PSS_CHIEF, args


def program_args(ctx: TaskContext, role: str, index: int,
                 cluster: cpb.ClusterAddresses) -> cpb.UserProgramArgs:
    """The job's own program as ``role:index`` (docs/program.md: what it is told)."""
    cfg = ctx.cfg
    return cpb.UserProgramArgs(
        program=cfg.program, argv=list(cfg.program_args), code_dir=cfg.code_dir,
        api=cfg.api, role=role, index=index, cluster=cluster, master=ctx.master_address,
        dataset="train", checkpoint_dir=str(cfg.checkpoint_dir),
        checkpoint_every_seconds=cfg.checkpoint_every_seconds,
        report_json=str(ctx.coordinator_report_path) if index == 0 else "",
        worker_slots=len(ctx.spec["worker"]), audit=cfg.audit)


def tf1_task_args(ctx: TaskContext, job: str, index: int, standby_file: str = ""):
    """TF1 between-graph: PS servers, and one trainer per worker (worker 0 the chief,
    which also writes the report); the master's worker i is the launcher's."""
    cfg = ctx.cfg
    cluster = cluster_addresses({"ps": ctx.spec["ps"],
                                 "worker": ctx.spec["worker"][:ctx.active_workers]})
    if job == "ps" and cfg.api == "mts":
        return cpb.TF_SERVER, cpb.TfServerArgs(cluster=cluster, job="ps", index=index,
                                               standby_file=standby_file)
    if cfg.program:
        args = program_args(ctx, job, index, cluster)
        args.standby_file = standby_file
        return cpb.USER_PROGRAM, args
    # tf.estimator runs its PS from the same program (its role from TF_CONFIG)
    args = cpb.Tf1TrainerArgs(
        cluster=cluster, task_index=index, job=job, checkpoint_dir=str(cfg.checkpoint_dir),
        master=ctx.master_address, dataset="train", data=str(cfg.data), register=False,
        batch_size=cfg.batch_size, buckets=cfg.buckets, learning_rate=cfg.learning_rate,
        save_secs=max(1, round(cfg.checkpoint_every_seconds)),
        report_json=str(ctx.coordinator_report_path), audit=cfg.audit,
        standby_file=standby_file)
    if cfg.eval_data and index == 0 and job == "worker":
        args.eval_data = str(cfg.eval_data)
    return (cpb.MTS_TRAINER if cfg.api == "mts" else cpb.ESTIMATOR_TRAINER), args
