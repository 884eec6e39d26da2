"""The documentation cannot drift from the code: the CLI reference is generated from the
binaries' flags, and the MkDocs site builds with every link resolving."""

import importlib.util
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli_reference",
                                                  ROOT / "tools" / "gen_cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_generated_from_the_flags():
    gen = _generator()
    expected = gen.render()
    checked_in = (ROOT / "docs" / "cli.md").read_text()
    assert checked_in == expected, (
        "docs/cli.md differs from the binaries' flags; regenerate it with: "
        f"{gen.COMMAND}  (then review and commit docs/cli.md)")


def test_cli_reference_covers_every_console_script_and_flag():
    gen = _generator()
    text = (ROOT / "docs" / "cli.md").read_text()
    scripts = gen.console_scripts()
    assert len(scripts) >= 8
    for script in scripts:
        assert f"## `{script}`" in text, f"{script} (setup.py entry point) missing"
    # one flag per binary, defined in its own module, reaches the page with its default
    for flag, default in (("--state_dir", '`""`'), ("--num_ps", "`2`"),
                          ("--host_name", "`localhost`"), ("--steps_per_closure", "`16`")):
        rows = [line for line in text.splitlines() if line.startswith(f"| `{flag}` |")]
        assert rows and all(f"| {default} |" in row for row in rows), (flag, rows)
