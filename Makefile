# antdt-tf developer entry points. Everything installs into .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.antdt-installed
# the pinned stub generator (grpcio-tools 1.62.3 needs protobuf < 5: its own venv)
PROTOC_VENV := .venv-protoc
PROTOC_STAMP := $(PROTOC_VENV)/.installed

.PHONY: install protoc-venv venv-tf215 example-mts example-estimator test test-fast demo demo-sharding bench bench-shard-cost bench-multihost bench-ray bench-compare bench-step-cost bench-keras-step-cost bench-tf1-step-cost bench-apis bench-scenarios bench-peer protos bazel-test docs clean

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	# tensorflow-cpu (older checkouts) and tensorflow share files: remove it before
	# installing tensorflow, never after
	if $(PY) -m pip show -q tensorflow-cpu 2>/dev/null; then $(PY) -m pip uninstall -q -y tensorflow-cpu; fi
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,tf,ray,docs,kubernetes]'
	touch $(STAMP)

install: $(STAMP)

$(PROTOC_STAMP):
	test -x $(PROTOC_VENV)/bin/python || $(PYTHON) -m venv $(PROTOC_VENV)
	$(PROTOC_VENV)/bin/python -m pip install -q --disable-pip-version-check grpcio-tools==1.62.3
	touch $(PROTOC_STAMP)

protoc-venv: $(PROTOC_STAMP)

# TF 2.15 + tensorflow-estimator (tf.estimator is gone in 2.21) for the Estimator hooks'
# example and tests; the package runs from the source tree there (PYTHONPATH).
TF215_VENV := .venv-tf215
TF215_STAMP := $(TF215_VENV)/.installed
$(TF215_STAMP): setup.py
	test -x $(TF215_VENV)/bin/python || $(PYTHON) -m venv $(TF215_VENV)
	$(TF215_VENV)/bin/python -m pip install -q --disable-pip-version-check \
		tensorflow-cpu==2.15.1 tensorflow-estimator==2.15.0 grpcio-health-checking==1.62.3 \
		'absl-py>=2.1' 'tqdm>=4.66' 'psutil>=5.9' 'google-crc32c>=1.5' 'uvloop>=0.19' \
		'pytest>=8' 'pytest-timeout>=2.3' 'hypothesis>=6.100'
	touch $(TF215_STAMP)

venv-tf215: $(TF215_STAMP)

# The whole suite, multi-process tests included.
test: $(STAMP) $(PROTOC_STAMP) $(TF215_STAMP)
	PYTHONPATH=$(CURDIR) $(TF215_VENV)/bin/python -m pytest -q tests/test_estimator_tf215.py tests/test_tf_internals.py
	$(PY) -m pytest -q tests

# Unit and in-process service tests only (skips the tests marked slow).
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

# The main job: 2 PS + 3 workers + coordinator + master, each a real process started by
# per-host agents; 200k generated records; worker 2 slowed 3x for a while; audit on.
demo: $(STAMP)
	rm -rf .demo
	$(VENV)/bin/antdt-launch --num_ps=2 --num_workers=3 --generate_records=200000 --audit \
		--inject=slow:worker:2:x3@0s-15s --workdir=.demo --report_json=.demo/report.json

# TF1 between-graph examples through the antdt hooks (estimator_examples/): every worker
# a trainer, worker 0 the chief; one worker killed, one slowed; audit on.
example-mts: $(STAMP)
	rm -rf .example-mts
	$(VENV)/bin/antdt-launch --api=mts --num_ps=1 --num_workers=3 --generate_records=200000 \
		--audit --inject=kill:worker:1@2s --inject=slow:worker:2:x3@0s \
		--workdir=.example-mts --report_json=.example-mts/report.json

example-estimator: $(STAMP) $(TF215_STAMP)
	rm -rf .example-estimator
	$(VENV)/bin/antdt-launch --api=estimator --num_ps=1 --num_workers=3 \
		--generate_records=200000 --audit --inject=kill:worker:1@2s \
		--inject=slow:worker:2:x3@0s --workdir=.example-estimator \
		--report_json=.example-estimator/report.json

