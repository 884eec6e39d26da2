"""The job token: calls without it, or with another, are refused UNAUTHENTICATED and
change nothing; health checks stay open; a server refuses to listen beyond loopback
without a token. Real gRPC servers (an in-process master, an agent process)."""

import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from antdt_tf import auth
from antdt_tf.proto import cluster_pb2 as cpb
from antdt_tf.agent.client import AgentClient
from antdt_tf.errors import AntdtError
from antdt_tf.sharding.client import ShardingClient
from antdt_tf.sharding.plan import DataFile, DatasetSpec
from antdt_tf.master.server import BackgroundMaster
from antdt_tf.sharding.service import ShardingServicer
from antdt_tf.sharding.state import ShardState

TOKEN = "s3cret-job-token"
SPEC = DatasetSpec("train", records_per_shard=10, files=(DataFile("/data/a", 100),))


@pytest.fixture
def master():
    with BackgroundMaster(ShardingServicer(ShardState()), token=TOKEN) as m:
        yield m


def _code(call) -> grpc.StatusCode:
    with pytest.raises(AntdtError) as e:
        call()
    return e.value.__cause__.code()


def test_master_refuses_calls_without_the_token_and_changes_nothing(master):
    for token in ("", "wrong-token"):
        with ShardingClient(master.address, channel=auth.channel(master.address,
                                                                 token=token)) as c:
            assert _code(lambda: c.register_dataset(SPEC)) == grpc.StatusCode.UNAUTHENTICATED
            assert _code(lambda: c.progress("")) == grpc.StatusCode.UNAUTHENTICATED
    with ShardingClient(master.address, channel=auth.channel(master.address,
                                                             token=TOKEN)) as c:
        assert not c.progress("").datasets        # the refused register changed nothing
        c.register_dataset(SPEC)
        assert [d.name for d in c.progress("").datasets] == ["train"]
    with grpc.insecure_channel(master.address) as ch:   # health stays open
        answer = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                      timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_the_token_comes_from_the_environment(master, monkeypatch):
    monkeypatch.setenv(auth.TOKEN_ENV, TOKEN)
    with ShardingClient(master.address) as c:
        c.register_dataset(SPEC)
    monkeypatch.setenv(auth.TOKEN_ENV, "other")
    with ShardingClient(master.address) as c:
        assert _code(lambda: c.progress("")) == grpc.StatusCode.UNAUTHENTICATED


def _agent_with_token(tmp_path, *flags):
    """A real antdt-agent process that enforces TOKEN (and ``flags``); (proc, address)."""
    import time

    port_file = tmp_path / "port"
    env = dict(__import__("os").environ, ANTDT_JOB_TOKEN=TOKEN)
    proc = subprocess.Popen([sys.executable, "-m", "antdt_tf.agent.agent", "--port=0",
                             f"--port_file={port_file}", f"--task_log_dir={tmp_path}", *flags],
                            env=env, start_new_session=True)
    deadline = time.monotonic() + 30
    try:
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    except BaseException:
        proc.kill()
        proc.wait(30)
        raise
    return proc, f"127.0.0.1:{port_file.read_text().strip()}"


