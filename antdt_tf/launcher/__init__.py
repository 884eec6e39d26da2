"""antdt-launch's parts: a job's configuration and data (``config``), the runner that
starts and supervises its tasks through a ClusterBackend and carries out the
Controller's actions (``job``), the progress line (``progress``) and the report
(``report``). The binary itself (flags, ``main``) is :mod:`antdt_tf.launch`.
"""
