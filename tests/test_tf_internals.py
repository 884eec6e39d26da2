"""Every private TensorFlow / tf-keras API antdt-tf uses (antdt_tf.tf.tf_internals) still
exists on the installed TensorFlow. `make test` runs this file under TF 2.21 (with
tf-keras) and under TF 2.15 (the Estimator venv, without tf-keras): a TF upgrade that
removes one fails here, by name."""

import pytest

from antdt_tf.tf import tf_internals


def test_every_private_api_we_use_is_still_there():
    assert tf_internals.missing() == []


def test_a_missing_api_is_reported_by_name(monkeypatch):
    def gone():
        raise AttributeError("Something._private is gone")

    monkeypatch.setattr(tf_internals, "CHECKS",
                        tf_internals.CHECKS + [("Something._private", False, gone)])
    assert tf_internals.missing() == ["Something._private: Something._private is gone"]


def test_the_keras_apis_are_checked_where_tf_keras_is_installed():
    pytest.importorskip("tf_keras")
    names = [name for name, needs_keras, _ in tf_internals.CHECKS if needs_keras]
    assert names and tf_internals.missing(include_keras=True) == []
