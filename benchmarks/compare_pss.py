"""Straggler tolerance: vanilla TF2 PSS vs TF1 static sharding vs antdt-tf, same model and data.

Usage::

    python -m benchmarks.compare_pss [--rounds=3] [--records=120000] [--setups=abc]
        [--out=benchmarks/results/compare_pss.md] [--smoke]

``--smoke``: the given setups, one round, no warm-up run, with the straggler only (its
throttle or injection runs; the no-straggler runs add no code path), on 24,576 records:
checks that the benchmark runs; not a measurement.

Every setup trains ``antdt_tf.models.deepfm.DeepFM``'s math (hashed embeddings with
``--buckets`` buckets, FM + dense tower, plain SGD, ``--learning_rate``) on the SAME
generated record file (``criteo.generate`` + ``records.write_records``, written once
into a temp dir), with batch ``--batch_size``, on 1 PS + 3 workers, each a separate real
process on 127.0.0.1. Each setup runs without and with a straggler: worker 2 slowed
``--slowdown`` x (4) by ``antdt_tf.agent.throttle.CpuThrottle`` (SIGSTOP/SIGCONT duty
cycling — a real CPU slowdown) for the whole training phase. The six runs are repeated
back to back in ``--rounds`` paired rounds (odd rounds in reverse order, after one
uncounted warm-up run: the first job after the data is written runs slow); the table
gives medians.

Setups
------
(a) **vanilla TF2 PSS**, as TensorFlow's ParameterServerStrategy tutorial does it: the
    driver starts a ``LocalCluster`` (``antdt-tf-server`` PS + workers) and a chief
    process (this file, ``--role=vanilla_chief``) that builds ``ParameterServerStrategy`` +
    ``ClusterCoordinator``, a per-worker dataset with ``create_per_worker_dataset`` — the
    same ``dataset_fn`` on every worker: the WHOLE file, zipped with its record ids,
    ``.shuffle(--shuffle_buffer).repeat().batch()`` — and schedules ``ceil(records /
    batch)`` closures of one step each, then ``join()``. The DeepFM audit counter
    (``audit_records``) counts per record id how often it was applied: since every worker
    samples the whole file independently, records are applied 0, 1 or 2+ times.
(b) **TF1 between-graph async PS training with static sharding**: the PS is an
    ``antdt-tf-server``; each worker is a process (``--role=tf1_worker``) running
    ``tf.compat.v1`` graph mode with its own in-process ``tf.distribute.Server``,
    ``replica_device_setter`` and an async ``MonitoredTrainingSession``, reading ONLY its
    contiguous third of the records (the same seeking reader as antdt-tf).
    The graph is DeepFM itself (its variables, ``_hash`` and ``logits``) with the same SGD
    update written as graph ops (``tf.gradients`` + ``scatter_sub``/``assign_sub``) and
    the same audit counter. The 30 s ``recovery_wait_secs`` of non-chiefs is avoided:
    the chief creates its session (initializing the variables) first and only then do
    the non-chiefs create theirs, which then find the model ready at the first check.
    The job ends when every worker finished its third.
(c) **antdt-tf**: ``python -m antdt_tf.launch --num_ps=1 --num_workers=3 --data=<file>
    --eval_data= --records_per_shard=--records_per_shard --batch_size=... --audit
    [--inject=slow:worker:2:x4@0s]`` as a subprocess (agents, master, PS, workers and
    coordinator all real processes; the straggler is the agent's own CpuThrottle from
    the first leased shard on). Dynamic sharding through the master.

(s) **diagnosis — TF2 PSS itself**: (a)'s chief with ``--static_thirds``: each worker
    reads only its contiguous third (the same seek as (b)), and closures run (c)'s own
    loop (16 steps per closure, the step guarded by the loop's predicate, the same DeepFM step and
    audit) — but no master, no leases, no reports, no checkpoints. (s) vs (b) is what the
    platform (ParameterServerStrategy's remote functions vs TF1 graph sessions) costs;
    (c) vs (s) is what antdt-tf adds on top.
(v) **diagnosis — tf-keras ``model.fit`` itself**: TensorFlow's Keras PSS tutorial on
    the same data: a chief (``--role=keras_chief``) with the Keras DeepFM of (k)
    (``build_keras_deepfm``, SGD, binary cross-entropy, 16 steps per execution as (k)),
    a ``DatasetCreator`` whose every worker reads the whole file shuffled and repeated
    (as (a)), and ``fit`` for ``ceil(records / batch)`` steps — no master, no antdt
    callback. (k) vs (v) is what antdt-tf adds to a Keras job; (v) vs (a)/(s) what
    Keras' own step costs. Its step counts applications with the same two PS counters
    as (k)'s ``--audit`` (``started`` before the step's updates, ``applied`` after
    them; before 2026-12-06 (v) had no audit and (k) paid for two it did not), and like
    (a) it samples the whole file, so records are applied 0, 1 or 2+ times. Its
    per-worker split is not measured; its ideal JCT is its JCT.
(t) **(b) with the TF1 model of (m)**: the same static thirds, but the model a TF1 user
    writes (``estimator_examples.deepfm_tf1``: ``get_variable``, the v1 optimizer's
    ``minimize``, the audit counter after the update), which (m) trains. (m) vs (t) is
    what antdt-tf adds to a TF1 job; (t) vs (b) what that way of writing the model costs.
(u) **(t) as a TF1 job runs it**: the same workers and model, but started the way
    (m)'s are, and checkpointed the way (m) is: the chief writes checkpoints with TF's
    ``CheckpointSaverHook`` every 10 s (at the start — ``graph.pbtxt``, the meta graph,
    checkpoint 0 — and at the end), the non-chiefs poll for the chief's initialized
    model every 0.1 s (``SessionManager``'s wait, as antdt-tf's workers do), nobody
    waits for a common start (the straggler is slowed from the first worker's session
    on), and the clock runs from the first step of any worker to the last step of all. (m) vs (u) compares the two jobs over the same kind of
    window: start-up and checkpoint 0 inside it, as in (m)'s.
(m) **antdt-tf's TF1 path**: (c)'s launcher with ``--api=mts``: the same master, dynamic
    sharding, per-step reports and audit, but every worker a TF1 between-graph
    ``MonitoredTrainingSession`` with the antdt SessionRunHooks (worker 0 the chief; no
    ParameterServerStrategy, no coordinator), i.e. (b)'s platform fed by antdt-tf.
    Its "coordinator CPU" is not measured (there is none).

Definitions
-----------
* **JCT** — the training phase only, no process start-up, no TF import:
  (a), (b) and (s): every process first gets ready (chief: strategy, coordinator,
  variables and per-worker dataset created, the closure function traced; TF1 workers:
  graph built, session created), then the driver starts the throttle and writes a "go"
  file; JCT = go -> the last record applied ((a), (s) ``join()`` returned; (b) the last
  worker's loop ended).
  (c): the launcher's ``jct_seconds``: the first shard issued -> every record applied,
  both times from the master's journal (the first shard is leased by the first
  closure, after the coordinator traced it).
  All four include the first run of the step on each worker (function instantiation /
  graph registration), none includes process start-up or TF import. Until 2026-12-03
  (a) counted its tracing too.
* **records/s** = records trained / JCT ((a) trains ``ceil(N/B)*B`` records).
* **per-worker rate** = records the worker trained / its busy time, where busy time =
  training start -> the worker's last applied step, measured in the same run:
  (a) a per-worker record count and ``tf.timestamp()`` of its last step kept on the PS
  (updated by the step itself, worker index from
  ``experimental_get_current_worker_index``); (b) each worker's own clock around its
  loop; (c) the per-worker record counts the coordinator reports to the master's
  ClusterMonitor (every 1 s), polled by this driver every 0.25 s: busy time = when the
  worker's count last grew (so (c)'s busy times are ~1 s coarse; capped at JCT);
  (m) each worker's own first step -> its last one (its report): a TF1 worker that
  started later than the first (session creation, the chief's first checkpoint) is not
  counted idle before it (the spread of the first steps is ``start_skew`` in each run's
  ``summary.json``); (k) and (v): busy the whole JCT.
* **ideal JCT** = records / sum of per-worker rates: how long the job would take if no
  worker ever idled at its measured speed. JCT/ideal = 1 means no load-imbalance loss.
* **coordinator CPU s** = CPU seconds (user+sys, all threads) of the coordinator during
  the training phase: (a) the chief process, measured by itself (``time.process_time``)
  across JCT; (c) ``psutil.Process(pid).cpu_times()`` of the ``antdt_tf.tf.coordinator``
  process found in the launcher's process tree, sampled every 0.25 s, at the first
  leased shard and the last sample before it exits; (b) has no coordinator: the number
  given is the chief WORKER (task 0), which trains its own third (not comparable).

All on one 2-core machine: the processes share the cores, so a throttled worker frees
CPU for the others and absolute rates drift between runs (hence paired rounds).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

NUM_WORKERS = 3


# ---------------------------------------------------------------------------- helpers

def _wait_file(path: pathlib.Path, timeout: float = 300.0, poll: float = 0.005) -> float:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout}s")
        time.sleep(poll)
    return time.time()


def _touch(path: pathlib.Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(str(time.time()))
    os.replace(tmp, path)


def _audit(counts) -> dict:
    import numpy as np

    counts = np.asarray(counts)
    return {"applied_0": int((counts == 0).sum()), "applied_1": int((counts == 1).sum()),
            "applied_2plus": int((counts >= 2).sum())}


def _pretrace(fn, *args) -> None:
    """Traces a closure function the way ``ClusterCoordinator.schedule`` does (worker 0's
    slice of per-worker arguments, as type specs), before the "go": (c)'s JCT starts at
    its first leased shard, after its coordinator traced, so (a) and (s) must not count
    the tracing either. Private TF helpers; a benchmark, not the product."""
    from tensorflow.python.distribute.coordinator import cluster_coordinator as cc
    from tensorflow.python.util import nest

    fn.get_concrete_function(*nest.map_structure(cc._maybe_as_type_spec,
                                                  cc._select_worker_slice(0, args)))


def _read_whole(tf, var):
    parts = getattr(var, "variables", None)
    return (tf.concat([p.read_value() for p in parts], 0) if parts else var.read_value()).numpy()


# ---------------------------------------------------------------------------- (a) chief

def vanilla_chief(args) -> None:
    """The chief of setup (a): TF tutorial-style PSS with a per-worker dataset."""
    import tensorflow as tf

    from antdt_tf.models.deepfm import DeepFM
    from antdt_tf.tf.reader import decode_records, records_from  # noqa: F401

    spec = json.loads(args.cluster)
    sync = pathlib.Path(args.sync_dir)
    n, b = args.records, args.batch_size
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners.
        MinSizePartitioner(min_shard_bytes=64 << 10, max_shards=len(spec["ps"])))
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    workers = len(spec["worker"])
    with strategy.scope():
        model = DeepFM(buckets=args.buckets, audit_records=n, learning_rate=args.learning_rate)
        w_records = tf.Variable(tf.zeros([workers], tf.int64), trainable=False)
        w_last = tf.Variable(tf.zeros([workers], tf.float64), trainable=False)
    path = args.data

    def dataset_fn():
        if args.static_thirds:   # (s): this worker's contiguous third, read by the seek
            i = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(),
                        tf.int64)
            start, end = n * i // workers, n * (i + 1) // workers
            return tf.data.Dataset.zip((records_from(path, start).take(end - start),
                                        tf.data.Dataset.range(start, end))).batch(b)
        # the same function on every worker: the whole file, shuffled, repeated
        raw = tf.data.TFRecordDataset(path).skip(1)   # record 0 is the .adtr header
        ids = tf.data.Dataset.range(n)
        return (tf.data.Dataset.zip((raw, ids)).shuffle(args.shuffle_buffer).repeat()
                .batch(b).prefetch(2))

    per_worker = coordinator.create_per_worker_dataset(dataset_fn)
    it = iter(per_worker)
    if args.static_thirds:
        return _static_thirds_loop(args, tf, strategy, coordinator, model, it, w_records,
                                   w_last, sync, workers)

    @tf.function
    def step(iterator):
        def replica_fn(raw, ids):
            model.train_step(decode_records(raw), ids)
            w = tf.reshape(tf.cast(
                tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64), [1])
            w_records.scatter_add(tf.IndexedSlices(tf.shape(ids, out_type=tf.int64), w))
            w_last.scatter_update(tf.IndexedSlices(tf.reshape(tf.timestamp(), [1]), w))
        raw, ids = next(iterator)
        strategy.run(replica_fn, args=(raw, ids))

    steps = math.ceil(n / b)
    _pretrace(step, it)
    _touch(sync / "ready_chief")
    t_go = _wait_file(sync / "go")
    cpu0 = time.process_time()
    for _ in range(steps):
        coordinator.schedule(step, args=(it,))
    coordinator.join()
    t_end = time.time()
    cpu = time.process_time() - cpu0
    result = {"t_go": t_go, "t_end": t_end, "coordinator_cpu": cpu, "steps": steps,
              "records_per_worker": w_records.numpy().tolist(),
              "last_step_time": w_last.numpy().tolist(),
              "audit": _audit(_read_whole(tf, model.applied))}
    pathlib.Path(args.result).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)   # ClusterCoordinator's teardown can linger; everything is written


def _static_thirds_loop(args, tf, strategy, coordinator, model, it, w_records, w_last, sync,
                        workers, steps_per_closure: int = 16) -> None:
    """Setup (s): antdt-tf's closure loop (many steps per closure, the same step) on
    static thirds, without the master: what ParameterServerStrategy itself costs."""
    from antdt_tf.tf.pull import no_records
    from antdt_tf.tf.reader import decode_records

    @tf.function
    def steps(iterator):
        w = tf.reshape(tf.cast(
            tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64), [1])

        def replica_fn(raw, ids):
            model.train_step(decode_records(raw), ids)
            n = tf.shape(ids, out_type=tf.int64)
            w_records.scatter_add(tf.IndexedSlices(n, w))
            return n[0]

        def fetch():
            batch = iterator.get_next_as_optional()
            raw, ids = tf.cond(batch.has_value(), batch.get_value,
                               lambda: no_records(iterator.element_spec))
            return raw, ids, tf.shape(ids)[0] > 0

        # the loop of PullTrainer._train_fn, minus reports: the step guarded by the loop's
        # predicate, the next batch fetched after it (none after the last step)
        def body(i, more, trained, raw, ids):
            stepped = strategy.run(replica_fn, args=(raw, ids))
            raw, ids, more = tf.cond(
                i + 1 < steps_per_closure, fetch,
                lambda: (*no_records(iterator.element_spec), tf.constant(False)))
            return i + 1, more, trained + stepped, raw, ids

        raw, ids, more = fetch()
        _, _, trained, _, _ = tf.while_loop(lambda i, more, *_: more, body,
                                            [tf.constant(0), more, tf.constant(0, tf.int64),
                                             raw, ids])
        if trained > 0:
            w_last.scatter_update(tf.IndexedSlices(tf.reshape(tf.timestamp(), [1]), w))
        return trained

    _pretrace(steps, it)
    _touch(sync / "ready_chief")
    t_go = _wait_file(sync / "go")
    cpu0 = time.process_time()
    window, done, queue = 2 * workers, 0, []
    while done < args.records:   # closures on a worker whose third is done return 0
        while len(queue) < window:
            queue.append(coordinator.schedule(steps, args=(it,)))
        done += int(queue.pop(0).fetch())
    coordinator.join()
    t_end = time.time()
    cpu = time.process_time() - cpu0
    result = {"t_go": t_go, "t_end": t_end, "coordinator_cpu": cpu,
              "records_per_worker": w_records.numpy().tolist(),
              "last_step_time": w_last.numpy().tolist(),
              "audit": _audit(_read_whole(tf, model.applied))}
    pathlib.Path(args.result).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)


# ---------------------------------------------------------------------------- (v) chief

def keras_chief(args) -> None:
    """The chief of setup (v): bare tf-keras ``model.fit`` under PSS (no antdt-tf)."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1"   # before TensorFlow: tf.keras = tf-keras
    import tensorflow as tf

    from antdt_tf.models.keras_deepfm import build_keras_deepfm
    from antdt_tf.tf.reader import decode_records

    keras = tf.keras
    spec = json.loads(args.cluster)
    sync = pathlib.Path(args.sync_dir)
    n, b, spe = args.records, args.batch_size, 16
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners.
        MinSizePartitioner(min_shard_bytes=64 << 10, max_shards=len(spec["ps"])))
    with strategy.scope():
        model = build_keras_deepfm(args.buckets)
        model.compile(optimizer=keras.optimizers.SGD(args.learning_rate),
                      loss=keras.losses.BinaryCrossentropy(), steps_per_execution=spe)
        # the audit of (k)'s --audit, the same two PS counters: `started` before the
        # step's updates, `applied` after them
        started = tf.Variable(tf.zeros([n], tf.int32), trainable=False)
        applied = tf.Variable(tf.zeros([n], tf.int32), trainable=False)
    original = model.train_step

    def train_step(data):
        x, y = data
        x = dict(x)
        ids = x.pop("record_id")
        ones = tf.IndexedSlices(tf.ones_like(ids, tf.int32), ids)
        begun = started.scatter_add(ones)
        with tf.control_dependencies([begun]):
            logs = original((x, y))
        with tf.control_dependencies(tf.nest.flatten(logs)):
            applied.scatter_add(ones)
        return logs

    model.train_step = train_step
    path = args.data

    def dataset_fn(_context):
        raw = tf.data.TFRecordDataset(path).skip(1)   # record 0 is the .adtr header
        raw = tf.data.Dataset.zip((raw, tf.data.Dataset.range(n)))

        def to_keras(r, ids):
            batch = decode_records(r)
            return {"dense": batch["dense"], "sparse": batch["sparse"],
                    "record_id": ids}, batch["label"]
        return raw.shuffle(args.shuffle_buffer).repeat().batch(b).map(to_keras).prefetch(2)

    data = keras.utils.experimental.DatasetCreator(dataset_fn)
    model.fit(data, epochs=1, steps_per_epoch=spe, verbose=0)   # traces, as (c) before its clock
    warm = started.numpy(), applied.numpy()    # the warm-up's steps are not the job's
    steps = spe * math.ceil(math.ceil(n / b) / spe)
    _touch(sync / "ready_chief")
    t_go = _wait_file(sync / "go")
    cpu0 = time.process_time()
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
    t_end = time.time()
    cpu = time.process_time() - cpu0
    per = steps * b // len(spec["worker"])
    result = {"t_go": t_go, "t_end": t_end, "coordinator_cpu": cpu, "steps": steps,
              "records_per_worker": [per] * len(spec["worker"]),
              "last_step_time": [t_end] * len(spec["worker"]),
              "audit": _audit(applied.numpy() - warm[1]),
              "started_not_applied": int((started.numpy() - warm[0]
                                          - (applied.numpy() - warm[1])).sum())}
    pathlib.Path(args.result).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)   # ClusterCoordinator's teardown can linger; everything is written


