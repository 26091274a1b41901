"""PPO end to end: learning on CartPole and Pendulum, runs that log, checkpoint, resume and
evaluate, determinism, and bad configs rejected before any work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from learning import best_window, metric, refused
from onebox import cli, run
from onebox.algos import ppo
from onebox.nn.networks import ActorCritic
from onebox.sampling import Rollout

CPU = torch.device("cpu")


def train(tmp_path: Path, *args: str) -> Path:
    assert cli.main(["train", "ppo", "--runs-dir", str(tmp_path), "--name", "run", *args]) == 0
    return tmp_path / "run"


def test_cartpole_reaches_475_within_200k_steps(tmp_path: Path) -> None:
    run_dir = train(tmp_path, "--env", "CartPole-v1", "--total-steps", "200000",
                    "--learning-rate", "1e-3", "--seed", "1")  # fmt: skip
    assert best_window(run_dir) >= 475
    assert (run_dir / "curve.png").stat().st_size > 0


@pytest.mark.slow  # 65 s on a 2-core machine
def test_pendulum_reaches_minus_300_within_120k_steps(tmp_path: Path) -> None:
    run_dir = train(tmp_path, "--env", "Pendulum-v1", "--total-steps", "120000", "--num-envs", "4",
                    "--num-steps", "1024", "--gamma", "0.9", "--learning-rate", "1e-3",
                    "--num-minibatches", "64")  # fmt: skip
    assert best_window(run_dir) >= -300


def test_pong_run_logs_checkpoints_and_evaluates(tmp_path: Path) -> None:
    run_dir = train(tmp_path, "--env", "Pong-v5", "--total-steps", "256", "--num-steps", "16",
                    "--sampler", "double")  # fmt: skip
    config = json.loads((run_dir / "config.json").read_text())["config"]
    assert config["preset"] == "atari" and config["clip_coef"] == 0.1 and config["num_envs"] == 8
    for tag in (
        "losses/approx_kl",
        "losses/clipfrac",
        "losses/explained_variance",
        "charts/SPS",
        "charts/learning_rate",
        "time/env",
        "time/inference",
        "time/learn",
    ):
        assert [s for s, _ in metric(run_dir, tag)] == [128, 256], tag  # fmt: skip
    state = run.load_checkpoint(run_dir)
    assert state["global_step"] == 256 and state["trainer"]["updates"] == 2
    assert list(run_dir.glob("events.out.tfevents.*"))


def test_same_seed_gives_identical_first_update(tmp_path: Path) -> None:
    tags = ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl")
    runs = []
    for name in ("a", "b"):
        cli.main(["train", "ppo", "--env", "CartPole-v1", "--total-steps", "512",
                  "--runs-dir", str(tmp_path), "--name", name, "--seed", "7"])  # fmt: skip
        runs.append([metric(tmp_path / name, t) for t in tags])
    assert runs[0] == runs[1]
    cli.main(["train", "ppo", "--env", "CartPole-v1", "--total-steps", "512",
              "--runs-dir", str(tmp_path), "--name", "c", "--seed", "8"])  # fmt: skip
    assert [metric(tmp_path / "c", t) for t in tags] != runs[0]


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "onebox", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


def test_killed_run_resumes_its_counters_and_config(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _spawn("train", "ppo", "--env", "CartPole-v1", "--total-steps", "60000",
                  "--runs-dir", str(tmp_path), "--name", "run", "--checkpoint-minutes", "0.002")  # fmt: skip
    _wait_for(run_dir / "checkpoint.pt", proc)
    time.sleep(1.0)
    proc.kill()  # SIGKILL: no chance to save
    proc.wait()
    config_before = (run_dir / "config.json").read_text()
    saved_step = run.load_checkpoint(run_dir)["global_step"]
    assert 0 < saved_step < 60000
    assert cli.main(["train", "--resume", str(run_dir)]) == 0
    assert (run_dir / "config.json").read_text() == config_before
    state = run.load_checkpoint(run_dir)
    assert state["global_step"] == 59904 and state["trainer"]["updates"] == 117  # 60000 // 512
    steps = [s for s, _ in metric(run_dir, "charts/SPS")]
    assert steps == list(range(512, 59905, 512))  # each iteration logged once, none lost


def test_ctrl_c_saves_a_checkpoint_and_exits(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _spawn("train", "ppo", "--env", "CartPole-v1", "--total-steps", "10000000",
                  "--runs-dir", str(tmp_path), "--name", "run")  # fmt: skip
    _wait_for(run_dir / "metrics.csv", proc)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    state = run.load_checkpoint(run_dir)
    assert state["global_step"] > 0
    assert state["global_step"] == metric(run_dir, "charts/SPS")[-1][0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--total-steps", "-5"], "--total-steps must be positive"),
        (["--num-minibatches", "3"], "does not divide the batch"),
        (["--env", "CartPol-v1"], "Did you mean"),
        (["--env-options", "sutton_barto_rewad", "True"], "no option 'sutton_barto_rewad'"),
        (["--sampler", "double", "--num-envs", "3"], "even --num-envs"),
        (["--env", "FrozenLake-v1"], "needs a Box observation space"),
        (
            ["--device", "cuda:7"] if not torch.cuda.is_available() else ["--device", "tpu"],
            "device",
        ),
    ],
)
def test_bad_config_fails_before_any_work(tmp_path: Path, capsys, args, message) -> None:
    assert message in refused(tmp_path, capsys, "ppo", *args)


def test_update_losses_match_hand_computed_values() -> None:
    """One epoch of one minibatch: the ratio is 1, so the policy loss is -mean(normalized
    advantages) = 0, and the value loss is 0.5 * mean((V - returns)^2) (clipping inactive)."""
    from gymnasium import spaces

    torch.manual_seed(0)
    net = ActorCritic(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2))
    obs = torch.randn(4, 2, 3)
    with torch.no_grad():
        dist, values = net.dist(obs.flatten(0, 1))
        actions = dist.sample()
        logprobs = net.log_prob(dist, actions)
        entropy = net.entropy(dist).mean().item()
    no = torch.zeros(4, 2, dtype=torch.bool)
    rollout = Rollout(
        obs=obs, actions=actions.view(4, 2), rewards=torch.ones(4, 2), terminated=no, truncated=no,
        outputs={"logprobs": logprobs.view(4, 2), "values": values.view(4, 2)},
        final={"values": torch.zeros(4, 2)}, next_obs=torch.zeros(2, 3),
        next={"values": torch.zeros(2)},
    )  # fmt: skip
    config = ppo.Config(num_envs=2, num_steps=4, num_minibatches=1, update_epochs=1,
                        learning_rate=1e-3, clip_coef=0.2, ent_coef=0.01, total_steps=8)  # fmt: skip
    learner = ppo.PPO(config, spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2), CPU)
    learner.net.load_state_dict(net.state_dict())
    stats = learner.update(rollout)
    # GAE by hand with next_value 0, gamma 0.99, lambda 0.95:
    v = values.view(4, 2).numpy()
    adv = np.zeros((4, 2))
    last = np.zeros(2)
    for t in reversed(range(4)):
        nv = v[t + 1] if t < 3 else 0.0
        last = 1.0 + 0.99 * nv - v[t] + 0.99 * 0.95 * last
        adv[t] = last
    returns = adv + v
    assert stats["losses/policy_loss"] == pytest.approx(0.0, abs=1e-6)
    assert stats["losses/value_loss"] == pytest.approx(0.5 * np.mean((v - returns) ** 2), rel=1e-5)
    assert stats["losses/entropy"] == pytest.approx(entropy, rel=1e-6)
    assert stats["losses/approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert stats["losses/clipfrac"] == 0.0


def test_double_sampler_trains_cartpole(tmp_path: Path) -> None:
    run_dir = train(tmp_path, "--env", "CartPole-v1", "--total-steps", "100000", "--num-envs",
                    "8", "--sampler", "double", "--learning-rate", "1e-3")  # fmt: skip
    assert best_window(run_dir) >= 200  # learning, through the async path


def test_resume_requires_a_run_folder(tmp_path: Path, capsys) -> None:
    assert cli.main(["train", "--resume", str(tmp_path)]) == 2
    assert "not a onebox run folder" in capsys.readouterr().err
    os.makedirs(tmp_path / "x")
    assert cli.main(["eval", str(tmp_path / "x")]) == 2


def test_bench_train_measures_both_samplers(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench.md"
    argv = ["bench", "train", "--env", "CartPole-v1", "--iterations", "1", "--output", str(out)]
    assert cli.main(argv) == 0
    text = out.read_text()
    assert "<!-- bench:train:CartPole-v1 -->" in text
    assert "| sync |" in text and "| double |" in text and "| appo |" in text
    assert cli.main(["bench", "train", "--iterations", "0"]) == 2


def test_target_kl_stops_the_epochs_early() -> None:
    from gymnasium import spaces

    torch.manual_seed(0)
    net = ActorCritic(spaces.Box(-1, 1, (3,), np.float32), spaces.Box(-1, 1, (2,), np.float32))
    obs = torch.randn(8, 2, 3)
    with torch.no_grad():
        dist, values = net.dist(obs.flatten(0, 1))
        actions = dist.sample()
        logprobs = net.log_prob(dist, actions)
    no = torch.zeros(8, 2, dtype=torch.bool)
    rollout = Rollout(
        obs=obs, actions=actions.view(8, 2, 2), rewards=torch.randn(8, 2), terminated=no,
        truncated=no, outputs={"logprobs": logprobs.view(8, 2), "values": values.view(8, 2)},
        final={"values": torch.zeros(8, 2)}, next_obs=torch.zeros(2, 3),
        next={"values": torch.zeros(2)},
    )  # fmt: skip

    def optimizer_steps(target_kl: float | None) -> int:
        config = ppo.Config(num_envs=2, num_steps=8, num_minibatches=2, update_epochs=4,
                            learning_rate=1e-2, clip_coef=0.2, ent_coef=0.0, total_steps=16,
                            target_kl=target_kl)  # fmt: skip
        learner = ppo.PPO(config, spaces.Box(-1, 1, (3,), np.float32),
                          spaces.Box(-1, 1, (2,), np.float32), CPU)  # fmt: skip
        learner.net.load_state_dict(net.state_dict())
        learner.update(rollout)
        return int(learner.optimizer.state[next(iter(learner.net.parameters()))]["step"])

    assert optimizer_steps(None) == 8  # 4 epochs x 2 minibatches
    assert optimizer_steps(1e-12) == 2  # the KL after the first epoch is above any tiny target