# The sharding service alone, with simulated trainers (no TensorFlow).
demo-sharding: $(STAMP)
	$(VENV)/bin/antdt-sharding-demo

# Benchmarks: each writes its results table into $(RESULTS); BENCH_ARGS is appended to
# its command. A smoke run (smallest size, one round; not a measurement), without
# touching the checked-in results: make bench-X RESULTS=/tmp/x BENCH_ARGS=--smoke
RESULTS ?= benchmarks/results
BENCH_ARGS ?=

# The sharding service alone: GetShard+ReportShard pairs/s and latency, plan memory.
bench: $(STAMP)
	$(PY) -m benchmarks.sharding_bench --out $(RESULTS)/sharding.md $(BENCH_ARGS)

# The fixed cost per shard of the two PSS data paths: 512 vs 8,192 records per shard
# (1 PS + 2 workers, 4 jobs per round).
bench-shard-cost: $(STAMP)
	$(PY) -m benchmarks.pss_shard_cost --rounds=3 --out $(RESULTS)/pss_shard_cost.md $(BENCH_ARGS)

# Straggler scenarios x policies (static, dynamic, AntDT-ND, AntDT-DD) with timeline PNGs
# (16 whole jobs; about 15 minutes here).
bench-scenarios: $(STAMP)
	$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q -e '.[bench]'
	$(PY) -m benchmarks.scenarios --out $(RESULTS)/scenarios.md $(BENCH_ARGS)

# The TF-native peer: PSS fed by the tf.data service (DYNAMIC) vs antdt-tf, with and
# without a 4x straggler (4 whole jobs; a few minutes here).
bench-peer: $(STAMP)
	$(PY) -m benchmarks.dataservice_peer --out $(RESULTS)/dataservice_peer.md $(BENCH_ARGS)

# Jobs across three network-namespace hosts (needs root): host loss, move cost, and
# scenario 2 on the agents backend beside the local one (7 whole jobs; a few minutes).
bench-multihost: $(STAMP)
	$(PY) -m benchmarks.multihost --out $(RESULTS)/multihost.md $(BENCH_ARGS)

# Jobs on a three-node Ray cluster on this machine: node loss -> training again, and
# scenario 2 on the Ray backend beside the local one (5 whole jobs; a few minutes).
bench-ray: $(STAMP)
	$(PY) -m benchmarks.ray_backend --out $(RESULTS)/ray.md $(BENCH_ARGS)

# Vanilla TF2 PSS vs TF1 static sharding vs antdt-tf, with and without a 4x straggler
# (1 PS + 3 workers each, real processes; a few minutes per round).
bench-compare: $(STAMP)
	$(PY) -m benchmarks.compare_pss --rounds=5 --setups=abcs --out $(RESULTS)/compare_pss.md $(BENCH_ARGS)

bench-step-cost: $(STAMP)
	$(PY) -m benchmarks.step_cost --rounds=24 --out $(RESULTS)/step_cost.md $(BENCH_ARGS)

bench-keras-step-cost: $(STAMP)
	$(PY) -m benchmarks.keras_step_cost --rounds=16 --out $(RESULTS)/keras_step_cost.md $(BENCH_ARGS)

# One TF1 worker's step part by part, runs interleaved (a few minutes)
bench-tf1-step-cost: $(STAMP)
	$(PY) -m benchmarks.tf1_step_cost --rounds=6 --steps=400 --out $(RESULTS)/tf1_step_cost.md $(BENCH_ARGS)

# The training APIs against their bare platforms: Keras (v/k), TF1 (b/t/m)
bench-apis: $(STAMP)
	$(PY) -m benchmarks.compare_pss --rounds=3 --setups=vkbtm --out $(RESULTS)/compare_pss_apis.md $(BENCH_ARGS)

# The documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link or anchor
# fails. docs/cli.md is generated from the flags: python tools/gen_cli_reference.py
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

protos: $(PROTOC_STAMP)
	$(PROTOC_VENV)/bin/python tools/gen_protos.py

bazel-test: $(STAMP) $(PROTOC_STAMP)
	bash tools/bazel_test.sh

clean:
	rm -rf $(VENV) $(PROTOC_VENV) $(TF215_VENV) build site *.egg-info .pytest_cache bazel-*
