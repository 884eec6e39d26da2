"""tools/check_report.py, which .ci/run applies to `make demo`'s report: it passes an
exact report and fails each way a report can be wrong, with the reason."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHECK = ROOT / "tools" / "check_report.py"
EXACT = {"records": 1000, "epochs": 1, "jct_seconds": 2.5, "auc": 0.7,
         "records_per_worker": [600, 400],
         "audit": {"applied_0": 0, "applied_1": 1000, "applied_2plus": 0,
                   "expected_times": 1, "applied_expected": 1000, "applied_other": 0,
                   "allowed_off_records": 0, "ok": True}}


def check(tmp_path, report, *flags):
    path = tmp_path / "report.json"
    path.write_text(report if isinstance(report, str) else json.dumps(report))
    return subprocess.run([sys.executable, str(CHECK), str(path), *flags],
                          capture_output=True, text=True, timeout=60)


def test_an_exact_report_passes(tmp_path):
    res = check(tmp_path, EXACT)
    assert res.returncode == 0, res.stderr
    assert "1,000 records, each applied exactly 1x" in res.stdout


def _with(**changes):
    report = json.loads(json.dumps(EXACT))
    for key, value in changes.items():
        where = report["audit"] if key in EXACT["audit"] else report
        where[key] = value
    return report


@pytest.mark.parametrize("report,words", [
    (_with(applied_expected=998, applied_0=2), "998 of 1,000 records applied exactly 1x"),
    (_with(applied_expected=999, applied_2plus=1), "2\\+x: 1"),
    (_with(ok=False), "audit.ok is false"),
    (_with(records_per_worker=[600, 300]), "add up to 900"),
    (_with(records_per_worker={"worker:0": 1000}), "not a list per worker"),
    (_with(jct_seconds=0), "jct_seconds"),
    (_with(auc=0.49), "no better than chance"),
    ({k: v for k, v in EXACT.items() if k != "audit"}, "has no audit"),
    ("{not json", "cannot read"),
])
def test_a_wrong_report_fails_with_the_reason(tmp_path, report, words):
    import re
    res = check(tmp_path, report)
    assert res.returncode == 1 and re.search(words, res.stderr), res.stderr


def test_allow_off_accepts_the_allowed_batch_of_a_kill(tmp_path):
    report = _with(applied_expected=900, applied_2plus=100, allowed_off_records=128)
    assert check(tmp_path, report).returncode == 1
    assert check(tmp_path, report, "--allow_off").returncode == 0
    report["audit"]["allowed_off_records"] = 50
    assert check(tmp_path, report, "--allow_off").returncode == 1
