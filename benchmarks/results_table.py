"""Writing a benchmark's results table (markdown) to a file and the console."""

import pathlib


def write_table(path: str, lines: list[str]) -> str:
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
