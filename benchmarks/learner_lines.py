"""Lines of Python files: all, blank, comments and docstrings, and code (the rest), to compare a
onebox learner's module with a CleanRL script for the same algorithm.

    python benchmarks/learner_lines.py src/onebox/algos/pqn.py ../shared/peers/cleanrl/pqn.py
"""

from __future__ import annotations

import argparse
import io
import tokenize
from pathlib import Path


def count(path: Path) -> dict[str, int]:
    """Line counts of one file: `lines`, `blank`, `docs` (comment or docstring lines) and
    `code` (every other line; a line with code and a comment counts as code)."""
    text = path.read_text()
    lines = text.splitlines()
    code: set[int] = set()
    docs: set[int] = set()
    previous = tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        rows = set(range(tok.start[0], tok.end[0] + 1))
        if tok.type == tokenize.COMMENT:
            docs |= rows
        elif tok.type == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.INDENT,
                                                          tokenize.DEDENT, tokenize.NL):  # fmt: skip
            docs |= rows  # a string standing alone: a docstring
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                              tokenize.ENDMARKER):  # fmt: skip
            code |= rows
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            previous = tok.type
    blank = sum(1 for line in lines if not line.strip())
    return {"lines": len(lines), "blank": blank, "docs": len(docs - code), "code": len(code)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args()
    print("| file | lines | blank | comments and docstrings | code |")
    print("|---|---|---|---|---|")
    for path in args.files:
        c = count(path)
        print(f"| {path} | {c['lines']} | {c['blank']} | {c['docs']} | {c['code']} |")


if __name__ == "__main__":
    main()
