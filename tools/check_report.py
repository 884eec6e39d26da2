"""Checks a job report (``antdt-launch --report_json``): the job trained every record
the expected number of times and the report agrees with itself.

``.ci/run`` runs it on ``make demo``'s report, so the README's first command is held to
what the README promises (the summary and an exact audit), not only to its exit code.

Usage: python tools/check_report.py REPORT.json [--allow_off]
  --allow_off  accept records off by up to ``allowed_off_records`` (one batch per
               injected kill); by default the audit must be exact.
Exit 0 when it holds; 1 with one line per problem otherwise.
"""

from __future__ import annotations

import json
import sys


def problems(report: dict, exact: bool = True) -> list[str]:
    """What is wrong with ``report`` (empty: nothing)."""
    out = []
    records, epochs = report.get("records"), report.get("epochs", 1)
    if not isinstance(records, int) or records < 1:
        return [f"no record count in the report (records={records!r})"]
    audit = report.get("audit")
    if not isinstance(audit, dict):
        return ["the report has no audit (run the job with --audit)"]
    expected = records * epochs
    if audit.get("expected_times") != epochs:
        out.append(f"audit.expected_times is {audit.get('expected_times')}, the job ran "
                   f"{epochs} epoch(s)")
    if not audit.get("ok"):
        out.append("audit.ok is false")
    applied = audit.get("applied_expected", 0)
    off = records - applied          # records applied another number of times
    if exact and off:
        out.append(f"{applied:,} of {records:,} records applied exactly {epochs}x "
                   f"(0x: {audit.get('applied_0', '?')}, 2+x: "
                   f"{audit.get('applied_2plus', '?')})")
    elif off > audit.get("allowed_off_records", 0):
        out.append(f"{off:,} records off, {audit.get('allowed_off_records', 0):,} allowed")
    per_worker = report.get("records_per_worker")     # [records of worker 0, 1, ...]
    if not isinstance(per_worker, list) or not per_worker:
        out.append(f"records_per_worker is {per_worker!r}, not a list per worker")
    elif sum(per_worker) != expected:
        out.append(f"records_per_worker add up to {sum(per_worker):,}, not {expected:,}")
    if not report.get("jct_seconds", 0) > 0:
        out.append(f"jct_seconds is {report.get('jct_seconds')!r}")
    auc = report.get("auc")
    if auc is not None and not 0.5 < auc <= 1.0:
        out.append(f"held-out AUC {auc} is no better than chance")
    return out


def main(argv: list[str]) -> int:
    args = [a for a in argv[1:] if not a.startswith("--")]
    unknown = [a for a in argv[1:] if a.startswith("--") and a != "--allow_off"]
    if len(args) != 1 or unknown:
        print(__doc__.strip().splitlines()[-4], file=sys.stderr)
        return 2
    try:
        with open(args[0]) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        print(f"check_report: cannot read {args[0]}: {e}", file=sys.stderr)
        return 1
    found = problems(report, exact="--allow_off" not in argv)
    for p in found:
        print(f"check_report: {args[0]}: {p}", file=sys.stderr)
    if not found:
        a = report["audit"]
        print(f"check_report: {args[0]}: {report['records']:,} records, each applied "
              f"exactly {a['expected_times']}x ({a['applied_expected']:,}); "
              f"JCT {report['jct_seconds']:.1f} s")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
