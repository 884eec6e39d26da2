"""Every benchmark still runs: each ``make bench`` / ``make bench-*`` target of the
Makefile, read from the Makefile itself, is run at its smallest size (``BENCH_ARGS=--smoke``)
into a temp directory (``RESULTS=``), and its results file must hold a rendered table
(a header, rows of as many cells, numbers in them) that says it is a smoke run. The
checked-in results (benchmarks/results/) are left as they are. A new bench target that
does not take ``RESULTS``/``BENCH_ARGS``, or a new benchmark without a target, fails
the fast checks here; one whose smoke run breaks fails the slow ones."""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

import netns
import raycluster

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAKEFILE = ROOT / "Makefile"
CHECKED_IN = ROOT / "benchmarks" / "results"
# what each smoke run leaves beside its table, besides the table (relative to RESULTS)
EXTRA_OUTPUTS = {"bench-scenarios": "scenarios/*.png"}
# the environment a target needs, and why it is skipped without it
NEEDS = {"bench-multihost": netns.available, "bench-ray": raycluster.available}


def bench_targets() -> dict[str, list[str]]:
    """``{target: its recipe lines}`` of every Makefile target named bench or bench-*."""
    targets: dict[str, list[str]] = {}
    current = None
    for line in MAKEFILE.read_text().splitlines():
        rule = re.match(r"^(bench(?:-[\w-]+)?)\s*:(?![=:])", line)
        if rule:
            current = rule.group(1)
            targets[current] = []
        elif line.startswith("\t") and current:
            targets[current].append(line.strip())
        elif line.strip() and not line.startswith("#"):
            current = None
    return targets


TARGETS = bench_targets()


def _results_table():
    spec = importlib.util.spec_from_file_location(
        "results_table", ROOT / "benchmarks" / "results_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SMOKE_NOTE = _results_table().SMOKE_NOTE


def _benchmark_line(target: str) -> str:
    """The recipe line that runs the benchmark module."""
    lines = [line for line in TARGETS[target] if re.search(r"-m benchmarks\.\w+", line)]
    assert len(lines) == 1, f"{target}: one recipe line runs a benchmark, got {lines}"
    return lines[0]


def _results_file(target: str) -> str:
    """The results file the target writes, relative to $(RESULTS)."""
    found = re.findall(r"--out[= ]\$\(RESULTS\)/(\S+)", _benchmark_line(target))
    assert len(found) == 1, f"{target}: --out must name $(RESULTS)/<file>"
    return found[0]


def test_the_makefile_has_the_bench_targets():
    assert {"bench", "bench-scenarios", "bench-peer", "bench-compare"} <= set(TARGETS)
    assert len(TARGETS) >= 11, sorted(TARGETS)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_bench_target_writes_into_results_and_takes_bench_args(target):
    """What the smoke runs below rely on: the table goes to $(RESULTS) (by default
    benchmarks/results, as before) and $(BENCH_ARGS) ends the benchmark's command (so
    --smoke overrides the target's own sizes)."""
    line = _benchmark_line(target)
    assert line.endswith("$(BENCH_ARGS)"), f"{target}: {line}"
    assert _results_file(target).endswith(".md")
    phony = re.search(r"^\.PHONY:(.*)$", MAKEFILE.read_text(), re.M).group(1).split()
    assert target in phony
    text = MAKEFILE.read_text()
    assert re.search(r"^RESULTS \?= benchmarks/results$", text, re.M)
    assert re.search(r"^BENCH_ARGS \?=\s*$", text, re.M)


def test_every_benchmark_has_a_bench_target():
    """A benchmark script (a module of benchmarks/ with a ``__main__``) that no target
    runs would get no smoke run."""
    run = {m for target in TARGETS for m in re.findall(r"-m benchmarks\.(\w+)",
                                                         _benchmark_line(target))}
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py")
               if 'if __name__ == "__main__"' in p.read_text()}
    assert scripts - run == set(), f"benchmarks without a make target: {scripts - run}"


