"""CpuThrottle: make a process N times slower, for real, by SIGSTOP/SIGCONT duty cycling.

Within every ``period`` the process runs for ``period / factor`` and is stopped for the
rest, so it gets at most 1/factor of the CPU time it could use — a straggler the way a
contended host makes one, not a sleep in our own code. The process is resumed when the
throttle stops (also on errors), so it never stays frozen.
"""

from __future__ import annotations

import os
import signal
import threading


class CpuThrottle:
    """``with CpuThrottle(pid, factor=4): ...`` or ``start()`` / ``stop()``."""

    def __init__(self, pid: int, factor: float, period: float = 0.1):
        if factor < 1:
            raise ValueError(f"slowdown factor must be >= 1, got {factor}")
        if period <= 0:
            raise ValueError("period must be > 0")
        self.pid = pid
        self.factor = factor
        self.period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"throttle-{pid}", daemon=True)

    def _signal(self, sig) -> bool:
        try:
            os.kill(self.pid, sig)
            return True
        except ProcessLookupError:
            return False   # the process is gone: nothing left to throttle

    def _run(self) -> None:
        run_for = self.period / self.factor
        try:
            while not self._stop.is_set():
                if not self._signal(signal.SIGSTOP):
                    return
                if self._stop.wait(self.period - run_for):
                    return
                if not self._signal(signal.SIGCONT):
                    return
                self._stop.wait(run_for)
        finally:
            self._signal(signal.SIGCONT)

    def start(self) -> "CpuThrottle":
        if self.factor > 1:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
