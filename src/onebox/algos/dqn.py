"""DQN (Mnih et al. 2015) with CleanRL's defaults, on onebox's env pools and replay buffer.

    onebox train dqn --env CartPole-v1
    onebox train dqn --env Pong-v5 --double --dueling --n-step 3 --prioritized

Each env step acts epsilon-greedily on the Q-network (epsilon falling linearly from `start_e` to
`end_e` over the first `exploration_fraction` of the run) and adds the transition to the replay
buffer (`onebox.algos.offpolicy` runs the loop). After `learning_starts` steps, every
`train_frequency` steps one batch regresses Q(s, a) on the target

    y = R + d * Q_target(s', a'),  a' = argmax_a Q_target(s', a)  (double DQN: argmax_a Q(s', a))

where R is the buffer's n-step discounted return and d its discount (gamma^n, 0 if the episode
terminated within the n steps; a truncated one bootstraps from its final observation). The
target network is copied every `target_network_frequency` steps (`tau` 1) or moved towards the
Q-network by Polyak averaging (`tau` < 1). With `--prioritized`, batches are drawn by TD error
and the loss is weighted by the buffer's importance weights. `--dueling` gives the Q-network a
value and an advantage stream.

Presets equal CleanRL's scripts: `classic` (dqn.py: a 120-84 ReLU MLP, 10k buffer, batch 128) and
`atari` (dqn_atari.py: the Nature CNN, 1M buffer of single frames, batch 32); `minatar` is the
MinAtar paper's DQN (the MinAtar CNN, 100k buffer, batch 32, an update every frame). Any field given on
the command line wins over the preset.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from onebox import run
from onebox.algos import offpolicy
from onebox.algos.common import adam, check_positive, greedy_q_policy, resolve_env
from onebox.nn.accel import AccelFields, check_accel
from onebox.nn.networks import Init
from onebox.nn.q_networks import EpsilonGreedy, QNetwork
from onebox.replay import ReplayBatch
from onebox.run.config import TorchConfig
from onebox.run.presets import Presets


@dataclasses.dataclass
class Config(TorchConfig, AccelFields):
    """Train an agent with DQN. Fields left unset come from the env family's preset."""

    preset: Literal["auto", "classic", "atari", "minatar"] = "auto"
    total_steps: int | None = None
    """Env steps to train for (preset: 500k classic, 10M Atari)."""
    num_envs: int = 1
    """Envs stepped in parallel (each vector step adds num_envs transitions)."""
    learning_rate: float | None = None
    """Learning rate (preset: 2.5e-4 classic, 1e-4 Atari)."""
    optimizer: Literal["adam", "rmsprop"] = "adam"
    """adam (as CleanRL), or rmsprop: the MinAtar paper's centered RMSProp, as its code ran it
    (squared-gradient momentum 0.95, minimum squared gradient 0.01, no momentum: the paper lists
    a gradient momentum of 0.95 that its code never passed to the optimizer)."""
    loss: Literal["mse", "huber"] = "mse"
    """The TD errors' loss: mse (squared error, as CleanRL) or huber (squared within 1, linear
    beyond: the DQN papers')."""
    gamma: float = 0.99
    """Discount factor."""
    buffer_size: int | None = None
    """Replay buffer capacity in transitions (preset: 10k classic, 1M Atari)."""
    batch_size: int | None = None
    """Transitions per update (preset: 128 classic, 32 Atari)."""
    learning_starts: int | None = None
    """Env steps before the first update (preset: 10k classic, 80k Atari)."""
    train_frequency: int | None = None
    """Env steps between updates (preset: 10 classic, 4 Atari)."""
    target_network_frequency: int | None = None
    """Env steps between target network updates (preset: 500 classic, 1000 Atari)."""
    tau: float = 1.0
    """Target update rate: 1 copies the Q-network, below 1 is Polyak averaging."""
    start_e: float = 1.0
    """Exploration epsilon at the start."""
    end_e: float | None = None
    """Exploration epsilon at the end of the schedule (preset: 0.05 classic, 0.01 Atari)."""
    exploration_fraction: float | None = None
    """Fraction of total_steps over which epsilon falls from start_e to end_e (preset: 0.5
    classic, 0.1 Atari)."""
    double: bool = False
    """Double DQN: the Q-network picks the next action, the target network values it."""
    dueling: bool = False
    """Dueling Q-network: Q = V + A - mean(A)."""
    n_step: int = 1
    """Steps of the discounted returns in the targets."""
    prioritized: bool = False
    """Prioritized replay (proportional, by TD error), with importance-sampling weights."""
    priority_alpha: float = 0.6
    """Prioritized replay: how much priorities shape sampling (0: uniform)."""
    priority_beta: float = 0.4
    """Prioritized replay: initial importance-sampling exponent, annealed to 1 over the run."""
    max_grad_norm: float | None = None
    """Gradient norm clip (None: no clipping, as CleanRL)."""
    hidden: tuple[int, ...] = (120, 84)
    """Hidden layer widths of the MLP Q-network (vector observations)."""
    init: Init = "torch"
    """The Q-network's initialization: torch (PyTorch's default, as CleanRL's DQN and the MinAtar
    paper's) or orthogonal (gain sqrt(2), zero biases, as PPO's and PQN's)."""
    num_threads: int | None = None
    """Env pool threads (default: physical cores)."""
    save_replay: bool = False
    """Also save the replay buffer with each checkpoint (`replay.npz` in the run folder; Atari's
    1M transitions take about 7.5 GB), so that a resumed run continues with it. Without it a
    resumed run refills the buffer for `learning_starts` steps before it learns again."""


