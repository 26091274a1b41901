"""The figure scripts of benchmarks/ on small recorded inputs: each draws a non-empty image from
what a real run leaves (so a figure in the docs is always redrawable from its data)."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from onebox import cli
from onebox.bench import figures

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def script(name: str) -> ModuleType:
    """benchmarks/NAME.py as a module."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def populations(tmp_path_factory) -> list[Path]:
    """A PBT run and a random-search run (`--selection none`) of 3 PPO members on CartPole."""
    root = tmp_path_factory.mktemp("runs")
    args = ["pbt", "ppo", "--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "64",
            "--torch-threads", "1", "--num-threads", "1", "--population", "3", "--ready",
            "1024", "--total-steps", "4096", "--runs-dir", str(root)]  # fmt: skip
    for name, selection in (("pbt", "truncation"), ("random", "none")):
        assert cli.main([*args, "--name", name, "--selection", selection]) == 0
    return [root / "pbt", root / "random"]


def test_pbt_curves_extracts_each_runs_best_member_and_draws_them(populations, tmp_path) -> None:
    curves = script("pbt_curves")
    data = tmp_path / "curves.csv"
    curves.extract(populations, data)
    with open(data, newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["method"] for r in rows} == {"pbt", "random"}
    assert {r["game"] for r in rows} == {"CartPole"}
    for method in ("pbt", "random"):
        mine = [r for r in rows if r["method"] == method]
        steps = [int(r["step"]) for r in mine]
        assert steps == sorted(steps) and all(s % curves.BIN == 0 for s in steps)
        assert len({r["final"] for r in mine}) == 1  # one best member per run
    for row in rows:  # CartPole's games for the plot: the script draws the games it knows
        row["game"] = "Breakout"
    with open(data, "w", newline="") as f:
        writer = csv.DictWriter(f, curves.FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    out = tmp_path / "fig.png"
    curves.plot(data, out)
    assert out.stat().st_size > 10_000


def test_learn_time_reads_a_runs_returns_from_its_events(populations) -> None:
    """What learn_time.py reads of a run (onebox's here; CleanRL's are the same TensorBoard
    tag): every episode's return, in time order."""
    learn_time = script("learn_time")
    times, values = learn_time.returns(populations[1] / "members" / "0")
    assert values.size > 10 and (times[1:] >= times[:-1]).all()
    assert values.min() >= 1 and values.max() <= 500  # CartPole's returns


def test_the_headline_figure_draws_from_the_two_measurements(tmp_path) -> None:
    engine = figures.Bars("e", "env steps/s", ["8 envs", "64 envs"],
                          {"onebox sync": [5e6, 2.4e7], "EnvPool async": [1.3e5, 4.8e5],
                           "Gymnasium SyncVectorEnv": [1.5e5, None]})  # fmt: skip
    learning = figures.Bars("l", "seconds", ["whole run", "to the goal"],
                            {"onebox: PPO": [60.0, 20.0], "CleanRL: PPO": [300.0, 120.0]})  # fmt: skip
    out = script("headline").draw(figures.write(engine, tmp_path / "e.json").with_suffix(".json"),
                                  figures.write(learning, tmp_path / "l.json").with_suffix(".json"),
                                  tmp_path / "headline.png")  # fmt: skip
    assert out.stat().st_size > 10_000
