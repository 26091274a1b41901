"""Replay tables for off-policy learners: uniform or prioritized, n-step, frame-deduplicated.

    from onebox.replay import ReplayBuffer, SequenceReplay, ReplayBatch

    buf = ReplayBuffer(capacity, obs_shape, obs_dtype, action_shape, action_dtype, num_envs,
                       n_step=1, gamma=0.99, prioritized=False, alpha=0.6, beta=0.4,
                       beta_steps=1_000_000, frame_stack=0, seed=0)
    buf.add(obs, actions, rewards, terminated, truncated, next_obs, priorities=None)
    batch = buf.sample(512)          # ReplayBatch: obs, actions, returns, next_obs, discounts,
                                     # weights, indices (numpy arrays)
    buf.update_priorities(batch.indices, td_errors)   # prioritized only
    buf.save("replay.npz"); buf.load("replay.npz")      # or state_dict() / load_state_dict()
    len(buf); buf.get(buf.live_indices())   # the transitions held; every one of them, in order

`add` takes one env step of all `num_envs` envs (row i is env i): `next_obs` is the true next
observation, the final one where an episode ended (Gymnasium's `final_obs`). n-step returns are
computed at insertion: a transition leaves its env's staging after n steps, or when the episode
ends (terminated: discount 0; truncated: discount gamma**k, bootstrapping from the final
observation). `returns` is the discounted reward sum, `discounts` gamma**k (0 after a
termination), so a target is `returns + discounts * max_a Q(next_obs, a)`. Each env owns
`capacity // num_envs` slots (the capacity is rounded down to a multiple of `num_envs`), first in
first out. `sample` draws with replacement; a batch larger than the capacity is an error.

Prioritized tables (`prioritized=True`) sample in proportion to priority**alpha, stratified over
`batch_size` equal segments of the total; new transitions get the largest priority seen, unless
`add(..., priorities=td)` gives the actor's own (Ape-X). `update_priorities(indices, td)` sets
(|td| + eps)**alpha (`eps=1e-6`). Importance weights are (N P(i))**-beta normalised by their maximum, with
beta annealed linearly from `beta` to 1 over `beta_steps` calls to `sample`.

With `frame_stack=K`, observations are (K, H, W) stacks stored as single frames in one ring per
env and rebuilt at sampling time, exactly as the env made them (episode starts included): about
a quarter of the memory of stacked storage. `nbytes` is the memory held.

`SequenceReplay` stores fixed-length overlapping sequences with the recurrent state at their
start, for R2D2 (see `onebox.replay.sequence`). Both tables are `onebox.replay.table.Table`s:
one implementation of sampling, priority updates, `state_dict` and the .npz file.
"""

from onebox.replay.buffer import ReplayBatch, ReplayBuffer
from onebox.replay.sequence import SequenceBatch, SequenceReplay, mixed_priority

__all__ = ["ReplayBatch", "ReplayBuffer", "SequenceBatch", "SequenceReplay", "mixed_priority"]
