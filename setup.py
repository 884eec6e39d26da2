"""antdt-tf: straggler-tolerant parameter-server training for TensorFlow."""

from setuptools import find_packages, setup

setup(
    name="antdt-tf",
    version="0.1.0",
    description="Straggler-tolerant parameter-server training for TensorFlow (AntDT design)",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["antdt_tf", "antdt_tf.*", "estimator_examples", "keras_examples"]),
    package_data={"antdt_tf.proto": ["*.pyi"]},
    install_requires=[
        # the stubs come from grpcio-tools 1.62.3 (tools/gen_protos.py): they run on
        # protobuf 4.x (TF 2.15 + Estimator) and 7.x (TF 2.21)
        "grpcio>=1.62.3",
        "grpcio-health-checking>=1.62.3",
        "protobuf>=4.25",
        "absl-py>=2.1",
        "tqdm>=4.66",
        "psutil>=5.9",
        "numpy>=1.26",
        "google-crc32c>=1.5",  # C CRC32C for the TFRecord framing of .adtr record files
        "uvloop>=0.19",  # the master's event loop: more calls per CPU second
        "cryptography>=42",  # the throw-away job CA of local runs (antdt_tf.auth)
    ],
    extras_require={
        # tf-keras (model.fit under ParameterServerStrategy; Keras 3 has no PSS support)
        # requires the `tensorflow` package; tensorflow-cpu beside it would share its
        # files, so the extra names `tensorflow` (it runs on the CPU; no CUDA needed).
        "tf": [
            "tensorflow==2.21.0",
            "tf-keras==2.21.0",
        ],
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "hypothesis>=6.100",
            # the Kubernetes objects the backend creates and deploy/kubernetes/ are
            # checked against the API's OpenAPI schemas
            "kubernetes-validate>=1.37",
        ],
        "bench": ["matplotlib>=3.8"],   # timelines of benchmarks/scenarios.py
        # the documentation site (mkdocs.yml; `make docs`, tests/test_docs.py builds it
        # with --strict); MkDocs 2 will not read this configuration
        "docs": ["mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10"],
        # the Ray backend (antdt-launch --backend=ray); the same Ray on every node
        "ray": ["ray==2.60.0"],
        # the Kubernetes backend (antdt-master --kubernetes_*, antdt-launch
        # --backend=kubernetes)
        "kubernetes": ["kubernetes>=31"],
    },
    entry_points={
        "console_scripts": [
            "antdt-master=antdt_tf.master:run",
            "antdt-sharding-demo=antdt_tf.sharding_demo:run",
            "antdt-data=antdt_tf.data.cli:run",
            "antdt-tf-server=antdt_tf.tf.server:run",
            "antdt-coordinator=antdt_tf.tf.coordinator:run",
            "antdt-agent=antdt_tf.agent.agent:run",
            "antdt-keras-trainer=antdt_tf.tf.keras_trainer:run",
            "antdt-launch=antdt_tf.launch:run",
        ],
    },
)
