"""The compact training format: fixed-size binary records after a 64-byte header.

Layout (little endian)::

    header (64 bytes): magic b"ADTREC01", version u32, record_bytes u32, num_records u64,
                       num_dense u32, num_sparse u32, crc32 of the bytes before it u32, zero pad
    record i at HEADER_BYTES + i * record_bytes:
                       label f32, dense f32 x num_dense, sparse i64 x num_sparse

Why: a shard is a record range, and this layout makes reading it a single seek — for
numpy here and for ``tf.data.FixedLengthRecordDataset(header_bytes=byte_offset(start))``
on the worker — with no index file and no scan of the records before it.
"""

from __future__ import annotations

import os
import pathlib
import struct
import zlib
from typing import Iterable

import numpy as np

from antdt_tf.data.criteo import NUM_DENSE, NUM_SPARSE, Batch
from antdt_tf.errors import DataError

MAGIC = b"ADTREC01"
VERSION = 1
HEADER_BYTES = 64
_HEADER = struct.Struct("<8sIIQII")   # magic, version, record_bytes, num_records, dense, sparse


def record_dtype(num_dense: int = NUM_DENSE, num_sparse: int = NUM_SPARSE) -> np.dtype:
    return np.dtype([("label", "<f4"), ("dense", "<f4", (num_dense,)),
                     ("sparse", "<i8", (num_sparse,))])


def _header(record_bytes: int, num_records: int, num_dense: int, num_sparse: int) -> bytes:
    head = _HEADER.pack(MAGIC, VERSION, record_bytes, num_records, num_dense, num_sparse)
    head += struct.pack("<I", zlib.crc32(head))
    return head.ljust(HEADER_BYTES, b"\0")


def write_records(path: str | os.PathLike, batches: Iterable[Batch]) -> int:
    """Writes batches to ``path`` (atomically: a temporary file renamed at the end).
    Returns the number of records."""
    path = pathlib.Path(path)
    dtype = record_dtype()
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    with open(tmp, "wb") as f:
        f.write(b"\0" * HEADER_BYTES)
        for b in batches:
            rec = np.empty(len(b), dtype)
            rec["label"], rec["dense"], rec["sparse"] = b.label, b.dense, b.sparse
            f.write(rec.tobytes())
            count += len(b)
        f.seek(0)
        f.write(_header(dtype.itemsize, count, NUM_DENSE, NUM_SPARSE))
    os.replace(tmp, path)
    return count


class RecordFile:
    """A validated compact record file; reads any record range with one seek."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        try:
            size = os.path.getsize(self.path)
            with open(self.path, "rb") as f:
                head = f.read(HEADER_BYTES)
        except OSError as e:
            raise DataError(f"cannot read {self.path}: {e.strerror}") from e
        if len(head) < HEADER_BYTES or not head.startswith(MAGIC):
            raise DataError(f"{self.path} is not an antdt-tf record file (bad magic); convert "
                            "Criteo TSV with `antdt-data --mode=convert`")
        fields = head[:_HEADER.size]
        (crc,) = struct.unpack_from("<I", head, _HEADER.size)
        if zlib.crc32(fields) != crc:
            raise DataError(f"{self.path}: header checksum mismatch (damaged file)")
        _, version, self.record_bytes, self.num_records, self.num_dense, self.num_sparse = \
            _HEADER.unpack(fields)
        if version != VERSION:
            raise DataError(f"{self.path}: format version {version} is not supported (reads {VERSION})")
        self.dtype = record_dtype(self.num_dense, self.num_sparse)
        if self.dtype.itemsize != self.record_bytes:
            raise DataError(f"{self.path}: header says {self.record_bytes}-byte records, the layout "
                            f"gives {self.dtype.itemsize}")
        expected = HEADER_BYTES + self.num_records * self.record_bytes
        if size != expected:
            raise DataError(f"{self.path}: {size} bytes, the header promises {expected} "
                            f"({self.num_records} records): truncated or appended to")

    def byte_offset(self, index: int) -> int:
        return HEADER_BYTES + index * self.record_bytes

    def read(self, start: int, length: int) -> Batch:
        if start < 0 or length < 0 or start + length > self.num_records:
            raise DataError(f"{self.path}: records [{start}, {start + length}) outside "
                            f"[0, {self.num_records})")
        rec = np.fromfile(self.path, dtype=self.dtype, count=length, offset=self.byte_offset(start))
        return Batch(rec["label"].copy(), rec["dense"].copy(), rec["sparse"].copy())
