"""The replay core: sum tree, n-step returns, priorities and importance weights, frame
deduplication against a real Atari pool, R2D2 sequences against an LSTM, save/load, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from onebox.replay import ReplayBuffer, SequenceReplay, mixed_priority
from onebox.replay.nstep import NStepStaging
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
        counts += np.bincount(tree.sample_stratified(512, rng)[0], minlength=k)
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
    idx, _ = tree.sample_stratified(4, np.random.default_rng(0))
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


@pytest.mark.parametrize(("n_step", "frame_stack"), [(1, 0), (3, 0), (3, 2)])
def test_adding_a_block_of_steps_equals_adding_them_one_by_one(n_step: int, frame_stack: int):
    """An actor's unroll added at once (`add_steps`) leaves the table, its staging, frames and
    priorities exactly as adding its steps one by one does, for some envs of the table, across
    blocks, through terminations and truncations."""
    rng = np.random.default_rng(n_step + frame_stack)
    shape = (frame_stack, 3) if frame_stack else (3,)
    one, block = (ReplayBuffer(60, shape, np.float32, (), np.int64, 6, n_step=n_step, gamma=0.9,
                               prioritized=True, frame_stack=frame_stack) for _ in range(2))  # fmt: skip
    envs, t_len = np.array([1, 2, 4]), 5
    obs = rng.normal(size=(3, *shape)).astype(np.float32)
    for _ in range(6):
        steps = []
        for _ in range(t_len):
            nxt = rng.normal(size=(3, *shape)).astype(np.float32)
            if frame_stack:  # stacks shifted by one frame, as Atari's are
                nxt[:, :-1] = obs[:, 1:]
            term, trunc = rng.random(3) < 0.15, rng.random(3) < 0.1
            steps.append((obs, rng.integers(4, size=3), rng.normal(size=3), term, trunc, nxt,
                          rng.random(3)))  # fmt: skip
            obs = np.where((term | trunc)[:, None, None] if frame_stack else (term | trunc)[:, None],
                           rng.normal(size=(3, *shape)).astype(np.float32), nxt)  # fmt: skip
        for step in steps:
            one.add(*step, envs=envs)
        block.add_steps(*(np.stack(x) for x in zip(*steps, strict=True)), envs=envs)
        a, b = one.state_dict(), block.state_dict()
        assert a.keys() == b.keys()
        staged = np.arange(n_step) < a["staging.count"][:, None]  # ring slots beyond: unused
        for k in a:
            if k.startswith(("staging.data.", "staging.rewards")):
                np.testing.assert_array_equal(a[k][staged], b[k][staged], err_msg=k)
            else:
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert len(block) == 30  # 3 envs of 10 slots: full, the FIFO wrapped


@pytest.mark.parametrize("t_len", [1, 4])
def test_one_step_transitions_equal_the_general_windows(t_len: int):
    """n_step 1's own path (`_push_single`) emits what the general one (`_push_windows`) does
    for the same blocks: the same transitions, in the same order, with the same fields, returns
    and discounts, through terminations and truncations, for some envs of the staging."""
    rng = np.random.default_rng(t_len)
    fields = {"obs": ((2,), np.dtype(np.float32)), "action": ((), np.dtype(np.int64))}
    staging = NStepStaging(5, 1, 0.9, fields)
    envs = np.array([0, 2, 3])
    for _ in range(20):
        block = {"obs": rng.normal(size=(t_len, 3, 2)).astype(np.float32),
                 "action": rng.integers(4, size=(t_len, 3))}  # fmt: skip
        rewards = rng.normal(size=(t_len, 3))
        term, trunc = rng.random((t_len, 3)) < 0.2, rng.random((t_len, 3)) < 0.2
        fast = staging._push_single(block, rewards, term, envs)
        windows = staging._push_windows(block, rewards, term, trunc, envs)
        for name in ("envs", "rows", "steps", "returns", "discounts"):
            np.testing.assert_array_equal(getattr(fast, name), getattr(windows, name), name)
        for name in fields:
            np.testing.assert_array_equal(fast.fields[name], windows.fields[name], name)
        assert len(fast.envs) == 3 * t_len and not staging.count.any()


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
        buf.add(
            stacks, np.arange(num_envs) * 1000 + t, np.ones(num_envs), term, np.zeros(2, bool), nxt
        )
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

    def held() -> np.ndarray:
        return np.flatnonzero(buf.priorities.tree.get(np.arange(buf.capacity)) > 0)

    np.testing.assert_array_equal(held(), np.sort(buf.live_indices()))
    batch = buf.sample(32)
    assert np.isin(batch.indices, buf.live_indices()).all()
    # slots that left between sampling and the priority update stay out of the table
    for t in range(300, 310):
        frame = rng.integers(1, 255, size=(num_envs, 2, 2), dtype=np.uint8)
        nxt = np.concatenate([stacks[:, 1:], frame[:, None]], axis=1)
        buf.add(stacks, [t, 1000 + t], np.ones(2), np.ones(2, bool), np.zeros(2, bool), nxt)
        stacks = np.zeros_like(stacks)
        stacks[:, -1] = frame
    assert not np.isin(batch.indices, buf.live_indices()).all()
    buf.update_priorities(batch.indices, np.ones(32))
    np.testing.assert_array_equal(held(), np.sort(buf.live_indices()))


# ---- sequences -------------------------------------------------------------------------------


def test_sequence_state_replayed_through_burn_in_is_the_actors():
    """An LSTM actor over 2 envs with episode ends (its state zeroed at each start); every stored
    sequence, unrolled from its stored (h, c), reproduces the actor's states step by step, so the
    state after the burn-in is the one the actor had there. Sequences never cross episodes."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(3, 8)
    rng = np.random.default_rng(0)
    num_envs, seq_len, overlap, burn_in = 2, 10, 5, 4
    seq = SequenceReplay(
        64, (3,), np.float32, (), np.int64, num_envs, 8, seq_len=seq_len, overlap=overlap,
        burn_in=burn_in,
    )  # fmt: skip
    h = torch.zeros(1, num_envs, 8)
    c = torch.zeros(1, num_envs, 8)
    states, episode = {}, np.zeros(num_envs, dtype=int)
    obs = rng.standard_normal((num_envs, 3)).astype(np.float32)
    for t in range(60):
        term = rng.random(num_envs) < 0.04
        trunc = (rng.random(num_envs) < 0.03) & ~term
        nxt = rng.standard_normal((num_envs, 3)).astype(np.float32)
        for e in range(num_envs):
            states[(e, t)] = (h[0, e].numpy().copy(), c[0, e].numpy().copy(), episode[e])
        seq.add(obs, 100 * np.arange(num_envs) + t, rng.random(num_envs), term, trunc, nxt,
                (h[0].numpy(), c[0].numpy()))  # fmt: skip
        with torch.no_grad():
            _, (h, c) = lstm(torch.from_numpy(obs)[None], (h, c))
        done = torch.from_numpy(term | trunc)
        h[:, done] = 0
        c[:, done] = 0
        episode += term | trunc
        obs = nxt
    b = seq.get(np.arange(len(seq)))
    assert len(seq) >= 10 and not b.mask.all()  # some padded sequences (episode ends)
    for i in range(len(seq)):
        valid = np.flatnonzero(b.mask[i])
        assert valid.tolist() == list(range(len(valid)))
        ids = b.actions[i, valid]
        e, t0 = divmod(int(ids[0]), 100)
        assert ids.tolist() == list(range(ids[0], ids[0] + len(valid)))  # consecutive steps
        ep = {states[(e, t0 + j)][2] for j in range(len(valid))}
        assert len(ep) == 1  # one episode
        ep_start = min(t for (e2, t), st in states.items() if e2 == e and st[2] in ep)
        assert (t0 - ep_start) % (seq_len - overlap) == 0 or len(valid) < seq_len
        hs, cs = (
            torch.from_numpy(b.hidden[0][i])[None, None],
            torch.from_numpy(b.hidden[1][i])[None, None],
        )
        np.testing.assert_array_equal(hs[0, 0].numpy(), states[(e, t0)][0])
        with torch.no_grad():
            for j in range(len(valid)):
                h_true, c_true, _ = states[(e, t0 + j)]
                np.testing.assert_allclose(hs[0, 0].numpy(), h_true, atol=1e-6)
                np.testing.assert_allclose(cs[0, 0].numpy(), c_true, atol=1e-6)
                x = torch.from_numpy(b.obs[i, j])[None, None]
                _, (hs, cs) = lstm(x, (hs, cs))
        assert not b.obs[i, len(valid) + 1 :].any() and not b.rewards[i, len(valid) :].any()


