"""Whole ``antdt-launch`` jobs for the benchmarks that compare backends: start one,
read its report, see from the master's count how long it took to train again after a
fault, and tabulate scenario 2 per backend."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

LAUNCH = [sys.executable, "-m", "antdt_tf.launch"]
MONITOR = ("--straggler_window_seconds=4", "--straggler_persistent_after_seconds=4")
# scenario 2 of benchmarks.scenarios: a persistent worker straggler
SCENARIO2 = ("--num_ps=1", "--num_workers=3", *MONITOR, "--relaunch_cost_seconds=10",
             "--inject=slow:worker:2:x4@3s")


def launch(workdir: pathlib.Path, data: str, *flags: str) -> subprocess.Popen:
    """``antdt-launch`` on ``data`` in ``workdir`` (audit on, no progress line); its
    output goes to ``<workdir>.log``."""
    cmd = LAUNCH + [f"--data={data}", "--eval_data=", "--audit", "--progress=false",
                    "--checkpoint_every_seconds=5", f"--workdir={workdir}",
                    f"--report_json={workdir / 'report.json'}", "--timeout_seconds=600",
                    *flags]
    workdir.mkdir(parents=True, exist_ok=True)      # the report's directory
    log = open(workdir.parent / f"{workdir.name}.log", "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)


def report(proc: subprocess.Popen, workdir: pathlib.Path) -> dict:
    proc.wait(900)
    if proc.returncode != 0:
        raise RuntimeError(f"job failed; see {workdir.parent / (workdir.name + '.log')}")
    return json.loads((workdir / "report.json").read_text())


def scenario2_table(rows: dict, backends) -> list[str]:
    """Markdown rows: scenario 2, static vs antdt-nd, per backend (``rows[backend,
    policy]`` are the reports)."""
    lines = ["| backend | policy | JCT (s) | vs static | move: start-up (s) | move: "
             "old killed -> new trains (s) | audit exact |", "|---|---|---|---|---|---|---|"]
    for backend in backends:
        static = rows[backend, "static"]["jct_seconds"]
        for policy in ("static", "antdt-nd"):
            rep = rows[backend, policy]
            moves = [a for a in rep["actions"] if a["action"] == "RelaunchWorker"]
            start = "; ".join(f"{a.get('standby_seconds', float('nan')):.1f}" for a in moves)
            back = "; ".join(f"{a.get('recovered_after_s', float('nan')):.1f}" for a in moves)
            exact = rep["audit"]["applied_1"] == rep["records"]
            lines.append(f"| {backend} | {policy} | {rep['jct_seconds']:.1f} | "
                         f"{static / rep['jct_seconds']:.2f}x | {start or '-'} | "
                         f"{back or '-'} | {'yes' if exact else 'NO'} |")
    return lines


def records_done(admin) -> int:
    return admin.progress("train").datasets[0].records_done_total


def wait_for_records(admin, proc, count: int) -> tuple[float, int]:
    """Waits (while the launcher ``proc`` runs) until the master counts ``count`` records
    done; returns (monotonic time, the count then)."""
    done = 0
    while proc.poll() is None:
        try:
            done = records_done(admin)
        except Exception:     # noqa: BLE001 (not registered yet, or a slow answer)
            time.sleep(0.1)
            continue
        if done >= count:
            break
        time.sleep(0.05)
    return time.monotonic(), done


def time_to_resume(admin, proc, at_fault: int, fault_at: float) -> dict:
    """After a fault at ``fault_at`` (monotonic) with ``at_fault`` records counted: the
    surviving workers may still report their closures; then the restarted chief
    restores the last checkpoint (the count drops back to it): training is going again
    when the count grows after that drop. Returns ``training_again_after_s`` (None: not
    seen before the job ended) and ``redone_records`` (trained again since that
    checkpoint; the job's own report times regaining them: ``regained_after_s``)."""
    prev, high, low, resumed = at_fault, at_fault, None, None
    while proc.poll() is None and resumed is None:
        try:
            done = records_done(admin)
        except Exception:     # noqa: BLE001 (the master busy or restarting)
            time.sleep(0.1)
            continue
        if low is None:
            high = max(high, done)
            if done < prev:
                low = done
        elif done < low:
            low = done
        elif done > low:
            resumed = time.monotonic()
        prev = done
        time.sleep(0.05)
    return {"training_again_after_s": (resumed - fault_at) if resumed else None,
            "redone_records": (high - low) if low is not None else 0}


def recovery_rows(loss: dict) -> list[str]:
    """Markdown rows of a fault's cost: records trained again, JCT, the audit."""
    r = loss["report"]
    return [f"| records trained again (since the restored checkpoint) | "
            f"{loss['redone_records']:,} |",
            f"| JCT | {r['jct_seconds']:.1f} s |",
            f"| audit | applied once: {r['audit']['applied_1']:,} of {r['records']:,}, "
            f"0x: {r['audit']['applied_0']}, 2+x: {r['audit']['applied_2plus']} |"]
