"""The job report as the launcher shows it: the summary table."""

from __future__ import annotations


def summary_table(report: dict) -> str:
    rows = [("worker", "shards", "records", "share")]
    total = sum(report["records_per_worker"]) or 1
    for i, (s, r) in enumerate(zip(report["shards_per_worker"], report["records_per_worker"])):
        rows.append((f"worker:{i}", str(s), str(r), f"{r / total:.1%}"))
    width = [max(len(r[c]) for r in rows) for c in range(4)]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, width)) for row in rows]
    lines.append("")
    lines.append(f"JCT {report['jct_seconds']:.1f} s, {report['records_per_second']:,.0f} "
                 f"records/s, {report['records']:,} records")
    if report.get("auc") is not None:
        lines.append(f"AUC {report['auc']:.4f}, logloss {report['logloss']:.4f} "
                     f"(held-out, {report['coordinator'].get('eval_records', 0):,} records)")
    if report.get("stolen_leases"):
        lines.append(f"tail work-stealing: {report['stolen_leases']} lease remainder(s) "
                     "taken over by idle workers")
    if report.get("backup_leases"):
        lines.append(f"backup workers: {report['backup_leases']} speculative duplicate(s) of "
                     "slow workers' lease remainders (first finisher wins)")
    for ev in report["failures"]:
        again, regained = ev.get("training_again_after_s"), ev.get("regained_after_s")
        lines.append(f"failure at {ev['t']:.1f}s: {ev['event']}"
                     + (f" — training again {again:.1f}s later" if again is not None
                        else "")
                     + (f", lost work regained after {regained:.1f}s" if regained is not None
                        and regained != again else ""))
    for act in report.get("actions", []):
        after = act.get("recovered_after_s")
        if act["action"] == "ScaleWorkers":
            what = f"{act['from_workers']} -> {act['to_workers']} workers"
        elif act["action"] == "AdjustBatchSizes":
            what = "batch sizes " + ", ".join(f"w{w}:{b}" for w, b in act["batch_sizes"].items())
        else:
            what = f"{act['job']}:{act['index']} host{act['from_host']} -> host{act['to_host']}"
        lines.append(f"controller at {act['t']:.1f}s: {act['action']} {what} ({act['reason']})"
                     + (f" — working again {after:.1f}s later" if after is not None else ""))
    if "audit" in report:
        a = report["audit"]
        lines.append(f"audit: applied exactly {a['expected_times']}x: {a['applied_expected']:,}, "
                     f"0x: {a['applied_0']:,}, 1x: {a['applied_1']:,}, 2+x: "
                     f"{a['applied_2plus']:,}"
                     + (f", in steps cut by a kill: {a['torn']:,}" if "torn" in a else "")
                     + f" (off: {a['applied_other']:,}, allowed "
                     f"{a['allowed_off_records']:,}"
                     + ("; duplicates are the backup workers' price"
                        if a.get("duplicates_by_design") else "")
                     + f") -> {'OK' if a['ok'] else 'FAILED'}")
    return "\n".join(lines)
