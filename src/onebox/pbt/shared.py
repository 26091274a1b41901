"""A population's members on one engine (`onebox pbt ... --engine shared`): every member's envs
in one env pool, stepped together, and one batched forward pass choosing all their actions
(`onebox.nn.stacked.StackedPolicy`: the members' networks stacked, one vmapped call); each
member then updates on its own share of the rollout, exactly the share its own sampler would
have given it (its envs, their episodes), so a member is still a run of its learner. Where the
learner has a batched update (`update_together`: PPO's), the members' updates are one too: one
stacked forward and backward per minibatch, each member's own optimizer step after it.

    one pool of N x E envs --> Sampler(StackedPolicy of the N nets) --> rollout (T, N x E)
                                                                      |-> member k: envs kE..(k+1)E-1

The members step in lockstep: `advance` plays one rollout for all (and makes their batched
update), then each member's step takes its share (`SharedLane`, the trainer's `Lane`) and its
update's stats (or updates on it); a member that asks for a share twice before the next
`advance` is an error, not a stale rollout. Member k's envs are seeded as its own pool would
be (the seeds its trainer took from the run's `EnvSeeds`).

What fits (`unfit` says why not): the on-policy actor-critics (PPO, A2C) with feed-forward
networks, discrete actions, the sync sampler, no `--compile` and no observation or reward
normalizer (whose statistics are each member's own). The others run each member on its own
pools (`--engine own`).
"""

from __future__ import annotations

from typing import Any

import torch
from gymnasium import spaces

import onebox.envs
from onebox.algos import driver
from onebox.algos.common import parse_env_options
from onebox.algos.onpolicy import ActorCriticLearner, OnPolicyTrainer
from onebox.algos.trainer import Trainer
from onebox.nn.stacked import StackedPolicy
from onebox.run.timing import TimeSplit
from onebox.sampling import Rollout, Sampler


def unfit(config: Any, module: Any, action_space: spaces.Space) -> str | None:
    """Why `config`'s members cannot share one engine, or None when they can."""
    trainer = module.Trainer
    if not (issubclass(trainer, OnPolicyTrainer)
            and issubclass(trainer.make_learner, ActorCriticLearner)):  # fmt: skip
        return f"{config.LEARNER} is not an on-policy actor-critic (PPO, A2C)"
    if config.lstm is not None:
        return "--lstm: a recurrent network's state is not stacked"
    if config.sampler != "sync":
        return f"--sampler {config.sampler}: the shared engine steps every env at once (sync)"
    if config.compile:
        return "--compile compiles one network's forward, not the stacked one"
    if config.normalize_obs or config.normalize_reward:
        return "--normalize-obs/--normalize-reward: each member keeps its own statistics"
    if not isinstance(action_space, spaces.Discrete):
        return f"{action_space}: the stacked policy draws discrete actions"
    return None


