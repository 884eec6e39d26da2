"""Training data: the Criteo display-ads format, a synthetic generator with learnable
signal, and the compact fixed-length record format trainers read shards from.

Purpose: a shard handed out by the master is a record range; the worker must read it
without scanning the records before it. The compact format (``records.py``) is a
TFRecord file of fixed-size records after a fixed-size header record, so record ``i``
starts at byte ``HEADER_BYTES + i * RECORD_STRIDE`` (80 + 280·i) — an O(1) seek for
numpy and for TF's ``TFRecordDatasetV2`` op (``byte_offsets``) on the worker.

numpy (and ``google-crc32c`` for the TFRecord checksums); imports no TensorFlow (the TF
readers live in the integration layer).
"""
