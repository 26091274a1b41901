"""Sampling: rollouts from an env pool and a policy, sync or double-buffered."""

from onebox.sampling.rollout import Rollout, bootstrapped_rewards, gae
from onebox.sampling.sampler import EpisodeTracker, Policy, Sampler

__all__ = ["EpisodeTracker", "Policy", "Rollout", "Sampler", "bootstrapped_rewards", "gae"]
