"""The one translation of a typed start request into a command line (agent.programs):
every backend builds a task's command here, so a backend never edits an argv; a job's
own program runs only from where the agent's operator allowed; and the program's side
of the contract (antdt_tf.program) reads what the agent wrote."""

import pytest

from antdt_tf.agent.programs import PathPolicy, command_for
from antdt_tf.agent.client import start_request
from antdt_tf.errors import InvalidRequest
from antdt_tf.proto import cluster_pb2 as cpb

PATHS = PathPolicy(job_roots=("/tmp/antdt-job",))


def probe_request(endpoint: str) -> cpb.StartTaskRequest:
    return start_request("worker", 1, cpb.PROBE_TASK, cpb.ProbeTaskArgs(endpoint=endpoint),
                         endpoint=endpoint)


def test_a_probe_binds_its_advertised_endpoint_unless_the_backend_names_its_bind_host():
    assert command_for(probe_request("worker-1:2222"), PATHS).argv[0] == \
        "--endpoint=worker-1:2222"
    # a pod is reached by its Service name but binds its own IP (expanded by Kubernetes)
    command = command_for(probe_request("worker-1:2222"), PATHS, bind_host="$(ANTDT_POD_IP)")
    assert command.argv[0] == "--endpoint=$(ANTDT_POD_IP):2222"
    assert command.module == "antdt_tf.agent.probe_task"


def test_the_bind_host_does_not_reach_other_programs_arguments():
    cluster = cpb.ClusterAddresses(jobs={
        "ps": cpb.ClusterAddresses.Addresses(address=["ps-0:2222"]),
        "worker": cpb.ClusterAddresses.Addresses(address=["worker-0:2222"])})
    req = start_request("ps", 0, cpb.TF_SERVER, cpb.TfServerArgs(job="ps", index=0,
                                                                  cluster=cluster))
    assert command_for(req, PATHS, bind_host="$(ANTDT_POD_IP)") == command_for(req, PATHS)


def test_a_bad_probe_endpoint_is_refused_before_any_bind_host_is_applied():
    with pytest.raises(InvalidRequest, match="probe.endpoint must be host:port"):
        command_for(probe_request("no-port"), PATHS, bind_host="$(ANTDT_POD_IP)")


# ---- a job's own program (USER_PROGRAM): only from under the agent's program roots

def cluster(**jobs) -> cpb.ClusterAddresses:
    return cpb.ClusterAddresses(jobs={job: cpb.ClusterAddresses.Addresses(address=a)
                                      for job, a in jobs.items()})


PSS = cluster(chief=["c:1"], ps=["p:1"], worker=["w0:1", "w1:1"])


def user_request(program: str, code_dir: str = "", api: str = "keras", role: str = "chief",
                 index: int = 0, generation: int = 3, **fields) -> cpb.StartTaskRequest:
    args = cpb.UserProgramArgs(program=program, code_dir=code_dir, api=api, role=role,
                               index=index, master="m:7000", dataset="train",
                               cluster=fields.pop("cluster", PSS), argv=["--lr=0.1", "x y"],
                               checkpoint_dir="/tmp/antdt-job/ckpt", **fields)
    return start_request("chief" if role == "chief" else "worker", index, cpb.USER_PROGRAM,
                         args, generation=generation)


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "programs"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "trainer.py").write_text("def main():\n    return 0\n")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "evil.py").write_text("print('evil')\n")
    (root / "link.py").symlink_to(outside / "evil.py")
    paths = PathPolicy(job_roots=("/tmp/antdt-job",), program_roots=(str(root),))
    return root, outside, paths


def test_a_program_file_runs_with_the_job_in_its_environment(project):
    import json

    root, _, paths = project
    command = command_for(user_request(str(root / "train.py")), paths)
    assert command.module == "antdt_tf.program_main"
    assert command.argv == (str(root / "train.py"), "--lr=0.1", "x y")   # as they are
    env = dict(command.env)
    assert env["ANTDT_MASTER"] == "m:7000" and env["ANTDT_GENERATION"] == "3"
    assert env["ANTDT_ROLE"] == "chief" and env["ANTDT_CHECKPOINT_DIR"] == "/tmp/antdt-job/ckpt"
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"chief": ["c:1"], "ps": ["p:1"], "worker": ["w0:1", "w1:1"]},
        "task": {"type": "chief", "index": 0}}
    assert "PYTHONPATH" not in env and not command.estimator


