"""Reading a shard on the worker with TF ops only, with a true seek.

``shard_dataset(path, start, length, batch_size)`` builds a ``tf.data`` pipeline over
records ``[start, start + length)`` of a compact record file (``antdt_tf.data.records``,
version 2: a TFRecord file whose data records all have a 264-byte payload, so record ``i``
is framed at byte ``HEADER_BYTES + i * RECORD_STRIDE = 80 + 280 * i``).

The source is TF's ``TFRecordDatasetV2`` op with its ``byte_offsets`` input (which the
public ``tf.data.TFRecordDataset`` does not expose) set to that offset: the reader seeks
there instead of reading the bytes before it, so a shard costs its own records (in
reads of at most 256 KiB) wherever it sits in the file (measured: ~144 KB of reads for a
512-record shard at the end of a 56 MB file; ``FixedLengthRecordDataset`` with
``header_bytes``, the version-1 reader, read all 53 MB before such a shard). TF verifies each record's CRC32C on the way
(``DataLossError`` on a damaged record). Then ``take(length)``, batch, decode.

``path``, ``start`` and ``length`` may all be tensors, so one traced ``tf.function``
serves every shard of every file without retracing.
"""

from __future__ import annotations

import tensorflow as tf

from antdt_tf.data.criteo import NUM_DENSE, NUM_SPARSE
from antdt_tf.data.records import HEADER_BYTES, RECORD_BYTES, RECORD_STRIDE  # noqa: F401

_DENSE_END = 4 + 4 * NUM_DENSE
_READ_BUFFER_BYTES = 256 * 1024   # tf.data.TFRecordDataset's default
_ELEMENT_SPEC = tf.TensorSpec([], tf.string)
# TF 2.21's TFRecordDatasetV2 kernel serializes itself without its byte_offsets input
# (MakeIterator fails: "3 inputs specified of 4 inputs"), and tf.data serializes a
# pipeline to apply its default graph rewrites when an iterator is made. Without those
# rewrites (none matters for source -> take -> batch) it is never serialized; works in
# eager, in tf.function and inside flat_map (tested). Anything else that serializes the
# dataset graph (e.g. tf.data service) would presumably hit the same bug.
_OPTIONS = tf.data.Options()
_OPTIONS.experimental_optimization.apply_default_optimizations = False


def decode_records(raw: tf.Tensor) -> dict:
    """Decodes a batch of raw records (a string tensor of shape [n], 264-byte payloads)
    into ``{"label": f32[n], "dense": f32[n,13], "sparse": i64[n,26]}``."""
    b = tf.io.decode_raw(raw, tf.uint8)
    b = tf.reshape(b, [-1, RECORD_BYTES])
    label = tf.bitcast(tf.reshape(b[:, :4], [-1, 4]), tf.float32)
    dense = tf.bitcast(tf.reshape(b[:, 4:_DENSE_END], [-1, NUM_DENSE, 4]), tf.float32)
    sparse = tf.bitcast(tf.reshape(b[:, _DENSE_END:], [-1, NUM_SPARSE, 8]), tf.int64)
    return {"label": label, "dense": dense, "sparse": sparse}


def records_from(path, start, buffer_bytes=_READ_BUFFER_BYTES) -> tf.data.Dataset:
    """The raw payloads of data records ``start, start + 1, ...`` of ``path`` to the end of
    the file, read from a seek to record ``start`` (CRCs verified) in reads of
    ``buffer_bytes``."""
    offset = HEADER_BYTES + tf.cast(start, tf.int64) * RECORD_STRIDE
    variant = tf.raw_ops.TFRecordDatasetV2(
        filenames=tf.reshape(tf.convert_to_tensor(path, tf.string), [1]),
        compression_type=tf.constant("", tf.string),
        buffer_size=tf.cast(buffer_bytes, tf.int64),
        byte_offsets=tf.reshape(offset, [1]))
    return tf.data.experimental.from_variant(variant, _ELEMENT_SPEC).with_options(_OPTIONS)


def raw_shard_dataset(path, start, length, batch_size: int) -> tf.data.Dataset:
    """Batches of raw records ``[start, start + length)`` of ``path``; decode each batch
    with :func:`decode_records` (decoding in the consumer is cheaper per shard than a
    ``map`` stage: one iterator fewer to build for every shard)."""
    length = tf.cast(length, tf.int64)
    # a read buffer no larger than the shard: a small shard reads little past its end
    buffer_bytes = tf.clip_by_value(length * RECORD_STRIDE, 4096, _READ_BUFFER_BYTES)
    return records_from(path, start, buffer_bytes).take(length).batch(batch_size)


def shard_dataset(path, start, length, batch_size: int) -> tf.data.Dataset:
    """The records ``[start, start + length)`` of ``path``, decoded, in batches of
    ``batch_size`` (the last one may be smaller)."""
    return raw_shard_dataset(path, start, length, batch_size).map(decode_records)
