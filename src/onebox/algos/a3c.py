"""A3C (Mnih et al. 2016): asynchronous actor-learners updating one shared model Hogwild-style.

    onebox train a3c --env CartPole-v1 --actors 2

`actors` worker processes each own a small env pool and a local copy of the network. A worker
copies the shared weights, plays `num_steps` steps in each of its envs (the `Sampler`), computes
the n-step actor-critic gradient of A2C's loss on its local copy, and applies it to the shared
model with a shared RMSprop (its statistics live in shared memory too, as in the paper), without
locks. The main process only watches: it logs the episodes and losses the workers send over a
queue, saves checkpoints, restarts a worker that dies (found through its process sentinel), and
on Ctrl-C or at the end stops the workers and saves. Resume continues from the checkpointed
weights, optimizer statistics and step count (the asynchronous interleaving itself cannot be
replayed).

With `--lstm H` the network has an LSTM core; each worker's sampler carries its envs' states
through its n-step segments, and the gradient replays each segment from its initial state.

Presets per env family set the run length, the envs per worker and the entropy bonus (`classic`:
500k steps, 8 envs and none, as A2C's; `atari`: 10M steps, 4 envs and 0.01, as the paper); the
learning rate anneals linearly to 0 over the run: the driver sets the run's progress in the
hyperparameters, which live in shared memory, and each worker loads them before each update (so
a value set on the running trainer reaches every worker's next update).
On CartPole-v1 the default run ended with a mean of the last 20 episodes of 500 for each of seeds
1-8; with 4 envs per worker it ended at 247 for seed 5, and with 4 envs and an entropy bonus of
0.01 at 359-422 (seeds 1 and 4).
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Any, ClassVar, Literal

import torch
from torch import multiprocessing as mp
from torch import nn

import onebox.envs
from onebox.algos import a2c, trainer
from onebox.algos.common import (
    check_lstm,
    check_positive,
    fill_log_every,
    greedy_policy,
    parse_env_options,
    probe_env,
    seed_everything,
)
from onebox.algos.onpolicy import ActorCriticLearner
from onebox.algos.trainer import EnvSeeds, Learner, Step
from onebox.nn.networks import ActorCritic
from onebox.run.config import Switch, TrainConfig
from onebox.run.presets import Presets
from onebox.sampling import Rollout, Sampler
from onebox.supervisor import FROM_WORKER, RestartLimitError, Supervisor, Worker


@dataclasses.dataclass
class Config(TrainConfig):
    """Train an agent with A3C: Hogwild worker processes sharing one model. Fields left unset
    come from the env family's preset."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"lstm"})

    preset: Literal["auto", "classic", "atari", "continuous"] = "auto"
    total_steps: int | None = None
    """Env steps to train for, summed over all actors (preset: 500k classic, 10M Atari, 1M
    continuous)."""
    actors: int = 2
    """Worker processes, each with its own env pool and local network."""
    envs_per_actor: int | None = None
    """Envs in each worker's pool (preset: 8, as A2C's 8 envs, or 4 Atari)."""
    num_steps: int = 5
    """Steps per env between a worker's updates: the n of the n-step returns (t_max)."""
    learning_rate: float = 7e-4
    """Shared RMSprop learning rate."""
    anneal_lr: Switch = True
    rms_alpha: float = 0.99
    """RMSprop smoothing constant."""
    rms_eps: float = 1e-5
    """RMSprop epsilon."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 1.0
    """GAE lambda (1: plain n-step returns)."""
    norm_adv: bool = False
    """Normalize the advantages of each rollout."""
    ent_coef: float | None = None
    """Entropy bonus coefficient (preset: 0, or 0.01 Atari)."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Gradient norm clip, per worker update."""
    lstm: int | None = None
    """LSTM core size; None = feed-forward."""
    num_threads: int = 1
    """Env pool threads in each worker."""
    max_restarts: int = 10
    """Worker restarts allowed before the run fails (a worker that keeps dying is a bug)."""


PRESETS = Presets(Config, {
    "classic": dict(total_steps=500_000, envs_per_actor=8, ent_coef=0.0),
    "atari": dict(total_steps=10_000_000, envs_per_actor=4, ent_coef=0.01),
    "continuous": dict(total_steps=1_000_000, envs_per_actor=8, ent_coef=0.0),
})  # fmt: skip
"""Per env family; the fields left None in `Config` come from here."""


