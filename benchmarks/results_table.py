"""Writing a benchmark's results table (markdown) to a file and the console."""

import pathlib


def write_table(path: str, lines: list[str]) -> str:
    text = "\n".join(lines) + "\n"
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print("\n" + text)
    return text
