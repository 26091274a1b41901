"""Closed-loop rollouts (`NativeEnvPool.rollout`): whole episodes with a linear or MLP policy
evaluated in C++ give the same returns and lengths as a Python loop that steps a pool with the
same policy computed in NumPy.

Tolerance: both compute the policy in float64 from the same float32 weights, in different
summation orders (NumPy's matmul vs a C++ loop), so the float64 outputs differ by ~1e-16
relative; the actions are float32, and a 1e-16 difference changes a float32 rounding only if the
value lies within 1e-16 of a rounding boundary (probability ~1e-9 per action element). The
actions, hence the trajectories, are identical in practice, and the returns are float64 sums of
the same rewards in the same order: compared with rtol 1e-9 (lengths exactly).
"""

from __future__ import annotations

import numpy as np
import pytest

import onebox.envs
from onebox.envs.mujoco_module import mujoco_module


def policy(
    w: np.ndarray, obs: np.ndarray, hidden: int, n_out: int, mean=None, std=None, obs_clip=None
):
    """The reference policy in NumPy: the raw outputs for a batch of observations."""
    x = obs.astype(np.float64)
    if mean is not None:
        x = (x - mean) / std
    if obs_clip is not None:
        x = np.clip(x, -obs_clip, obs_clip)
    w = w.astype(np.float64)
    n_obs = x.shape[1]
    outs = []
    for i in range(len(x)):
        p = w[i]
        inp = x[i]
        if hidden:
            w1 = p[: hidden * n_obs].reshape(hidden, n_obs)
            b1 = p[hidden * n_obs : hidden * n_obs + hidden]
            inp = np.tanh(w1 @ inp + b1)
            p = p[hidden * n_obs + hidden :]
        n_in = len(inp)
        outs.append(p[: n_out * n_in].reshape(n_out, n_in) @ inp + p[n_out * n_in :])
    return np.array(outs)


def python_rollout(
    env_id: str, num_envs: int, w, hidden: int, seed: int, mean=None, std=None, obs_clip=None,
    squash=False, sums=None, **kwargs,
):  # fmt: skip
    """Step a fresh pool from Python until every env finished its first episode."""
    pool = onebox.envs.make(env_id, num_envs=num_envs, seed=seed, **kwargs)
    space = pool.single_action_space
    discrete = not hasattr(space, "low")
    n_out = space.n if discrete else space.shape[0]
    obs, _ = pool.reset()
    returns = np.zeros(num_envs)
    lengths = np.zeros(num_envs, dtype=np.int64)
    running = np.ones(num_envs, dtype=bool)
    while running.any():
        if sums is not None:
            x = obs.astype(np.float64) * running[:, None]
            sums[:, 0] += x
            sums[:, 1] += x * x
        out = policy(w, obs, hidden, n_out, mean, std, obs_clip)
        if discrete:
            actions = out.argmax(axis=1)
        elif squash:
            low, high = space.low.astype(np.float64), space.high.astype(np.float64)
            actions = ((low + high) / 2 + (high - low) / 2 * np.tanh(out)).astype(np.float32)
        else:
            actions = np.clip(out, space.low, space.high).astype(np.float32)
        obs, rew, term, trunc, _ = pool.step(actions)
        returns[running] += rew[running]
        lengths[running] += 1
        running &= ~(term | trunc)
    return returns, lengths


