"""Criteo format, synthetic generator and the compact record format (real files)."""

import pathlib
import subprocess
import sys

import numpy as np
import pytest

from antdt_tf.data import criteo, records
from antdt_tf.data.metrics import auc
from antdt_tf.errors import DataError, InvalidRequest

DATA_BIN = str(pathlib.Path(sys.executable).parent / "antdt-data")




def test_auc_matches_pair_counting_with_ties():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 300)
    s = rng.integers(0, 20, 300).astype(float)   # many ties
    pairs = [(a, b) for a in s[y == 1] for b in s[y == 0]]
    expect = np.mean([1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs])
    assert auc(y, s) == pytest.approx(expect)
    assert auc(np.ones(3), np.arange(3)) != auc(np.ones(3), np.arange(3))   # NaN: one class


@pytest.fixture(scope="module")
def data():
    spec = criteo.SyntheticSpec(60_000, seed=3)
    batches = list(criteo.generate(spec, block=25_000))
    cat = lambda name: np.concatenate([getattr(b, name) for b in batches])  # noqa: E731
    return spec, batches, cat("label"), cat("dense"), cat("sparse"), cat("probability")


def test_generation_is_deterministic_and_seed_dependent(data):
    spec, batches, label, dense, sparse, _ = data
    again = list(criteo.generate(spec, block=25_000))
    assert all(np.array_equal(a.sparse, b.sparse) and np.array_equal(a.label, b.label)
               for a, b in zip(batches, again))
    other = next(criteo.generate(criteo.SyntheticSpec(60_000, seed=4), block=25_000))
    assert not np.array_equal(other.sparse, batches[0].sparse)


def test_generated_data_looks_like_criteo_and_carries_learnable_signal(data):
    spec, _, label, dense, sparse, prob = data
    assert 0.18 < label.mean() < 0.32                       # Criteo-like click rate
    assert 0.02 < (dense == -1).mean() < 0.08 and 0.02 < (sparse == -1).mean() < 0.08
    present = sparse >= 0
    assert (sparse[present] < 2**32).all()                   # Criteo's 8-digit hex hashes
    # Zipf over each feature's vocabulary: one id per popularity rank (no two ranks
    # hash alike), never more ids than the vocabulary — a small one is used whole
    # here; in a huge one the hottest id takes P(rank 0) = 1/zeta(a) of the values
    a = spec.zipf_a
    zeta = (np.arange(1, 10**6, dtype=np.float64) ** -a).sum() + 1e6 ** (1 - a) / (a - 1)
    hottest = []
    for f, vocab in enumerate(spec.vocab_sizes):
        ids, counts = np.unique(sparse[present[:, f], f], return_counts=True)
        hottest.append(ids[counts.argmax()])
        assert len(ids) <= vocab, (f, len(ids), vocab)
        if vocab <= 700:
            assert len(ids) == vocab, (f, len(ids), vocab)
        if vocab >= 100_000:
            assert counts.max() / counts.sum() == pytest.approx(1 / zeta, abs=0.015), f
    assert len(set(hottest)) == criteo.NUM_SPARSE            # ids are per feature
    assert len(np.unique(sparse[:, 2])) > 5_000                # a huge, long-tailed vocabulary
    assert auc(label, prob) > 0.75                           # the hidden model explains labels
    # learnable from the data alone: per-id click rates of one hot feature, fitted on
    # the first half, rank the second half far better than chance
    train, test = slice(0, 30_000), slice(30_000, None)
    score = np.zeros(len(label[test]))
    for f in range(criteo.NUM_SPARSE):
        ids, inv = np.unique(sparse[train, f], return_inverse=True)
        rate = (np.bincount(inv, label[train]) + 1) / (np.bincount(inv) + 4)
        pos = np.searchsorted(ids, sparse[test, f]).clip(0, len(ids) - 1)
        known = ids[pos] == sparse[test, f]
        score += np.log(np.where(known, rate[pos], label[train].mean()))
    assert auc(label[test], score) > 0.65


def test_records_round_trip_and_any_range_is_one_seek(tmp_path, data):
    _, batches, label, dense, sparse, _ = data
    path = tmp_path / "d.adtr"
    assert records.write_records(path, batches) == 60_000
    f = records.RecordFile(path)
    assert (f.num_records, f.record_bytes, f.stride) == (60_000, 264, 280)
    assert (records.HEADER_BYTES, records.RECORD_STRIDE) == (80, 280)
    assert f.byte_offset(59_000) == 80 + 59_000 * 280
    assert path.stat().st_size == 80 + 60_000 * 280
    tail = f.read(59_000, 1_000)
    assert np.array_equal(tail.sparse, sparse[59_000:]) and np.array_equal(tail.label, label[59_000:])
    mid = f.read(12_345, 7)
    assert np.array_equal(mid.dense, dense[12_345:12_352])
    with pytest.raises(DataError, match="outside"):
        f.read(59_999, 2)


