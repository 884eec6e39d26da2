"""The compact training format (version 2, ``.adtr``): a TFRecord file of fixed-size records.

Layout (little endian). Every record is framed as a TFRecord record::

    length u64 | masked crc32c(length) u32 | payload | masked crc32c(payload) u32

    record 0, bytes [0, 80):  the 64-byte header payload: magic b"ADTREC02", version u32 (2),
                              record_bytes u32 (payload size, 264), num_records u64,
                              num_dense u32, num_sparse u32, crc32 of the bytes before it u32,
                              zero pad
    data record i at HEADER_BYTES + i * RECORD_STRIDE = 80 + 280 * i:
                              a 264-byte payload: label f32, dense f32 x 13, sparse i64 x 26

Why: a shard is a record range, and fixed-size payloads put record ``i`` at a computable
byte offset, so reading a shard is one seek with no index file and no scan of the records
before it — for numpy here (one ``np.fromfile`` at an offset) and for TF on the worker:
the file is a valid TFRecord file, and TF's ``TFRecordDatasetV2`` op takes a start byte
offset and seeks there (``antdt_tf.tf.reader``). (Version 1 used bare fixed-length records,
read in TF by ``FixedLengthRecordDataset``, which *reads* its ``header_bytes`` rather than
seeking: a shard at the end of a 53 MB file cost 53 MB of reads.) The framing also gives
every record a CRC32C that TF verifies on read.

Version-1 files are refused with a message to re-convert them (``antdt-data``).
"""

from __future__ import annotations

import os
import pathlib
import struct
import warnings
import zlib
from typing import Iterable

import google_crc32c
import numpy as np

from antdt_tf.data.criteo import NUM_DENSE, NUM_SPARSE, Batch
from antdt_tf.errors import DataError

MAGIC = b"ADTREC02"
MAGIC_V1 = b"ADTREC01"
VERSION = 2
FRAME_BYTES = 16                                   # u64 length, u32 crc, ..., u32 crc
HEADER_PAYLOAD_BYTES = 64
HEADER_BYTES = HEADER_PAYLOAD_BYTES + FRAME_BYTES  # 80: byte offset of data record 0
_HEADER = struct.Struct("<8sIIQII")   # magic, version, record_bytes, num_records, dense, sparse
_CRC_MASK_DELTA = 0xA282EAD8


if google_crc32c.implementation != "c":   # its pure-Python fallback: far slower
    warnings.warn("google-crc32c has no C extension here: writing record files will be slow")


def masked_crc32c(data) -> int:
    """TFRecord's masked CRC32C of ``data`` (bytes-like)."""
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def record_dtype(num_dense: int = NUM_DENSE, num_sparse: int = NUM_SPARSE) -> np.dtype:
    """The payload of one data record (``record_bytes`` = 264 for Criteo)."""
    return np.dtype([("label", "<f4"), ("dense", "<f4", (num_dense,)),
                     ("sparse", "<i8", (num_sparse,))])


def framed_record_dtype(num_dense: int = NUM_DENSE, num_sparse: int = NUM_SPARSE) -> np.dtype:
    """One data record as stored: TFRecord framing around the payload (``RECORD_STRIDE``)."""
    return np.dtype([("length", "<u8"), ("length_crc", "<u4"), ("label", "<f4"),
                     ("dense", "<f4", (num_dense,)), ("sparse", "<i8", (num_sparse,)),
                     ("crc", "<u4")])


RECORD_BYTES = record_dtype().itemsize              # 264: payload of a data record
RECORD_STRIDE = framed_record_dtype().itemsize      # 280: distance between data records
assert RECORD_STRIDE == RECORD_BYTES + FRAME_BYTES


def _frame(payload: bytes) -> bytes:
    length = struct.pack("<Q", len(payload))
    return (length + struct.pack("<I", masked_crc32c(length)) + payload
            + struct.pack("<I", masked_crc32c(payload)))


def _header(record_bytes: int, num_records: int, num_dense: int, num_sparse: int) -> bytes:
    head = _HEADER.pack(MAGIC, VERSION, record_bytes, num_records, num_dense, num_sparse)
    head += struct.pack("<I", zlib.crc32(head))
    return _frame(head.ljust(HEADER_PAYLOAD_BYTES, b"\0"))


def _framed(b: Batch) -> np.ndarray:
    """``b`` as framed records: numpy fills the fields, then one C CRC32C call per payload."""
    rec = np.empty(len(b), framed_record_dtype())
    rec["length"] = RECORD_BYTES
    rec["length_crc"] = masked_crc32c(struct.pack("<Q", RECORD_BYTES))
    rec["label"], rec["dense"], rec["sparse"] = b.label, b.dense, b.sparse
    payloads = rec.view(np.uint8).reshape(len(b), RECORD_STRIDE)[:, 12:12 + RECORD_BYTES]
    crcs = np.fromiter(map(google_crc32c.value, payloads), np.uint32, len(b))
    rec["crc"] = (((crcs >> np.uint32(15)) | (crcs << np.uint32(17)))
                  + np.uint32(_CRC_MASK_DELTA))                  # uint32 arithmetic wraps
    return rec


