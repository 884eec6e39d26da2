"""The results file of ``compare_pss``: one row per setup and straggler mode (medians over
the rounds), CPU seconds by process role, the ratios between setups, the JCT of every
run, and the command that reproduces it."""

from __future__ import annotations

import statistics

from benchmarks.pss.cpu import ROLES
from benchmarks.pss.runs import NUM_WORKERS, SETUPS

# the run's flags a results file's reproduce line names when they differ from these
# (the parser's defaults)
REPRODUCE_DEFAULTS = {"batch_size": 256, "records_per_shard": 2048, "stragglers": "both",
                      "warmup": 1}
# the results files a Makefile target writes with exactly its command
TARGETS = {"benchmarks/results/compare_pss.md": "bench-compare",
           "benchmarks/results/compare_pss_apis.md": "bench-apis"}

DEFINITIONS = (
    "Definitions ([docs/benchmarks.md](../../docs/benchmarks.md"
    "#the-pss-comparison-setups-and-definitions)): "
    "JCT = training phase only (all processes ready -> last record applied; antdt-tf: "
    "first shard leased -> the master reports every record applied); ideal = records / "
    "sum of per-worker rates (records the worker trained / training start -> its last "
    "step) measured in the same run; coordinator CPU = CPU seconds of the "
    "chief/coordinator process during training ((b) has no coordinator: the number is the "
    "chief *worker*, which also trains its third).")

# The lines under the tables: (the setups the line is about, its lead-in, its parts).
# A line is written when all of its setups were run; each part of it when both runs of
# each of its ratios exist. A ratio is (measure, run, run): the first run's median over
# the second's, of "jct" (JCT) or "rps" (records/s); a run is a setup's letter, "+" for
# with the straggler.
SUMMARY = (
    ("abc", "", (
        ("JCT (c)/(b) with the straggler: {:.2f} (JCT (c)/(a) with the straggler: {:.2f})",
         ("jct", "c+", "b+"), ("jct", "c+", "a+")),)),
    ("abc", "", (
        ("(c) throughput without straggler vs (a): {:.2f}x, vs (b): {:.2f}x",
         ("rps", "c", "a"), ("rps", "c", "b")),)),
    ("abc", "straggler slowdown of JCT (with / without): ", (
        ("(a) {:.2f}, (b) {:.2f}, (c) {:.2f}",
         ("jct", "a+", "a"), ("jct", "b+", "b"), ("jct", "c+", "c")),)),
    ("bcs", "", (
        ("what the platform costs: (s) TF2 PSS static thirds, no antdt-tf, throughput "
         "without straggler vs (b): {:.2f}x", ("rps", "s", "b")),
        ("what antdt-tf costs on top of it: (c) vs (s): {:.2f}x", ("rps", "c", "s")),
        ("JCT (s)/(b) with the straggler: {:.2f}", ("jct", "s+", "b+")))),
    ("bm", "antdt-tf's TF1 path: ", (
        ("JCT (m)/(b) with the straggler: {:.2f}", ("jct", "m+", "b+")),
        ("(m) throughput without straggler vs (b): {:.2f}x", ("rps", "m", "b")))),
    ("mt", "what antdt-tf adds to a TF1 job (the same model on both sides): ", (
        ("(m) throughput without straggler vs (t): {:.2f}x", ("rps", "m", "t")),
        ("JCT (t)/(m) with the straggler: {:.2f} (how many times faster antdt-tf is)",
         ("jct", "t+", "m+")))),
    ("mu", "antdt-tf's TF1 job against the same TF1 job without it, both timed from the "
           "first step (start-up and checkpoint 0 inside): ", (
        ("(m) throughput without straggler vs (u): {:.2f}x", ("rps", "m", "u")),
        ("JCT (u)/(m) with the straggler: {:.2f}", ("jct", "u+", "m+")))),
    ("bt", "", (
        ("what the TF1 model as written costs: (t) vs (b) throughput without straggler: "
         "{:.2f}x", ("rps", "t", "b")),)),
    ("ck", "antdt-tf's Keras path: ", (
        ("(k) throughput without straggler vs (c): {:.2f}x", ("rps", "k", "c")),
        ("JCT (k)/(c) with the straggler: {:.2f}", ("jct", "k+", "c+")))),
    ("kv", "", (
        ("what antdt-tf adds to a Keras job: (k) vs (v) throughput without straggler: "
         "{:.2f}x", ("rps", "k", "v")),
        ("what Keras' own step costs: (v) vs (s): {:.2f}x", ("rps", "v", "s")))),
    ("bk", "", (("JCT (k)/(b) with the straggler: {:.2f}", ("jct", "k+", "b+")),)),
    ("cd", "", (("JCT (c)/(c') with the straggler: {:.2f}, without: {:.2f}",
                 ("jct", "c+", "d+"), ("jct", "c", "d")),)),
)


def _jct(runs) -> float:
    return statistics.median(r["jct"] for r in runs)


def _rps(runs) -> float:
    return statistics.median(r["records"] / r["jct"] for r in runs)


MEASURES = {"jct": _jct, "rps": _rps}


