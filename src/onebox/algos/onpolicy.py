"""The on-policy family (PPO, A2C, PQN): a `Sampler` fills a rollout from the env pools, the
learner updates on it.

`OnPolicyTrainer` is its trainer: one step collects `num_steps` steps from each of `num_envs`
envs (one pool, or with `--sampler double` two halves that take turns) and makes one update.
A learner module subclasses it, naming its `Learner` as `make_learner`; the learner has `net`
(what the sampler acts with: `act`, `value`, and with an LSTM `step`/`unroll`, as
`onebox.nn.networks.ActorCritic`), `obs_norm` and `reward_scaler` (None, or what the sampler
applies to observations and rewards), and `update(rollout)`.

`ActorCriticLearner` is PPO's and A2C's common part: an `ActorCritic` (with an LSTM core for
`--lstm`), its optimizer and the normalizers the config asks for.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

import torch

import onebox.envs
from onebox.algos.common import (
    check_lstm,
    check_positive,
    greedy_policy,
    parse_env_options,
    resolve_env,
    setup_torch,
)
from onebox.algos.trainer import (
    DISCOUNT,
    GRAD_CLIP,
    LEARNING_RATE,
    NONNEGATIVE,
    POSITIVE,
    UNIT,
    EnvSeeds,
    Learner,
    Range,
    Step,
    Trainer,
    ranges,
    tunables,
)
from onebox.nn.accel import Accel, check_accel
from onebox.nn.networks import ActorCritic
from onebox.nn.normalize import ObsNormalizer, RewardScaler
from onebox.run.presets import Presets
from onebox.sampling import Rollout, Sampler


def resolve_common(config: Any, presets: Presets) -> Any:
    """Check the env and its options, fill the env family's preset (or `config.preset`'s) into
    the fields left None, pick thread counts, and check the fields every actor-critic on the
    sampler has (sizes, learning rate, sampler, gamma, gae_lambda, device); raise ValueError on
    bad input."""
    config = resolve_env(config, presets, ActorCritic.check_spaces)
    check_accel(config)
    check_positive(config, "num_steps", "learning_rate")
    check_lstm(config.lstm)
    check_sampler(config)
    if not 0 <= config.gae_lambda <= 1:
        raise ValueError(f"--gae-lambda must be in [0, 1], got {config.gae_lambda}")
    return config


def check_sampler(config: Any) -> None:
    """Raise ValueError unless `config.sampler` can drive `config.num_envs` envs (double
    buffering needs an even number)."""
    if config.sampler == "double" and (config.num_envs < 2 or config.num_envs % 2):
        raise ValueError(f"--sampler double needs an even --num-envs >= 2, got {config.num_envs}")


def make_pools(config: Any, seed: int) -> list[Any]:
    """The training env pools: one of `num_envs` envs, or with `--sampler double` two halves
    (env i seeded `seed + i` as in one pool), each with `num_threads` threads."""
    return onebox.envs.make_splits(2 if config.sampler == "double" else 1, config.env,
                                   config.num_envs, config.num_threads, seed,
                                   autoreset_mode="SameStep",
                                   **parse_env_options(config.env_options))  # fmt: skip


class Lane(Protocol):
    """What feeds a trainer that shares its env pool (`onebox.pbt.shared`): the spaces of its
    envs, their reset, its share of each rollout and of the episodes that finished in it, as
    its own `Sampler` would give them."""

    single_observation_space: Any
    single_action_space: Any

    def reset(self, seed: int) -> None: ...

    @property
    def episodes(self) -> Any:
        """Its `pop()`: (returns, lengths) of the lane's episodes finished since the last."""
        ...

    def collect(self) -> Rollout: ...

    def learn(self, rollout: Rollout) -> dict[str, float]:
        """The trainer's update on its share `rollout` (its learner's `update`, or the stats of
        an update made with the lane's other trainers)."""
        ...


