"""Straggler scenarios x policies: how much each policy saves, with timelines.

Usage::

    python -m benchmarks.scenarios [--records=600000] [--scenarios=1,2,3,3bsp,4]
        [--policies=static,dynamic,backup,antdt-nd,antdt-dd,tfdata-peer]
        [--out=benchmarks/results/scenarios.md] [--smoke]

``--smoke``: scenario 3 (slowed from the start) with ``static`` and ``antdt-nd`` on 20,000
records (two short jobs, their timelines, the table): checks that the benchmark runs;
not a measurement.

Every run is a whole ``antdt-launch`` job (agents, master, PS, workers, coordinator: real
processes on this machine) on the same generated record file, with the audit on, and a
real slowdown injected by the agent (SIGSTOP/SIGCONT duty cycling):

1. transient worker straggler: worker 2 at 1/4 speed from 3 s to 9 s;
2. persistent worker straggler: worker 2 at 1/4 speed from 3 s to the end;
3. deterministic heterogeneity: workers 1 and 2 at half speed all along, in asynchronous
   training (``3``) and in synchronous BSP rounds (``3bsp``, ``--mode=bsp``: there the
   presets adjust per-worker batch sizes, ADJUST_BS);
4. persistent PS straggler: ps 0 (of 2) at 1/3 speed from 3 s to the end.

Policies: ``static`` (static sharding, no action: the baseline), ``dynamic`` (dynamic
sharding only), ``backup`` (dynamic sharding + speculative duplicates of slow workers'
leases: the backup-workers baseline), ``antdt-nd``, ``antdt-dd`` (see
``antdt_tf.controller.policy``), and ``tfdata-peer``: what TensorFlow ships — PSS fed by
the tf.data service with ``ShardingPolicy.DYNAMIC`` (its own dispatcher and three
tf.data workers; ``benchmarks.dataservice_peer``), same data, model, batch, PS count
and slowdowns (started by its chief from its first step, with the same throttle).
Asynchronous only (no BSP row). Its JCT runs from its first to its last applied step
(worker clocks); its ideal is not measured (no per-worker counters).

Numbers: JCT = the launcher's ``jct_seconds`` (first shard leased -> every record
applied, from the master's journal; includes pauses of actions, excludes process
start-up); vs static = JCT / JCT of ``static`` in the same scenario; ideal = records /
sum of the per-worker rates measured in the same run (records a worker trained / the
time from training start to its last step — a relaunched worker's downtime counts in
its rate, so relaunch costs are in the ideal). The Monitor's horizon is scaled to these
short jobs (``--straggler_window_seconds=4 --straggler_persistent_after_seconds=4``) and
the cost model starts from the costs measured here (relaunch 10 s, PS replacement 15 s).

A timeline PNG per run (records applied per worker over time, from the launcher's
report; actions and injections marked) goes next to the table.
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

import antdt_tf.launch  # noqa: F401  (defines --batch_size, used here too)
from antdt_tf.launcher.generate import generate_data
from benchmarks.results_table import absl_smoke, smoke_argv, write_table

FLAGS = flags.FLAGS
flags.DEFINE_integer("records", 600_000, "Training records (scenarios 1-3).")
flags.DEFINE_integer("ps_records", 1_500_000, "Training records of scenario 4: replacing a "
                     "PS costs a fixed pause (start, restore, redo since the checkpoint), so "
                     "it pays in longer jobs.")
flags.DEFINE_list("scenarios", ["1", "2", "3", "3bsp", "4"], "Scenarios to run.")
flags.DEFINE_list("policies", ["static", "dynamic", "backup", "antdt-nd", "antdt-dd",
                                "tfdata-peer"], "Policies (tfdata-peer: the tf.data service).")
flags.DEFINE_integer("rounds", 1, "Repetitions of every (scenario, policy); medians.")
flags.DEFINE_string("out", "benchmarks/results/scenarios.md", "Results table (markdown).")
# --smoke: one scenario, two policies (the baseline and one that compares to it)
SMOKE = {"scenarios": ["3"], "policies": ["static", "antdt-nd"], "records": 20_000}
absl_smoke(flags, SMOKE)

SCENARIOS = {
    "1": ("transient worker straggler (w2 x4, 3-9 s)", 1, ["slow:worker:2:x4@3s-9s"]),
    "2": ("persistent worker straggler (w2 x4 from 3 s)", 1, ["slow:worker:2:x4@3s"]),
    "3": ("deterministic heterogeneity (w1, w2 x2 all along)", 1,
          ["slow:worker:1:x2@0s", "slow:worker:2:x2@0s"]),
    "3bsp": ("deterministic heterogeneity, BSP rounds (w1, w2 x2 all along)", 1,
             ["slow:worker:1:x2@0s", "slow:worker:2:x2@0s"]),
    "4": ("persistent PS straggler (ps0 x3 from 3 s)", 2, ["slow:ps:0:x3@3s"]),
}
LAUNCH = [sys.executable, "-m", "antdt_tf.launch"]


def run_job(workdir: pathlib.Path, data: str, num_ps: int, injections, policy: str,
            mode: str = "async") -> dict:
    report = workdir / "report.json"
    cmd = LAUNCH + [f"--num_ps={num_ps}", "--num_workers=3", f"--data={data}", "--eval_data=",
                    f"--batch_size={FLAGS.batch_size}", "--audit", f"--policy={policy}",
                    "--straggler_window_seconds=4", "--straggler_persistent_after_seconds=4",
                    "--relaunch_cost_seconds=10", "--replace_ps_cost_seconds=15",
                    "--checkpoint_every_seconds=5", "--progress=false", f"--mode={mode}",
                    f"--workdir={workdir}", f"--report_json={report}", "--timeout_seconds=600"]
    cmd += [f"--inject={i}" for i in injections]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode != 0 or not report.exists():
        raise RuntimeError(f"job failed ({' '.join(cmd)}):\n{out.stderr[-3000:]}")
    return json.loads(report.read_text())


def run_peer(workdir: pathlib.Path, data: str, records: int, num_ps: int, injections) -> dict:
    """The tf.data-service peer's chief (``benchmarks.dataservice_peer --role=peer``)."""
    from antdt_tf.procutil import child_env

    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "peer.json"
    cmd = [sys.executable, "-m", "benchmarks.dataservice_peer", "--role=peer",
           f"--data={data}", f"--json={out}", f"--records={records}",
           f"--batch_size={FLAGS.batch_size}", f"--num_ps={num_ps}", "--slow_factor=1"]
    cmd += [f"--inject={i}" for i in injections]
    with open(workdir / "peer.log", "wb") as log:
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=log, timeout=1800,
                              env=child_env(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")))
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"peer failed ({proc.returncode}); see {workdir / 'peer.log'}")
    peer = json.loads(out.read_text())
    audit = dict(peer["audit"], ok=peer["audit"]["applied_other"] == 0)
    return {"jct_seconds": peer["jct_seconds"], "audit": audit, "actions": [],
            "records_per_worker": []}


