"""Repository rule: a Python toolchain that runs the repo's own .venv interpreter.

The interpreter is <workspace root>/.venv/bin/python (created by `make install`)
unless ANTDT_PYTHON names another one (absolute path). Nothing is downloaded.
"""

_BUILD = """\
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

py_runtime(
    name = "py3_runtime",
    interpreter_path = "{interpreter}",
    python_version = "PY3",
    stub_shebang = "#!/usr/bin/env python3",
)

py_runtime_pair(
    name = "runtime_pair",
    py2_runtime = None,
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
"""

def _venv_python_impl(rctx):
    interpreter = rctx.os.environ.get("ANTDT_PYTHON", "")
    if not interpreter:
        # Bazel 4 has no rctx.workspace_root: walk up from this file.
        root = rctx.path(Label("//tools/python:venv.bzl")).dirname.dirname.dirname
        interpreter = "%s/%s" % (root, rctx.attr.venv_python)
    if not interpreter.startswith("/"):
        fail("ANTDT_PYTHON must be an absolute path, got %r" % interpreter)
    if not rctx.path(interpreter).exists:
        fail("Python interpreter %s not found: run `make install` first or set ANTDT_PYTHON" % interpreter)
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)
    rctx.file("BUILD", _BUILD.format(interpreter = interpreter))

venv_python = repository_rule(
    implementation = _venv_python_impl,
    attrs = {"venv_python": attr.string(default = ".venv/bin/python")},
    environ = ["ANTDT_PYTHON"],
    local = True,
)
