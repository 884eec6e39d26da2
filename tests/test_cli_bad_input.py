"""Every binary answers bad input with one line naming the problem and a documented exit
code (antdt_tf.exitcodes, docs/cli-exit-codes.md), never a traceback, and overwrites
nothing: real processes, real files, real sockets. None of these cases imports TensorFlow
except the last (marked slow)."""

import os
import pathlib
import re
import socket
import subprocess
import sys

import pytest

from antdt_tf import exitcodes
from antdt_tf.data import criteo, records

ROOT = pathlib.Path(__file__).resolve().parent.parent
UNROUTABLE = "203.0.113.7"      # TEST-NET-3: on no interface of this host


def run(module, *args, cwd=None, env=None):
    e = {k: v for k, v in os.environ.items() if k != "ANTDT_JOB_TOKEN"}
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, timeout=60, cwd=cwd, env=e, stdin=subprocess.DEVNULL)


def refused(res, code, *words):
    """Exit ``code``, no traceback, exactly one ``error:`` line, naming ``words``."""
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if ": error: " in line]
    assert len(lines) == 1, res.stderr
    for w in words:
        assert re.search(w, lines[0]), (w, lines[0])
    assert res.returncode == code, (res.returncode, res.stderr)
    return lines[0]


@pytest.fixture
def busy_port():
    """A port on 127.0.0.1 that another process (this one) listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def snapshot(*paths):
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in paths}


def no_tmp_files(root):
    return [p for p in root.rglob("*") if ".tmp" in p.name] == []


def test_master_refuses_a_busy_port_a_foreign_address_and_an_unusable_state_dir(
        tmp_path, busy_port):
    state = tmp_path / "state"
    res = run("antdt_tf.master", f"--port={busy_port}", f"--state_dir={state}")
    refused(res, exitcodes.CANNOT_SERVE, f"port {busy_port} .* already in use")
    assert not state.exists()                       # nothing created for a refused start
    res = run("antdt_tf.master", "--port=0", f"--bind={UNROUTABLE}",
              "--allow_unauthenticated_network_access", f"--state_dir={state}")
    refused(res, exitcodes.CANNOT_SERVE, UNROUTABLE, "not on this host")
    res = run("antdt_tf.master", "--port=0", "--bind=garbage.invalid",
              "--allow_unauthenticated_network_access")
    refused(res, exitcodes.BAD_INPUT, "--bind='garbage.invalid' is not an address")
    assert not state.exists()
    a_file = tmp_path / "a_file"
    a_file.write_text("mine\n")
    before = snapshot(a_file)
    refused(run("antdt_tf.master", "--port=0", f"--state_dir={a_file}"), exitcodes.BAD_INPUT,
            "--state_dir=.*a_file exists and is not a directory")
    refused(run("antdt_tf.master", "--port=0", f"--state_dir={a_file}/sub"),
            exitcodes.BAD_INPUT, "--state_dir=.*a_file/sub cannot be created")
    refused(run("antdt_tf.master", "--port=0", f"--port_file={tmp_path}/no/port"),
            exitcodes.BAD_INPUT, "--port_file=.* does not exist")
    refused(run("antdt_tf.master", "--port=70000"), exitcodes.BAD_INPUT, "--port must be")
    refused(run("antdt_tf.master", "--fsync=sometimes"), exitcodes.BAD_INPUT, "--fsync")
    assert snapshot(a_file) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_agent_refuses_a_busy_port_and_a_foreign_address(tmp_path, busy_port):
    logs = tmp_path / "logs"
    res = run("antdt_tf.agent.agent", f"--port={busy_port}", f"--task_log_dir={logs}")
    refused(res, exitcodes.CANNOT_SERVE, f"port {busy_port} .* already in use")
    res = run("antdt_tf.agent.agent", "--port=0", f"--bind={UNROUTABLE}",
              "--allow_unauthenticated_network_access", f"--task_log_dir={logs}")
    refused(res, exitcodes.CANNOT_SERVE, "not on this host")
    assert not logs.exists()
    a_file = tmp_path / "a_file"
    a_file.write_text("mine\n")
    refused(run("antdt_tf.agent.agent", "--port=0", f"--task_log_dir={a_file}"),
            exitcodes.BAD_INPUT, "--task_log_dir=.* is not a directory")
    refused(run("antdt_tf.agent.agent", "--task_ports=1-2"), exitcodes.BAD_INPUT,
            "--task_ports")
    assert a_file.read_text() == "mine\n"


def test_data_convert_refuses_bad_input_and_replaces_nothing(tmp_path):
    out = tmp_path / "out.adtr"
    records.write_records(out, criteo.generate(criteo.SyntheticSpec(50)))
    tsv = tmp_path / "in.tsv"
    criteo.write_tsv(tsv, criteo.generate(criteo.SyntheticSpec(3)))
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(bytes(range(256)) * 64)
    empty = tmp_path / "empty.tsv"
    empty.write_bytes(b"")
    bad = tmp_path / "bad.tsv"
    lines = tsv.read_text().splitlines(keepends=True)
    fields = lines[2].split("\t")
    fields[16] = "not-hex"                          # C3 of line 3
    bad.write_text(lines[0] + lines[1] + "\t".join(fields))
    (tmp_path / "link.tsv").symlink_to(tsv)
    (tmp_path / "dir").mkdir()
    before = snapshot(out, tsv)

    def convert(inp, output):
        return run("antdt_tf.data.cli", "--mode=convert", f"--input={inp}",
                   f"--output={output}", cwd=tmp_path)

    refused(convert(garbage, out), exitcodes.BAD_INPUT, "garbage.bin:1: byte 0x00 at column 1 is not printable ASCII")
    refused(convert(empty, out), exitcodes.BAD_INPUT, "no records", "out.adtr was not written")
    refused(convert(bad, out), exitcodes.BAD_INPUT,
            r"bad.tsv:3: field C3 \(column 17\): 'not-hex' is not a hex hash")
    for same in (tsv, "in.tsv", tmp_path / "dir" / ".." / "in.tsv", tmp_path / "link.tsv"):
        refused(convert(tsv, same), exitcodes.BAD_INPUT, "is the same file as --input")
    refused(convert(tsv, tmp_path / "in.tsv" / "x.adtr"), exitcodes.BAD_INPUT,
            "its directory .*in.tsv is not a directory")
    refused(convert(tsv, tmp_path / "dir"), exitcodes.BAD_INPUT, "is a directory")
    refused(convert(tmp_path / "missing.tsv", out), exitcodes.BAD_INPUT, "cannot read")
    refused(run("antdt_tf.data.cli", "--mode=inspect", f"--input={garbage}"),
            exitcodes.BAD_INPUT, "not an antdt-tf record file")
    refused(run("antdt_tf.data.cli", "--mode=bogus"), exitcodes.BAD_INPUT, "--mode")
    assert snapshot(out, tsv) == before
    assert no_tmp_files(tmp_path)
    assert sorted(p.name for p in (tmp_path / "dir").iterdir()) == []


def test_launch_creates_no_workdir_for_a_job_it_refuses(tmp_path):
    workdir = tmp_path / "job"
    garbage = tmp_path / "garbage.adtr"
    garbage.write_bytes(b"\x00" * 1000)
    temp = tmp_path / "temp"              # where a default workdir (mkdtemp) would go
    temp.mkdir()
    prog = tmp_path / "train.py"
    prog.write_text("print('mine')\n")
    for flags, words in [
        (["--timeout_seconds=0"], "--timeout_seconds must be > 0"),
        (["--num_ps=0"], "--num_ps"),
        ([f"--data={garbage}"], "cannot use the data"),
        ([f"--report_json={tmp_path}/no/r.json"], "--report_json=.* does not exist"),
        (["--inject=kill:worker:9@1s"], "does not exist"),
        (["--no_such_flag"], "no_such_flag"),
        # a job's own program: named so that every host can run it, data it can count
        ([f"--program={tmp_path}/nope.py"], "--program=.*no such file"),
        ([f"--program={prog}", f"--data={tmp_path}/*.csv"], "matches no file"),
        ([f"--program={prog}", f"--data={garbage}", "--data_format=tfrecord"],
         "truncated TFRecord"),
        ([f"--program={prog}", f"--data={garbage}"], "bad magic"),      # .adtr: its header
        ([f"--program={prog}", f"--data={prog}"], "data's format"),
        ([f"--program={prog}", f"--data={garbage}", "--data_format=csv"],
         "--data_format must be one of"),
        ([f"--program=pkg.mod", f"--code_dir={tmp_path}"], "module pkg.mod is not in"),
        (["--code_dir=/x"], "--code_dir and --data_format go with --program"),
        (["--", "--lr=1"], "unexpected arguments.*after '--'"),
    ]:
        res = run("antdt_tf.launch", f"--workdir={workdir}", *flags)
        refused(res, exitcodes.BAD_INPUT, words)
        assert not workdir.exists(), flags
        res = run("antdt_tf.launch", *flags, env={"TMPDIR": str(temp)})
        refused(res, exitcodes.BAD_INPUT, words)
        assert list(temp.iterdir()) == [], flags
    a_file = tmp_path / "a_file"
    a_file.write_text("mine\n")
    refused(run("antdt_tf.launch", f"--workdir={a_file}"), exitcodes.BAD_INPUT,
            "exists and is not a directory")
    assert a_file.read_text() == "mine\n"
    # under the workdir the launcher creates, a report's directory need not exist yet —
    # unless something in the way is not a directory
    refused(run("antdt_tf.launch", f"--workdir={tmp_path}/w", f"--report_json={a_file}/r.json"),
            exitcodes.BAD_INPUT, "is not a directory")
    refused(run("antdt_tf.launch", f"--workdir={a_file}/w", f"--report_json={a_file}/w/r.json"),
            exitcodes.BAD_INPUT, "exists and is not a directory|is not a directory")
    assert not (tmp_path / "w").exists() and a_file.read_text() == "mine\n"


def test_launch_dry_run_accepts_a_report_in_the_workdir_and_writes_nothing(tmp_path):
    """`make demo`'s own flags (--report_json inside the --workdir it creates): --dry_run
    says what would run and creates nothing, not even the workdir."""
    res = run("antdt_tf.launch", "--dry_run", f"--workdir={tmp_path}/.demo",
              f"--report_json={tmp_path}/.demo/sub/report.json", "--num_ps=2",
              "--num_workers=3", "--inject=slow:worker:2:x3@0s-15s", "--audit")
    assert res.returncode == 0, res.stderr
    assert "the job is valid" in res.stdout
    tasks = [line.split()[0] for line in res.stdout.splitlines() if line.startswith("    ")]
    assert tasks == ["ps:0", "ps:1", "worker:0", "worker:1", "worker:2", "coordinator"]
    assert f"{tmp_path}/.demo/sub/report.json" in res.stdout
    assert list(tmp_path.iterdir()) == []


def test_output_file_problem_under_a_directory_the_binary_creates(tmp_path):
    job = tmp_path / "job"
    assert exitcodes.output_file_problem(str(job / "r.json"), "--r", created_dir=str(job)) == ""
    assert exitcodes.output_file_problem(str(job / "a" / "r.json"), "--r",
                                         created_dir=str(job)) == ""
    assert "does not exist" in exitcodes.output_file_problem(str(job / "r.json"), "--r")
    assert "does not exist" in exitcodes.output_file_problem(     # beside it, not under it
        str(tmp_path / "jobX" / "r.json"), "--r", created_dir=str(job))
    (tmp_path / "f").write_text("")
    assert "is not a directory" in exitcodes.output_file_problem(
        str(tmp_path / "f" / "r.json"), "--r", created_dir=str(tmp_path / "f"))


@pytest.mark.parametrize("module,args,words", [
    ("antdt_tf.tf.server", ["--cluster={bad", "--job=ps"], "--cluster is not valid JSON"),
    ("antdt_tf.tf.server", ['--cluster={"ps": ["127.0.0.1:1"]}', "--job=worker"],
     "worker:0 is not in the cluster spec"),
    ("antdt_tf.tf.coordinator", ["--master=127.0.0.1:1", "--cluster=[]"], "--cluster must"),
    ("antdt_tf.tf.keras_trainer", ["--master=127.0.0.1:1", '--cluster={"ps": []}'],
     "needs a 'chief' job"),
    ("antdt_tf.sharding_demo", ["--slowdowns=x"], "--slowdowns"),
])
def test_the_task_binaries_answer_bad_flags_in_one_line(module, args, words):
    refused(run(module, *args), exitcodes.BAD_INPUT, words)


def test_the_exit_code_page_documents_every_code():
    page = (ROOT / "docs" / "cli-exit-codes.md").read_text()
    for name in ("OK", "FAILED", "BAD_INPUT", "BAD_STATE", "CANNOT_SERVE",
                 "CLUSTER_UNAVAILABLE"):
        assert f"| {getattr(exitcodes, name)} |" in page, name


@pytest.mark.slow
def test_tf_server_on_a_busy_port_says_so_in_one_line(busy_port):
    """Imports TensorFlow (seconds)."""
    res = run("antdt_tf.tf.server", f'--cluster={{"ps": ["127.0.0.1:{busy_port}"]}}',
              "--job=ps")
    refused(res, exitcodes.CANNOT_SERVE, f"ps:0 cannot serve on 127.0.0.1:{busy_port}")


def test_kubernetes_flags_are_checked_before_anything_is_submitted(tmp_path):
    """antdt-launch --backend=kubernetes needs where the master is and cluster paths;
    antdt-master refuses bad --kubernetes_* flags before it serves."""
    for flags, words in [
        (["--backend=kubernetes", "--data=/antdt/d.adtr", "--workdir=/antdt/j"],
         "needs --namespace"),
        (["--backend=kubernetes", "--namespace=ns", "--data=rel.adtr", "--workdir=/antdt/j"],
         "absolute paths on the job's volume"),
        (["--backend=kubernetes", "--namespace=ns"], "needs --data and --workdir"),
        (["--backend=kubernetes", "--namespace=ns", "--data=/antdt/d.adtr",
          "--workdir=/antdt/j", "--inject=kill:worker:0@1s"], "fault injection"),
        (["--backend=kubernetes", "--namespace=ns", "--data=/antdt/d.adtr",
          "--workdir=/antdt/j", "--api=keras"], "custom_loop"),
        (["--namespace=ns"], "--namespace goes with --backend=kubernetes"),
    ]:
        refused(run("antdt_tf.launch", *flags), exitcodes.BAD_INPUT, words)
    for flags, words in [
        (["--kubernetes_image=img", "--kubernetes_namespace=ns", "--kubernetes_job=Bad_Name"],
         "bad --kubernetes_\\* flags: job name"),
        (["--kubernetes_image=img", "--kubernetes_namespace=ns",
          "--kubernetes_node_selector=pool"], "expected LABEL=VALUE"),
        (["--kubernetes_image=img"], "--kubernetes_namespace is needed outside"),
    ]:
        refused(run("antdt_tf.master", f"--port_file={tmp_path}/p", *flags),
                exitcodes.BAD_INPUT, words)
        assert not (tmp_path / "p").exists()
