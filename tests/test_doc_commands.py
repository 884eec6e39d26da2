"""Every command the README and the docs tell a user to type still works as written.

The commands are read from the pages themselves — fenced ``sh``/``bash`` blocks and inline
code that starts a command (``make …``, ``antdt-…``, ``python -m …``) in README.md,
docs/*.md and the results files' reproduce lines — so a page that changes is checked as it
now reads. The quick ones run (``antdt-data``, ``python -c``); the long or cluster ones
are checked by the binary's own parser without starting anything: ``antdt-launch
--dry_run`` (flags, the master's JobSpec checks, data, paths, every task's arguments),
absl's ``--only_check_args`` for the other ``antdt-*`` binaries, the benchmarks' own
argument parsers, ``make -n`` for make targets (and ``--dry_run`` of the ``antdt-launch``
a make recipe runs). `make demo` itself runs in ``.ci/run``; the ``make bench-*`` targets
run at their smallest size in tests/test_bench_smoke.py.

Documented paths on a cluster (``/shared``, ``/etc/antdt``, ``/var/lib/antdt``) are mapped
into the test's directory, where the data they name is generated; addresses are never
contacted (nothing is started).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
BIN = pathlib.Path(sys.executable).parent
PAGES = [ROOT / "README.md"] + sorted(
    p for p in (ROOT / "docs").glob("*.md") if p.name not in ("index.md", "cli.md")) + sorted(
    (ROOT / "benchmarks" / "results").glob("*.md"))
# cluster paths of the docs -> under the test's directory
MAPPED_ROOTS = ("/shared", "/etc/antdt", "/var/lib/antdt")
# commands of other tools: the docs show them, they are not ours to parse
FOREIGN = ("kubectl", "ray", "openssl", "bazel", "ip", "docker", "helm", "pip", "umask",
           "(umask", "export", "chmod", "cd", "mkdir", "cat", "echo", "ls", "rm", "cp", "ln",
           "mv", "sudo", "systemctl", "curl", "nft", "head", "tail", "wc", "tee", "sort")
PLACEHOLDER = re.compile(r"\.\.\.|…|\*|<[^>]*>|\[--|\|")
INLINE = re.compile(r"`((?:make |antdt-[a-z-]+ |(?:\.venv/bin/)?python3? -m )[^`]*)`")


def _blocks(text: str):
    for m in re.finditer(r"```(sh|bash|console|shell)\n(.*?)```", text, re.S):
        yield m.group(2)


def _commands_of_block(block: str):
    """Logical command lines: continuations joined, quotes that span lines kept whole,
    ``$(…)`` replaced by a word (its value is the user's)."""
    pending = ""
    for line in block.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:          # a quote still open: the command goes on
            continue
        text = re.sub(r"\$\([^)]*\)", "h0", pending).strip()
        pending = ""
        if text and not text.startswith("#"):
            yield text


def _split(text: str) -> list[list[str]]:
    """One line into simple commands (split at ``;``, ``&&``, ``|``), redirections and
    trailing ``&`` dropped."""
    lex = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
    lex.whitespace_split = True
    lex.commenters = "#"
    commands, current, skip_next = [], [], False
    for token in lex:
        if skip_next:
            skip_next = False
            continue
        if token in (";", "&&", "||", "|", "&"):
            commands.append(current)
            current = []
        elif token in (">", ">>", "<", "2>", "2>&1"):
            skip_next = True
        else:
            current.append(token)
    commands.append(current)
    return [c for c in commands if c]


def documented_commands() -> list[tuple[str, list[str], bool]]:
    """(where, argv, inline) of every command the pages show a user. ``inline``: a
    command in running text (``antdt-launch --api=keras``), which may name a mode or a
    flag rather than be a whole command."""
    found, seen = [], set()
    for page in PAGES:
        text = page.read_text()
        where = str(page.relative_to(ROOT))
        lines = [(line, False) for block in _blocks(text)
                 for line in _commands_of_block(block)]
        for m in INLINE.finditer(text):
            if not PLACEHOLDER.search(m.group(1)):
                lines.append((m.group(1), True))
        for line, inline in lines:
            for argv in _split(line):
                while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):
                    argv = argv[1:]           # VAR=value cmd …
                if argv and (where, tuple(argv)) not in seen:
                    seen.add((where, tuple(argv)))
                    found.append((where, argv, inline))
    return found


COMMANDS = documented_commands()


def _kind(argv: list[str]) -> str:
    head = argv[0]
    if head == "make":
        return "make"
    if head.startswith("antdt-") or head.startswith(".venv/bin/antdt-"):
        return pathlib.Path(head).name
    if re.fullmatch(r"(\.venv/bin/)?python3?", head) and len(argv) > 2 and argv[1] == "-m":
        return "python-m"
    if re.fullmatch(r"(\.venv/bin/)?python3?", head) and len(argv) > 2 and argv[1] == "-c":
        return "python-c"
    if head in FOREIGN:
        return "foreign"
    return "unknown"