def random_weights(pool, hidden: int, scale: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (scale * rng.standard_normal((pool.num_envs, pool.policy_size(hidden)))).astype(
        np.float32
    )


@pytest.mark.parametrize(("hidden", "threads"), [(0, 1), (16, 2)])
def test_pendulum_matches_python_loop(hidden: int, threads: int) -> None:
    pool = onebox.envs.make("Pendulum-v1", num_envs=6, seed=3, num_threads=threads)
    w = random_weights(pool, hidden, 1.0)
    returns, lengths = pool.rollout(w, hidden=hidden, seed=3)
    ref_returns, ref_lengths = python_rollout("Pendulum-v1", 6, w, hidden, seed=3)
    np.testing.assert_array_equal(lengths, ref_lengths)
    assert (lengths == 200).all()
    np.testing.assert_allclose(returns, ref_returns, rtol=1e-9)
    assert len(set(returns.round(6))) == 6  # different weights, different returns


def test_obs_clip_squash_and_obs_sums_match_python_loop() -> None:
    pool = onebox.envs.make("Pendulum-v1", num_envs=5, seed=4, num_threads=2)
    w = random_weights(pool, 6, 2.0, seed=2)
    mean, std = np.array([0.1, -0.1, 0.5]), np.array([0.3, 0.3, 1.0])  # |o'| well above 0.5
    sums = np.zeros((5, 2, 3))
    returns, lengths = pool.rollout(w, hidden=6, seed=4, obs_mean=mean, obs_std=std,
                                    obs_clip=0.5, squash=True, obs_sums=sums)  # fmt: skip
    ref_sums = np.zeros((5, 2, 3))
    ref_returns, ref_lengths = python_rollout("Pendulum-v1", 5, w, 6, 4, mean, std, obs_clip=0.5,
                                              squash=True, sums=ref_sums)  # fmt: skip
    np.testing.assert_array_equal(lengths, ref_lengths)
    np.testing.assert_allclose(returns, ref_returns, rtol=1e-9)
    np.testing.assert_allclose(sums, ref_sums, rtol=1e-12)  # of the raw observations
    unclipped = pool.rollout(w, hidden=6, seed=4, obs_mean=mean, obs_std=std, squash=True)[0]
    clipped_only = pool.rollout(w, hidden=6, seed=4, obs_mean=mean, obs_std=std, obs_clip=0.5)[0]
    assert not np.allclose(unclipped, returns) and not np.allclose(clipped_only, returns)
    with pytest.raises(ValueError, match="obs_clip must be a positive number"):
        pool.rollout(w, hidden=6, obs_clip=0)
    with pytest.raises(ValueError, match=r"obs_sums must be .* shape \(5, 2, 3\)"):
        pool.rollout(w, hidden=6, obs_sums=np.zeros((5, 3)))
    with pytest.raises(ValueError, match="obs_sums must be"):
        pool.rollout(w, hidden=6, obs_sums=np.zeros((5, 2, 3), dtype=np.float32))


def test_cartpole_argmax_and_threads() -> None:
    pool = onebox.envs.make("CartPole-v1", num_envs=16, seed=0)
    w = random_weights(pool, 0, 1.0, seed=1)
    returns, lengths = pool.rollout(w, seed=0)
    ref_returns, ref_lengths = python_rollout("CartPole-v1", 16, w, 0, seed=0)
    np.testing.assert_array_equal(lengths, ref_lengths)
    np.testing.assert_array_equal(returns, ref_returns)
    assert lengths.min() < lengths.max()  # some policies balance longer than others
    single = onebox.envs.make("CartPole-v1", num_envs=16, seed=0, num_threads=1)
    np.testing.assert_array_equal(single.rollout(w, seed=0)[0], returns)


def test_streams_continue_without_seed() -> None:
    pool = onebox.envs.make("Pendulum-v1", num_envs=4, seed=9)
    w = random_weights(pool, 0, 0.5)
    first = pool.rollout(w, seed=9)[0]
    second = pool.rollout(w)[0]  # the next episode of each env: other initial states
    again = pool.rollout(w, seed=9)[0]
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, second)
    rew = pool.step(np.zeros((4, 1), dtype=np.float32))[1]
    assert (rew == 0).all()  # each env was reset by this step (next-step autoreset)