# ---------------------------------------------------------------------------- (b) TF1 worker

def tf1_static_graph(tf, args, i: int, workers: int, tf1_model: bool = False):
    """Setup (b)'s graph for worker ``i`` of ``workers``: its contiguous third of
    ``args.data`` and DeepFM's step as graph ops — or with ``tf1_model`` (setup (t)) the
    TF1 model (m) trains, ``estimator_examples.deepfm_tf1``. Returns ``(train_op,
    batch_rows, applied_value)``; build it under ``replica_device_setter``."""
    from antdt_tf.models.deepfm import DeepFM
    from antdt_tf.data.criteo import NUM_SPARSE
    from antdt_tf.tf.reader import decode_records, records_from

    n, b = args.records, args.batch_size
    start = n * i // workers
    length = n * (i + 1) // workers - start
    raw_ds = records_from(args.data, start).take(length)   # the same seek as antdt-tf
    ds = tf.data.Dataset.zip((raw_ds, tf.data.Dataset.range(start, start + length))).batch(b)
    raw, ids = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    batch = decode_records(raw)
    if tf1_model:
        from estimator_examples.deepfm_tf1 import audit_variable, deepfm_train_op

        labels = batch.pop("label")
        batch["record_id"] = ids
        _, train_op = deepfm_train_op(batch, labels, 1, args.buckets, args.learning_rate, n)
        return train_op, tf.shape(ids)[0], audit_variable().read_value()
    global_step = tf.compat.v1.train.get_or_create_global_step()
    model = DeepFM(buckets=args.buckets, audit_records=n, learning_rate=args.learning_rate)
    # DeepFM.train_step's math as graph ops (same hash, gathers, loss and SGD update)
    idx = model._hash(batch["sparse"])
    flat = tf.reshape(idx, [-1])
    rows = tf.shape(idx)[0]
    dense_vars = [model.w1, model.b1, model.w2, model.bias]
    emb_rows = tf.gather(model.embedding, flat)
    lin_rows = tf.gather(model.linear, flat)
    emb = tf.reshape(emb_rows, [rows, NUM_SPARSE, -1])
    lin = tf.reshape(lin_rows, [rows, NUM_SPARSE, 1])
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=batch["label"], logits=model.logits(batch, emb, lin)))
    grads = tf.gradients(loss, [emb_rows, lin_rows] + dense_vars)
    lr = model.learning_rate
    updates = [model.embedding.scatter_sub(tf.IndexedSlices(lr * grads[0], flat)),
               model.linear.scatter_sub(tf.IndexedSlices(lr * grads[1], flat))]
    updates += [v.assign_sub(lr * g) for v, g in zip(dense_vars, grads[2:])]
    updates.append(model.applied.scatter_add(tf.IndexedSlices(tf.ones_like(ids, tf.int32), ids)))
    updates.append(global_step.assign_add(1))
    return tf.group(updates), tf.shape(ids)[0], model.applied.read_value()