PRESETS = Presets(Config, {
    "classic": dict(total_steps=500_000, learning_rate=2.5e-4, buffer_size=10_000,
                    target_network_frequency=500, batch_size=128, end_e=0.05,
                    exploration_fraction=0.5, learning_starts=10_000, train_frequency=10),
    "atari": dict(total_steps=10_000_000, learning_rate=1e-4, buffer_size=1_000_000,
                  target_network_frequency=1000, batch_size=32, end_e=0.01,
                  exploration_fraction=0.1, learning_starts=80_000, train_frequency=4),
    "minatar": dict(total_steps=5_000_000, learning_rate=2.5e-4, buffer_size=100_000,
                    target_network_frequency=1000, batch_size=32, end_e=0.1,
                    exploration_fraction=0.02, learning_starts=5000, train_frequency=1),
})  # fmt: skip
"""CleanRL's hyperparameters per env family; the fields left None in `Config` come from here.
`minatar` (the MinAtar CNN) is the MinAtar paper's DQN (Young and Tian 2019; the `minatar`
package's examples/dqn.py): 5M frames, replay 100k, batch 32, step size 2.5e-4, a target copy
every 1000 steps, epsilon 1 -> 0.1 over the first 100k frames (0.02 of 5M: with another
--total-steps, set --exploration-fraction to keep 100k), replay start 5000, an update every
frame, gamma 0.99, PyTorch's default initialization. It differs from the paper in the optimizer
(Adam here, centered RMSProp there) and the loss (squared TD error here, Huber there):
`--optimizer rmsprop --loss huber` gives the paper's. The paper played the full action set of 6
(`MinAtar/GAME-v0`; `-v1` is the minimal set)."""


def resolve(config: Config) -> Config:
    """Fill the preset and check every field; raise ValueError before any work starts."""
    config = resolve_env(config, PRESETS, QNetwork.check_spaces)
    check_accel(config, compiles=False)
    check_positive(config, "learning_rate", "target_network_frequency")
    offpolicy.check_replay(config)
    if not 0 < config.tau <= 1:
        raise ValueError(f"--tau must be in (0, 1], got {config.tau}")
    if config.max_grad_norm is not None:
        check_positive(config, "max_grad_norm")
    return config


# ---- the loss -----------------------------------------------------------------------------------


def td_target(
    returns: torch.Tensor,
    discounts: torch.Tensor,
    next_q_target: torch.Tensor,
    next_q_online: torch.Tensor | None = None,
) -> torch.Tensor:
    """y = returns + discounts * Q_target(s', a'), with a' the argmax of `next_q_online` (double
    DQN) or of `next_q_target` (DQN). Q-values are (batch, actions)."""
    choose = next_q_target if next_q_online is None else next_q_online
    best = choose.argmax(-1, keepdim=True)
    return returns + discounts * next_q_target.gather(-1, best).squeeze(-1)


