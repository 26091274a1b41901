"""Sampling: how env steps become the trajectories learners train on.

- The on-policy sampler (`sampler`): `Sampler` drives an env pool with a policy, sync or
  double-buffered, into fixed-length `Rollout`s (`rollout`, with the truncation bootstrap and GAE).
- The actor-learner loop's sampling side: actors (`actors`: threads, or processes) step their env
  pools and hand unrolls to a channel (`channels`: a FIFO or a replay table) that the learner
  takes batches from. They act through the central inference server (`inference`: a thread of
  the learner's process, or `server_process`: processes of their own), which process actors
  reach through shared memory (`actor_client`), or through a copy of the network of their own.
  `policies` holds the policy functions served or run and the weights actors reload;
  `env_states` a recurrent policy's state per env.

The package exports the on-policy sampler's names (`Sampler`, `Policy`, `EpisodeTracker`) and
the trajectory record's (`Rollout`, `gae`, `bootstrapped_rewards`).
"""

from onebox.sampling.rollout import Rollout, bootstrapped_rewards, gae
from onebox.sampling.sampler import EpisodeTracker, Policy, Sampler

__all__ = ["EpisodeTracker", "Policy", "Rollout", "Sampler", "bootstrapped_rewards", "gae"]
