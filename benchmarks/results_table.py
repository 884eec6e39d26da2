"""Writing a benchmark's results table (markdown) to a file and the console, and the
``--smoke`` flag every benchmark has (its smallest size; the table then says so)."""

import pathlib

# the first line of a results file written by a ``--smoke`` run
SMOKE_NOTE = ("> **Smoke run** (`--smoke`): the benchmark at its smallest size, one "
              "round. It checks that the benchmark runs and renders its table; its numbers "
              "are not a measurement.")


def write_table(path: str, lines: list[str], smoke: bool = False) -> str:
    """Writes ``lines`` (and prints them); a ``smoke`` run's file starts with
    :data:`SMOKE_NOTE`."""
    if smoke:
        lines = [SMOKE_NOTE, "", *lines]
    text = "\n".join(lines) + "\n"
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print("\n" + text)
    return text


def per_step_stats(rows: dict, parts, steps: int):
    """``(mean, total, stderr)`` for the step-cost probes: ``rows[variant]`` is a list of
    runs, each ``{part: seconds, ...}`` over ``steps`` steps. ``mean(variant, part)`` and
    ``total(variant)`` (summed over ``parts``) are milliseconds per step; ``stderr(variant)``
    is the standard error of the total over the runs (nan with one run)."""
    import statistics

    ms = 1000.0 / steps

    def mean(name, key):
        return statistics.mean(x[key] for x in rows[name]) * ms

    def total(name):
        return sum(mean(name, k) for k in parts)

    def stderr(name):
        sums = [sum(x[k] for k in parts) * ms for x in rows[name]]
        return statistics.stdev(sums) / len(sums) ** 0.5 if len(sums) > 1 else float("nan")

    return mean, total, stderr


def non_default_flags(args, defaults: dict) -> str:
    """`` --flag=value`` for each of ``defaults`` (flag -> its parser default) that
    ``args`` sets otherwise: what a results file's reproduce line must name."""
    return "".join(f" --{flag}={getattr(args, flag)}" for flag, default in defaults.items()
                   if getattr(args, flag) != default)


def _flag_value(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def smoke_argv(argv: list[str], smoke: dict) -> list[str]:
    """``argv`` with ``--smoke`` expanded in place into ``smoke``'s flags (flag -> value)
    after it: it overrides what comes before it (the Makefile's ``--rounds=...``), and a
    flag named after it still wins (``--smoke --rounds=2``)."""
    out = []
    for arg in argv:
        out.append(arg)
        if arg in ("--smoke", "--smoke=true", "--smoke=True", "--smoke=1"):
            out += [f"--{flag}={_flag_value(value)}" for flag, value in smoke.items()]
    return out


def _smoke_help(smoke: dict) -> str:
    return ("the smallest meaningful size, as if " + " ".join(
        f"--{k}={_flag_value(v)}" for k, v in smoke.items()) + " were named here (flags "
        "after it still win): checks that the benchmark runs; the results file says it "
        "is not a measurement")


def argparse_smoke(ap, smoke: dict, argv=None):
    """``ap.parse_args`` with a ``--smoke`` flag (see :func:`smoke_argv`)."""
    import sys

    ap.add_argument("--smoke", action="store_true", help=_smoke_help(smoke))
    return ap.parse_args(smoke_argv(sys.argv[1:] if argv is None else argv, smoke))


def absl_smoke(flags_module, smoke: dict) -> None:
    """Defines ``--smoke`` for an absl benchmark; run it with
    ``app.run(main, argv=smoke_argv(sys.argv, SMOKE))``."""
    flags_module.DEFINE_bool("smoke", False, _smoke_help(smoke))