def test_tsv_round_trip_equals_direct_generation(tmp_path):
    spec = criteo.SyntheticSpec(2_000, seed=9)
    tsv = tmp_path / "d.tsv"
    criteo.write_tsv(tsv, criteo.generate(spec))
    line = tsv.read_text().splitlines()[0].split("\t")
    assert len(line) == 40 and line[0] in ("0", "1") and all(len(v) in (0, 8) for v in line[14:])
    records.write_records(tmp_path / "a.adtr", criteo.generate(spec))
    records.write_records(tmp_path / "b.adtr", criteo.read_tsv(tsv))
    assert (tmp_path / "a.adtr").read_bytes() == (tmp_path / "b.adtr").read_bytes()


@pytest.mark.parametrize("line,match", [
    ("1\t2\t3", "expected 40"),
    ("x" + "\t" * 39, r"field label \(column 1\): 'x' is not 0 or 1"),
    ("2" + "\t" * 39, r"field label \(column 1\): '2' is not 0 or 1"),
    ("1" + "\t" * 3 + "\t4.5.6" + "\t" * 35, r"field I4 \(column 5\): '4.5.6' is not a number"),
    ("1" + "\t" * 13 + "\tzz" + "\t" * 25, r"field C1 \(column 15\): 'zz' is not a hex hash"),
])
def test_malformed_tsv_names_file_line_and_field(tmp_path, line, match):
    tsv = tmp_path / "bad.tsv"
    tsv.write_text("0" + "\t" * 39 + "\n" + line + "\n")
    with pytest.raises(InvalidRequest, match=rf"bad.tsv:2: .*{match}"):
        list(criteo.read_tsv(tsv))


