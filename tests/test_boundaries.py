"""Import boundaries: the pure cores import neither TensorFlow nor gRPC nor absl flags."""

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["antdt_tf.sharding.plan", "antdt_tf.sharding.state",
                                    "antdt_tf.sharding.store", "antdt_tf.data.criteo",
                                    "antdt_tf.data.records"])
def test_pure_cores_import_no_framework(module):
    code = (f"import sys, json, {module}; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert not loaded & {"tensorflow", "grpc", "absl", "keras", "tf_keras"}


def test_service_layer_imports_no_tensorflow():
    code = ("import sys, json, antdt_tf.sharding.client, antdt_tf.master; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "tensorflow" not in json.loads(out.stdout)