def write_records(path: str | os.PathLike, batches: Iterable[Batch],
                  allow_empty: bool = True) -> int:
    """Writes batches to ``path`` atomically: into a new temporary file beside it, renamed
    over ``path`` only when every batch was written — on any error (bad input data
    included: ``batches`` may raise) the temporary file is removed and ``path`` is left as
    it was. ``allow_empty=False``: zero records is a :class:`DataError` too (``path`` kept).
    Returns the number of records."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise DataError(f"cannot write {path}: it is a directory")
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    count = 0
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        raise DataError(f"cannot write {path}: {e.strerror}") from e
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(b"\0" * HEADER_BYTES)
            for b in batches:
                f.write(_framed(b).tobytes())
                count += len(b)
            if not count and not allow_empty:
                raise DataError(f"the input holds no records: {path} was not written")
            f.seek(0)
            f.write(_header(RECORD_BYTES, count, NUM_DENSE, NUM_SPARSE))
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DataError(f"cannot write {path}: {e.strerror or e}") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return count


class RecordFile:
    """A validated compact record file; reads any record range with one seek."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        try:
            size = os.path.getsize(self.path)
            with open(self.path, "rb") as f:
                framed = f.read(HEADER_BYTES)
        except OSError as e:
            raise DataError(f"cannot read {self.path}: {e.strerror}") from e
        if framed.startswith(MAGIC_V1):
            raise DataError(f"{self.path} is a version-1 antdt-tf record file, which this "
                            f"version no longer reads (it reads version {VERSION}: TFRecord "
                            "framing, for a true seek in TF); re-convert it with `antdt-data`")
        head = framed[12:12 + HEADER_PAYLOAD_BYTES]
        if (len(framed) < HEADER_BYTES or framed[:8] != struct.pack("<Q", HEADER_PAYLOAD_BYTES)
                or not head.startswith(MAGIC)):
            raise DataError(f"{self.path} is not an antdt-tf record file (bad magic); convert "
                            "Criteo TSV with `antdt-data --mode=convert`")
        length_crc, = struct.unpack_from("<I", framed, 8)
        payload_crc, = struct.unpack_from("<I", framed, 12 + HEADER_PAYLOAD_BYTES)
        fields = head[:_HEADER.size]
        (crc,) = struct.unpack_from("<I", head, _HEADER.size)
        if (zlib.crc32(fields) != crc or masked_crc32c(framed[:8]) != length_crc
                or masked_crc32c(head) != payload_crc):
            raise DataError(f"{self.path}: header checksum mismatch (damaged file)")
        _, version, self.record_bytes, self.num_records, self.num_dense, self.num_sparse = \
            _HEADER.unpack(fields)
        if version != VERSION:
            raise DataError(f"{self.path}: format version {version} is not supported (reads {VERSION})")
        self.dtype = framed_record_dtype(self.num_dense, self.num_sparse)
        if record_dtype(self.num_dense, self.num_sparse).itemsize != self.record_bytes:
            raise DataError(f"{self.path}: header says {self.record_bytes}-byte records, the layout "
                            f"gives {self.dtype.itemsize - FRAME_BYTES}")
        self.stride = self.dtype.itemsize
        expected = HEADER_BYTES + self.num_records * self.stride
        if size != expected:
            raise DataError(f"{self.path}: {size} bytes, the header promises {expected} "
                            f"({self.num_records} records): truncated or appended to")

    def byte_offset(self, index: int) -> int:
        """Where data record ``index`` (its framing) starts."""
        return HEADER_BYTES + index * self.stride

    def read(self, start: int, length: int) -> Batch:
        """Records ``[start, start + length)``: one seek and one read. Checks each record's
        length field (cheap, vectorized); payload CRCs are checked by TF's reader only."""
        if start < 0 or length < 0 or start + length > self.num_records:
            raise DataError(f"{self.path}: records [{start}, {start + length}) outside "
                            f"[0, {self.num_records})")
        rec = np.fromfile(self.path, dtype=self.dtype, count=length, offset=self.byte_offset(start))
        if len(rec) != length or (rec["length"] != self.record_bytes).any():
            raise DataError(f"{self.path}: records [{start}, {start + length}) have bad framing "
                            "(damaged file)")
        return Batch(rec["label"].copy(), rec["dense"].copy(), rec["sparse"].copy())
