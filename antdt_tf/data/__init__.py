"""Training data: the Criteo display-ads format, a synthetic generator with learnable
signal, and the compact fixed-length record format trainers read shards from.

Purpose: a shard handed out by the master is a record range; the worker must read it
without scanning the records before it. The compact format (``records.py``) has
fixed-size records after a fixed-size header, so record ``i`` starts at byte
``HEADER_BYTES + i * record_bytes`` — an O(1) seek for TF's
``FixedLengthRecordDataset`` as well as for numpy.

Pure numpy; imports no TensorFlow (the TF readers live in the integration layer).
"""
