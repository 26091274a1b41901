"""The engine's work split with expensive envs: MuJoCo steps cost ~20-500 us, so every call goes to
the threads one env per chunk, each env in its home thread's queue, idle threads stealing from the
others. Results must be exactly those of one thread (each env has its own random stream and
state), in sync steps, async send/recv with arbitrary batches, and closed-loop rollouts.

Hopper-v5 under random actions ends an episode every ~25 steps, so resets, short and long steps and
autoresets are mixed in every call; 13 envs on 3 threads give home blocks of unequal size.
"""

from __future__ import annotations

import numpy as np
import pytest

import onebox.envs
from onebox.envs.mujoco_module import mujoco_module

pytestmark = pytest.mark.skipif(mujoco_module() is None, reason="onebox was built without MuJoCo")

ENV = "Hopper-v5"
N = 13
STEPS = 60
# A call runs inline on the caller below ~40 us of estimated work: these pools must not.
INLINE_NS = 40e3


def actions(steps: int, seed: int = 0) -> np.ndarray:
    pool = onebox.envs.make(ENV, 1)
    low, high = pool.single_action_space.low, pool.single_action_space.high
    pool.close()
    rng = np.random.default_rng(seed)
    return rng.uniform(low, high, size=(steps, N, len(low))).astype(np.float32)


def sync_run(threads: int, acts: np.ndarray, **kwargs) -> dict[str, np.ndarray]:
    """Results indexed [t, env]: t = 0 is the reset, t = k + 1 follows acts[k]."""
    pool = onebox.envs.make(ENV, N, num_threads=threads, seed=5, **kwargs)
    obs, _ = pool.reset(seed=5)
    out = {"obs": [obs], "reward": [np.zeros(N)], "terminated": [np.zeros(N, bool)]}
    out["truncated"] = [np.zeros(N, bool)]
    for a in acts:
        obs, reward, terminated, truncated, _ = pool.step(a)
        for key, value in zip(out, (obs, reward, terminated, truncated), strict=True):
            out[key].append(value)
    if threads > 1:
        assert pool._engine.step_cost_ns * N > INLINE_NS, "the steps were not given to the threads"
    pool.close()
    return {key: np.stack(value) for key, value in out.items()}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("autoreset_mode", ["NextStep", "SameStep"])
def test_sync_steps_do_not_depend_on_threads(autoreset_mode: str) -> None:
    acts = actions(STEPS)
    ref = sync_run(1, acts, autoreset_mode=autoreset_mode)
    assert ref["terminated"].sum() >= N, "expected several episode ends per env"
    for threads in (2, 3):
        got = sync_run(threads, acts, autoreset_mode=autoreset_mode)
        for key in ref:
            np.testing.assert_array_equal(got[key], ref[key], err_msg=f"{key}, {threads} threads")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("threads", "batch_size"), [(3, 5), (2, 1), (3, N)])
def test_async_batches_match_sync(threads: int, batch_size: int) -> None:
    """Env i's k-th action is acts[k, i] whatever batch it comes back in; its k-th result must be
    the sync pool's."""
    acts = actions(STEPS, seed=1)
    ref = sync_run(1, acts)
    pool = onebox.envs.make(ENV, N, batch_size=batch_size, num_threads=threads, seed=5)
    rng = np.random.default_rng(batch_size)
    count = np.zeros(N, int)  # results received per env (the first is the reset)
    held: list[int] = []  # received, not yet sent again
    pool.async_reset(seed=5)
    pending = N
    while pending >= batch_size:
        obs, reward, terminated, truncated, info = pool.recv()
        ids = info["env_id"]
        assert len(np.unique(ids)) == batch_size
        np.testing.assert_array_equal(obs, ref["obs"][count[ids], ids])
        np.testing.assert_array_equal(reward, ref["reward"][count[ids], ids])
        np.testing.assert_array_equal(terminated, ref["terminated"][count[ids], ids])
        np.testing.assert_array_equal(truncated, ref["truncated"][count[ids], ids])
        count[ids] += 1
        pending -= batch_size
        held.extend(int(i) for i in ids if count[i] <= STEPS)
        rng.shuffle(held)  # send back a random part of what is held, in random order
        k = len(held) if pending < batch_size else int(rng.integers(0, len(held) + 1))
        send, held = np.array(held[:k], dtype=np.int32), held[k:]
        if len(send):
            pool.send(acts[count[send] - 1, send], send)
            pending += len(send)
    assert pool._engine.step_cost_ns * batch_size > 2e3, "the sends were stepped inline"
    pool.close()
    # Every env went through all its steps, except the fewer than batch_size still in flight.
    assert (count <= STEPS).sum() == pending < batch_size


@pytest.mark.timeout(120)
def test_rollout_does_not_depend_on_threads() -> None:
    """Episodes of very different lengths (a linear policy on Hopper falls early or hops on) end
    in any order on any thread; each env's return and length are those of one thread."""
    results = []
    for threads in (1, 2, 3):
        pool = onebox.envs.make(ENV, N, num_threads=threads, seed=2)
        rng = np.random.default_rng(0)
        w = (0.3 * rng.standard_normal((N, pool.policy_size(8)))).astype(np.float32)
        results.append(pool.rollout(w, hidden=8, max_steps=300))
        pool.close()
    returns, lengths = results[0]
    assert lengths.min() < lengths.max(), "expected episodes of different lengths"
    for threads, (r, n) in zip((2, 3), results[1:], strict=True):
        np.testing.assert_array_equal(n, lengths, err_msg=f"{threads} threads")
        np.testing.assert_array_equal(r, returns, err_msg=f"{threads} threads")
