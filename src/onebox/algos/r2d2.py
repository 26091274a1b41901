"""R2D2 (Kapturowski et al. 2019): Ape-X's actors and prioritized replay with a recurrent
Q-network, trained on stored sequences with burn-in.

    onebox train r2d2 --env CartPole-v1
    onebox train r2d2 --env CartPole-v1 --env-options hide_velocities True   # needs memory

The actor-learner loop is `onebox.algos.actor_learner`'s. Actors (threads, or with
`--process-actors` processes) step their env pools with actions from the central inference
server, which keeps every actor-env's LSTM state (SEED RL), zeroes it where an episode starts, and
batches every actor's requests into one forward pass. The served policy acts epsilon-greedily with
Ape-X's per-actor epsilons and returns, besides the actions, the (h, c) each env's network had
before the step: the actors record them like any other output, so each stored sequence starts
from the state the actor really had. With `--inference local` (the default with `--ray ADDRESS`,
whose actors run on actor hosts of a Ray cluster, `onebox.cluster.actor_hosts`) each actor runs
its own copy of the network, which keeps its envs' states the same way
(`onebox.sampling.env_states.EnvStates`).

The channel (`onebox.sampling.channels.SequenceChannel`) cuts each actor-env's steps into
sequences of `seq_len` steps overlapping by `overlap`, which never cross an episode end
(`onebox.replay.SequenceReplay`), new ones at the largest priority seen. The learner samples
sequences by priority, unrolls its network from each stored state, the first `burn_in` steps
without gradient only to warm the state up (a sequence that begins an episode starts from the
actor's zero state itself and is trained on from its first step), and the target network over
the whole sequence. The loss is the importance-weighted squared TD error of double Q-learning on
n-step returns with value rescaling, y = h(sum_k gamma^k r_{t+k} + gamma^n h^-1(Q_target(s_{t+n},
argmax_a Q(s_{t+n}, a)))), h(x) = sign(x)(sqrt(|x| + 1) - 1) + 1e-3 x; a sequence's new priority
mixes the max and the mean of its |TD errors| (eta 0.9). Sequences end where their episode does:
a terminated one bootstraps nothing there, a truncated one from its final observation.

A checkpoint holds the networks, the optimizer and the counters; the replay table too with
`--save-replay`, else a resumed run refills it, and says so in its log.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from onebox.algos import actor_learner, apex
from onebox.algos.common import adam, check_positive, fill_log_every, resolve_env
from onebox.algos.dqn import QLearner
from onebox.algos.trainer import POSITIVE, UNIT, tunables
from onebox.nn.q_networks import QNetwork, RecurrentQNetwork, epsilon_greedy
from onebox.replay import SequenceBatch, SequenceReplay, mixed_priority
from onebox.run.config import Switch, TorchConfig
from onebox.run.presets import Presets
from onebox.sampling.channels import SequenceChannel


@dataclasses.dataclass
class Config(TorchConfig, actor_learner.ActorFields):
    """Train an agent with R2D2. Fields left unset come from the env family's preset."""

    preset: Literal["auto", "classic", "atari"] = "auto"
    total_steps: int | None = None
    """Env steps to train for, all actors together (preset: 200k classic, 50M Atari)."""
    actors: int | None = None
    """Actors, each owning an env pool and its own epsilon (preset: 4 classic, 8 Atari)."""
    envs_per_actor: int | None = None
    """Envs in each actor's pool (preset: 4 classic, 16 Atari)."""
    unroll: int = 16
    """Steps an actor collects before handing them to the replay table."""
    eps_base: float | None = None
    """Actor i of N explores with epsilon eps_base ** (1 + eps_alpha * i / (N - 1)) (preset: 0.1
    classic, Ape-X's 0.4 Atari)."""
    eps_alpha: float = 7.0
    """See eps_base."""
    lstm: int | None = None
    """Size of the recurrent core (preset: 64 classic, 512 Atari)."""
    core: Literal["lstm", "mlp"] = "lstm"
    """The core: an LSTM, or `mlp`, a ReLU layer of the same size (no memory; a control)."""
    hidden: tuple[int, ...] | None = None
    """ReLU MLP widths before the core, for vector observations (preset: 64 classic)."""
    seq_len: int | None = None
    """Steps per stored sequence, burn-in included (preset: 20 classic, 80 Atari)."""
    overlap: int | None = None
    """Steps two consecutive sequences of an episode share (preset: 10 classic, 40 Atari)."""
    burn_in: int | None = None
    """Steps at a sequence's start that only warm up the state (preset: 10 classic, 40 Atari)."""
    n_step: int | None = None
    """Steps of the discounted returns in the targets (preset: 5)."""
    gamma: float | None = None
    """Discount factor (preset: 0.99 classic, 0.997 Atari)."""
    value_rescaling: bool = True
    """Learn Q in h(x) = sign(x)(sqrt(|x| + 1) - 1) + 1e-3 x space (R2D2's value rescaling)."""
    learning_rate: float | None = None
    """Adam learning rate (preset: 1e-3 classic, 1e-4 Atari)."""
    anneal_lr: Switch | None = None
    """Anneal the learning rate linearly to 0 over the run's env steps (preset: on classic, off
    Atari)."""
    buffer_size: int | None = None
    """Replay table capacity in sequences (preset: 5,000 classic, 10,000 Atari)."""
    batch_size: int | None = None
    """Sequences per learner update (preset: 32 classic, 64 Atari)."""
    learning_starts: int | None = None
    """Sequences in the table before the first update (preset: 100 classic, 1,000 Atari)."""
    target_update: int | None = None
    """Learner updates between target network copies (preset: 100 classic, 2,500 Atari)."""
    samples_per_insert: float | None = None
    """Rate limit: actors wait while the steps they inserted exceed those the learner sampled
    (sequences x (seq_len - overlap)) divided by this (plus one unroll per actor); 0 = no limit,
    the actors run free (preset: 16 classic, 0 Atari)."""
    priority_eta: float = 0.9
    """A sequence's priority: eta * max + (1 - eta) * mean of its |TD errors|."""
    priority_alpha: float = 0.9
    """How much priorities shape sampling (0: uniform)."""
    priority_beta: float = 0.6
    """Importance-sampling exponent, annealed to 1 over the run's expected learner updates."""
    max_grad_norm: float | None = None
    """Gradient norm clip (preset: 10 classic, 40 Atari)."""
    save_replay: bool = False
    """Also save the replay table with each checkpoint (`replay.npz` in the run folder), so
    that a resumed run continues with it. Without it a resumed run refills the table for
    `learning_starts` sequences before it learns again."""

    @property
    def num_envs(self) -> int:
        """Envs of all actors together (of a resolved config)."""
        return self.actors * self.envs_per_actor  # type: ignore[operator]


