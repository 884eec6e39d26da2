"""A job's data files and their record counts, as the submitter finds them.

The master shards by record position and never reads the data, so what it needs of a
job's data is each file's path and number of records (``JobSpec.data_files``). The
submitter (``antdt-launch``, on the user's machine) counts them once, by format:

- ``adtr``: antdt-tf's compact files (the count is in the header);
- ``tfrecord`` / ``tfrecord_gzip`` / ``tfrecord_zlib``: TFRecord files (what most
  ranking pipelines write), counted from the record framing -- a seek per record for
  uncompressed files, a decompressing pass for compressed ones;
- ``module:Class``: the user's own format; ``Class.count(path)`` (a static or class
  method, or a method of ``Class()``) returns the records of one file. Imported here,
  on the submitter's machine, with the program's code directory on the import path.

Pure Python: no TensorFlow.
"""

from __future__ import annotations

import glob
import gzip
import importlib
import inspect
import os
import re
import struct
import sys
import zlib
from typing import Callable

from antdt_tf.errors import DataError

FORMATS = ("adtr", "tfrecord", "tfrecord_gzip", "tfrecord_zlib")
_USER_FORMAT = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*\Z")


def expand(patterns: list[str]) -> list[str]:
    """Comma-separated paths and globs as absolute file paths, in the order given (a
    glob's matches sorted); DataError for a pattern that matches nothing."""
    out: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise DataError(f"{pattern} matches no file")
        for path in matches:
            if not os.path.isfile(path):
                raise DataError(f"{path} is not a readable file")
            out.append(os.path.abspath(path))
    if len(set(out)) != len(out):
        raise DataError("a data file is named twice (its records would be trained twice)")
    return out


def guess_format(paths: list[str]) -> str:
    """The format the files' names say (``auto``), or DataError asking for one."""
    kinds = {"adtr" if p.endswith(".adtr") else
             "tfrecord" if re.search(r"\.tfrecords?$", p) else
             "tfrecord_gzip" if re.search(r"\.tfrecords?\.gz$", p) else "" for p in paths}
    if len(kinds) != 1 or "" in kinds:
        raise DataError("cannot tell the data's format from the file names (.adtr, "
                        ".tfrecord, .tfrecord.gz): pass --data_format=adtr|tfrecord|"
                        "tfrecord_gzip|tfrecord_zlib|module:Class")
    return kinds.pop()


def count_tfrecord(path: str, compression: str = "") -> int:
    """Records of a TFRecord file, from its framing (length u64, crc u32, data, crc
    u32); DataError for a truncated file."""
    opener: Callable = {"": open, "GZIP": gzip.open}.get(compression)
    try:
        if compression == "ZLIB":
            with open(path, "rb") as f:
                data = zlib.decompress(f.read())
            return _count_frames_bytes(path, data)
        with opener(path, "rb") as f:
            n = 0
            seekable = compression == ""
            size = os.path.getsize(path) if seekable else None
            while True:
                head = f.read(12)
                if not head:
                    return n
                if len(head) < 12:
                    raise DataError(f"{path}: truncated TFRecord (record {n})")
                length, = struct.unpack("<Q", head[:8])
                if seekable:
                    end = f.tell() + length + 4
                    if end > size:
                        raise DataError(f"{path}: truncated TFRecord (record {n})")
                    f.seek(end)
                elif len(f.read(length + 4)) != length + 4:
                    raise DataError(f"{path}: truncated TFRecord (record {n})")
                n += 1
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"cannot read {path} as TFRecord ({compression or 'uncompressed'})"
                        f": {e}") from e


def _count_frames_bytes(path: str, data: bytes) -> int:
    n, at = 0, 0
    while at < len(data):
        if at + 12 > len(data):
            raise DataError(f"{path}: truncated TFRecord (record {n})")
        length, = struct.unpack_from("<Q", data, at)
        at += 12 + length + 4
        if at > len(data):
            raise DataError(f"{path}: truncated TFRecord (record {n})")
        n += 1
    return n


def counter(data_format: str, code_dir: str = "") -> Callable[[str], int]:
    """How to count one file's records in ``data_format``."""
    if data_format == "adtr":
        from antdt_tf.data.records import RecordFile

        return lambda p: RecordFile(p).num_records
    if data_format.startswith("tfrecord"):
        compression = {"tfrecord": "", "tfrecord_gzip": "GZIP",
                       "tfrecord_zlib": "ZLIB"}[data_format]
        return lambda p: count_tfrecord(p, compression)
    if not _USER_FORMAT.match(data_format):
        raise DataError(f"--data_format must be one of {FORMATS} or module:Class, got "
                        f"{data_format!r}")
    module, _, name = data_format.partition(":")
    if code_dir and code_dir not in sys.path:
        sys.path.insert(0, code_dir)
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise DataError(f"--data_format={data_format}: cannot import it: {e}") from e
    raw = inspect.getattr_static(cls, "count", None)
    if raw is None:
        raise DataError(f"--data_format={data_format} has no count(path) (the records "
                        "of one file: the master shards by record position)")
    if isinstance(raw, (staticmethod, classmethod)):
        count = getattr(cls, "count")
    else:
        try:
            count = cls().count
        except Exception as e:  # noqa: BLE001 (the user's class: say what failed)
            raise DataError(f"--data_format={data_format}: {name}() failed: {e}") from e
    return count


def count_files(paths: list[str], data_format: str, code_dir: str = "") -> list[tuple[str, int]]:
    """``[(path, records)]`` of every file; DataError for a file with none or unreadable."""
    count = counter(data_format, code_dir)
    out = []
    for path in paths:
        try:
            n = int(count(path))
        except DataError:
            raise
        except Exception as e:  # noqa: BLE001 (the user's format: say which file)
            raise DataError(f"cannot count the records of {path} ({data_format}): "
                            f"{type(e).__name__}: {e}") from e
        if n < 1:
            raise DataError(f"{path} holds no records ({data_format})")
        out.append((path, n))
    return out
