"""Ape-X DQN (Horgan et al. 2018): many actors, each exploring with its own epsilon, feed one
prioritized replay table; one learner trains a dueling double DQN on n-step returns from it.

    onebox train apex --env CartPole-v1 --actors 4

The actor-learner loop is `onebox.algos.actor_learner`'s, with a replay channel
(`onebox.sampling.channels.ReplayChannel`) where IMPALA has a FIFO. Actors (threads, or with
`--process-actors` processes) step their env pools with actions from the central inference
server, which batches every actor's requests into one forward pass of the learner's Q-network,
or with `--inference local` each from its own copy of it, reloaded whenever the learner has
published newer weights (as in Ape-X, where the actors copy the learner's every 400 frames). The
policy knows which actor asks: actor i of N acts epsilon-greedily with
epsilon_i = eps_base ** (1 + eps_alpha * i / (N - 1)) (Ape-X's 0.4 and 7), and returns the
Q-values with the actions. Each actor's unrolls go into the replay table with their initial
priorities, |n-step TD error| computed from those Q-values (as Ape-X's actors do), and the table
computes the n-step returns at insertion (a truncated episode bootstraps from its final
observation, a terminated one does not).

The learner is DQN's (`onebox.algos.dqn.QLearner`, with Ape-X's defaults: dueling, double,
3-step returns): it samples batches by priority, minimises the importance-weighted squared TD
error of double DQN's target, writes the new |TD errors| back as priorities, and copies the
Q-network to the target network every `target_update` updates. Updates start once the table
holds `learning_starts` transitions and run as fast as the learner can go (or as
`--samples-per-insert` lets the actors run), while the actors keep stepping.

A checkpoint holds the networks, the optimizer and the counters; the replay table too with
`--save-replay` (`replay.npz`), else a resumed run refills it, waiting for `learning_starts`
transitions again, and says so in its log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch

from onebox.algos import actor_learner, offpolicy
from onebox.algos.common import check_positive, fill_log_every, resolve_env
from onebox.algos.dqn import QLearner, QLearningFields
from onebox.nn.accel import Accel, AccelFields, check_accel
from onebox.nn.networks import Init
from onebox.nn.q_networks import QNetwork, epsilon_greedy
from onebox.run.config import TorchConfig
from onebox.run.presets import Presets
from onebox.sampling.channels import ReplayChannel


@dataclasses.dataclass
class Config(TorchConfig, AccelFields, actor_learner.ActorFields, QLearningFields):
    """Train an agent with Ape-X DQN. Fields left unset come from the env family's preset."""

    preset: Literal["auto", "classic", "atari"] = "auto"
    total_steps: int | None = None
    """Env steps to train for, all actors together (preset: 200k classic, 50M Atari)."""
    actors: int | None = None
    """Actors, each owning an env pool and its own epsilon (preset: 4 classic, 8 Atari)."""
    envs_per_actor: int | None = None
    """Envs in each actor's pool (preset: 4 classic, 16 Atari)."""
    unroll: int | None = None
    """Steps per unroll an actor hands to the replay table (preset: 16); at least n_step."""
    eps_base: float | None = None
    """Actor i of N explores with epsilon eps_base ** (1 + eps_alpha * i / (N - 1)) (preset:
    Ape-X's 0.4 Atari, 0.1 classic)."""
    eps_alpha: float = 7.0
    """See eps_base."""
    learning_rate: float | None = None
    """Learning rate (preset: Adam 2.5e-4 classic, 0.00025 / 4 Atari)."""
    double: bool = True
    dueling: bool = True
    n_step: int = 3
    init: Init = "orthogonal"
    buffer_size: int | None = None
    """Replay table capacity in transitions (preset: 50k classic, 2M Atari)."""
    batch_size: int | None = None
    """Transitions per learner update (preset: 64 classic, 512 Atari)."""
    learning_starts: int | None = None
    """Transitions in the table before the first update (preset: 2k classic, 50k Atari)."""
    target_update: int | None = None
    """Learner updates between target network updates (preset: 250 classic, 2,500 Atari)."""
    samples_per_insert: float | None = None
    """Rate limit: actors wait while the transitions they inserted exceed those the learner
    sampled divided by this (plus one unroll per actor); 0 = no limit, the actors run free as
    in Ape-X (preset: 16 classic, 0 Atari)."""
    max_grad_norm: float | None = None
    """Gradient norm clip (preset: 10 classic, 40 Atari)."""

    @property
    def num_envs(self) -> int:
        """Envs of all actors together (of a resolved config)."""
        return self.actors * self.envs_per_actor  # type: ignore[operator]


