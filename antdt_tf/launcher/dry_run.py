"""``antdt-launch --dry_run``: the whole job checked and described, nothing started.

Users want to know what a command will do before they submit it to a cluster; the docs'
long and multi-host commands are checked the same way in CI (tests/test_doc_commands.py).
Every task's command line comes from the code that builds it for a real launch
(``master.runner.taskspecs.task_args`` -> ``agent.programs.command_for``), so the agent's own
argument checks run too; only the addresses, which exist once the job runs, are
placeholders.
"""

from __future__ import annotations

import math
import pathlib

from antdt_tf.job.spec import Job, place

MASTER_PLACEHOLDER = "master.antdt:7470"     # a valid host:port for the agent's checks


def _placeholder_spec(cfg: Job, where: dict) -> dict:
    """Cluster addresses of the right shape: ``h<host>:<port>`` (ports are picked at
    launch)."""
    spec, port = {}, 20000
    for job, count in (("chief", 1), ("ps", cfg.num_ps), ("worker", cfg.slots)):
        spec[job] = []
        for index in range(count):
            host = where.get((job, index), index % max(cfg.num_hosts, 1))
            spec[job].append(f"h{host}:{port}")
            port += 1
    return spec


def _shown_argv(argv) -> str:
    out = []
    for arg in argv:
        if arg.startswith("--cluster="):
            arg = "--cluster=<the job's addresses>"
        out.append(arg.replace(MASTER_PLACEHOLDER, "<the job's master>"))
    return " ".join(out)


def task_commands(cfg: Job) -> list[tuple[str, str, str]]:
    """(task, host, command) of every task the job starts, in start order. Raises
    InvalidRequest when the agent would refuse a task's arguments."""
    from antdt_tf.agent.client import start_request
    from antdt_tf.agent.programs import PathPolicy, command_for
    from antdt_tf.master.runner.taskspecs import TaskContext, task_args

    where = place(cfg.num_ps, cfg.slots, max(cfg.num_hosts, 1))
    ctx = TaskContext(cfg, _placeholder_spec(cfg, where), cfg.num_workers,
                      MASTER_PLACEHOLDER, cfg.workdir / "coordinator_report.json")
    paths = PathPolicy(tuple(str(r) for r in (cfg.workdir, cfg.checkpoint_dir) if r),
                       cfg.read_roots, cfg.program_roots)
    tasks = [("ps", i) for i in range(cfg.num_ps)] + [
        ("worker", i) for i in range(cfg.num_workers)]
    if not cfg.tf1:
        tasks.append(("chief", 0))
    out = []
    for job, index in tasks:
        program, args = task_args(ctx, job, index)
        command = command_for(start_request(job, index, program, args), paths)
        python = "python (TF 2.15)" if command.estimator else "python"
        name = "coordinator" if job == "chief" else f"{job}:{index}"
        if cfg.tf1 and job == "worker" and index == 0:
            name += " (chief)"
        env = " (its job in TF_CONFIG, ANTDT_*: docs/program.md)" if any(
            k == "TF_CONFIG" for k, _ in command.env) else ""
        out.append((name, f"host{where[job, index]}",
                    f"{python} -m {command.module} {_shown_argv(command.argv)}{env}"))
    return out


def describe(cfg: Job, *, generate: tuple[int, int] | None, report_json: str,
             master: str = "", ray_address: str = "") -> str:
    """What the job would do, as lines for a person. ``generate``: (train, held-out)
    records to generate into ``cfg.data``/``cfg.eval_data``, None for the user's data."""
    workdir = cfg.spec.workdir or "a new temporary directory"
    lines = ["antdt-launch --dry_run: the job is valid; nothing was started, created or "
             "contacted."]
    if cfg.backend == "local":
        lines.append(f"  backend     local: {cfg.num_hosts} simulated host(s) on this machine "
                     "(an antdt-agent each) and an antdt-master with its state in "
                     f"{workdir}/master")
    elif cfg.backend == "agents":
        lines.append(f"  backend     agents: the master at {master} places the tasks on "
                     f"its registered hosts (waits for {cfg.num_hosts}); each agent checks "
                     "the paths against its --job_root/--read_roots")
    elif cfg.backend == "ray":
        lines.append(f"  backend     ray: the Ray cluster at {ray_address or 'auto'}; the master "
                     "and every task an actor on its nodes")
    else:
        lines.append(f"  backend     kubernetes: the master at {master} creates a pod per "
                     "task")
    if cfg.files:
        records = sum(n for _, n in cfg.files)
        lines.append(f"  data        {len(cfg.files)} file(s), {records:,} records "
                     f"({math.ceil(records / cfg.records_per_shard):,}+ shards of "
                     f"{cfg.records_per_shard:,}): " + ", ".join(
                         f"{p} ({n:,})" for p, n in cfg.files[:3])
                     + (", ..." if len(cfg.files) > 3 else "")
                     + f"; {cfg.epochs} epoch(s)")
    elif generate is None:
        records = _records(cfg.data)
        shards = math.ceil(records / cfg.records_per_shard) if records else None
        lines.append(f"  data        {cfg.data}"
                     + (f": {records:,} records, {shards:,} shards of "
                        f"{cfg.records_per_shard:,}" if records else " (checked by the master)")
                     + f"; {cfg.epochs} epoch(s), shard order "
                     + ("shuffled" if cfg.shuffle else "in file order"))
        if cfg.eval_data:
            lines.append(f"  held out    {cfg.eval_data}")
    else:
        train, held_out = generate
        lines.append(f"  data        {train:,} synthetic records (+{held_out:,} held out) "
                     f"generated into {pathlib.Path(cfg.data).parent}: "
                     f"{math.ceil(train / cfg.records_per_shard):,} shards of "
                     f"{cfg.records_per_shard:,}; {cfg.epochs} epoch(s)")
    if cfg.program:
        lines.append(f"  program     {cfg.program}"
                     + (f" (from {cfg.code_dir})" if cfg.code_dir else "")
                     + (" " + " ".join(cfg.program_args) if cfg.program_args else ""))
    lines.append(f"  training    --api={cfg.api}"
                 + (f" --data_path={cfg.data_path} --mode={cfg.mode}" if cfg.api ==
                    "custom_loop" else "")
                 + f", {cfg.num_ps} PS, {cfg.num_workers} worker(s)"
                 + (f" (up to {cfg.max_workers})" if cfg.max_workers > cfg.num_workers
                    else "")
                 + (f", batch {cfg.batch_size}" if not cfg.program else "")
                 + f", policy {cfg.policy}")
    lines.append(f"  checkpoints {cfg.checkpoint_dir or workdir + '/checkpoints'} every "
                 f"{cfg.checkpoint_every_seconds:g} s")
    lines.append(f"  report      {report_json or '(summary only; no --report_json)'}"
                 + (", audit on" if cfg.audit else ""))
    for inj in cfg.injections:
        lines.append(f"  inject      {inj}")
    lines.append("  tasks (addresses and ports are picked at launch):")
    for name, host, command in task_commands(cfg):
        if cfg.backend in ("agents", "kubernetes", "ray"):
            host = "(placed by the master)"
        lines.append(f"    {name:<18} {host:<22} {command}")
    return "\n".join(lines)


def _records(path: str) -> int:
    """Records of a local .adtr file; 0 when it is not readable here (a cluster path)."""
    from antdt_tf.data.records import RecordFile
    from antdt_tf.errors import AntdtError

    try:
        return RecordFile(path).num_records
    except (AntdtError, OSError):
        return 0