def resolve(config: Config) -> Config:
    """Check every field and the env; raise ValueError before any work starts."""
    if onebox.envs.backend_of(config.env) is None:
        onebox.envs.make(config.env)  # raises the unknown-id error with suggestions
    family, obs_space, act_space = probe_env(config.env, **parse_env_options(config.env_options))
    ActorCritic.check_spaces(obs_space, act_space)
    config = PRESETS.fill(config, config.preset if config.preset != "auto" else family)
    check_positive(config, "total_steps", "actors", "envs_per_actor", "num_steps")
    check_positive(config, "learning_rate", "rms_eps", "max_grad_norm", "num_threads")
    check_lstm(config.lstm)
    if config.max_restarts < 0:
        raise ValueError(f"--max-restarts must be >= 0, got {config.max_restarts}")
    if not 0 <= config.gamma <= 1 or not 0 <= config.gae_lambda <= 1:
        raise ValueError("--gamma and --gae-lambda must be in [0, 1]")
    if not 0 <= config.rms_alpha < 1:
        raise ValueError(f"--rms-alpha must be in [0, 1), got {config.rms_alpha}")
    if config.ent_coef < 0:
        raise ValueError(f"--ent-coef must be >= 0, got {config.ent_coef}")
    return fill_log_every(config, 1000)


# ---- the shared model ---------------------------------------------------------------------------


class A3C(Learner):
    """The shared actor-critic and its RMSprop (on the CPU: the workers share them in memory,
    with the hyperparameters). In a worker, `update` computes A2C's loss on the worker's own
    copy of the network (`local`), copies its gradient onto the shared model and steps the
    shared optimizer, without locks."""

    tunable = ActorCriticLearner.tunable
    local: ActorCritic | None = None
    """The worker's copy of the network (set in each worker)."""

    def __init__(self, config: Config, obs_space: Any, act_space: Any, device: torch.device):
        self.config = config
        self.net = ActorCritic(obs_space, act_space, lstm=config.lstm)
        self.optimizer = torch.optim.RMSprop(self.net.parameters(), lr=config.learning_rate,
                                             alpha=config.rms_alpha, eps=config.rms_eps)  # fmt: skip
        self.hp = self.make_hyperparams(config)
        self.hp.bind("learning_rate", self.optimizer)

    def attach(self, local: ActorCritic) -> None:
        """In a worker: its own copy of the network to compute gradients on, and this
        process's view of the shared optimizer bound to the shared learning rate."""
        self.local = local
        self.hp.bind("learning_rate", self.optimizer)

    def share(self) -> None:
        """Move the weights, the optimizer's statistics and the hyperparameters to shared
        memory, creating the statistics now (RMSprop would create them lazily, privately in
        each worker)."""
        self.net.share_memory()
        self.hp.share_memory()
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                state = self.optimizer.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["square_avg"] = torch.zeros_like(p)
                for value in state.values():
                    if torch.is_tensor(value):
                        value.share_memory_()

    def update(self, rollout: Rollout) -> dict[str, float]:
        local = self.local
        assert local is not None, "A3C's update runs in a worker, on its copy of the network"
        total, stats = a2c.loss(local, rollout, self.hp, self.config.norm_adv)
        local.zero_grad()
        total.backward()
        nn.utils.clip_grad_norm_(local.parameters(), self.hp.max_grad_norm)
        for mine, theirs in zip(local.parameters(), self.net.parameters(), strict=True):
            theirs.grad = mine.grad
        self.hp.apply()  # this process's view of the shared optimizer: the current rate
        self.optimizer.step()  # Hogwild: no lock around the shared weights
        return stats

    def greedy(self, device: torch.device) -> Any:
        return greedy_policy(self.net.to(device), device)

    def state_dict(self) -> dict[str, Any]:
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])


# ---- the workers --------------------------------------------------------------------------------

Report = tuple[int, int, list[float], list[int], dict[str, float] | None]
"""What a worker sends: (rank, global step, episode returns, episode lengths, mean losses)."""