def test_the_pages_show_commands_of_every_kind():
    """The extraction finds what the pages say (an extraction that found nothing would
    make every check below vacuous)."""
    kinds = {}
    for where, argv, _ in COMMANDS:
        kinds.setdefault(_kind(argv), []).append((where, argv))
    assert not kinds.get("unknown"), ("commands the test does not know how to check; teach "
                                      f"it or mark them as foreign: {kinds['unknown']}")
    assert {"make", "antdt-launch", "antdt-master", "antdt-agent", "antdt-data",
            "python-m", "python-c"} <= set(kinds), sorted(kinds)
    assert any(argv[:2] == ["make", "demo"] for _, argv in kinds["make"])
    assert len(kinds["antdt-launch"]) >= 5


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A directory standing in for the docs' cluster paths, with data where they name
    it, and the environment a documented command expects (job token, TLS files)."""
    base = tmp_path_factory.mktemp("docs")
    from antdt_tf import auth
    from antdt_tf.launcher.generate import generate_data

    env = dict(os.environ)
    auth.make_job_ca(str(base / "tls"), hosts=["127.0.0.1"], days=1)
    env.update({"ANTDT_JOB_TOKEN": "0" * 64, "RAY_AUTH_TOKEN": "docs-test",
                "ANTDT_TLS_CERT": str(base / "tls" / "job.crt"),
                "ANTDT_TLS_KEY": str(base / "tls" / "job.key"),
                "ANTDT_TLS_CA": str(base / "tls" / "ca.crt"),
                "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"})
    train, held_out = generate_data(base / "gen", 4096, 1024, seed=0)
    for _, argv, _ in COMMANDS:
        for arg in argv:
            value = arg.split("=", 1)[-1]
            if value.startswith(MAPPED_ROOTS) and value.endswith(".adtr"):
                target = base / value.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                if not target.exists():
                    os.link(held_out if "eval" in value else train, target)
            elif value.strip("'").startswith(MAPPED_ROOTS) and ".tfrecord" in value:
                # a user's TFRecord files (a glob): one small file where it points
                from keras_examples.clicks import write_examples

                pattern = value.strip("'").lstrip("/")
                target = base / pattern.replace("*", "0")
                target.parent.mkdir(parents=True, exist_ok=True)
                if not target.exists():
                    write_examples(target, 0, 100)
    cwd = base / "cwd"
    cwd.mkdir()
    return base, cwd, env


def _mapped(argv: list[str], base: pathlib.Path) -> list[str]:
    out = []
    for arg in argv:
        for root in MAPPED_ROOTS:
            arg = re.sub(rf"(^|=|')({re.escape(root)})(?=/|'|$)",
                         lambda m: m.group(1) + str(base) + m.group(2), arg)
        out.append(arg)
    return out


def _run(argv, cwd, env, timeout=120):
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _binary(name: str) -> str:
    return str(BIN / pathlib.Path(name).name)


def _make_launch_lines(target: str) -> list[list[str]]:
    """The antdt-launch commands a make target's recipe runs (``make -n``)."""
    proc = _run(["make", "-n", "-s", "-C", str(ROOT), target,
                 f"STAMP={ROOT / 'setup.py'}", f"TF215_STAMP={ROOT / 'setup.py'}",
                 f"PROTOC_STAMP={ROOT / 'setup.py'}"], ROOT, os.environ)
    assert proc.returncode == 0, f"`make {target}`: no such target?\n{proc.stderr}"
    lines = proc.stdout.replace("\\\n", " ").splitlines()
    return [shlex.split(line) for line in lines if "antdt-launch" in line.split(" ")[0]]


def _check_launch(argv, base, env, where):
    cwd = pathlib.Path(tempfile.mkdtemp(dir=base))    # empty: --dry_run must create nothing
    argv = _mapped([_binary(argv[0]), *argv[1:]], base)
    # before a program's own arguments ('--'), which are the program's, not ours
    cut = argv.index("--") if "--" in argv else len(argv)
    proc = _run([*argv[:cut], "--dry_run", *argv[cut:]], cwd, env)
    assert proc.returncode == 0, (f"{where}: `{shlex.join(argv)}` no longer passes "
                                  f"--dry_run:\n{proc.stderr[-3000:]}")
    assert "the job is valid" in proc.stdout and "coordinator" in proc.stdout \
        or "worker:0 (chief)" in proc.stdout, proc.stdout
    assert not any(cwd.iterdir()), f"{where}: --dry_run created {list(cwd.iterdir())}"


