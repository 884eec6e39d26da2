"""The data side of the Keras path: each worker's ``model.fit`` pipeline pulls its
shards from the master and yields ``(features, label, sample_weight)``.

``model.fit`` under PSS needs an endless dataset (a finite one ends ``fit`` with
``CancelledError``, measured), so after the last shard the pipeline yields one-record
padding batches with sample weight 0 — a no-op for SGD and Adagrad (momentum and Adam
still move the weights a little on such steps).
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras   # the [tf] extra installs it; TF_USE_LEGACY_KERAS=1 makes it tf.keras

from antdt_tf.tf.master_rpc import DEFAULT_TIMEOUT_MS
from antdt_tf.tf.pull import check_feature_names, pull_dataset


def default_parse(batch: dict):
    """The compact format's batch as the model's ``(features, label)``: the features
    ``dense`` (f32[n,13]) and ``sparse`` (i64[n,26]), the label f32[n] (0 or 1)."""
    return {"dense": batch["dense"], "sparse": batch["sparse"]}, batch["label"]


def padding_like(spec, worker):
    """One record of ``spec``'s structure, with sample weight 0 and no lease: trains
    nothing (the batch ``model.fit`` needs once the data is done, and a WAIT's)."""
    def zeros(s):
        if not isinstance(s, tf.TensorSpec):
            raise TypeError(f"a padding batch needs dense features, got a {type(s).__name__}: "
                            "make the parse function return dense tensors (e.g. "
                            "tf.sparse.to_dense)")
        return tf.zeros([1 if d is None else d for d in s.shape.as_list()], s.dtype)
    x, y, w = tf.nest.map_structure(zeros, spec)
    x = dict(x)
    x["record_id"] = tf.fill([1], tf.constant(-1, tf.int64))
    meta = dict(x["antdt"], worker=worker, incarnation=tf.constant(-1, tf.int64))
    meta["lease"] = tf.fill([1], tf.constant(-1, tf.int64))
    x["antdt"] = meta
    return x, y, tf.zeros_like(w)


def dataset_creator(master: str, dataset: str, batch_size: int,
                    timeout_ms: int = DEFAULT_TIMEOUT_MS, sparse_reports: bool = False,
                    steps_per_execution: int = 1, parse=None, record_format=None):
    """A Keras ``DatasetCreator`` whose per-worker pipelines pull from the master.

    ``record_format`` reads and decodes the dataset's files (:mod:`antdt_tf.tf.formats`:
    the compact ``.adtr`` format by default, ``TFRecordExamples`` for ``tf.train.Example``
    files, or one's own). ``parse(batch) -> (features, label)`` or
    ``(features, label, sample_weight)`` turns a decoded batch (a dict) into what the
    model takes; ``features`` must be a dict (default: :func:`default_parse`). The
    pipeline then adds two entries to the features, ``record_id`` and ``antdt`` (the
    lease position), which the step of :meth:`ShardingCallback.attach` removes before
    the model's own ``train_step`` sees the batch.

    ``sparse_reports`` must match the :class:`ShardingCallback`'s, and
    ``steps_per_execution`` the model's (``compile``): with sparse reports a step for
    which the master has nothing now trains a padding batch after the master's long
    poll, and a closure runs ``steps_per_execution`` steps, so each poll is cut to
    2 s / ``steps_per_execution`` — a closure of nothing but waits ends within ~2 s
    instead of holding its worker (and the chief's pacing) 2 s per step (seen at 16:
    32 s, while another worker sat on the last lease it had read ahead)."""
    if steps_per_execution < 1:
        raise ValueError(f"steps_per_execution must be >= 1, got {steps_per_execution}")
    wait_ms = -1 if steps_per_execution == 1 else max(50, 2000 // steps_per_execution)
    parse = default_parse if parse is None else parse

    def to_keras(b):
        b = dict(b)
        meta, ids = b.pop("antdt"), b.pop("record_id")
        x, y, w = keras.utils.unpack_x_y_sample_weight(parse(b))
        if not isinstance(x, dict):
            raise TypeError("parse must return the features as a dict (the pipeline adds "
                            f"'record_id' and 'antdt' to it), got {type(x).__name__}")
        check_feature_names(x, "parse returned")
        x = dict(x, record_id=ids, antdt=meta)
        ones = tf.ones(tf.shape(ids), tf.float32)
        return x, y, ones if w is None else tf.cast(w, tf.float32) * ones

    def dataset_fn(input_context):
        del input_context   # shards come from the master, not from a static split
        worker = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(),
                         tf.int64)
        pulled = pull_dataset(master, dataset, batch_size, timeout_ms=timeout_ms,
                              wait_markers=sparse_reports, sparse_reports=sparse_reports,
                              wait_ms=wait_ms, record_format=record_format)
        real = pulled.map(to_keras)
        padding = padding_like(real.element_spec, worker)

        def wait_to_padding(*b):
            # a WAIT marker (no records: the master has nothing for this worker now)
            # trains a padding batch, so the step ends and the chief is not held up
            return tf.cond(tf.shape(b[0]["record_id"])[0] > 0, lambda: b, lambda: padding)

        if sparse_reports:
            real = real.map(wait_to_padding)
        pad = tf.data.Dataset.from_tensors(padding).repeat()
        return real.concatenate(pad)

    return keras.utils.experimental.DatasetCreator(dataset_fn)
