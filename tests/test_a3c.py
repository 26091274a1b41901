"""A3C end to end: Hogwild workers learn CartPole through a shared model and a shared optimizer;
a worker killed mid-run is restarted and training continues; runs resume and evaluate; bad
configs are rejected before any work."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from learning import best_window, metric, refused
from onebox import cli, run


def train(tmp_path: Path, *args: str) -> Path:
    assert cli.main(["train", "a3c", "--runs-dir", str(tmp_path), "--name", "run", *args]) == 0
    return tmp_path / "run"


def optimizer_updates(run_dir: Path) -> float:
    """RMSprop's step count in the checkpoint: every worker's updates, if its state is shared."""
    state = run.load_checkpoint(run_dir)["trainer"]["learner"]["optimizer"]["state"]
    return float(state[0]["step"])


def test_cartpole_learns_with_a_shared_optimizer(tmp_path: Path) -> None:
    run_dir = train(tmp_path, "--env", "CartPole-v1", "--total-steps", "150000", "--actors", "2")
    assert best_window(run_dir) >= 200
    step = run.load_checkpoint(run_dir)["global_step"]
    assert step >= 150000
    # 40 steps per update (8 envs x 5 steps); Hogwild increments may rarely collide.
    assert optimizer_updates(run_dir) >= 0.9 * step / 40


@pytest.mark.slow
def test_default_cartpole_run_finishes_solved(tmp_path: Path) -> None:
    """The classic preset's whole default run (500k steps, learning rate annealed to 0) ends
    solved: the last 20 episodes average at least 475 (500 for seeds 1-4 when measured)."""
    run_dir = train(tmp_path, "--env", "CartPole-v1", "--seed", "3")
    returns = [v for _, v in metric(run_dir, "charts/episodic_return")]
    assert np.mean(returns[-20:]) >= 475
    assert run.load_config(run_dir).preset == "classic"


def test_killed_worker_is_restarted_and_training_continues(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    killed: list[int] = []

    def kill_one_worker() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait for the first episodes: workers are running
            if (run_dir / "metrics.csv").exists() and metric(run_dir, "charts/episodic_return"):
                break
            time.sleep(0.05)
        children = multiprocessing.active_children()
        if children:
            os.kill(children[0].pid, signal.SIGKILL)
            killed.append(children[0].pid)

    killer = threading.Thread(target=kill_one_worker)
    killer.start()
    # Losses every 400 env steps and a checkpoint at least every ~0.1 s show the whole run.
    train(tmp_path, "--env", "CartPole-v1", "--total-steps", "60000", "--actors", "2",
          "--log-every", "400", "--checkpoint-minutes", "0.002")  # fmt: skip
    killer.join()
    assert killed, "no worker was running"
    restarts = metric(run_dir, "charts/actor_restarts")
    assert restarts[-1][1] == 1
    assert run.load_checkpoint(run_dir)["global_step"] >= 60000
    first_restart = next(step for step, value in restarts if value == 1)
    # Both the restarted worker and the survivor kept learning after the kill.
    late = [step for step, _ in metric(run_dir, "losses/value_loss") if step > first_restart]
    assert late and max(late) >= 50000
    assert not multiprocessing.active_children()  # every worker stopped


def test_a_worker_dying_past_max_restarts_fails_the_run(tmp_path: Path) -> None:
    def kill_one_worker() -> None:
        deadline = time.monotonic() + 60
        while not multiprocessing.active_children() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        children = multiprocessing.active_children()
        if children:
            os.kill(children[0].pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_one_worker)
    killer.start()
    with pytest.raises(RuntimeError, match="--max-restarts"):
        cli.main(["train", "a3c", "--runs-dir", str(tmp_path), "--name", "run", "--env",
                  "CartPole-v1", "--total-steps", "100000000", "--max-restarts", "0"])  # fmt: skip
    killer.join()
    assert not multiprocessing.active_children()  # the other worker was stopped too


def test_resume_continues_from_the_checkpoint_and_evaluates(tmp_path: Path, capsys) -> None:
    run_dir = train(tmp_path, "--env", "CartPole-v1", "--total-steps", "4000")
    before = run.load_checkpoint(run_dir)
    assert before["global_step"] >= 4000
    cfg = run.load_config(run_dir)
    run.save_config(run_dir, dataclasses.replace(cfg, total_steps=8000))
    assert cli.main(["train", "--resume", str(run_dir)]) == 0
    after = run.load_checkpoint(run_dir)
    # Fresh env seeds for every start: 2 actors of 8 envs, twice.
    assert after["global_step"] >= 8000 and after["env_seeds"] == 2 * 8 * 2
    # The optimizer state was restored and kept counting from where it was.
    assert optimizer_updates(run_dir) > float(
        before["trainer"]["learner"]["optimizer"]["state"][0]["step"]
    )
    capsys.readouterr()
    assert cli.main(["eval", str(run_dir), "--episodes", "2"]) == 0
    assert "2 episodes" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--actors", "0"], "--actors must be positive"),
        (["--env", "CartPol-v1"], "Did you mean"),
        (["--rms-alpha", "1"], "--rms-alpha"),
        (["--gamma", "1.5"], "--gamma"),
        (["--ent-coef", "-1"], "--ent-coef must be >= 0"),
    ],
)
def test_bad_config_fails_before_any_work(tmp_path: Path, capsys, args, message) -> None:
    assert message in refused(tmp_path, capsys, "a3c", *args)
