"""The multi-host recipe of docs/backends.md ("Run on several machines") runs as written.

The test reads the recipe's ```sh block and runs every command in it, in order, each in
a shell on the host the recipe names: the master on 10.0.0.5, one agent per job host
(the host its ``--bind`` names), everything else (making the CA, the token, the data, the
launch) on one job host. The hosts are four network namespaces this test creates
(``tests/netns.py``: the master's host and three job hosts in 198.18.0.0/24). The shell
of every command after the recipe's ``export`` line runs that line first, as the recipe
says. The job must succeed with every record applied exactly once.

The only changes to the recipe's text are the substitutions in ``substitutions()``, one
table: the documented addresses become the namespace hosts', the documented absolute
paths move under ``tmp_path``, ``$(hostname)`` becomes the host's own name (namespaces
share the machine's hostname) and the data gets a small record count. The commands'
environment is the test's, minus any ``ANTDT_*`` variable, with the venv's ``bin`` first
on ``PATH`` and ``TMPDIR`` under ``tmp_path`` (where the agents put their task logs).

security.md's recipe block (the CA, the token, the environment) is checked to be a part
of the tested block, command for command, so it runs as written too.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import socket
import subprocess
import sys
import time

import pytest

import netns
from antdt_tf.procutil import child_env

pytestmark = pytest.mark.slow

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
RECIPE = ("backends.md", "## Run on several machines")
SECURITY_RECIPE = ("security.md", "## Running a job across hosts safely")
HOSTS = ("10.0.0.5", "10.0.0.7", "10.0.0.8", "10.0.0.9")    # the master's, then the job's
ANY_HOST = 3                 # where a command that binds nothing runs ("from any host")
DAEMONS = ("antdt-master", "antdt-agent")     # servers: started, left running
RECORDS = 12_000
EVAL_RECORDS = 4000       # the held-out part, for the AUC


def substitutions(tmp_path: pathlib.Path, addresses: list[str], host_name: str) -> list:
    """The one table of what the test changes in the recipe: (regex, replacement)."""
    return [
        # the documented addresses -> this test's namespace hosts (198.18.0.0/24)
        *((rf"(?<![\d.]){re.escape(doc)}(?![\d])", ours)
          for doc, ours in zip(HOSTS, addresses, strict=True)),
        # the documented absolute paths -> under tmp_path
        *((rf"(?<![\w./-]){re.escape(doc)}(?![\w.-])", f"{tmp_path}{doc}")
          for doc in ("/shared", "/etc/antdt", "/var/lib/antdt")),
        # each namespace host has a name of its own
        (re.escape("$(hostname)"), host_name),
        # a small job: the recipe's record count -> a small one
        (r"--records=200000(?!\d)", f"--records={RECORDS}"),
        (r"--eval_records=20000(?!\d)", f"--eval_records={EVAL_RECORDS}"),
    ]


def sh_block(page: str, heading: str) -> str:
    """The (one) ```sh block of the section ``heading`` of docs/<page>."""
    text = (DOCS / page).read_text()
    assert heading in text, f"docs/{page} has no section {heading!r} (the recipe moved?)"
    section = text[text.index(heading) + len(heading):]
    section = section[:m.start()] if (m := re.search(r"^## ", section, re.M)) else section
    blocks = re.findall(r"^```sh\n(.*?)^```", section, re.S | re.M)
    assert len(blocks) == 1, f"docs/{page} {heading!r}: {len(blocks)} ```sh blocks, want 1"
    return blocks[0]


def commands(block: str) -> list[str]:
    """The block's commands: comments and blank lines dropped, a command continued over
    lines (a trailing backslash, an open quote) joined as the shell would read it."""
    out, pending = [], ""
    for line in block.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line + "\n"
        if pending.endswith("\\\n"):
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:             # an open quote: the command goes on
            continue
        out.append(pending.rstrip("\n"))
        pending = ""
    assert not pending, f"unfinished command at the end of the block: {pending!r}"
    return out


def test_security_recipe_is_part_of_the_tested_recipe():
    """security.md's block repeats steps of the backends.md recipe, command for command,
    so that running the latter runs it."""
    tested = commands(sh_block(*RECIPE))
    for command in commands(sh_block(*SECURITY_RECIPE)):
        assert command in tested, (f"docs/security.md's command is not in docs/backends.md's "
                                   f"tested recipe:\n{command}")


def _host_of(command: str) -> int:
    bind = re.search(r"--bind=(\S+)", command)
    if bind is None:
        return ANY_HOST
    assert bind.group(1) in HOSTS, f"the recipe binds an address it does not name: {command}"
    return HOSTS.index(bind.group(1))