def tf1_worker(args) -> None:
    """One worker of setup (b): between-graph async PS training on a static third."""
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    spec = json.loads(args.cluster)
    sync = pathlib.Path(args.sync_dir)
    i, workers = args.index, len(spec["worker"])
    n = args.records
    start = n * i // workers
    length = n * (i + 1) // workers - start
    cluster = tf.train.ClusterSpec(spec)
    config = tf.compat.v1.ConfigProto(
        device_filters=["/job:ps", f"/job:worker/task:{i}"], allow_soft_placement=True)
    server = tf.distribute.Server(cluster, job_name="worker", task_index=i, config=config)
    is_chief = i == 0
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{i}", cluster=cluster)):
        train_op, batch_rows, applied_value = tf1_static_graph(tf, args, i, workers,
                                                               args.tf1_model)

    checkpoint_dir = None
    if args.as_job:   # (u): started and checkpointed as (m)'s workers are
        from antdt_tf.estimator.feed import shorten_session_wait

        shorten_session_wait(0.1)
        checkpoint_dir = str(sync.parent / "checkpoints") if is_chief else None
    elif not is_chief:   # the chief initializes first: no 30 s recovery wait for us
        _wait_file(sync / "chief_initialized")
    sess = tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target, is_chief=is_chief, config=config, checkpoint_dir=checkpoint_dir,
        save_checkpoint_secs=10 if checkpoint_dir else None, save_summaries_steps=None,
        save_summaries_secs=None, log_step_count_steps=0)
    if is_chief:
        _touch(sync / "chief_initialized")
    _touch(sync / f"ready_{i}")
    t_go = time.time() if args.as_job else _wait_file(sync / "go")
    cpu0 = time.process_time()
    trained = 0
    try:
        while not sess.should_stop():
            _, r = sess.run([train_op, batch_rows])
            trained += int(r)
    except tf.errors.OutOfRangeError:
        pass   # our third is done (MonitoredSession re-raises it from run())
    t_end = time.time()
    if args.as_job:
        sess.close()     # the chief's last checkpoint, as (m)'s chief writes it
    cpu = time.process_time() - cpu0
    result = {"t_go": t_go, "t_end": t_end, "cpu": cpu, "records": trained,
              "start": start, "length": length}
    if is_chief:   # audit after every worker is done (a plain session on the same server)
        for j in range(1, workers):
            _wait_file(sync / f"done_{j}", timeout=1800, poll=0.05)
        with tf.compat.v1.Session(server.target, config=config) as s:
            result["audit"] = _audit(s.run(applied_value))
    pathlib.Path(args.result).write_text(json.dumps(result))
    _touch(sync / f"done_{i}")
    sys.stdout.flush()
    os._exit(0)


