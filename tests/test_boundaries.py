"""Import boundaries: the pure cores import neither TensorFlow nor gRPC nor absl flags."""

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["antdt_tf.sharding.plan", "antdt_tf.sharding.state",
                                    "antdt_tf.sharding.store", "antdt_tf.data.criteo",
                                    "antdt_tf.data.records", "antdt_tf.monitor.straggler",
                                    "antdt_tf.controller", "antdt_tf.backends.base"])
def test_pure_cores_import_no_framework(module):
    code = (f"import sys, json, {module}; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert not loaded & {"tensorflow", "grpc", "absl", "keras", "tf_keras"}


def test_service_layer_imports_no_tensorflow():
    code = ("import sys, json, antdt_tf.sharding.client, antdt_tf.master.__main__, "
            "antdt_tf.monitor.view, antdt_tf.monitor.service, antdt_tf.backends.kubernetes; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "tensorflow" not in json.loads(out.stdout)


def test_children_die_with_their_parent(tmp_path):
    """An antdt_tf process started with child_env() is SIGKILLed when its parent dies,
    even when the parent is busy in gRPC threads (no preexec_fn involved)."""
    import os
    import time

    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from antdt_tf.procutil import child_env\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import antdt_tf, time; time.sleep(60)'],"
        " env=child_env())\n"
        f"open({str(pid_file)!r}, 'w').write(str(c.pid))\n"
        "time.sleep(60)\n")])
    deadline = time.monotonic() + 20
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int(pid_file.read_text())
    parent.kill()   # SIGKILL the parent we started
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        try:
            with open(f"/proc/{child}/stat") as f:   # a zombie awaiting its reaper is dead too
                if f.read().split()[2] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    pytest.fail("the child outlived its parent")


def test_imports_point_one_way():
    """core state -> services -> master -> launcher: the services and the job spec never
    import the master or the launcher, the master (its job runner included) never imports
    the launcher, and the shared RPC plumbing imports no service (no cycles)."""
    import ast
    import pathlib

    pkg = pathlib.Path(__file__).resolve().parent.parent / "antdt_tf"

    def imported(path):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                yield node.module
            elif isinstance(node, ast.Import):
                yield from (a.name for a in node.names)

    rules = {("sharding", "monitor", "backends", "controller", "agent", "job"):
             ("antdt_tf.master", "antdt_tf.launcher", "antdt_tf.launch"),
             # the master runs the job; the launcher is a client of it
             ("master",): ("antdt_tf.launcher", "antdt_tf.launch"),
             ("rpc.py", "auth.py", "errors.py"):
             ("antdt_tf.sharding", "antdt_tf.monitor", "antdt_tf.master", "antdt_tf.launch")}
    bad = []
    for places, forbidden in rules.items():
        for place in places:
            files = [pkg / place] if place.endswith(".py") else sorted((pkg / place).rglob("*.py"))
            for f in files:
                bad += [f"{f.relative_to(pkg)} imports {m}" for m in imported(f)
                        if m.startswith(forbidden)]
    assert not bad, bad


def _module_graph(pkg) -> dict:
    """Module -> the package modules it imports at module level (imports inside a
    function run later, when both modules are loaded, and cannot form a cycle)."""
    import ast

    mods = {}
    for p in pkg.rglob("*.py"):
        parts = p.relative_to(pkg.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    graph = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    here = here[:len(here) - node.level + 1]
                    base = ".".join(here + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def _cycles(graph: dict) -> list:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    import pathlib

    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = _module_graph(pathlib.Path(__file__).resolve().parent.parent / "antdt_tf")
    assert len(graph) > 50 and graph["antdt_tf.sharding.state.ledger"] >= {
        "antdt_tf.sharding.state.records", "antdt_tf.errors"}       # the graph is read
    assert _cycles(graph) == []


def _private_imports(pkg, root) -> list:
    """``from antdt_tf.x import _name`` and ``thing._name`` on anything but ``self`` /
    ``cls`` anywhere under ``root``: a helper private to one module (or class) used by
    another. TensorFlow's own private APIs go through ``tf/tf_internals.py`` only."""
    import ast

    bad = []
    for path in sorted(root.rglob("*.py")):
        if "proto" in path.parts:
            continue     # generated stubs
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("antdt_tf"):
                bad += [f"{path.relative_to(pkg.parent)}: {node.module}.{a.name}"
                        for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                continue
            owner = ast.unparse(node.value)
            if owner in ("self", "cls", "os") or path.name == "tf_internals.py":
                continue     # its own; os._exit; the one home of TF's private APIs
            if path.name == "client.py" and owner == "self._client":
                continue     # ShardStream and the ShardingClient of its own module
            bad.append(f"{path.relative_to(pkg.parent)}: {owner}.{node.attr}")
    return bad


def test_no_module_uses_another_modules_private_helpers(tmp_path):
    import pathlib

    sample = tmp_path / "antdt_tf"
    sample.mkdir()
    (sample / "m.py").write_text("from antdt_tf.tf.pull import _x\nfrom antdt_tf.tf import pull\n"
                                 "pull._y()\nfrom antdt_tf import __version__\n"
                                 "self._ok()\nself.reporter._report()\n")
    assert _private_imports(sample, sample) == ["antdt_tf/m.py: antdt_tf.tf.pull._x",
                                                "antdt_tf/m.py: pull._y",
                                                "antdt_tf/m.py: self.reporter._report"]
    pkg = pathlib.Path(__file__).resolve().parent.parent / "antdt_tf"
    assert _private_imports(pkg, pkg) == []
