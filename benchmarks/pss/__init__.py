"""The parts of ``python -m benchmarks.compare_pss`` (vanilla TF2 PSS vs TF1 static
sharding vs antdt-tf, same model and data). Its setups and what it measures: the
definitions in docs/benchmarks.md ("The PSS comparison: setups and definitions").

- ``driver``: the data, the warm-up run and the paired rounds;
- ``runs``: one run of one setup: starts its processes, slows the straggler, reads
  what they measured; ``SETUPS``;
- ``chiefs`` (setups (a), (s), (v)) and ``tf1_worker`` ((b), (t), (u)): the task
  processes a run starts (``python -m benchmarks.compare_pss --role=...``);
- ``handshake``: the files the driver and those processes meet at;
- ``cpu``: CPU seconds by process role, sampled from outside the processes;
- ``table``: the results file (tables, the ratios between setups, the reproduce line).
"""