# ---------------------------------------------------------------------------- driver side

def _env():
    from antdt_tf.procutil import child_env

    root = str(pathlib.Path(__file__).resolve().parents[1])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return child_env(env)


def _killpg(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


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
    rates = [r / t if t > 0 else 0.0 for r, t in zip(per_worker_records, busy)]
    return total / sum(rates), rates


def run_vanilla(work: pathlib.Path, args, straggler: bool, static_thirds: bool = False,
                role: str = "vanilla_chief") -> dict:
    from antdt_tf.agent.throttle import CpuThrottle
    from antdt_tf.tf.local_cluster import LocalCluster

    sync = work / "sync"
    sync.mkdir(parents=True)
    result = work / "chief.json"
    with LocalCluster(num_ps=1, num_workers=NUM_WORKERS, log_dir=work) as cluster:
        cmd = [sys.executable, "-m", "benchmarks.compare_pss", f"--role={role}",
               f"--cluster={cluster.spec_json}", f"--sync_dir={sync}", f"--result={result}",
               *_model_flags(args)] + (["--static_thirds"] if static_thirds else [])
        with open(work / "chief.log", "ab") as log:
            chief = subprocess.Popen(cmd, env=_env(), start_new_session=True,
                                     stdout=log, stderr=log)
        throttle = None
        try:
            _wait_all([sync / "ready_chief"], [chief])
            if straggler:
                throttle = CpuThrottle(cluster.procs["worker", 2].pid, args.slowdown).start()
            import psutil

            tasks = [psutil.Process(p.pid) for p in cluster.procs.values()]
            cpu = CpuByRole()
            cpu.sample(_procs(chief.pid, tasks))
            _touch(sync / "go")
            _wait_sampling(cpu, lambda: _procs(chief.pid, tasks),
                           lambda: chief.poll() is None, "the chief")
        finally:
            if throttle is not None:
                throttle.stop()
            _killpg(chief)
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
                   f"--result={work / f'worker{i}.json'}", *_model_flags(args)]
            if tf1_model:
                cmd.append("--tf1_model")
            if as_job:
                cmd.append("--as_job")
            with open(work / f"tf1_worker{i}.log", "ab") as log:
                workers.append(subprocess.Popen(cmd, env=_env(), start_new_session=True,
                                                stdout=log, stderr=log))
        import psutil

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
            _touch(sync / "go")
        _wait_sampling(cpu, lambda: procs, lambda: any(w.poll() is None for w in workers),
                       "the TF1 workers")
    finally:
        if throttle is not None:
            throttle.stop()
        for w in workers:
            _killpg(w)
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


