"""`onebox bench gpu` (the GPU suite) without a GPU: it refuses to pass a CPU off as a GPU, a
`--tiny --device cpu` dry run says so at the top of its report, and parts past the deadline are
reported skipped, as are a part's rows past it. (The whole dry run, every part:
`benchmarks/gpu.sh OUT --tiny --device cpu`.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from onebox import cli

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU's refusals")


def test_the_suite_refuses_a_cpu_unless_tiny(tmp_path: Path, capsys) -> None:
    out = tmp_path / "report"
    assert cli.main(["bench", "gpu", "--device", "cpu", "--out", str(out)]) == 2
    assert "--tiny --device cpu" in capsys.readouterr().err
    assert not out.exists()


def test_a_tiny_cpu_run_says_so_and_measures(tmp_path: Path) -> None:
    out = tmp_path / "report"
    args = ["bench", "gpu", "--tiny", "--device", "cpu", "--out", str(out), "--env-threads", "1"]
    assert cli.main([*args, "--parts", "envs"]) == 0
    report = (out / "report.md").read_text()
    assert "**Ran on cpu, not a GPU, at tiny sizes" in report
    section = report.split("## Pong-v5: the engine alone against EnvPool", 1)[1]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| onebox")]
    assert [row[0] for row in rows] == ["| onebox sync", "| onebox async"]
    assert all(float(row[3].rstrip("k")) > 0 for row in rows)  # frames/s measured


def test_parts_past_the_deadline_are_reported_skipped(tmp_path: Path) -> None:
    out = tmp_path / "report"
    assert cli.main(["bench", "gpu", "--tiny", "--device", "cpu", "--out", str(out),
                     "--parts", "envs", "learn", "--deadline", "1"]) == 0  # fmt: skip
    report = (out / "report.md").read_text()
    assert "## envs\n\nSkipped: less than a minute was left before the deadline." in report
    assert "## Learning run\n\nSkipped: less than half a minute" in report


def test_rows_past_the_deadline_are_reported_not_run(tmp_path: Path, capsys) -> None:
    # 70 s left: the evolve part starts (a minute is its floor) and runs its first row, the one
    # most wanted; the others need 100 s and are listed as not run.
    out = tmp_path / "report"
    deadline = str(time.time() + 70)
    assert cli.main(["bench", "gpu", "--tiny", "--device", "cpu", "--out", str(out),
                     "--env-threads", "1", "--parts", "evolve", "--deadline", deadline]) == 0  # fmt: skip
    section = (out / "report.md").read_text().split("## Evolution", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| float32 | env | 2 of")]
    assert len(rows) == 1
    # and printed as it was measured, for a suite cut off before its part's report is written
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("row: ")]
    assert printed == ["row: " + rows[0]]
    assert (
        "Not run, the deadline being near: float32, env seeds, 2 groups of 1, in turn, episodes "
        "of 20 steps; float32, env seeds, 2 groups of 2, in turn, episodes of 20 steps;" in section
    )


def test_a_row_that_raises_costs_only_that_row(tmp_path: Path, monkeypatch) -> None:
    # A lease is minutes long: a row that fails is reported with its traceback and the part's
    # other rows still run; the suite then exits non-zero.
    from onebox.bench import evolve

    real = evolve.population_rate

    def flaky(bench, slots, one_pool):
        if not bench.pool_turns:
            raise RuntimeError("a row that breaks")
        return real(bench, slots, one_pool)

    monkeypatch.setattr(evolve, "population_rate", flaky)
    out = tmp_path / "report"
    deadline = str(time.time() + 200)  # room for the first four rows, the most wanted
    assert cli.main(["bench", "gpu", "--tiny", "--device", "cpu", "--out", str(out),
                     "--env-threads", "1", "--parts", "evolve", "--deadline", deadline]) == 1  # fmt: skip
    section = (out / "report.md").read_text().split("## Evolution", 1)[1]
    assert "**Failed: float32, env seeds, 2 groups of 2, at once, episodes of 10 steps**" in section
    assert "RuntimeError: a row that breaks" in section
    rows = [line for line in section.splitlines() if line.startswith("| float32 | env |")]
    assert [row.split(" | ")[2:4] for row in rows][:2] == [["2 of 2", "in turn"],
                                                           ["2 of 1", "in turn"]]  # fmt: skip
    assert any(line.startswith("| bfloat16 | env | 2 of 2 |") for line in section.splitlines())
    assert [row.split(" | ")[4] for row in rows][:3] == ["10", "20", "20"]  # episode caps
    assert all(row.split(" | ")[7] != "-" for row in rows)  # one pool alone, measured too


def test_the_population_part_measures_one_member_and_both_ways_of_updating(tmp_path) -> None:
    out = tmp_path / "report"
    assert cli.main(["bench", "gpu", "--tiny", "--device", "cpu", "--out", str(out),
                     "--env-threads", "1", "--parts", "pbt"]) == 0  # fmt: skip
    section = (out / "report.md").read_text().split("## A population of 2 PPO members", 1)[1]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ")][2:]
    assert [row[0] for row in rows] == ["| one member (`onebox train`)",
                                        "| 2 members, --updates batched",
                                        "| 2 members, --updates separate"]  # fmt: skip
    assert rows[0][3] == "1.00x" and all(float(row[3].rstrip("x")) > 0 for row in rows)