PRESETS = Presets(Config, {
    "classic": dict(
        total_steps=200_000, actors=4, envs_per_actor=4, eps_base=0.1, lstm=64, hidden=(64,),
        seq_len=20, overlap=10, burn_in=10, n_step=5, gamma=0.99, learning_rate=1e-3,
        anneal_lr=True, buffer_size=5_000, batch_size=32, learning_starts=100, target_update=100,
        max_grad_norm=10.0, samples_per_insert=16.0,
    ),
    "atari": dict(
        total_steps=50_000_000, actors=8, envs_per_actor=16, eps_base=0.4, lstm=512, hidden=(),
        seq_len=80, overlap=40, burn_in=40, n_step=5, gamma=0.997, learning_rate=1e-4,
        anneal_lr=False, buffer_size=10_000, batch_size=64, learning_starts=1_000,
        target_update=2_500, max_grad_norm=40.0, samples_per_insert=0.0,
    ),
})  # fmt: skip
"""Per env family. Atari: R2D2's published settings (LSTM 512 on the Nature CNN, sequences of 80
overlapping by 40, burn-in 40, 5-step returns, gamma 0.997, Adam 1e-4, batch 64, target update
every 2,500 updates, priority exponent 0.9, importance-sampling exponent 0.6, eta 0.9), with 8
actors of 16 envs in place of 256 actors and a table of 10,000 sequences in place of 4M
observations (a sequence stores its 81 observations whole: with 4-frame stacks 2.3 MB each);
not yet measured here. Classic control: sequences of 20 with burn-in 10, an LSTM of 64, epsilons
from 0.1, actors held to 16 sampled steps per inserted one, the learning rate annealed to 0 over
200k steps. On CartPole-v1 the last 20 training episodes averaged 500.0 for seeds 2, 4 and 5
(at 150k steps: 485.1, 500.0, 500.0 and 319.2; at 100k without annealing 431; see
docs/results.md)."""


