"""The antdt-master binary as a real process: health, SIGTERM, SIGKILL + restart,
corrupt state, bad flags, loopback binding."""

import ipaddress
import signal
import threading
import time

import psutil
import pytest
from grpc_health.v1 import health_pb2

from antdt_tf.sharding.client import ShardingClient, Task
from antdt_tf.sharding.plan import DatasetSpec
from procs import MasterProcess, run_master_once

pytestmark = pytest.mark.slow

SERVING = health_pb2.HealthCheckResponse.SERVING


@pytest.fixture
def master(tmp_path):
    m = MasterProcess(tmp_path / "m", state_dir=tmp_path / "state").start()
    yield m
    m.stop()


def test_serves_health_binds_loopback_and_stops_gracefully_on_sigterm(master, tmp_path):
    assert master.health() == SERVING and master.health("") == SERVING
    listening = [c.laddr for c in psutil.Process(master.proc.pid).net_connections("inet")
                 if c.status == psutil.CONN_LISTEN]
    assert listening and all(_is_loopback(addr.ip) for addr in listening)
    with ShardingClient(master.address, Task("worker", 0), timeout=10) as c:
        c.register_dataset(DatasetSpec("train", records_per_shard=10, num_records=100))
        c.report_done(c.get_shard("train").shard)
    assert master.kill(signal.SIGTERM) == 0
    assert "state flushed" in master.output()
    master.start()   # same state_dir
    with ShardingClient(master.address, Task("worker", 0), timeout=10) as c:
        assert c.progress("train").datasets[0].done_shards == 1


def test_sigkill_mid_run_and_restart_loses_and_repeats_nothing(tmp_path):
    """Workers keep pulling while the master is SIGKILLed and restarted on the same
    port and state_dir; every record ends up DONE exactly once."""
    m = MasterProcess(tmp_path / "m", state_dir=tmp_path / "state", flags=["--fsync=never"]).start()
    m.port = m.port  # restarts keep the port the clients know
    records = 6000
    with ShardingClient(m.address, timeout=30) as admin:
        admin.register_dataset(DatasetSpec("train", records_per_shard=20, num_records=records,
                                           num_epochs=2, shuffle=True, seed=11))
    acked = []   # (epoch, start, length) of DONE answered ACCEPTED or DUPLICATE
    lock = threading.Lock()
    failures = []

    def worker(i):
        try:
            with ShardingClient(m.address, Task("worker", i), timeout=60) as c:
                for s in (c.shards("train") if i % 2 else c.stream().shards("train")):
                    time.sleep(0.01)
                    with lock:   # DONE follows this body; a lost one would show in the totals
                        acked.append((s.epoch, s.start, s.length))
        except Exception as e:  # surfaced below
            failures.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    kills = []
    for threshold in (150, 400):   # of 600 shards: kill once per epoch, mid-run
        deadline = time.monotonic() + 60
        while len(acked) < threshold and time.monotonic() < deadline:
            time.sleep(0.01)
        assert m.kill(signal.SIGKILL) == -signal.SIGKILL
        kills.append(len(acked))
        m.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures, failures
    assert all(k < 600 for k in kills), f"the kills must land mid-run: {kills}"
    covered = sorted((e, r) for e, start, n in acked for r in range(start, start + n))
    assert covered == [(e, r) for e in range(2) for r in range(records)]
    with ShardingClient(m.address, timeout=10) as admin:
        p = admin.progress("train").datasets[0]
    assert p.finished and p.records_done_total == 2 * records
    assert "journal event(s) replayed" in m.output()
    m.stop()


def test_corrupt_state_stops_the_master_with_a_clear_error(tmp_path):
    state = tmp_path / "state"
    m = MasterProcess(tmp_path / "m", state_dir=state).start()
    with ShardingClient(m.address, timeout=10) as c:
        c.register_dataset(DatasetSpec("train", records_per_shard=10, num_records=100))
    assert m.kill(signal.SIGTERM) == 0
    snap = state / "snapshot.pb"
    data = bytearray(snap.read_bytes())
    data[-1] ^= 0xFF
    snap.write_bytes(bytes(data))
    res = run_master_once(["--port=0", f"--state_dir={state}"])
    assert res.returncode == 3
    assert "checksum" in res.stderr and "--discard_corrupt_state" in res.stderr
    assert snap.read_bytes() == bytes(data)     # left untouched
    m.flags = ["--discard_corrupt_state"]
    m.start()
    assert m.health() == SERVING
    assert list(state.glob("corrupt-*/snapshot.pb"))
    m.stop()


def test_second_master_on_the_same_state_dir_is_refused(master, tmp_path):
    res = run_master_once(["--port=0", f"--state_dir={tmp_path / 'state'}"])
    assert res.returncode == 3 and "in use by another master" in res.stderr
    assert master.health() == SERVING


@pytest.mark.parametrize("flag,message", [
    ("--port=-1", "--port"),
    ("--fsync=sometimes", "fsync"),
    ("--lease_factor=0.5", "lease factor"),
    ("--lease_min_seconds=1000", "initial_seconds"),
    ("--snapshot_every=0", "snapshot_every"),
])
def test_bad_flags_are_usage_errors(flag, message):
    res = run_master_once(["--port=0", flag])
    assert res.returncode != 0
    assert message in res.stderr


def _is_loopback(ip):
    addr = ipaddress.ip_address(ip)
    return (getattr(addr, "ipv4_mapped", None) or addr).is_loopback
