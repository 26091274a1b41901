"""Ape-X: per-actor epsilons reach the served policy, learning CartPole with 4 actors (slow), a
short run's folder, checkpoint (weights-only), eval and resume, process actors served centrally
or running their own copies, a killed actor process restarted (its copy of the network
reattached to the learner's shared weights), and bad configs rejected."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

import onebox.envs
from learning import descendants, kill_and_resume, last_mean, metric, refused
from onebox import cli, run
from onebox.algos import apex, driver
from onebox.algos.launch import play
from onebox.sampling.inference import InferenceServer


def test_actor_epsilons_are_ape_xs() -> None:
    eps = apex.actor_epsilons(4)
    np.testing.assert_allclose(eps, [0.4, 0.4 ** (1 + 7 / 3), 0.4 ** (1 + 14 / 3), 0.4**8])
    assert apex.actor_epsilons(1).tolist() == [0.4]


def test_each_actor_explores_with_its_own_epsilon_through_the_server() -> None:
    obs_space, act_space = spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2)
    config = apex.resolve(apex.Config(actors=3, eps_base=0.5, eps_alpha=2.0, learning_rate=1e-3,
                                      seed=0, device="cpu"))  # fmt: skip
    learner = apex.ApeX(config, obs_space, act_space, torch.device("cpu"))
    for p in learner.net.parameters():
        p.data.zero_()
    learner.net.head.bias.data = torch.tensor([1.0, 0.0])  # advantages: greedy action 0
    # Epsilons 0.5, 0.25, 0.125: an actor takes action 1 with probability epsilon / 2.
    n = 4000
    with InferenceServer(learner.policy, obs_space, act_space, max_batch=3 * n, timeout_ms=50,
                         outputs=learner.outputs) as server:  # fmt: skip
        pending = [server.submit(a, np.arange(n), np.zeros((n, 3), np.float32)) for a in range(3)]
        results = [p.wait(timeout=60) for p in pending]
    for eps, result in zip([0.5, 0.25, 0.125], results, strict=True):
        rate = result.actions.mean()
        assert abs(rate - eps / 2) < 5 * np.sqrt(eps / 2 * (1 - eps / 2) / n), (eps, rate)
        np.testing.assert_allclose(result.q, np.tile([0.5, -0.5], (n, 1)), atol=1e-6)


@pytest.mark.parametrize("save_replay", [False, True])
def test_short_run_folder_checkpoint_eval_and_resume(
    tmp_path: Path, capsys, save_replay: bool
) -> None:
    args = ["train", "apex", "--env", "CartPole-v1", "--total-steps", "6000",
            "--learning-starts", "1000", *(["--save-replay"] if save_replay else [])]  # fmt: skip
    run_dir, saved_step = kill_and_resume(tmp_path, *args)
    assert 0 < saved_step < 6000
    # With --save-replay the resumed run goes on with its table; without, it says it refills.
    assert (run_dir / "replay.npz").exists() == save_replay
    log = (run_dir / "log.txt").read_text()
    assert "actors are rate-limited (--samples-per-insert 16)" in log  # the classic preset's
    assert ("refills" in log) != save_replay
    for name in ("config.json", "metrics.csv", "checkpoint.pt"):
        assert (run_dir / name).exists(), name
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert state["global_step"] >= 6000 and state["trainer"]["updates"] > 0
    assert set(state) >= {"trainer", "env_seeds", "global_step", "rng"}
    assert set(state["trainer"]["learner"]) >= {"net", "target", "optimizer", "updates"}
    # The resumed run logs on from where its checkpoint was, never before it.
    losses = [s for s, _ in metric(run_dir, "losses/td_loss")]
    assert losses == sorted(losses) and metric(run_dir, "charts/episodic_return")
    capsys.readouterr()
    assert cli.main(["eval", str(run_dir), "--episodes", "2"]) == 0
    assert "2 episodes" in capsys.readouterr().out


@pytest.mark.parametrize("inference", ["central", "local"])
def test_process_actors_feed_the_replay_table(tmp_path: Path, inference: str) -> None:
    args = ["train", "apex", "--env", "CartPole-v1", "--total-steps", "4000", "--learning-starts",
            "1000", "--process-actors", "--inference", inference, "--runs-dir", str(tmp_path),
            "--name", "run"]  # fmt: skip
    assert cli.main(args) == 0
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert state["global_step"] >= 4000 and state["trainer"]["updates"] > 0
    assert metric(tmp_path / "run", "charts/episodic_return")
    assert "4 actors (processes), " in (tmp_path / "run" / "log.txt").read_text()
    assert f"(--inference {inference})" in (tmp_path / "run" / "log.txt").read_text()


def test_killed_actor_process_is_restarted_and_the_run_finishes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "onebox", "train", "apex", "--env", "CartPole-v1",
         "--total-steps", "30000", "--learning-starts", "1000", "--batch-size", "32",
         "--samples-per-insert", "2", "--process-actors", "--inference", "local",
         "--actors", "2", "--runs-dir",
         str(tmp_path), "--name", "run"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        # The actors are the forkserver's children: the run's descendants two levels down.
        # A run this short may finish within seconds of their start, so one is killed as soon
        # as both are up.
        actors: list[int] = []
        while len(actors) < 2:
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline
            time.sleep(0.05)
            actors = [p for p, d in descendants(proc.pid).items() if d == 2]
        os.kill(actors[0], signal.SIGKILL)
        out = proc.communicate(timeout=180)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert metric(run_dir, "charts/actor_restarts")[-1][1] == 1
    assert run.load_checkpoint(run_dir)["global_step"] >= 30000


@pytest.mark.slow
def test_four_actors_learn_cartpole(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = ["train", "apex", "--env", "CartPole-v1", "--actors", "4", "--runs-dir", str(tmp_path),
            "--name", "run"]  # fmt: skip
    assert cli.main(args) == 0
    # The last 20 training episodes, every actor's (actor 0's exploring with epsilon 0.1), and
    # the greedy policy.
    assert last_mean(run_dir, 20) >= 475
    config = run.load_config(run_dir)
    with onebox.envs.make("CartPole-v1", 1, autoreset_mode="SameStep") as envs:
        returns, _, _ = play(driver.load_policy(run_dir, config), envs, 20, seed=12345)
    assert np.mean(returns) >= 475


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "Pendulum-v1"], "Q-learning needs Discrete actions"),
        (["--actors", "0"], "--actors must be positive"),
        (["--actors", "-2"], "--actors must be positive"),
        (["--envs-per-actor", "0"], "--envs-per-actor must be positive"),
        (["--unroll", "2"], "must be at least --n-step"),
        (["--learning-starts", "200000"], "--learning-starts must be in"),
        (["--samples-per-insert", "-1"], "--samples-per-insert must be >= 0"),
        (["--eps-base", "0"], "--eps-base must be positive"),
        (["--eps-base", "1.5"], "--eps-base must be in (0, 1]"),
    ],
)
def test_bad_config_fails_before_any_work(tmp_path: Path, capsys, args, message) -> None:
    assert message in refused(tmp_path, capsys, "apex", *args)


def test_the_actors_share_the_cores_and_atari_on_a_cpu_takes_them_for_torch() -> None:
    cores = onebox.envs.physical_cores()
    c = apex.resolve(apex.Config(env="Pong-v5", device="cpu"))
    assert c.actors == 8 and c.num_threads == max(1, cores // 8)
    assert c.torch_threads == cores
    c = apex.resolve(apex.Config(env="CartPole-v1", actors=1, device="cpu"))
    assert c.num_threads == cores and c.torch_threads == 1
    c = apex.resolve(apex.Config(env="Pong-v5", num_threads=3, torch_threads=2, device="cpu"))
    assert (c.num_threads, c.torch_threads) == (3, 2)  # given ones are kept