def _tree(pid: int):
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


ROLES = ("ps", "worker", "chief", "master", "agent", "launcher")


def _role(cmdline: list) -> str:
    cmd = " ".join(cmdline)
    if "antdt_tf.tf.server" in cmd or "antdt-tf-server" in cmd:
        return "ps" if "--job=ps" in cmd else "worker"
    if any(k in cmd for k in ("antdt_tf.tf.keras_trainer", "antdt_tf.tf.coordinator",
                              "--role=keras_chief", "--role=vanilla_chief")):
        return "chief"
    if "--role=tf1_worker" in cmd or "estimator_examples.train_mts" in cmd:
        return "worker"
    for needle, role in (("antdt_tf.master", "master"), ("antdt_tf.agent", "agent"),
                         ("antdt_tf.launch", "launcher")):
        if needle in cmd:
            return role
    return ""


class CpuByRole:
    """CPU seconds (user + system) per process role between two moments, from snapshots
    polled every ~0.25 s: where a run's CPU goes — the platform's processes (PS,
    workers, chief) and antdt-tf's own (master, agents, launcher) — on a machine where
    the CPU is the limit. The moments are picked afterwards (antdt-tf's training start
    is the master's, in its report). A process's CPU after its last snapshot is not
    seen."""

    def __init__(self):
        self.samples: list[tuple[float, dict]] = []   # (unix time, {pid: (role, cpu)})
        self._roles: dict[int, str] = {}

    def sample(self, procs) -> None:
        import psutil

        snap = {}
        for p in procs:
            try:
                if p.pid not in self._roles:
                    self._roles[p.pid] = _role(p.cmdline())
                ct = p.cpu_times()
            except psutil.Error:
                continue
            if self._roles[p.pid]:
                snap[p.pid] = (self._roles[p.pid], ct.user + ct.system)
        self.samples.append((time.time(), snap))

    def between(self, t0: float, t1: float) -> dict:
        at0: dict[int, float] = {}
        at1: dict[int, tuple[str, float]] = {}
        for t, snap in self.samples:
            for pid, (role, cpu) in snap.items():
                if t <= t0:
                    at0[pid] = cpu
                if t <= t1:
                    at1[pid] = (role, cpu)
        out = dict.fromkeys(ROLES, 0.0)
        for pid, (role, cpu) in at1.items():
            out[role] += cpu - at0.get(pid, 0.0)
        return out


