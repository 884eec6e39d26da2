"""Synthetic click logs as TFRecord files of ``tf.train.Example`` (``user``, ``item``,
``rid`` -- the record's own id -- and ``label``), the data ``keras_examples.ranker``
trains on: a click when user and item share parity, so a model can learn it::

    python -m keras_examples.clicks --out=/shared/clicks --files=4 --records_per_file=25000

Encoded here, without TensorFlow (the Example and TFRecord wire formats are public).
"""

from __future__ import annotations

import argparse
import pathlib


def write_examples(path, first_rid: int, count: int, seed: int = 0) -> None:
    """``count`` serialized ``tf.train.Example`` records (rid ``first_rid``...) in a TFRecord
    file, with a learnable label: a click when user and item share parity. Encoded here
    (the Example and TFRecord wire formats are public), so a test need not import
    TensorFlow to write its data."""
    import numpy as np

    from antdt_tf.data.records import masked_crc32c

    rng = np.random.default_rng(seed)
    users, items = rng.integers(0, 1000, count), rng.integers(0, 1000, count)
    with open(path, "wb") as f:
        for k in range(count):
            label = float((users[k] + items[k]) % 2 == 0)
            payload = _example({"user": int(users[k]), "item": int(items[k]),
                                "rid": first_rid + k, "label": label})
            head = len(payload).to_bytes(8, "little")
            f.write(head + masked_crc32c(head).to_bytes(4, "little") + payload
                    + masked_crc32c(payload).to_bytes(4, "little"))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:         # a length-delimited field
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _example(values: dict) -> bytes:
    """Example{features: Features{feature: map<string, Feature>}}; Feature's float_list
    is field 2 (packed floats), int64_list field 3 (packed varints)."""
    import struct

    entries = b""
    for key, v in values.items():
        if isinstance(v, float):
            feature = _field(2, _field(1, struct.pack("<f", v)))
        else:
            feature = _field(3, _field(1, _varint(v)))
        entries += _field(1, _field(1, key.encode()) + _field(2, feature))
    return _field(1, entries)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("::")[0])
    ap.add_argument("--out", required=True, help="directory to write part-K.tfrecord into")
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--records_per_file", type=int, default=25_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.files < 1 or args.records_per_file < 1:
        ap.error("--files and --records_per_file must be >= 1")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for k in range(args.files):
        path = out / f"part-{k}.tfrecord"
        write_examples(path, k * args.records_per_file, args.records_per_file,
                       seed=args.seed + k)
        print(f"wrote {args.records_per_file:,} examples to {path}")


if __name__ == "__main__":
    main()
