"""The worker processes of the TF1 setups, three per run, each ``python -m
benchmarks.compare_pss --role=tf1_worker --index=<i>`` started by ``runs.run_tf1``
beside one ``antdt-tf-server`` PS: between-graph async PS training with its own
``tf.distribute.Server``, ``replica_device_setter`` and a ``MonitoredTrainingSession``,
on its contiguous third of the records (worker 0 the chief).

- (b): DeepFM's math as graph ops (``tf1_static_graph``);
- (t), ``--tf1_model``: the TF1 model (m) trains, ``estimator_examples.deepfm_tf1``;
- (u), ``--as_job`` too: started and checkpointed the way (m)'s workers are.

Each writes its result: ``t_go``, ``t_end``, its CPU seconds, the records it trained,
its slice; the chief also the audit, once every worker wrote ``done_<i>``.
"""

from __future__ import annotations

import json
import pathlib
import time

from benchmarks.pss.handshake import audit_counts, finish, touch, wait_file


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
    """One worker of setups (b), (t) and (u): between-graph async PS training on a
    static third."""
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
        wait_file(sync / "chief_initialized")
    sess = tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target, is_chief=is_chief, config=config, checkpoint_dir=checkpoint_dir,
        save_checkpoint_secs=10 if checkpoint_dir else None, save_summaries_steps=None,
        save_summaries_secs=None, log_step_count_steps=0)
    if is_chief:
        touch(sync / "chief_initialized")
    touch(sync / f"ready_{i}")
    t_go = time.time() if args.as_job else wait_file(sync / "go")
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
            wait_file(sync / f"done_{j}", timeout=1800, poll=0.05)
        with tf.compat.v1.Session(server.target, config=config) as s:
            result["audit"] = audit_counts(s.run(applied_value))
    finish(args.result, result, done=sync / f"done_{i}")
