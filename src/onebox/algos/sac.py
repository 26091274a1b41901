"""SAC (Haarnoja et al. 2018) with CleanRL's defaults, on onebox's env pools and replay buffer.

    onebox train sac --env Pendulum-v1
    onebox train sac --env HalfCheetah-v5

For continuous (1-D Box) actions. The policy is a tanh-squashed Gaussian rescaled to the env's
action bounds (`onebox.nn.q_networks.SquashedGaussianActor`); two Q-networks and their Polyak-averaged
targets give the critic target

    y = R + d * (min(Q1_target, Q2_target)(s', a') - alpha * log pi(a'|s')),  a' ~ pi(.|s')

with R the buffer's n-step return and d its discount (0 if the episode terminated; a truncated
one bootstraps from its final observation). Actions are uniformly random for the first
`learning_starts` steps; then every `train_frequency` steps the critics take one update, and
every `policy_frequency` updates the actor (and the entropy coefficient alpha, tuned towards the
target entropy -dim(A) when `autotune`) takes `policy_frequency` updates, as CleanRL does.

The preset equals CleanRL's sac_continuous_action.py. Any field given on the command line wins.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Literal

import numpy as np
import torch

from onebox.algos import offpolicy
from onebox.algos.common import adam, check_positive, fill_log_every, resolve_env
from onebox.algos.trainer import LEARNING_RATE, POSITIVE, RATE, Learner, Range, ranges, tunables
from onebox.nn.accel import Accel, AccelFields, check_accel
from onebox.nn.q_networks import ContinuousQ, SquashedGaussianActor, check_bounded_actions
from onebox.replay import ReplayBatch
from onebox.run.config import TorchConfig
from onebox.run.presets import Presets


@dataclasses.dataclass
class Config(TorchConfig, AccelFields):
    """Train an agent with SAC. Fields left unset come from the preset."""

    env: str = "Pendulum-v1"
    preset: Literal["auto", "continuous"] = "auto"
    total_steps: int | None = None
    """Env steps to train for (preset: 1M)."""
    num_envs: int = 1
    """Envs stepped in parallel (each vector step adds num_envs transitions)."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak rate of the target critics."""
    buffer_size: int | None = None
    """Replay buffer capacity in transitions (preset: 1M)."""
    batch_size: int | None = None
    """Transitions per update (preset: 256)."""
    learning_starts: int | None = None
    """Env steps of uniformly random actions before the first update (preset: 5000)."""
    train_frequency: int = 1
    """Env steps between critic updates."""
    policy_lr: float = 3e-4
    """Adam learning rate of the actor."""
    q_lr: float = 1e-3
    """Adam learning rate of the critics (and of alpha)."""
    policy_frequency: int = 2
    """Critic updates between actor updates (each time `policy_frequency` of them, TD3 style)."""
    target_network_frequency: int = 1
    """Critic updates between target critic updates."""
    alpha: float = 0.2
    """Entropy coefficient (its initial value is 1 with `autotune`)."""
    autotune: bool = True
    """Tune alpha towards the target entropy -dim(actions)."""
    n_step: int = 1
    """Steps of the discounted returns in the critic target."""
    prioritized: bool = False
    """Prioritized replay (by the critics' mean TD error), with importance-sampling weights."""
    priority_alpha: float = 0.6
    """Prioritized replay: how much priorities shape sampling (0: uniform)."""
    priority_beta: float = 0.4
    """Prioritized replay: initial importance-sampling exponent, annealed to 1 over the run."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden layer widths of the actor and critic MLPs."""
    num_threads: int | None = None
    """Env pool threads (default: physical cores)."""
    save_replay: bool = False
    """Also save the replay buffer with each checkpoint (`replay.npz` in the run folder; Atari's
    1M transitions take about 7.5 GB), so that a resumed run continues with it. Without it a
    resumed run refills the buffer for `learning_starts` steps before it learns again."""


PRESETS = Presets(Config, {
    "continuous": dict(total_steps=1_000_000, buffer_size=1_000_000, batch_size=256,
                       learning_starts=5000),
})  # fmt: skip
"""CleanRL's hyperparameters; the fields left None in `Config` come from here."""