def td_errors(
    q: nn.Module, target: nn.Module, batch: ReplayBatch, double: bool, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Q(s, a) - y for a batch of n-step transitions (y from `td_target`, double DQN if
    `double`), and Q(s, a); gradients flow through Q(s, a) only. Shared with Ape-X."""

    def tensor(x: Any) -> torch.Tensor:
        return torch.as_tensor(x, device=device)

    obs, next_obs = tensor(batch.obs), tensor(batch.next_obs)
    with torch.no_grad():
        next_online = q(next_obs) if double else None
        y = td_target(tensor(batch.returns), tensor(batch.discounts), target(next_obs), next_online)
    q_taken = q(obs).gather(1, tensor(batch.actions).long().unsqueeze(1)).squeeze(1)
    return q_taken - y, q_taken


class Agent:
    """Q-network, target network and optimizer: what a checkpoint restores."""

    def __init__(self, config: Config, envs: Any, device: torch.device) -> None:
        assert config.total_steps is not None and config.exploration_fraction is not None
        self.config, self.device = config, device
        q = QNetwork(envs.single_observation_space, envs.single_action_space, config.hidden,
                     dueling=config.dueling, init=config.init)  # fmt: skip
        duration = config.exploration_fraction * config.total_steps
        self.policy = EpsilonGreedy(q, config.start_e, config.end_e, duration).to(device)
        self.q = self.policy.q
        self.target = copy.deepcopy(self.q).requires_grad_(False)
        lr = config.learning_rate or 0.0
        self.optimizer: torch.optim.Optimizer
        if config.optimizer == "rmsprop":
            self.optimizer = torch.optim.RMSprop(
                self.q.parameters(), lr=lr, alpha=0.95, eps=0.01, centered=True
            )
        else:
            self.optimizer = adam(self.q.parameters(), lr, device)
        self.target_step = 0
        """The env step of the last target network update."""

    def act(self, obs: np.ndarray, step: int) -> np.ndarray:
        """Epsilon-greedy actions; the Q-network runs only if some env acts greedily (one env
        early in the schedule mostly explores, and a forward pass costs more than a step)."""
        n, epsilon = len(obs), self.policy.epsilon
        self.policy.steps += n
        explore = np.random.random(n) < epsilon
        actions = np.random.randint(self.q.num_actions, size=n)
        if explore.all():
            return actions
        with torch.inference_mode():
            greedy = self.q(torch.as_tensor(obs, device=self.device)).argmax(-1).cpu().numpy()
        return np.where(explore, actions, greedy)

    def update(self, batch: ReplayBatch, step: int) -> tuple[dict[str, float], torch.Tensor | None]:
        c = self.config
        td, q_taken = td_errors(self.q, self.target, batch, c.double, self.device)
        per = (
            td.pow(2)
            if c.loss == "mse"
            else F.huber_loss(td, torch.zeros_like(td), reduction="none")
        )
        loss = (self._tensor(batch.weights) * per).mean()
        self.optimizer.zero_grad()
        loss.backward()
        if c.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(self.q.parameters(), c.max_grad_norm)
        self.optimizer.step()
        assert c.target_network_frequency is not None
        if step // c.target_network_frequency > self.target_step // c.target_network_frequency:
            if c.tau == 1:
                self.target.load_state_dict(self.q.state_dict())
            else:
                for target, online in zip(
                    self.target.parameters(), self.q.parameters(), strict=True
                ):
                    target.lerp_(online.detach(), c.tau)
            self.target_step = step
        stats = {"losses/td_loss": loss.item(), "losses/q_values": q_taken.mean().item(),
                 "charts/epsilon": self.policy.epsilon}  # fmt: skip
        return stats, td.detach().abs() if c.prioritized else None

    def _tensor(self, x: Any) -> torch.Tensor:
        return torch.as_tensor(x, device=self.device)

    def state_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.state_dict(), "target": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict(), "target_step": self.target_step}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.target_step = state["target_step"]


# ---- the run ------------------------------------------------------------------------------------


def train(config: Config, resume: Path | None = None) -> Path:
    """Train (or, with `resume`, continue the run in that folder); return the run folder."""
    return offpolicy.run_loop(config, "dqn", resume, resolve=resolve, make_agent=Agent)


def load_policy(run_dir: Path, config: Config, device: str = "cpu") -> Any:
    """The trained policy of a run: a batch of observations -> a batch of greedy actions."""
    with offpolicy.make_envs(config, num_envs=1) as probe:
        agent = Agent(config, probe, torch.device(device))
    agent.load_state_dict(run.load_checkpoint(run_dir)["agent"])
    return greedy_q_policy(agent.q.eval(), device)
