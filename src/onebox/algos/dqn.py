"""DQN (Mnih et al. 2015) with CleanRL's defaults: the Q-learning learner, which Ape-X shares,
fed by one inline actor and a replay buffer.

    onebox train dqn --env CartPole-v1
    onebox train dqn --env Pong-v5 --double --dueling --n-step 3 --prioritized

Each env step acts epsilon-greedily on the Q-network (epsilon falling linearly from `start_e` to
`end_e` over the first `exploration_fraction` of the run) and adds the transition to the replay
buffer (`onebox.algos.offpolicy.ReplayTrainer`). After `learning_starts` steps, every
`train_frequency` steps one batch regresses Q(s, a) on the target

    y = R + d * Q_target(s', a'),  a' = argmax_a Q_target(s', a)  (double DQN: argmax_a Q(s', a))

where R is the buffer's n-step discounted return and d its discount (gamma^n, 0 if the episode
terminated within the n steps; a truncated one bootstraps from its final observation). The
target network is copied every `target_network_frequency` env steps (`tau` 1; counted in
updates, `target_network_frequency / train_frequency` of them) or moved towards the Q-network
by Polyak averaging (`tau` < 1). With `--prioritized`, batches are drawn by TD error, the loss is
weighted by the buffer's importance weights, and the update writes the new |TD errors| back.
`--dueling` gives the Q-network a value and an advantage stream.

`QLearner` is the algorithm: Ape-X (`onebox.algos.apex`) is the same learner with many actors
in place of the inline one, each exploring with its own epsilon, feeding a prioritized table;
R2D2 builds its recurrent learner on the same optimizer step and target network.

Presets equal CleanRL's scripts: `classic` (dqn.py: a 120-84 ReLU MLP, 10k buffer, batch 128) and
`atari` (dqn_atari.py: the Nature CNN, 1M buffer of single frames, batch 32); `minatar` is the
MinAtar paper's DQN (the MinAtar CNN, 100k buffer, batch 32, an update every frame). Any field given on
the command line wins over the preset.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from onebox.algos import offpolicy
from onebox.algos.common import adam, check_positive, fill_log_every, greedy_q_policy, resolve_env
from onebox.algos.trainer import (
    GRAD_CLIP,
    LEARNING_RATE,
    POSITIVE,
    RATE,
    Learner,
    ranges,
    tunables,
)
from onebox.nn.accel import Accel, AccelFields, check_accel
from onebox.nn.networks import Init
from onebox.nn.q_networks import EpsilonGreedy, QNetwork
from onebox.replay import ReplayBatch
from onebox.run.config import TorchConfig
from onebox.run.presets import Presets


@dataclasses.dataclass
class QLearningFields:
    """The Q-learning learner's own fields, DQN's and Ape-X's (each learner's config adds those
    its presets fill: learning rate, replay size, batch, learning starts, gradient clip)."""

    optimizer: Literal["adam", "rmsprop"] = "adam"
    """adam (as CleanRL), or rmsprop: the MinAtar paper's centered RMSProp, as its code ran it
    (squared-gradient momentum 0.95, minimum squared gradient 0.01, no momentum: the paper lists
    a gradient momentum of 0.95 that its code never passed to the optimizer)."""
    loss: Literal["mse", "huber"] = "mse"
    """The TD errors' loss: mse (squared error, as CleanRL) or huber (squared within 1, linear
    beyond: the DQN papers')."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 1.0
    """Target update rate: 1 copies the Q-network, below 1 is Polyak averaging."""
    double: bool = False
    """Double DQN: the Q-network picks the next action, the target network values it."""
    dueling: bool = False
    """Dueling Q-network: Q = V + A - mean(A)."""
    n_step: int = 1
    """Steps of the discounted returns in the targets."""
    priority_alpha: float = 0.6
    """Prioritized replay: how much priorities shape sampling (0: uniform)."""
    priority_beta: float = 0.4
    """Prioritized replay: initial importance-sampling exponent, annealed to 1 over the run."""
    hidden: tuple[int, ...] = (120, 84)
    """Hidden layer widths of the MLP Q-network (vector observations)."""
    init: Init = "torch"
    """The Q-network's initialization: torch (PyTorch's default, as CleanRL's DQN and the MinAtar
    paper's) or orthogonal (gain sqrt(2), zero biases, as PPO's and PQN's)."""
    save_replay: bool = False
    """Also save the replay buffer with each checkpoint (`replay.npz` in the run folder; Atari's
    1M transitions take about 7.5 GB), so that a resumed run continues with it. Without it a
    resumed run refills the buffer for `learning_starts` steps before it learns again."""


