"""A job's data as the submitter counts it (antdt_tf.data.files): the master shards by
record position, so each file's count must be exact, and bad input is refused."""

import gzip
import zlib

import pytest

from antdt_tf.data import files
from antdt_tf.data.records import masked_crc32c
from antdt_tf.errors import DataError


def write_tfrecord(path, payloads, compress=None):
    out = b""
    for p in payloads:
        head = len(p).to_bytes(8, "little")
        out += (head + masked_crc32c(head).to_bytes(4, "little") + p
                + masked_crc32c(p).to_bytes(4, "little"))
    path.write_bytes(gzip.compress(out) if compress == "gzip" else
                     zlib.compress(out) if compress == "zlib" else out)


@pytest.mark.parametrize("fmt,compress", [("tfrecord", None), ("tfrecord_gzip", "gzip"),
                                          ("tfrecord_zlib", "zlib")])
def test_tfrecord_files_are_counted_from_their_framing(tmp_path, fmt, compress):
    path = tmp_path / "a.tfrecord"
    write_tfrecord(path, [b"x" * (k % 97) for k in range(1234)], compress)
    assert files.count_files([str(path)], fmt) == [(str(path), 1234)]


def test_a_truncated_file_or_an_empty_one_is_refused(tmp_path):
    path = tmp_path / "a.tfrecord"
    write_tfrecord(path, [b"abc"] * 10)
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(DataError, match="truncated TFRecord"):
        files.count_files([str(path)], "tfrecord")
    empty = tmp_path / "e.tfrecord"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match="holds no records"):
        files.count_files([str(empty)], "tfrecord")


def test_globs_keep_order_and_a_file_named_twice_is_refused(tmp_path):
    for name in ("b.tfrecord", "a.tfrecord"):
        write_tfrecord(tmp_path / name, [b"1"])
    got = files.expand([str(tmp_path / "*.tfrecord")])
    assert got == [str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord")]
    with pytest.raises(DataError, match="named twice"):
        files.expand([str(tmp_path / "*.tfrecord"), str(tmp_path / "a.tfrecord")])
    with pytest.raises(DataError, match="matches no file"):
        files.expand([str(tmp_path / "*.csv")])


def test_the_format_comes_from_the_names_or_is_asked_for(tmp_path):
    assert files.guess_format(["x/a.tfrecord", "x/b.tfrecords"]) == "tfrecord"
    assert files.guess_format(["x/a.tfrecord.gz"]) == "tfrecord_gzip"
    with pytest.raises(DataError, match="--data_format"):
        files.guess_format(["x/a.csv"])
    with pytest.raises(DataError, match="--data_format"):
        files.guess_format(["x/a.tfrecord", "x/b.adtr"])


def test_a_users_own_format_counts_its_files(tmp_path):
    (tmp_path / "myformat.py").write_text(
        "class Lines:\n"
        "    def count(self, path):\n"
        "        return sum(1 for _ in open(path))\n"
        "class NoCount:\n    pass\n")
    data = tmp_path / "d.txt"
    data.write_text("a\nb\nc\n")
    assert files.count_files([str(data)], "myformat:Lines", str(tmp_path)) == [(str(data), 3)]
    with pytest.raises(DataError, match="has no count"):
        files.count_files([str(data)], "myformat:NoCount", str(tmp_path))
    with pytest.raises(DataError, match="cannot import"):
        files.count_files([str(data)], "nosuchmodule:X", str(tmp_path))
    with pytest.raises(DataError, match="--data_format must be one of"):
        files.count_files([str(data)], "csv", str(tmp_path))