def test_sequence_windows_overlap_and_end_partial():
    """One env, seq_len 4, overlap 2: an episode of 9 steps gives [0, 4), [2, 6), [4, 8) and the
    unfinished [6, 9) padded; the obs after the last step is the final obs."""
    seq = SequenceReplay(16, (1,), np.float32, (), np.int64, 1, 2, seq_len=4, overlap=2, burn_in=1)
    zero = np.zeros((1, 2), np.float32)
    for t in range(9):
        o = np.full((1, 1), t, np.float32)
        end = np.array([t == 8])
        nxt = np.full((1, 1), 100 if t == 8 else t + 1, np.float32)
        seq.add(o, [t], [1.0], end, np.zeros(1, bool), nxt, (zero, zero))
    b = seq.get(np.arange(len(seq)))
    assert [r[m].tolist() for r, m in zip(b.actions, b.mask, strict=True)] == [
        [0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7], [6, 7, 8],
    ]  # fmt: skip
    assert b.obs[0, :, 0].tolist() == [0, 1, 2, 3, 4]
    assert b.obs[3, :, 0].tolist() == [6, 7, 8, 100, 0]
    assert b.terminated[3].tolist() == [False, False, True, False]
    assert b.first.tolist() == [True, False, False, False]  # [0, 4) begins the episode
    seq.update_priorities(np.array([1, 3]), mixed_priority(np.ones((2, 4)), b.mask[[1, 3]]))
    np.testing.assert_allclose(
        seq.priorities.tree.get([0, 1, 2, 3]), [1, (1 + 1e-6) ** 0.9, 1, (1 + 1e-6) ** 0.9]
    )
    assert np.allclose(
        mixed_priority(np.array([[1.0, 3.0, 9.0]]), np.array([[1, 1, 0]], bool)), 0.9 * 3 + 0.1 * 2
    )


