"""TensorFlow's RPC ops to the master: the client that graphs (input pipelines and
training steps on the workers) use to lease shards and report them, with no Python in
between.

The master serves ``tensorflow.rpc.RpcService`` (``antdt_tf.sharding.tf_rpc``). The ops
live in a private TensorFlow module (``gen_rpc_ops``, through
:mod:`antdt_tf.tf.tf_internals`, whose test pins them). Used by :mod:`antdt_tf.tf.pull`
(leases), :mod:`antdt_tf.tf.accounting` (reports) and :mod:`antdt_tf.tf.bsp` (rounds).
"""

from __future__ import annotations

import tensorflow as tf

from antdt_tf import auth
from antdt_tf.tf.tf_internals import rpc_ops

_rpc = rpc_ops()

STATUS_SHARD, STATUS_WAIT, STATUS_END = 1, 2, 3
DEFAULT_TIMEOUT_MS = 60_000
# what ``antdt.next`` returns: status, lease, shard, epoch, path, file_start, start,
# length, batch size, sparse
NEXT_TYPES = [tf.int32, tf.int64, tf.int64, tf.int32, tf.string, tf.int64, tf.int64, tf.int64,
              tf.int64, tf.int64]


_TF_RPC_ADDRESSES: dict[str, str] = {}


def tf_rpc_address(master: str) -> str:
    """Where TensorFlow's RPC ops reach ``master``: the master itself, or, when the job
    runs with TLS (which TF's RPC ops cannot speak), the plaintext port the master names
    in GetMasterInfo. Asked once per master by the process that builds the graph."""
    if not auth.tls_enabled():
        return master
    if master not in _TF_RPC_ADDRESSES:
        from antdt_tf.monitor.client import MonitorClient

        with MonitorClient(master, timeout=60) as monitor:
            _TF_RPC_ADDRESSES[master] = monitor.master_info().tf_rpc_address
    return _TF_RPC_ADDRESSES[master]


def rpc_client(master: str, timeout_ms: int, role: str):
    """A TF RPC client resource for ``master``, one per ``role`` in this process."""
    # One named client per role: a handle that shares its resource with another user
    # (the input pipeline vs the training step) was found deleted under the other.
    master = tf_rpc_address(master)
    client, _ = _rpc.rpc_client(server_address=master, timeout_in_ms=timeout_ms,
                                shared_name=f"antdt_{role}_{master}",
                                list_registered_methods=False)
    return client


# gRPC codes worth another attempt: the master restarting (a call in flight when it
# died fails with INTERNAL "connection reset"; a call made while it is down waits for it,
# up to the timeout). Application errors (NOT_FOUND, INVALID_ARGUMENT, ...) are raised.
_RETRYABLE = (4, 13, 14)   # DEADLINE_EXCEEDED, INTERNAL, UNAVAILABLE


def rpc_call(client, method: str, args, tout, timeout_ms: int, attempts: int = 6):
    """One RPC to the master from a TF graph, retried on transport errors (every method
    is idempotent: ``next`` carries a request id, reports are absolute). Raises the
    master's error (as the matching ``tf.errors`` type) if it does not succeed.

    The first attempt runs outside any loop and the retries only when it failed: a
    training step reports once per batch, and a ``tf.while_loop`` around every call cost
    its frame even when the master answered at once (the common case)."""
    def zeros():
        return [tf.constant("" if t == tf.string else 0, t) for t in tout]

    token = auth.job_token()
    if token:     # TF's RPC ops send no metadata: the master checks the last argument
        args = list(args) + [tf.constant(token)]

    def attempt(i, code, *values):
        future, deleter = _rpc.rpc_call(client=client, method_name=method, args=args,
                                        timeout_in_ms=timeout_ms)
        code, _ = _rpc.rpc_check_status(status_or=future)
        code = tf.reshape(code, [])
        values = tf.cond(tf.equal(code, 0),
                         lambda: [tf.reshape(v, []) for v in
                                  _rpc.rpc_get_value(status_or=future, Tout=tout)], zeros)
        with tf.control_dependencies(values):
            done = _rpc.delete_rpc_future_resource(handle=future, deleter=deleter)
        with tf.control_dependencies([done]):
            return [i + 1, tf.identity(code)] + [tf.identity(v) for v in values]

    def again(i, code, *values):
        retryable = tf.reduce_any(tf.equal(code, tf.constant(_RETRYABLE, tf.int64)))
        return tf.logical_and(i < attempts, tf.logical_or(code < 0, retryable))

    def raise_error():   # one more call, whose value op raises the master's error
        future, deleter = _rpc.rpc_call(client=client, method_name=method, args=args,
                                        timeout_in_ms=timeout_ms)
        vals = _rpc.rpc_get_value(status_or=future, Tout=tout)
        with tf.control_dependencies(vals):
            done = _rpc.delete_rpc_future_resource(handle=future, deleter=deleter)
        with tf.control_dependencies([done]):
            return [tf.reshape(tf.identity(v), []) for v in vals]

    def retry(code):
        out = tf.while_loop(again, attempt, [tf.constant(1), code] + zeros())
        return tf.cond(tf.equal(out[1], 0), lambda: list(out[2:]), raise_error)

    _, code, *values = attempt(tf.constant(0), tf.constant(-1, tf.int64), *zeros())
    return tf.cond(tf.equal(code, 0), lambda: values, lambda: retry(code))
