"""What every benchmark shares: the timing loop, the machine description, number formatting, the
command line that reproduces a run, and the markdown writer for docs/benchmarks.md."""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import os
import platform
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from onebox.bench import figures

# ---- timing ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Timing:
    """`steps` steps done in `seconds` of wall time."""

    steps: int
    seconds: float

    @property
    def rate(self) -> float:
        """Steps per second."""
        return self.steps / self.seconds if self.seconds > 0 else float("nan")


def measure(
    run: Callable[[int], Any],
    steps_per_call: int,
    seconds: float,
    warmup: float = 0.5,
) -> Timing:
    """Time a loop: `run(k)` makes `k` calls of the loop body, each doing `steps_per_call` steps
    (or, if `run` returns an int, that many steps in all: loops whose calls vary in length).

    The body runs for `warmup` seconds first (not counted), then for about `seconds`. Calls are
    made in chunks long enough (~10 ms, or 1/20 of the budget if less) that reading the clock
    costs nothing measurable even when one call takes a microsecond; at least one call is timed.
    """
    target = max(min(0.01, seconds / 20), 1e-4)
    chunk = 1
    start = time.perf_counter()
    while True:  # warm-up, sizing the chunk on the way
        t0 = time.perf_counter()
        run(chunk)
        dt = time.perf_counter() - t0
        if dt < target / 2 and chunk < 1 << 24:
            chunk = max(chunk * 2, int(chunk * target / max(dt, 1e-9) / 2))
        if time.perf_counter() - start >= warmup:
            break
    steps = 0
    t0 = time.perf_counter()
    while True:
        done = run(chunk)
        steps += done if isinstance(done, int) else chunk * steps_per_call
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return Timing(steps, elapsed)


# ---- formatting --------------------------------------------------------------------------------


def format_rate(rate: float | None) -> str:
    """Steps/s with three significant digits: 987, 12.3k, 4.56M."""
    if rate is None or rate != rate:
        return "-"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if rate >= scale:
            return f"{rate / scale:.3g}{suffix}"
    return f"{rate:.3g}"


def format_ratio(ratio: float | None) -> str:
    """A speed ratio: 0.52×, 3.1×, 48×."""
    if ratio is None or ratio != ratio:
        return "-"
    return f"{ratio:.2f}×" if ratio < 10 else f"{ratio:.0f}×"


def command_line(prog: str, config: Any) -> str:
    """The command that reruns `config` (a tyro config dataclass) with every value spelled out."""
    parts = shlex.split(prog)
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        flag = "--" + field.name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            parts.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, list | tuple):
            parts += [flag, *map(str, value)]
        else:
            parts += [flag, str(value)]
    return shlex.join(parts)


def console(stderr: bool = False) -> Any:
    """A rich console; when the output is not a terminal (a pipe, a log file) it is 160 columns
    wide rather than 80, so that tables keep one line per row."""
    from rich.console import Console

    out = Console(stderr=stderr)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(stderr=stderr, width=160)
    return out


# ---- the machine -------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo or lscpu, else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        m = re.search(r"^Model name:\s*(.+)$", out, re.MULTILINE)
        if m:
            return m.group(1).strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def package_version(name: str) -> str:
    """An installed distribution's version, or "not installed" (the package is not imported)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def git_commit(path: str | Path | None = None) -> str | None:
    """The short commit (with "+dirty" if the tree has changes) of the repository holding `path`."""
    cwd = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        run = dict(cwd=cwd, capture_output=True, text=True, timeout=5)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], **run)  # type: ignore[call-overload]
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], **run)  # type: ignore[call-overload]
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info(packages: Sequence[str] = ("numpy", "gymnasium")) -> dict[str, str]:
    """What a benchmark ran on: CPU, cores, OS, Python and the versions of `packages`."""
    from onebox import __version__
    from onebox.envs.base import physical_cores

    logical = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = {
        "cpu": cpu_model(),
        "cores": f"{physical_cores()} physical, {logical} logical (usable by this process)",
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
    }
    for name in packages:
        info[name] = package_version(name)
    commit = git_commit()
    info["onebox"] = __version__ + (f" (git {commit})" if commit else "")
    return info


def now() -> str:
    """The date and time, UTC, to the minute."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def print_table(
    console: Any, title: str, header: Sequence[str], rows: Sequence[Sequence[str]]
) -> None:
    """`rows` as a rich table on `console`: the first column left-aligned, the others right."""
    from rich.table import Table

    table = Table(title=title)
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)


# ---- markdown ----------------------------------------------------------------------------------


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]
) -> str:
    """A GitHub markdown table; columns with `right[i]` are right-aligned."""
    align = ["--:" if r else "---" for r in right]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def provenance(prog: str, config: Any, packages: Sequence[str]) -> list[str]:
    """The closing lines of a benchmark section: its command, date and machine."""
    machine = machine_info(packages)
    return [f"Command: `{command_line(prog, config)}`", "", f"Date: {now()}", "", "Machine:", "",
            *[f"- {k}: {v}" for k, v in machine.items()]]  # fmt: skip


def markers(key: str) -> tuple[str, str]:
    """The comments that open and close section `key` (e.g. "bench:envs:CartPole-v1")."""
    return f"<!-- {key} -->", f"<!-- /{key} -->"


def write_section(
    path: str | Path, key: str, body: str, figure: figures.Bars | None = None
) -> Path:
    """Put `body` between the markers of section `key` in the markdown file `path`; with a
    `figure`, its numbers and its drawing beside the file (`figures.save`) and the drawing
    shown at the section's end.

    An existing section is replaced, whatever it held, and nothing else in the file changes; a
    missing one is appended at the end (the file is created if need be). Writing the same body
    twice leaves the file as it was after the first write.
    """
    path = Path(path)
    if figure is not None:
        drawn = figures.save(figure, path, key)
        body = f"{body.rstrip()}\n\n![{figure.title}]({figures.FOLDER}/{drawn.name})"
    start, end = markers(key)
    block = f"{start}\n{body.strip()}\n{end}"
    text = path.read_text() if path.exists() else ""
    i = text.find(start)
    if i >= 0:
        j = text.find(end, i + len(start))
        if j < 0:
            raise ValueError(f"{path}: {start} has no closing {end}; fix the file by hand")
        text = text[:i] + block + text[j + len(end) :]
    else:
        text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
