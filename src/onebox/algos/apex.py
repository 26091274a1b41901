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

The learner samples batches by priority, minimises the importance-weighted squared TD error of
double DQN's target (`onebox.algos.dqn.td_errors`), writes the new |TD errors| back as
priorities, and copies the Q-network to the target network every `target_update` updates.
Updates start once the table holds `learning_starts` transitions and run as fast as the learner
can go, while the actors keep stepping.

A checkpoint holds the networks, the optimizer and the counters; the replay table too with
`--save-replay` (`replay.npz`), else a resumed run refills it, waiting for `learning_starts`
transitions again, and says so in its log.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from onebox import run
from onebox.algos import actor_learner, offpolicy
from onebox.algos.common import (
    adam,
    check_positive,
    greedy_q_policy,
    parse_env_options,
    resolve_env,
)
from onebox.algos.dqn import td_errors
from onebox.nn.accel import Accel, AccelFields, check_accel
from onebox.nn.q_networks import QNetwork
from onebox.replay import ReplayBatch, ReplayBuffer
from onebox.run.config import TorchConfig
from onebox.run.presets import Presets
from onebox.sampling.actors import ActorSpec
from onebox.sampling.channels import ReplayChannel
from onebox.sampling.inference import InferenceServer
from onebox.sampling.policies import LocalPolicy, Weights


@dataclasses.dataclass
class Config(TorchConfig, AccelFields, actor_learner.ActorFields):
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
    """Adam learning rate (preset: 2.5e-4 classic, 0.00025 / 4 Atari)."""
    anneal_lr: bool | None = None
    """Anneal the learning rate linearly to 0 over the run's expected learner updates (needs
    --samples-per-insert; preset: off. On CartPole it did not keep a run that played 500 from
    collapsing near its end: with it, and the importance-sampling exponent annealed to 1 over the
    same updates, one run's last 20 episodes fell from 500 at 174k steps to 232 at 200k)."""
    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 3
    """Steps of the discounted returns in the targets (and the actors' initial priorities)."""
    buffer_size: int | None = None
    """Replay table capacity in transitions (preset: 50k classic, 2M Atari)."""
    batch_size: int | None = None
    """Transitions per learner update (preset: 64 classic, 512 Atari)."""
    learning_starts: int | None = None
    """Transitions in the table before the first update (preset: 2k classic, 50k Atari)."""
    target_update: int | None = None
    """Learner updates between target network copies (preset: 250 classic, 2,500 Atari)."""
    samples_per_insert: float | None = None
    """Rate limit: actors wait while the transitions they inserted exceed those the learner
    sampled divided by this (plus one unroll per actor); 0 = no limit, the actors run free as
    in Ape-X (preset: 16 classic, 0 Atari)."""
    priority_alpha: float = 0.6
    """How much priorities shape sampling (0: uniform)."""
    priority_beta: float = 0.4
    """Initial importance-sampling exponent, annealed to 1 over total_steps learner updates."""
    max_grad_norm: float | None = None
    """Gradient norm clip (preset: 10 classic, 40 Atari)."""
    hidden: tuple[int, ...] = (120, 84)
    """Hidden layer widths of the MLP Q-network (vector observations)."""
    save_replay: bool = False
    """Also save the replay table with each checkpoint (`replay.npz` in the run folder), so
    that a resumed run continues with it. Without it a resumed run refills the table for
    `learning_starts` transitions before it learns again."""

    @property
    def num_envs(self) -> int | None:
        """Envs of all actors together."""
        return self.actors * self.envs_per_actor if self.actors and self.envs_per_actor else None


