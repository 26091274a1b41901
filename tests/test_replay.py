"""The replay core: sum tree, n-step returns, priorities and importance weights, frame
deduplication against a real Atari pool, R2D2 sequences against an LSTM, save/load, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from onebox.replay import ReplayBuffer, SequenceReplay, mixed_priority
from onebox.replay.sum_tree import SumTree


def chi2_critical(df: int, z: float) -> float:
    """Upper quantile of chi-square(df) at the normal quantile z (Wilson-Hilferty)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


# ---- sum tree --------------------------------------------------------------------------------


def test_sum_tree_matches_brute_force():
    rng = np.random.default_rng(0)
    tree, ref = SumTree(1000), np.zeros(1000)
    for _ in range(20):
        idx = rng.integers(1000, size=300)  # repeats: the last value wins
        p = rng.random(300) * (rng.random(300) < 0.8)  # some zeros
        tree.set(idx, p)
        for i, v in zip(idx, p, strict=True):
            ref[i] = v
        assert tree.total == pytest.approx(ref.sum(), rel=1e-12)
        assert tree.min == ref[ref > 0].min()
        np.testing.assert_array_equal(tree.get(np.arange(1000)), ref)
        # prefix-sum search: the leaf whose cumulative interval holds the target
        u = rng.random(500) * ref.sum()
        expected = np.searchsorted(np.cumsum(ref), u, side="right")
        np.testing.assert_array_equal(tree.find(u), expected)
    # rounding past the total never lands on an empty leaf
    assert ref[tree.find(np.array([ref.sum(), ref.sum() * (1 + 1e-9)]))].min() > 0


def test_sum_tree_sampling_frequencies_chi_square():
    """51,200 stratified draws over 64 leaves against their shares, at the 1e-4 level (z = 3.719).

    Power: a leaf drawn at 1.5x its share adds a noncentrality of about 51200 * 0.25 / 64 = 200
    to a critical value near 111, so such a bug fails this test with probability > 0.999; the
    test checks that by rejecting the same draws against shares with one leaf changed so.
    Stratified draws vary less than multinomial ones, which makes the acceptance conservative.
    """
    rng = np.random.default_rng(1)
    k, batches = 64, 100
    p = rng.uniform(0.5, 2.0, size=k)
    tree = SumTree(k)
    tree.set(np.arange(k), p)
    counts = np.zeros(k)
    for _ in range(batches):
        counts += np.bincount(tree.sample_stratified(512, rng), minlength=k)
    draws = counts.sum()
    critical = chi2_critical(k - 1, 3.719)

    def chi2(shares: np.ndarray) -> float:
        expected = draws * shares / shares.sum()
        return float(((counts - expected) ** 2 / expected).sum())

    assert chi2(p) < critical
    wrong = p.copy()
    wrong[7] *= 1.5
    assert chi2(wrong) > critical


def test_stratified_sampling_one_draw_per_segment():
    tree = SumTree(2)
    tree.set(np.arange(2), np.array([1.0, 3.0]))
    idx = tree.sample_stratified(4, np.random.default_rng(0))
    np.testing.assert_array_equal(np.sort(idx), [0, 1, 1, 1])  # exactly the shares


# ---- n-step returns --------------------------------------------------------------------------


def table(buf: ReplayBuffer) -> dict[int, tuple]:
    """Every stored transition keyed by its action (the tests use the step id as the action)."""
    b = buf.get(buf.live_indices())
    return {
        int(a): (o.tolist(), float(r), n.tolist(), float(d))
        for o, a, r, n, d in zip(b.obs, b.actions, b.returns, b.next_obs, b.discounts, strict=True)
    }