def _check_python_m(argv, base, cwd, env, where):
    module = argv[2]
    args = _mapped(argv[3:], base)
    if module == "pytest":
        proc = _run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args], ROOT, env)
        assert proc.returncode == 0, f"{where}: {shlex.join(argv)}\n{proc.stdout[-2000:]}"
        return
    source = (ROOT / (module.replace(".", "/") + ".py"))
    assert source.exists(), f"{where}: `python -m {module}`: no such module"
    if "argparse" in source.read_text():
        # the module's own argparse parser, stopped right after it accepted the arguments
        code = ("import argparse, runpy, sys\n"
                "parse = argparse.ArgumentParser.parse_args\n"
                "def checked(self, *a, **k):\n"
                "    parse(self, *a, **k)\n"
                "    print('ARGS-OK'); sys.exit(0)\n"
                "argparse.ArgumentParser.parse_args = checked\n"
                f"sys.argv = [{module!r}] + sys.argv[1:]\n"
                f"runpy.run_module({module!r}, run_name='__main__')\n")
        proc = _run([sys.executable, "-c", code, *args], ROOT, env)
        ok = proc.returncode == 0 and "ARGS-OK" in proc.stdout
    else:     # absl: its --only_check_args parses every flag and exits
        proc = _run([sys.executable, "-m", module, *args, "--only_check_args"], ROOT, env)
        ok = proc.returncode == 0
    assert ok, f"{where}: `{shlex.join(argv)}` no longer parses:\n{proc.stderr[-2000:]}"


@pytest.fixture(scope="module")
def flags_of():
    """``flags_of(script)``: the names of a console script's antdt flags (read by the
    CLI reference's generator from the binary's own absl definitions)."""
    spec = importlib.util.spec_from_file_location("gen_cli_reference",
                                                  ROOT / "tools" / "gen_cli_reference.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    scripts, cache = gen.console_scripts(), {}

    def lookup(script: str) -> dict:
        if script not in cache:
            module = scripts[script]
            dump = gen.read_flags(gen.FLAG_MODULES.get(module, module))
            cache[script] = {f["name"]: f["boolean"] for rows in dump["modules"].values()
                             for f in rows}
        return cache[script]
    return lookup


def _check_mention(argv, flags_of, base, env, where):
    """Running text names a binary with some of its flags: each flag exists, and the
    ones given a value (or booleans) parse."""
    script = pathlib.Path(argv[0]).name
    known = flags_of(script)
    given = []
    for arg in argv[1:]:
        name = arg[2:].split("=", 1)[0]
        boolean = name in known and known[name] or (name.startswith("no")
                                                      and known.get(name[2:]))
        assert arg.startswith("--") and (name in known or boolean), (
            f"{where}: `{shlex.join(argv)}`: {script} has no flag {arg.split('=')[0]}")
        if "=" in arg or boolean:
            given.append(arg)
    proc = _run([_binary(script), *_mapped(given, base), "--only_check_args"], base, env)
    # a mention need not name the binary's required flags; anything else is an error
    rest = re.sub(r"flag --(\w+)=None: Flag --\1 must have a value other than None\.\s*",
                  "", proc.stderr)
    assert proc.returncode == 0 or rest.strip() == f"{script}: error: (--help lists the flags)", (
        f"{where}: `{shlex.join(argv)}` no longer parses:\n{proc.stderr[-2000:]}")


@pytest.mark.parametrize("where,argv,inline", COMMANDS,
                         ids=[f"{w}:{' '.join(a)[:60]}" for w, a, _ in COMMANDS])
def test_documented_command(where, argv, inline, sandbox, flags_of):
    base, cwd, env = sandbox
    kind = _kind(argv)
    if kind == "make":
        target = argv[1] if len(argv) > 1 else "all"
        for launch in _make_launch_lines(target):
            _check_launch(launch, base, env, f"{where} (make {target})")
    elif kind.startswith("antdt-") and inline:
        _check_mention(argv, flags_of, base, env, where)
    elif kind == "antdt-launch":
        _check_launch(argv, base, env, where)
    elif kind == "antdt-data":
        # quick: run as written, one page's commands in order in one directory
        proc = _run([_binary(argv[0]), *_mapped(argv[1:], base)], cwd, env)
        assert proc.returncode == 0, f"{where}: {shlex.join(argv)}\n{proc.stderr[-2000:]}"
    elif kind.startswith("antdt-"):
        proc = _run([_binary(argv[0]), *_mapped(argv[1:], base), "--only_check_args"],
                    cwd, env)
        assert proc.returncode == 0, (f"{where}: `{shlex.join(argv)}` no longer parses:\n"
                                      f"{proc.stderr[-2000:]}")
    elif kind == "python-m":
        _check_python_m(argv, base, cwd, env, where)
    elif kind == "python-c":
        (base / "etc" / "antdt" / "job42").mkdir(parents=True, exist_ok=True)
        proc = _run([sys.executable, "-c", _mapped([argv[2]], base)[0]], cwd,
                    {**env, "PYTHONPATH": str(ROOT)})
        assert proc.returncode == 0, f"{where}: {shlex.join(argv)}\n{proc.stderr[-2000:]}"
    else:
        assert kind == "foreign", (where, argv)
        pytest.skip(f"not an antdt-tf command: {argv[0]}")
