"""The worker-side shard reader: TF ops read exactly the records numpy reads."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import tensorflow as tf  # noqa: E402  (the [tf] extra; `make install` installs it)

from antdt_tf.data import criteo, records  # noqa: E402
from antdt_tf.tf.reader import decode_records, raw_shard_dataset, shard_dataset  # noqa: E402


@pytest.fixture(scope="module")
def record_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("d") / "d.adtr"
    records.write_records(path, criteo.generate(criteo.SyntheticSpec(20_000, seed=5)))
    return str(path), records.RecordFile(path)


@pytest.mark.parametrize("start,length", [(0, 512), (19_000, 1_000), (12_345, 777), (19_999, 1)])
def test_shard_dataset_reads_exactly_the_range(record_file, start, length):
    path, f = record_file
    got = list(shard_dataset(path, start, length, 256))
    want = f.read(start, length)
    assert [len(b["label"]) for b in got] == [256] * (length // 256) + (
        [length % 256] if length % 256 else [])
    assert np.array_equal(np.concatenate([b["sparse"] for b in got]), want.sparse)
    assert np.array_equal(np.concatenate([b["dense"] for b in got]), want.dense)
    assert np.array_equal(np.concatenate([b["label"] for b in got]), want.label)


def test_one_trace_serves_every_shard(record_file):
    path, f = record_file

    @tf.function
    def checksum(start, length):
        total = tf.constant(0, tf.int64)
        it = iter(raw_shard_dataset(path, start, length, 128))
        raw = it.get_next_as_optional()
        while raw.has_value():
            total += tf.reduce_sum(decode_records(raw.get_value())["sparse"][:, 3])
            raw = it.get_next_as_optional()
        return total

    for start, length in [(0, 300), (5_000, 4_096), (19_900, 100)]:
        got = checksum(tf.constant(start, tf.int64), tf.constant(length, tf.int64))
        assert got.numpy() == f.read(start, length).sparse[:, 3].sum()
    assert checksum.experimental_get_tracing_count() == 1