def resolve(config: Config) -> Config:
    """Fill the preset and check every field; raise ValueError before any work starts."""
    config = resolve_env(config, PRESETS, lambda obs, act: check_bounded_actions(act))
    check_accel(config, compiles=False)
    check_positive(config, "policy_lr", "q_lr", "policy_frequency", "target_network_frequency")
    check_positive(config, "alpha")
    offpolicy.check_replay(config)
    if not 0 < config.tau <= 1:
        raise ValueError(f"--tau must be in (0, 1], got {config.tau}")
    return fill_log_every(config, 1000)


# ---- the losses ---------------------------------------------------------------------------------


def critic_target(
    returns: torch.Tensor,
    discounts: torch.Tensor,
    next_q1: torch.Tensor,
    next_q2: torch.Tensor,
    next_log_prob: torch.Tensor,
    alpha: float,
) -> torch.Tensor:
    """y = returns + discounts * (min(Q1', Q2') - alpha * log pi(a'|s')), all (batch,)."""
    return returns + discounts * (torch.min(next_q1, next_q2) - alpha * next_log_prob)


def alpha_loss(
    log_alpha: torch.Tensor, log_prob: torch.Tensor, target_entropy: float
) -> torch.Tensor:
    """The entropy coefficient's loss, -alpha * (log pi + target entropy) averaged: alpha grows
    while the policy's entropy is below the target and shrinks while above (CleanRL's form)."""
    return (-log_alpha.exp() * (log_prob.detach() + target_entropy)).mean()


