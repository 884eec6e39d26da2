"""antdt-data: make training data in the compact record format.

Usage::

    antdt-data --mode=generate --records=200000 --seed=0 --output=train.adtr
    antdt-data --mode=generate --records=200000 --eval_records=20000 --output=train.adtr \
        --eval_output=eval.adtr --tsv=train.tsv
    antdt-data --mode=convert --input=day_0.tsv --output=day_0.adtr
    antdt-data --mode=inspect --input=train.adtr

``generate`` writes synthetic Criteo-format data with learnable signal (optionally also
as TSV, and held-out records of the same dataset for an AUC: another ``--seed`` would be
another dataset); ``convert`` turns real Criteo TSV into the compact format; ``inspect`` validates
a record file and prints its header and first records.

Exit code 2 on bad data or bad flags, with one line saying what is wrong; an output is
written atomically and only when the whole input converted: a failed or empty
conversion leaves an existing output as it was and no temporary file behind
(docs/cli-exit-codes.md).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from tqdm import tqdm

from antdt_tf import exitcodes
from antdt_tf.data import criteo, records
from antdt_tf.errors import DataError, InvalidRequest

FLAGS = flags.FLAGS
flags.DEFINE_enum("mode", None, ["generate", "convert", "inspect"], "What to do.")
flags.DEFINE_string("input", "", "convert: Criteo TSV file; inspect: record file.")
flags.DEFINE_string("output", "", "Record file to write (generate, convert).")
flags.DEFINE_string("tsv", "", "generate: also write the data as Criteo TSV here.")
flags.DEFINE_integer("records", 200_000, "generate: number of records.")
flags.DEFINE_integer("seed", 0, "generate: seed (same seed, same bytes; another seed is "
                     "another dataset: another hidden model).")
flags.DEFINE_integer("eval_records", 0, "generate: also write this many held-out records of "
                     "the same dataset (the records after --records) to --eval_output.")
flags.DEFINE_string("eval_output", "", "generate: record file of the --eval_records.")


def _progress(batches, total, desc):
    with tqdm(total=total, unit="rec", unit_scale=True, desc=desc, file=sys.stderr,
              disable=None) as bar:
        for b in batches:
            bar.update(len(b))
            yield b


def _same_file(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` are one file (another path, a symlink or a hard link)."""
    try:
        return os.path.samefile(a, b)
    except OSError:       # one of them does not exist
        return os.path.abspath(a) == os.path.abspath(b)


def _check_output(output: str, *inputs: str) -> None:
    problem = exitcodes.output_file_problem(output, "--output")
    if problem:
        raise app.UsageError(problem)
    for flag, path in zip(("--input", "--tsv"), inputs):
        if path and _same_file(output, path):
            raise app.UsageError(f"--output={output} is the same file as {flag}={path}: "
                                 "it would be overwritten")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        if FLAGS.mode == "generate":
            if not FLAGS.output:
                raise app.UsageError("--output is required for --mode=generate")
            _check_output(FLAGS.output, "", FLAGS.tsv)
            if FLAGS.tsv and (problem := exitcodes.output_file_problem(FLAGS.tsv, "--tsv")):
                raise app.UsageError(problem)
            if FLAGS.records < 1 or FLAGS.eval_records < 0:
                raise app.UsageError("--records must be >= 1 and --eval_records >= 0")
            if bool(FLAGS.eval_records) != bool(FLAGS.eval_output):
                raise app.UsageError("--eval_records and --eval_output go together")
            if FLAGS.eval_output:
                _check_output(FLAGS.eval_output, "", FLAGS.tsv)
                if _same_file(FLAGS.eval_output, FLAGS.output):
                    raise app.UsageError("--eval_output is the same file as --output")
            # one dataset (one hidden model): the held-out records follow the training ones
            spec = criteo.SyntheticSpec(FLAGS.records + FLAGS.eval_records, seed=FLAGS.seed)
            n = records.write_records(FLAGS.output, _progress(
                criteo.records_between(spec, 0, FLAGS.records), FLAGS.records, "generate"))
            if FLAGS.tsv:
                criteo.write_tsv(FLAGS.tsv, criteo.records_between(spec, 0, FLAGS.records))
            print(f"wrote {n} records to {FLAGS.output}")
            if FLAGS.eval_output:
                n = records.write_records(FLAGS.eval_output, criteo.records_between(
                    spec, FLAGS.records, spec.num_records))
                print(f"wrote {n} held-out records to {FLAGS.eval_output}")
        elif FLAGS.mode == "convert":
            if not FLAGS.input or not FLAGS.output:
                raise app.UsageError("--input and --output are required for --mode=convert")
            _check_output(FLAGS.output, FLAGS.input)
            n = records.write_records(FLAGS.output, _progress(
                criteo.read_tsv(FLAGS.input), None, "convert"), allow_empty=False)
            print(f"wrote {n} records to {FLAGS.output}")
        else:
            if not FLAGS.input:
                raise app.UsageError("--input is required for --mode=inspect")
            f = records.RecordFile(FLAGS.input)
            print(f"{f.path}: {f.num_records} records of {f.record_bytes} bytes "
                  f"({f.num_dense} dense, {f.num_sparse} sparse)")
            head = f.read(0, min(3, f.num_records))
            for i in range(len(head)):
                print(f"  [{i}] label={head.label[i]:.0f} dense={head.dense[i][:4].tolist()}... "
                      f"sparse={head.sparse[i][:3].tolist()}...")
    except (DataError, InvalidRequest) as e:
        return exitcodes.error("antdt-data", e, exitcodes.BAD_INPUT)
    except OSError as e:      # e.g. --tsv on a full disk
        return exitcodes.error("antdt-data", f"{e.filename}: {e.strerror or e}",
                               exitcodes.BAD_INPUT)
    return exitcodes.OK


def run():
    flags.mark_flag_as_required("mode")
    exitcodes.run(main, "antdt-data")


if __name__ == "__main__":
    run()