def test_n_step_returns_by_hand():
    """3 envs, n = 3, gamma = 0.5. Env 0 never ends; env 1 terminates at step 2; env 2 is
    truncated at step 1. obs = [env, t], next_obs = [env, t + 1], final obs = [env, 100 + t];
    action = 10 * env + t identifies the transition; reward at step t = t + 1."""
    buf = ReplayBuffer(30, (2,), np.float32, (), np.int64, 3, n_step=3, gamma=0.5)
    ends = {(1, 2): "term", (2, 1): "trunc"}
    for t in range(5):
        obs = np.array([[e, t] for e in range(3)], dtype=np.float32)
        term = np.array([ends.get((e, t)) == "term" for e in range(3)])
        trunc = np.array([ends.get((e, t)) == "trunc" for e in range(3)])
        nxt = np.array(
            [[e, 100 + t] if (e, t) in ends else [e, t + 1] for e in range(3)], dtype=np.float32
        )
        buf.add(obs, 10 * np.arange(3) + t, np.full(3, t + 1.0), term, trunc, nxt)
    expected = {
        # env 0: full windows; steps 3 and 4 still staged
        0: ([0, 0], 1 + 0.5 * 2 + 0.25 * 3, [0, 3], 0.125),
        1: ([0, 1], 2 + 0.5 * 3 + 0.25 * 4, [0, 4], 0.125),
        2: ([0, 2], 3 + 0.5 * 4 + 0.25 * 5, [0, 5], 0.125),
        # env 1: terminated at step 2: every staged step flushed, no bootstrap
        10: ([1, 0], 1 + 0.5 * 2 + 0.25 * 3, [1, 102], 0.0),
        11: ([1, 1], 2 + 0.5 * 3, [1, 102], 0.0),
        12: ([1, 2], 3.0, [1, 102], 0.0),
        # env 2: truncated at step 1: bootstrap from the final obs after k steps
        20: ([2, 0], 1 + 0.5 * 2, [2, 101], 0.25),
        21: ([2, 1], 2.0, [2, 101], 0.5),
        22: ([2, 2], 3 + 0.5 * 4 + 0.25 * 5, [2, 5], 0.125),
    }
    assert len(buf) == len(expected)
    got = table(buf)
    for key, (obs, ret, nxt, disc) in expected.items():
        assert got[key][0] == obs and got[key][2] == nxt, key
        assert got[key][1] == pytest.approx(ret) and got[key][3] == disc, key


def test_n_step_one_is_plain_transitions_and_fifo_wraps():
    buf = ReplayBuffer(4, (1,), np.float32, (), np.int64, 2, n_step=1, gamma=0.9)
    for t in range(5):
        obs = np.full((2, 1), t, dtype=np.float32)
        buf.add(obs, [t, 10 + t], [1.0, 2.0], np.array([False, t == 4]), np.zeros(2, bool), obs + 1)
    got = table(buf)
    assert sorted(got) == [3, 4, 13, 14]  # two slots per env, the oldest overwritten
    assert got[4][:3] == ([4.0], 1.0, [5.0]) and got[4][3] == pytest.approx(0.9)
    assert got[14] == ([4.0], 2.0, [5.0], 0.0)


# ---- priorities and importance weights -------------------------------------------------------


def test_importance_weights_and_beta_annealing_by_hand():
    alpha, beta, eps = 0.5, 0.4, 1e-6
    buf = ReplayBuffer(
        4, (1,), np.float32, (), np.int64, 1, prioritized=True, alpha=alpha, beta=beta,
        beta_steps=10, eps=eps,
    )  # fmt: skip
    for t in range(4):
        o = np.full((1, 1), t, np.float32)
        buf.add(o, [t], [0.0], np.zeros(1, bool), np.zeros(1, bool), o)
    slots = buf.live_indices()
    td = np.array([1.0, -2.0, 3.0, 4.0])
    buf.update_priorities(slots, td)
    p = (np.abs(td) + eps) ** alpha
    for k in range(12):
        assert buf.beta == pytest.approx(min(1.0, beta + (1 - beta) * k / 10))
        b = buf.sample(4)
        share = p / p.sum()
        w = (4 * share) ** -buf_beta(beta, k) / ((4 * share.min()) ** -buf_beta(beta, k))
        np.testing.assert_allclose(b.weights, w[np.searchsorted(slots, b.indices)], rtol=1e-6)
    # a new transition gets the largest priority seen: (4 + eps) ** alpha
    o = np.zeros((1, 1), np.float32)
    buf.add(o, [9], [0.0], np.zeros(1, bool), np.zeros(1, bool), o)
    new = buf.live_indices()[-1]
    assert buf.priorities.tree.get([new])[0] == pytest.approx((4 + eps) ** alpha)


def buf_beta(beta0: float, k: int) -> float:
    return min(1.0, beta0 + (1 - beta0) * k / 10)


def test_actor_priorities_at_insertion():
    """Ape-X: add() takes the actor's priority of the transition starting at that step."""
    buf = ReplayBuffer(8, (1,), np.float32, (), np.int64, 2, n_step=2, prioritized=True, alpha=1.0)
    o = np.zeros((2, 1), np.float32)
    f = np.zeros(2, bool)
    buf.add(o, [0, 1], [0, 0], f, f, o, priorities=[3.0, np.nan])
    buf.add(o, [2, 3], [0, 0], f, f, o, priorities=[5.0, 7.0])
    got = buf.priorities.tree.get(buf.live_indices())
    # the step-0 transitions completed: env 0 with its own 3, env 1 with the max so far (3)
    np.testing.assert_allclose(got, [3 + 1e-6, 3 + 1e-6])