def test_sequence_adds_of_some_envs_equal_adds_of_all():
    """Two actors adding their own envs (`envs=`) fill the table as one add of every env would."""
    rng = np.random.default_rng(0)
    kw = dict(capacity=64, obs_shape=(2,), obs_dtype=np.float32, action_shape=(),
              action_dtype=np.int64, num_envs=4, hidden_size=3, seq_len=6, overlap=3, burn_in=2)  # fmt: skip
    whole, split = SequenceReplay(**kw), SequenceReplay(**kw)
    for _ in range(40):
        o, nxt = rng.standard_normal((2, 4, 2)).astype(np.float32)
        a, r = rng.integers(0, 2, 4), rng.random(4)
        term, trunc = rng.random(4) < 0.1, np.zeros(4, bool)
        h, c = rng.standard_normal((2, 4, 3)).astype(np.float32)
        whole.add(o, a, r, term, trunc, nxt, (h, c))
        for rows in ([0, 1], [2, 3]):
            split.add(o[rows], a[rows], r[rows], term[rows], trunc[rows], nxt[rows],
                      (h[rows], c[rows]), envs=np.array(rows))  # fmt: skip
    assert len(whole) == len(split) > 10

    def rows(seq: SequenceReplay) -> list:
        b = seq.get(np.arange(len(seq)))
        parts = (b.obs, b.actions, b.mask, b.first, b.hidden[0], b.hidden[1])
        return sorted([p[i].tolist() for p in parts] for i in range(len(seq)))

    assert rows(whole) == rows(split)
    with pytest.raises(ValueError, match="increasing env ids"):
        split.add(o[:2], a[:2], r[:2], term[:2], trunc[:2], nxt[:2], (h[:2], c[:2]), envs=[3, 2])


# ---- save and load ---------------------------------------------------------------------------


