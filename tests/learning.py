"""Helpers for the learners' end-to-end tests: reading a run's metrics, and a run killed by
SIGKILL after its first checkpoint, then resumed; the processes a run started; a bad config
refused before anything is written; whether a process is alive."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from onebox import cli, run


def metric(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of every row of `tag` in the run's metrics.csv."""
    with open(run_dir / "metrics.csv") as f:
        return [(int(r["step"]), float(r["value"])) for r in csv.DictReader(f) if r["tag"] == tag]


def best_window(run_dir: Path, n: int = 20) -> float:
    """The best mean return over `n` consecutive episodes of the run."""
    returns = np.array([v for _, v in metric(run_dir, "charts/episodic_return")])
    return float(np.convolve(returns, np.ones(n) / n, "valid").max())


def last_mean(run_dir: Path, n: int = 20) -> float:
    """Mean return of the run's last `n` episodes."""
    returns = [v for _, v in metric(run_dir, "charts/episodic_return")]
    assert len(returns) >= n, f"only {len(returns)} episodes"
    return float(np.mean(returns[-n:]))


def refused(tmp_path: Path, capsys, algo: str, *args: str) -> str:
    """Run `onebox train algo *args` into `tmp_path`; check it exits 2 having written nothing,
    and return what it printed to stderr."""
    assert cli.main(["train", algo, "--runs-dir", str(tmp_path), *args]) == 2
    assert not any(tmp_path.iterdir())  # no run folder was made
    return capsys.readouterr().err


def start_until_checkpoint(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], Path]:
    """Start `onebox *args` in a subprocess, run folder `tmp_path/run`, with a checkpoint every
    ~0.1 s; return it and the folder once its first checkpoint exists (within 2 minutes)."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "onebox", *args, "--runs-dir", str(tmp_path), "--name", "run",
         "--checkpoint-minutes", "0.002"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (run_dir / "checkpoint.pt").exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.2)
    return proc, run_dir


def kill_and_resume(tmp_path: Path, *args: str) -> tuple[Path, int]:
    """Start `onebox train *args` in a subprocess with a checkpoint every ~0.1 s, SIGKILL it once
    a checkpoint exists, check the checkpoint is mid-run, then resume it in this process. Returns
    the run folder and the step of the checkpoint it resumed from."""
    proc, run_dir = start_until_checkpoint(tmp_path, *args)
    time.sleep(1.0)
    proc.kill()  # SIGKILL: no chance to save
    proc.wait()
    config_before = (run_dir / "config.json").read_text()
    saved_step = run.load_checkpoint(run_dir)["global_step"]
    assert cli.main(["train", "--resume", str(run_dir)]) == 0
    assert (run_dir / "config.json").read_text() == config_before
    return run_dir, saved_step


def alive(pid: int) -> bool:
    """Whether process `pid` is running (a zombie is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def descendants(pid: int) -> dict[int, int]:
    """pid -> depth of every live descendant process of `pid` (Linux /proc)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    depth, frontier = {}, [(pid, 0)]
    while frontier:
        p, d = frontier.pop()
        for child, ppid in parent.items():
            if ppid == p:
                depth[child] = d + 1
                frontier.append((child, d + 1))
    return depth
