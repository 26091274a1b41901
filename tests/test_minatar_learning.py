"""Learners on MinAtar: the MinAtar paper's CNN (in the learners' nets and the population nets), the
`minatar` presets picked for `MinAtar/*` ids, and PPO learning Breakout.

The learning test's threshold comes from measured runs: PPO's `minatar` preset for 300k steps
(294,912: 36 iterations of 64 x 128) on MinAtar/Breakout-v1 ended, as the mean of the last 20
training episodes, at 8.70, 8.40, 9.25 and 8.00 for seeds 1 to 4 (at 100k steps: 3.5-4.2), where a
uniform random policy scores 0.41 +- 0.04 (208 episodes, docs/results.md). The test asks for 4.0:
half the worst seed, ten times random.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import onebox.envs
from learning import last_mean, metric
from onebox import cli
from onebox.algos import a2c, appo, dqn, impala, ppo, pqn
from onebox.evo import run as evo_run
from onebox.nn.networks import ActorCritic, MinAtarCNN
from onebox.nn.population import PopulationNet, default_arch
from onebox.nn.q_networks import QNetwork

BREAKOUT = "MinAtar/Breakout-v1"


def spaces(env_id: str = BREAKOUT):
    with onebox.envs.make(env_id, num_envs=1, num_threads=1) as envs:
        return envs.single_observation_space, envs.single_action_space


def grids(n: int, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).random((n, *shape)) < 0.3)


def test_minatar_cnn_is_the_papers_network_on_channels_first_floats() -> None:
    net = MinAtarCNN((10, 10, 4))
    conv = net.conv[0]
    assert conv.weight.shape == (16, 4, 3, 3) and conv.stride == (1, 1)
    assert net.fc[0].weight.shape == (128, 16 * 8 * 8) and net.out_features == 128
    x = grids(5, (10, 10, 4))
    # by hand: the grid as float channels (C, H, W), unscaled, conv + ReLU, fc + ReLU
    chw = torch.from_numpy(np.transpose(x.numpy(), (0, 3, 1, 2)).astype(np.float32))
    hidden = F.relu(F.conv2d(chw, conv.weight, conv.bias)).flatten(1)
    expected = F.relu(hidden @ net.fc[0].weight.T + net.fc[0].bias)
    torch.testing.assert_close(net(x), expected)


@pytest.mark.parametrize("game", ["Breakout", "Freeway", "Seaquest"])
def test_learners_nets_take_minatar_grids(game: str) -> None:
    obs_space, act_space = spaces(f"MinAtar/{game}-v1")
    x = grids(3, obs_space.shape)
    ac = ActorCritic(obs_space, act_space)
    assert isinstance(ac.torso, MinAtarCNN)
    dist, value = ac.dist(x)
    assert dist.logits.shape == (3, act_space.n) and value.shape == (3,)
    q = QNetwork(obs_space, act_space)
    assert isinstance(q.trunk, MinAtarCNN) and q(x).shape == (3, act_space.n)
    ln = QNetwork(obs_space, act_space, layer_norm=True)  # PQN's: layer norm before each ReLU
    assert sum(isinstance(m, torch.nn.LayerNorm) for m in ln.trunk.modules()) == 2
    assert ln(x).shape == (3, act_space.n)


def test_population_minatar_net_equals_the_learners_cnn() -> None:
    obs_space, act_space = spaces()
    assert default_arch(obs_space) == "minatar"
    pop = PopulationNet("minatar", obs_space, act_space, 3)
    flat = torch.stack([pop.init_params(s) for s in (1, 2, 3)])
    flat += 0.1 * torch.randn(flat.shape, generator=torch.Generator().manual_seed(0))
    pop.set_slots(slice(0, 3), flat)
    x = grids(3, obs_space.shape)
    out = pop.forward(x, slice(0, 3))
    for k in range(3):  # individual k as a MinAtarCNN and a linear head, same parameters
        cnn, head = MinAtarCNN(obs_space.shape), torch.nn.Linear(128, act_space.n)
        w_conv, b_conv, w_fc, b_fc, w_out, b_out = (
            t[k] for pair in zip(pop.weights, pop.biases, strict=True) for t in pair
        )
        with torch.no_grad():
            cnn.conv[0].weight.copy_(w_conv), cnn.conv[0].bias.copy_(b_conv)
            cnn.fc[0].weight.copy_(w_fc.T), cnn.fc[0].bias.copy_(b_fc)
            head.weight.copy_(w_out.T), head.bias.copy_(b_out)
            torch.testing.assert_close(out[k], head(cnn(x[k : k + 1]))[0])
    assert pop.num_params == 16 * 4 * 9 + 16 + 1024 * 128 + 128 + 128 * 3 + 3


def test_minatar_presets_are_picked_for_minatar_ids() -> None:
    cfg = ppo.resolve(ppo.Config(env=BREAKOUT))
    assert cfg.preset == "minatar"
    assert (cfg.num_envs, cfg.num_steps, cfg.learning_rate, cfg.num_minibatches) == (
        64, 128, 5e-3, 8,
    )  # fmt: skip
    cfg = dqn.resolve(dqn.Config(env=BREAKOUT))
    assert cfg.preset == "minatar"
    assert (cfg.buffer_size, cfg.batch_size, cfg.target_network_frequency, cfg.end_e) == (
        100_000, 32, 1000, 0.1,
    )  # fmt: skip
    assert cfg.exploration_fraction * cfg.total_steps == 100_000 and cfg.learning_starts == 5000
    cfg = pqn.resolve(pqn.Config(env=BREAKOUT))
    assert cfg.preset == "minatar"
    assert (cfg.num_envs, cfg.num_steps, cfg.num_minibatches, cfg.update_epochs) == (128, 32, 32, 2)
    assert (cfg.learning_rate, cfg.end_e, cfg.exploration_fraction) == (5e-4, 0.05, 0.1)
    cfg = appo.resolve(appo.Config(env=BREAKOUT))
    assert cfg.preset == "minatar" and cfg.batch_size == 32 * 4 * 16
    assert (cfg.learning_rate, cfg.ent_coef) == (5e-3, 1e-4)
    assert appo.resolve(appo.Config(env="CartPole-v1")).ent_coef == 0.01
    with pytest.raises(ValueError, match="--ent-coef must be >= 0"):
        appo.resolve(appo.Config(env=BREAKOUT, ent_coef=-0.1))
    for cls in (evo_run.GAConfig, evo_run.ESConfig, evo_run.RSConfig):
        config = evo_run.resolve(cls(env=BREAKOUT))
        assert config.preset == "minatar" and not getattr(config, "obs_norm", False), cls
    # a learner without a MinAtar preset says so, and which presets it has
    for resolve, config in ((a2c.resolve, a2c.Config), (impala.resolve, impala.Config)):
        with pytest.raises(ValueError, match=r"no 'minatar' preset for (a2c|impala) .*--preset"):
            resolve(config(env=BREAKOUT))


def test_ppo_learns_breakout(tmp_path: Path) -> None:
    """PPO's minatar preset, 300k steps (24 s here on two shared cores)."""
    args = ["train", "ppo", "--env", BREAKOUT, "--total-steps", "300000", "--seed", "1",
            "--num-threads", "1", "--runs-dir", str(tmp_path), "--name", "run"]  # fmt: skip
    assert cli.main(args) == 0
    assert last_mean(tmp_path / "run") >= 4.0


def test_ga_evolves_the_minatar_cnn(tmp_path: Path) -> None:
    """One small generation end to end: the evaluator plays the population's MinAtar CNNs."""
    args = ["evolve", "ga", "--env", BREAKOUT, "--generations", "2", "--population", "8",
            "--truncation", "2", "--elite-candidates", "2", "--elite-episodes", "2",
            "--runs-dir", str(tmp_path), "--name", "run"]  # fmt: skip
    assert cli.main(args) == 0
    best = [v for _, v in metric(tmp_path / "run", "fitness/best")]
    assert len(best) == 2 and all(b >= 0 for b in best)
