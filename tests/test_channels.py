"""The channels between actors and learner: Ape-X's actor-side n-step priorities against
hand-computed values and against what the replay table stores, and per-actor rows of the table
adding up to whole steps."""

from __future__ import annotations

import threading

import numpy as np

from onebox.replay import ReplayBuffer
from onebox.sampling import Rollout
from onebox.sampling.channels import ReplayChannel, nstep_td_errors


def test_nstep_td_errors_hand_computed() -> None:
    # 2-step returns, gamma 0.5; Q(s_t) = [t, 10 + t], actions 0; truncated at 1 (final max Q
    # 100), terminated at 3.
    q = np.array([[[t, 10.0 + t]] for t in range(5)])
    final_q = np.zeros((5, 1, 2))
    final_q[1, 0] = [100.0, 0.0]
    rewards = np.array([[1.0], [2.0], [3.0], [4.0], [5.0]])
    truncated = np.array([[False], [True], [False], [False], [False]])
    terminated = np.array([[False], [False], [False], [True], [False]])
    td = nstep_td_errors(q, np.zeros((5, 1), np.int64), rewards, terminated, truncated, final_q,
                         steps=3, n_step=2, gamma=0.5)  # fmt: skip
    # t=0: 1 + 0.5 * 2 + 0.25 * 100 - 0 (the episode was cut at 1: bootstrap from its final obs)
    # t=1: 2 + 0.5 * 100 - 1;  t=2: 3 + 0.5 * 4 (terminated at 3: no bootstrap) - 2
    assert td[:, 0].tolist() == [27.0, 51.0, 3.0]


def unroll(obs: np.ndarray, rewards: np.ndarray, terminated: np.ndarray) -> Rollout:
    """An unroll of 1-d observations whose Q-values are (obs, 2 * obs); every action is 1."""
    t, n = rewards.shape
    q = np.stack([obs, 2 * obs], -1).astype(np.float32)
    nxt = np.concatenate([obs[1:], obs[-1:] + 1])
    return Rollout(
        obs=obs[..., None], actions=np.ones((t, n), np.int64), rewards=rewards,
        terminated=terminated, truncated=np.zeros((t, n), np.bool_),
        starts=np.zeros((t, n), np.bool_), versions=np.zeros((t, n), np.int64),
        final_obs=nxt[..., None], next_obs=nxt[-1][..., None], outputs={"q": q},
        final={"q": np.zeros_like(q)}, state=None, returns=[], lengths=[],
    )  # fmt: skip


def test_replay_channel_priorities_match_the_tables_n_step_transitions() -> None:
    gamma, n_step, t_len = 0.9, 3, 4
    buffer = ReplayBuffer(64, (1,), np.float32, (), np.int64, 4, n_step=n_step, gamma=gamma,
                          prioritized=True, alpha=1.0)  # fmt: skip
    channel = ReplayChannel(buffer, envs_per_actor=2, learning_starts=1, batch_size=1)
    stop = threading.Event()
    rng = np.random.default_rng(0)
    step = 0
    for _ in range(3):
        for actor in (1, 0):
            obs = (np.arange(step, step + t_len)[:, None] + np.array([0.0, 0.5])).astype(np.float32)
            rewards = rng.normal(size=(t_len, 2)).astype(np.float32)
            terminated = rng.random((t_len, 2)) < 0.2
            channel.put(actor, unroll(obs, rewards, terminated), stop)
        step += t_len
    assert len(buffer) == 0  # put only queues: the learner's thread inserts
    channel.insert_queued()
    # Two unrolls per actor are in (the third is held for its successor's Q-values); a
    # transition's priority is |R + d * max Q(s') - Q(s, a)| with R and d as the table stores them.
    slots = buffer.live_indices()
    batch = buffer.get(slots)
    q_next_max = 2 * batch.next_obs[:, 0]
    td = batch.returns + batch.discounts * q_next_max - 2 * batch.obs[:, 0]
    assert 32 - 4 * (n_step - 1) <= len(slots) <= 32  # 4 envs x 8 steps, up to 2 each staged
    np.testing.assert_allclose(buffer.priorities.tree.get(slots), np.abs(td) + 1e-6, rtol=1e-5)


def test_adding_each_actors_rows_equals_adding_whole_steps() -> None:
    rng = np.random.default_rng(1)
    whole = ReplayBuffer(40, (2,), np.float32, (), np.int64, 4, n_step=2, gamma=0.9)
    parts = ReplayBuffer(40, (2,), np.float32, (), np.int64, 4, n_step=2, gamma=0.9)
    for _ in range(12):
        obs, nxt = rng.normal(size=(2, 4, 2)).astype(np.float32)
        actions, rewards = rng.integers(3, size=4), rng.normal(size=4)
        term, trunc = rng.random(4) < 0.2, rng.random(4) < 0.1
        whole.add(obs, actions, rewards, term, trunc, nxt)
        for rows in (np.array([2, 3]), np.array([0, 1])):  # actor 1 first, then actor 0
            parts.add(obs[rows], actions[rows], rewards[rows], term[rows], trunc[rows], nxt[rows],
                      envs=rows)  # fmt: skip
    a, b = whole.get(whole.live_indices()), parts.get(parts.live_indices())
    for field in ("obs", "actions", "returns", "next_obs", "discounts"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


def test_a_restarted_actors_new_episodes_cut_the_held_ones() -> None:
    gamma, n_step, t_len = 0.5, 3, 4
    buffer = ReplayBuffer(64, (1,), np.float32, (), np.int64, 2, n_step=n_step, gamma=gamma,
                          prioritized=True)  # fmt: skip
    channel = ReplayChannel(buffer, envs_per_actor=2, learning_starts=1, batch_size=1)
    stop, no_ends = threading.Event(), np.zeros((t_len, 2), np.bool_)
    rewards = np.ones((t_len, 2), np.float32)
    obs = (np.arange(t_len)[:, None] + np.array([0.0, 0.5])).astype(np.float32)
    channel.put(0, unroll(obs, rewards, no_ends), stop)
    after = unroll(obs + t_len, rewards, no_ends)
    after.starts[0] = [True, False]  # env 0 begins a new life; env 1 goes on
    channel.put(0, after, stop)
    channel.put(0, unroll(obs + 2 * t_len, rewards, no_ends), stop)
    channel.insert_queued()
    batch = buffer.get(buffer.live_indices())
    env0 = batch.obs[:, 0] % 1 == 0
    # env 0's first life ends at the cut (next obs 4), truncated: no return reaches past it
    life = env0 & (batch.obs[:, 0] < t_len)
    assert batch.next_obs[life, 0].tolist() == [3.0, 4.0, 4.0, 4.0]
    assert batch.discounts[life].tolist() == [gamma**3, gamma**3, gamma**2, gamma]
    # env 1's episode goes on through the unroll boundary
    assert batch.next_obs[~env0 & (batch.obs[:, 0] == 3.5), 0].tolist() == [6.5]
