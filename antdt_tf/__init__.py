"""antdt-tf: straggler-tolerant parameter-server training for TensorFlow (AntDT design).

Packages, one per AntDT component (each readable alone):

- :mod:`antdt_tf.sharding` — the stateful dynamic data sharding service (master side,
  client, persistence). Pure Python + gRPC; imports no TensorFlow.
- :mod:`antdt_tf.data` — the Criteo format, a synthetic generator with learnable signal
  and the compact fixed-length record format shards are read from (numpy only).
"""

__version__ = "0.1.0"

from antdt_tf.procutil import adopt_parent_death as _adopt_parent_death

_adopt_parent_death()   # a child started with procutil.child_env() dies with its parent