def test_a_module_program_runs_from_its_code_dir(project):
    root, _, paths = project
    command = command_for(user_request("pkg.trainer:main", code_dir=str(root)), paths)
    assert command.argv[0] == "pkg.trainer:main"
    assert dict(command.env)["PYTHONPATH"] == str(root)
    # antdt-tf's own trainers are programs like any other, from the installed package
    assert command_for(user_request("antdt_tf.tf.keras_trainer"), paths).argv[0] == \
        "antdt_tf.tf.keras_trainer"


def test_estimator_roles_and_interpreter(project):
    import json

    root, _, paths = project
    tf1 = cluster(ps=["p:1"], worker=["w0:1", "w1:1", "w2:1"])
    command = command_for(user_request(str(root / "train.py"), api="estimator",
                                       role="worker", index=2, cluster=tf1), paths)
    assert command.estimator
    assert json.loads(dict(command.env)["TF_CONFIG"]) == {
        "cluster": {"chief": ["w0:1"], "worker": ["w1:1", "w2:1"], "ps": ["p:1"]},
        "task": {"type": "worker", "index": 1}}


@pytest.mark.parametrize("program,code_dir,reason", [
    ("{outside}/evil.py", "", "outside the program roots"),
    ("{root}/link.py", "", "outside the program roots"),          # a symlink out
    ("{root}/missing.py", "", "does not exist"),
    ("relative/train.py", "", "must be an absolute path"),
    ("http.server", "", "needs its code_dir"),                     # not a module of ours
    ("pkg.nothere", "{root}", "is not in code_dir"),
    ("pkg.trainer", "{outside}", "outside the program roots"),
    ("pkg.trainer; rm -rf /", "{root}", "must be /abs/path/file.py or pkg.module"),
    ("{root}/train.py", "{root}", "code_dir goes with a module program"),
])
def test_a_program_outside_the_roots_or_missing_is_refused(project, program, code_dir,
                                                           reason):
    root, outside, paths = project
    fill = {"root": root, "outside": outside}
    req = user_request(program.format(**fill), code_dir=code_dir.format(**fill))
    with pytest.raises(InvalidRequest, match=reason):
        command_for(req, paths)


def test_an_agent_without_program_roots_runs_only_antdt_tfs_own(project):
    root, _, _ = project
    paths = PathPolicy(job_roots=("/tmp/antdt-job",))
    with pytest.raises(InvalidRequest, match="runs no job's own programs"):
        command_for(user_request(str(root / "train.py")), paths)
    assert command_for(user_request("antdt_tf.tf.coordinator", api="custom_loop"), paths)


def test_a_role_the_api_has_not_is_refused(project):
    root, _, paths = project
    with pytest.raises(InvalidRequest, match="role must be one of .* for api=keras"):
        command_for(user_request(str(root / "train.py"), role="ps"), paths)


# ---- the program's side of the contract (antdt_tf.program)

def test_a_program_reads_what_the_agent_wrote():
    from antdt_tf import program

    ctx = program.Context(master="m:1", dataset="train", checkpoint_dir="/c",
                          checkpoint_every_seconds=2.5, report_json="/r.json", api="mts",
                          role="worker", index=0, generation=4, worker_slots=3, audit=True,
                          tf_config={"cluster": {"ps": ["p:1"], "worker": ["w:1"]},
                                     "task": {"type": "worker", "index": 0}})
    assert program.context(program.environment(ctx)) == ctx
    assert ctx.is_chief and ctx.cluster == {"ps": ["p:1"], "worker": ["w:1"]}
    with pytest.raises(program.NotAJobTask, match="antdt-launch --program"):
        program.context({})


@pytest.mark.parametrize("body,code", [
    ("return 3", 3), ("return None", 0),
    ("import tensorflow as tf\n    raise tf.errors.UnavailableError(None, None, 'ps:0 gone')",
     75),
    ("raise ValueError('mine')", 1),
])
def test_run_gives_main_the_contracts_exit_codes(tmp_path, body, code):
    import subprocess
    import sys

    script = tmp_path / "p.py"
    script.write_text(f"from antdt_tf import program\ndef main():\n    {body}\n"
                      "program.run(main)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == code, out.stderr[-2000:]
    if code == 75:
        assert "restart me" in out.stderr
