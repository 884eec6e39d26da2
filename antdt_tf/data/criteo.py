"""The Criteo display-ads TSV format and a synthetic generator for it.

A Criteo line is ``label \\t I1..I13 \\t C1..C26``: a 0/1 click label, 13 integer count
features and 26 categorical features as 8-digit hex hashes; any feature may be empty
(missing). The generator writes the same format with *learnable* signal: the label is
drawn from a hidden logistic model over the features, categorical ids are
Zipf-distributed over vocabularies from hundreds to millions, and everything is
deterministic from a seed, so tests, demos and benchmarks train on data whose quality
ceiling is known.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Iterator

import numpy as np

from antdt_tf.errors import InvalidRequest

NUM_DENSE = 13
NUM_SPARSE = 26
# Vocabulary sizes of the 26 categorical features: hundreds to millions, like Criteo's.
DEFAULT_VOCAB_SIZES = (
    1_460, 583, 10_131_227, 2_202_608, 305, 24, 12_517, 633, 3, 93_145, 5_683, 8_351_593,
    3_194, 27, 14_992, 5_461_306, 10, 5_652, 2_173, 4, 7_046_547, 18, 15, 286_181, 105, 142_572,
)


@dataclasses.dataclass(frozen=True)
class SyntheticSpec:
    """What to generate. Validated on construction."""

    num_records: int
    seed: int = 0
    vocab_sizes: tuple[int, ...] = DEFAULT_VOCAB_SIZES
    zipf_a: float = 1.2          # id skew: larger = a few hot ids dominate
    missing_rate: float = 0.05   # share of empty feature values
    signal_ids: int = 64         # hot ids per feature that carry weight in the hidden model

    def __post_init__(self):
        if self.num_records <= 0:
            raise InvalidRequest(f"num_records must be > 0, got {self.num_records}")
        if len(self.vocab_sizes) != NUM_SPARSE or min(self.vocab_sizes) < 2:
            raise InvalidRequest(f"need {NUM_SPARSE} vocabulary sizes >= 2")
        if self.zipf_a <= 1:
            raise InvalidRequest("zipf_a must be > 1")
        if not 0 <= self.missing_rate < 1:
            raise InvalidRequest("missing_rate must be in [0, 1)")


@dataclasses.dataclass
class Batch:
    """Columns of a block of records. ``dense`` is -1 where missing; ``sparse`` holds
    the categorical ids (the integer value of the hex hash), -1 where missing."""

    label: np.ndarray    # (n,) float32
    dense: np.ndarray    # (n, 13) float32
    sparse: np.ndarray   # (n, 26) int64
    probability: np.ndarray | None = None  # the hidden model's click probability (generated data)

    def __len__(self):
        return len(self.label)


class _HiddenModel:
    """The logistic model the labels come from (fixed by the seed)."""

    def __init__(self, spec: SyntheticSpec):
        rng = np.random.default_rng([spec.seed, 1])
        self.dense_w = rng.normal(0, 0.3, NUM_DENSE)
        # weights of the `signal_ids` hottest ids of each feature; other ids weigh 0
        self.sparse_w = rng.normal(0, 0.35, (NUM_SPARSE, spec.signal_ids))
        self.bias = -1.9  # ≈ 25 % clicks, like Criteo's ~26 %

    def logit(self, dense: np.ndarray, ranks: np.ndarray, signal_ids: int) -> np.ndarray:
        d = np.log1p(np.maximum(dense, 0)) - 1.0
        hot = ranks < signal_ids
        w = self.sparse_w[np.arange(NUM_SPARSE)[None, :], np.minimum(ranks, signal_ids - 1)]
        return self.bias + d @ self.dense_w + np.where(hot, w, 0.0).sum(axis=1)


BLOCK_RECORDS = 65_536     # records drawn from one seed (a block of generate())


def _id_of(rank: np.ndarray, feature: int, vocab: int, seed: int) -> np.ndarray:
    """Maps a popularity rank to a stable 32-bit hash id (what Criteo ships as hex)."""
    x = (rank.astype(np.uint64) + np.uint64(feature * 1_000_003 + seed * 7919)) * np.uint64(
        0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(29)
    return (x & np.uint64(0xFFFFFFFF)).astype(np.int64)


def generate(spec: SyntheticSpec, block: int = BLOCK_RECORDS, start: int = 0
             ) -> Iterator[Batch]:
    """Yields the dataset in blocks; identical for identical specs. ``start``: from the
    block that holds that record on (each block is drawn from its own seed, so the ones
    before need not be made)."""
    model = _HiddenModel(spec)
    for first in range(start - start % block, spec.num_records, block):
        n = min(block, spec.num_records - first)
        rng = np.random.default_rng([spec.seed, 2, first])
        dense = np.floor(rng.lognormal(1.0, 1.3, (n, NUM_DENSE))).astype(np.float32)
        ranks = np.empty((n, NUM_SPARSE), dtype=np.int64)
        for f, vocab in enumerate(spec.vocab_sizes):
            r = rng.zipf(spec.zipf_a, n) - 1
            ranks[:, f] = np.where(r < vocab, r, rng.integers(0, vocab, n))
        p = 1 / (1 + np.exp(-model.logit(dense, ranks, spec.signal_ids)))
        label = (rng.random(n) < p).astype(np.float32)
        sparse = np.stack([_id_of(ranks[:, f], f, v, spec.seed)
                           for f, v in enumerate(spec.vocab_sizes)], axis=1)
        dense_missing = rng.random((n, NUM_DENSE)) < spec.missing_rate
        sparse_missing = rng.random((n, NUM_SPARSE)) < spec.missing_rate
        dense[dense_missing] = -1
        sparse[sparse_missing] = -1
        yield Batch(label, dense, sparse, p.astype(np.float32))


def records_between(spec: SyntheticSpec, lo: int, hi: int) -> Iterator[Batch]:
    """Records ``lo`` to ``hi`` of the dataset, in blocks: a training part and a
    held-out part of one dataset (one hidden model) without holding it all."""
    first = lo - lo % BLOCK_RECORDS
    for b in generate(spec, BLOCK_RECORDS, start=lo):
        a, z = max(lo - first, 0), min(hi - first, len(b))
        if a < z:
            yield Batch(b.label[a:z], b.dense[a:z], b.sparse[a:z])
        first += len(b)
        if first >= hi:
            return


def write_tsv(path: str | os.PathLike, batches) -> int:
    """Writes batches as Criteo TSV. Returns the number of records."""
    count = 0
    with open(path, "w") as f:
        for b in batches:
            for i in range(len(b)):
                dense = "\t".join("" if v < 0 else str(int(v)) for v in b.dense[i])
                sparse = "\t".join("" if v < 0 else f"{v:08x}" for v in b.sparse[i])
                f.write(f"{int(b.label[i])}\t{dense}\t{sparse}\n")
            count += len(b)
    return count


MAX_LINE_BYTES = 1 << 16     # a Criteo line is a few hundred bytes
_TEXT_BYTES = bytes(range(0x20, 0x7F)) + b"\t\r\n"
FIELD_NAMES = ("label", *(f"I{i}" for i in range(1, NUM_DENSE + 1)),
               *(f"C{i}" for i in range(1, NUM_SPARSE + 1)))


def _bad_field(fields: list[str]) -> str:
    """Which field of a line that did not parse is wrong, and why (bounded: never the
    whole value)."""
    for column, (name, value) in enumerate(zip(FIELD_NAMES, fields), 1):
        shown = repr(value[:24] + ("..." if len(value) > 24 else ""))
        where = f"field {name} (column {column})"
        if name == "label":
            try:
                ok = int(value) in (0, 1)
            except ValueError:
                ok = False
            if not ok:
                return f"{where}: {shown} is not 0 or 1"
        elif value:
            try:
                float(value) if name.startswith("I") else int(value, 16)
            except ValueError:
                kind = "a number" if name.startswith("I") else "a hex hash"
                return f"{where}: {shown} is not {kind}"
    return "a field does not parse"


def read_tsv(path: str | os.PathLike, block: int = 65_536) -> Iterator[Batch]:
    """Parses Criteo TSV into batches. Malformed lines (binary data included) raise
    :class:`InvalidRequest` naming the file, line and field."""
    columns = 1 + NUM_DENSE + NUM_SPARSE
    try:
        f = open(path, "rb")
    except OSError as e:
        raise InvalidRequest(f"cannot read {path}: {e.strerror}") from e
    with f:
        labels, dense, sparse = [], [], []
        lineno = 0
        while True:
            try:
                raw = f.readline(MAX_LINE_BYTES + 1)
            except OSError as e:     # e.g. a directory
                raise InvalidRequest(f"cannot read {path}: {e.strerror}") from e
            if not raw:
                break
            lineno += 1
            if len(raw) > MAX_LINE_BYTES:
                raise InvalidRequest(f"{path}:{lineno}: line longer than {MAX_LINE_BYTES} "
                                     "bytes: not Criteo TSV (binary data?)")
            odd = raw.translate(None, _TEXT_BYTES)
            if odd:
                raise InvalidRequest(f"{path}:{lineno}: byte 0x{odd[0]:02x} at column "
                                     f"{raw.index(odd[0]) + 1} is not printable ASCII: not "
                                     "Criteo TSV (binary data?)")
            line = raw.decode("ascii")
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) != columns:
                raise InvalidRequest(f"{path}:{lineno}: expected {columns} tab-separated fields "
                                     f"(label, {NUM_DENSE} integers, {NUM_SPARSE} hex), got "
                                     f"{len(fields)}")
            try:
                label = int(fields[0])
                if label not in (0, 1):
                    raise ValueError("label must be 0 or 1")
                d = [float(v) if v else -1.0 for v in fields[1:1 + NUM_DENSE]]
                s = [int(v, 16) if v else -1 for v in fields[1 + NUM_DENSE:]]
            except ValueError:
                raise InvalidRequest(f"{path}:{lineno}: {_bad_field(fields)}") from None
            labels.append(label)
            dense.append(d)
            sparse.append(s)
            if len(labels) == block:
                yield Batch(np.array(labels, np.float32), np.array(dense, np.float32),
                            np.array(sparse, np.int64))
                labels, dense, sparse = [], [], []
        if labels:
            yield Batch(np.array(labels, np.float32), np.array(dense, np.float32),
                        np.array(sparse, np.int64))