PRESETS = Presets(Config, {
    "classic": dict(
        total_steps=200_000, actors=4, envs_per_actor=4, unroll=16, learning_rate=2.5e-4,
        eps_base=0.1, buffer_size=50_000, batch_size=64, learning_starts=2_000,
        target_update=250, max_grad_norm=10.0, samples_per_insert=16.0,
    ),
    "atari": dict(
        total_steps=50_000_000, actors=8, envs_per_actor=16, unroll=16, eps_base=0.4,
        learning_rate=0.00025 / 4, buffer_size=2_000_000, batch_size=512,
        learning_starts=50_000, target_update=2_500, max_grad_norm=40.0, samples_per_insert=0.0,
    ),
})  # fmt: skip
"""Per env family: Ape-X's published Atari settings (epsilons 0.4 ** (1 + 7 i / (N - 1)),
replay of 2M transitions, batch 512, Adam 0.00025/4, target update every 2,500 learner steps,
gradient clip 40; priority exponent 0.6 and importance-sampling exponent 0.4 and 3-step returns
are the Config defaults), with 8 actors of 16 envs in place of 360 single-env actors.

For classic control a small table and batch, actors held to 16 sampled transitions per inserted
one, and eps_base 0.1: with 4 actors, actor 0 takes a quarter of the steps, and with Ape-X's 0.4
its episodes are short (a policy that played 495 greedily averaged 223 with epsilon 0.4, 458
with 0.2, 482 with 0.1), so they are over 40% of the training episodes and held the mean of the
last 20 to 374-410 on CartPole-v1. (With 360 actors only 11% explore with epsilon above 0.2.)
The training episodes reported are all actors', actor 0's included. With eps_base 0.1, runs that
had played 500 for tens of thousands of steps could collapse (DQN's forgetting once the table
holds only long episodes): Adam 5e-4 and 150k steps ended at 176-500 over seeds 1-4; Adam 2.5e-4,
target copies every 250 updates and 200k steps, this preset, ended with last-20 means of 487,
478 and 500 for seeds 1-3 (two dipped to about 300 near 150k steps and recovered)."""


def resolve(config: Config) -> Config:
    """Fill the preset and check every field; raise ValueError before any work starts."""
    for name in ("actors", "envs_per_actor"):  # before the preset could hide a bad value
        value = getattr(config, name)
        if value is not None and value <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")
    config = resolve_env(config, PRESETS, QNetwork.check_spaces)
    check_accel(config, compiles=False)
    check_positive(config, "actors", "envs_per_actor", "unroll", "learning_rate", "buffer_size")
    check_positive(config, "batch_size", "target_update", "max_grad_norm", "max_batch")
    check_positive(config, "n_step", "eps_base", "num_threads")
    check_rate_limit(config)
    if config.unroll < config.n_step:
        raise ValueError(f"--unroll ({config.unroll}) must be at least --n-step ({config.n_step})")
    if config.buffer_size < config.batch_size:
        raise ValueError(
            f"--buffer-size {config.buffer_size} is smaller than a batch (--batch-size "
            f"{config.batch_size}); make the buffer larger or the batch smaller"
        )
    if not 0 <= config.learning_starts < config.total_steps:
        raise ValueError(
            f"--learning-starts must be in [0, --total-steps), got {config.learning_starts}"
        )
    if config.eps_base > 1 or config.eps_alpha < 0:
        raise ValueError("--eps-base must be in (0, 1] and --eps-alpha >= 0")
    if config.priority_alpha < 0 or not 0 <= config.priority_beta <= 1:
        raise ValueError("--priority-alpha must be >= 0 and --priority-beta in [0, 1]")
    if not 0 < config.tau <= 1:
        raise ValueError(f"--tau must be in (0, 1], got {config.tau}")
    return fill_log_every(actor_learner.resolve_actors(config), 1000)