def _wait_listening(proc, address: str, port: int, log: pathlib.Path, what: str) -> None:
    """Until ``proc`` listens on ``address:port``, read from its own network namespace's
    socket tables (/proc/<pid>/net/tcp and tcp6: gRPC binds a v4-mapped IPv6 socket):
    nothing of this test goes through the root namespace, whose routes to 198.18.0.0/24
    another concurrent NetnsHosts may share."""
    ipv4 = f"{socket.htonl(int.from_bytes(socket.inet_aton(address), 'big')):08X}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, f"{what} exited with {proc.returncode}:\n{_tail(log)}"
        rows = []
        for table in ("tcp", "tcp6"):
            try:
                rows += pathlib.Path(f"/proc/{proc.pid}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                pass
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            host, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port and host[-8:] == ipv4:  # LISTEN
                return
        assert time.monotonic() < deadline, f"{what} not listening:\n{_tail(log)}"
        time.sleep(0.2)


def _tail(path: pathlib.Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError as e:
        return f"({path}: {e})"


def _all_logs(tmp_path: pathlib.Path) -> str:
    logs = sorted((tmp_path / "logs").glob("*.log")) + sorted((tmp_path / "tmp").rglob("*.log"))
    return "\n".join(f"--- {p}:\n{_tail(p, 1500)}" for p in logs)


@pytest.fixture
def hosts():
    ok, why = netns.available()
    if not ok:
        pytest.skip(why)
    with netns.NetnsHosts(len(HOSTS)) as net:
        yield net


def test_multihost_recipe_runs_as_written(hosts, tmp_path):
    net = hosts
    names = [f"host{i}" for i in range(net.n)]
    (tmp_path / "logs").mkdir()
    (tmp_path / "tmp").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTDT_")}
    env["PATH"] = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["TMPDIR"] = str(tmp_path / "tmp")

    exports, launch, report_json, used = [], None, None, {}
    for n, documented in enumerate(commands(sh_block(*RECIPE))):
        host = _host_of(documented)
        command = documented
        for pattern, replacement in substitutions(tmp_path, net.addresses, names[host]):
            command, count = re.subn(pattern, lambda _: replacement, command)
            used[pattern] = used.get(pattern, 0) + count
        assert not re.search(r"\b10\.\d+\.\d+\.\d+\b", command), command   # all mapped
        if command.startswith("export "):
            exports.append(command)
            continue
        program = shlex.split(command)[0]
        log = tmp_path / "logs" / f"{n:02d}-{program}-{names[host]}.log"
        exec_ = program in DAEMONS or program == "antdt-launch"
        script = "\n".join([*exports, ("exec " if exec_ else "") + command])
        with open(log, "wb") as out:
            # an exec'd server (or the launch) dies with this test (child_env: PDEATHSIG)
            proc = net.popen(host, ["sh", "-ec", script], stdout=out, stderr=subprocess.STDOUT,
                             env=child_env(env) if exec_ else env)
        if program in DAEMONS:
            port = int(re.search(r"--port=(\d+)", command).group(1))
            _wait_listening(proc, net.addresses[host], port, log, f"{program} on {names[host]}")
        elif program == "antdt-launch":
            launch = proc
            report_json = pathlib.Path(re.search(r"--report_json=(\S+)", command).group(1))
            try:
                proc.wait(timeout=240)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the launch did not finish in 240 s:\n{_all_logs(tmp_path)}")
            assert proc.returncode == 0, (f"antdt-launch exited {proc.returncode}:\n"
                                          f"{_tail(log, 8000)}\n{_all_logs(tmp_path)}")
        else:
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{documented!r} did not finish in 120 s:\n{_tail(log)}")
            assert proc.returncode == 0, f"{documented!r} exited {proc.returncode}:\n{_tail(log)}"

    unused = [p for p, n in used.items() if not n]
    assert not unused, f"substitutions that match nothing in the recipe (it changed?): {unused}"
    assert exports, "the recipe sets no environment (the token, the TLS files)"
    assert launch is not None, "the recipe launches no job"
    report = json.loads(report_json.read_text())
    assert report["backend"] == "agents" and report["num_hosts"] == 3, report
    assert set(report["hosts"].values()) == set(names[1:]), report["hosts"]  # the job hosts
    audit = report["audit"]
    assert report["records"] == RECORDS, report["records"]
    assert audit["applied_1"] == RECORDS and audit["applied_0"] == 0, audit
    assert audit["applied_2plus"] == 0 and audit["ok"], audit
    # the held-out records are the same dataset's: the model beats chance on them
    assert report["coordinator"].get("eval_records") == EVAL_RECORDS, report["coordinator"]
    assert 0.6 < report["auc"] < 1.0, report["auc"]