def _procs(root_pid: int, extra=()):
    import psutil

    try:
        return [psutil.Process(root_pid)] + _tree(root_pid) + list(extra)
    except psutil.NoSuchProcess:
        return list(extra)


def _wait_sampling(cpu: CpuByRole, procs, running, what: str, timeout: float = 1800) -> None:
    """Samples ``procs()`` into ``cpu`` every 0.25 s while ``running()``."""
    deadline = time.monotonic() + timeout
    while running():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not finish")
        cpu.sample(procs())
        time.sleep(0.25)


def run_antdt(work: pathlib.Path, args, straggler: bool, checkpoint_every: float = 10.0,
              api: str = "custom_loop") -> dict:
    report = work / "report.json"
    cmd = [sys.executable, "-m", "antdt_tf.launch", "--num_ps=1", f"--num_workers={NUM_WORKERS}",
           f"--data={args.data}", "--eval_data=", f"--records_per_shard={args.records_per_shard}",
           f"--batch_size={args.batch_size}", f"--buckets={args.buckets}",
           f"--learning_rate={args.learning_rate}", "--audit", f"--report_json={report}",
           f"--workdir={work / 'job'}", "--noprogress",
           f"--checkpoint_every_seconds={checkpoint_every}", f"--api={api}"]
    if straggler:
        cmd.append(f"--inject=slow:worker:2:x{args.slowdown:g}@0s")
    with open(work / "launch.log", "ab") as log:
        launcher = subprocess.Popen(cmd, env=_env(), start_new_session=True, stdout=log, stderr=log)
    # The job runs in a network namespace of its own (--private_network) with a token:
    # the master is not reachable from here. Everything comes from its report; the CPU
    # of every process of the job is sampled from outside (same PID namespace).
    cpu = CpuByRole()
    try:
        _wait_sampling(cpu, lambda: _procs(launcher.pid), lambda: launcher.poll() is None,
                       "antdt-launch")
    finally:
        _killpg(launcher)
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


# the run's flags a results file's reproduce line names when they differ from these
REPRODUCE_DEFAULTS = {"batch_size": 256, "records_per_shard": 2048, "stragglers": "both",
                      "warmup": 1}
# --smoke: every setup asked for, once, with the straggler, on few records
SMOKE = {"rounds": 1, "warmup": 0, "records": 24_576, "stragglers": "only"}

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


def _model_flags(args) -> list[str]:
    return [f"--data={args.data}", f"--records={args.records}", f"--batch_size={args.batch_size}",
            f"--buckets={args.buckets}", f"--learning_rate={args.learning_rate}",
            f"--shuffle_buffer={args.shuffle_buffer}"]


def _med(runs, key):
    return statistics.median(r[key] for r in runs)


