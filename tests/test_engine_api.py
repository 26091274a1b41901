"""Behaviour of the native env engine through `onebox.envs.make` (a `NativeEnvPool`).

Checked against Gymnasium's `SyncVectorEnv` where Gymnasium defines the behaviour (spaces, autoreset
modes, time limits), and against the engine's own sync API for the async API, seeding and threading
(results must not depend on threads, batch sizes or the order envs are sent in).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.spaces import Box, Discrete, MultiDiscrete
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv

import onebox.envs
from onebox.envs import EnvPool, NativeEnvPool
from onebox.envs.base import cap_options, time_limit

ENV = "CartPole-v1"
# Enough CartPole envs that the engine's cost estimate sends the work to its worker threads
# (it runs a call inline below ~40 us of estimated work; CartPole steps take ~20-40 ns).
MANY = 8192
INLINE_NS = 40e3


def make(num_envs: int = 4, **kwargs) -> NativeEnvPool:
    pool = onebox.envs.make(ENV, num_envs, **kwargs)
    assert isinstance(pool, NativeEnvPool)
    return pool


@contextlib.contextmanager
def opened(num_envs: int = 4, **kwargs) -> Iterator[NativeEnvPool]:
    """A pool closed on exit (not `with make(...)`, so that only one test relies on that)."""
    pool = make(num_envs, **kwargs)
    try:
        yield pool
    finally:
        pool.close()


def random_actions(steps: int, num_envs: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2, size=(steps, num_envs), dtype=np.int64)


def sync_reference(
    num_envs: int, seed: int, actions: np.ndarray, **kwargs
) -> dict[str, np.ndarray]:
    """Results of a sync pool, indexed [t, env]: t = 0 is the reset, t = k + 1 follows actions[k]."""
    with opened(num_envs, seed=seed, **kwargs) as pool:
        obs, _ = pool.reset(seed=seed)
        out = {
            "obs": [obs],
            "reward": [np.zeros(num_envs)],
            "terminated": [np.zeros(num_envs, bool)],
            "truncated": [np.zeros(num_envs, bool)],
            "final": [np.zeros(num_envs, bool)],
            "final_obs": [np.zeros_like(obs)],
        }
        for a in actions:
            obs, reward, terminated, truncated, info = pool.step(a)
            final = info.get("_final_obs", np.zeros(num_envs, bool))
            final_obs = np.zeros_like(obs)
            for i in np.flatnonzero(final):
                final_obs[i] = info["final_obs"][i]
            for key, value in zip(
                out, (obs, reward, terminated, truncated, final, final_obs), strict=True
            ):
                out[key].append(value)
    return {k: np.stack(v) for k, v in out.items()}


def assert_rows_equal(
    ref: dict[str, np.ndarray], t: np.ndarray, ids: np.ndarray, got: dict
) -> None:
    for key, value in got.items():
        np.testing.assert_array_equal(value, ref[key][t, ids], err_msg=f"{key} of envs {ids}")


# ---- Gymnasium VectorEnv API ------------------------------------------------------------------


def test_pool_is_a_gymnasium_vector_env():
    n = 5
    pool = make(n)
    gym_env = gym.make(ENV)
    assert isinstance(pool, VectorEnv) and isinstance(pool, EnvPool)
    assert pool.num_envs == n and pool.batch_size == n
    assert pool.single_observation_space == gym_env.observation_space
    assert pool.single_observation_space.dtype == np.float32
    assert pool.single_action_space == Discrete(2)
    assert pool.observation_space == Box(
        np.tile(gym_env.observation_space.low, (n, 1)),
        np.tile(gym_env.observation_space.high, (n, 1)),
        (n, 4),
        np.float32,
    )
    assert pool.action_space == MultiDiscrete([2] * n)
    assert pool.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    assert pool.spec.id == ENV and pool.spec.max_episode_steps == 500
    assert pool.spec.reward_threshold == gym_env.spec.reward_threshold

    obs, info = pool.reset(seed=0)
    assert obs.shape == (n, 4) and obs.dtype == np.float32 and obs in pool.observation_space
    np.testing.assert_array_equal(info["env_id"], np.arange(n))
    obs, reward, terminated, truncated, info = pool.step(pool.action_space.sample())
    assert obs in pool.observation_space
    assert reward.shape == (n,) and reward.dtype == np.float64
    assert terminated.shape == truncated.shape == (n,)
    assert terminated.dtype == truncated.dtype == np.bool_
    np.testing.assert_array_equal(reward, np.ones(n))
    pool.close()


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, "SameStep", "same_step"])
def test_same_step_mode_metadata(mode):
    with opened(2, autoreset_mode=mode) as pool:
        assert pool.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        assert pool.autoreset_mode == AutoresetMode.SAME_STEP


def test_context_manager_closes_the_pool():
    with make(3) as pool:
        pool.reset(seed=0)
        pool.step(np.zeros(3, np.int64))
        assert not pool.closed
    assert pool.closed and pool._engine.closed
    with pytest.raises(RuntimeError, match="closed"):
        pool.step(np.zeros(3, np.int64))
    pool.close()  # closing twice is fine


# ---- sync step, env order, autoreset ----------------------------------------------------------


def test_sync_step_results_are_in_env_order():
    n = 6
    with opened(n) as pool:
        pool.reset(seed=0)
        for i in range(n):  # a distinct state per env; env 3 is about to fall
            pool.set_state(i, [0.1 * i, 0.05 * i, 0.01 * i, 0.0])
        pool.set_state(3, [0.3, 0.0, 0.2, 2.0])
        before = [pool.get_state(i) for i in range(n)]
        actions = np.array([0, 1, 1, 0, 1, 0], np.int64)
        obs, reward, terminated, truncated, _ = pool.step(actions)
        for i in range(n):  # row i is env i stepped with actions[i]
            single = gym.make(ENV).unwrapped
            single.reset(seed=0)
            single.state = before[i].astype(np.float64)
            r_obs, r_reward, r_terminated, _, _ = single.step(int(actions[i]))
            np.testing.assert_allclose(obs[i], r_obs, rtol=1e-6, atol=1e-6)
            assert (reward[i], terminated[i]) == (r_reward, r_terminated)
            np.testing.assert_array_equal(obs[i], pool.get_state(i).astype(np.float32))
        np.testing.assert_array_equal(terminated, [False, False, False, True, False, False])
        assert not truncated.any()


def _set_gym_states(pool: NativeEnvPool, envs: SyncVectorEnv) -> None:
    for i, env in enumerate(envs.envs):
        env.unwrapped.state = pool.get_state(i).astype(np.float64)


def _is_reset_obs(pool: NativeEnvPool, i: int, obs_row: np.ndarray) -> bool:
    """The env was just reset: it holds a fresh initial state (uniform in +-0.05) shown in obs_row."""
    state = pool.get_state(i)
    return bool(np.all(np.abs(state) <= 0.05)) and np.array_equal(obs_row, state.astype(np.float32))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_autoreset_matches_gymnasium_sync_vector_env(mode):
    """Step a pool and Gymnasium's SyncVectorEnv side by side from the same states.

    The two draw initial states from different generators, so after every step the Gymnasium envs
    are given the pool's states; everything else (rewards, flags, which step is a reset step,
    where final observations go, the info layout) must agree.
    """
    n, limit, steps = 4, 30, 400
    rng = np.random.default_rng(1)
    pool = make(n, autoreset_mode=mode, max_episode_steps=limit, seed=3)
    ref = SyncVectorEnv(
        [lambda: gym.make(ENV, max_episode_steps=limit) for _ in range(n)], autoreset_mode=mode
    )
    obs, info = pool.reset(seed=3)
    ref.reset(seed=0)
    _set_gym_states(pool, ref)
    assert set(info) == {"env_id"}
    was_done = np.zeros(n, bool)
    seen = {"terminated": 0, "truncated": 0, "reset_steps": 0}
    for _ in range(steps):
        # Mostly balance the pole, so that some episodes reach the time limit.
        theta, theta_dot = obs[:, 2], obs[:, 3]
        actions = (theta + 0.5 * theta_dot > 0).astype(np.int64)
        flip = rng.random(n) < 0.25
        actions[flip] = 1 - actions[flip]

        obs, reward, terminated, truncated, info = pool.step(actions)
        r_obs, r_reward, r_terminated, r_truncated, r_info = ref.step(actions)

        np.testing.assert_array_equal(reward, r_reward)
        np.testing.assert_array_equal(terminated, r_terminated)
        np.testing.assert_array_equal(truncated, r_truncated)
        np.testing.assert_array_equal(info.pop("env_id"), np.arange(n))
        assert set(info) == set(r_info)

        done = terminated | truncated
        if mode == AutoresetMode.NEXT_STEP:
            assert not info
            fresh = was_done  # this step reset these envs and ignored their actions
            assert (reward[fresh] == 0).all() and not done[fresh].any()
            was_done = done
        else:
            fresh = done  # these envs ended and were reset within this step
            if done.any():
                np.testing.assert_array_equal(info["_final_obs"], r_info["_final_obs"])
                np.testing.assert_array_equal(info["_final_info"], r_info["_final_info"])
                np.testing.assert_array_equal(info["_final_obs"], done)
                assert info["final_obs"].dtype == object and info["final_obs"].shape == (n,)
                assert info["final_info"] == r_info["final_info"] == {}
                for i in range(n):
                    if done[i]:
                        np.testing.assert_allclose(
                            info["final_obs"][i], r_info["final_obs"][i], rtol=1e-6, atol=1e-6
                        )
                    else:
                        assert info["final_obs"][i] is None and r_info["final_obs"][i] is None
        for i in range(n):
            if fresh[i]:
                assert _is_reset_obs(pool, i, obs[i]), f"env {i}: not a reset observation"
            else:
                np.testing.assert_allclose(obs[i], r_obs[i], rtol=1e-6, atol=1e-6)
        seen["terminated"] += int(terminated.sum())
        seen["truncated"] += int(truncated.sum())
        seen["reset_steps"] += int(fresh.sum())
        _set_gym_states(pool, ref)
    assert min(seen.values()) >= 3, seen  # the run covered every case
    pool.close()


def test_next_step_reset_step_ignores_the_action():
    with opened(2, seed=7) as a, opened(2, seed=7) as b:
        a.reset()
        b.reset()
        for pool in (a, b):
            pool.set_state(0, [0.0, 0.0, 0.2, 3.0])  # falls at the next step
        for pool in (a, b):
            _, _, terminated, _, _ = pool.step(np.array([1, 1]))
            assert terminated.tolist() == [True, False]
        obs_a, reward_a, term_a, trunc_a, _ = a.step(np.array([0, 0]))
        obs_b, reward_b, term_b, trunc_b, _ = b.step(np.array([1, 0]))
        np.testing.assert_array_equal(obs_a[0], obs_b[0])
        assert reward_a[0] == reward_b[0] == 0.0
        assert not (term_a[0] or trunc_a[0] or term_b[0] or trunc_b[0])
        assert _is_reset_obs(a, 0, obs_a[0])
        # The next episode is the env's second one: a fresh state, not the first reset's.
        with opened(2, seed=7) as fresh:
            first, _ = fresh.reset()
        assert not np.array_equal(obs_a[0], first[0])


# ---- time limits ------------------------------------------------------------------------------


def _balanced_steps(pool: NativeEnvPool, steps: int):
    """Step a 1-env pool `steps` times, holding the pole upright so that it never falls."""
    for _ in range(steps):
        pool.set_state(0, [0.0, 0.0, 0.0, 0.0])
        yield pool.step(np.array([1]))


@pytest.mark.timeout(30)
def test_default_time_limit_truncates_at_500():
    with opened(1) as pool:
        pool.reset(seed=0)
        results = list(_balanced_steps(pool, 501))
        truncated = np.array([r[3][0] for r in results])
        terminated = np.array([r[2][0] for r in results])
        assert not terminated.any()
        assert np.flatnonzero(truncated).tolist() == [499]  # the 500th step
        assert results[499][1][0] == 1.0
        # NextStep: the step after truncation is the reset step.
        obs, reward, _, _, _ = results[500]
        assert reward[0] == 0.0 and _is_reset_obs(pool, 0, obs[0])


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_max_episode_steps_override(mode):
    with opened(1, max_episode_steps=7, autoreset_mode=mode) as pool:
        assert pool.spec.max_episode_steps == 7
        pool.reset(seed=0)
        truncated = [r[3][0] for r in _balanced_steps(pool, 40)]
        period = 8 if mode == AutoresetMode.NEXT_STEP else 7  # NextStep spends a step resetting
        assert np.flatnonzero(truncated).tolist() == list(range(6, 40, period))


def test_max_episode_steps_zero_means_no_limit():
    with opened(1, max_episode_steps=0) as pool:
        assert pool.spec.max_episode_steps is None
        pool.reset(seed=0)
        assert not any(r[3][0] for r in _balanced_steps(pool, 600))


@pytest.mark.parametrize(
    ("env_id", "limit", "cap"),
    [("CartPole-v1", 500, {"max_episode_steps": 9}), ("MinAtar/Seaquest-v1", None,
     {"max_episode_steps": 9}), ("Pong-v5", 27_000, {"max_num_frames_per_episode": 36})],
)  # fmt: skip
def test_time_limit_and_the_options_that_cap_episodes(env_id, limit, cap):
    """What evaluation reads and sets: the step at which a pool's episodes end by themselves
    (Atari's in frames, 108,000 at frameskip 4), and the options that make it 9 steps."""
    with onebox.envs.make(env_id, 1) as pool:
        assert time_limit(pool.spec) == limit
        assert cap_options(pool.spec, 9) == cap
    with onebox.envs.make(env_id, 1, **cap) as pool:
        assert time_limit(pool.spec) == 9


def test_terminated_and_truncated_on_the_same_step():
    with opened(1, max_episode_steps=1) as pool:
        pool.reset(seed=0)
        pool.set_state(0, [0.0, 0.0, 0.2, 3.0])
        _, _, terminated, truncated, _ = pool.step(np.array([0]))
        assert terminated[0] and truncated[0]


# ---- seeding and determinism ------------------------------------------------------------------


def test_same_seed_gives_identical_trajectories():
    actions = random_actions(150, 6)
    a = sync_reference(6, 11, actions)
    b = sync_reference(6, 11, actions)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert a["terminated"].sum() >= 6  # several episodes per env
    c = sync_reference(6, 12, actions)
    assert not np.array_equal(a["obs"], c["obs"])


def test_env_i_uses_seed_plus_i():
    actions = random_actions(120, 3)
    a = sync_reference(3, 4, actions)  # envs seeded 4, 5, 6
    b = sync_reference(3, 5, np.roll(actions, -1, axis=1))  # envs seeded 5, 6, 7
    for key in a:  # over several episodes, not just the first reset
        np.testing.assert_array_equal(a[key][:, 1:], b[key][:, :2])
    assert a["terminated"][:, 1].sum() >= 2


def test_constructor_seed_equals_reset_seed():
    with opened(4, seed=9) as a, opened(4, seed=0) as b:
        obs_a, _ = a.reset()
        obs_b, _ = b.reset(seed=9)
    np.testing.assert_array_equal(obs_a, obs_b)


def test_reset_with_a_list_of_seeds():
    seeds = [10, 3, 7]
    actions = random_actions(80, 3)
    with opened(3) as pool:
        obs, _ = pool.reset(seed=seeds)
        got = [obs]
        got += [pool.step(a)[0] for a in actions]
    for k, s in enumerate(seeds):
        ref = sync_reference(1, s, actions[:, k : k + 1])
        np.testing.assert_array_equal(np.stack(got)[:, k], ref["obs"][:, 0])
    with opened(3) as pool:
        np.testing.assert_array_equal(pool.reset(seed=np.array(seeds))[0], got[0])


def test_reset_without_seed_starts_new_episodes():
    with opened(4) as pool:
        first, _ = pool.reset(seed=0)
        second, _ = pool.reset()
        third, _ = pool.reset()
        assert not np.array_equal(first, second)
        assert not np.array_equal(second, third)
        assert not np.array_equal(first, third)
        again, _ = pool.reset(seed=0)  # reseeding starts the same streams over
        np.testing.assert_array_equal(again, first)
        np.testing.assert_array_equal(pool.reset()[0], second)


@pytest.mark.timeout(60)
def test_results_do_not_depend_on_num_threads():
    actions = random_actions(25, MANY, seed=2)
    ref = None
    for threads in (1, 2, 4):
        got = sync_reference(MANY, 5, actions, num_threads=threads)
        if ref is None:
            ref = got
            continue
        for key in ref:
            np.testing.assert_array_equal(got[key], ref[key], err_msg=f"{key}, {threads} threads")
    with opened(MANY, num_threads=2) as pool:
        pool.reset(seed=0)
        for a in actions[:5]:
            pool.step(a)
        assert pool._engine.step_cost_ns * MANY > INLINE_NS, "work was not given to the workers"


def _async_rollout(pool: NativeEnvPool, ref: dict, actions: np.ndarray, seed: int, rng) -> int:
    """Drive `pool` with send/recv over random subsets; check every result against `ref`.

    Env i's k-th action is actions[k, i] whatever order it is sent in. Returns the results received.
    """
    n, b, steps = pool.num_envs, pool.batch_size, len(actions)
    count = np.zeros(n, int)  # results received per env (the first is the reset)
    ready = np.zeros(n, bool)  # received and not sent again
    same_step = pool.autoreset_mode == AutoresetMode.SAME_STEP
    pool.async_reset(seed=seed)
    pending = n
    while True:
        assert pool._engine.pending == pending
        if pending >= b:
            obs, reward, terminated, truncated, info = pool.recv()
            ids = info["env_id"]
            assert ids.shape == (b,) and ids.dtype == np.int32
            assert len(np.unique(ids)) == b, "an env came back twice in one batch"
            assert not ready[ids].any(), "an env came back twice for one send"
            got = {"obs": obs, "reward": reward, "terminated": terminated, "truncated": truncated}
            if same_step:
                final = info.get("_final_obs", np.zeros(b, bool))
                got["final"] = final
                got["final_obs"] = np.stack(
                    [
                        info["final_obs"][k] if final[k] else np.zeros(4, np.float32)
                        for k in range(b)
                    ]
                )
            assert_rows_equal(ref, count[ids], ids, got)
            count[ids] += 1
            ready[ids] = True
            pending -= b
        can = np.flatnonzero(ready & (count <= steps))
        if len(can) == 0 and pending < b:
            break
        if len(can):
            low = min(len(can), max(0, b - pending))
            sub = rng.permutation(can)[: rng.integers(low, len(can) + 1)]
            if len(sub):
                pool.send(actions[count[sub] - 1, sub], sub)
                ready[sub] = False
                pending += len(sub)
    # Every env got through all its steps, except fewer than batch_size still in flight.
    assert pending < b and (~ready).sum() == pending
    assert (count[ready] == steps + 1).all() and (count[~ready] <= steps).all()
    return int(count.sum())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize(
    ("num_envs", "batch_size", "threads", "steps"),
    [(7, 3, 2, 60), (7, 1, 1, 60), (7, 7, 2, 40), (MANY, 1024, 2, 12)],
)
def test_async_random_subsets_match_sync(mode, num_envs, batch_size, threads, steps):
    actions = random_actions(steps, num_envs, seed=num_envs + batch_size)
    ref = sync_reference(num_envs, 21, actions, autoreset_mode=mode)
    assert ref["terminated"].any()
    rng = np.random.default_rng(batch_size)
    with opened(num_envs, batch_size=batch_size, num_threads=threads, autoreset_mode=mode) as pool:
        _async_rollout(pool, ref, actions, 21, rng)
        if num_envs == MANY:
            assert pool._engine.step_cost_ns * MANY > INLINE_NS, "work was not given to the workers"


# ---- async API --------------------------------------------------------------------------------


def test_async_reset_then_recv():
    n, b = 8, 4
    with opened(n) as sync_pool:
        ref, _ = sync_pool.reset(seed=2)
    with opened(n, batch_size=b) as pool:
        pool.async_reset(seed=2)
        seen = []
        for _ in range(n // b):
            obs, reward, terminated, truncated, info = pool.recv()
            ids = info["env_id"]
            assert obs.shape == (b, 4) and ids.shape == (b,)
            np.testing.assert_array_equal(obs, ref[ids])
            assert (reward == 0).all() and not terminated.any() and not truncated.any()
            seen += ids.tolist()
        assert sorted(seen) == list(range(n))
        assert pool._engine.pending == 0


def test_every_env_comes_back_once_per_send():
    n, b = 12, 4
    with opened(n, batch_size=b) as pool:
        pool.async_reset(seed=0)
        assert sorted(np.concatenate([pool.recv()[4]["env_id"] for _ in range(3)])) == list(
            range(n)
        )
        for subsets in ([np.arange(n)], [np.arange(6), np.arange(6, 12)], [[11, 0, 5, 3], [7]]):
            sent = np.concatenate(subsets)
            for ids in subsets:
                pool.send(np.ones(len(ids), np.int64), ids)
            got = np.concatenate([pool.recv()[4]["env_id"] for _ in range(len(sent) // b)])
            assert len(got) == len(set(got.tolist()))
            assert set(got.tolist()) <= set(sent.tolist())
            leftover = set(sent.tolist()) - set(got.tolist())
            assert pool._engine.pending == len(leftover)
            if leftover:  # one env is still pending: send three more to complete a batch
                more = [i for i in range(n) if i not in leftover][:3]
                pool.send(np.ones(3, np.int64), more)
                assert set(pool.recv()[4]["env_id"].tolist()) == leftover | set(more)


def test_recv_returns_envs_in_completion_order_inline():
    # Few cheap envs run inline on the calling thread, so they finish in the order they are sent.
    with opened(6, batch_size=2, num_threads=2) as pool:
        pool.async_reset(seed=0)
        for _ in range(3):
            pool.recv()
        pool.send(np.array([1]), [4])
        pool.send(np.array([0]), [1])
        pool.send(np.array([1, 0]), [5, 0])
        assert pool.recv()[4]["env_id"].tolist() == [4, 1]
        assert pool.recv()[4]["env_id"].tolist() == [5, 0]


def test_batch_rows_match_their_env_ids():
    n = 6
    with opened(n, seed=1) as sync_pool, opened(n, batch_size=3, seed=1) as pool:
        sync_pool.reset()
        pool.async_reset()
        pool.recv()
        pool.recv()
        sync_obs, sync_reward, sync_term, _, _ = sync_pool.step(np.array([0, 1, 0, 1, 0, 1]))
        pool.send(np.array([1, 0, 1, 0, 1, 0]), [5, 4, 3, 2, 1, 0])  # reversed ids and actions
        for _ in range(2):
            obs, reward, terminated, _, info = pool.recv()
            ids = info["env_id"]
            np.testing.assert_array_equal(obs, sync_obs[ids])
            np.testing.assert_array_equal(reward, sync_reward[ids])
            np.testing.assert_array_equal(terminated, sync_term[ids])


def test_sync_reset_drops_pending_async_work():
    with opened(MANY, batch_size=512, num_threads=2) as pool:
        ref, _ = pool.reset(seed=4)
        for _ in range(3):
            pool.step(np.zeros(MANY, np.int64))
        pool.send(np.zeros(MANY, np.int64))
        assert pool._engine.pending == MANY
        obs, _ = pool.reset(seed=4)
        assert pool._engine.pending == 0
        np.testing.assert_array_equal(obs, ref)
        pool.step(np.zeros(MANY, np.int64))  # usable in sync mode again
        pool.async_reset(seed=4)  # async_reset with work pending is fine too
        obs, *_, info = pool.recv()
        np.testing.assert_array_equal(obs, ref[info["env_id"]])


# ---- copy semantics ---------------------------------------------------------------------------


def test_copy_false_returns_views_overwritten_by_the_next_call():
    with opened(4, copy=False) as pool:
        obs0, _ = pool.reset(seed=0)
        saved = obs0.copy()
        obs1, reward1, term1, trunc1, _ = pool.step(np.ones(4, np.int64))
        assert np.shares_memory(obs0, obs1)
        assert not np.array_equal(obs0, saved)  # the reset obs was overwritten in place
        saved1 = obs1.copy()
        obs2, reward2, term2, trunc2, _ = pool.step(np.zeros(4, np.int64))
        for x, y in ((obs1, obs2), (reward1, reward2), (term1, term2), (trunc1, trunc2)):
            assert np.shares_memory(x, y)
        np.testing.assert_array_equal(obs1, obs2)
        assert not np.array_equal(obs1, saved1)


def test_copy_false_recv_returns_views_of_the_batch():
    with opened(4, batch_size=2, copy=False) as pool:
        pool.async_reset(seed=0)
        obs_a, *_, info_a = pool.recv()
        ids_a = info_a["env_id"].copy()
        saved = obs_a.copy()
        obs_b, *_, info_b = pool.recv()
        assert np.shares_memory(obs_a, obs_b) and np.shares_memory(
            info_a["env_id"], info_b["env_id"]
        )
        assert not np.array_equal(ids_a, info_b["env_id"])
        assert not np.array_equal(obs_a, saved)


def test_copy_true_returns_independent_arrays():
    with opened(4) as pool:
        obs0, _ = pool.reset(seed=0)
        saved = obs0.copy()
        result1 = pool.step(np.ones(4, np.int64))
        kept = [x.copy() for x in result1[:4]]
        result2 = pool.step(np.zeros(4, np.int64))
        np.testing.assert_array_equal(obs0, saved)
        for x, y, k in zip(result1[:4], result2[:4], kept, strict=True):
            assert not np.shares_memory(x, y)
            np.testing.assert_array_equal(x, k)
        obs0[:] = 99  # writing into returned arrays does not touch the engine
        np.testing.assert_array_equal(pool.get_state(0).astype(np.float32), result2[0][0])
    with opened(4, batch_size=2) as pool:
        pool.async_reset(seed=0)
        obs_a, *_, info_a = pool.recv()
        saved, ids = obs_a.copy(), info_a["env_id"].copy()
        obs_b, *_, info_b = pool.recv()
        assert not np.shares_memory(obs_a, obs_b)
        assert not np.shares_memory(info_a["env_id"], info_b["env_id"])
        np.testing.assert_array_equal(obs_a, saved)
        np.testing.assert_array_equal(info_a["env_id"], ids)


def test_observations_written_into_the_returned_array_stay_the_pools_own():
    """MinAtar envs write a step's observations straight into the array it returns and redraw
    them when a later call needs the pool's own: writing into that array changes nothing, and
    reset_mask keeps the other envs' last observations (after set_state too), as with copy=False."""
    env_id, n = "MinAtar/Seaquest-v1", 4
    kwargs = {"seed": 0, "autoreset_mode": "Disabled"}
    with (
        onebox.envs.make(env_id, n, **kwargs) as pool,
        onebox.envs.make(env_id, n, copy=False, **kwargs) as views,
    ):
        pool.reset()
        views.reset()
        rng = np.random.default_rng(0)
        resets = 0
        for t in range(400):
            actions = rng.integers(0, pool.single_action_space.n, n)
            obs, _, term, trunc, _ = pool.step(actions)
            np.testing.assert_array_equal(obs, views.step(actions)[0])
            obs[:] = True
            ended = term | trunc
            if t == 50:  # env 0 takes env 1's state; its observation stays the one it had
                for p in (pool, views):
                    p.set_state(0, p.get_state(1))
                ended[-1] = True
            if ended.any():
                new, _ = pool.reset(options={"reset_mask": ended})
                np.testing.assert_array_equal(new, views.reset(options={"reset_mask": ended})[0])
                resets += 1
        assert resets >= 3


# ---- lifecycle --------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_close_with_async_work_in_flight_does_not_hang():
    n = 8 * MANY
    pool = make(n, num_threads=2)
    pool.reset(seed=0)
    for _ in range(3):
        pool.step(np.zeros(n, np.int64))
    pool.send(np.zeros(n, np.int64))
    pool.close()
    assert pool._engine.closed
    with pytest.raises(RuntimeError, match="closed"):
        pool.recv()


@pytest.mark.timeout(60)
def test_dropping_a_pool_while_workers_step_does_not_crash():
    """A pool garbage-collected without close() while its workers are busy must shut down cleanly.

    Run in a subprocess: the failure mode is a crash. MALLOC_MMAP_THRESHOLD_ makes glibc unmap the
    freed env array at once, so a worker still using it faults instead of reading freed memory.
    """
    script = textwrap.dedent(
        """
        import numpy as np
        import onebox.envs
        n = 65536
        for _ in range(10):
            pool = onebox.envs.make("CartPole-v1", n, num_threads=2)
            pool.reset(seed=0)
            pool.send(np.zeros(n, np.int64))
            del pool  # no close(): the engine is destroyed with steps in flight
        print("ok")
        """
    )
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=50, env=env
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (
        f"exit code {proc.returncode}\n{proc.stderr[-3000:]}"
    )


def test_pinned_threads_give_the_same_results():
    n = 4096
    actions = np.random.default_rng(0).integers(0, 2, size=(50, n))
    results = []
    for offset in (-1, 0):
        pool = onebox.envs.make("CartPole-v1", n, num_threads=2, thread_affinity_offset=offset)
        try:
            obs, _ = pool.reset(seed=3)
            trace = [obs]
            for a in actions:
                trace.append(pool.step(a)[0])
            results.append(np.stack(trace))
        finally:
            pool.close()
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("offset", [-2, 1.5, "0"])
def test_bad_thread_affinity_offset(offset):
    with pytest.raises(ValueError, match="thread_affinity_offset"):
        onebox.envs.make("CartPole-v1", 2, thread_affinity_offset=offset)


@pytest.mark.parametrize("num_threads", [1, 2, 3])
def test_recv_passes_no_env_over(num_threads: int) -> None:
    """A send/recv loop steps every env in turn: envs sent earlier come back first, even when cheap
    steps run inline on the caller while a worker has not woken up for the envs queued before."""
    with onebox.envs.make(
        "CartPole-v1", 6, batch_size=3, num_threads=num_threads, seed=3, autoreset_mode="SameStep"
    ) as envs:
        envs.async_reset(seed=3)
        steps = np.zeros(6, np.int64)
        for _ in range(300):
            ids = envs.recv()[4]["env_id"]
            steps[ids] += 1
            envs.send(np.zeros(3, np.int64), ids)
    assert steps.max() - steps.min() <= 2, steps