class OnPolicyTrainer(Trainer):
    """A sampler feeding a learner rollouts (see the module's docstring); or, given a `lane`,
    the share of a sampler of several trainers' envs that the lane hands it."""

    make_learner: ClassVar[Callable[..., Any]]
    """(config, observation space, action space, device) -> the learner."""

    def __init__(self, config: Any, seeds: EnvSeeds, lane: Lane | None = None) -> None:
        super().__init__()
        device = setup_torch(config)
        accel = Accel.of(config, device)
        accel.setup()
        self.batch = config.num_envs * config.num_steps
        self.total_steps = max(1, config.total_steps // self.batch) * self.batch
        self.num_envs = config.num_envs
        self.seed = seeds.take(config.num_envs)
        self.pools = [] if lane is not None else make_pools(config, self.seed)
        try:
            space = lane if lane is not None else self.pools[0]
            self.learner = self.make_learner(config, space.single_observation_space,
                                             space.single_action_space, device)  # fmt: skip
            self.learn = lane.learn if lane is not None else self.learner.update
            self.sampler: Sampler | Lane = lane if lane is not None else Sampler(
                self.pools, accel.policy(self.learner.net), config.num_steps, device=device,
                obs_transform=self.learner.obs_norm, reward_transform=self.learner.reward_scaler,
                timer=self.timer,
            )  # fmt: skip
        except BaseException:
            self.close()
            raise

    def start(self) -> None:
        self.sampler.reset(seed=self.seed)

    def step(self) -> Step:
        rollout = self.sampler.collect()
        self.global_step += self.batch
        with self.timer("learn"), self.learner.autocast():
            stats = self.learn(rollout)
        self.updates += 1
        return Step(stats, *self.sampler.episodes.pop())

    def close(self) -> None:
        for pool in self.pools:
            pool.close()


class ActorCriticLearner(Learner):
    """An `ActorCritic` for the env's spaces (an LSTM core of `config.lstm` units if set), its
    optimizer (`make_optimizer`), and the normalizers the config asks for (`normalize_obs`,
    `normalize_reward`, the latter with a return per env of the run's `num_envs`). Its tunable
    hyperparameters are A2C's (and A3C's); PPO adds its clip range."""

    tunable = tunables(learning_rate=POSITIVE, gamma=UNIT, gae_lambda=UNIT,
                       ent_coef=NONNEGATIVE, vf_coef=NONNEGATIVE, max_grad_norm=POSITIVE)  # fmt: skip
    search = ranges(learning_rate=LEARNING_RATE, gamma=DISCOUNT,
                    gae_lambda=Range(0.8, 0.99, "complement"), ent_coef=Range(1e-5, 0.1, "log"),
                    vf_coef=Range(0.1, 1.0), max_grad_norm=GRAD_CLIP)  # fmt: skip

    def __init__(self, config: Any, obs_space: Any, act_space: Any, device: torch.device) -> None:
        self.config, self.device = config, device
        self.accel = Accel.of(config, device)
        self.net = ActorCritic(obs_space, act_space, lstm=config.lstm).to(device)
        self.params = list(self.net.parameters())  # listed once: every step clips their norm
        self.optimizer = self.make_optimizer(self.params)
        self.obs_norm = ObsNormalizer(obs_space.shape) if config.normalize_obs else None
        self.reward_scaler = (
            RewardScaler(config.num_envs, config.gamma) if config.normalize_reward else None
        )
        self.hp = self.make_hyperparams(config)
        self.hp.bind("learning_rate", self.optimizer)

    update_together: ClassVar[Callable[[Sequence[Any], Sequence[Rollout]], list[dict[str, float]]]
                              | None] = None  # fmt: skip
    """(learners, their rollouts) -> each one's stats: their updates in one batched pass, where
    the learner has one (PPO's; a population on one engine uses it, `onebox.pbt.shared`)."""

    @abc.abstractmethod
    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        """The optimizer of the network's parameters."""

    @abc.abstractmethod
    def update(self, batch: Rollout) -> dict[str, float]: ...

    def greedy(self, device: torch.device) -> Any:
        norm = self.obs_norm  # frozen: evaluation does not move its statistics
        return greedy_policy(
            self.net, device, (lambda obs: norm(obs, update=False)) if norm is not None else None
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "net": self.net.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "obs_norm": self.obs_norm.state_dict() if self.obs_norm else None,
            "reward_scaler": self.reward_scaler.state_dict() if self.reward_scaler else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.obs_norm is not None:
            self.obs_norm.load_state_dict(state["obs_norm"])
        if self.reward_scaler is not None:
            self.reward_scaler.load_state_dict(state["reward_scaler"])
