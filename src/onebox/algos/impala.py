"""IMPALA (Espeholt et al. 2018) on the central inference server: actors and learner decoupled,
V-trace correcting for the policy lag.

    onebox train impala --env CartPole-v1 --actors 2

The actor-learner loop is `onebox.algos.actor_learner`'s, with a FIFO channel of unrolls. Actors
(threads, or with `--process-actors` processes restarted if they die; see
`onebox.sampling.actors`) each own an env pool. They only step envs: every step's observations go
to the `InferenceServer`, which batches all actors' requests into one forward pass of the current
network (SEED RL's central inference), or with `--inference local` each actor runs its own copy
synced from the learner (IMPALA). Actors cut their streams into unrolls of `unroll` steps that
record the behaviour log-probabilities and the weights' version that chose each action, and put
them on a bounded queue. The learner takes `batch_unrolls` unrolls at a time, recomputes
log-probabilities and values with the current weights, and minimises the V-trace policy-gradient
loss, the value loss against the V-trace targets and an entropy bonus; it updates the weights in
place under the server's version counter. Policy lag (learner version minus behaviour version)
is logged as `charts/policy_lag`.

With `--lstm H` the network has an LSTM core: the server (or the local actor) keeps each env's
state, unrolls record the state they start from, and the learner replays each unroll from it.

Unrolls keep `terminated` and `truncated` apart, with the behaviour value of a truncated
episode's final observation; the learner's transform (`bootstrap_truncated`) folds it into that
step's reward once, r + gamma V(final obs), so V-trace then treats every episode end alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

import numpy as np
import torch

import onebox.envs
from onebox.algos import actor_learner
from onebox.algos.common import (
    adam,
    check_lstm,
    check_positive,
    fill_log_every,
    fill_threads,
    greedy_policy,
    parse_env_options,
    probe_env,
)
from onebox.algos.trainer import (
    DISCOUNT,
    GRAD_CLIP,
    LEARNING_RATE,
    NONNEGATIVE,
    POSITIVE,
    UNIT,
    Learner,
    Range,
    ranges,
    tunables,
)
from onebox.algos.vtrace import vtrace
from onebox.nn.accel import Accel, AccelFields, check_accel, resolve_device
from onebox.nn.networks import ActorCritic
from onebox.run.config import Switch, TorchConfig
from onebox.run.presets import Presets
from onebox.sampling.channels import FifoChannel
from onebox.sampling.policies import ACTOR_CRITIC_OUTPUTS, actor_critic_policy
from onebox.sampling.rollout import Rollout, bootstrapped_rewards


@dataclasses.dataclass
class Config(TorchConfig, AccelFields, actor_learner.ActorFields):
    """Train an agent with IMPALA (V-trace). Fields left unset come from the env family's preset."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"lstm"})

    preset: Literal["auto", "classic", "atari"] = "auto"
    total_steps: int | None = None
    """Env steps to train for (preset: 500k classic, 10M Atari)."""
    actors: int | None = None
    """Actors, each owning an env pool (preset: 2 classic, 4 Atari)."""
    envs_per_actor: int | None = None
    """Envs in each actor's pool (preset: 8)."""
    unroll: int | None = None
    """Steps per unroll (preset: 10 classic, 20 Atari)."""
    batch_unrolls: int | None = None
    """Unrolls per learner batch (preset: 1 classic, 4 Atari: 32 env-unrolls of 20 steps)."""
    learning_rate: float | None = None
    """Learning rate (preset: Adam 2e-3 classic, RMSProp 6e-4 Atari), linearly annealed."""
    optimizer: Literal["adam", "rmsprop"] | None = None
    """Optimizer (preset: adam classic; rmsprop with eps 0.01 for Atari, as IMPALA)."""
    anneal_lr: Switch = True
    gamma: float = 0.99
    """Discount factor."""
    rho_bar: float = 1.0
    """V-trace clip of the importance weights in the value targets."""
    c_bar: float = 1.0
    """V-trace clip of the trace-cutting coefficients."""
    ent_coef: float | None = None
    """Entropy bonus coefficient (preset: 0.01; APPO's MinAtar preset 1e-4)."""
    vf_coef: float = 0.5
    """Value loss coefficient (IMPALA's baseline cost)."""
    max_grad_norm: float | None = None
    """Gradient norm clip (preset: 0.5 classic, 40 Atari)."""
    queue_unrolls: int | None = None
    """Unrolls the actors may have waiting for the learner (default: 2 batches); bounds the lag."""
    lstm: int | None = None
    """Size of an LSTM core between the torso and the heads; None: a feed-forward net."""

    @property
    def batch_size(self) -> int:
        """Env steps per learner batch (of a resolved config)."""
        return self.unroll * self.batch_unrolls * self.envs_per_actor  # type: ignore[operator]