def write_results(args, results: dict, started: str) -> None:
    from benchmarks.results_table import non_default_flags, write_table

    cmd = (f"python -m benchmarks.compare_pss --rounds={args.rounds} --records={args.records} "
           f"--setups={args.setups}{non_default_flags(args, REPRODUCE_DEFAULTS)} "
           f"--out={args.out}")
    # the Makefile target that runs exactly this (the results files it writes)
    target = {"benchmarks/results/compare_pss.md": "bench-compare",
              "benchmarks/results/compare_pss_apis.md": "bench-apis"}.get(args.out)
    lines = [
        f"# vanilla TF2 PSS vs TF1 static sharding vs antdt-tf ({started}; 2 cores, 1 PS + 3 "
        f"workers, DeepFM {args.buckets:,} buckets, SGD lr {args.learning_rate:g}, "
        f"{args.records:,} records, batch {args.batch_size}, antdt shards of "
        f"{args.records_per_shard:,}; straggler = worker 2 slowed {args.slowdown:g}x by "
        f"CpuThrottle; {args.rounds} paired round(s), medians)",
        "",
        "Definitions (see the module docstring of `benchmarks/compare_pss.py`): JCT = training "
        "phase only (all processes ready -> last record applied; antdt-tf: first shard "
        "leased -> the master reports every record applied); ideal = records / sum of per-worker rates (records the worker trained / "
        "training start -> its last step) measured in the same run; coordinator CPU = CPU "
        "seconds of the chief/coordinator process during training ((b) has no coordinator: "
        "the number is the chief *worker*, which also trains its third).",
        "",
        "| setup | straggler | JCT (s) | records/s | ideal JCT (s) | JCT / ideal | "
        "coordinator CPU (s) | records per worker | applied 0 / 1 / 2+ times |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for (key, straggler), runs in results.items():
        if not runs:
            continue
        name = SETUPS[key][0]
        per = [int(statistics.median(r["records_per_worker"][w] for r in runs))
               for w in range(NUM_WORKERS)]
        aud = runs[len(runs) // 2]["audit"]
        ratio = statistics.median(r["jct"] / r["ideal"] for r in runs)
        rps = statistics.median(r["records"] / r["jct"] for r in runs)
        lines.append(
            f"| {name} | {'worker 2 x' + format(args.slowdown, 'g') if straggler else 'none'} | "
            f"{_med(runs, 'jct'):.2f} | {rps:,.0f} | {_med(runs, 'ideal'):.2f} | {ratio:.2f} | "
            f"{'—' if key == 'm' else format(_med(runs, 'coord_cpu'), '.2f')}"
            f"{' (chief worker)' if key in ('b', 't', 'u') else ''} | "
            f"{' / '.join(f'{x:,}' for x in per) if aud and key != 'v' else '—'} | "
            + (f"{aud['applied_0']:,} / {aud['applied_1']:,} / {aud['applied_2plus']:,} |"
               if aud else "— |"))
    lines += ["", "CPU seconds by process role during training (medians; polled every 0.25 s "
              "from the start mark; the platform's: PS, workers, chief; antdt-tf's own: master, "
              "agents, launcher), and CPU per 10k records:", "",
              "| setup | straggler | " + " | ".join(ROLES) + " | total | total per 10k records |",
              "|---|---|" + "---:|" * (len(ROLES) + 2)]
    for (key, straggler), runs in results.items():
        runs = [r for r in runs if r.get("cpu")]
        if not runs:
            continue
        cells = [statistics.median(r["cpu"][role] for r in runs) for role in ROLES]
        total = statistics.median(sum(r["cpu"].values()) for r in runs)
        per10k = statistics.median(sum(r["cpu"].values()) / r["records"] * 1e4 for r in runs)
        slow = "x" + format(args.slowdown, "g") if straggler else "none"
        lines.append(f"| {SETUPS[key][0]} | {slow} | " + " | ".join(f"{c:.2f}" for c in cells)
                     + f" | {total:.2f} | {per10k:.2f} |")
    lines.append("")

    def med_jct(k, s):
        return _med(results[k, s], "jct") if results.get((k, s)) else float("nan")

    def med_rps(k, s):
        runs = results.get((k, s))
        return statistics.median(r["records"] / r["jct"] for r in runs) if runs else float("nan")

    ratio_lines = [
        f"- JCT (c)/(b) with the straggler: {med_jct('c', True) / med_jct('b', True):.2f} "
        f"(JCT (c)/(a) with the straggler: {med_jct('c', True) / med_jct('a', True):.2f})",
        f"- (c) throughput without straggler vs (a): {med_rps('c', False) / med_rps('a', False):.2f}x, "
        f"vs (b): {med_rps('c', False) / med_rps('b', False):.2f}x",
        f"- straggler slowdown of JCT (with / without): (a) "
        f"{med_jct('a', True) / med_jct('a', False):.2f}, (b) "
        f"{med_jct('b', True) / med_jct('b', False):.2f}, (c) "
        f"{med_jct('c', True) / med_jct('c', False):.2f}"]
    if set("abc") <= set(args.setups):
        lines += ratio_lines
    if set("bcs") <= set(args.setups):
        lines.append(
            f"- what the platform costs: (s) TF2 PSS static thirds, no antdt-tf, throughput "
            f"without straggler vs (b): {med_rps('s', False) / med_rps('b', False):.2f}x; "
            f"what antdt-tf costs on top of it: (c) vs (s): "
            f"{med_rps('c', False) / med_rps('s', False):.2f}x; JCT (s)/(b) with the "
            f"straggler: {med_jct('s', True) / med_jct('b', True):.2f}")
    if set("bm") <= set(args.setups):
        lines.append(
            f"- antdt-tf's TF1 path: JCT (m)/(b) with the straggler: "
            f"{med_jct('m', True) / med_jct('b', True):.2f}; (m) throughput without "
            f"straggler vs (b): {med_rps('m', False) / med_rps('b', False):.2f}x")
    if set("mt") <= set(args.setups):
        lines.append(
            f"- what antdt-tf adds to a TF1 job (the same model on both sides): (m) throughput "
            f"without straggler vs (t): {med_rps('m', False) / med_rps('t', False):.2f}x; JCT "
            f"(t)/(m) with the straggler: {med_jct('t', True) / med_jct('m', True):.2f} "
            f"(how many times faster antdt-tf is)")
    if set("mu") <= set(args.setups):
        lines.append(
            f"- antdt-tf's TF1 job against the same TF1 job without it, both timed from the "
            f"first step (start-up and checkpoint 0 inside): (m) throughput without straggler "
            f"vs (u): {med_rps('m', False) / med_rps('u', False):.2f}x; JCT (u)/(m) with the "
            f"straggler: {med_jct('u', True) / med_jct('m', True):.2f}")
    if set("bt") <= set(args.setups):
        lines.append(
            f"- what the TF1 model as written costs: (t) vs (b) throughput without straggler: "
            f"{med_rps('t', False) / med_rps('b', False):.2f}x")
    if set("ck") <= set(args.setups):
        lines.append(
            f"- antdt-tf's Keras path: (k) throughput without straggler vs (c): "
            f"{med_rps('k', False) / med_rps('c', False):.2f}x; JCT (k)/(c) with the "
            f"straggler: {med_jct('k', True) / med_jct('c', True):.2f}")
    if set("kv") <= set(args.setups):
        lines.append(
            f"- what antdt-tf adds to a Keras job: (k) vs (v) throughput without straggler: "
            f"{med_rps('k', False) / med_rps('v', False):.2f}x; what Keras' own step costs: "
            f"(v) vs (s): {med_rps('v', False) / med_rps('s', False):.2f}x")
    if set("bk") <= set(args.setups):
        lines.append(
            f"- JCT (k)/(b) with the straggler: {med_jct('k', True) / med_jct('b', True):.2f}")
    if set("cd") <= set(args.setups):
        lines.append(f"- JCT (c)/(c') with the straggler: "
                     f"{med_jct('c', True) / med_jct('d', True):.2f}, without: "
                     f"{med_jct('c', False) / med_jct('d', False):.2f}")
    # a ratio needs both of its setups (and straggler modes) run: drop the parts that
    # were not, rather than print "nan"
    missing = re.compile(r"\bnanx?\b")    # how a ratio of a setup not run prints
    kept = []
    for line in lines:
        if line.startswith("- ") and missing.search(line):
            parts = [p for p in line[2:].split("; ") if not missing.search(p)]
            if not parts:
                continue
            line = "- " + "; ".join(parts)
        kept.append(line)
    lines = kept
    lines += [
        "",
        "Per run (JCT s): " + "; ".join(
            f"{k}{'+s' if s else ''}: " + ", ".join(
                f"{r['jct']:.1f} (load {r['load'][0]:.0f}->{r['load'][1]:.0f})" for r in runs)
            for (k, s), runs in results.items() if runs),
        "",
        f"Reproduce: `{cmd}`" + (f" (or `make {target}`)." if target else "."),
    ]
    write_table(args.out, lines, smoke=args.smoke)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=REPRODUCE_DEFAULTS["warmup"], choices=(0, 1),
                    help="1: one uncounted run of the first setup before the rounds")
    ap.add_argument("--records", type=int, default=120_000)
    ap.add_argument("--batch_size", type=int, default=REPRODUCE_DEFAULTS["batch_size"])
    ap.add_argument("--buckets", type=int, default=1 << 16)
    ap.add_argument("--learning_rate", type=float, default=0.2)
    ap.add_argument("--records_per_shard", type=int,
                    default=REPRODUCE_DEFAULTS["records_per_shard"])
    ap.add_argument("--shuffle_buffer", type=int, default=10_000)
    ap.add_argument("--slowdown", type=float, default=4.0)
    ap.add_argument("--setups", default="abc", help="which setups to run, e.g. 'ac' (s: the "
                    "diagnostic TF2 PSS static-thirds loop, d: (c) without periodic checkpoints, m: antdt "
                    "on TF1 MonitoredTrainingSession hooks, t: (b) with (m)'s TF1 model, u: (t) "
                    "started and checkpointed as (m) is, k: antdt with "
                    "Keras model.fit, v: bare tf-keras model.fit)")
    ap.add_argument("--stragglers", default=REPRODUCE_DEFAULTS["stragglers"],
                    choices=["both", "none", "only"],
                    help="run each setup without the straggler, with it, or both")
    ap.add_argument("--out", default="benchmarks/results/compare_pss.md")
    ap.add_argument("--workdir", default="", help="default: a new temp dir (kept)")
    # internal: the processes this benchmark starts
    ap.add_argument("--role", default="driver",
                    choices=["driver", "vanilla_chief", "keras_chief", "tf1_worker"])
    ap.add_argument("--data", default="")
    ap.add_argument("--static_thirds", action="store_true")
    ap.add_argument("--tf1_model", action="store_true")
    ap.add_argument("--as_job", action="store_true")
    ap.add_argument("--cluster", default="")
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--sync_dir", default="")
    ap.add_argument("--result", default="")
    from benchmarks.results_table import argparse_smoke

    args = argparse_smoke(ap, SMOKE)
    if args.role == "vanilla_chief":
        return vanilla_chief(args)
    if args.role == "tf1_worker":
        return tf1_worker(args)
    if args.role == "keras_chief":
        return keras_chief(args)

    from antdt_tf.data import criteo, records

    work = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="antdt-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    args.data = str(work / "train.adtr")
    records.write_records(args.data, criteo.generate(criteo.SyntheticSpec(args.records, seed=1)))
    print(f"data: {args.data} ({args.records:,} records); work dir {work}", flush=True)
    started = time.strftime("%Y-%m-%d")
    results = {(k, s): [] for s in (False, True) for k in args.setups}
    if args.warmup:
        # the first job after the data is written runs slower (seen: bare Keras 10.5 and
        # 11.6 s in round 0, 3.4-7.0 s after): one run of the first setup, not counted
        run_dir = work / "warmup"
        run_dir.mkdir()
        r = SETUPS[args.setups[0]][1](run_dir, args, False)
        print(f"warm-up {SETUPS[args.setups[0]][0]} JCT {r['jct']:.2f} s (not counted)",
              flush=True)
    for rnd in range(args.rounds):
        for straggler in {"both": (False, True), "none": (False,), "only": (True,)}[args.stragglers]:
            # odd rounds in reverse order: no setup always runs first or last
            for key in (args.setups if rnd % 2 == 0 else args.setups[::-1]):
                run_dir = work / f"r{rnd}-{key}-{'slow' if straggler else 'none'}"
                run_dir.mkdir()
                t = time.monotonic()
                load0 = os.getloadavg()[0]
                r = SETUPS[key][1](run_dir, args, straggler)
                r["load"] = (load0, os.getloadavg()[0])   # 1-min load average before / after
                results[key, straggler].append(r)
                print(f"round {rnd} {SETUPS[key][0]:<24} straggler={straggler!s:<5} "
                      f"JCT {r['jct']:6.2f} s ideal {r['ideal']:6.2f} s "
                      f"coord CPU {r['coord_cpu']:6.2f} s per worker {r['records_per_worker']} "
                      f"audit {r['audit']} (wall {time.monotonic() - t:.0f} s, load avg "
                      f"{r['load'][0]:.1f} -> {r['load'][1]:.1f})", flush=True)
                (run_dir / "summary.json").write_text(json.dumps(r))
    write_results(args, results, started)


if __name__ == "__main__":
    main()
