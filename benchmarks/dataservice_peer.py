"""The TF-native peer: PSS fed by the tf.data service with ``ShardingPolicy.DYNAMIC``,
side by side with antdt-tf (``antdt-launch --policy=dynamic``) on the same data, model
and cluster (1 PS, 3 workers), with no straggler and with worker 0 slowed 4x by
SIGSTOP/SIGCONT duty cycling. Writes a results table; not a test.

    python -m benchmarks.dataservice_peer --records=100000 --out=benchmarks/results/dataservice_peer.md

``--smoke``: the straggler row only (both jobs, the throttle and the injection) on 20,000
records: checks that the benchmark runs; not a measurement.

The peer gets what TensorFlow ships: its own dispatcher and three tf.data service
workers (separate processes: reading and decoding run there), one shared ``job_name``
(without it every PSS worker gets a job of its own and every record is trained three
times), splits = chunks of 1,024 records read by a seek, and the same DeepFM train step
with the audit counter. What it cannot give: DYNAMIC is at-most-once — a dead PSS
worker's prefetched batches are lost — and its split state is not checkpointable.

Roles of this module (one process each): the orchestrator (default), ``--role=peer``
(the peer's chief), ``--role=dispatcher``, ``--role=dsworker``, ``--role=throttle``.
``benchmarks.scenarios`` runs the peer's chief too (``--num_ps``, ``--inject=slow:...``:
the same slowdowns as antdt-launch's agents inject, timed from the first applied step).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

from absl import app, flags

from benchmarks.results_table import absl_smoke, smoke_argv, write_table

FLAGS = flags.FLAGS
flags.DEFINE_enum("role", "bench", ["bench", "peer", "dispatcher", "dsworker", "throttle"],
                  "This process's role (the orchestrator starts the others).")
flags.DEFINE_integer("records", 100_000, "Records to generate and train (one epoch).")
flags.DEFINE_integer("batch_size", 256, "Records per batch.")
flags.DEFINE_integer("buckets", 1 << 16, "Embedding hash buckets.")
flags.DEFINE_integer("chunk", 1024, "peer: records per tf.data service split.")
flags.DEFINE_float("slow_factor", 4.0, "The straggler's slowdown (worker 0).")
flags.DEFINE_integer("num_ps", 1, "peer: parameter servers.")
flags.DEFINE_multi_string("inject", [], "peer: slowdowns as antdt-launch's --inject "
                          "(slow:worker:2:x4@3s[-9s], slow:ps:0:x3@3s), from training start.")
flags.DEFINE_float("delay", 0.0, "internal (throttle): start after this many seconds.")
flags.DEFINE_float("duration", 0.0, "internal (throttle): stop after this many seconds "
                   "(0: until stopped).")
flags.DEFINE_string("out", "benchmarks/results/dataservice_peer.md", "Results table.")
flags.DEFINE_enum("stragglers", "both", ["both", "none", "only"], "Rows: without the "
                  "straggler, with it, or both.")
flags.DEFINE_string("workdir", "", "Scratch directory (default: a temp dir).")
# internal (set by the orchestrator / the peer's chief)
flags.DEFINE_string("data", "", "internal: the .adtr file.")
flags.DEFINE_string("json", "", "internal: where the peer writes its result.")
flags.DEFINE_integer("port", 0, "internal: this server's port.")
flags.DEFINE_integer("dispatcher_port", 0, "internal: the dispatcher's port.")
flags.DEFINE_integer("pid", 0, "internal: the process to throttle.")

# --smoke: the straggler row (a peer job and an antdt-tf job) on few records
SMOKE = {"records": 20_000, "stragglers": "only"}
absl_smoke(flags, SMOKE)

HOST = "127.0.0.1"


def _child(args: list[str], log: pathlib.Path) -> subprocess.Popen:
    from antdt_tf.procutil import child_env

    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "benchmarks.dataservice_peer", *args],
                                env=child_env(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")),
                                start_new_session=True, stdout=subprocess.DEVNULL, stderr=out)


def _stop(procs) -> None:
    """Our own children only, by process group; resumed first (a throttled one may be
    stopped)."""
    for p in procs:
        if p.poll() is None:
            for sig in (signal.SIGCONT, signal.SIGTERM):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


# ------------------------------------------------------------------ server roles

def serve_dispatcher() -> None:
    import tensorflow as tf

    tf.data.experimental.service.DispatchServer(tf.data.experimental.service.DispatcherConfig(
        port=FLAGS.port, protocol="grpc")).join()


def serve_dsworker() -> None:
    import tensorflow as tf

    svc = tf.data.experimental.service
    svc.WorkerServer(svc.WorkerConfig(
        dispatcher_address=f"{HOST}:{FLAGS.dispatcher_port}",
        worker_address=f"{HOST}:{FLAGS.port}", port=FLAGS.port, protocol="grpc")).join()


def throttle() -> None:
    from antdt_tf.agent.throttle import CpuThrottle

    # its own process: a throttle thread in the chief can deadlock it (the chief holds
    # the GIL while it waits on the stopped worker, so the thread never resumes it)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    if FLAGS.delay > 0 and signal.sigtimedwait({signal.SIGTERM, signal.SIGINT}, FLAGS.delay):
        return
    t = CpuThrottle(FLAGS.pid, FLAGS.slow_factor).start()
    if FLAGS.duration > 0:
        signal.sigtimedwait({signal.SIGTERM, signal.SIGINT}, FLAGS.duration)
    else:
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
    t.stop()


# ------------------------------------------------------------------ the peer's chief

def run_peer() -> None:
    """Starts the tf.data service and the PSS tasks, trains one epoch, writes JSON."""
    import tensorflow as tf

    from antdt_tf.data.metrics import audit_summary
    from antdt_tf.models.deepfm import DeepFM
    from antdt_tf.tf.cluster_spec import make_strategy
    from antdt_tf.tf.local_cluster import LocalCluster, free_ports
    from antdt_tf.tf.reader import decode_records, records_from
    from antdt_tf.tf.variables import full_value

    work = pathlib.Path(FLAGS.json).parent
    n, chunk, batch = FLAGS.records, FLAGS.chunk, FLAGS.batch_size
    dport, *wports = free_ports(4)
    procs = [_child(["--role=dispatcher", f"--port={dport}"], work / "dispatcher.log")]
    procs += [_child(["--role=dsworker", f"--port={p}", f"--dispatcher_port={dport}"],
                     work / f"dsworker{i}.log") for i, p in enumerate(wports)]
    cluster = LocalCluster(num_ps=FLAGS.num_ps, num_workers=3, log_dir=work).start()
    try:
        strategy = make_strategy(cluster.spec)
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            model = DeepFM(buckets=FLAGS.buckets, audit_records=n, learning_rate=0.2)
            # first and last applied step (worker clocks): the training time, comparable
            # to antdt-tf's first-lease -> last-record JCT
            first = tf.Variable(tf.constant(1e18, tf.float64), trainable=False)
            last = tf.Variable(tf.constant(0.0, tf.float64), trainable=False)
        path = FLAGS.data

        def dataset_fn():
            def one_chunk(c):   # a split: one seek, ids from the split (see module doc)
                raw = records_from(path, c * chunk).take(chunk)
                return tf.data.Dataset.zip((raw, tf.data.Dataset.range(c * chunk,
                                                                       (c + 1) * chunk)))
            ds = (tf.data.Dataset.range(-(-n // chunk)).flat_map(one_chunk).batch(batch)
                  .map(lambda raw, ids: (decode_records(raw), ids)))
            return ds.apply(tf.data.experimental.service.distribute(
                processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
                service=f"grpc://{HOST}:{dport}", job_name="antdt_peer", compression=None))

        iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

        @tf.function
        def train(it):
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
            ended = tf.constant(False)
            for _ in tf.range(16):
                optional = it.get_next_as_optional()
                if not optional.has_value():
                    ended = tf.constant(True)
                    break
                features, ids = optional.get_value()
                first.assign(tf.minimum(first.read_value(), tf.timestamp()))
                strategy.run(model.train_step, args=(dict(features), ids))
                last.assign(tf.maximum(last.read_value(), tf.timestamp()))
            return worker, ended

        throttlers = []
        if FLAGS.slow_factor > 1 and not FLAGS.inject:
            throttlers.append(_child(["--role=throttle",
                                      f"--pid={cluster.procs['worker', 0].pid}",
                                      f"--slow_factor={FLAGS.slow_factor}"],
                                     work / "throttle.log"))
        for inj in slowdowns(FLAGS.inject, FLAGS.num_ps):
            throttlers.append(_child([
                "--role=throttle", f"--pid={cluster.procs[inj.job, inj.index].pid}",
                f"--slow_factor={inj.factor}", f"--delay={inj.at}",
                f"--duration={(inj.until - inj.at) if inj.until is not None else 0}"],
                work / f"throttle-{inj.job}{inj.index}.log"))
        t0 = time.monotonic()
        pending, exhausted = [], set()
        for _ in range(6):
            pending.append(coordinator.schedule(train, args=(iterator,)))
        while len(exhausted) < 3:   # every worker's stream ended (fetched on this thread)
            worker, ended = (int(v) for v in pending.pop(0).fetch())
            if ended:
                exhausted.add(worker)
            pending.append(coordinator.schedule(train, args=(iterator,)))
        coordinator.join()
        wall = time.monotonic() - t0
        jct = float(last.numpy() - first.numpy())
        _stop(throttlers)
        audit = audit_summary(full_value(model.applied).numpy(), 1)
        pathlib.Path(FLAGS.json).write_text(json.dumps(
            {"jct_seconds": jct, "wall_seconds": wall, "records_per_second": n / jct,
             "audit": audit}))
    finally:
        cluster.stop()
        _stop(procs)
    os._exit(0)   # ClusterCoordinator's teardown is slow and noisy; the result is written


def slowdowns(texts, num_ps: int):
    """The ``slow:`` injections (antdt-launch's syntax); anything else is refused."""
    from antdt_tf.agent.inject import parse_injection

    out = [parse_injection(t, num_ps, 3) for t in texts]
    bad = [str(i) for i in out if i.kind != "slow"]
    if bad:
        raise app.UsageError(f"the peer takes slow: injections only, not {bad}")
    return out


# ------------------------------------------------------------------ orchestrator

def peer_job(work: pathlib.Path, data: str, slow: float) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    out = work / "peer.json"
    proc = _child(["--role=peer", f"--data={data}", f"--json={out}",
                   f"--records={FLAGS.records}", f"--batch_size={FLAGS.batch_size}",
                   f"--buckets={FLAGS.buckets}", f"--chunk={FLAGS.chunk}",
                   f"--slow_factor={slow}"], work / "peer.log")
    try:
        proc.wait(timeout=900)
    finally:
        _stop([proc])
    if not out.exists():
        raise RuntimeError(f"peer failed; see {work / 'peer.log'}")
    return json.loads(out.read_text())


def antdt_job(work: pathlib.Path, data: str, slow: float) -> dict:
    report = work / "report.json"
    cmd = [sys.executable, "-m", "antdt_tf.launch", "--num_ps=1", "--num_workers=3",
           f"--data={data}", "--eval_data=", f"--batch_size={FLAGS.batch_size}",
           f"--buckets={FLAGS.buckets}", "--records_per_shard=1024", "--audit",
           "--policy=dynamic", "--progress=false", f"--workdir={work}",
           f"--report_json={report}", "--timeout_seconds=900"]
    if slow > 1:
        cmd.append(f"--inject=slow:worker:0:x{slow:g}@0s")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if out.returncode != 0 or not report.exists():
        raise RuntimeError(f"antdt job failed:\n{out.stderr[-3000:]}")
    return json.loads(report.read_text())


def bench() -> None:
    import tempfile

    from antdt_tf.data import criteo, records

    work = pathlib.Path(FLAGS.workdir or tempfile.mkdtemp(prefix="antdt-peer-"))
    data = work / "train.adtr"
    work.mkdir(parents=True, exist_ok=True)
    records.write_records(data, criteo.generate(criteo.SyntheticSpec(FLAGS.records, seed=3)))
    rows = []
    slows = {"both": (1.0, FLAGS.slow_factor), "none": (1.0,),
             "only": (FLAGS.slow_factor,)}[FLAGS.stragglers]
    for slow in slows:
        label = "none" if slow == 1 else f"worker 0 x{slow:g}"
        peer = peer_job(work / f"peer-{slow:g}", str(data), slow)
        ours = antdt_job(work / f"antdt-{slow:g}", str(data), slow)
        rows.append((label, peer, ours))
        print(label, "peer", round(peer["jct_seconds"], 1), "antdt",
              round(ours["jct_seconds"], 1), file=sys.stderr)
    lines = [f"# tf.data service (DYNAMIC) vs antdt-tf: {FLAGS.records:,} records, 1 PS, "
             f"3 workers, batch {FLAGS.batch_size}", "",
             "| straggler | peer JCT (s) | antdt-tf JCT (s) | peer / antdt | peer audit 0/1/2+ "
             "| antdt audit 0/1/2+ |", "|---|---|---|---|---|---|"]
    for label, peer, ours in rows:
        pa, oa = peer["audit"], ours["audit"]
        lines.append(
            f"| {label} | {peer['jct_seconds']:.1f} | {ours['jct_seconds']:.1f} | "
            f"{peer['jct_seconds'] / ours['jct_seconds']:.2f} | "
            f"{pa['applied_0']}/{pa['applied_1']}/{pa['applied_2plus']} | "
            f"{oa['applied_0']}/{oa['applied_1']}/{oa['applied_2plus']} |")
    lines += ["", "JCT: training time. peer: first batch applied -> last batch applied "
              "(worker clocks; tracing and starting the service job not counted); "
              "antdt-tf: first shard leased -> every record applied (the master's clock)."]
    write_table(FLAGS.out, lines, smoke=FLAGS.smoke)


def main(argv):
    del argv
    {"bench": bench, "peer": run_peer, "dispatcher": serve_dispatcher,
     "dsworker": serve_dsworker, "throttle": throttle}[FLAGS.role]()


if __name__ == "__main__":
    app.run(main, argv=smoke_argv(sys.argv, SMOKE))