def test_uniform_sampling_covers_every_transition():
    buf = ReplayBuffer(6, (1,), np.float32, (), np.int64, 3, n_step=1)
    for t in range(2):
        o = np.full((3, 1), t, np.float32)
        buf.add(o, 10 * np.arange(3) + t, np.zeros(3), np.zeros(3, bool), np.zeros(3, bool), o)
    idx = np.concatenate([buf.sample(6).indices for _ in range(100)])
    assert np.all(buf.sample(6).weights == 1)
    counts = np.bincount(idx, minlength=6)
    assert counts.min() > 60  # six slots, 100 draws expected each


# ---- frames ----------------------------------------------------------------------------------


def test_frame_dedup_returns_the_atari_stacks():
    """A real Pong pool (SameStep autoreset, 100-step episodes so that resets happen), stored
    with frame_stack=4 and n=3 in a table that wraps; every stored transition's obs and next_obs
    equal the stacks the env produced, including episode starts (zeros, then the first frame)."""
    pytest.importorskip("ale_py")
    import onebox.envs

    envs = onebox.envs.make(
        "Pong-v5", 2, seed=0, autoreset_mode="SameStep", max_num_frames_per_episode=400
    )
    n, steps = 3, 250
    buf = ReplayBuffer(300, (4, 84, 84), np.uint8, (), np.int64, 2, n_step=n, frame_stack=4)
    obs, _ = envs.reset()
    record_obs, record_next, record_done = [], [], []
    for t in range(steps):
        obs2, reward, term, trunc, info = envs.step(envs.action_space.sample())
        done = term | trunc
        nxt = obs2.copy()
        for e in np.flatnonzero(done):
            nxt[e] = info["final_obs"][e]
        buf.add(obs, 1000 * np.arange(2) + t, reward, term, trunc, nxt)
        record_obs.append(obs.copy())
        record_next.append(nxt)
        record_done.append(done)
        obs = obs2
    envs.close()
    done = np.array(record_done)
    assert done.sum() >= 2  # the run crossed resets
    assert (np.array(record_obs)[:, :, :3] == 0).all(axis=(2, 3, 4)).any()  # reset stacks
    b = buf.get(buf.live_indices())
    assert len(b.actions) == len(buf) == 2 * 150
    for i, a in enumerate(b.actions):
        e, t = divmod(int(a), 1000)
        k = next(j for j in range(1, n + 1) if j == n or done[t + j - 1, e])
        np.testing.assert_array_equal(b.obs[i], record_obs[t][e])
        np.testing.assert_array_equal(b.next_obs[i], record_next[t + k - 1][e])
    assert buf.nbytes / buf.capacity < 4 * 84 * 84 / 3


def test_frame_dedup_short_episodes_drop_the_oldest_never_a_wrong_stack():
    """Episodes of 1 to 3 steps write whole first stacks often and outrun the frame margin: the
    oldest transitions leave early, and every one held still comes back exactly."""
    rng = np.random.default_rng(0)
    k, num_envs = 4, 2
    buf = ReplayBuffer(
        40, (k, 2, 2), np.uint8, (), np.int64, num_envs, n_step=2, frame_stack=k, prioritized=True
    )
    stacks = np.zeros((num_envs, k, 2, 2), np.uint8)
    stacks[:, -1] = rng.integers(1, 255, size=(num_envs, 2, 2))
    seen = {}
    for t in range(300):
        frame = rng.integers(1, 255, size=(num_envs, 2, 2), dtype=np.uint8)
        nxt = np.concatenate([stacks[:, 1:], frame[:, None]], axis=1)
        term = rng.random(num_envs) < 0.5
        buf.add(stacks, np.arange(num_envs) * 1000 + t, np.ones(num_envs), term, np.zeros(2, bool), nxt)
        for e in range(num_envs):
            seen[e * 1000 + t] = stacks[e].copy()
        stacks = nxt.copy()
        for e in np.flatnonzero(term):  # reset: zeros then a first frame
            stacks[e] = 0
            stacks[e, -1] = rng.integers(1, 255, size=(2, 2))
    assert 0 < len(buf) < buf.capacity  # some left early
    b = buf.get(buf.live_indices())
    for o, a in zip(b.obs, b.actions, strict=True):
        np.testing.assert_array_equal(o, seen[int(a)])
    held = buf.priorities.tree.get(np.arange(buf.capacity)) > 0
    np.testing.assert_array_equal(np.flatnonzero(held), np.sort(buf.live_indices()))
    assert np.isin(buf.sample(32).indices, buf.live_indices()).all()