def test_bad_rollout_arguments() -> None:
    pool = onebox.envs.make("Pendulum-v1", num_envs=2)
    size = pool.policy_size(0)
    assert size == 1 * (3 + 1) and pool.policy_size(4) == 4 * (3 + 1) + 1 * (4 + 1)
    good = np.zeros((2, size), dtype=np.float32)
    with pytest.raises(ValueError, match=r"shape"):
        pool.rollout(np.zeros((2, size + 1)))
    with pytest.raises(ValueError, match=r"shape"):
        pool.rollout(np.zeros((3, size)))
    with pytest.raises(ValueError, match="shape"):
        pool.rollout(good, hidden=4)
    with pytest.raises(ValueError, match="NaN"):
        pool.rollout(np.full((2, size), np.nan))
    with pytest.raises(TypeError, match="numbers"):
        pool.rollout(np.array([["a"] * size] * 2))
    with pytest.raises(ValueError, match="together"):
        pool.rollout(good, obs_mean=np.zeros(3))
    with pytest.raises(ValueError, match="obs_std must have shape"):
        pool.rollout(good, obs_mean=np.zeros(3), obs_std=np.ones(2))
    with pytest.raises(ValueError, match="positive"):
        pool.rollout(good, obs_mean=np.zeros(3), obs_std=np.zeros(3))
    with pytest.raises(ValueError, match="max_steps"):
        pool.rollout(good, max_steps=0)
    with pytest.raises(ValueError, match="hidden"):
        pool.policy_size(-1)
    unlimited = onebox.envs.make("Pendulum-v1", num_envs=2, max_episode_steps=0)
    with pytest.raises(ValueError, match="max_steps"):
        unlimited.rollout(good)
    assert (unlimited.rollout(good, max_steps=7)[1] == 7).all()
    pool.async_reset()
    with pytest.raises(RuntimeError, match="pending"):
        pool.rollout(good)


def test_mujoco_mlp_with_normalization_matches_python_loop() -> None:
    if mujoco_module() is None:
        pytest.skip("onebox was built without MuJoCo")
    pool = onebox.envs.make("HalfCheetah-v5", num_envs=4, seed=1, max_episode_steps=120)
    w = random_weights(pool, 8, 0.3)
    rng = np.random.default_rng(2)
    mean, std = rng.standard_normal(17), rng.uniform(0.5, 2.0, 17)
    returns, lengths = pool.rollout(w, hidden=8, obs_mean=mean, obs_std=std, seed=1)
    ref = python_rollout("HalfCheetah-v5", 4, w, 8, 1, mean, std, max_episode_steps=120)
    np.testing.assert_array_equal(lengths, ref[1])
    assert (lengths == 120).all()
    np.testing.assert_allclose(returns, ref[0], rtol=1e-9)


def test_mujoco_terminating_episodes_match_python_loop() -> None:
    if mujoco_module() is None:
        pytest.skip("onebox was built without MuJoCo")
    pool = onebox.envs.make("Hopper-v5", num_envs=6, seed=4)
    w = random_weights(pool, 0, 0.5)
    returns, lengths = pool.rollout(w, seed=4, max_steps=300)
    ref = python_rollout("Hopper-v5", 6, w, 0, 4, max_episode_steps=300)
    np.testing.assert_array_equal(lengths, ref[1])
    assert lengths.max() <= 300 and lengths.min() < 300  # some fall: terminated
    np.testing.assert_allclose(returns, ref[0], rtol=1e-9)


def test_bench_policy_peers() -> None:
    """The closed-loop rows of `onebox bench envs` run, and `measure` counts the steps a
    varying-length loop reports."""
    from onebox.bench import common
    from onebox.bench.envs import Task, measure_peer, select_peers

    calls: list[int] = []

    def run(k: int) -> int:
        calls.append(k)
        return 7  # steps done by this call, whatever k is

    timing = common.measure(run, steps_per_call=1, seconds=0.01, warmup=0)
    assert timing.steps == 7 * (len(calls) - 1)  # the first call was the warm-up
    peers = select_peers(("policy",))
    assert [p.name for p in peers] == ["policy-python", "policy-rollout"]
    for peer in peers:
        result = measure_peer(peer, Task("Pendulum-v1", 4, 1), seconds=0.05, warmup=0.0)
        assert result.rate and result.rate > 0, result.note
        assert "n/a" in measure_peer(peer, Task("CartPole-v1", 4, 1), 0.05, 0.0).note