def test_smoke_overrides_the_targets_sizes_and_flags_after_it_win():
    """The targets name their own sizes (``--rounds=5``) before $(BENCH_ARGS)."""
    rt = _results_table()
    smoke = {"rounds": 1, "records": 10}

    def parse(*argv):
        ap = argparse.ArgumentParser()
        ap.add_argument("--rounds", type=int, default=3)
        ap.add_argument("--records", type=int, default=100)
        args = rt.argparse_smoke(ap, smoke, list(argv))
        return args.rounds, args.records, args.smoke

    assert parse("--rounds=5") == (5, 100, False)
    assert parse("--rounds=5", "--smoke") == (1, 10, True)
    assert parse("--rounds=5", "--smoke", "--rounds=2") == (2, 10, True)
    assert rt.smoke_argv(["prog", "--smoke", "--x=1"], {"policies": ["a", "b"]}) == [
        "prog", "--smoke", "--policies=a,b", "--x=1"]


def _venv() -> str:
    """The venv this suite runs in (``make test`` runs it with the Makefile's): the
    targets run the benchmark with its python, and find its install stamp there."""
    prefix = pathlib.Path(sys.prefix)
    if sys.prefix == sys.base_prefix or not (prefix / ".antdt-installed").exists():
        pytest.skip("not running in a venv made by `make install` (run `make test`)")
    return str(prefix)


def _snapshot() -> dict:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in CHECKED_IN.rglob("*") if p.is_file()}


def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """The markdown tables of ``text``: ``[(header cells, [row cells, ...]), ...]``."""
    lines = text.splitlines()
    tables = []
    for i in range(1, len(lines)):
        if re.fullmatch(r"\|(\s*:?-{3,}:?\s*\|)+", lines[i].strip()) and \
                lines[i - 1].startswith("|"):
            def cells(line):
                return [c.strip() for c in line.strip().strip("|").split("|")]
            rows = []
            for line in lines[i + 1:]:
                if not line.startswith("|"):
                    break
                rows.append(cells(line))
            tables.append((cells(lines[i - 1]), rows))
    return tables


NUMBER = re.compile(r"[-+]?\d[\d,]*(\.\d+)?(x| s)?")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_bench_target_smoke_runs_and_renders_its_table(target, tmp_path):
    if target in NEEDS:
        ok, why = NEEDS[target]()
        if not ok:
            pytest.skip(why)
    venv = _venv()
    results = tmp_path / "results"
    before = _snapshot()
    # the make running this suite (make test) must not hand its jobserver or its
    # command-line variables to this one
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    # the benchmark's scratch (its temp work dirs: data, job dirs, logs) in a directory
    # of this test's, removed when it passed; short, as Unix socket paths must be
    scratch = tempfile.mkdtemp(prefix="antdt-smoke-", dir="/tmp")
    env["TMPDIR"] = scratch
    t0 = time.monotonic()
    proc = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), target,
                           f"VENV={venv}", f"RESULTS={results}", "BENCH_ARGS=--smoke"],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=880)
    took = time.monotonic() - t0
    print(f"make {target} BENCH_ARGS=--smoke: {took:.0f} s")
    assert proc.returncode == 0, f"(its work dirs: {scratch})\n{proc.stdout[-8000:]}"
    out = results / _results_file(target)
    assert out.exists(), f"{out} not written:\n{proc.stdout[-4000:]}"
    text = out.read_text()
    assert text.startswith(SMOKE_NOTE), text[:500]
    tables = _tables(text)
    assert tables, text
    for header, rows in tables:
        assert len(header) >= 2 and rows, (header, rows)
        assert all(len(row) == len(header) for row in rows), (header, rows)
    numbers = [cell for _, rows in tables for row in rows for cell in row
               if NUMBER.fullmatch(cell) or re.match(r"\d[\d,.]* ", cell)]
    assert numbers, text
    if target in EXTRA_OUTPUTS:
        assert list(results.glob(EXTRA_OUTPUTS[target])), sorted(results.rglob("*"))
    assert _snapshot() == before, "the smoke run changed the checked-in results"
    shutil.rmtree(scratch, ignore_errors=True)
