"""--inject values: every documented form parses; every mistake gets a message that
says what is wrong; antdt-launch refuses bad flags before starting anything."""

import pathlib
import subprocess
import sys

import pytest

from antdt_tf.agent.inject import Injection, parse_injection
from antdt_tf.errors import InvalidRequest
from antdt_tf.job.spec import place

LAUNCH_BIN = str(pathlib.Path(sys.executable).parent / "antdt-launch")


@pytest.mark.parametrize("text,expect", [
    ("kill:worker:1@30s", Injection("kill", "worker", 1, 30.0)),
    ("kill:ps:0@60", Injection("kill", "ps", 0, 60.0)),
    ("kill:coordinator@45s", Injection("kill", "chief", 0, 45.0)),
    ("kill:master@20s", Injection("kill", "master", 0, 20.0)),
    ("slow:worker:2:x4@10s", Injection("slow", "worker", 2, 10.0, None, 4.0)),
    ("slow:worker:2:x4@10s-70s", Injection("slow", "worker", 2, 10.0, 70.0, 4.0)),
    ("slow:ps:0:x2.5@1.5s-3s", Injection("slow", "ps", 0, 1.5, 3.0, 2.5)),
    ("scale:workers:5@30s", Injection("scale", "worker", 5, 30.0)),
    ("scale:workers:1@2.5", Injection("scale", "worker", 1, 2.5)),
    ("scale:workers:3@1%", Injection("scale", "worker", 3, 1.0, percent=True)),
    ("kill:worker:1@25%", Injection("kill", "worker", 1, 25.0, percent=True)),
    ("slow:ps:0:x2@5.5%", Injection("slow", "ps", 0, 5.5, None, 2.0, percent=True)),
])
def test_documented_forms_parse(text, expect):
    assert parse_injection(text, num_ps=2, num_workers=3, max_workers=5) == expect


@pytest.mark.parametrize("text,message", [
    ("kill:worker@3s", "needs an index"),
    ("kill:worker:3@3s", "does not exist"),
    ("kill:ps:2@3s", "does not exist"),
    ("slow:worker:1:x0.5@3s", ">= 1"),
    ("slow:worker:1:x2@30s-10s", "not after"),
    ("kill:worker:1@3s-5s", "not a range"),
    ("slow:master:x2@3s", "not supported"),
    ("kill:master:1@3s", "only one"),
    ("explode:worker:1@3s", "expected kill"),
    ("kill:worker:1", "expected kill"),
    ("scale:workers:4@3s", "can scale to 1..3 workers"),
    ("scale:workers:0@3s", "can scale to 1..3 workers"),
    ("scale:workers:2@3s-5s", "expected kill"),
    ("slow:worker:1:x2@5%-9s", "not a range"),
    ("kill:worker:1@101%", "not a range"),
])
def test_mistakes_are_explained(text, message):
    with pytest.raises(InvalidRequest, match=message):
        parse_injection(text, num_ps=2, num_workers=3)


def test_placement_spreads_ps_and_workers_over_hosts():
    where = place(num_ps=2, num_workers=3, num_hosts=3)
    assert where["master", 0] == where["chief", 0] == 0
    assert {where["ps", 0], where["ps", 1]} == {0, 1}
    assert sorted(where["worker", i] for i in range(3)) == [0, 1, 2]


@pytest.mark.parametrize("flag,message", [
    ("--inject=kill:worker:9@1s", "does not exist"),
    ("--num_workers=0", "must be >= 1"),
    ("--data=/nonexistent/train.adtr", "cannot use the data"),
    ("--batch_size=0", "must be >= 1"),
    ("--max_workers=2", "--max_workers must be 0 or >= --num_workers"),
    ("--policy=nope", "unknown policy 'nope'"),
    ("--policy=no_such_module:P", "cannot load policy"),
    ("--straggler_slow_ratio=0.5", "slow_ratio must be > 1"),
    ("--api=mts --policy=static", "needs --api=custom_loop"),
    ("--mode=bsp --policy=backup", "(backup workers) needs a trainer"),
    ("--api=keras --policy=backup", "(backup workers) needs a trainer"),
    ("--api=mts --inject=kill:ps:0@1s", "is not supported"),
    ("--api=estimator --estimator_python=/nonexistent/python", "needs TF 2.15's venv"),
])
def test_launch_rejects_bad_flags_before_starting_anything(tmp_path, flag, message):
    out = subprocess.run([LAUNCH_BIN, *flag.split(), f"--workdir={tmp_path}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2        # bad input (antdt_tf.exitcodes)
    assert message in out.stderr
    assert not list(tmp_path.glob("host*"))   # no agent was started


def test_free_ports_are_bindable_and_outside_the_kernels_ephemeral_range():
    """The launcher's ports for TF servers, agents and the master: a port the kernel can
    hand out by itself (bind to 0, outgoing connections) could be taken before our
    server binds it (seen: an agent's port-0 server got a TF worker's port)."""
    import socket

    from antdt_tf.tf.local_cluster import _ephemeral_range, free_ports

    lo, _ = _ephemeral_range()
    ports = free_ports(16)
    assert len(set(ports)) == 16 and all(10000 <= p < lo for p in ports), (ports, lo)
    # the kernel never gives them out meanwhile: 200 port-0 binds miss all of them
    socks = []
    try:
        for _ in range(200):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        assert not {s.getsockname()[1] for s in socks} & set(ports)
    finally:
        for s in socks:
            s.close()
    for p in ports:   # and each is free for the server that asks for it by number
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