def test_v2_layout_is_tfrecord_framing_with_a_fixed_stride(tmp_path):
    """Byte-level check of the layout, independent of the reader: record 0 is the
    64-byte header, data record i is framed at 80 + 280 i, every CRC is TFRecord's
    masked CRC32C (the reference values: crc32c(b"123456789") = 0xE3069283)."""
    import struct
    import zlib
    assert records.masked_crc32c(b"123456789") == (
        (((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xA282EAD8) & 0xFFFFFFFF)
    path = tmp_path / "d.adtr"
    batch = next(criteo.generate(criteo.SyntheticSpec(10, seed=1)))
    records.write_records(path, [batch])
    raw = path.read_bytes()
    assert len(raw) == 80 + 10 * 280

    def framed(at):
        (n,) = struct.unpack_from("<Q", raw, at)
        (len_crc,) = struct.unpack_from("<I", raw, at + 8)
        payload = raw[at + 12:at + 12 + n]
        (crc,) = struct.unpack_from("<I", raw, at + 12 + n)
        assert len_crc == records.masked_crc32c(raw[at:at + 8])
        assert crc == records.masked_crc32c(payload)
        return payload

    head = framed(0)
    assert len(head) == 64 and head[:8] == b"ADTREC02"
    magic, version, record_bytes, num, dense, sparse = struct.unpack_from("<8sIIQII", head)
    assert (version, record_bytes, num, dense, sparse) == (2, 264, 10, 13, 26)
    assert struct.unpack_from("<I", head, 32)[0] == zlib.crc32(head[:32])
    assert head[36:] == bytes(28)
    for i in (0, 7, 9):
        payload = framed(80 + 280 * i)
        assert len(payload) == 264
        label, *dense_v = struct.unpack_from("<14f", payload)
        assert label == batch.label[i] and dense_v == batch.dense[i].tolist()
        assert list(struct.unpack_from("<26q", payload, 56)) == batch.sparse[i].tolist()


def _v1_file(b: bytes) -> bytes:
    """A version-1 file as the old writer made it: 64-byte header, bare 264-byte records."""
    import struct
    import zlib
    head = struct.pack("<8sIIQII", b"ADTREC01", 1, 264, 100, 13, 26)
    head = (head + struct.pack("<I", zlib.crc32(head))).ljust(64, b"\0")
    return head + bytes(100 * 264)


@pytest.mark.parametrize("damage,match", [
    (lambda b: b[:12] + b"NOTADTR!" + b[20:], "bad magic"),
    (lambda b: b"NOTADTR!" + b[8:], "bad magic"),                       # header framing
    (lambda b: b[:24] + bytes([b[24] ^ 1]) + b[25:], "checksum"),          # a header field
    (lambda b: b[:56] + bytes([b[56] ^ 1]) + b[57:], "checksum"),          # the zero pad
    (lambda b: b[:9] + bytes([b[9] ^ 1]) + b[10:], "checksum"),            # header length CRC
    (lambda b: b[:-5], "truncated"),
    (lambda b: b + bytes(280), "appended"),
    (lambda b: b[:10], "bad magic"),
    (lambda b: b"", "bad magic"),
    (_v1_file, "version-1 .*re-convert"),
])
def test_damaged_record_files_are_refused(tmp_path, damage, match):
    path = tmp_path / "d.adtr"
    records.write_records(path, criteo.generate(criteo.SyntheticSpec(100)))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DataError, match=match):
        records.RecordFile(path)


def test_numpy_read_checks_the_framing_of_the_records_it_reads(tmp_path):
    path = tmp_path / "d.adtr"
    records.write_records(path, criteo.generate(criteo.SyntheticSpec(100)))
    raw = bytearray(path.read_bytes())
    raw[80 + 280 * 50] ^= 1                                  # length field of record 50
    path.write_bytes(bytes(raw))
    f = records.RecordFile(path)
    assert len(f.read(0, 50).label) == 50
    with pytest.raises(DataError, match=r"\[40, 60\) have bad framing"):
        f.read(40, 20)


def test_data_cli_generate_convert_inspect_and_errors(tmp_path):
    out, tsv = tmp_path / "g.adtr", tmp_path / "g.tsv"
    run = lambda *a: subprocess.run([DATA_BIN, *a], capture_output=True, text=True)  # noqa: E731
    res = run("--mode=generate", "--records=3000", f"--output={out}", f"--tsv={tsv}")
    assert res.returncode == 0 and "wrote 3000 records" in res.stdout
    res = run("--mode=convert", f"--input={tsv}", f"--output={tmp_path / 'c.adtr'}")
    assert res.returncode == 0 and (tmp_path / "c.adtr").read_bytes() == out.read_bytes()
    res = run("--mode=inspect", f"--input={out}")
    assert res.returncode == 0 and "3000 records of 264 bytes" in res.stdout
    res = run("--mode=inspect", f"--input={tmp_path / 'missing.adtr'}")
    assert res.returncode == 2 and "cannot read" in res.stderr
    res = run("--mode=generate")
    assert res.returncode != 0 and "--output is required" in res.stderr


def test_data_cli_generates_a_held_out_part_of_the_same_dataset(tmp_path):
    """--eval_records: the records after --records of one dataset (one hidden model),
    the split the launcher's generated jobs use; bad combinations write nothing."""
    from antdt_tf.data import criteo

    train, held = tmp_path / "t.adtr", tmp_path / "e.adtr"
    run = lambda *a: subprocess.run([DATA_BIN, *a], capture_output=True, text=True)  # noqa: E731
    res = run("--mode=generate", "--records=3000", "--eval_records=700", "--seed=3",
              f"--output={train}", f"--eval_output={held}")
    assert res.returncode == 0 and "wrote 700 held-out records" in res.stdout, res.stderr
    whole = list(criteo.generate(criteo.SyntheticSpec(3700, seed=3)))
    labels = np.concatenate([b.label for b in whole])
    sparse = np.concatenate([b.sparse for b in whole])
    t, e = records.RecordFile(train), records.RecordFile(held)
    assert (t.num_records, e.num_records) == (3000, 700)
    assert (t.read(0, 3000).label == labels[:3000]).all()
    assert (e.read(0, 700).label == labels[3000:]).all()
    assert (e.read(0, 700).sparse == sparse[3000:]).all()
    for flags, words in ((["--eval_records=10"], "go together"),
                         ([f"--eval_output={tmp_path / 'x.adtr'}"], "go together"),
                         (["--eval_records=10", f"--eval_output={tmp_path / 'o.adtr'}"],
                          "same file")):
        res = run("--mode=generate", f"--output={tmp_path / 'o.adtr'}", *flags)
        assert res.returncode == 2 and words in res.stderr, res.stderr
    assert not (tmp_path / "o.adtr").exists() and not (tmp_path / "x.adtr").exists()


def test_records_between_is_the_same_slice_of_one_dataset_from_any_block():
    """The held-out part starts in a later block: it is made from that block's own seed
    (the blocks before are not drawn), and equals the slice of the whole dataset."""
    from antdt_tf.data import criteo

    spec = criteo.SyntheticSpec(2 * criteo.BLOCK_RECORDS + 5_000, seed=6)
    whole = list(criteo.generate(spec))
    labels = np.concatenate([b.label for b in whole])
    sparse = np.concatenate([b.sparse for b in whole])
    for lo, hi in ((0, 10), (criteo.BLOCK_RECORDS - 3, criteo.BLOCK_RECORDS + 3),
                   (criteo.BLOCK_RECORDS + 100, spec.num_records)):
        part = list(criteo.records_between(spec, lo, hi))
        assert (np.concatenate([b.label for b in part]) == labels[lo:hi]).all(), (lo, hi)
        assert (np.concatenate([b.sparse for b in part]) == sparse[lo:hi]).all(), (lo, hi)