@dataclasses.dataclass
class Config(TorchConfig, AccelFields, QLearningFields):
    """Train an agent with DQN. Fields left unset come from the env family's preset."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"max_grad_norm"})

    preset: Literal["auto", "classic", "atari", "minatar"] = "auto"
    total_steps: int | None = None
    """Env steps to train for (preset: 500k classic, 10M Atari)."""
    num_envs: int = 1
    """Envs stepped in parallel (each vector step adds num_envs transitions)."""
    learning_rate: float | None = None
    """Learning rate (preset: 2.5e-4 classic, 1e-4 Atari)."""
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
    start_e: float = 1.0
    """Exploration epsilon at the start."""
    end_e: float | None = None
    """Exploration epsilon at the end of the schedule (preset: 0.05 classic, 0.01 Atari)."""
    exploration_fraction: float | None = None
    """Fraction of total_steps over which epsilon falls from start_e to end_e (preset: 0.5
    classic, 0.1 Atari)."""
    prioritized: bool = False
    """Prioritized replay (proportional, by TD error), with importance-sampling weights."""
    max_grad_norm: float | None = None
    """Gradient norm clip (None: no clipping, as CleanRL)."""
    num_threads: int | None = None
    """Env pool threads (default: physical cores)."""


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
    return fill_log_every(config, 1000)


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


class QLearner(Learner):
    """The Q-learning learner on n-step transitions from a replay table: a Q-network (`net`, the
    one the actors' policy runs), its target network and optimizer. One update regresses
    Q(s, a) on the (double) DQN target with the config's loss, weighted by the table's
    importance weights, clips the gradient norm, steps the optimizer, moves the target network
    every `target_every` updates (by `tau`), and writes the new |TD errors| back to the table
    (`replay`, set by the trainer) when it is prioritized."""

    tunable = tunables(learning_rate=POSITIVE, tau=RATE, max_grad_norm=POSITIVE)
    search = ranges(learning_rate=LEARNING_RATE, max_grad_norm=GRAD_CLIP)
    replay: Any = None

    def __init__(self, config: Any, obs_space: Any, act_space: Any, device: torch.device,
                 target_every: int) -> None:  # fmt: skip
        self.config, self.device, self.target_every = config, device, target_every
        self.net = self.make_net(config, obs_space, act_space).to(device)
        self.target = copy.deepcopy(self.net).requires_grad_(False)
        self.params = list(self.net.parameters())  # listed once: every step clips their norm
        self.optimizer = self.make_optimizer(self.params)
        self.hp = self.make_hyperparams(config)
        self.hp.bind("learning_rate", self.optimizer)
        self.clips = "max_grad_norm" in self.hp.names  # a config without one does not clip
        self.updates = 0

    def make_net(self, config: Any, obs_space: Any, act_space: Any) -> nn.Module:
        """The Q-network for the env's spaces."""
        return QNetwork(obs_space, act_space, config.hidden, dueling=config.dueling,
                        init=config.init)  # fmt: skip

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        """Adam (fused), or the MinAtar paper's centered RMSProp (`--optimizer rmsprop`)."""
        lr = self.config.learning_rate
        if self.config.optimizer == "rmsprop":
            return torch.optim.RMSprop(params, lr=lr, alpha=0.95, eps=0.01, centered=True)
        return adam(params, lr, self.device)

    def optimize(self, loss: torch.Tensor, tau: float) -> None:
        """One optimizer step on `loss` (the gradient norm clipped where the learner has
        `max_grad_norm`), inside `updating()`; then, every `target_every` updates, the target
        network moved towards the online one by `tau` (1: copied)."""
        self.descend(loss, self.hp.max_grad_norm if self.clips else None)
        self.updates += 1
        if self.updates % self.target_every == 0:
            if tau == 1:
                self.target.load_state_dict(self.net.state_dict())
            else:
                for target, online in zip(
                    self.target.parameters(), self.net.parameters(), strict=True
                ):
                    target.lerp_(online.detach(), tau)

    def write_priorities(self, indices: np.ndarray, td: torch.Tensor) -> None:
        """The sampled items' new priorities, their |TD errors|, when the table has them."""
        if self.replay is not None and self.replay.prioritized:
            self.replay.update_priorities(indices, td.detach().abs().cpu().numpy())

    def update(self, batch: ReplayBatch) -> dict[str, float]:
        td, q_taken = td_errors(self.net, self.target, batch, self.config.double, self.device)
        per = (td.pow(2) if self.config.loss == "mse"
               else F.huber_loss(td, torch.zeros_like(td), reduction="none"))  # fmt: skip
        loss = (torch.as_tensor(batch.weights, device=self.device) * per).mean()
        self.optimize(loss, self.hp.tau)
        self.write_priorities(batch.indices, td)
        return {"losses/td_loss": loss.item(), "losses/q_values": q_taken.mean().item()}

    def greedy(self, device: torch.device) -> Any:
        return greedy_q_policy(self.net.eval(), device)

    def state_dict(self) -> dict[str, Any]:
        return {"net": self.net.state_dict(), "target": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict(), "updates": self.updates}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])


class DQN(QLearner):
    """The Q-learning learner with DQN's inline actor: epsilon-greedy on a linear schedule over
    the run's env steps (`act`)."""

    def __init__(self, config: Config, obs_space: Any, act_space: Any, device: torch.device):
        every = max(1, config.target_network_frequency // config.train_frequency)
        super().__init__(config, obs_space, act_space, device, target_every=every)
        self.accel = Accel.of(config, device)
        duration = config.exploration_fraction * config.total_steps
        self.explorer = EpsilonGreedy(self.net, config.start_e, config.end_e, duration).to(device)

    def act(self, obs: np.ndarray, step: int) -> np.ndarray:
        """Epsilon-greedy actions for a batch of observations (the schedule counts the steps)."""
        return self.explorer.sample(obs, self.device)

    def update(self, batch: ReplayBatch) -> dict[str, float]:
        return {**super().update(batch), "charts/epsilon": self.explorer.epsilon}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "explorer_steps": int(self.explorer.steps)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.explorer.steps.fill_(int(state["explorer_steps"]))


class Trainer(offpolicy.ReplayTrainer):
    """DQN: one inline actor, a replay buffer, the Q-learning learner."""

    make_learner = DQN
