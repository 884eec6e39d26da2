"""antdt-probe-task: a tiny task that checks a host can run and expose a task.

It serves ``--endpoint`` (a TCP port that answers ``probe <name>\\n`` to every
connection), then, if asked, exits with ``--exit_code`` after ``--exit_after_seconds``,
or allocates ``--allocate_mb`` of memory (to meet an agent's memory limit). It imports
no TensorFlow, so a backend's conformance suite can start dozens in seconds.
"""

from __future__ import annotations

import socket
import sys
import threading
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("endpoint", "", "host:port to serve on (the host may be 0.0.0.0 or an "
                    "address of this host); empty: serve nothing.")
flags.DEFINE_string("name", "probe", "Answered to every connection.")
flags.DEFINE_float("exit_after_seconds", -1, "Exit after this long (< 0: run until killed).")
flags.DEFINE_integer("exit_code", 0, "Exit code when --exit_after_seconds runs out.")
flags.DEFINE_integer("allocate_mb", 0, "Allocate (and touch) this much memory, a MiB a "
                     "millisecond, then hold it.")


def _serve(sock: socket.socket, answer: bytes) -> None:
    while True:
        conn, _ = sock.accept()
        with conn:
            conn.sendall(answer)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if FLAGS.endpoint:
        host, port = FLAGS.endpoint.rsplit(":", 1)
        sock = socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), int(port)))
        sock.listen(16)
        threading.Thread(target=_serve, args=(sock, f"probe {FLAGS.name}\n".encode()),
                         daemon=True).start()
        print(f"serving {FLAGS.endpoint}", flush=True)
    held = []
    for _ in range(FLAGS.allocate_mb):
        held.append(bytearray(1 << 20))    # bytearray zero-fills: the pages are touched
        time.sleep(0.001)
    if FLAGS.exit_after_seconds >= 0:
        time.sleep(FLAGS.exit_after_seconds)
        sys.stdout.flush()
        return FLAGS.exit_code
    while True:
        time.sleep(3600)


def run():
    app.run(main)


if __name__ == "__main__":
    run()