PRESETS = Presets(Config, {
    "classic": dict(
        total_steps=500_000, actors=2, envs_per_actor=8, unroll=10, batch_unrolls=1,
        learning_rate=2e-3, optimizer="adam", max_grad_norm=0.5, ent_coef=0.01,
    ),
    "atari": dict(
        total_steps=10_000_000, actors=4, envs_per_actor=8, unroll=20, batch_unrolls=4,
        learning_rate=6e-4, optimizer="rmsprop", max_grad_norm=40.0, ent_coef=0.01,
    ),
})  # fmt: skip
"""Per env family: IMPALA's Atari settings (32 env-unrolls of 20 steps per batch, RMSProp 6e-4,
grad clip 40), and for classic control small batches of one 8-env unroll of 10 steps, many quick
updates: on CartPole-v1 this solved all 8 seeds tried within 150k steps (best 20-episode mean
500), where 2 unrolls of 20 steps reached 280-500."""


def resolve(config: Config, presets: Presets = PRESETS) -> Config:
    """Fill the preset (from `presets`, per env family) and check every field; raise ValueError
    before any work starts."""
    env_kwargs = parse_env_options(config.env_options)
    if onebox.envs.backend_of(config.env) is None:
        onebox.envs.make(config.env)  # raises the unknown-id error with suggestions
    family, obs_space, act_space = probe_env(config.env, **env_kwargs)
    ActorCritic.check_spaces(obs_space, act_space)
    if family == "continuous":
        raise ValueError(f"impala here takes discrete actions; {config.env} has continuous ones")
    config = presets.fill(config, config.preset if config.preset != "auto" else family)
    check_positive(config, "total_steps", "actors", "envs_per_actor", "unroll", "batch_unrolls")
    config = fill_threads(config, config.preset)
    if config.queue_unrolls is None:
        config = dataclasses.replace(config, queue_unrolls=2 * config.batch_unrolls)
    check_positive(config, "learning_rate", "max_grad_norm", "queue_unrolls", "max_batch")
    check_positive(config, "num_threads", "torch_threads", "rho_bar", "c_bar")
    config = actor_learner.resolve_actors(config)
    check_lstm(config.lstm)
    if not 0 <= config.gamma <= 1:
        raise ValueError(f"--gamma must be in [0, 1], got {config.gamma}")
    if config.ent_coef is None or config.ent_coef < 0:
        raise ValueError(f"--ent-coef must be >= 0, got {config.ent_coef}")
    resolve_device(config.device)
    check_accel(config)
    return fill_log_every(config, config.batch_size)  # every update


# ---- the learner --------------------------------------------------------------------------------


def stack(unrolls: list[Rollout], device: torch.device) -> dict[str, Any]:
    """Batch unrolls side by side: (T, B) tensors with B = unrolls x envs; `logprobs` are the
    behaviour log-probabilities, `final_values` the behaviour values of truncated episodes'
    final observations."""

    def cat(arrays: list[np.ndarray]) -> torch.Tensor:
        return torch.as_tensor(np.concatenate(arrays, 1), device=device)

    keys = ("obs", "actions", "rewards", "terminated", "truncated", "starts")
    out: dict[str, Any] = {k: cat([getattr(u, k) for u in unrolls]) for k in keys}
    out["logprobs"] = cat([u.logprobs for u in unrolls])
    out["final_values"] = cat([u.final_values for u in unrolls])
    out["next_obs"] = torch.as_tensor(np.concatenate([u.next_obs for u in unrolls]), device=device)
    out["state"] = None
    if unrolls[0].state is not None:
        out["state"] = tuple(
            torch.as_tensor(np.concatenate([u.state[j] for u in unrolls]), device=device)  # type: ignore[index]
            for j in (0, 1)
        )
    return out


def bootstrap_truncated(batch: dict[str, Any], gamma: float) -> dict[str, Any]:
    """The learner's transform of a stacked batch, the one place truncation is bootstrapped:
    a truncated (not terminated) step's reward becomes r + gamma * V(final obs), and `ends`
    (terminated or truncated) cuts V-trace's bootstrapping at every episode end."""
    rewards = bootstrapped_rewards(batch["rewards"], batch["terminated"], batch["truncated"],
                                   batch["final_values"], gamma)  # fmt: skip
    return {**batch, "rewards": rewards, "ends": batch["terminated"] | batch["truncated"]}


