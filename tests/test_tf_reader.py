"""The worker-side shard reader: TF ops read exactly the records numpy reads, with a
true seek (the format is TFRecord framing at a fixed stride), CRCs checked."""

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


def test_one_trace_serves_every_file_too(tmp_path, record_file):
    """The path is a runtime string tensor as well: two files, one trace."""
    path, f = record_file
    other = tmp_path / "other.adtr"
    records.write_records(other, criteo.generate(criteo.SyntheticSpec(3_000, seed=8)))
    g = records.RecordFile(other)

    @tf.function
    def first_ids(path, start, length):
        return tf.concat([b["sparse"][:, 0] for b in [next(iter(shard_dataset(
            path, start, length, 4_096)))]], 0)

    for p, rf, start, length in [(path, f, 17, 50), (str(other), g, 2_990, 10), (path, f, 0, 1)]:
        got = first_ids(tf.constant(p), tf.constant(start, tf.int64), tf.constant(length, tf.int64))
        assert np.array_equal(got.numpy(), rf.read(start, length).sparse[:, 0])
    assert first_ids.experimental_get_tracing_count() == 1


def test_the_file_is_a_valid_tfrecord_file(record_file):
    path, f = record_file
    raw = tf.concat(list(tf.data.TFRecordDataset(path).batch(8_192)), 0)  # CRCs verified
    assert raw.shape == [f.num_records + 1]
    head = raw[0].numpy()
    assert len(head) == 64 and head.startswith(records.MAGIC)
    assert set(tf.strings.length(raw[1:]).numpy()) == {264}
    got = decode_records(raw[1 + 19_990:])
    assert np.array_equal(got["sparse"], f.read(19_990, 10).sparse)


def _rchar() -> int:
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar"))


def test_reading_a_shard_is_a_true_seek(tmp_path_factory):
    """A 512-record shard at the end of a 200k-record file (56 MB) reads its own bytes,
    not the prefix: rchar (bytes returned by read syscalls of this process) grows by
    < 2 MB around the read (the version-1 reader grew it by the whole file)."""
    path = str(tmp_path_factory.mktemp("big") / "big.adtr")
    n = records.write_records(path, criteo.generate(criteo.SyntheticSpec(200_000, seed=2)))
    assert os.path.getsize(path) > 50e6

    @tf.function
    def checksum(path, start, length):
        total = tf.constant(0, tf.int64)
        it = iter(raw_shard_dataset(path, start, length, 256))
        raw = it.get_next_as_optional()
        while raw.has_value():
            total += tf.reduce_sum(decode_records(raw.get_value())["sparse"][:, 5])
            raw = it.get_next_as_optional()
        return total

    args = lambda s, n: (tf.constant(path), tf.constant(s, tf.int64), tf.constant(n, tf.int64))  # noqa: E731
    checksum(*args(0, 512))                               # trace (and warm up) first
    want = records.RecordFile(path).read(n - 512, 512).sparse[:, 5].sum()
    a = args(n - 512, 512)
    before = _rchar()
    got = checksum(*a).numpy()
    read = _rchar() - before
    assert got == want
    assert 512 * 280 <= read < 2_000_000, read


def test_a_corrupted_payload_fails_the_crc_check(tmp_path):
    path = tmp_path / "d.adtr"
    records.write_records(path, criteo.generate(criteo.SyntheticSpec(2_000, seed=3)))
    raw = bytearray(path.read_bytes())
    raw[80 + 280 * 1_500 + 12 + 100] ^= 0x10            # one payload byte of record 1,500
    path.write_bytes(bytes(raw))
    records.RecordFile(path)          # the header is intact: the numpy side opens the file
    assert len(list(shard_dataset(str(path), 0, 1_500, 256))) == 6    # before it: fine
    assert len(list(shard_dataset(str(path), 1_501, 499, 256))) == 2  # after it: fine
    with pytest.raises(tf.errors.DataLossError):
        list(shard_dataset(str(path), 1_400, 200, 256))
