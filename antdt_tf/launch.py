"""antdt-launch: run a whole antdt-tf training job with real processes, on this machine,
on the hosts registered with a running master, or on a Ray cluster.

Usage::

    antdt-launch --num_ps=2 --num_workers=3 --generate_records=200000 --audit \\
        --inject=slow:worker:2:x3@5s-40s --inject=kill:worker:1@30s --report_json=r.json
    antdt-launch --backend=agents --master=10.0.0.5:7470 --num_hosts=3 --data=/shared/d.adtr
    antdt-launch --backend=ray --ray_address=10.0.0.5:6379 --data=/shared/d.adtr

It is a client of the master, which owns the job: it submits a typed ``JobSpec`` and
follows the job (``antdt_tf.launcher.follow``). By default (``--backend=local``) it first
starts one ``antdt-agent`` per simulated host on loopback and an ``antdt-master`` (state
in the workdir) — restarting that master if it dies; with ``--backend=agents`` it submits
to the running master at ``--master``, whose hosts are the agents registered with it
(docs/backends.md); with ``--backend=ray`` it starts the master as an actor on the Ray
cluster's head node, and every task is an actor on a node (docs/ray.md). The master's job control (``antdt_tf.master.job_control``) starts
the PS and worker ``tf.distribute.Server`` tasks and the coordinator through the
backend, publishes the cluster's addresses for the chief, and supervises
(``antdt_tf.master.runner``); the launcher shows a progress line (records, shards,
records/s, ETA, each worker's share) and the job's events:

- a worker that died is restarted on its address; TensorFlow re-joins it and re-runs its
  closure (the slot progress on the PS resumes the shard after its applied batches);
- a PS that died is restarted; the coordinator, which cannot continue without it, exits
  75 and is relaunched, restoring model and sharding state from the last shard-boundary
  checkpoint;
- a coordinator that died is relaunched (same restore);
- a master that died is restarted on its state dir (local and ray backends: by the
  launcher);
  it resumes the job, adopting the tasks that still run;
- a task whose host is lost comes back on another host, at a new address; for a worker
  the chief restarts with the new cluster and restores.

At the end it prints a summary table and writes a JSON report (``--report_json``): JCT,
records/s, shards and records per worker, failures and recoveries, AUC, audit counts.
Exit code 0 when the job finished (and, with ``--audit``, every record was applied the
expected number of times up to one batch per injected failure), 1 otherwise; 2 for bad
flags or unusable data, refused in one line before anything is created (no workdir, no
process; docs/cli-exit-codes.md).
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile

from absl import app, flags

from antdt_tf import auth, exitcodes
from antdt_tf.agent.inject import parse_injection
from antdt_tf.errors import AntdtError, InvalidRequest
from antdt_tf.job.spec import (CHOICES, DEFAULTS, SOURCE_ROOT, Job, check_traits,
                               default_namespace, new_spec, task_port_range, validate)
from antdt_tf.launcher.generate import generate_data, generated_paths
from antdt_tf.launcher.report import summary_table

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_ps", DEFAULTS["num_ps"], "Parameter server tasks.")
flags.DEFINE_integer("num_workers", DEFAULTS["num_workers"], "Worker tasks at the start.")
flags.DEFINE_integer("max_workers", DEFAULTS["max_workers"],
                     "Worker slots the job may scale out to (pull data "
                     "path); 0 = --num_workers.")
flags.DEFINE_integer("num_hosts", 0,
                     "Simulated hosts (one agent each); tasks are placed "
                     "round-robin. 0: one host per worker. --backend=agents: wait until "
                     "this many hosts registered with the master (0: 1).")
flags.DEFINE_enum("backend", DEFAULTS["backend"], CHOICES["backend"], "Where the "
                  "tasks run: local = simulated hosts on this machine (an agent each, on "
                  "loopback; the launcher starts the master); agents = the real hosts whose "
                  "antdt-agent registered with the running master at --master (see "
                  "docs/backends.md); ray = the nodes of a Ray cluster (docs/ray.md); "
                  "kubernetes = pods the antdt-master running in --namespace creates "
                  "(docs/kubernetes.md).")
flags.DEFINE_string("namespace", "", "--backend=kubernetes: the namespace the job's "
                    "antdt-master runs in (deploy/kubernetes/); its Service is the default "
                    "--master.")
flags.DEFINE_string("ray_address", "auto", "--backend=ray: the Ray cluster to run on "
                    "(HOST:PORT of its GCS, or auto: the cluster of this machine). Needs "
                    "RAY_AUTH_TOKEN as on the cluster's nodes (docs/ray.md).")
flags.DEFINE_string("ray_namespace", "", "--backend=ray: the job's Ray namespace, where its "
                    "master and task actors are named (default: one derived from --workdir).")
flags.DEFINE_string("task_ports", "", "--backend=ray: FIRST-LAST, the ports the job's TF "
                    "tasks serve on, outside Ray's own ports (default 23000-23999).")
flags.DEFINE_string("master", "", "--backend=agents|kubernetes: host:port of the running "
                    "antdt-master (agents: the one the hosts' agents report to; kubernetes: "
                    "default antdt-master.<namespace>.svc.cluster.local:7470, or 127.0.0.1:7470 "
                    "through kubectl port-forward). Every process needs the job's token "
                    "($ANTDT_JOB_TOKEN) when it listens beyond loopback.")
flags.DEFINE_float("host_timeout_seconds", DEFAULTS["host_timeout_seconds"],
                   "--backend=agents: a host whose agent was not heard from for this long is "
                   "lost; its tasks are relaunched on the others.")
flags.DEFINE_enum("model", "deepfm", ["deepfm"], "The model antdt-tf's own trainers train "
                  "(without --program).")
flags.DEFINE_string("program", "", "Your own training program, run as the job's chief "
                    "(--api=custom_loop|keras) or as every worker (--api=mts|estimator): "
                    "/path/to/train.py, or pkg.module[:function] found in --code_dir. Its "
                    "arguments follow '--'. It gets the job from its environment "
                    "(TF_CONFIG, ANTDT_*; docs/program.md). Empty: antdt-tf's DeepFM.")
flags.DEFINE_string("code_dir", "", "--program=pkg.module: the directory its package is in "
                    "(default: the current directory). Every host must see it at this path "
                    "(agents: under their --program_roots).")
flags.DEFINE_string("data_format", "auto", "--program: the format of --data, to count its "
                    "records: adtr, tfrecord, tfrecord_gzip, tfrecord_zlib, or module:Class "
                    "of your own with count(path); auto: from the file names.")
flags.DEFINE_boolean("local_security", True, "--backend=local: give the job a fresh token "
                     "and a throw-away CA (workdir/tls), so every call between its processes "
                     "is authenticated and encrypted, as across real hosts.")
flags.DEFINE_boolean("private_network", True, "--backend=local: run the master, the agents "
                     "and every TF task in a network namespace of the job's own (root or "
                     "user namespaces), so none of their ports — TensorFlow's open, "
                     "unauthenticated servers above all — is reachable from outside it.")
auth.define_tls_flags()     # --backend=agents: the launcher's identity towards the master
flags.DEFINE_enum("api", DEFAULTS["api"], CHOICES["api"],
                  "How the job trains: custom_loop = antdt-coordinator (ClusterCoordinator "
                  "loop); keras = antdt-keras-trainer (tf-keras model.fit with the antdt "
                  "callback); TF1 between-graph, every worker a trainer (worker 0 the chief) "
                  "with the antdt SessionRunHooks: mts = MonitoredTrainingSession on this "
                  "TensorFlow, estimator = tf.estimator train_and_evaluate on TF 2.15 "
                  "(--estimator_python).")
flags.DEFINE_string("estimator_python", "", "--api=estimator: the TF 2.15 venv's Python "
                    "(default: .venv-tf215/bin/python of this source tree; make venv-tf215).")
flags.DEFINE_enum("mode", DEFAULTS["mode"], CHOICES["mode"], "custom_loop + pull: async = every "
                  "worker applies its own steps (PSS's default); bsp = synchronous rounds, "
                  "one batch per worker applied together (stragglers then slow every "
                  "round: the presets adjust per-worker batch sizes, ADJUST_BS).")
flags.DEFINE_enum("data_path", DEFAULTS["data_path"],
                  ["pull", "closure"], "custom_loop only: pull = "
                  "workers lease shards from the master in their tf.data pipeline; closure = "
                  "the coordinator schedules one closure per shard.")
flags.DEFINE_float("checkpoint_every_seconds", DEFAULTS["checkpoint_every_seconds"],
                   "Checkpoint this often (pull and keras).")
flags.DEFINE_string("data", "", "Training records (.adtr, see antdt-data). Empty: generate "
                    "--generate_records synthetic Criteo-format records into the workdir.")
flags.DEFINE_string("eval_data", "", "Held-out records for the final AUC (with --data).")
flags.DEFINE_integer("generate_records", 200_000, "Records to generate when --data is empty.")
flags.DEFINE_integer("eval_records", 20_000, "Held-out records to generate for the AUC.")
flags.DEFINE_integer("data_seed", DEFAULTS["data_seed"], "Seed of the generated data.")
flags.DEFINE_integer("epochs", DEFAULTS["epochs"], "Epochs over the data.")
flags.DEFINE_integer("batch_size", DEFAULTS["batch_size"], "Records per training step.")
flags.DEFINE_integer("records_per_shard", DEFAULTS["records_per_shard"], "Records per shard.")
flags.DEFINE_boolean("shuffle", DEFAULTS["shuffle"], "Shuffle the shard order of every epoch.")
flags.DEFINE_integer("buckets", DEFAULTS["buckets"], "Hash buckets of each embedding table.")
flags.DEFINE_float("learning_rate", DEFAULTS["learning_rate"], "SGD learning rate.")
flags.DEFINE_string("checkpoint_dir", "", "Shard-boundary checkpoints (default: "
                    "<workdir>/checkpoints).")
flags.DEFINE_integer("checkpoint_every_shards", DEFAULTS["checkpoint_every_shards"],
                     "Checkpoint after this many DONE shards.")
flags.DEFINE_string("report_json", "", "Write the job report here.")
flags.DEFINE_boolean("audit", DEFAULTS["audit"],
                     "Count per record how often it was applied; the report "
                     "gives the records applied 0, 1 and 2+ times.")
flags.DEFINE_multi_string("inject", [], "Fault/straggler injection, repeatable: "
                          "kill:worker:1@30s, kill:ps:0@60s, kill:coordinator@45s, "
                          "kill:master@20s, slow:worker:2:x4@10s[-70s], slow:ps:0:x3@5s.")
flags.DEFINE_string("workdir", "", "Job directory (data, state, logs). Default: a new temp dir.")
flags.DEFINE_boolean("dry_run", False, "Check the whole job (flags, the master's JobSpec "
                     "checks, data, paths, every task's arguments as an agent checks them), "
                     "print what it would run, and exit 0 without starting, creating or "
                     "contacting anything.")
flags.DEFINE_float("timeout_seconds", DEFAULTS["timeout_seconds"],
                   "Give up (exit 1) after this long.")
flags.DEFINE_integer("max_restarts", DEFAULTS["max_restarts"],
                     "Restarts allowed per task before the job fails.")
flags.DEFINE_boolean("progress", True, "Show the live progress line.")
flags.DEFINE_string("policy", DEFAULTS["policy"],
                    "Controller policy: static (static data sharding, "
                    "no action: the baseline), dynamic (dynamic sharding only, no action), "
                    "backup (dynamic sharding + speculative duplicates of slow workers' "
                    "leases: the backup-workers baseline), antdt-nd (non-dedicated clusters), antdt-dd (dedicated "
                    "clusters), or module:Class for your own (see antdt_tf.controller.policy).")
flags.DEFINE_float("controller_interval_seconds", DEFAULTS["controller_interval_seconds"],
                   "How often the policy is asked.")
flags.DEFINE_float("straggler_window_seconds", DEFAULTS["straggler_window_seconds"],
                   "Monitor window (see antdt-master).")
flags.DEFINE_float("straggler_slow_ratio", DEFAULTS["straggler_slow_ratio"],
                   "Monitor: slow = this many times slower than the median worker / the "
                   "fastest PS.")
flags.DEFINE_float("straggler_persistent_after_seconds",
                   DEFAULTS["straggler_persistent_after_seconds"],
                   "Monitor: slow episodes longer than this are persistent (or deterministic).")
flags.DEFINE_float("relaunch_cost_seconds", DEFAULTS["relaunch_cost_seconds"],
                   "Cost model: first estimate of a worker relaunch (replaced by the measured "
                   "time after the first one).")
flags.DEFINE_float("replace_ps_cost_seconds", DEFAULTS["replace_ps_cost_seconds"],
                   "Cost model: first estimate of the pause a PS replacement costs (replaced "
                   "by the measured pause).")
flags.DEFINE_float("min_gain_seconds", DEFAULTS["min_gain_seconds"],
                   "Cost model: act only when the job is expected to finish at least this "
                   "much sooner.")


def master_address() -> str:
    """--master, else (kubernetes) the Service of the master in --namespace."""
    if FLAGS.master or FLAGS.backend != "kubernetes":
        return FLAGS.master
    return f"antdt-master.{FLAGS.namespace}.svc.cluster.local:7470"


def config_from_flags(program_args: tuple = ()) -> Job:
    if FLAGS.num_ps < 1 or FLAGS.num_workers < 1:
        raise app.UsageError("--num_ps and --num_workers must be >= 1")
    if FLAGS.num_hosts < 0:
        raise app.UsageError("--num_hosts must be >= 0")
    if FLAGS.backend == "agents":
        if not FLAGS.master:
            raise app.UsageError("--backend=agents needs --master=HOST:PORT (the running "
                                 "antdt-master the hosts' agents report to)")
    elif FLAGS.backend == "kubernetes":
        if not FLAGS.namespace and not FLAGS.master:
            raise app.UsageError("--backend=kubernetes needs --namespace=NS (where the job's "
                                 "antdt-master runs; deploy/kubernetes/) or --master")
        if not FLAGS.data or not FLAGS.workdir:
            raise app.UsageError("--backend=kubernetes needs --data and --workdir: paths on "
                                 "the job's volume as the master's pod sees them (e.g. "
                                 "/antdt/data/train.adtr, /antdt/jobs/j1)")
    elif FLAGS.master:
        raise app.UsageError("--master goes with --backend=agents or kubernetes (the local "
                             "and ray backends start their own master)")
    if FLAGS.namespace and FLAGS.backend != "kubernetes":
        raise app.UsageError("--namespace goes with --backend=kubernetes")
    if FLAGS.backend == "ray":
        if os.environ.get("RAY_AUTH_MODE", "token") == "token" and not (
                os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
                or os.path.exists(os.path.expanduser("~/.ray/auth_token"))):
            raise app.UsageError("--backend=ray: the Ray cluster's token is not set; export "
                                 "RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) as on the "
                                 "cluster's nodes (docs/ray.md)")
        if FLAGS.task_ports:
            try:
                task_port_range(FLAGS.task_ports)
            except InvalidRequest as e:
                raise app.UsageError(f"--task_ports: {e}") from e
    elif FLAGS.ray_namespace or FLAGS.task_ports:
        raise app.UsageError("--ray_namespace and --task_ports go with --backend=ray")
    try:
        injections = tuple(parse_injection(t, FLAGS.num_ps, FLAGS.num_workers,
                                           FLAGS.max_workers) for t in FLAGS.inject)
    except InvalidRequest as e:
        raise app.UsageError(str(e)) from e
    policy_name, estimator_python = FLAGS.policy, ""
    if FLAGS.api == "estimator":
        estimator_python = FLAGS.estimator_python or str(
            SOURCE_ROOT / ".venv-tf215" / "bin" / "python")
        if not os.access(estimator_python, os.X_OK):
            raise app.UsageError(f"--api=estimator needs TF 2.15's venv: {estimator_python} "
                                 "not found (run: make venv-tf215, or pass "
                                 "--estimator_python)")
    try:
        from antdt_tf.controller import PolicyTraits, load_policy
        from antdt_tf.monitor.straggler import StragglerConfig

        traits = PolicyTraits.of(load_policy(policy_name))
        StragglerConfig(window_seconds=FLAGS.straggler_window_seconds,
                        slow_ratio=FLAGS.straggler_slow_ratio,
                        persistent_after_seconds=FLAGS.straggler_persistent_after_seconds)
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    # Nothing is created before every check passed: a refused job leaves no workdir.
    # Absolute paths: the master that runs the job may have another working directory.
    remote = FLAGS.backend == "kubernetes"    # paths on the cluster's volume, not here
    if remote:
        for flag in ("workdir", "data", "eval_data", "checkpoint_dir"):
            value = getattr(FLAGS, flag)
            if value and not os.path.isabs(value):
                raise app.UsageError(f"--{flag}={value}: --backend=kubernetes takes absolute "
                                     "paths on the job's volume")
    workdir = pathlib.Path(FLAGS.workdir).resolve() if FLAGS.workdir else None
    if workdir is not None and not remote:
        if workdir.exists() and not workdir.is_dir():
            raise app.UsageError(f"--workdir={workdir} exists and is not a directory")
        if (workdir / "master").exists() or (workdir / "checkpoints").exists():
            raise app.UsageError(f"--workdir={workdir} holds a previous job's master state "
                                 "or checkpoints; use a new directory (or delete it)")
    for flag in ("report_json",):     # written here, by the launcher (may be in the workdir)
        path = getattr(FLAGS, flag)
        if path and (problem := exitcodes.output_file_problem(
                path, f"--{flag}", created_dir=str(workdir) if workdir and not remote else "")):
            raise app.UsageError(problem)
    if not remote and FLAGS.checkpoint_dir and pathlib.Path(FLAGS.checkpoint_dir).exists() \
            and not pathlib.Path(FLAGS.checkpoint_dir).is_dir():
        raise app.UsageError(f"--checkpoint_dir={FLAGS.checkpoint_dir} is not a directory")
    program, code_dir, files = "", "", []
    if FLAGS.program:
        from antdt_tf.launcher.program import count_data, resolve_program

        try:
            program, code_dir = resolve_program(FLAGS.program, FLAGS.code_dir, remote)
            if FLAGS.data and not remote:
                files = count_data(FLAGS.data, FLAGS.data_format, code_dir)
        except (InvalidRequest, AntdtError) as e:
            raise app.UsageError(str(e)) from e
        if FLAGS.eval_data:
            raise app.UsageError("--eval_data is for antdt-tf's own trainers; your program "
                                 "evaluates as it likes (its own arguments, after '--')")
    elif FLAGS.code_dir or FLAGS.data_format != "auto":
        raise app.UsageError("--code_dir and --data_format go with --program")
    data, eval_data = (str(pathlib.Path(f).resolve()) if f else "" for f in
                       (FLAGS.data if not files else "", FLAGS.eval_data))
    if files or (FLAGS.program and FLAGS.data):
        pass                      # counted above (or, remote, on the cluster's volume)
    elif data and not remote:     # (the master checks the data when it takes the job)
        from antdt_tf.data.records import RecordFile
        try:
            RecordFile(data)
            if eval_data:
                RecordFile(eval_data)
        except (AntdtError, OSError) as e:
            raise app.UsageError(f"cannot use the data: {e}") from e
    elif FLAGS.generate_records < 1 or FLAGS.eval_records < 0:
        raise app.UsageError("--generate_records must be >= 1 and --eval_records >= 0 (or "
                             "pass --data)")
    fields = {name: getattr(FLAGS, name) for name in DEFAULTS if name in FLAGS}
    cfg = Job(new_spec(**{
        **fields,
        "num_hosts": FLAGS.num_hosts or (1 if FLAGS.backend in ("agents", "ray", "kubernetes")
                                         else FLAGS.num_workers),
        "ray_namespace": (FLAGS.ray_namespace or "(from the workdir)")
        if FLAGS.backend == "ray" else "",
        "task_ports": FLAGS.task_ports, "data": data, "eval_data": eval_data,
        "workdir": workdir or "", "injections": injections, "policy": policy_name,
        "estimator_python": estimator_python, "program": program,
        "program_args": list(program_args), "code_dir": code_dir}))
    cfg = cfg.replace(files=files)
    try:    # what the master would refuse at submission, refused before anything exists
        spec = cfg.replace(
            data=data or ("(generated)" if not program else ""),
            workdir=workdir or pathlib.Path(tempfile.gettempdir()).resolve(),
            files=files or ([("(generated)", 1)] if program else []))
        validate(spec.spec)
        check_traits(spec.spec, traits)     # a user's policy too (the presets: in validate)
    except InvalidRequest as e:
        raise app.UsageError(str(e).replace("JobSpec.", "--")) from e
    if FLAGS.dry_run:     # nothing is created: where the job's files would go
        workdir = workdir or pathlib.Path(tempfile.gettempdir()).resolve() / "antdt-job-NEW"
        if not data and not files:
            data, eval_data = generated_paths(workdir, FLAGS.eval_records)
    else:
        try:
            if workdir is None:
                workdir = pathlib.Path(tempfile.mkdtemp(prefix="antdt-job-")).resolve()
            if not remote:        # the master creates the workdir on the job's volume
                workdir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise app.UsageError(f"--workdir={workdir} cannot be created: {e.strerror}") from e
        if not data and not files:
            print(f"generating {FLAGS.generate_records:,} + {FLAGS.eval_records:,} synthetic "
                  f"records into {workdir / 'data'}", file=sys.stderr)
            data, eval_data = generate_data(workdir, FLAGS.generate_records,
                                            FLAGS.eval_records, FLAGS.data_seed)
            if program:      # the program reads the generated .adtr file as its data
                cfg = cfg.replace(files=[(data, FLAGS.generate_records)])
    ckpt = str(pathlib.Path(FLAGS.checkpoint_dir).resolve()) if FLAGS.checkpoint_dir else str(
        workdir / "checkpoints")
    return cfg.replace(workdir=workdir, data=data, eval_data=eval_data, checkpoint_dir=ckpt,
                       ray_namespace=(FLAGS.ray_namespace or default_namespace(workdir)
                                      if FLAGS.backend == "ray" else ""))


def main(argv):
    if len(argv) > 1 and not FLAGS.program:
        raise app.UsageError(f"unexpected arguments: {argv[1:]} (a program's own "
                             "arguments go with --program, after '--')")
    auth.flag_tls()       # checked before config_from_flags creates the workdir
    cfg = config_from_flags(tuple(argv[1:]))
    if FLAGS.dry_run:
        from antdt_tf.launcher.dry_run import describe

        try:
            generate = (FLAGS.generate_records, FLAGS.eval_records) if not FLAGS.data else None
            print(describe(cfg, generate=generate,
                           report_json=FLAGS.report_json, master=master_address(),
                           ray_address=FLAGS.ray_address))
        except InvalidRequest as e:     # a task's arguments an agent would refuse
            raise app.UsageError(str(e)) from e
        return exitcodes.OK
    where = (f"the hosts registered with {master_address()}" if cfg.agents
             else f"the pods of the master at {master_address()}" if cfg.backend == "kubernetes"
             else f"the nodes of the Ray cluster at {FLAGS.ray_address}" if cfg.ray
             else f"{cfg.num_hosts} simulated host(s)")
    print(f"antdt-launch: {cfg.num_ps} PS, {cfg.num_workers} workers on {where}; "
          f"workdir {cfg.workdir}", file=sys.stderr)
    for inj in cfg.injections:
        print(f"  inject: {inj}", file=sys.stderr)
    try:
        if cfg.agents or cfg.backend == "kubernetes":
            from antdt_tf.launcher.follow import follow

            report = follow(cfg, master_address(), show_progress=FLAGS.progress)
        elif cfg.ray:
            from antdt_tf.launcher.ray_job import run_ray

            report = run_ray(cfg.replace(num_hosts=FLAGS.num_hosts),
                             FLAGS.ray_address, show_progress=FLAGS.progress)
        else:
            from antdt_tf.launcher.follow import run_local

            report = run_local(cfg, secure=FLAGS.local_security,
                               isolate=FLAGS.private_network, show_progress=FLAGS.progress)
    except (RuntimeError, TimeoutError, AntdtError) as e:
        logs = cfg.workdir / ("ray/*/" if cfg.ray else "host*/")
        print(f"antdt-launch: the job failed: {e}\n  logs: {logs}", file=sys.stderr)
        return exitcodes.FAILED
    print(summary_table(report))
    if FLAGS.report_json:
        out = pathlib.Path(FLAGS.report_json)
        out.parent.mkdir(parents=True, exist_ok=True)     # under the workdir (checked)
        out.write_text(json.dumps(report, indent=2))
        print(f"report: {FLAGS.report_json}")
    return 0 if report.get("audit", {}).get("ok", True) else 1


def run():
    exitcodes.run(main, "antdt-launch")


if __name__ == "__main__":
    run()