def test_agent_refuses_a_start_without_the_token(tmp_path):
    proc, address = _agent_with_token(tmp_path)
    try:
        intruder = AgentClient(address, 10, auth.channel(address, token=""))
        code = _code(lambda: intruder.start("worker", 0, cpb.PROBE_TASK,
                                            cpb.ProbeTaskArgs(exit_after_seconds=0)))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        owner = AgentClient(address, 10, auth.channel(address, token=TOKEN))
        assert list(owner.list().tasks) == []      # nothing was started
        intruder.close()
        owner.close()
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize("module", ["antdt_tf.master", "antdt_tf.agent.agent"])
def test_listening_beyond_loopback_needs_a_token(module, tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if k != auth.TOKEN_ENV}
    out = subprocess.run([sys.executable, "-m", module, "--bind=0.0.0.0", "--port=0"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode != 0
    assert "without authentication" in out.stderr and auth.TOKEN_ENV in out.stderr
    empty = tmp_path / "token"
    empty.write_text("\n")
    out = subprocess.run([sys.executable, "-m", module, "--bind=0.0.0.0", "--port=0",
                          f"--token_file={empty}"], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode != 0 and "is empty" in out.stderr


def test_loopback_detection():
    assert auth.is_loopback("127.0.0.1") and auth.is_loopback("[::1]")
    assert auth.is_loopback("localhost") and auth.is_loopback("127.3.2.1")
    assert not auth.is_loopback("0.0.0.0") and not auth.is_loopback("198.18.0.1")
    assert not auth.is_loopback("example.org")


def test_tf_rpc_data_path_carries_the_token_in_its_arguments(monkeypatch):
    """TF's RPC ops send no metadata: the workers' calls pass the token as their last
    argument. Real TF ops (the TF2 workers' path) and the Python client (TF1 feed)."""
    import tensorflow as tf

    from antdt_tf.sharding.tf_rpc_client import TfRpcClient
    from antdt_tf.tf import master_rpc

    with BackgroundMaster(ShardingServicer(ShardState()), token=TOKEN) as m:
        with ShardingClient(m.address, channel=auth.channel(m.address, token=TOKEN)) as c:
            c.register_dataset(SPEC)
        monkeypatch.setenv(auth.TOKEN_ENV, TOKEN)
        client = master_rpc.rpc_client(m.address, 5000, "auth-test")
        (inc,) = master_rpc.rpc_call(client, "antdt.open", [tf.constant("train"),
                                                   tf.constant(0, tf.int64)], [tf.int64], 5000)
        assert int(inc) > 0
        with TfRpcClient(m.address, "train", 1, timeout=5, unavailable_seconds=1) as py:
            assert py.open() > 0 and py.next().status == 1    # a lease
        monkeypatch.delenv(auth.TOKEN_ENV)
        other = master_rpc.rpc_client(m.address, 5000, "auth-test-2")
        with pytest.raises(tf.errors.UnauthenticatedError):
            master_rpc.rpc_call(other, "antdt.open", [tf.constant("train"), tf.constant(2, tf.int64)],
                       [tf.int64], 5000)
        with TfRpcClient(m.address, "train", 3, timeout=5, unavailable_seconds=1) as py:
            with pytest.raises(AntdtError):
                py.open()
        with ShardingClient(m.address, channel=auth.channel(m.address, token=TOKEN)) as c:
            tasks = {(t.task.type, t.task.index) for t in c.progress("train").tasks}
        assert ("worker", 2) not in tasks and ("worker", 3) not in tasks   # refused: nothing


@pytest.fixture(scope="module")
def cas(tmp_path_factory):
    """The job's CA (and its certificate) and a stranger's CA, each a real throw-away PKI."""
    root = tmp_path_factory.mktemp("pki")
    return auth.make_job_ca(root / "job"), auth.make_job_ca(root / "stranger")


def _refused(call) -> grpc.StatusCode:
    with pytest.raises(AntdtError) as e:
        call()
    return e.value.__cause__.code()


def test_master_with_tls_refuses_peers_without_the_jobs_certificate(cas, tmp_path):
    """Mutual TLS: no certificate, a certificate another CA signed, or the right
    certificate without the token — each refused, and nothing changed."""
    job, stranger = cas
    with BackgroundMaster(ShardingServicer(ShardState()), token=TOKEN, tls=job) as m:
        attempts = {
            "plaintext": auth.channel(m.address, token=TOKEN, tls=None),
            "stranger's certificate": auth.channel(m.address, token=TOKEN, tls=stranger),
            # our CA trusted, but the client's own certificate is the stranger's
            "stranger's client certificate": auth.channel(
                m.address, token=TOKEN, tls=auth.TlsFiles(stranger.cert, stranger.key, job.ca)),
            "no token": auth.channel(m.address, token="", tls=job),
        }
        for what, ch in attempts.items():
            with ShardingClient(m.address, channel=ch, timeout=2) as c:
                code = _refused(lambda: c.register_dataset(SPEC))
                # a failed handshake: the call never reaches the master (a client that
                # waits for the channel to be ready runs out of time instead)
                assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                grpc.StatusCode.UNAUTHENTICATED), what
        with ShardingClient(m.address, channel=auth.channel(m.address, token=TOKEN,
                                                             tls=job)) as c:
            assert not c.progress("").datasets        # every refused call changed nothing
            c.register_dataset(SPEC)
            assert [d.name for d in c.progress("").datasets] == ["train"]
        info = m.server.monitor.master_info
        assert info.tls and info.tf_rpc_address != m.address   # TF's ops: their own port


def test_tls_data_path_keeps_checking_the_token(cas, monkeypatch):
    """TF's RPC ops speak no TLS: with TLS the master serves them on a plaintext port of
    their own (GetMasterInfo), where the token is still checked."""
    import tensorflow as tf

    from antdt_tf.tf import master_rpc

    job, _ = cas
    with BackgroundMaster(ShardingServicer(ShardState()), token=TOKEN, tls=job) as m:
        monkeypatch.setenv(auth.TOKEN_ENV, TOKEN)
        for name, var in auth.TLS_ENV.items():
            monkeypatch.setenv(var, getattr(job, name))
        with ShardingClient(m.address) as c:                  # TLS + token from the env
            c.register_dataset(SPEC)
        assert master_rpc.tf_rpc_address(m.address) == m.server.monitor.master_info.tf_rpc_address
        client = master_rpc.rpc_client(m.address, 5000, "tls-test")
        (inc,) = master_rpc.rpc_call(client, "antdt.open", [tf.constant("train"),
                                                   tf.constant(0, tf.int64)], [tf.int64], 5000)
        assert int(inc) > 0
        monkeypatch.delenv(auth.TOKEN_ENV)
        other = master_rpc.rpc_client(m.address, 5000, "tls-test-2")
        with pytest.raises(tf.errors.UnauthenticatedError):
            master_rpc.rpc_call(other, "antdt.open", [tf.constant("train"), tf.constant(2, tf.int64)],
                       [tf.int64], 5000)


def test_agent_with_tls_refuses_a_start_from_a_stranger(cas, tmp_path):
    job, stranger = cas
    proc, address = _agent_with_token(tmp_path, f"--tls_cert={job.cert}",
                                      f"--tls_key={job.key}", f"--tls_ca={job.ca}")
    try:
        start = lambda c: c.start("worker", 0, cpb.PROBE_TASK,  # noqa: E731
                                  cpb.ProbeTaskArgs(exit_after_seconds=0))
        for tls in (None, stranger):
            intruder = AgentClient(address, 2, auth.channel(address, token=TOKEN, tls=tls))
            assert _refused(lambda: start(intruder)) in (grpc.StatusCode.UNAVAILABLE,
                                                         grpc.StatusCode.DEADLINE_EXCEEDED)
            intruder.close()
        owner = AgentClient(address, 10, auth.channel(address, token=TOKEN, tls=job))
        assert list(owner.list().tasks) == []      # nothing was started
        owner.close()
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize("module", ["antdt_tf.master", "antdt_tf.agent.agent"])
def test_listening_beyond_loopback_needs_tls_too(module, cas, tmp_path):
    job, _ = cas
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in auth.TLS_ENV.values()}
    env[auth.TOKEN_ENV] = TOKEN
    out = subprocess.run([sys.executable, "-m", module, "--bind=0.0.0.0", "--port=0"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode != 0 and "without TLS" in out.stderr
    assert "--allow_plaintext_network_access" in out.stderr
    out = subprocess.run([sys.executable, "-m", module, "--bind=0.0.0.0", "--port=0",
                          f"--tls_cert={job.cert}", f"--tls_key={job.key}"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode != 0 and "missing --tls_ca" in out.stderr
    (tmp_path / "junk.pem").write_text("not a certificate")
    out = subprocess.run([sys.executable, "-m", module, "--port=0",
                          f"--tls_cert={tmp_path / 'junk.pem'}", f"--tls_key={job.key}",
                          f"--tls_ca={job.ca}"], capture_output=True, text=True, timeout=60,
                         env=env)
    assert out.returncode != 0 and "not a PEM file" in out.stderr
    assert "Traceback" not in out.stderr