def resolve(config: Config) -> Config:
    """Fill the preset and check every field; raise ValueError before any work starts."""
    for name in ("actors", "envs_per_actor"):  # before the preset could hide a bad value
        value = getattr(config, name)
        if value is not None and value <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")
    config = resolve_env(config, PRESETS, QNetwork.check_spaces)
    check_positive(config, "actors", "envs_per_actor", "unroll", "lstm", "seq_len", "n_step")
    check_positive(config, "learning_rate", "buffer_size", "batch_size", "target_update")
    check_positive(config, "max_grad_norm", "max_batch", "eps_base", "num_threads")
    c: Any = config  # every preset field is set from here on
    if not 0 <= c.overlap < c.seq_len:
        raise ValueError(f"--overlap must be in [0, --seq-len={c.seq_len}), got {c.overlap}")
    if not 0 <= c.burn_in < c.seq_len:
        raise ValueError(
            f"--burn-in ({c.burn_in}) must be >= 0 and smaller than --seq-len ({c.seq_len}): "
            "the learner needs steps after the burn-in to train on"
        )
    if c.buffer_size < max(c.batch_size, c.num_envs):
        raise ValueError(
            f"--buffer-size ({c.buffer_size} sequences) is smaller than a batch (--batch-size "
            f"{c.batch_size}) or the number of envs ({c.num_envs}); make it larger"
        )
    if not 0 <= c.learning_starts <= c.buffer_size:
        raise ValueError(
            f"--learning-starts must be in [0, --buffer-size], got {c.learning_starts}"
        )
    apex.check_rate_limit(c)
    if c.eps_base > 1 or c.eps_alpha < 0:
        raise ValueError("--eps-base must be in (0, 1] and --eps-alpha >= 0")
    for name in ("priority_eta", "priority_alpha", "priority_beta"):
        if not 0 <= getattr(c, name) <= 1:
            raise ValueError(
                f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(c, name)}"
            )
    return fill_log_every(actor_learner.resolve_actors(config), 1000)


def rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """R2D2's value rescaling h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1) - 1) + eps * x


def unrescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """The inverse of `rescale`."""
    root = (torch.sqrt(1 + 4 * eps * (x.abs() + 1 + eps)) - 1) / (2 * eps)
    return torch.sign(x) * (root**2 - 1)


def nstep_targets(q: torch.Tensor, q_target: torch.Tensor, batch: SequenceBatch, n_step: int,
                  gamma: float, rescaled: bool) -> torch.Tensor:  # fmt: skip
    """Double-Q n-step targets, (B, L), of every step of B sequences of L steps, from the online
    and target networks' Q at the L + 1 observations of each, (B, L + 1, actions). The returns stop
    at the sequence's end, where a terminated episode bootstraps nothing."""
    dev = q.device
    rewards = torch.as_tensor(batch.rewards, device=dev)
    seq_len = rewards.shape[1]
    length = torch.as_tensor(batch.mask.sum(1), device=dev)[:, None]  # (B, 1)
    terminal = torch.as_tensor(batch.terminated.any(1), device=dev)[:, None]
    padded = nn.functional.pad(rewards, (0, n_step))
    returns = sum(gamma**k * padded[:, k : k + seq_len] for k in range(n_step))
    t = torch.arange(seq_len, device=dev)[None]
    boot = torch.minimum(t + n_step, length)  # the observation each step bootstraps from
    discount = torch.where((boot == length) & terminal, 0.0, gamma ** (boot - t).float())
    best = q.argmax(-1, keepdim=True)
    value = q_target.gather(-1, best)[..., 0].gather(1, boot)
    if rescaled:
        return rescale(returns + discount * unrescale(value))
    return returns + discount * value


