"""CpuThrottle slows a real process by SIGSTOP/SIGCONT duty cycling, and always resumes it."""

import subprocess
import sys
import time

import psutil
import pytest

from antdt_tf.agent.throttle import CpuThrottle

BUSY = "import time\nwhile True:\n    pass\n"


def cpu_seconds(proc, seconds):
    p = psutil.Process(proc.pid)
    t0 = sum(p.cpu_times()[:2])
    time.sleep(seconds)
    return sum(p.cpu_times()[:2]) - t0


def test_throttle_cuts_cpu_time_and_resumes_the_process():
    proc = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(0.3)
        free = cpu_seconds(proc, 1.5)
        with CpuThrottle(proc.pid, factor=4, period=0.05):
            slowed = cpu_seconds(proc, 1.5)
        assert psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED
        after = cpu_seconds(proc, 1.0)
        assert slowed < free / 2.5            # ≈ 1/4 of the CPU time, with slack for noise
        assert after > slowed                  # resumed: 1 s free beats 1.5 s throttled
    finally:
        proc.kill()
        proc.wait()


def test_throttle_of_a_vanished_process_ends_quietly():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with CpuThrottle(proc.pid, factor=3, period=0.02):
        time.sleep(0.1)


def test_bad_factor_is_rejected():
    with pytest.raises(ValueError, match=">= 1"):
        CpuThrottle(1, factor=0.5)