PRESETS = Presets(Config, {
    "classic": dict(
        total_steps=200_000, actors=4, envs_per_actor=4, unroll=16, learning_rate=2.5e-4,
        eps_base=0.1, anneal_lr=False, buffer_size=50_000, batch_size=64, learning_starts=2_000,
        target_update=250, max_grad_norm=10.0, samples_per_insert=16.0,
    ),
    "atari": dict(
        total_steps=50_000_000, actors=8, envs_per_actor=16, unroll=16, eps_base=0.4,
        learning_rate=0.00025 / 4, buffer_size=2_000_000, batch_size=512,
        learning_starts=50_000, target_update=2_500, max_grad_norm=40.0, samples_per_insert=0.0,
        anneal_lr=False,
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
    assert config.learning_starts is not None and config.unroll is not None
    if config.unroll < config.n_step:
        raise ValueError(f"--unroll ({config.unroll}) must be at least --n-step ({config.n_step})")
    if config.buffer_size < config.batch_size:  # type: ignore[operator]
        raise ValueError(
            f"--buffer-size {config.buffer_size} is smaller than a batch (--batch-size "
            f"{config.batch_size}); make the buffer larger or the batch smaller"
        )
    if not 0 <= config.learning_starts < config.total_steps:  # type: ignore[operator]
        raise ValueError(
            f"--learning-starts must be in [0, --total-steps), got {config.learning_starts}"
        )
    if config.eps_base > 1 or config.eps_alpha < 0:  # type: ignore[operator]
        raise ValueError("--eps-base must be in (0, 1] and --eps-alpha >= 0")
    if config.priority_alpha < 0 or not 0 <= config.priority_beta <= 1:
        raise ValueError("--priority-alpha must be >= 0 and --priority-beta in [0, 1]")
    return actor_learner.resolve_actors(config)


def check_rate_limit(config: Any) -> None:
    """Check `samples_per_insert` and what `anneal_lr` needs of it (Ape-X's and R2D2's)."""
    if config.samples_per_insert is None or config.samples_per_insert < 0:
        raise ValueError(f"--samples-per-insert must be >= 0, got {config.samples_per_insert}")
    if config.anneal_lr and not config.samples_per_insert:
        raise ValueError(
            "--anneal-lr counts the learner updates a run held to --samples-per-insert makes; "
            "set --samples-per-insert > 0 or --anneal-lr False"
        )


def expected_updates(config: Any, steps_per_item: int = 1) -> int:
    """The learner updates of a run held to `samples_per_insert` (1 where it is 0), each
    sampling `batch_size` items of `steps_per_item` env steps (transitions: 1): the
    importance-sampling exponent reaches 1, and an annealed learning rate 0, at the last."""
    per_step = (config.samples_per_insert or 1) / (steps_per_item * config.batch_size)
    return max(int(config.total_steps * per_step), 1)


def actor_epsilons(actors: int, base: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """Ape-X's exploration: actor i of N explores with base ** (1 + alpha * i / (N - 1))."""
    i = np.arange(actors)
    return base ** (1 + alpha * i / max(actors - 1, 1))


def explore(q: torch.Tensor, actor_ids: torch.Tensor, epsilons: torch.Tensor,
            generator: torch.Generator) -> torch.Tensor:  # fmt: skip
    """Epsilon-greedy actions from Q-values `q` (rows, actions), each row with its actor's
    epsilon."""
    n = len(q)
    explores = torch.rand(n, device=q.device, generator=generator) < epsilons[actor_ids]
    random = torch.randint(0, q.shape[-1], (n,), device=q.device, generator=generator)
    return torch.where(explores, random, q.argmax(-1))


def epsilon_greedy(
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
        return {"actions": explore(q, actor_ids, epsilons, generator), "q": q}

    return policy


def local_policy(net: Any, epsilons: torch.Tensor, seed: int, make: Any = epsilon_greedy,
                 lstm: int | None = None) -> Any:  # fmt: skip
    """`Setup.local` of Ape-X and R2D2 (`--inference local`): each actor gets its own copy of
    `net`, run as `make(copy, epsilons, generator)` (a `PolicyFn`) with its own epsilon and
    random stream; `lstm`: the state size of a recurrent policy (R2D2's)."""

    def local(actor: int, weights: Weights) -> LocalPolicy:
        copy_ = copy.deepcopy(net).requires_grad_(False)
        gen = torch.Generator(next(copy_.parameters()).device).manual_seed(seed + 7919 * actor)
        policy = make(copy_, epsilons.to(gen.device), gen)
        return LocalPolicy(weights, copy_, actor, policy=policy, lstm=lstm)

    return local


class TargetLearner:
    """What Ape-X's and R2D2's learners share: an online network the actors' policy serves, its
    target network and optimizer, the step that changes the served weights, and the state a
    checkpoint keeps. A subclass sets `config`, `net`, `target`, `opt` and `updates`."""

    config: Any
    net: nn.Module
    target: nn.Module
    opt: torch.optim.Optimizer
    updates: int

    def step(self, loss: torch.Tensor, server: InferenceServer) -> None:
        """Backpropagate `loss`, clip the gradient norm, step the optimizer inside
        `server.updating()`, and copy the target network every `target_update` updates."""
        self.opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.net.parameters(), self.config.max_grad_norm or 0.0)
        with server.updating():
            self.opt.step()
        self.updates += 1
        if self.updates % (self.config.target_update or 1) == 0:
            self.target.load_state_dict(self.net.state_dict())

    def state_dict(self) -> dict[str, Any]:
        return {"net": self.net.state_dict(), "target": self.target.state_dict(),
                "optimizer": self.opt.state_dict()}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.target.load_state_dict(state["target"])
        self.opt.load_state_dict(state["optimizer"])
        self.updates = state["updates"]


class Learner(TargetLearner):
    """A dueling Q-network served epsilon-greedily per actor, its target network and optimizer."""

    def __init__(self, config: Config, obs_space: Any, act_space: Any, device: torch.device,
                 channel: ReplayChannel) -> None:  # fmt: skip
        self.config, self.device, self.channel = config, device, channel
        self.net = QNetwork(obs_space, act_space, config.hidden, dueling=True).to(device)
        self.target = copy.deepcopy(self.net).requires_grad_(False)
        self.opt = adam(self.net.parameters(), config.learning_rate or 0.0, device)
        assert config.eps_base is not None, "resolve() the config first"
        eps = actor_epsilons(config.actors or 1, config.eps_base, config.eps_alpha)
        self.epsilons = torch.as_tensor(eps, dtype=torch.float32, device=device)
        self.outputs = {"q": ((self.net.num_actions,), np.float32)}
        self.updates, self.expected_updates = 0, expected_updates(config)
        self.generator = torch.Generator(device).manual_seed(config.seed)
        self.accel = Accel.of(config, device)
        self.accel.setup()

        self.policy = epsilon_greedy(self.net, self.epsilons, self.generator, self.accel.autocast)

    def update(self, batch: ReplayBatch, server: InferenceServer) -> dict[str, float]:
        with self.accel.autocast():
            td, q_taken = td_errors(self.net, self.target, batch, True, self.device)
        weights = torch.as_tensor(batch.weights, device=self.device)
        loss = (weights * td.pow(2)).mean()
        self.step(loss, server)
        self.channel.update_priorities(batch.indices, td.detach().abs().cpu().numpy())
        return {"losses/td_loss": loss.item(), "losses/q_values": q_taken.mean().item(),
                "charts/replay_size": len(self.channel.buffer)}  # fmt: skip


CHECKPOINT_KEYS = ("net", "target", "optimizer")
"""What an Ape-X checkpoint holds besides the loop's counters."""


def actor_spec(config: Config, num_actions: int) -> ActorSpec:
    """What each actor runs: its envs, its unroll length, and the Q-values it records."""
    return ActorSpec(
        env=config.env,
        num_envs=config.envs_per_actor or 1,
        num_threads=config.num_threads,
        env_options=parse_env_options(config.env_options),
        unroll=config.unroll or 1,
        outputs={"q": ((num_actions,), np.float32)},
        lstm=None,
        splits=config.env_splits,
    )


def make_buffer(config: Config, obs_space: Any, act_space: Any) -> ReplayBuffer:
    """The prioritized n-step table; each actor's envs own rows of it (Atari's frame stacks are
    stored as single frames)."""
    assert config.num_envs is not None and config.total_steps is not None
    return ReplayBuffer(
        config.buffer_size or 1, tuple(obs_space.shape), obs_space.dtype, (), np.int64,
        config.num_envs, n_step=config.n_step, gamma=config.gamma, prioritized=True,
        alpha=config.priority_alpha, beta=config.priority_beta, beta_steps=config.total_steps,
        frame_stack=offpolicy.frame_stack(config, SimpleNamespace(single_observation_space=obs_space)),
        seed=config.seed,
    )  # fmt: skip


def setup(
    config: Config, obs_space: Any, act_space: Any, device: torch.device
) -> actor_learner.Setup:
    """Ape-X's parts for the actor-learner loop: the replay channel and the learner."""
    n, spi = config.envs_per_actor or 1, config.samples_per_insert
    channel = ReplayChannel(make_buffer(config, obs_space, act_space), n,
                            config.learning_starts or 0, config.batch_size or 1, spi or None,
                            slack=(config.actors or 1) * n * (config.unroll or 1))  # fmt: skip
    learner = Learner(config, obs_space, act_space, device, channel)
    net = actor_learner.actors_net(config, learner.net)
    return actor_learner.Setup(
        spec=actor_spec(config, learner.net.num_actions),
        learner=learner,
        channel=channel,
        replay=channel,
        total_steps=config.total_steps or 0,
        log_every=100,
        local=local_policy(net, learner.epsilons.cpu(), config.seed),
        note=rate_note(config),
    )


def rate_note(config: Config) -> str:
    """What the run's rate limit does, for its log."""
    spi = config.samples_per_insert
    if not spi:
        return "actors run free (--samples-per-insert 0): nothing holds them to the learner's pace"
    return (
        f"actors are rate-limited (--samples-per-insert {spi:g}): once the learner has started, "
        f"they wait while the transitions they inserted since exceed those the learner sampled "
        f"/ {spi:g}, plus one unroll per actor, so that they leave the learner its share of the "
        "cores; --samples-per-insert 0 lets them run free"
    )


def train(config: Config, resume: Path | None = None) -> Path:
    """Train (or, with `resume`, continue the run in that folder); return the run folder."""
    return actor_learner.train(config, resume, "apex", resolve, setup, CHECKPOINT_KEYS)


def load_policy(run_dir: Path, config: Config, device: str = "cpu") -> Any:
    """The trained policy of a run: a batch of observations -> a batch of greedy actions."""
    state = run.load_checkpoint(run_dir, keys=CHECKPOINT_KEYS)
    spec = dataclasses.replace(actor_spec(config, 1), num_envs=1)
    with spec.make_pool(config.seed) as probe:
        spaces_ = (probe.single_observation_space, probe.single_action_space)
    net = QNetwork(*spaces_, config.hidden, dueling=True).to(device)
    net.load_state_dict(state["net"])
    return greedy_q_policy(net.eval(), device)
