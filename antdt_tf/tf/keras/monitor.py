"""The chief's progress reports to the master's Monitor under ``model.fit``, as the custom
loop's coordinator makes them: what each worker trained and how long every PS takes to
answer, so the Controller judges (and may replace) a slow PS in a Keras job too.
"""

from __future__ import annotations

import logging
import time

import tf_keras as keras   # the [tf] extra installs it; TF_USE_LEGACY_KERAS=1 makes it tf.keras

from antdt_tf.tf.tf_internals import accept_remote_logs

log = logging.getLogger(__name__)


class ClusterMonitorCallback(keras.callbacks.Callback):
    """Chief: about every ``report_seconds`` tells the master's Monitor what each worker
    trained (the master's own count, from the workers' reports) and how long every PS
    takes to answer (``probe``: :class:`antdt_tf.tf.ps_probe.PsProbe`), as the custom
    loop's coordinator does — so the Controller judges (and may replace) a slow PS in a
    ``model.fit`` job too. Best effort: a failed report is logged, training goes on.

    Under PSS the batch hooks run on the chief's main thread as steps are scheduled,
    which is also where the probe's remote reads must run (concurrent remote reads from
    several threads crashed TF here). ``client``: a ``ShardingClient`` of the master the
    chief already has (not closed here); None opens (and closes) one."""

    def __init__(self, master: str, dataset: str, probe, incarnation: int,
                 report_seconds: float = 1.0, client=None):
        super().__init__()
        from antdt_tf.monitor.client import MonitorClient
        from antdt_tf.sharding.client import ShardingClient

        accept_remote_logs(self)
        self.dataset, self.probe, self.incarnation = dataset, probe, incarnation
        self.report_seconds = report_seconds
        self._own_client = client is None
        self.client = ShardingClient(master) if client is None else client
        self.monitor = MonitorClient(master)
        self.reports = 0
        self._last = 0.0

    def report(self) -> None:
        from antdt_tf.sharding.client import worker_split

        self._last = time.monotonic()
        try:
            shards, records = worker_split(self.client.progress(self.dataset))
            self.monitor.report_trainer(self.incarnation, list(zip(shards, records)),
                                        ps_latency_ms=self.probe.measure())
            self.reports += 1
        except Exception as e:  # progress reports are best effort; training goes on
            log.warning("trainer report not delivered: %s", e)

    def on_train_begin(self, logs=None):
        # the first report one period in, not at the first batch: the first step's
        # function is still being sent to the workers then, and a remote read racing
        # with that once sent a request TF could not parse (a worker's "Unable to parse
        # request", the job failed); the custom loop's first report also waits a period
        self._last = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        if time.monotonic() - self._last >= self.report_seconds:
            self.report()

    def on_train_end(self, logs=None):
        self.report()
        if self._own_client:
            self.client.close()
        self.monitor.close()
