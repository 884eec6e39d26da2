"""One run of one setup of ``compare_pss``: start its processes (1 PS + 3 workers and
what the setup adds), slow worker 2 if the run has the straggler, sample CPU by role
while it trains, and return what it measured:

``{"jct", "records", "ideal", "rates", "records_per_worker", "coord_cpu", "cpu", "audit"}``
(JCT, ideal JCT and the rest as docs/benchmarks.md defines them). ``SETUPS`` maps a
setup's letter to its name and its run function.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

from antdt_tf.procutil import kill_group
from benchmarks.procs import child_env
from benchmarks.pss.cpu import CpuByRole, process_tree, sample_while
from benchmarks.pss.handshake import touch

NUM_WORKERS = 3


def model_flags(args) -> list[str]:
    """The flags a task process gets from the driver's: the data and the model."""
    return [f"--data={args.data}", f"--records={args.records}", f"--batch_size={args.batch_size}",
            f"--buckets={args.buckets}", f"--learning_rate={args.learning_rate}",
            f"--shuffle_buffer={args.shuffle_buffer}"]


def _task(cmd: list[str], log_path: pathlib.Path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(cmd, env=child_env(), start_new_session=True,
                                stdout=log, stderr=log)


def _wait_all(paths, procs, timeout=300.0, need=all) -> None:
    """Until ``need`` (``all``, or ``any``) of ``paths`` exist; a process of ``procs``
    that failed first raises."""
    deadline = time.monotonic() + timeout
    while not need(p.exists() for p in paths):
        for p in procs:
            if p.poll() is not None and p.returncode != 0:
                raise RuntimeError(f"a process exited {p.returncode} before it was ready "
                                   f"({' '.join(p.args[:4])}...)")
        if time.monotonic() > deadline:
            raise TimeoutError(f"not ready within {timeout}s: {[str(p) for p in paths]}")
        time.sleep(0.01)


def _ideal(total: int, per_worker_records, busy) -> tuple[float, list[float]]:
    """(ideal JCT, per-worker rates): records / the sum of the workers' rates."""
    rates = [r / t if t > 0 else 0.0 for r, t in zip(per_worker_records, busy)]
    return total / sum(rates), rates


def run_vanilla(work: pathlib.Path, args, straggler: bool, static_thirds: bool = False,
                role: str = "vanilla_chief") -> dict:
    """Setups (a), (s) (``static_thirds``) and (v) (``role="keras_chief"``): a
    ``LocalCluster`` and a chief process of ``chiefs``."""
    import psutil

    from antdt_tf.agent.throttle import CpuThrottle
    from antdt_tf.tf.local_cluster import LocalCluster

    sync = work / "sync"
    sync.mkdir(parents=True)
    result = work / "chief.json"
    with LocalCluster(num_ps=1, num_workers=NUM_WORKERS, log_dir=work) as cluster:
        chief = _task([sys.executable, "-m", "benchmarks.compare_pss", f"--role={role}",
                       f"--cluster={cluster.spec_json}", f"--sync_dir={sync}",
                       f"--result={result}", *model_flags(args)]
                      + (["--static_thirds"] if static_thirds else []), work / "chief.log")
        throttle = None
        try:
            _wait_all([sync / "ready_chief"], [chief])
            if straggler:
                throttle = CpuThrottle(cluster.procs["worker", 2].pid, args.slowdown).start()
            tasks = [psutil.Process(p.pid) for p in cluster.procs.values()]
            cpu = CpuByRole()
            cpu.sample(process_tree(chief.pid, tasks))
            touch(sync / "go")
            sample_while(cpu, lambda: process_tree(chief.pid, tasks),
                         lambda: chief.poll() is None, "the chief")
        finally:
            if throttle is not None:
                throttle.stop()
            kill_group(chief)
    if chief.returncode != 0:
        raise RuntimeError(f"vanilla chief exited {chief.returncode}; see {work / 'chief.log'}")
    r = json.loads(result.read_text())
    jct = r["t_end"] - r["t_go"]
    busy = [max(t - r["t_go"], 0.0) for t in r["last_step_time"]]
    total = sum(r["records_per_worker"])
    ideal, rates = _ideal(total, r["records_per_worker"], busy)
    return {"jct": jct, "records": total, "ideal": ideal, "rates": rates,
            "records_per_worker": r["records_per_worker"], "coord_cpu": r["coordinator_cpu"],
            "cpu": cpu.between(r["t_go"], r["t_end"]), "audit": r["audit"]}


def run_tf1(work: pathlib.Path, args, straggler: bool, tf1_model: bool = False,
            as_job: bool = False) -> dict:
    """Setups (b), (t) (``tf1_model``) and (u) (``as_job`` too): one PS and three
    processes of ``tf1_worker``."""
    import psutil

    from antdt_tf.agent.throttle import CpuThrottle
    from antdt_tf.tf.local_cluster import LocalCluster, free_ports

    sync = work / "sync"
    sync.mkdir(parents=True)
    cluster = LocalCluster(num_ps=1, num_workers=0, log_dir=work)
    ports = free_ports(NUM_WORKERS)
    cluster.spec = {"ps": cluster.spec["ps"], "worker": [f"127.0.0.1:{p}" for p in ports]}
    workers: list[subprocess.Popen] = []
    throttle = None
    try:
        cluster.start_task("ps", 0)
        for i in range(NUM_WORKERS):
            cmd = [sys.executable, "-m", "benchmarks.compare_pss", "--role=tf1_worker",
                   f"--index={i}", f"--cluster={cluster.spec_json}", f"--sync_dir={sync}",
                   f"--result={work / f'worker{i}.json'}", *model_flags(args)]
            if tf1_model:
                cmd.append("--tf1_model")
            if as_job:
                cmd.append("--as_job")
            workers.append(_task(cmd, work / f"tf1_worker{i}.log"))
        procs = [psutil.Process(x.pid) for x in [cluster.procs["ps", 0], *workers]]
        cpu = CpuByRole()
        # (u) has no common start: training starts with the first worker's session, and
        # the straggler is slowed from then on, as (m)'s @0s injection starts at the first
        # leased shard (not while the worker imports TensorFlow)
        _wait_all([sync / f"ready_{i}" for i in range(NUM_WORKERS)], workers,
                  need=any if as_job else all)
        if straggler:
            throttle = CpuThrottle(workers[2].pid, args.slowdown).start()
        cpu.sample(procs)
        t_go = time.time()
        if not as_job:
            touch(sync / "go")
        sample_while(cpu, lambda: procs, lambda: any(w.poll() is None for w in workers),
                     "the TF1 workers")
    finally:
        if throttle is not None:
            throttle.stop()
        for w in workers:
            kill_group(w)
        cluster.stop()
    bad = [i for i, w in enumerate(workers) if w.returncode != 0]
    if bad:
        raise RuntimeError(f"TF1 workers {bad} failed; see {work}/tf1_worker*.log")
    rs = [json.loads((work / f"worker{i}.json").read_text()) for i in range(NUM_WORKERS)]
    if as_job:   # from the first step of any worker: each one's t_go is its first step
        t_go = min(r["t_go"] for r in rs)
        busy = [r["t_end"] - r["t_go"] for r in rs]
    else:
        busy = [r["t_end"] - t_go for r in rs]
    jct = max(r["t_end"] for r in rs) - t_go
    per = [r["records"] for r in rs]
    ideal, rates = _ideal(sum(per), per, busy)
    return {"jct": jct, "records": sum(per), "ideal": ideal, "rates": rates,
            "records_per_worker": per, "coord_cpu": rs[0]["cpu"],
            "cpu": cpu.between(t_go, t_go + jct),
            "audit": rs[0]["audit"]}


def run_antdt(work: pathlib.Path, args, straggler: bool, checkpoint_every: float = 10.0,
              api: str = "custom_loop") -> dict:
    """Setups (c), (c') (``checkpoint_every=0``), (m) (``api="mts"``) and (k)
    (``api="keras"``): a whole ``antdt-launch`` job."""
    report = work / "report.json"
    cmd = [sys.executable, "-m", "antdt_tf.launch", "--num_ps=1", f"--num_workers={NUM_WORKERS}",
           f"--data={args.data}", "--eval_data=", f"--records_per_shard={args.records_per_shard}",
           f"--batch_size={args.batch_size}", f"--buckets={args.buckets}",
           f"--learning_rate={args.learning_rate}", "--audit", f"--report_json={report}",
           f"--workdir={work / 'job'}", "--noprogress",
           f"--checkpoint_every_seconds={checkpoint_every}", f"--api={api}"]
    if straggler:
        cmd.append(f"--inject=slow:worker:2:x{args.slowdown:g}@0s")
    launcher = _task(cmd, work / "launch.log")
    # The job runs in a network namespace of its own (--private_network) with a token:
    # the master is not reachable from here. Everything comes from its report; the CPU
    # of every process of the job is sampled from outside (same PID namespace).
    cpu = CpuByRole()
    try:
        sample_while(cpu, lambda: process_tree(launcher.pid), lambda: launcher.poll() is None,
                     "antdt-launch")
    finally:
        kill_group(launcher)
    if launcher.returncode != 0:
        raise RuntimeError(f"antdt-launch exited {launcher.returncode}; see {work / 'launch.log'}")
    r = json.loads(report.read_text())
    jct = r["jct_seconds"]
    per = r["records_per_worker"]
    last_steps = r["coordinator"].get("worker_last_step_unix") or []
    last_change = [0.0] * NUM_WORKERS   # unknown (Keras, TF1): busy the whole JCT
    if last_steps and r.get("train_started_unix"):
        # each worker's own clock at its last step (a PS variable the step updates)
        last_change = [t - r["train_started_unix"] if t > 0 else 0.0 for t in last_steps]
    busy = [min(t, jct) if t > 0 else jct for t in last_change]
    skew = float("nan")
    if api == "mts":
        # each TF1 worker's own first and last step (its report: the chief's in the
        # launcher's, the others' in their logs): busy from its first step on, as (b)'s
        steps = _tf1_step_spans(work / "job", r["coordinator"])
        if len(steps) == NUM_WORKERS:
            busy = [last - first for first, last in steps]
            skew = max(first for first, _ in steps) - min(first for first, _ in steps)
    t0 = r.get("train_started_unix") or 0.0
    by_role = cpu.between(t0, t0 + jct) if t0 else {}
    ideal, rates = _ideal(sum(per), per, busy)
    audit = {k: r["audit"][k] for k in ("applied_0", "applied_1", "applied_2plus")}
    return {"jct": jct, "records": sum(per), "ideal": ideal, "rates": rates,
            "records_per_worker": per, "cpu": by_role,
            "coord_cpu": by_role.get("chief", float("nan")) if api != "mts" else float("nan"),
            "audit": audit, "start_skew": skew}


def _tf1_step_spans(job: pathlib.Path, chief: dict) -> list:
    """``[(first_step_unix, last_step_unix)]`` of TF1 workers 0, 1, ...: worker 0's from
    the chief's report, the others' from the JSON report each prints as its last line."""
    spans = {0: (chief.get("first_step_unix"), chief.get("last_step_unix"))}
    for path in job.glob("host*/worker*.log"):
        for line in reversed(path.read_text(errors="replace").splitlines()):
            if line.startswith('{"worker"'):
                rep = json.loads(line)
                spans[rep["worker"]] = (rep.get("first_step_unix"), rep.get("last_step_unix"))
                break
    out = [spans.get(i, (None, None)) for i in range(NUM_WORKERS)]
    return out if all(a and b for a, b in out) else []


SETUPS = {"a": ("(a) vanilla TF2 PSS", run_vanilla),
          "b": ("(b) TF1 static thirds", run_tf1),
          # (b)'s platform with the TF1 model (m) trains (get_variable, a v1 optimizer's
          # minimize): (m) vs (t) is what antdt-tf adds to a TF1 job
          "t": ("(t) TF1 static thirds, (m)'s model", lambda work, args, straggler: run_tf1(
              work, args, straggler, tf1_model=True)),
          # (t) started and checkpointed as (m)'s job is, timed over the same window
          "u": ("(u) (t) run as a job: ckpts, no common start", lambda work, args, straggler:
                run_tf1(work, args, straggler, tf1_model=True, as_job=True)),
          "c": ("(c) antdt-tf", run_antdt),
          # antdt-tf's TF1 path: the same master and sharding, MonitoredTrainingSession
          # workers with the antdt SessionRunHooks (no ParameterServerStrategy)
          "m": ("(m) antdt-tf, TF1 MTS hooks", lambda work, args, straggler: run_antdt(
              work, args, straggler, api="mts")),
          # antdt-tf's Keras path: tf-keras model.fit + ShardingCallback (one step per
          # closure, sparse reports)
          "k": ("(k) antdt-tf, Keras model.fit", lambda work, args, straggler: run_antdt(
              work, args, straggler, api="keras")),
          # diagnosis: what ParameterServerStrategy itself costs — (c)'s closure loop
          # (16 steps per closure, the same step) on static thirds, no master, no reports
          "s": ("(s) TF2 PSS static thirds", lambda work, args, straggler: run_vanilla(
              work, args, straggler, static_thirds=True)),
          # diagnosis: what tf-keras model.fit itself costs under PSS (no antdt-tf)
          "v": ("(v) bare tf-keras fit", lambda work, args, straggler: run_vanilla(
              work, args, straggler, role="keras_chief")),
          # diagnosis: (c) without its periodic checkpoints, which drain every closure in
          # flight (so the fast workers wait for the straggler's current closure)
          "d": ("(c') antdt-tf, no periodic ckpt",
                lambda work, args, straggler: run_antdt(work, args, straggler, checkpoint_every=0))}