def fill(buf: ReplayBuffer, steps: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = buf.frame_stack
    stacks = rng.integers(0, 255, size=(buf.num_envs, *buf.obs_shape), dtype=np.uint8)
    for t in range(steps):
        nxt = np.concatenate(
            [stacks[:, 1:], rng.integers(0, 255, (buf.num_envs, 1, 3, 3), np.uint8)], 1
        )
        term = rng.random(buf.num_envs) < 0.1
        buf.add(stacks, np.full(buf.num_envs, t), rng.random(buf.num_envs), term,
                np.zeros(buf.num_envs, bool), nxt)  # fmt: skip
        stacks = np.where(
            term[:, None, None, None], rng.integers(0, 255, stacks.shape, np.uint8), nxt
        )
    assert k == stacks.shape[1]


def test_save_load_round_trip_samples_the_same(tmp_path):
    args = dict(capacity=60, obs_shape=(4, 3, 3), obs_dtype=np.uint8, action_shape=(),
                action_dtype=np.int64, num_envs=3, n_step=3, prioritized=True, frame_stack=4)  # fmt: skip
    a = ReplayBuffer(**args, seed=5)
    fill(a, 50, 0)
    b0 = a.sample(16)
    a.update_priorities(b0.indices, np.arange(16.0))
    a.save(tmp_path / "replay.npz")
    b = ReplayBuffer(**args, seed=99)
    b.load(tmp_path / "replay.npz")
    for _ in range(3):  # same draws, and the same after more steps
        x, y = a.sample(32), b.sample(32)
        for name in ("obs", "actions", "returns", "next_obs", "discounts", "weights", "indices"):
            np.testing.assert_array_equal(getattr(x, name), getattr(y, name))
        fill(a, 5, 1)
        fill(b, 5, 1)
    with pytest.raises(ValueError, match="other arguments"):
        ReplayBuffer(**{**args, "n_step": 2}).load(tmp_path / "replay.npz")

    s = SequenceReplay(8, (2,), np.float32, (), np.int64, 1, 4, seq_len=4, overlap=2, burn_in=2)
    z = np.zeros((1, 4), np.float32)
    for t in range(12):
        o = np.full((1, 2), t, np.float32)
        s.add(o, [t], [1.0], np.array([t == 6]), np.zeros(1, bool), o + 1, (z + t, z))
    s.save(tmp_path / "seq.npz")
    s2 = SequenceReplay(8, (2,), np.float32, (), np.int64, 1, 4, seq_len=4, overlap=2, burn_in=2)
    s2.load(tmp_path / "seq.npz")
    x, y = s.sample(8), s2.sample(8)
    np.testing.assert_array_equal(x.obs, y.obs)
    np.testing.assert_array_equal(x.hidden[0], y.hidden[0])
    np.testing.assert_array_equal(x.indices, y.indices)


# ---- bad input -------------------------------------------------------------------------------


def test_bad_input_is_a_clear_error():
    def make(**kw):
        args = dict(capacity=8, obs_shape=(2,), obs_dtype=np.float32, action_shape=(),
                    action_dtype=np.int64, num_envs=2)  # fmt: skip
        return ReplayBuffer(**{**args, **kw})

    with pytest.raises(ValueError, match="n_step"):
        make(n_step=0)
    with pytest.raises(ValueError, match="alpha"):
        make(prioritized=True, alpha=1.5)
    with pytest.raises(ValueError, match="beta"):
        make(prioritized=True, beta=-0.1)
    with pytest.raises(ValueError, match="gamma"):
        make(gamma=1.1)
    with pytest.raises(ValueError, match="at least num_envs"):
        make(capacity=1)
    with pytest.raises(ValueError, match="frame_stack"):
        make(frame_stack=4)
    buf = make(prioritized=True)
    o, f = np.zeros((2, 2), np.float32), np.zeros(2, bool)
    with pytest.raises(ValueError, match="empty"):
        buf.sample(4)
    buf.add(o, [0, 1], [0, 0], f, f, o)
    with pytest.raises(ValueError, match="larger than the capacity"):
        buf.sample(9)
    with pytest.raises(ValueError, match="obs must be float32 of shape"):
        buf.add(o.astype(np.float64), [0, 1], [0, 0], f, f, o)
    with pytest.raises(ValueError, match=r"next_obs must be float32 of shape \(2, 2\)"):
        buf.add(o, [0, 1], [0, 0], f, f, o[:1])
    with pytest.raises(ValueError, match="actions must have shape"):
        buf.add(o, [0, 1, 2], [0, 0], f, f, o)
    with pytest.raises(TypeError, match="actions must have dtype int64"):
        buf.add(o, [0.5, 1.0], [0, 0], f, f, o)
    with pytest.raises(ValueError, match="terminated must be a bool"):
        buf.add(o, [0, 1], [0, 0], [0, 1], f, o)

    def steps(t: int, rewards_shape: tuple[int, ...] | None = None) -> list[np.ndarray]:
        """`add_steps`' arguments for t steps of the 2 envs."""
        r = np.zeros(rewards_shape or (t, 2))
        return [np.zeros((t, 2, 2), np.float32), np.zeros((t, 2), np.int64), r,
                np.zeros((t, 2), bool), np.zeros((t, 2), bool), np.zeros((t, 2, 2), np.float32)]  # fmt: skip

    with pytest.raises(ValueError, match=r"rewards must have shape \(3, 2\)"):
        buf.add_steps(*steps(3, rewards_shape=(3, 1)))
    with pytest.raises(ValueError, match="add fewer steps per call or make the table larger"):
        buf.add_steps(*steps(5))  # 4 slots per env
    with pytest.raises(ValueError, match="finite"):
        buf.update_priorities(buf.live_indices(), [np.nan, 1.0])
    with pytest.raises(IndexError, match="slots"):
        buf.update_priorities([8], [1.0])
    with pytest.raises(ValueError, match="uniform"):
        make().update_priorities([0], [1.0])
    with pytest.raises(ValueError, match="burn_in"):
        SequenceReplay(8, (2,), np.float32, (), np.int64, 1, 4, seq_len=10, overlap=5, burn_in=10)
    with pytest.raises(ValueError, match="overlap"):
        SequenceReplay(8, (2,), np.float32, (), np.int64, 1, 4, seq_len=10, overlap=10, burn_in=2)


def test_bench_replay_runs(capsys):
    pytest.importorskip("cpprb")
    from onebox import cli

    argv = ["bench", "replay", "--capacity", "2048", "--rounds", "1", "--seconds", "0.05"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "cpprb" in out and "bytes/transition" in out and "7,563" in out
