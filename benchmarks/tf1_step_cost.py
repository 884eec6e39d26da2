"""What one TF1 training step of antdt-tf's hooks path costs, part by part.

Usage::

    python -m benchmarks.tf1_step_cost [--rounds=6] [--out=benchmarks/results/tf1_step_cost.md]
        [--smoke]

``--smoke``: one run of 20 measured steps, no warm-up steps, of every variant but ``feed``
(the probe ``counter`` too): checks that the benchmark runs; not a measurement.

Setup (m) of ``compare_pss`` against (b) takes the whole job apart: here one PS
(``antdt-tf-server``), one master (``antdt_tf.master``) and one TF1 between-graph worker
process at a time (its own ``tf.distribute.Server``, ``replica_device_setter``, an async
``MonitoredTrainingSession``, worker 0 = the chief), on a generated record file. Each run
builds one variant, trains ``--warmup`` steps, then measures ``--steps`` steps: CPU of
the worker, the PS and the master (psutil, user + sys) and wall time. Runs are
interleaved (A B C ..., ... C B A) so that the machine's drift hits every variant alike.

Variants (each adds one part to the one before, except ``b``):

``b``          (b)'s graph in ``compare_pss``: DeepFM's math written as graph ops on a
               static slice of the file (seek, batch, decode in the step).
``model``      the TF1 model a user writes (``estimator_examples.deepfm_tf1``:
               ``get_variable``, ``GradientDescentOptimizer.minimize``, the audit
               counter after the update) on the same static slice: what the model costs.
``feed_noprefetch`` ``feed`` with ``prefetch_batches=0``: what the read-ahead costs.
``feed``       that model on ``ShardFeed.input_fn`` (leases from the master through
               TF's RPC ops inside ``tf.data``, prefetch, the refused-lease filter); the
               step runs the train op only: no lease record, no hooks (a probe: its
               leases are never reported).
``meta``       ``feed`` plus the lease metadata fetched with every step (one vector).
``counter``    ``meta`` plus a constant ``scatter_add`` into a variable on the PS (a
               probe, not a design: a PS-local write with no tensor from the worker,
               what a record kept as a step counter on the PS would cost a step).
``record``     ``meta`` plus the lease record's update on the PS: what the report hook
               fetches with every step, without the hook.
``hooks``      ``ShardFeed.hooks()`` in the session (report hook, chief's restore and
               settle hooks): what ``compare_pss``'s (m) runs per step on a worker.
``chief``      ``hooks`` plus the chief's checkpoint hook (``ShardFeed.chief_hooks``,
               ``MonitoredTrainingSession(checkpoint_dir=...)``; no save while measured):
               what (m)'s chief runs per step.

Differences between rows are what a part costs: ``model - b`` the model as written,
``feed - model`` the pipeline, ``meta - feed`` the fetch, ``record - meta`` the PS
record (``record - counter``: of it, the worker's tensor sent to the PS), ``hooks -
record`` the hooks' Python and reports, ``chief - hooks`` the chief's checkpoint hook
(``counter`` is off the chain: ``hooks`` builds on ``record``).
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import subprocess
import sys

from benchmarks import step_cost_harness as harness
from antdt_tf.procutil import kill_group
from benchmarks.procs import child_env
from benchmarks.results_table import argparse_smoke, non_default_flags

VARIANTS = ("b", "model", "feed_noprefetch", "feed", "meta", "counter", "record", "hooks", "chief")
PARTS = ("worker", "ps", "master")
# the run's flags a results file's reproduce line names when they differ from these
# (the probe ``counter`` runs only when named: ``--variants=meta,counter,record``)
REPRODUCE_DEFAULTS = {"records_per_shard": 2048, "batch_size": 256,
                      "variants": ",".join(v for v in VARIANTS if v != "counter"),
                      "warmup": 40}
# --smoke: every code path once, a few steps: every variant but ``feed`` (``feed_noprefetch``
# builds the same graph, and ``meta`` on builds it with the prefetch)
SMOKE = {"rounds": 1, "steps": 20, "warmup": 0,
         "variants": ",".join(v for v in VARIANTS if v != "feed")}


def worker(args) -> None:
    """One run: build the variant, warm up, measure, write the result, exit."""
    import psutil
    import tensorflow as tf

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    from antdt_tf.estimator import ShardFeed
    from antdt_tf.estimator.feed import META_COLLECTION, RECORD_COLLECTION
    from antdt_tf.sharding.client import ShardingClient
    from antdt_tf.sharding.plan import DataFile, DatasetSpec
    from benchmarks.pss.tf1_worker import tf1_static_graph
    from estimator_examples.deepfm_tf1 import deepfm_train_op

    spec = json.loads(args.cluster)
    cluster = tf.train.ClusterSpec(spec)
    device = "/job:worker/task:0"
    config = v1.ConfigProto(device_filters=["/job:ps", device])
    server = tf.distribute.Server(cluster, job_name="worker", task_index=0, config=config)
    variant, hooks, feed = args.variant, [], None
    if variant in ("feed_noprefetch", "feed", "meta", "counter", "record", "hooks", "chief"):
        with ShardingClient(args.master) as admin:
            admin.register_dataset(DatasetSpec(args.dataset, records_per_shard=args.records_per_shard,
                                               files=(DataFile(args.data, args.records),)))
        feed = ShardFeed(args.master, args.dataset, args.batch_size, worker=0,
                         worker_device=device, sparse_reports=True,
                         prefetch_batches=0 if variant == "feed_noprefetch" else 2)
    with v1.device(v1.train.replica_device_setter(cluster=cluster, worker_device=device)):
        if variant == "b":
            train_op, _, _ = tf1_static_graph(tf, args, 0, 1)
        else:
            if feed is None:
                from antdt_tf.tf.reader import decode_records, records_from

                ds = tf.data.Dataset.zip((records_from(args.data, 0).take(args.records),
                                          tf.data.Dataset.range(args.records)))
                raw, ids = v1.data.make_one_shot_iterator(ds.batch(args.batch_size)).get_next()
                features = decode_records(raw)
                labels = features.pop("label")
                features["record_id"] = ids
            else:
                features, labels = feed.input_fn()
            _, train_op = deepfm_train_op(features, labels, 1, args.buckets, args.learning_rate,
                                          args.records)
    fetches = train_op
    if variant == "meta":
        fetches = [train_op, v1.get_collection(META_COLLECTION)]
    if variant == "counter":
        with v1.device("/job:ps/task:0"):
            counter = v1.get_variable("probe_counter", shape=[64], dtype=tf.int64,
                                      initializer=v1.zeros_initializer(), trainable=False,
                                      use_resource=True)
            bump = counter.scatter_add(tf.IndexedSlices(tf.constant([1], tf.int64),
                                                        tf.constant([0], tf.int64)))
        fetches = [train_op, v1.get_collection(META_COLLECTION), bump.op]
    if variant == "record":
        fetches = [train_op, v1.get_collection(META_COLLECTION),
                   v1.get_collection(RECORD_COLLECTION)[1]]
    checkpoint_dir, chief_hooks = None, []
    if variant in ("hooks", "chief"):
        hooks = feed.hooks()
    if variant == "chief":
        checkpoint_dir = args.result + ".ckpt"
        chief_hooks = feed.chief_hooks(checkpoint_dir, save_secs=3600)
    sess = v1.train.MonitoredTrainingSession(
        master=server.target, is_chief=True, config=config, checkpoint_dir=checkpoint_dir,
        save_checkpoint_secs=None, save_checkpoint_steps=None, save_summaries_steps=None,
        save_summaries_secs=None, log_step_count_steps=None, hooks=hooks,
        chief_only_hooks=chief_hooks)
    measure = harness.cpu_clock({"worker": psutil.Process(), "ps": psutil.Process(args.ps_pid),
                                 "master": psutil.Process(args.master_pid)})

    def steps(n):
        for _ in range(n):
            sess.run(fetches)

    steps(args.warmup)
    result = measure(lambda: steps(args.steps))
    pathlib.Path(args.result).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)   # no orderly session close: the next run starts at once


def main() -> None:
    ap = harness.parser(__doc__, "benchmarks/results/tf1_step_cost.md", rounds=6,
                        rounds_help="runs per variant", warmup=REPRODUCE_DEFAULTS["warmup"],
                        warmup_help="unmeasured steps per run",
                        batch_size=REPRODUCE_DEFAULTS["batch_size"],
                        records_per_shard=REPRODUCE_DEFAULTS["records_per_shard"])
    ap.add_argument("--steps", type=int, default=300, help="measured steps per run")
    ap.add_argument("--learning_rate", type=float, default=0.2)
    ap.add_argument("--variants", default=REPRODUCE_DEFAULTS["variants"])
    # internal: one run
    ap.add_argument("--role", default="driver", choices=["driver", "worker"])
    ap.add_argument("--variant", default="")
    ap.add_argument("--cluster", default="")
    ap.add_argument("--master", default="")
    ap.add_argument("--dataset", default="")
    ap.add_argument("--data", default="")
    ap.add_argument("--records", type=int, default=0)
    ap.add_argument("--ps_pid", type=int, default=0)
    ap.add_argument("--master_pid", type=int, default=0)
    ap.add_argument("--result", default="")
    args = argparse_smoke(ap, SMOKE)
    if args.role == "worker":
        return worker(args)
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")

    # a run's steps and its warm-up, a batch to spare, whole shards
    per_run = (args.steps + args.warmup + 1) * args.batch_size
    num_records = -(-per_run // args.records_per_shard) * args.records_per_shard
    with harness.job("antdt-tf1-step-cost-", num_records, own_worker=True) as job:
        runs = itertools.count(1)

        def run(v):
            """One run of variant ``v``: a worker process of its own (``worker``)."""
            n = next(runs)
            result = job.work / f"run{n}.json"
            cmd = [sys.executable, "-m", "benchmarks.tf1_step_cost", "--role=worker",
                   f"--variant={v}", f"--cluster={json.dumps(job.cluster.spec)}",
                   f"--master={job.address}", f"--dataset=run{n}", f"--data={job.data}",
                   f"--records={num_records}", f"--ps_pid={job.cluster.procs['ps', 0].pid}",
                   f"--master_pid={job.master.pid}", f"--result={result}",
                   f"--steps={args.steps}", f"--warmup={args.warmup}",
                   f"--batch_size={args.batch_size}", f"--buckets={args.buckets}",
                   f"--learning_rate={args.learning_rate}",
                   f"--records_per_shard={args.records_per_shard}"]
            with open(job.work / f"run{n}.log", "wb") as log:
                proc = subprocess.Popen(cmd, env=child_env(), start_new_session=True,
                                        stdout=log, stderr=log)
            try:
                proc.wait(timeout=600)
            finally:
                kill_group(proc)
            if proc.returncode != 0 or not result.exists():
                raise RuntimeError(f"run {n} ({v}) exited {proc.returncode}; see "
                                   f"{job.work / f'run{n}.log'}")
            return json.loads(result.read_text())

        rows = harness.interleaved(variants, args.rounds, run, show_variant=True)
    _write(args, rows)


def _write(args, rows: dict) -> None:
    def notes(mean, total):
        steps = [v for v in VARIANTS if v in rows]
        lines = []
        for a, b in zip(steps, steps[1:]):
            d = total(b) - total(a)
            lines.append(f"- {b} - {a}: {d:+.2f} ms of CPU per step (worker "
                         f"{mean(b, 'worker') - mean(a, 'worker'):+.2f}, PS "
                         f"{mean(b, 'ps') - mean(a, 'ps'):+.2f}, master "
                         f"{mean(b, 'master') - mean(a, 'master'):+.2f})")
        if "b" in rows and "hooks" in rows:
            lines.append(f"- hooks / b: {total('hooks') / total('b'):.2f}x the CPU per step")
        return lines

    harness.write_results(
        args, harness.heading(
            "CPU per TF1 training step, part by part",
            f"1 PS + 1 TF1 worker (chief) + master, DeepFM {args.buckets:,} buckets, batch "
            f"{args.batch_size}, shards of {args.records_per_shard:,}; {args.rounds} "
            f"interleaved runs per variant of {args.steps} measured steps, means"),
        rows, PARTS, args.steps, notes,
        f"Reproduce: `python -m benchmarks.tf1_step_cost --rounds={args.rounds} "
        f"--steps={args.steps}{non_default_flags(args, REPRODUCE_DEFAULTS)} --out={args.out}`.")


if __name__ == "__main__":
    main()