def recurrent_policy(net: RecurrentQNetwork, epsilons: torch.Tensor,
                     generator: torch.Generator) -> Any:  # fmt: skip
    """`net` as a recurrent `PolicyFn`: epsilon-greedy actions, each row with its actor's
    epsilon, and the state (h, c) the network had before this step (recorded by the actors);
    plus the state after it."""

    def policy(obs: torch.Tensor, actor_ids: torch.Tensor, env_ids: torch.Tensor,
               state: tuple[torch.Tensor, torch.Tensor]) -> Any:  # fmt: skip
        q, after = net.unroll(obs[None], state)
        actions = epsilon_greedy(q[0], epsilons[actor_ids], generator)
        return {"actions": actions, "h": state[0], "c": state[1]}, after

    return policy


class R2D2(QLearner):
    """The recurrent dueling Q-network served epsilon-greedily per actor (the server keeps each
    env's LSTM state), its target network and Adam, fed by a sequence table."""

    tunable = tunables(learning_rate=POSITIVE, gamma=UNIT, max_grad_norm=POSITIVE,
                       priority_eta=UNIT)  # fmt: skip
    steps_per_update = None  # a replay table: the run ends on its env steps

    def __init__(self, config: Config, obs_space: Any, act_space: Any, device: torch.device):
        super().__init__(config, obs_space, act_space, device, target_every=config.target_update)
        if isinstance(self.target.core, nn.LSTM):  # a deep copy's weights lie apart, which
            self.target.core.flatten_parameters()  # cuDNN would compact at every call
        eps = apex.actor_epsilons(config.actors, config.eps_base, config.eps_alpha)
        self.epsilons = torch.as_tensor(eps, dtype=torch.float32, device=device)
        self.state_size = config.lstm
        self.outputs = {"h": ((config.lstm,), np.float32), "c": ((config.lstm,), np.float32)}
        self.generator = torch.Generator(device).manual_seed(config.seed)
        self.policy = recurrent_policy(self.net, self.epsilons, self.generator)

    def make_net(self, config: Any, obs_space: Any, act_space: Any) -> nn.Module:
        return RecurrentQNetwork(obs_space, act_space, config.hidden, config.lstm, config.core)

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        return adam(params, self.config.learning_rate, self.device)

    def local_policy(self) -> Any:
        return functools.partial(apex.local_q_policy, epsilons=self.epsilons.cpu(),
                                 make=recurrent_policy)  # fmt: skip

    def make_channel(self, obs_space: Any, act_space: Any) -> SequenceChannel:
        """The prioritized sequence table, each actor's envs owning rows of it."""
        c = self.config
        table = SequenceReplay(
            c.buffer_size, tuple(obs_space.shape), obs_space.dtype, (), np.int64, c.num_envs,
            c.lstm, seq_len=c.seq_len, overlap=c.overlap, burn_in=c.burn_in, prioritized=True,
            alpha=c.priority_alpha, beta=c.priority_beta, beta_steps=expected_updates(c),
            seed=c.seed,
        )  # fmt: skip
        self.replay = SequenceChannel(table, c.envs_per_actor, c.learning_starts, c.batch_size,
                                      c.samples_per_insert or None,
                                      slack=c.actors * c.envs_per_actor * c.unroll)  # fmt: skip
        return self.replay

    def notes(self) -> list[str]:
        return [apex.rate_note(self.config, "steps")]

    def update(self, batch: SequenceBatch) -> dict[str, float]:
        c, dev = self.config, self.device
        burn = c.burn_in
        obs = torch.as_tensor(batch.obs, device=dev).transpose(0, 1)  # (L + 1, B, ...)
        state = tuple(torch.as_tensor(x, device=dev) for x in batch.hidden)
        first = torch.as_tensor(batch.first, device=dev)
        with torch.no_grad():
            q_target, _ = self.target.unroll(obs, state)  # type: ignore[operator]
        if burn:  # gradients stop at the burn-in's end, except where a sequence begins an episode
            q_head, warm = self.net.unroll(obs[:burn], state)  # type: ignore[operator]
            warm = tuple(torch.where(first[:, None], s, s.detach()) for s in warm)
            q_rest, _ = self.net.unroll(obs[burn:], warm)  # type: ignore[operator]
            q = torch.cat([q_head, q_rest]).transpose(0, 1)  # (B, L + 1, actions)
        else:
            q = self.net.unroll(obs, state)[0].transpose(0, 1)  # type: ignore[operator]
        with torch.no_grad():
            y = nstep_targets(q.detach(), q_target.transpose(0, 1), batch, c.n_step,
                              self.hp.gamma, c.value_rescaling)  # fmt: skip
        actions = torch.as_tensor(batch.actions, device=dev).long()
        q_taken = q[:, :-1].gather(-1, actions[..., None])[..., 0]
        seq_len = actions.shape[1]
        late = torch.arange(seq_len, device=dev)[None] >= burn
        trained = torch.as_tensor(batch.mask, device=dev) & (late | first[:, None])
        td = torch.where(trained, q_taken - y, 0.0)
        weights = torch.as_tensor(batch.weights, device=dev)[:, None]
        loss = (weights * td.pow(2)).sum() / (len(td) * (seq_len - burn))
        self.optimize(loss, tau=1.0)
        abs_td, mask = td.detach().abs().cpu().numpy(), trained.cpu().numpy()
        self.replay.update_priorities(batch.indices, mixed_priority(abs_td, mask,
                                                                    self.hp.priority_eta))  # fmt: skip
        return {"losses/td_loss": loss.item(), "losses/q_values": q_taken[trained].mean().item(),
                "charts/replay_size": len(self.replay.buffer)}  # fmt: skip

    def greedy(self, device: torch.device) -> Any:
        """(observations, starts) -> greedy actions, carrying each env's LSTM state between
        calls (zeroed where `starts` flags a new episode)."""
        net = self.net.to(device).eval()
        carry: list[Any] = []

        @torch.no_grad()
        def policy(obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
            if not carry:
                carry.extend(torch.zeros(len(obs), net.size, device=device) for _ in range(2))
            keep = torch.as_tensor(~np.asarray(starts, np.bool_), device=device)[:, None]
            h, c = (s * keep for s in carry)
            q, carry[:] = net.unroll(torch.as_tensor(obs, device=device)[None], (h, c))
            return q[0].argmax(-1).cpu().numpy()

        return policy


def expected_updates(config: Config) -> int:
    """The learner updates of a run held to `samples_per_insert` (1 per sampled batch where it
    is 0): the importance-sampling exponent reaches 1 at the last. A sequence brings
    `seq_len - overlap` new env steps."""
    per_step = (config.samples_per_insert or 1) / ((config.seq_len - config.overlap)
                                                   * config.batch_size)  # fmt: skip
    return max(int(config.total_steps * per_step), 1)


class Trainer(actor_learner.ActorLearnerTrainer):
    """R2D2: Ape-X's actors and epsilons, the server keeping each env's LSTM state, a sequence
    table, the recurrent learner with burn-in."""

    make_learner = R2D2
