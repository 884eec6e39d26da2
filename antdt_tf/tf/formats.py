"""Record formats: how a worker reads the records of one shard and decodes a batch.

A shard is a record range ``[start, start + length)`` of one file (the master's
``DataFile(path, num_records)``); a format turns it into batches of raw records
(``read``) and a batch of raw records into a dict of feature tensors (``decode``). The
pull pipeline (:func:`antdt_tf.tf.pull.pull_dataset`) calls both on the worker, inside
one traced function for every shard, so ``path``, ``start`` and ``length`` are tensors.

Built in:

- :data:`COMPACT` — the project's compact format (``.adtr``, written by ``antdt-data``):
  fixed-size records, so a shard is one seek (:mod:`antdt_tf.tf.reader`). Decodes to
  ``{"label": f32[n], "dense": f32[n,13], "sparse": i64[n,26]}``.
- :class:`TFRecordExamples` — TFRecord files of serialized ``tf.train.Example`` (what
  most recommendation pipelines already write), decoded with ``tf.io.parse_example`` and
  the user's feature spec. TFRecord records have no fixed size, so a shard at record
  ``start`` reads (and drops) the ``start`` records before it: write files of a few
  hundred thousand records each (every file is a ``DataFile``) so the cost stays bounded.

A format of one's own: subclass :class:`RecordFormat`; ``read`` must yield exactly the
``length`` records from ``start`` in file order (the master counts records by
position, so a format that skips or repeats records breaks exactly-once).
"""

from __future__ import annotations

import tensorflow as tf

from antdt_tf.tf.reader import decode_records, raw_shard_dataset


class RecordFormat:
    """How to read a shard's records and decode them (subclass both methods)."""

    def read(self, path, start, length, batch_size) -> tf.data.Dataset:
        """Batches of exactly ``batch_size`` raw records (``tf.string [n]``, only the
        last may be smaller) of the records ``[start, start + length)`` of ``path``, in
        file order: a record's id is its batch's index times ``batch_size`` plus its
        place in the batch."""
        raise NotImplementedError

    def decode(self, raw) -> dict:
        """A batch of raw records (``tf.string [n]``, ``n`` may be 0) as a dict of
        tensors whose first dimension is ``n``."""
        raise NotImplementedError


class CompactRecords(RecordFormat):
    """The ``.adtr`` format (``antdt_tf.data.records``): one seek per shard."""

    def read(self, path, start, length, batch_size) -> tf.data.Dataset:
        return raw_shard_dataset(path, start, length, batch_size)

    def decode(self, raw) -> dict:
        return decode_records(raw)


COMPACT = CompactRecords()


class TFRecordExamples(RecordFormat):
    """TFRecord files of ``tf.train.Example``.

    Args:
      features: the ``tf.io.parse_example`` spec, e.g.
        ``{"label": tf.io.FixedLenFeature([], tf.float32),
        "user": tf.io.FixedLenFeature([], tf.int64)}``. ``VarLenFeature`` columns decode
        to ``tf.sparse.SparseTensor`` (densify them in your ``parse`` function if the
        model wants dense input).
      compression: ``""``, ``"GZIP"`` or ``"ZLIB"``.
    """

    def __init__(self, features: dict, compression: str = ""):
        if not features:
            raise ValueError("TFRecordExamples needs the features to parse (a "
                             "tf.io.parse_example spec)")
        if compression not in ("", "GZIP", "ZLIB"):
            raise ValueError(f"compression must be '', 'GZIP' or 'ZLIB', got {compression!r}")
        self.features = dict(features)
        self.compression = compression

    def read(self, path, start, length, batch_size) -> tf.data.Dataset:
        records = tf.data.TFRecordDataset(path, compression_type=self.compression)
        return records.skip(tf.cast(start, tf.int64)).take(tf.cast(length, tf.int64)).batch(
            batch_size)

    def decode(self, raw) -> dict:
        return tf.io.parse_example(raw, self.features)

    @staticmethod
    def count(path: str, compression: str = "") -> int:
        """The number of records in a TFRecord file (reads it once): the
        ``num_records`` of its ``DataFile``."""
        return int(tf.data.TFRecordDataset(path, compression_type=compression).reduce(
            tf.constant(0, tf.int64), lambda n, _: n + 1).numpy())