def check_rate_limit(config: Any) -> None:
    """Check `samples_per_insert` (Ape-X's and R2D2's)."""
    if config.samples_per_insert < 0:
        raise ValueError(f"--samples-per-insert must be >= 0, got {config.samples_per_insert}")


def rate_note(config: Any, items: str) -> str:
    """What the run's rate limit does, for its log (`items`: what the table holds)."""
    spi = config.samples_per_insert
    if not spi:
        return "actors run free (--samples-per-insert 0): nothing holds them to the learner's pace"
    return (
        f"actors are rate-limited (--samples-per-insert {spi:g}): once the learner has started, "
        f"they wait while the {items} they inserted since exceed those the learner sampled "
        f"/ {spi:g}, plus one unroll per actor, so that they leave the learner its share of the "
        "cores; --samples-per-insert 0 lets them run free"
    )


def actor_epsilons(actors: int, base: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """Ape-X's exploration: actor i of N explores with base ** (1 + alpha * i / (N - 1))."""
    i = np.arange(actors)
    return base ** (1 + alpha * i / max(actors - 1, 1))


def q_policy(
    net: QNetwork,
    epsilons: torch.Tensor,
    generator: torch.Generator,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> Any:
    """`net` as a `PolicyFn`: epsilon-greedy actions, each row with its actor's epsilon, and the
    Q-values (the forward pass inside `autocast()`: the run's precision)."""

    def policy(obs: torch.Tensor, actor_ids: torch.Tensor, env_ids: torch.Tensor) -> Any:
        with autocast():
            q = net(obs)
        return {"actions": epsilon_greedy(q, epsilons[actor_ids], generator), "q": q}

    return policy


def local_q_policy(net: Any, generator: torch.Generator, epsilons: torch.Tensor,
                   make: Callable[..., Any] = q_policy) -> Any:  # fmt: skip
    """An actor's own copy of the network as its policy (`make`: `q_policy`, or R2D2's
    recurrent one), with the actors' epsilons on the copy's device."""
    return make(net, epsilons.to(generator.device), generator)


class ApeX(QLearner):
    """DQN's learner served to many actors: a dueling Q-network acting epsilon-greedily with
    each actor's epsilon (`actor_epsilons`), recording its Q-values (the actors' initial
    priorities), fed by a prioritized replay table."""

    state_size = None  # feed-forward
    steps_per_update = None  # a replay table: the run ends on its env steps

    def __init__(self, config: Config, obs_space: Any, act_space: Any, device: torch.device):
        super().__init__(config, obs_space, act_space, device, target_every=config.target_update)
        self.accel = Accel.of(config, device)
        self.accel.setup()
        eps = actor_epsilons(config.actors, config.eps_base, config.eps_alpha)
        self.epsilons = torch.as_tensor(eps, dtype=torch.float32, device=device)
        self.outputs = {"q": ((self.net.num_actions,), np.float32)}
        self.generator = torch.Generator(device).manual_seed(config.seed)
        self.policy = q_policy(self.net, self.epsilons, self.generator, self.accel.autocast)

    def local_policy(self) -> Any:
        return functools.partial(local_q_policy, epsilons=self.epsilons.cpu())

    def make_channel(self, obs_space: Any, act_space: Any) -> ReplayChannel:
        """The prioritized n-step table, each actor's envs owning rows of it, behind the
        channel that inserts the actors' unrolls with their initial priorities."""
        c, n = self.config, self.config.envs_per_actor
        table = offpolicy.make_buffer(c, obs_space, act_space, c.num_envs,
                                      beta_steps=c.total_steps, prioritized=True)  # fmt: skip
        self.replay = ReplayChannel(table, n, c.learning_starts, c.batch_size,
                                    c.samples_per_insert or None, slack=c.actors * n * c.unroll)  # fmt: skip
        return self.replay

    def notes(self) -> list[str]:
        return [rate_note(self.config, "transitions")]

    def update(self, batch: Any) -> dict[str, float]:
        return {**super().update(batch), "charts/replay_size": len(self.replay.buffer)}


class Trainer(actor_learner.ActorLearnerTrainer):
    """Ape-X: actors with their own epsilons, the inference server, a prioritized replay
    table, DQN's learner."""

    make_learner = ApeX