def bootstrap_value(net: ActorCritic, batch: dict[str, Any], state: Any) -> torch.Tensor:
    """V of the observations after the batch's last step, from the state the unroll reached."""
    next_starts = batch["ends"][-1:]
    _, value, _ = net.unroll(batch["next_obs"].unsqueeze(0), next_starts, state)
    return value


def local_actor_critic(net: ActorCritic, generator: torch.Generator) -> Any:
    """An actor's own copy of the actor-critic as its policy (its sampling draws on torch's
    stream)."""
    return actor_critic_policy(net)


class IMPALA(Learner):
    """An `ActorCritic` served to the actors (its LSTM's state kept per env by the server with
    `--lstm`), fed by a FIFO of unrolls; one update is a V-trace gradient step on a batch of
    them (`learn`, which APPO replaces with its PPO epochs)."""

    tunable = tunables(learning_rate=POSITIVE, gamma=UNIT, rho_bar=POSITIVE, c_bar=POSITIVE,
                       ent_coef=NONNEGATIVE, vf_coef=NONNEGATIVE, max_grad_norm=POSITIVE)  # fmt: skip
    search = ranges(learning_rate=LEARNING_RATE, gamma=DISCOUNT,
                    ent_coef=Range(1e-5, 0.1, "log"), vf_coef=Range(0.1, 1.0),
                    max_grad_norm=GRAD_CLIP)  # fmt: skip
    outputs = ACTOR_CRITIC_OUTPUTS

    def __init__(self, config: Config, obs_space: Any, act_space: Any, device: torch.device):
        self.config, self.device = config, device
        self.net = ActorCritic(obs_space, act_space, lstm=config.lstm).to(device)
        if config.optimizer == "rmsprop":
            self.optimizer: torch.optim.Optimizer = torch.optim.RMSprop(
                self.net.parameters(), lr=config.learning_rate, eps=0.01
            )
        else:
            self.optimizer = adam(self.net.parameters(), config.learning_rate, device, eps=1e-5)
        self.params = list(self.net.parameters())
        self.accel = Accel.of(config, device)
        self.accel.setup()
        self.policy = actor_critic_policy(self.accel.policy(self.net))
        self.state_size = config.lstm
        self.steps_per_update = config.batch_size
        self.hp = self.make_hyperparams(config)
        self.hp.bind("learning_rate", self.optimizer)

    def make_channel(self, obs_space: Any, act_space: Any) -> FifoChannel:
        """A bounded queue of unrolls (its bound limits the policy lag)."""
        return FifoChannel(self.config.queue_unrolls, self.config.batch_unrolls)

    def local_policy(self) -> Any:
        return local_actor_critic

    def update(self, batch: list[Rollout]) -> dict[str, float]:
        stacked = bootstrap_truncated(stack(batch, self.device), self.hp.gamma)
        return self.learn(stacked)

    def learn(self, batch: dict[str, Any]) -> dict[str, float]:
        """One V-trace gradient step on a stacked, bootstrapped batch of unrolls."""
        net, hp = self.net, self.hp.values()
        obs, actions = batch["obs"], batch["actions"]
        t_len, b = actions.shape
        dist, values, state = net.unroll(obs, batch["starts"], batch["state"])
        logprobs = net.log_prob(dist, actions.flatten()).view(t_len, b)
        values = values.view(t_len, b)
        entropy = net.entropy(dist).mean()
        with torch.no_grad():
            bootstrap = bootstrap_value(net, batch, state)
        vt = vtrace(
            logprobs.detach() - batch["logprobs"], batch["rewards"], values.detach(),
            batch["ends"], bootstrap, hp["gamma"], hp["rho_bar"], hp["c_bar"],
        )  # fmt: skip
        pg_loss = -(vt.advantages * logprobs).mean()
        v_loss = 0.5 * ((vt.vs - values) ** 2).mean()
        loss = pg_loss + hp["vf_coef"] * v_loss - hp["ent_coef"] * entropy
        self.descend(loss, hp["max_grad_norm"])
        return {
            "losses/policy_loss": pg_loss.item(),
            "losses/value_loss": v_loss.item(),
            "losses/entropy": entropy.item(),
            "losses/mean_rho": vt.rhos.mean().item(),
        }

    def greedy(self, device: torch.device) -> Any:
        return greedy_policy(self.net, device)

    def state_dict(self) -> dict[str, Any]:
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])


class Trainer(actor_learner.ActorLearnerTrainer):
    """IMPALA: actors and the inference server, a FIFO of unrolls, the V-trace learner."""

    make_learner = IMPALA