class SAC(Learner):
    """Actor, twin critics and their targets, alpha and the optimizers (the critics' rate also
    tunes alpha). `alpha` is tunable when it is not learned (`--autotune False`)."""

    tunable = tunables(policy_lr=POSITIVE, q_lr=POSITIVE, tau=RATE, alpha=POSITIVE)
    search = ranges(policy_lr=LEARNING_RATE, q_lr=LEARNING_RATE, tau=Range(1e-3, 0.1, "log"),
                    alpha=Range(0.01, 1.0, "log"))  # fmt: skip
    learning_rates = ("policy_lr", "q_lr")
    replay: Any = None

    def __init__(self, config: Config, obs_space: Any, act_space: Any, device: torch.device):
        self.config, self.device = config, device
        self.accel = Accel.of(config, device)
        self.low, self.high = check_bounded_actions(act_space)
        self.actor = SquashedGaussianActor(obs_space, act_space, config.hidden).to(device)
        self.q1 = ContinuousQ(obs_space, act_space, config.hidden).to(device)
        self.q2 = ContinuousQ(obs_space, act_space, config.hidden).to(device)
        self.q1_target = copy.deepcopy(self.q1).requires_grad_(False)
        self.q2_target = copy.deepcopy(self.q2).requires_grad_(False)
        critics = [*self.q1.parameters(), *self.q2.parameters()]
        self.q_optimizer = adam(critics, config.q_lr, device)
        self.actor_optimizer = adam(self.actor.parameters(), config.policy_lr, device)
        self.target_entropy = -float(np.prod(act_space.shape))
        self.log_alpha = torch.zeros(1, device=device, requires_grad=config.autotune)
        self.alpha_optimizer = adam([self.log_alpha], config.q_lr, device)
        names = [n for n in self.tunable if n != "alpha" or not config.autotune]
        self.hp = self.make_hyperparams(config, names)
        self.hp.bind("q_lr", self.q_optimizer, self.alpha_optimizer)
        self.hp.bind("policy_lr", self.actor_optimizer)
        self.updates = 0

    @property
    def alpha(self) -> float:
        """The entropy coefficient: learned (`autotune`), else the tunable value."""
        return float(self.log_alpha.detach().exp()) if self.config.autotune else self.hp.alpha

    def act(self, obs: np.ndarray, step: int) -> np.ndarray:
        """Uniformly random actions for the first `learning_starts` steps, then the policy's
        samples."""
        if step < self.config.learning_starts:
            u = torch.rand(len(obs), len(self.low), dtype=torch.float64).numpy()
            return (self.low + u * (self.high - self.low)).astype(np.float32)
        with torch.no_grad():
            action, _, _ = self.actor.sample(torch.as_tensor(obs, device=self.device))
        return action.cpu().numpy()

    def update(self, batch: ReplayBatch) -> dict[str, float]:
        c = self.config
        obs, next_obs = self._tensor(batch.obs), self._tensor(batch.next_obs)
        actions, weights = self._tensor(batch.actions), self._tensor(batch.weights)
        alpha = self.alpha
        with torch.no_grad():
            next_actions, next_log_prob, _ = self.actor.sample(next_obs)
            y = critic_target(self._tensor(batch.returns), self._tensor(batch.discounts),
                              self.q1_target(next_obs, next_actions),
                              self.q2_target(next_obs, next_actions), next_log_prob, alpha)  # fmt: skip
        q1, q2 = self.q1(obs, actions), self.q2(obs, actions)
        q_loss = (weights * ((q1 - y).pow(2) + (q2 - y).pow(2))).mean()
        self.q_optimizer.zero_grad()
        q_loss.backward()
        self.q_optimizer.step()
        self.updates += 1
        stats = {"losses/qf_loss": q_loss.item() / 2, "losses/qf1_values": q1.mean().item(),
                 "losses/qf2_values": q2.mean().item()}  # fmt: skip
        if self.updates % c.policy_frequency == 0:
            for _ in range(c.policy_frequency):
                stats.update(self._update_actor(obs))
        if self.updates % c.target_network_frequency == 0:
            tau = self.hp.tau
            for net, target in ((self.q1, self.q1_target), (self.q2, self.q2_target)):
                for p, tp in zip(net.parameters(), target.parameters(), strict=True):
                    tp.lerp_(p.detach(), tau)
        stats["losses/alpha"] = self.alpha
        if self.replay is not None and self.replay.prioritized:
            td = ((q1 - y).abs() + (q2 - y).abs()).detach() / 2
            self.replay.update_priorities(batch.indices, td.cpu().numpy())
        return stats

    def _update_actor(self, obs: torch.Tensor) -> dict[str, float]:
        actions, log_prob, _ = self.actor.sample(obs)
        q = torch.min(self.q1(obs, actions), self.q2(obs, actions))
        actor_loss = (self.alpha * log_prob - q).mean()
        self.actor_optimizer.zero_grad()
        actor_loss.backward()
        self.actor_optimizer.step()
        stats = {"losses/actor_loss": actor_loss.item()}
        if self.config.autotune:
            with torch.no_grad():
                _, log_prob, _ = self.actor.sample(obs)
            loss = alpha_loss(self.log_alpha, log_prob, self.target_entropy)
            self.alpha_optimizer.zero_grad()
            loss.backward()
            self.alpha_optimizer.step()
            stats["losses/alpha_loss"] = loss.item()
        return stats

    def _tensor(self, x: Any) -> torch.Tensor:
        return torch.as_tensor(x, device=self.device)

    def greedy(self, device: torch.device) -> Any:
        """Observations -> the deterministic actions tanh(mean), rescaled."""
        actor = self.actor.eval()

        @torch.no_grad()
        def policy(obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
            return actor.sample(torch.as_tensor(obs, device=device))[2].cpu().numpy()

        return policy

    NETS = ("actor", "q1", "q2", "q1_target", "q2_target", "q_optimizer", "actor_optimizer",
            "alpha_optimizer")  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k).state_dict() for k in self.NETS},
                "log_alpha": self.log_alpha.detach().clone(), "updates": self.updates}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in self.NETS:
            getattr(self, key).load_state_dict(state[key])
        self.log_alpha.data.copy_(state["log_alpha"])
        self.updates = int(state["updates"])


class Trainer(offpolicy.ReplayTrainer):
    """SAC: one inline actor, a replay buffer, twin critics and a squashed Gaussian actor."""

    make_learner = SAC
