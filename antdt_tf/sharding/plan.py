"""Shard plans: how a dataset is cut into shards and in which order they are handed out.

A plan is pure geometry, computed on demand: shard ``i`` of an epoch is found by
arithmetic (and a binary search over files), and the shuffled order of an epoch is a
seeded pseudo-random *permutation function* rather than a list. A 1e9-record dataset in
1e6 shards therefore costs a few hundred bytes, not a million Python objects.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import re
import struct
from array import array
from typing import NamedTuple, Sequence

from antdt_tf import limits
from antdt_tf.errors import InvalidRequest, shown

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-/]{0,127}")   # fullmatch
MAX_EPOCHS = limits.MAX_EPOCHS


@dataclasses.dataclass(frozen=True)
class DataFile:
    path: str
    num_records: int


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """What the user registers. Validated on construction (:class:`InvalidRequest`)."""

    name: str
    records_per_shard: int
    num_epochs: int = 1
    num_records: int = 0
    files: tuple[DataFile, ...] = ()
    shuffle: bool = False
    seed: int = 0
    static_workers: int = 0    # > 0: static sharding over worker:0..N-1 (a baseline)
    tail_stealing: bool = False   # idle workers take over the rest of slow workers' leases
    backup_leases: bool = False   # idle workers duplicate the rest of slow workers' leases

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME_RE.fullmatch(self.name):
            raise InvalidRequest(
                f"dataset name {shown(self.name)} is invalid: use 1-{limits.MAX_NAME_CHARS} "
                "characters of [A-Za-z0-9_.-/], starting with a letter or digit")
        name = self.name
        if not 0 < self.records_per_shard <= limits.MAX_RECORDS_PER_EPOCH:
            raise InvalidRequest(
                f"dataset {name}: records_per_shard must be in [1, "
                f"{limits.MAX_RECORDS_PER_EPOCH}], got {self.records_per_shard}")
        if not 0 < self.num_epochs <= MAX_EPOCHS:
            raise InvalidRequest(
                f"dataset {name}: num_epochs must be in [1, {MAX_EPOCHS}], got {self.num_epochs}")
        if self.files and self.num_records:
            raise InvalidRequest(
                f"dataset {name}: give either num_records or files, not both")
        if len(self.files) > limits.MAX_FILES:
            raise InvalidRequest(f"dataset {name}: {len(self.files)} files, at most "
                                 f"{limits.MAX_FILES} allowed")
        if self.files:
            records = shards = 0
            for f in self.files:
                if not f.path:
                    raise InvalidRequest(f"dataset {name}: a file has an empty path")
                if len(f.path) > limits.MAX_PATH_CHARS or "\0" in f.path:
                    raise InvalidRequest(
                        f"dataset {name}: file path {shown(f.path)} is too long (at most "
                        f"{limits.MAX_PATH_CHARS} characters) or holds a NUL character")
                if f.num_records < 0:
                    raise InvalidRequest(
                        f"dataset {name}: file {shown(f.path)} has a negative record count "
                        f"({f.num_records})")
                if f.num_records > limits.MAX_RECORDS_PER_EPOCH:
                    raise InvalidRequest(
                        f"dataset {name}: file {shown(f.path)} has {f.num_records} records; "
                        f"a file holds at most {limits.MAX_RECORDS_PER_EPOCH}")
                records += f.num_records
                shards += -(-f.num_records // self.records_per_shard)
                if records > limits.MAX_RECORDS_PER_EPOCH:
                    break
            if records <= 0:
                raise InvalidRequest(f"dataset {name}: the files hold no records")
        else:
            records = self.num_records
            if records <= 0:
                raise InvalidRequest(f"dataset {name}: num_records must be > 0 (or give "
                                     f"files), got {records}")
            shards = -(-records // self.records_per_shard)
        if records > limits.MAX_RECORDS_PER_EPOCH:
            raise InvalidRequest(
                f"dataset {name}: {records if records < 1 << 63 else 'more'} records per "
                f"epoch; at most {limits.MAX_RECORDS_PER_EPOCH} allowed")
        if not 0 <= self.seed < 2**64:
            raise InvalidRequest(f"dataset {name}: seed must fit in uint64")
        if self.static_workers and (self.tail_stealing or self.backup_leases):
            raise InvalidRequest(f"dataset {name}: static sharding excludes tail "
                                 "stealing and backup leases")
        if self.tail_stealing and self.backup_leases:
            raise InvalidRequest(f"dataset {name}: tail stealing and backup leases "
                                 "exclude each other (take over a lease or duplicate it)")
        if not 0 <= self.static_workers <= limits.MAX_STATIC_WORKERS:
            raise InvalidRequest(f"dataset {name}: static_workers must be in "
                                 f"[0, {limits.MAX_STATIC_WORKERS}], got {self.static_workers}")
        if self.static_workers and shards > limits.MAX_STATIC_SHARDS:
            raise InvalidRequest(
                f"dataset {name}: static sharding keeps every shard of an epoch queued; "
                f"{shards} shards per epoch, at most {limits.MAX_STATIC_SHARDS} allowed "
                "(raise records_per_shard)")


class ShardGeometry(NamedTuple):
    """Where shard ``shard_id`` lives. ``start`` is the global record index."""

    shard_id: int
    start: int
    length: int
    file: str
    file_start: int


class Permutation:
    """A seeded bijection of ``range(n)`` in O(1) memory.

    A balanced Feistel network over the smallest even power of two >= n, with cycle
    walking to stay inside ``range(n)``. Keys come from BLAKE2b of the seed, so the order
    is identical in every process and Python version (a restarted master must
    recompute exactly the order it persisted a cursor into).
    """

    _ROUNDS = 4
    _MASK64 = (1 << 64) - 1

    def __init__(self, n: int, seed: int, epoch: int):
        self.n = n
        bits = max(2, (n - 1).bit_length())
        bits += bits % 2
        self._half = bits // 2
        self._half_mask = (1 << self._half) - 1
        digest = hashlib.blake2b(struct.pack("<QQQ", seed, epoch, n), digest_size=8 * self._ROUNDS,
                                 person=b"antdt-shards").digest()
        self._keys = struct.unpack(f"<{self._ROUNDS}Q", digest)

    def _round(self, value: int, key: int) -> int:
        x = (value ^ key) * 0x9E3779B97F4A7C15 & self._MASK64
        x ^= x >> 29
        x = x * 0xBF58476D1CE4E5B9 & self._MASK64
        x ^= x >> 32
        return x & self._half_mask

    def _encrypt(self, x: int) -> int:
        left, right = x >> self._half, x & self._half_mask
        for key in self._keys:
            left, right = right, left ^ self._round(right, key)
        return (left << self._half) | right

    def _decrypt(self, x: int) -> int:
        left, right = x >> self._half, x & self._half_mask
        for key in reversed(self._keys):
            left, right = right ^ self._round(left, key), left
        return (left << self._half) | right

    def __call__(self, position: int) -> int:
        x = self._encrypt(position)
        while x >= self.n:  # cycle walking: expected < 4 steps
            x = self._encrypt(x)
        return x

    def inverse(self, value: int) -> int:
        x = self._decrypt(value)
        while x >= self.n:
            x = self._decrypt(x)
        return x


class _Identity:
    def __init__(self, n):
        self.n = n

    def __call__(self, position):
        return position

    def inverse(self, value):
        return value


class ShardPlan:
    """Geometry and per-epoch order of a dataset's shards."""

    def __init__(self, spec: DatasetSpec):
        self.spec = spec
        rps = spec.records_per_shard
        files: Sequence[DataFile] = spec.files or (DataFile("", spec.num_records),)
        # Cumulative shard and record counts per file: two int64 arrays, 16 bytes a file.
        self._paths = [f.path for f in files]
        self._shard_ends = array("q")
        self._record_starts = array("q")
        shards = records = 0
        for f in files:
            self._record_starts.append(records)
            shards += -(-f.num_records // rps)
            records += f.num_records
            self._shard_ends.append(shards)
        self._file_records = array("q", (f.num_records for f in files))
        self.num_shards = shards
        self.num_records = records

    def geometry(self, shard_id: int) -> ShardGeometry:
        if not 0 <= shard_id < self.num_shards:
            raise InvalidRequest(
                f"dataset {self.spec.name}: shard {shard_id} out of range [0, {self.num_shards})")
        f = bisect.bisect_right(self._shard_ends, shard_id)
        first_shard = self._shard_ends[f - 1] if f else 0
        rps = self.spec.records_per_shard
        file_start = (shard_id - first_shard) * rps
        length = min(rps, self._file_records[f] - file_start)
        return ShardGeometry(shard_id, self._record_starts[f] + file_start, length,
                             self._paths[f], file_start)

    def shard_length(self, shard_id: int) -> int:
        if len(self._paths) == 1 and 0 <= shard_id < self.num_shards:  # the common, hot case
            rps = self.spec.records_per_shard
            return min(rps, self.num_records - shard_id * rps)
        return self.geometry(shard_id).length

    def order(self, epoch: int):
        """The permutation mapping issue position -> shard id for ``epoch``."""
        if not self.spec.shuffle:
            return _Identity(self.num_shards)
        return Permutation(self.num_shards, self.spec.seed, epoch)
