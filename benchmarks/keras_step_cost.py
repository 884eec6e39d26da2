"""What one ``model.fit`` step of antdt-tf's Keras path costs, part by part (CPU per step,
per process), beside the same step without antdt-tf.

Usage::

    python -m benchmarks.keras_step_cost [--rounds=16] [--out=benchmarks/results/keras_step_cost.md]
        [--smoke]

``--smoke``: one closure per variant, no warm-up closures (tracing is in the measured
one): checks that the benchmark runs; not a measurement.

One real job on this machine: a master (``antdt_tf.master``), 1 PS and 1 worker
(``antdt-tf-server``) and this process as the chief, the Keras DeepFM (SGD, binary
cross-entropy) compiled with ``--steps_per_execution``. Variants are ``model.fit``'s own
train function (``make_train_function``, scheduled on the ClusterCoordinator as ``fit``
does), one closure of ``steps_per_execution`` steps at a time, **interleaved** (A B C D,
D C B A, ...) so that the machine's drift hits them alike:

``local``  the model's own ``train_step`` on a local ``tf.data`` pipeline of the same
           file (``shuffle().repeat().batch().map(decode).prefetch(2)``: bare
           tf-keras, setup (v) of ``compare_pss``).
``pulled`` the model's own ``train_step`` on :func:`antdt_tf.tf.keras.dataset_creator`'s
           pipeline (shards pulled from the master; ``record_id``/``antdt`` dropped):
           what the pull pipeline costs against ``local``.
``antdt``  :meth:`ShardingCallback.attach`'s step on the same pipeline (sparse reports,
           as ``antdt-keras-trainer`` runs): refused-lease skip, the PS record, the
           time accumulator, a report per lease.
``audit``  ``antdt`` with the audit counters (``--audit``: what the tests and
           ``compare_pss`` run).

Differences between rows are what a part costs. Per closure the CPU time of the worker,
PS, master and chief processes (psutil, 10 ms ticks: means over ``--rounds`` closures)
and the wall time.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import sys
import tempfile
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"   # before TensorFlow: tf.keras = tf-keras

PARTS = ("worker", "ps", "master", "chief")
VARIANTS = ("local", "pulled", "antdt", "audit")
# --smoke: every variant, one closure each, no warm-up
SMOKE = {"rounds": 1, "warmup": 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=16, help="closures per variant")
    ap.add_argument("--warmup", type=int, default=2,
                    help="unmeasured closures per variant first (tracing, first run)")
    ap.add_argument("--batch_size", type=int, default=256)
    ap.add_argument("--steps_per_execution", type=int, default=16)
    ap.add_argument("--buckets", type=int, default=1 << 16)
    ap.add_argument("--records_per_shard", type=int, default=2048)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated subset of " + ", ".join(VARIANTS))
    ap.add_argument("--out", default="benchmarks/results/keras_step_cost.md")
    from benchmarks.results_table import argparse_smoke

    args = argparse_smoke(ap, SMOKE)
    args.variants = tuple(v for v in VARIANTS if v in args.variants.split(","))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import psutil

    from antdt_tf.data import criteo, records
    from antdt_tf.procutil import start_master
    from antdt_tf.sharding.client import ShardingClient
    from antdt_tf.sharding.plan import DataFile, DatasetSpec
    from antdt_tf.tf.local_cluster import LocalCluster

    per_closure = args.steps_per_execution * args.batch_size
    # every pulling variant's closures plus its warm-up closures, and shards to spare
    num_records = (args.rounds + args.warmup) * 3 * per_closure + 8 * args.records_per_shard
    work = pathlib.Path(tempfile.mkdtemp(prefix="antdt-keras-step-cost-"))
    data = str(work / "train.adtr")
    records.write_records(data, criteo.generate(criteo.SyntheticSpec(num_records, seed=1)))
    master, address = start_master(work)
    try:
        with ShardingClient(address, timeout=30) as admin:
            admin.register_dataset(DatasetSpec("train", records_per_shard=args.records_per_shard,
                                               files=(DataFile(data, num_records),)))
            with LocalCluster(num_ps=1, num_workers=1, log_dir=work) as cluster:
                rows = _measure(args, address, data, num_records, cluster, master, psutil)
    finally:
        os.killpg(master.pid, signal.SIGKILL)
        master.wait()
    _write(args, rows, num_records)
    sys.stdout.flush()
    os._exit(0)   # TF's remote-function threads may crash an orderly interpreter exit


def _measure(args, address, data, num_records, cluster, master, psutil) -> dict:
    import tensorflow as tf

    from antdt_tf.models.keras_deepfm import build_keras_deepfm
    from antdt_tf.tf import keras as antdt_keras
    from antdt_tf.tf.cluster_spec import make_strategy
    from antdt_tf.tf import tf_internals
    from antdt_tf.tf.reader import decode_records

    keras = tf.keras
    spe, b = args.steps_per_execution, args.batch_size
    strategy = make_strategy(cluster.spec)
    with strategy.scope():
        model = build_keras_deepfm(args.buckets)
        model.compile(optimizer=keras.optimizers.SGD(0.2),
                      loss=keras.losses.BinaryCrossentropy(), steps_per_execution=spe)
    # fit() makes this (one per strategy) and its train function schedules on it
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    tf_internals.set_keras_coordinator(model, coordinator)
    own_step = model.train_step

    def local_fn(_context):
        raw = tf.data.TFRecordDataset(data).skip(1)   # record 0 is the .adtr header

        def to_keras(r):
            batch = decode_records(r)
            return {"dense": batch["dense"], "sparse": batch["sparse"]}, batch["label"]
        return raw.shuffle(10_000).repeat().batch(b).map(to_keras).prefetch(2)

    pulled = antdt_keras.dataset_creator(address, "train", b, sparse_reports=True,
                                         steps_per_execution=spe)

    def per_worker(fn):
        return iter(coordinator.create_per_worker_dataset(
            lambda: strategy.distribute_datasets_from_function(fn)))

    local_it, pulled_it = per_worker(local_fn), per_worker(pulled)
    iterators = {"local": local_it, "pulled": pulled_it, "antdt": pulled_it,
                 "audit": pulled_it}
    procs = {"worker": psutil.Process(cluster.procs["worker", 0].pid),
             "ps": psutil.Process(cluster.procs["ps", 0].pid),
             "master": psutil.Process(master.pid), "chief": psutil.Process()}

    def cpu():
        return {k: sum(p.cpu_times()[:2]) for k, p in procs.items()}

    def plain_step(data):   # the model's own step; the pipeline's two entries dropped
        x, y, w = keras.utils.unpack_x_y_sample_weight(data)
        x = {k: v for k, v in x.items() if k not in ("antdt", "record_id")}
        return own_step((x, y, w))

    def run(name):
        fns[name](iterators[name])
        coordinator.join()

    # a train function traces model.train_step when it first runs: each is built and
    # run (twice: tracing, and its first run on the worker) while its step is set
    fns = {}
    steps = {"local": own_step, "pulled": plain_step}
    for name in args.variants:
        model.train_step = own_step
        if name in steps:
            model.train_step = steps[name]
        else:
            antdt_keras.ShardingCallback(
                address, "train", sparse_reports=True, worker_slots=1,
                audit_records=num_records if name == "audit" else 0).attach(model)
        model.train_function = None
        fns[name] = model.make_train_function(force=True)
        for _ in range(args.warmup):
            run(name)
    model.train_step = own_step
    rows = {name: [] for name in args.variants}
    for r in range(args.rounds):
        for name in (args.variants if r % 2 == 0 else args.variants[::-1]):
            c0, t0 = cpu(), time.perf_counter()
            run(name)
            t1, c1 = time.perf_counter(), cpu()
            rows[name].append({"wall": t1 - t0, **{k: c1[k] - c0[k] for k in PARTS}})
        print(f"\rround {r + 1}/{args.rounds}", end="", flush=True)
    print()
    return rows


def _write(args, rows: dict, num_records: int) -> None:
    from benchmarks.results_table import per_step_stats, write_table

    mean, total, stderr = per_step_stats(rows, PARTS, args.steps_per_execution)

    def diff(a, b):
        parts = ", ".join(f"{k} {mean(a, k) - mean(b, k):+.2f}" for k in PARTS)
        return f"{total(a) - total(b):+.2f} ms CPU per step ({parts})"

    lines = [f"# CPU per model.fit step of the Keras path ({time.strftime('%Y-%m-%d')}; "
             f"{os.cpu_count()} cores, 1 PS + 1 worker + master + chief, Keras DeepFM "
             f"{args.buckets:,} buckets, batch {args.batch_size}, "
             f"{args.steps_per_execution} steps per execution, shards of "
             f"{args.records_per_shard:,}; {args.rounds} interleaved closures per variant, "
             "means)", "",
             "| variant | wall ms/step | worker CPU ms/step | PS | master | chief | "
             "total CPU ms/step (± s.e.) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name in rows:
        lines.append(f"| {name} | {mean(name, 'wall'):.2f} | " + " | ".join(
            f"{mean(name, k):.2f}" for k in PARTS) + f" | {total(name):.2f} ± {stderr(name):.2f} |")
    lines.append("")
    for a, b, what in (("pulled", "local", "the pull pipeline"),
                       ("antdt", "pulled", "antdt-tf's step"),
                       ("audit", "antdt", "the audit counters")):
        if a in rows and b in rows:
            lines.append(f"- {what} ({a} - {b}): {diff(a, b)}")
    if "antdt" in rows and "local" in rows:
        lines.append(f"- the Keras path as antdt-keras-trainer runs it vs bare tf-keras: "
                     f"{total('antdt') / total('local'):.2f}x the CPU, "
                     f"{mean('antdt', 'wall') / mean('local', 'wall'):.2f}x the wall time per step")
    lines += ["", f"Reproduce: `python -m benchmarks.keras_step_cost --rounds={args.rounds} "
              f"--steps_per_execution={args.steps_per_execution} "
              + (f"--warmup={args.warmup} " if args.warmup != 2 else "")
              + f"--variants={','.join(args.variants)} --out={args.out}`; "
              f"{num_records:,} generated records."]
    write_table(args.out, lines, smoke=args.smoke)


if __name__ == "__main__":
    main()
