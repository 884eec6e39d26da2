"""Writes docs/cli.md, the command-line reference, from the binaries' own absl flags.

Every console script in setup.py's ``entry_points`` is a module that defines its flags
with absl at import time (none of them imports TensorFlow to do so). This script imports
each such module in a fresh interpreter — the binaries share flag names (``--port``,
``--bind``, ...), and absl refuses a second definition in one process — and reads back
every flag defined by an ``antdt_tf`` module: name, type, default and help. The output
is deterministic (binaries and flags sorted by name), so ``tests/test_docs.py`` can
regenerate it and compare it with the checked-in page: a flag changed without running
this script fails the test.

Usage: python tools/gen_cli_reference.py [--check]
"""

from __future__ import annotations

import ast
import concurrent.futures
import difflib
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "cli.md"
COMMAND = "python tools/gen_cli_reference.py"

# An entry point whose flags live in another module than the one it names.
FLAG_MODULES = {
    "antdt_tf.master": "antdt_tf.master.__main__",   # run() imports it lazily
}

# What each module's flags are, when a binary gets them from a shared module.
SHARED_MODULES = {
    "antdt_tf.auth": "the job token and TLS (see [security](security.md))",
    "antdt_tf.tf.chief_flags": "shared by both chiefs (`antdt-coordinator`, "
                               "`antdt-keras-trainer`)",
}

# Run in a fresh interpreter: import one module, print its flags as JSON.
_DUMP = r"""
import importlib, json, sys
module = importlib.import_module(sys.argv[1])
from absl import flags
out = {"doc": module.__doc__ or "", "modules": {}}
for name, defined in flags.FLAGS.flags_by_module_dict().items():
    if not (name == "antdt_tf" or name.startswith("antdt_tf.")):
        continue
    rows = []
    for f in defined:
        default = f.default
        if isinstance(default, (list, tuple)):
            default = list(default)
        elif default is not None and not isinstance(default, (bool, int, float, str)):
            default = str(default)
        rows.append({"name": f.name, "type": f.flag_type(), "default": default,
                     "help": f.help or "", "boolean": bool(f.boolean),
                     "enum": list(getattr(f.parser, "enum_values", None) or [])})
    out["modules"][name] = rows
print(json.dumps(out))
"""


class GenerationError(RuntimeError):
    """A binary's flags could not be read."""


def console_scripts() -> dict[str, str]:
    """``{script: module}`` from setup.py's ``entry_points["console_scripts"]``."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "entry_points":
            scripts = ast.literal_eval(node.value)["console_scripts"]
            return {s.split("=")[0].strip(): s.split("=")[1].split(":")[0].strip()
                    for s in scripts}
    raise GenerationError("setup.py has no entry_points=... with console_scripts")


def read_flags(module: str) -> dict:
    """The module's docstring and its antdt_tf flags, read in a fresh interpreter."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT),
           "LANG": "C.UTF-8"}     # no ANTDT_* or TF variables: defaults as shipped
    proc = subprocess.run([sys.executable, "-c", _DUMP, module], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise GenerationError(f"importing {module} to read its flags failed "
                              f"(exit {proc.returncode}):\n{proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _cell(text: str) -> str:
    text = " ".join(str(text).split())
    for a, b in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("*", "\\*")):
        text = text.replace(a, b)
    return text


def _default(flag: dict) -> str:
    value = flag["default"]
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list):
        return f"`{','.join(map(str, value))}`" if value else "empty"
    if value == "":
        return '`""`'
    return f"`{value}`".replace("|", "\\|")


def _type(flag: dict) -> str:
    if flag["enum"]:
        return "one of " + ", ".join(f"`{v}`" for v in flag["enum"])
    return {"bool": "bool", "int": "int", "float": "float", "string": "string",
            "comma separated list of strings": "comma-separated list",
            "multi string": "string, repeatable"}.get(
                flag["type"], flag["type"])


def _help(flag: dict) -> str:
    text = flag["help"]
    if flag["enum"]:       # absl prefixes an enum's help with "<a|b|c>: "
        prefix = "<" + "|".join(flag["enum"]) + ">: "
        if text.startswith(prefix):
            text = text[len(prefix):]
    return _cell(text)


def _summary(script: str, doc: str) -> str:
    first = " ".join(doc.strip().split("\n\n")[0].split())
    if first.startswith(script + ":"):
        first = first[len(script) + 1:].strip()
    first = first.replace("``", "`")
    return first[:1].upper() + first[1:] if first else ""


def _table(rows: list[dict]) -> list[str]:
    lines = ["| flag | type | default | meaning |", "|---|---|---|---|"]
    for f in sorted(rows, key=lambda f: f["name"]):
        name = f"`--[no]{f['name']}`" if f["boolean"] else f"`--{f['name']}`"
        lines.append(f"| {name} | {_type(f)} | {_default(f)} | {_help(f)} |")
    return lines


def render() -> str:
    """The whole of docs/cli.md."""
    scripts = console_scripts()
    modules = {s: FLAG_MODULES.get(m, m) for s, m in scripts.items()}
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        found = dict(zip(modules, pool.map(read_flags, modules.values())))
    out = [
        "# Command-line reference",
        "",
        f"<!-- Generated by tools/gen_cli_reference.py from the binaries' absl flags; do not "
        f"edit. After changing a flag run: {COMMAND} -->",
        "",
        "Every flag of every antdt-tf binary (the console scripts of `setup.py`), read from "
        "the binaries' own flag definitions. Each binary also takes absl's standard flags "
        "(`--help`, `--helpfull`, `--flagfile`, logging), not listed here; `--helpshort` "
        "prints a binary's own. Exit codes and what each binary does with bad input: "
        "[exit codes](cli-exit-codes.md).",
    ]
    for script in sorted(found):
        module = modules[script]
        info = found[script]
        own = info["modules"].get(module, [])
        if not own:
            raise GenerationError(
                f"{script}: its module {module} defines no antdt_tf flags; if they live in "
                f"another module, add it to FLAG_MODULES in tools/gen_cli_reference.py")
        out += ["", f"## `{script}`", ""]
        summary = _summary(script, info["doc"])
        if summary:
            out += [summary, ""]
        out += [f"Flags of `{module}`:", ""] + _table(own)
        for other in sorted(info["modules"]):
            if other == module:
                continue
            what = SHARED_MODULES.get(other, "")
            out += ["", f"Flags of `{other}`" + (f", {what}" if what else "") + ":", ""]
            out += _table(info["modules"][other])
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        old = OUT.read_text() if OUT.exists() else ""
        if old == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(
            old.splitlines(True), text.splitlines(True), "docs/cli.md (checked in)",
            "docs/cli.md (from the flags)"))
        print(f"docs/cli.md is out of date; run: {COMMAND}", file=sys.stderr)
        return 1
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