def ideal_jct(report: dict) -> float:
    coord = report["coordinator"]
    start = report["train_started_unix"]
    rates = [r / (last - start) for r, last in zip(coord["records_per_worker"],
                                                  coord.get("worker_last_step_unix", []))
             if r and last > start]
    return report["records"] / sum(rates) if rates else float("nan")


def plot(path: pathlib.Path, title: str, report: dict) -> None:
    """Records applied per worker over time (the launcher's ``timeline``: the chief's
    per-worker counters every 0.5 s), injections (grey) and actions (red) marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["timeline"]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for w in range(len(rows[0]) - 1 if rows else 0):
        ax.step([r[0] for r in rows], [r[w + 1] for r in rows], where="post",
                label=f"worker {w}")
    startup = report["startup_seconds"]
    top = max((max(r[1:]) for r in rows), default=1)
    for ev in report["events"]:
        t = ev["t"] - startup
        if "action" in ev:
            ax.axvline(t, color="red", ls="--", lw=1)
            ax.text(t, top, " " + ev["action"], color="red", fontsize=7, va="top")
        elif "injected" in ev:
            ax.axvline(t, color="grey", ls=":", lw=1)
    ax.set_xlabel("seconds since the first shard was leased")
    ax.set_ylabel("records applied")
    ax.set_title(title, fontsize=9)
    if rows:
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv):
    del argv
    out = pathlib.Path(FLAGS.out)
    plots = out.parent / "scenarios"
    plots.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="antdt-scenarios-"))
    data, _ = generate_data(tmp, FLAGS.records, 0, seed=1)
    results = {}
    for sc in FLAGS.scenarios:
        title, num_ps, injections = SCENARIOS[sc]
        if sc == "4":
            data, _ = generate_data(tmp / "long", FLAGS.ps_records, 0, seed=1)
        for rnd in range(FLAGS.rounds):
            for policy in FLAGS.policies:
                bsp = sc.endswith("bsp")
                if bsp and policy in ("tfdata-peer", "backup"):
                    continue      # asynchronous only
                workdir = tmp / f"s{sc}-{policy}-{rnd}"
                t = time.monotonic()
                if policy == "tfdata-peer":
                    report = run_peer(workdir, data,
                                      FLAGS.ps_records if sc == "4" else FLAGS.records,
                                      num_ps, injections)
                else:
                    report = run_job(workdir, data, num_ps, injections, policy,
                                     "bsp" if bsp else "async")
                row = {"jct": report["jct_seconds"],
                       "ideal": ideal_jct(report) if "timeline" in report else float("nan"),
                       "actions": [a["action"] + (f" {a['job']}:{a['index']}" if a["action"]
                                                  not in ("ScaleWorkers", "AdjustBatchSizes")
                                                  else "")
                                   for a in report["actions"]],
                       "audit_ok": report["audit"]["ok"],
                       "off": report["audit"]["applied_other"],
                       "twice": report["audit"]["applied_2plus"],
                       "lost": report["audit"]["applied_0"],
                       "share": report["records_per_worker"]}
                results.setdefault((sc, policy), []).append(row)
                print(f"scenario {sc} {policy:9s} round {rnd}: JCT {row['jct']:.1f}s "
                      f"ideal {row['ideal']:.1f}s actions {row['actions']} "
                      f"({time.monotonic() - t:.0f}s)", flush=True)
                if rnd == 0 and "timeline" in report:
                    plot(plots / f"s{sc}-{policy}.png", f"scenario {sc}: {title} — {policy}",
                         report)
    lines = [f"# Straggler scenarios x policies ({time.strftime('%Y-%m-%d')}; 2 cores; "
             f"{FLAGS.records:,} records (scenario 4: {FLAGS.ps_records:,}), batch "
             f"{FLAGS.batch_size}, 3 workers; "
             f"{FLAGS.rounds} round(s), medians)", "",
             "Definitions: see the docstring of `benchmarks/scenarios.py`. Timelines: "
             f"`{plots}/s<scenario>-<policy>.png`.", "",
             "| scenario | policy | JCT (s) | vs static | ideal JCT (s) | JCT / ideal | "
             "actions | audit: records applied 0x / 2+x |",
             "|---|---|---:|---:|---:|---:|---|---|"]
    for sc in FLAGS.scenarios:
        base = results.get((sc, "static"))
        base_jct = statistics.median(r["jct"] for r in base) if base else float("nan")
        for policy in FLAGS.policies:
            rows = results.get((sc, policy))
            if not rows:
                continue
            jct = statistics.median(r["jct"] for r in rows)
            ideal = statistics.median(r["ideal"] for r in rows)
            acts = ", ".join(sorted({a for r in rows for a in r["actions"]})) or "none"
            ok = all(r["audit_ok"] for r in rows)
            ideal_cols = (f"{ideal:.1f} | {jct / ideal:.2f}" if ideal == ideal
                          else "— | —")     # nan: not measured (the peer)
            lines.append(f"| {sc}: {SCENARIOS[sc][0]} | {policy} | {jct:.1f} | "
                         f"{jct / base_jct:.2f} | {ideal_cols} | {acts} | "
                         f"{max(r['lost'] for r in rows):,} / "
                         f"{max(r['twice'] for r in rows):,}{'' if ok else ' FAILED'} |")
    if FLAGS.smoke:
        lines += ["", "Reproduce: `make bench-scenarios BENCH_ARGS=--smoke` (= `python -m "
                  "benchmarks.scenarios --smoke`)."]
    else:
        named = "".join(f" --{name}={','.join(v) if isinstance(v, list) else v}"
                        for name in ("records", "ps_records", "scenarios", "policies",
                                     "rounds", "out")
                        if (v := FLAGS[name].value) != FLAGS[name].default)
        command = f"python -m benchmarks.scenarios{named}"
        lines += ["", f"Reproduce: `{command}`" + (" (= `make bench-scenarios`)."
                                                   if not named else ".")]
    write_table(str(out), lines, smoke=FLAGS.smoke)


if __name__ == "__main__":
    app.run(main, argv=smoke_argv(sys.argv, SMOKE))
