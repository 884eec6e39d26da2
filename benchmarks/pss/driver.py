"""The driver of ``compare_pss``: writes the record file every setup trains on, runs one
uncounted warm-up run, then ``--rounds`` paired rounds — every setup asked for, without
and/or with the straggler, odd rounds in reverse order so that no setup always runs
first or last — and writes the results file."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
import time

from benchmarks.pss.runs import SETUPS
from benchmarks.pss.table import write_results

STRAGGLER_MODES = {"both": (False, True), "none": (False,), "only": (True,)}


def run(args) -> None:
    from antdt_tf.data import criteo, records

    work = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="antdt-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    args.data = str(work / "train.adtr")
    records.write_records(args.data, criteo.generate(criteo.SyntheticSpec(args.records, seed=1)))
    print(f"data: {args.data} ({args.records:,} records); work dir {work}", flush=True)
    started = time.strftime("%Y-%m-%d")
    results = {(k, s): [] for s in (False, True) for k in args.setups}
    if args.warmup:
        # the first job after the data is written runs slower: one run of the first
        # setup, not counted
        run_dir = work / "warmup"
        run_dir.mkdir()
        r = SETUPS[args.setups[0]][1](run_dir, args, False)
        print(f"warm-up {SETUPS[args.setups[0]][0]} JCT {r['jct']:.2f} s (not counted)",
              flush=True)
    for rnd in range(args.rounds):
        for straggler in STRAGGLER_MODES[args.stragglers]:
            for key in (args.setups if rnd % 2 == 0 else args.setups[::-1]):
                run_dir = work / f"r{rnd}-{key}-{'slow' if straggler else 'none'}"
                run_dir.mkdir()
                t = time.monotonic()
                load0 = os.getloadavg()[0]
                r = SETUPS[key][1](run_dir, args, straggler)
                r["load"] = (load0, os.getloadavg()[0])   # 1-min load average before / after
                results[key, straggler].append(r)
                print(f"round {rnd} {SETUPS[key][0]:<24} straggler={straggler!s:<5} "
                      f"JCT {r['jct']:6.2f} s ideal {r['ideal']:6.2f} s "
                      f"coord CPU {r['coord_cpu']:6.2f} s per worker {r['records_per_worker']} "
                      f"audit {r['audit']} (wall {time.monotonic() - t:.0f} s, load avg "
                      f"{r['load'][0]:.1f} -> {r['load'][1]:.1f})", flush=True)
                (run_dir / "summary.json").write_text(json.dumps(r))
    write_results(args, results, started)