def worker(
    rank: int,
    seed: int,
    config: Config,
    learner: A3C,
    steps: torch.Tensor,
    stop: torch.Tensor,
    reports: Any,
) -> None:
    """One actor-learner: copy the shared weights, play a rollout, push its gradient, repeat.

    `steps[rank]` counts the env steps of this rank (shared, one writer each), `stop[0]` tells it
    to stop; both are lock-free shared tensors, so a worker killed at any point leaves no lock
    held that the others or the main process would wait on. Its mean losses go out once the
    run's steps pass a multiple of `log_every`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C
    torch.set_num_threads(1)
    seed_everything(seed)
    envs = onebox.envs.make(config.env, config.envs_per_actor, num_threads=config.num_threads,
                            seed=seed, autoreset_mode="SameStep",
                            **parse_env_options(config.env_options))  # fmt: skip
    local = ActorCritic(envs.single_observation_space, envs.single_action_space, lstm=config.lstm)
    learner.attach(local)
    sampler = Sampler(envs, local, config.num_steps)
    sampler.reset(seed=seed)
    batch = config.envs_per_actor * config.num_steps
    sums: dict[str, float] = {}
    updates = 0
    with envs:
        while not stop[0] and int(steps.sum()) < config.total_steps:
            local.load_state_dict(learner.net.state_dict())
            stats = learner.update(sampler.collect())
            before = int(steps.sum())
            steps[rank] += batch
            step = before + batch
            updates += 1
            for key, value in stats.items():
                sums[key] = sums.get(key, 0.0) + value
            returns, lengths = sampler.episodes.pop()
            means = None
            if step // config.log_every > before // config.log_every:
                means = {key: value / updates for key, value in sums.items()}
                sums, updates = {}, 0
            if returns or means:
                reports.send((rank, step, returns, lengths, means))
    reports.close()


class Workers:
    """The worker processes, on a `Supervisor`: started, watched through their sentinels,
    restarted when they die (up to `max_restarts` in all), and stopped. Each sends its reports
    through its own pipe, so a worker killed in the middle of a message breaks nothing of the
    others'. Every start (restarts included) takes fresh env seeds from the run's `EnvSeeds`.
    """

    def __init__(self, config: Config, learner: A3C, step: int, seeds: EnvSeeds) -> None:
        self.config, self.learner, self.seeds = config, learner, seeds
        self.steps = torch.zeros(config.actors, dtype=torch.int64).share_memory_()
        self.steps[0] = step
        self.stop = torch.zeros(1, dtype=torch.bool).share_memory_()
        self.sup = Supervisor(mp.get_context("spawn"), worker, pipes=(FROM_WORKER,),
                              name="onebox-a3c", max_total_restarts=config.max_restarts)  # fmt: skip
        for rank in range(config.actors):
            self.sup.add(Worker(rank), *self._args(rank))

    def _args(self, rank: int) -> tuple:
        seed = self.seeds.take(self.config.envs_per_actor)
        return (rank, seed, self.config, self.learner, self.steps, self.stop)

    @property
    def restarts(self) -> int:
        """Worker restarts so far."""
        return self.sup.restarts

    @property
    def step(self) -> int:
        """Env steps so far, over all workers."""
        return int(self.steps.sum())

    @property
    def done(self) -> bool:
        return self.step >= self.config.total_steps

    def watch(self, timeout: float) -> list[Report]:
        """Wait up to `timeout` s for reports or exits; restart any worker that died before the
        end; return the reports received."""
        pipes = [w.conns[0] for w in self.sup.workers]
        ready = self.sup.wait(pipes, timeout)
        reports = self._receive([r for r in pipes if r in ready])
        for w in self.sup.workers:
            if not w.running and not self.stop[0] and not self.done:
                reports += self._receive(w.conns)
                try:
                    self.sup.restart(w, *self._args(w.index))
                except RestartLimitError as e:
                    raise RuntimeError(f"A3C {e} (--max-restarts)") from None
        return reports

    @staticmethod
    def _receive(readers: Any) -> list[Report]:
        out = []
        for reader in readers:
            try:
                while not reader.closed and reader.poll():
                    out.append(reader.recv())
            except (EOFError, OSError):  # the worker exited (possibly mid-message)
                pass
        return out

    def close(self) -> list[Report]:
        """Stop the workers (killing those still running after 30 s) and return their last
        reports."""
        self.stop[0] = True
        reports: list[Report] = []

        def drain() -> None:  # a worker blocked on a full pipe can finish
            reports.extend(self._receive(c for w in self.sup.workers for c in w.conns))

        self.sup.shutdown(timeout=30, drain=drain)
        return reports


# ---- the trainer --------------------------------------------------------------------------------


class Trainer(trainer.Trainer):
    """A3C's Hogwild workers on the shared learner; one step watches them for a tenth of a
    second, gathering their reports (episodes, mean losses) and the env steps they made."""

    make_learner = A3C

    def __init__(self, config: Config, seeds: EnvSeeds) -> None:
        super().__init__()
        self.config, self.seeds = config, seeds
        self.total_steps = config.total_steps
        self.num_envs = config.actors * config.envs_per_actor
        self.batch = config.envs_per_actor * config.num_steps
        seed_everything(config.seed)
        with onebox.envs.make(config.env, 1, **parse_env_options(config.env_options)) as probe:
            spaces = (probe.single_observation_space, probe.single_action_space)
        self.learner = A3C(config, *spaces, torch.device("cpu"))
        self.workers: Workers | None = None
        self.stopped = False

    def start(self) -> None:
        self.learner.share()
        self.workers = Workers(self.config, self.learner, self.global_step, self.seeds)

    def _account(self, reports: list[Report]) -> Step:
        """The reports' episodes and newest mean losses; the counters from the workers'."""
        assert self.workers is not None
        stats: dict[str, float] = {}
        returns: list[float] = []
        lengths: list[int] = []
        for _rank, _step, r, n, losses in reports:
            returns += r
            lengths += n
            stats = losses or stats
        self.global_step = self.workers.step
        self.updates = self.global_step // self.batch
        return Step(stats, returns, lengths)

    def step(self) -> Step:
        assert self.workers is not None
        return self._account(self.workers.watch(timeout=0.1))

    def charts(self) -> dict[str, float]:
        return {"charts/actor_restarts": self.workers.restarts} if self.workers else {}

    def finish(self) -> Step:
        assert self.workers is not None
        last = self._account(self.workers.close())
        self.stopped = True
        return last

    def close(self) -> None:
        if self.workers is not None and not self.stopped:
            self.workers.close()
        self.stopped = True
