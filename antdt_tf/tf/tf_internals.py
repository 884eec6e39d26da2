"""Every private TensorFlow / tf-keras API antdt-tf uses, in one place.

Each function names one private attribute or module, says why antdt-tf needs it and what
the public alternative is (if any). ``tests/test_tf_internals.py`` checks that each one
still exists on the installed TensorFlow (run under both TF versions of the suite), so a
TF upgrade that removes one fails there, loudly and by name, not deep inside a job.

``CHECKS`` lists them for that test: ``(name, needs_keras, check)``, where ``check()``
raises if the API is gone.
"""

from __future__ import annotations

from typing import Callable, Optional


def rpc_ops():
    """``tensorflow.distribute.experimental.rpc.kernels.gen_rpc_ops``: the RPC client ops
    (``RpcClient``, ``RpcCall``, ``RpcCheckStatus``, ``RpcGetValue``) that let a worker's
    tf.data pipeline and step talk to the master as graph ops. Why: the data path runs
    inside TF functions on the workers, where Python cannot. Public alternative:
    ``tf.distribute.experimental.rpc.Client`` wraps the same ops but needs eager
    Python to create it (not inside a ``tf.data`` function on a worker)."""
    from tensorflow.distribute.experimental.rpc.kernels import gen_rpc_ops
    return gen_rpc_ops


def cluster_resolver(strategy):
    """``ParameterServerStrategy._cluster_resolver``: the job's cluster spec (how many
    workers) from the model's strategy. Why: the Keras callback sizes per-worker state
    from it. Public alternative: ``strategy.cluster_resolver`` is ``None`` under PSS;
    pass ``worker_slots`` to ``ShardingCallback`` instead (it is used when this is
    missing)."""
    return getattr(strategy, "_cluster_resolver", None)


def keras_coordinator(model):
    """``keras.Model._cluster_coordinator``: the ``ClusterCoordinator`` ``model.fit``
    schedules on. Why: the Keras callback waits for (joins) the scheduled steps before a
    checkpoint. Public alternative: none in tf-keras; a ``ClusterCoordinator`` is one
    per strategy, so ``ClusterCoordinator(strategy)`` returns the same object once
    ``fit`` made it."""
    return getattr(model, "_cluster_coordinator", None)


def set_keras_coordinator(model, coordinator) -> None:
    """Sets what :func:`keras_coordinator` reads (``fit`` does it itself); for running
    ``make_train_function``'s function outside ``fit`` (benchmarks)."""
    model._cluster_coordinator = coordinator


def steps_per_execution(model) -> int:
    """``keras.Model._steps_per_execution`` (a variable): how many steps one scheduled
    closure runs. Why: the callback's pacing counts closures. Public alternative: none
    (``compile(steps_per_execution=)`` sets it); 1 when missing."""
    spe = getattr(model, "_steps_per_execution", None)
    return int(spe.numpy()) if spe is not None else 1


def accept_remote_logs(callback) -> None:
    """Sets ``Callback._supports_tf_logs``: the batch hooks get the step's logs as a
    ``RemoteValue`` instead of tf-keras fetching every step's logs to the chief. Why:
    under PSS the fetch would wait for each step (no steps ahead) and the callback
    paces on the RemoteValues. Public alternative: none."""
    callback._supports_tf_logs = True


def completion_event(remote_value):
    """``RemoteValue._status_available_event`` (a ``threading.Event``): set when the
    scheduled closure finished. Why: the Keras callback waits for *any* of its scheduled
    steps to finish (``RemoteValue.fetch`` waits for one, in order). Public alternative:
    ``remote_value.fetch()`` on the oldest (used when this is ``None``)."""
    return getattr(remote_value, "_status_available_event", None)


def is_stateful(op) -> bool:
    """``tf.Operation._is_stateful``: whether an op has side effects. Why: the step's
    report must be ordered after every write the step made (``run_step``). Public
    alternative: none for graph ops."""
    return op._is_stateful


def session_manager_class():
    """``tensorflow.python.training.session_manager.SessionManager``: its
    ``recovery_wait_secs`` default (30 s) is lowered for TF1 workers
    (:func:`shorten_session_wait`), which otherwise sleep 30 s after their first look
    for the chief's session. Public alternative:
    ``SessionManager(recovery_wait_secs=)``, but ``MonitoredTrainingSession`` and
    ``Estimator`` build theirs without passing it."""
    from tensorflow.python.training import session_manager
    return session_manager.SessionManager


