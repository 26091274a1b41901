"""onebox.run.session, .config and .presets: one run's plumbing around a toy loop, the shared
config fields, and presets checked against each learner's config."""

from __future__ import annotations

import csv
import dataclasses
import importlib
import os
import signal
from pathlib import Path
from typing import Literal

import pytest
import torch

from onebox import run
from onebox.run.config import RunConfig, TorchConfig, TrainConfig
from onebox.run.presets import Presets
from onebox.run.session import RunSession

LEARNERS = ("ppo", "a2c", "a3c", "dqn", "pqn", "sac", "impala", "appo", "apex")


@dataclasses.dataclass
class ToyConfig(RunConfig):
    total_steps: int = 10


def toy_run(session: RunSession, stop_at: int | None = None, fail_at: int | None = None) -> dict:
    """A loop of one step per iteration whose state is a counter and a random draw per step;
    SIGINT at step `stop_at`, an exception at `fail_at`. Returns its final state."""
    state = {"count": 0, "draws": []}
    if session.checkpoint is not None:
        state = {"count": session.checkpoint["count"], "draws": session.checkpoint["draws"]}
    config = session.config
    with session.start(lambda: dict(state), total=config.total_steps):
        while session.step < config.total_steps and not session.stopping:
            step = session.step + 1
            state["count"] += 1
            state["draws"] = [*state["draws"], float(torch.rand(()))]
            session.episodes(step, [float(step)], [1])
            session.log(step, {"losses/x": step, **session.rates(step)})
            session.update(step)
            if step == stop_at:
                os.kill(os.getpid(), signal.SIGINT)
            if step == fail_at:
                raise RuntimeError("boom")
    return state


def rows(run_dir: Path, tag: str) -> list[float]:
    with open(run_dir / "metrics.csv") as f:
        return [float(r["step"]) for r in csv.DictReader(f) if r["tag"] == tag]


def test_a_stopped_run_resumes_where_it_stopped(tmp_path: Path) -> None:
    config = ToyConfig(runs_dir=str(tmp_path), name="toy", progress=False, seed=3)
    torch.manual_seed(0)
    straight = toy_run(RunSession(config, "toy"))

    config = dataclasses.replace(config, name="stopped")
    torch.manual_seed(0)
    stopped = toy_run(RunSession(config, "toy"), stop_at=4)
    run_dir = tmp_path / "stopped"
    saved = run.load_checkpoint(run_dir)
    assert (saved["global_step"], saved["count"], stopped["count"]) == (4, 4, 4)
    assert (run_dir / "curve.png").exists()  # a stopped run ends normally: plots drawn

    torch.manual_seed(123)  # the checkpoint's generator state wins over the current one
    opened = RunSession.open(run.load_config(run_dir, ToyConfig), run_dir, "toy",
                             lambda c: c, keys=("count",))  # fmt: skip
    assert opened.step == 4 and opened.checkpoint is not None and opened.elapsed > 0
    resumed = toy_run(opened)
    assert resumed == straight  # same draws: the RNG state came back with the counters
    assert run.load_checkpoint(run_dir)["global_step"] == 10
    assert rows(run_dir, "losses/x") == list(range(1, 11))  # each step logged once


def test_an_exception_keeps_the_last_checkpoint(tmp_path: Path) -> None:
    config = ToyConfig(runs_dir=str(tmp_path), name="fails", progress=False)
    session = RunSession(config, "toy")
    with pytest.raises(RuntimeError, match="boom"):
        toy_run(session, fail_at=3)
    assert not (session.run_dir / "checkpoint.pt").exists()  # no final save of a failed run
    assert rows(session.run_dir, "losses/x") == [1, 2, 3]  # its logs were closed, kept


def test_open_checks_before_anything_is_written(tmp_path: Path) -> None:
    def resolve(config: ToyConfig) -> ToyConfig:
        if config.total_steps < 1:
            raise ValueError("--total-steps must be positive")
        return config

    bad = ToyConfig(runs_dir=str(tmp_path / "runs"), total_steps=0)
    with pytest.raises(ValueError, match="total-steps"):
        RunSession.open(bad, None, "toy", resolve)
    session = RunSession.open(dataclasses.replace(bad, total_steps=2), None, "toy", resolve)
    assert not (tmp_path / "runs").exists()  # the folder comes with start()
    with pytest.raises(RuntimeError, match="start"):
        session.run_dir  # noqa: B018
    toy_run(session)
    assert run.load_config(session.run_dir, ToyConfig).total_steps == 2
    with pytest.raises(ValueError, match="lacks 'agent'"):  # another learner's checkpoint
        RunSession.open(bad, session.run_dir, "toy", lambda c: c, keys=("agent",))


# ---- the shared fields --------------------------------------------------------------------------


@pytest.mark.parametrize("name", LEARNERS)
def test_every_learner_config_has_the_shared_fields(name: str) -> None:
    cls = importlib.import_module(f"onebox.algos.{name}").Config
    assert issubclass(cls, TorchConfig if name != "a3c" else TrainConfig)
    declared = set(vars(cls).get("__annotations__", {}))  # the fields the learner declares
    shared = {f.name for f in dataclasses.fields(TorchConfig)}
    # narrowed or another default (annealing: on for PPO, PQN, IMPALA, APPO, A3C)
    assert declared & shared <= {"preset", "env", "anneal_lr"}


# ---- typed presets ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LEARNERS)
def test_a_misspelt_preset_key_or_a_wrong_type_is_an_error(name: str) -> None:
    module = importlib.import_module(f"onebox.algos.{name}")
    assert isinstance(module.PRESETS, Presets) and module.PRESETS.cls is module.Config
    family = next(iter(module.PRESETS))
    with pytest.raises(TypeError, match=rf"{name} preset '{family}'.*'total_step'.*total_steps"):
        Presets(module.Config, {family: {"total_step": 1000}})
    with pytest.raises(TypeError, match=rf"{name} preset '{family}': total_steps='1000'"):
        Presets(module.Config, {family: {"total_steps": "1000"}})
    with pytest.raises(TypeError, match="cannot set the field 'gamma'"):  # not left to presets
        Presets(module.Config, {family: {"gamma": 0.9}})
    with pytest.raises(ValueError, match="no 'nope' preset"):
        module.PRESETS.of("nope")


def test_a_preset_fills_only_what_was_left_unset() -> None:
    @dataclasses.dataclass
    class Config(RunConfig):
        preset: Literal["auto", "small"] = "auto"
        lr: float | None = None
        hidden: tuple[int, ...] | None = None
        steps: int | None = None

    presets = Presets(Config, {"small": {"lr": 1, "hidden": [4, 4], "steps": 10}})
    assert dict(presets["small"]) == {"lr": 1.0, "hidden": (4, 4), "steps": 10}
    filled = presets.fill(Config(steps=3), "small")
    assert (filled.preset, filled.lr, filled.hidden, filled.steps) == ("small", 1.0, (4, 4), 3)
    with pytest.raises(TypeError, match=r"steps=2\.5 matches none of int"):
        Presets(Config, {"small": {"steps": 2.5}})
