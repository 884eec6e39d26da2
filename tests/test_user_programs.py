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
    project = tmp_path / "my-project"
    if api == "custom_loop":      # a module of the user's package: pkg.module + code_dir
        user_programs.write_program(project / "ranking", api, name="loop.py")
        (project / "ranking" / "__init__.py").write_text("")
        program = ["--program=ranking.loop", f"--code_dir={project}"]
    else:                         # a file
        program = [f"--program={user_programs.write_program(project, api)}"]
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "antdt_tf.launch", f"--api={api}", *program,
           f"--data={user_data}/*.tfrecord", "--num_ps=1", "--num_workers=2",
           "--records_per_shard=500", "--epochs=3", "--noprogress",
           f"--workdir={tmp_path / 'job'}",
           f"--report_json={report}", "--timeout_seconds=240", *flags,
           "--", f"--batch_size={BATCH}", *program_args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:] + out.stdout[-2000:]
    return json.loads(report.read_text()), out.stderr


def check_exactly_once(report, kills: int, epochs: int = 3):
    audit = report["audit"]
    assert report["records"] == epochs * sum(RECORDS)
    assert audit["expected_times"] == epochs
    assert audit["applied_0"] == 0, audit               # nothing lost
    assert audit["applied_other"] <= kills * BATCH, audit
    assert audit["ok"], audit
    assert sum(report["records_per_worker"]) >= epochs * sum(RECORDS) - kills * BATCH


@pytest.mark.parametrize("api", ["keras", "custom_loop", "mts", "estimator"])
def test_a_users_program_survives_a_worker_kill_locally(tmp_path, user_data, api):
    report, log = launch(tmp_path, user_data, api, "--inject=kill:worker:1@40%")
    check_exactly_once(report, kills=1)
    assert report["restarts"] == {"worker:1": 1}
    assert "injected: SIGKILL worker:1" in log
    # the program's own summary is the job's (what it wrote, where the contract said)
    assert report["coordinator"]["batch_size"] == BATCH