class SharedEnvs:
    """One env pool of `population` x `config.num_envs` envs and the sampler that plays it for
    the members (`bind` them once made, each with its `lanes[k]`); the batched forward runs on
    `threads` torch threads (the members' updates, on as many threads of their own, wait for
    the rollout, so the two never run at once)."""

    def __init__(self, config: Any, population: int, threads: int = 1) -> None:
        self.config, self.envs, self.threads = config, config.num_envs, threads
        self.pool = onebox.envs.make(config.env, population * config.num_envs,
                                     num_threads=config.num_threads, seed=config.seed,
                                     autoreset_mode="SameStep",
                                     **parse_env_options(config.env_options))  # fmt: skip
        self.lanes = [SharedLane(self, k) for k in range(population)]
        self.timer = TimeSplit()
        """The pool's and the stacked policy's time (`env`, `inference`)."""
        self.policy: StackedPolicy | None = None
        self.sampler: Sampler | None = None
        self.seeds: dict[int, int] = {}  # each lane's first env seed, as its trainer took them
        self.rollout: Rollout | None = None
        self.fresh: set[int] = set()  # the lanes whose share of `rollout` is still to be taken
        self.members: list[Trainer] = []
        self.batched = False
        """Whether the members update together (`--updates batched`, with the learner's
        `update_together`)."""
        self.learned: dict[int, dict[str, float]] = {}  # each lane's stats of the last `learn`

    def bind(self, members: list[Trainer]) -> None:
        """Act with the members' networks (member k's for lane k's envs)."""
        learner = members[0].learner
        self.members = list(members)
        self.batched = self.config.updates == "batched"
        self.policy = StackedPolicy([m.learner.net for m in members], self.envs,
                                    learner.accel.autocast)  # fmt: skip
        self.sampler = Sampler(self.pool, self.policy, self.config.num_steps,
                               device=learner.device, timer=self.timer)  # fmt: skip

    def reset(self, lane: int, seed: int) -> None:
        """Lane `lane`'s envs reset from `seed` on; the pool resets once every lane has."""
        self.seeds[lane] = seed
        if len(self.seeds) == len(self.lanes):
            assert self.sampler is not None, "bind the members before starting them"
            self.sampler.reset(seed=[self.seeds[k] + i for k in range(len(self.lanes))
                                     for i in range(self.envs)])  # fmt: skip
            self.seeds = {}

    def advance(self) -> None:
        """Play one rollout of every env with every member's current network; where the
        members update together (`batched`), their update on it too (`learn`)."""
        assert self.sampler is not None and self.policy is not None
        self.policy.refresh()
        threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            self.rollout = self.sampler.collect()
            self.fresh = set(range(len(self.lanes)))
            if self.batched:
                self._learn_together()
        finally:
            torch.set_num_threads(threads)

    def _learn_together(self) -> None:
        """Every member's update on its share of the rollout, batched (the learner's
        `update_together`: one stacked forward and backward per minibatch), each member's
        schedules read at its progress first (`driver.schedule`, as its step would)."""
        assert self.rollout is not None
        for member in self.members:
            driver.schedule(member)
        learners = [m.learner for m in self.members]
        shares = [self.rollout.envs(lane.first, lane.stop) for lane in self.lanes]
        with self.timer("learn"), learners[0].autocast():
            stats = learners[0].update_together(learners, shares)
        self.learned = dict(enumerate(stats))

    def learn(self, lane: int, rollout: Rollout) -> dict[str, float]:
        """Lane `lane`'s update on its share `rollout`: its stats from the batched update of
        the last `advance`, or (not `batched`) its own learner's update now."""
        if not self.batched:
            return self.members[lane].learner.update(rollout)
        return self.learned.pop(lane)

    def share(self, lane: int) -> Rollout:
        """Lane `lane`'s envs of the last rollout (views)."""
        if lane not in self.fresh or self.rollout is None:
            raise RuntimeError(
                f"member {lane} asked for a rollout before the shared engine played one "
                "(the members step in lockstep: the engine's advance, then one step each)"
            )
        self.fresh.remove(lane)
        return self.rollout.envs(self.lanes[lane].first, self.lanes[lane].stop)

    def close(self) -> None:
        self.pool.close()


class SharedLane:
    """Member `index`'s view of the shared engine: what its trainer's own sampler would be."""

    def __init__(self, shared: SharedEnvs, index: int) -> None:
        self.shared, self.index = shared, index
        self.single_observation_space = shared.pool.single_observation_space
        self.single_action_space = shared.pool.single_action_space
        self.first, self.stop = index * shared.envs, (index + 1) * shared.envs

    @property
    def episodes(self) -> SharedLane:
        return self

    def pop(self) -> tuple[list[float], list[int]]:
        """The episodes of this lane's envs finished since the last call."""
        assert self.shared.sampler is not None
        return self.shared.sampler.episodes.take(self.first, self.stop)

    def reset(self, seed: int) -> None:
        self.shared.reset(self.index, seed)

    def collect(self) -> Rollout:
        return self.shared.share(self.index)

    def learn(self, rollout: Rollout) -> dict[str, float]:
        return self.shared.learn(self.index, rollout)
