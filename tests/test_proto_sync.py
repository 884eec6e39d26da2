"""The checked-in wire code must be exactly what tools/gen_protos.py generates."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_generated_code_is_in_sync_with_the_protos():
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_protos.py"), "--check"],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
