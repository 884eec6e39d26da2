"""A user's own training program is the job (docs/program.md): each program below is
written by the test into a directory outside the package, with its own model, step,
TFRecord data and per-record counter, and submitted with ``antdt-launch --program``; a
worker is SIGKILLed mid-job, and the program's own count says every record was trained
exactly once (within the one batch a kill may repeat)."""

import json
import subprocess
import sys

import pytest

import user_programs

pytestmark = pytest.mark.slow

RECORDS = (6000, 4000)          # two files of the user's data
BATCH = 64


@pytest.fixture(scope="module")
def user_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("user-data")
    first = 0
    for k, n in enumerate(RECORDS):
        user_programs.write_examples(d / f"part-{k}.tfrecord", first, n, seed=k)
        first += n
    return d


def launch(tmp_path, user_data, api: str, *flags: str, program_args=()):
    program = user_programs.write_program(tmp_path / "my-project", api)
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "antdt_tf.launch", f"--api={api}", f"--program={program}",
           f"--data={user_data}/*.tfrecord", "--num_ps=1", "--num_workers=2",
           "--records_per_shard=500", "--noprogress", f"--workdir={tmp_path / 'job'}",
           f"--report_json={report}", "--timeout_seconds=240", *flags,
           "--", f"--batch_size={BATCH}", *program_args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:] + out.stdout[-2000:]
    return json.loads(report.read_text()), out.stderr


def check_exactly_once(report, kills: int):
    audit = report["audit"]
    assert report["records"] == sum(RECORDS)
    assert audit["applied_0"] == 0, audit               # nothing lost
    assert audit["applied_other"] <= kills * BATCH, audit
    assert audit["ok"], audit
    assert sum(report["records_per_worker"]) >= sum(RECORDS) - kills * BATCH


@pytest.mark.parametrize("api", ["keras", "custom_loop"])
def test_a_users_program_survives_a_worker_kill_locally(tmp_path, user_data, api):
    report, log = launch(tmp_path, user_data, api, "--inject=kill:worker:1@40%")
    check_exactly_once(report, kills=1)
    assert report["restarts"] == {"worker:1": 1}
    assert "injected: SIGKILL worker:1" in log
    # the program's own summary is the job's (what it wrote, where the contract said)
    assert report["coordinator"]["batch_size"] == BATCH