def test_a_tf1_job_that_loses_a_ps_fails_at_once_saying_why(tmp_path, user_data):
    """No TF1 PS recovery here: the job ends with the reason, not at its timeout."""
    import time

    import psutil

    program = user_programs.write_program(tmp_path / "my-project", "mts")
    proc = subprocess.Popen(
        [sys.executable, "-m", "antdt_tf.launch", "--api=mts", f"--program={program}",
         f"--data={user_data}/*.tfrecord", "--num_ps=1", "--num_workers=2", "--epochs=20",
         "--records_per_shard=500", "--noprogress", f"--workdir={tmp_path / 'job'}",
         "--timeout_seconds=600", "--", f"--batch_size={BATCH}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def the_ps():      # a process of this launcher's own tree (its agents' tasks)
            for child in psutil.Process(proc.pid).children(recursive=True):
                try:
                    if "--job=ps" in child.cmdline():
                        return child
                except psutil.Error:
                    pass
            return None
        from waiting import wait_for

        ps = wait_for(the_ps, 240, "the job's PS process")
        wait_for(lambda: (tmp_path / "job" / "checkpoints" / "checkpoint").exists(), 240,
                 "the first checkpoint (training under way)")
        ps.kill()
        t0 = time.monotonic()
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out[-3000:]
    assert "does not survive the loss of a PS" in out, out[-3000:]
    assert time.monotonic() - t0 < 60

def test_antdt_tfs_own_trainer_runs_as_a_program_like_any_other(tmp_path):
    """The built-in custom-loop chief, named as the job's program, takes the job from
    the contract (TF_CONFIG, ANTDT_*) and trains the generated .adtr data exactly once
    through a worker SIGKILL."""
    report = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "antdt_tf.launch", "--program=antdt_tf.tf.coordinator",
         "--generate_records=20000", "--eval_records=0", "--num_ps=1", "--num_workers=2",
         "--records_per_shard=500", "--audit", "--noprogress",
         f"--workdir={tmp_path / 'job'}", f"--report_json={report}",
         "--timeout_seconds=240", "--inject=kill:worker:1@40%",
         "--", "--buckets=4096", f"--batch_size={BATCH}"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    got = json.loads(report.read_text())
    assert "restored_from" in got["coordinator"]    # its own report, at the contract's path
    audit = got["audit"]
    assert got["records"] == 20_000 and audit["applied_0"] == 0 and audit["ok"], audit
    assert got["restarts"] == {"worker:1": 1}

# ---- on real hosts (network namespaces), through their agents --------------------

@pytest.fixture(scope="module")
def big_user_data(tmp_path_factory):
    """Enough of the user's data for a job that lasts past a host loss at a third."""
    d = tmp_path_factory.mktemp("user-data-big")
    first = 0
    for k in range(4):
        user_programs.write_examples(d / f"part-{k}.tfrecord", first, 15_000, seed=k)
        first += 15_000
    return d


# the agents' TF 2.15 interpreter for tf.estimator tasks (make venv-tf215)
TF215 = user_programs.ROOT / ".venv-tf215" / "bin" / "python"
ESTIMATOR_PYTHON = (f"--estimator_python={TF215}",) if TF215.exists() else ()


@pytest.fixture
def hosts(tmp_path, monkeypatch, big_user_data):
    import netns

    ok, why = netns.available()
    if not ok:
        pytest.skip(why)
    netns.job_security(tmp_path / "tls", monkeypatch.setenv)
    project = tmp_path / "my-project"
    project.mkdir()
    with netns.NetnsHosts(3) as net:
        master = netns.start_antdt_cluster(
            net, tmp_path, "--straggler_window_seconds=3",
            "--straggler_persistent_after_seconds=2",
            agent_flags=(f"--program_roots={project}", f"--read_roots={big_user_data}",
                         *ESTIMATOR_PYTHON))
        yield net, master


def launch_on_agents(tmp_path, master, data, api: str, *flags: str):
    program = user_programs.write_program(tmp_path / "my-project", api)
    return subprocess.Popen(
        [sys.executable, "-m", "antdt_tf.launch", "--backend=agents", f"--master={master}",
         "--num_hosts=3", f"--api={api}", f"--program={program}", f"--data={data}/*.tfrecord",
         "--records_per_shard=1000", "--checkpoint_every_seconds=2", "--noprogress",
         "--host_timeout_seconds=3", f"--workdir={tmp_path / 'job'}",
         f"--report_json={tmp_path / 'report.json'}", "--timeout_seconds=400", *flags,
         "--", f"--batch_size={BATCH}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc, tmp_path):
    out, _ = proc.communicate(timeout=450)
    assert proc.returncode == 0, out[-6000:]
    return json.loads((tmp_path / "report.json").read_text()), out


# (api, PS, the host lost, the tasks it runs): TF1 between-graph has no PS recovery (a
# PS loss ends a TF1 job: docs/program.md), so its lost host runs a worker only
HOST_LOSS = {"keras": (2, 0, ("chief:0", "ps:0", "worker:1")),
             "mts": (1, 2, ("worker:1",)), "estimator": (1, 2, ("worker:1",))}


@pytest.mark.parametrize("api", sorted(HOST_LOSS))
def test_a_users_program_survives_losing_a_host(hosts, tmp_path, big_user_data, api):
    """Every process of a host SIGKILLed at once, agent included, at a third of the job
    (Keras: the chief's host, with ps:0 and worker:1 on it); the master relaunches its
    tasks elsewhere and the user's program comes back from its last checkpoint (model
    and data position together)."""
    from jobs import wait_for_records

    net, master = hosts
    if api == "estimator" and not ESTIMATOR_PYTHON:
        pytest.skip("tf.estimator needs TF 2.15's venv: make venv-tf215")
    num_ps, host, lost = HOST_LOSS[api]
    proc = launch_on_agents(tmp_path, master, big_user_data, api, f"--num_ps={num_ps}",
                            "--num_workers=2", "--policy=dynamic")
    try:
        wait_for_records(master, proc, 20_000)       # progress, not time
        assert len(net.kill_host(host)) >= 1 + len(lost)     # its agent and tasks
    except BaseException:
        proc.kill()
        raise
    report, out = finish(proc, tmp_path)
    assert f"h{host}" not in report["hosts"].values(), report["hosts"]
    for task in lost:
        assert report["restarts"].get(task, 0) >= 1, (task, report["restarts"])
    assert report["records"] == 60_000
    # the user's counter restored with the model: every record once since the start
    audit = report["audit"]
    assert audit["applied_0"] == 0 and audit["ok"], audit


@pytest.mark.parametrize("api", ["keras"])
def test_the_controller_moves_a_users_straggler_to_another_host(hosts, tmp_path,
                                                                 big_user_data, api):
    """AntDT-ND relaunches the x4-slowed worker of the user's job on another host: a new
    address, so the user's chief restarts with the new cluster and restores."""
    net, master = hosts
    proc = launch_on_agents(tmp_path, master, big_user_data, api, "--num_ps=1",
                            "--num_workers=2", "--policy=antdt-nd",
                            "--relaunch_cost_seconds=1", "--min_gain_seconds=0.5",
                            # epochs: a job long enough for the move to land in it
                            "--epochs=5", "--inject=slow:worker:1:x4@0s")
    report, out = finish(proc, tmp_path)
    moves = [a for a in report["actions"] if a["action"] == "RelaunchWorker"]
    assert len(moves) == 1, (report["actions"], report["health"], report["events"])
    assert (moves[0]["job"], moves[0]["index"]) == ("worker", 1)
    assert moves[0]["from_host"] != moves[0]["to_host"]
    assert "recovered_after_s" in moves[0], moves[0]      # the move landed in the job
    assert any("worker:1 moved to 198.18.0." in ev["event"] for ev in report["events"])
    assert report["records"] == 5 * 60_000
    audit = report["audit"]
    assert audit["applied_0"] == 0 and audit["ok"], audit
