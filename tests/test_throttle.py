"""CpuThrottle slows a real process by SIGSTOP/SIGCONT duty cycling, and always resumes it."""

import pathlib
import subprocess
import sys
import time

import psutil
import pytest

from antdt_tf.agent.throttle import CpuThrottle

BUSY = "import time\nwhile True:\n    pass\n"


def schedstat(pid: int) -> tuple[float, float, int]:
    """The kernel's accounting of a task (``/proc/<pid>/schedstat``): seconds on a CPU,
    seconds runnable but waiting for one, timeslices run."""
    run, wait, slices = open(f"/proc/{pid}/schedstat").read().split()
    return int(run) / 1e9, int(wait) / 1e9, int(slices)


def runnable(procs, seconds: float) -> list:
    """Per process, the share of ``seconds`` of wall time it was runnable (on a CPU or
    waiting for one, i.e. not stopped), and the mean wait for a CPU per timeslice."""
    before = [schedstat(p.pid) for p in procs]
    t0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    out = []
    for p, (run0, wait0, n0) in zip(procs, before):
        run, wait, n = schedstat(p.pid)
        out.append(((run - run0 + wait - wait0) / wall, (wait - wait0) / max(1, n - n0)))
    return out


def test_throttle_stops_the_process_most_of_the_time_and_resumes_it():
    """The throttle's promise is time the process may not run: stopped for 3/4 of every
    period. Measured by the kernel, not by CPU time: a busy process that is not stopped
    is runnable all the time (on a CPU or waiting for one), so the share of time it is
    runnable does not depend on how many other processes want the CPU — an unthrottled
    twin over the same interval shows it (≈ 1). CPU time would: on a loaded machine an
    unthrottled process gets little of it too. What load adds is that a SIGSTOP takes
    effect when the process next gets a CPU, and the throttle's own thread wakes late:
    up to about two waits for a CPU per period, measured here as the twin's mean wait
    per timeslice; the bound grows with it (capped: a throttle that did not stop the
    process would show ≈ 1 like the twin). Afterwards it is runnable all the time again."""
    if not pathlib.Path("/proc/self/schedstat").exists():
        pytest.skip("no /proc/<pid>/schedstat on this kernel (CONFIG_SCHED_INFO)")
    factor, period = 4, 0.1
    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
    throttled, twin = procs
    try:
        time.sleep(0.3)
        with CpuThrottle(throttled.pid, factor=factor, period=period):
            (slowed, _), (baseline, cpu_wait) = runnable(procs, 2.0)
        assert psutil.Process(throttled.pid).status() != psutil.STATUS_STOPPED
        (after, _), (baseline_after, _) = runnable(procs, 1.0)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert baseline > 0.9 and baseline_after > 0.9, (baseline, baseline_after)
    bound = min(0.8, 1 / factor + 0.15 + 2 * cpu_wait / period)
    assert slowed < bound, (slowed, bound, cpu_wait)       # ≈ 1/4 on a free machine
    assert after > 0.9, after                                # resumed: never left stopped


def test_throttle_of_a_vanished_process_ends_quietly():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with CpuThrottle(proc.pid, factor=3, period=0.02):
        time.sleep(0.1)


def test_bad_factor_is_rejected():
    with pytest.raises(ValueError, match=">= 1"):
        CpuThrottle(1, factor=0.5)