def _runs(results: dict, run: str) -> list:
    return results.get((run[0], run.endswith("+"))) or []


def summary_lines(setups: str, results: dict) -> list[str]:
    """The lines of :data:`SUMMARY` that ``setups`` and the runs in ``results``
    (``{(setup, straggler): [run, ...]}``) give, each with the parts whose ratios have
    both of their runs."""
    lines = []
    for about, lead, parts in SUMMARY:
        if not set(about) <= set(setups):
            continue
        shown = []
        for template, *ratios in parts:
            if all(_runs(results, a) and _runs(results, b) for _, a, b in ratios):
                shown.append(template.format(*(
                    MEASURES[m](_runs(results, a)) / MEASURES[m](_runs(results, b))
                    for m, a, b in ratios)))
        if shown:
            lines.append("- " + lead + "; ".join(shown))
    return lines


def write_results(args, results: dict, started: str) -> None:
    """Writes ``args.out`` from ``results`` (``{(setup, straggler): [run, ...]}``, the
    runs of ``runs``' functions, each with the load averages around it)."""
    from benchmarks.results_table import non_default_flags, write_table

    cmd = (f"python -m benchmarks.compare_pss --rounds={args.rounds} --records={args.records} "
           f"--setups={args.setups}{non_default_flags(args, REPRODUCE_DEFAULTS)} "
           f"--out={args.out}")
    target = TARGETS.get(args.out)
    lines = [
        f"# vanilla TF2 PSS vs TF1 static sharding vs antdt-tf ({started}; 2 cores, 1 PS + 3 "
        f"workers, DeepFM {args.buckets:,} buckets, SGD lr {args.learning_rate:g}, "
        f"{args.records:,} records, batch {args.batch_size}, antdt shards of "
        f"{args.records_per_shard:,}; straggler = worker 2 slowed {args.slowdown:g}x by "
        f"CpuThrottle; {args.rounds} paired round(s), medians)",
        "", DEFINITIONS, "",
        *_setup_rows(args, results), "",
        *_cpu_rows(args, results), "",
        *summary_lines(args.setups, results),
        "",
        "Per run (JCT s): " + "; ".join(
            f"{k}{'+s' if s else ''}: " + ", ".join(
                f"{r['jct']:.1f} (load {r['load'][0]:.0f}->{r['load'][1]:.0f})" for r in runs)
            for (k, s), runs in results.items() if runs),
        "",
        f"Reproduce: `{cmd}`" + (f" (or `make {target}`)." if target else "."),
    ]
    write_table(args.out, lines, smoke=args.smoke)


def _setup_rows(args, results: dict) -> list[str]:
    lines = [
        "| setup | straggler | JCT (s) | records/s | ideal JCT (s) | JCT / ideal | "
        "coordinator CPU (s) | records per worker | applied 0 / 1 / 2+ times |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for (key, straggler), runs in results.items():
        if not runs:
            continue
        name = SETUPS[key][0]
        per = [int(statistics.median(r["records_per_worker"][w] for r in runs))
               for w in range(NUM_WORKERS)]
        aud = runs[len(runs) // 2]["audit"]
        ratio = statistics.median(r["jct"] / r["ideal"] for r in runs)
        coord = "—" if key == "m" else format(statistics.median(r["coord_cpu"] for r in runs),
                                               ".2f")
        lines.append(
            f"| {name} | {'worker 2 x' + format(args.slowdown, 'g') if straggler else 'none'} | "
            f"{_jct(runs):.2f} | {_rps(runs):,.0f} | "
            f"{statistics.median(r['ideal'] for r in runs):.2f} | {ratio:.2f} | "
            f"{coord}"
            f"{' (chief worker)' if key in ('b', 't', 'u') else ''} | "
            f"{' / '.join(f'{x:,}' for x in per) if aud and key != 'v' else '—'} | "
            + (f"{aud['applied_0']:,} / {aud['applied_1']:,} / {aud['applied_2plus']:,} |"
               if aud else "— |"))
    return lines


def _cpu_rows(args, results: dict) -> list[str]:
    lines = ["CPU seconds by process role during training (medians; polled every 0.25 s "
             "from the start mark; the platform's: PS, workers, chief; antdt-tf's own: master, "
             "agents, launcher), and CPU per 10k records:", "",
             "| setup | straggler | " + " | ".join(ROLES) + " | total | total per 10k records |",
             "|---|---|" + "---:|" * (len(ROLES) + 2)]
    for (key, straggler), runs in results.items():
        runs = [r for r in runs if r.get("cpu")]
        if not runs:
            continue
        cells = [statistics.median(r["cpu"][role] for r in runs) for role in ROLES]
        total = statistics.median(sum(r["cpu"].values()) for r in runs)
        per10k = statistics.median(sum(r["cpu"].values()) / r["records"] * 1e4 for r in runs)
        slow = "x" + format(args.slowdown, "g") if straggler else "none"
        lines.append(f"| {SETUPS[key][0]} | {slow} | " + " | ".join(f"{c:.2f}" for c in cells)
                     + f" | {total:.2f} | {per10k:.2f} |")
    return lines
