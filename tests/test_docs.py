"""The documentation cannot drift from the code: the CLI reference is generated from the
binaries' flags, and the MkDocs site builds with every link resolving."""

import importlib.util
import os
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


def test_docs_index_mirrors_the_readme():
    readme = (ROOT / "README.md").read_text()
    expected = readme.replace("](docs/", "](").replace("](CHANGELOG.md)", "](../CHANGELOG.md)")
    assert (ROOT / "docs" / "index.md").read_text() == expected, (
        "docs/index.md is the README with its links made relative to docs/; after editing "
        "README.md regenerate it: python -c \"import pathlib; s = pathlib.Path('README.md')"
        ".read_text(); pathlib.Path('docs/index.md').write_text(s.replace('](docs/', "
        "'](').replace('](CHANGELOG.md)', '](../CHANGELOG.md)'))\"")


def test_readme_stays_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move detail into docs/"
    first_screen = "\n".join(lines[:15])
    assert "make demo" in first_screen and "make test" in first_screen


def test_mkdocs_build_strict(tmp_path):
    """The whole site builds with --strict: a broken link, anchor or nav entry fails."""
    try:
        import mkdocs  # noqa: F401
        import material  # noqa: F401
    except ImportError:
        import pytest
        pytest.skip("mkdocs / mkdocs-material not installed (pip install -e '.[docs]')")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, (
        "mkdocs build --strict failed (run `make docs` to see it):\n" + proc.stdout + proc.stderr)
    assert (tmp_path / "site" / "cli" / "index.html").exists()
    # repository files linked from the pages are in the site (docs/hooks/repo_links.py)
    assert (tmp_path / "site" / "benchmarks" / "results" / "compare_pss_apis" / "index.html").exists()
