"""The chief processes of the TF2 setups, each ``python -m benchmarks.compare_pss
--role=...`` started by ``runs.run_vanilla`` beside a ``LocalCluster`` (1 PS + 3
``antdt-tf-server`` workers):

- ``vanilla_chief``: (a) TensorFlow's ParameterServerStrategy tutorial, every worker
  sampling the whole file; with ``--static_thirds`` (s): each worker its contiguous
  third, closures running antdt-tf's own loop, nothing else of antdt-tf;
- ``keras_chief``: (v) bare tf-keras ``model.fit`` under PSS, the same audit counters
  as antdt-tf's Keras path.

Each builds everything and traces its closure function, writes ``ready_chief``, waits
for ``go``, trains, and writes its result: ``t_go``, ``t_end``, its own CPU seconds
across them, records per worker, each worker's last step (unix time), the audit.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import time

from benchmarks.pss.handshake import audit_counts, finish, touch, wait_file


def _strategy(tf, spec: dict):
    """ParameterServerStrategy over ``spec``, this process its chief; variables
    partitioned over the PS tasks."""
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    return tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners.
        MinSizePartitioner(min_shard_bytes=64 << 10, max_shards=len(spec["ps"])))


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


def vanilla_chief(args) -> None:
    """The chief of setup (a): TF tutorial-style PSS with a per-worker dataset (and of
    (s), ``--static_thirds``)."""
    import tensorflow as tf

    from antdt_tf.models.deepfm import DeepFM
    from antdt_tf.tf.reader import decode_records, records_from

    spec = json.loads(args.cluster)
    sync = pathlib.Path(args.sync_dir)
    n, b = args.records, args.batch_size
    strategy = _strategy(tf, spec)
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
    touch(sync / "ready_chief")
    t_go = wait_file(sync / "go")
    cpu0 = time.process_time()
    for _ in range(steps):
        coordinator.schedule(step, args=(it,))
    coordinator.join()
    t_end = time.time()
    cpu = time.process_time() - cpu0
    finish(args.result, {"t_go": t_go, "t_end": t_end, "coordinator_cpu": cpu, "steps": steps,
                         "records_per_worker": w_records.numpy().tolist(),
                         "last_step_time": w_last.numpy().tolist(),
                         "audit": audit_counts(_read_whole(tf, model.applied))})


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
    touch(sync / "ready_chief")
    t_go = wait_file(sync / "go")
    cpu0 = time.process_time()
    window, done, queue = 2 * workers, 0, []
    while done < args.records:   # closures on a worker whose third is done return 0
        while len(queue) < window:
            queue.append(coordinator.schedule(steps, args=(it,)))
        done += int(queue.pop(0).fetch())
    coordinator.join()
    t_end = time.time()
    cpu = time.process_time() - cpu0
    finish(args.result, {"t_go": t_go, "t_end": t_end, "coordinator_cpu": cpu,
                         "records_per_worker": w_records.numpy().tolist(),
                         "last_step_time": w_last.numpy().tolist(),
                         "audit": audit_counts(_read_whole(tf, model.applied))})


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
    strategy = _strategy(tf, spec)
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
    touch(sync / "ready_chief")
    t_go = wait_file(sync / "go")
    cpu0 = time.process_time()
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
    t_end = time.time()
    cpu = time.process_time() - cpu0
    per = steps * b // len(spec["worker"])
    finish(args.result, {"t_go": t_go, "t_end": t_end, "coordinator_cpu": cpu, "steps": steps,
                         "records_per_worker": [per] * len(spec["worker"]),
                         "last_step_time": [t_end] * len(spec["worker"]),
                         "audit": audit_counts(applied.numpy() - warm[1]),
                         "started_not_applied": int((started.numpy() - warm[0]
                                                     - (applied.numpy() - warm[1])).sum())})