def _recovery_wait_default(init) -> int:
    """Where ``recovery_wait_secs`` sits in ``SessionManager.__init__.__defaults__``
    (found by parameter name, not assumed by position)."""
    code = init.__code__
    names = code.co_varnames[1:code.co_argcount]
    if "recovery_wait_secs" not in names or not init.__defaults__:
        raise AttributeError("SessionManager.__init__ has no recovery_wait_secs default")
    k = names.index("recovery_wait_secs") - (len(names) - len(init.__defaults__))
    if k < 0:
        raise AttributeError("SessionManager.__init__'s recovery_wait_secs has no default")
    return k


def shorten_session_wait(seconds: float) -> None:
    """Lowers the default ``recovery_wait_secs`` (30 s) of TF's ``SessionManager`` in this
    process to ``seconds``: a non-chief TF1 worker then checks every ``seconds`` whether
    the chief has initialized the model, instead of sleeping 30 s after its first look.

    Why: ``MonitoredTrainingSession`` and ``Estimator`` build their ``SessionManager``
    without passing ``recovery_wait_secs``, so the class's default is the only knob; this
    patches ``SessionManager.__init__.__defaults__`` (a TF internal, hence here). Checked
    on TF 2.15.1 and 2.21.0 (``recovery_wait_secs=30``, a parameter with a default;
    ``_check_session_manager`` runs the same lookup under both). Public alternative:
    ``SessionManager(recovery_wait_secs=)`` where you build the ``SessionManager``."""
    init = session_manager_class().__init__
    defaults = list(init.__defaults__)
    defaults[_recovery_wait_default(init)] = seconds
    init.__defaults__ = tuple(defaults)


def _check_rpc_ops():
    ops = rpc_ops()
    for name in ("rpc_client", "rpc_call", "rpc_check_status", "rpc_get_value"):
        if not callable(getattr(ops, name, None)):
            raise AttributeError(f"gen_rpc_ops.{name} is gone")


def _check_pss_resolver():
    import inspect

    import tensorflow as tf

    # the attribute is set in __init__, which connects to a cluster: check the source
    source = inspect.getsource(inspect.getmodule(
        tf.distribute.experimental.ParameterServerStrategy))
    if "self._cluster_resolver =" not in source:
        raise AttributeError("ParameterServerStrategy no longer keeps _cluster_resolver")


def _check_keras_model():
    import inspect

    import tf_keras as keras

    source = inspect.getsource(keras.Model)
    for name in ("_cluster_coordinator", "_steps_per_execution"):
        if name not in source:
            raise AttributeError(f"tf_keras.Model no longer has {name}")


def _check_callback_logs():
    import inspect

    import tf_keras as keras

    if "_supports_tf_logs" not in inspect.getsource(inspect.getmodule(keras.callbacks.Callback)):
        raise AttributeError("tf_keras callbacks no longer read _supports_tf_logs")


def _check_remote_value_event():
    import inspect

    from tensorflow.python.distribute.coordinator import values
    if "_status_available_event" not in inspect.getsource(values):
        raise AttributeError("RemoteValue no longer has _status_available_event")


def _check_is_stateful():
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.Variable(1.0, use_resource=True)
        op = v.assign_add(1.0).op
        if not isinstance(is_stateful(op), bool) or not is_stateful(op):
            raise AttributeError("Operation._is_stateful no longer says an assign is stateful")


def _check_session_manager():
    _recovery_wait_default(session_manager_class().__init__)   # what shorten_session_wait finds


CHECKS: list[tuple[str, bool, Callable[[], None]]] = [
    ("gen_rpc_ops", False, _check_rpc_ops),
    ("ParameterServerStrategy._cluster_resolver", False, _check_pss_resolver),
    ("tf_keras.Model._cluster_coordinator, _steps_per_execution", True, _check_keras_model),
    ("tf_keras Callback._supports_tf_logs", True, _check_callback_logs),
    ("RemoteValue._status_available_event", False, _check_remote_value_event),
    ("Operation._is_stateful", False, _check_is_stateful),
    ("SessionManager recovery_wait_secs default", False, _check_session_manager),
]


def missing(include_keras: Optional[bool] = None) -> list[str]:
    """The names of the private APIs the installed TensorFlow lacks (``include_keras``:
    also check tf-keras ones; default: when tf-keras is importable)."""
    if include_keras is None:
        try:
            import tf_keras  # noqa: F401
            include_keras = True
        except ImportError:
            include_keras = False
    gone = []
    for name, needs_keras, check in CHECKS:
        if needs_keras and not include_keras:
            continue
        try:
            check()
        except (AttributeError, ImportError, OSError, TypeError) as e:
            gone.append(f"{name}: {e}")
    return gone
