"""The Atari backend (`onebox.envs.atari.AtariEnvPool`, ale-py's vector engine underneath)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

ale_py = pytest.importorskip("ale_py")

import onebox.envs  # noqa: E402
from onebox.envs import atari_games  # noqa: E402

# Options that make ALE's reset deterministic and the protocol Gymnasium's AtariPreprocessing.
PLAIN = dict(noop_max=0, use_fire_reset=False, episodic_life=False, reward_clip=False)


def make(env_id: str = "Pong-v5", num_envs: int = 2, **kwargs):
    kwargs.setdefault("num_threads", 2)
    return onebox.envs.make(env_id, num_envs, **kwargs)


# ---- registration, spaces, presets -------------------------------------------------------------


def test_ids_and_backend():
    ids = onebox.envs.list_envs()
    assert {"Pong-v5", "Breakout-v5", "MsPacman-v5", "SpaceInvaders-v5"} <= set(ids)
    import gymnasium as gym

    gym.register_envs(ale_py)  # ale-py's own v5 ids: every game ALE runs single-player
    v5 = sorted(
        k.removeprefix("ALE/") for k in gym.registry if k.startswith("ALE/") and k.endswith("-v5")
    )
    assert atari_games.atari_ids() == v5
    assert onebox.envs.backend_of("Pong-v5") == "atari"
    assert onebox.envs.backend_of("ALE/Pong-v5") == "atari"
    assert onebox.envs.backend_of("CartPole-v1") == "native"
    assert onebox.envs.backend_of("Pongg-v5") is None
    with pytest.raises(ValueError, match="Did you mean: Pong-v5"):
        onebox.envs.make("Pongg-v5")


@pytest.mark.parametrize(
    ("preset", "actions", "sticky", "life", "fire"),
    [("envpool", 6, 0.0, True, True), ("machado", 18, 0.25, False, False)],
)
def test_spaces_dtypes_and_bounds(preset, actions, sticky, life, fire):
    with make("ALE/Pong-v5", 3, preset=preset) as envs:
        assert envs.spec.id == "Pong-v5"
        config = envs.spec.kwargs
        assert config["repeat_action_probability"] == sticky
        assert config["episodic_life"] is life and config["use_fire_reset"] is fire
        assert config["full_action_space"] is (preset == "machado")
        assert (config["frameskip"], config["stack_num"], config["img_height"]) == (4, 4, 84)
        assert config["max_num_frames_per_episode"] == 108_000 and config["reward_clip"]
        assert envs.single_observation_space.shape == (4, 84, 84)
        assert envs.single_observation_space.dtype == np.uint8
        assert envs.observation_space.shape == (3, 4, 84, 84)
        assert envs.single_action_space.n == actions
        obs, info = envs.reset(seed=0)
        assert obs in envs.observation_space
        assert info["env_id"].tolist() == [0, 1, 2] and info["lives"].dtype == np.int32
        for _ in range(5):
            obs, rew, term, trunc, info = envs.step(envs.action_space.sample())
        assert obs in envs.observation_space and obs.max() > 0
        assert rew.dtype == np.float32 and rew.shape == (3,)
        assert term.dtype == np.bool_ and trunc.dtype == np.bool_
        assert info["episode_return"].shape == (3,) and info["_episode_return"].dtype == np.bool_


def test_options_override_the_preset():
    with make(preset="machado", stack_num=1, grayscale=False, img_height=50, img_width=40) as e:
        assert e.single_observation_space.shape == (1, 50, 40, 3)
        assert e.single_action_space.n == 18
        assert e.spec.kwargs["repeat_action_probability"] == 0.25
        obs, _ = e.reset(seed=1)
        assert obs.shape == (2, 1, 50, 40, 3)


def test_bad_options():
    with pytest.raises(TypeError, match="Did you mean stack_num"):
        make(stack_nums=2)
    with pytest.raises(TypeError, match="'frameskip' takes a int"):
        make(frameskip=2.5)
    with pytest.raises(ValueError, match="frameskip must be >= 1"):
        make(frameskip=0)
    with pytest.raises(ValueError, match=r"repeat_action_probability must be in \[0, 1\]"):
        make(repeat_action_probability=1.5)
    with pytest.raises(ValueError, match="unknown Atari preset 'gym'"):
        make(preset="gym")
    with pytest.raises(ValueError, match="batch_size must be between 1 and num_envs"):
        make(batch_size=3)
    with pytest.raises(ValueError, match="autoreset_mode"):
        make(autoreset_mode="Disabled")


# ---- seeding and threads -----------------------------------------------------------------------


def _rollout(num_threads: int, seed: int, steps: int = 60) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    with make("Breakout-v5", 3, num_threads=num_threads, seed=seed) as envs:
        obs, info = envs.reset()
        out += [obs, info["frame_number"]]
        for _ in range(steps):
            obs, rew, term, trunc, info = envs.step(rng.integers(0, 4, 3))
            out += [obs, rew, term, trunc, info["lives"]]
    return out


def test_same_seed_same_results_whatever_the_threads():
    one, two = _rollout(1, seed=7), _rollout(2, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(one, two, strict=True))


def test_reset_seed_reproduces_and_env_i_gets_seed_plus_i():
    with make("Breakout-v5", 2) as envs:
        first = envs.reset(seed=11)[1]["frame_number"]
        envs.step(np.zeros(2, dtype=np.int64))
        again = envs.reset(seed=11)[1]["frame_number"]
        assert np.array_equal(first, again)
        shifted = envs.reset(seed=[12, 13])[1]["frame_number"]
    with make("Breakout-v5", 1, seed=12) as single:  # env 1 of seed 11 is env 0 of seed 12
        assert single.reset()[1]["frame_number"][0] == first[1] == shifted[0]


# ---- async -------------------------------------------------------------------------------------


def test_async_recv_returns_batches_and_every_sent_env_comes_back():
    rng = np.random.default_rng(1)
    with make("Pong-v5", 4, batch_size=2) as envs:
        envs.async_reset(seed=3)
        owed = {0: 1, 1: 1, 2: 1, 3: 1}  # results each env is owed
        for k in range(60):
            obs, *_, info = envs.recv()
            ids = info["env_id"]
            assert obs.shape == (2, 4, 84, 84) and len(set(ids.tolist())) == 2
            for i in ids.tolist():
                owed[i] -= 1
                assert owed[i] == 0
            if k % 2:  # any order, and partial sends completed before the next recv
                envs.send(rng.integers(0, 6, 2), ids[::-1])
            else:
                envs.send(rng.integers(0, 6, 1), ids[:1])
                envs.send(rng.integers(0, 6, 1), ids[1:])
            for i in ids.tolist():
                owed[i] += 1
        assert list(owed.values()) == [1, 1, 1, 1]  # each result answered one send, none lost


def test_async_protocol_errors():
    with make("Pong-v5", 3, batch_size=2) as envs:
        with pytest.raises(RuntimeError, match=r"recv\(\) with nothing pending"):
            envs.recv()
        with pytest.raises(RuntimeError, match="step\\(\\) needs batch_size == num_envs"):
            envs.step(np.zeros(3, dtype=np.int64))
        with pytest.raises(RuntimeError, match="reset\\(\\) needs batch_size == num_envs"):
            envs.reset()
        envs.async_reset()
        ids = envs.recv()[4]["env_id"]
        with pytest.raises(RuntimeError, match="still wait for their actions"):
            envs.recv()  # instead of waiting forever for a batch of 2 with 1 env in flight
        other = next(i for i in range(3) if i not in ids)
        with pytest.raises(ValueError, match=f"env {other} is not waiting for an action"):
            envs.send(np.zeros(2, dtype=np.int64), [ids[0], other])
        with pytest.raises(ValueError, match="duplicates"):
            envs.send(np.zeros(2, dtype=np.int64), [ids[0], ids[0]])
        envs.send(np.zeros(1, dtype=np.int64), ids[:1])
        with pytest.raises(RuntimeError, match="still wait for their actions"):
            envs.recv()
        envs.send(np.zeros(1, dtype=np.int64), ids[1:])
        assert len(envs.recv()[4]["env_id"]) == 2
        envs.async_reset(seed=5)  # steps are in flight: ALE's engine is rebuilt
        assert len(envs.recv()[4]["env_id"]) == 2


def test_sync_pool_async_api_and_reset_with_steps_in_flight():
    with make("Pong-v5", 2) as envs:
        envs.async_reset(seed=0)
        obs, rew, _, _, info = envs.recv()
        assert info["env_id"].tolist() == [0, 1] and not rew.any()
        envs.send(np.ones(2, dtype=np.int64), [1, 0])
        with pytest.raises(RuntimeError, match="recv\\(\\) them first"):
            envs.step(np.zeros(2, dtype=np.int64))
        reset_obs, _ = envs.reset(seed=0)  # drops the steps in flight
        assert np.array_equal(reset_obs, obs)
        envs.step(np.zeros(2, dtype=np.int64))


# ---- agreement with Gymnasium ------------------------------------------------------------------


def test_agrees_with_gymnasium_atari_preprocessing_for_a_whole_game():
    """Gymnasium's ALE/Pong-v5 (frameskip=1, no sticky actions) + AtariPreprocessing (frameskip 4,
    max-pool, grayscale, 84x84 area resize, no no-ops) + FrameStackObservation(4) gives the same
    observations, rewards and flags, step by step, for a whole game and the reset after it. Where
    the protocols differ the test aligns them: ALE fills the first stack with zero frames
    (`padding_type="zero"`, where Gymnasium's default repeats the first frame); Gymnasium has no
    FIRE reset, so it is off, and ALE's random no-ops draw from another generator, so they are off;
    Gymnasium resets by hand where this pool autoresets (NextStep)."""
    pytest.importorskip("cv2")
    import gymnasium as gym
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)
    ref = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0)
    ref = AtariPreprocessing(ref, noop_max=0, frame_skip=4, screen_size=84, grayscale_obs=True)
    ref = FrameStackObservation(ref, 4, padding_type="zero")
    rng = np.random.default_rng(0)
    with make("Pong-v5", 1, num_threads=1, **PLAIN) as envs:
        expected, _ = ref.reset(seed=3)
        obs, _ = envs.reset(seed=3)
        assert np.array_equal(obs[0], expected)
        total, steps = 0.0, 0
        while True:
            a = int(rng.integers(6))
            expected, r, te, tr, _ = ref.step(a)
            obs, rew, term, trunc, info = envs.step(np.array([a]))
            total, steps = total + r, steps + 1
            assert np.array_equal(obs[0], expected), steps
            assert (rew[0], term[0], trunc[0]) == (r, te, tr), steps
            assert info["_episode_return"][0] == (te or tr)
            if te or tr:
                break
        assert info["episode_return"][0] == total and info["episode_length"][0] == steps
        expected, _ = ref.reset()
        obs, rew, term, trunc, info = envs.step(np.array([3]))  # the autoreset step
        assert np.array_equal(obs[0], expected)
        assert rew[0] == 0 and not term[0] and not trunc[0] and not info["_episode_return"][0]


# ---- episodic life, reward clipping, the true score ---------------------------------------------


def test_episodic_life_reward_clipping_and_whole_game_return():
    """Against the same game without the pool's episodic life and clipping (fed the FIRE the pool
    presses after a lost life): terminated at each lost life, rewards clipped to their sign (0 on
    the reset step after a lost life), and at game over only, the whole-game unclipped score."""
    rng = np.random.default_rng(2)
    kw = dict(seed=4, num_threads=1)
    with (
        make("SpaceInvaders-v5", 1, **kw) as envs,
        make("SpaceInvaders-v5", 1, **kw, **dict(episodic_life=False, reward_clip=False)) as ref,
    ):
        fire = 1  # SpaceInvaders' minimal action set: NOOP, FIRE, ...
        obs, info = envs.reset()
        ref_obs, ref_info = ref.reset()
        assert np.array_equal(obs, ref_obs)
        lives, total, steps, life_losses, after_loss = ref_info["lives"][0], 0.0, 0, 0, False
        biggest = 0.0
        while True:
            a = np.array([rng.integers(6)])
            obs, rew, term, trunc, info = envs.step(a)
            ref_obs, r, te, tr, ref_info = ref.step(np.array([fire]) if after_loss else a)
            assert np.array_equal(obs, ref_obs)
            total, steps = total + float(r[0]), steps + 1
            biggest = max(biggest, float(r[0]))
            lost = ref_info["lives"][0] < lives
            lives = ref_info["lives"][0]
            assert rew[0] == (0.0 if after_loss else np.sign(r[0]))
            assert term[0] == (te[0] or lost) and trunc[0] == tr[0]
            assert info["_episode_return"][0] == (te[0] or tr[0])
            life_losses += lost and not te[0]
            after_loss = lost and not te[0]
            if te[0] or tr[0]:
                break
            assert info["episode_return"][0] == 0
        assert life_losses >= 2 and biggest > 1  # so clipping changed rewards
        assert info["episode_return"][0] == total and info["episode_length"][0] == steps
        _, rew, term, _, info = envs.step(np.array([2]))  # the autoreset starts a new game
        assert info["lives"][0] == 3 and not term[0] and not info["_episode_return"][0]


def test_same_step_mode_final_obs_at_life_loss_and_game_over():
    rng = np.random.default_rng(3)
    with make("Breakout-v5", 1, num_threads=1, autoreset_mode="SameStep", seed=1) as envs:
        envs.reset()
        seen_life_loss = False
        for _ in range(3000):
            obs, _, term, _, info = envs.step(rng.integers(0, 4, 1))
            if term[0] and not info["_episode_return"][0]:  # a lost life: the game goes on
                assert np.array_equal(info["final_obs"][0], obs[0])
                seen_life_loss = True
            if info["_episode_return"][0]:
                assert info["_final_obs"][0] and info["final_info"]["_episode_return"][0]
                assert info["final_info"]["episode_return"][0] == info["episode_return"][0]
                assert info["lives"][0] == 5  # the observation already starts the next game
                break
            if not term[0]:
                assert "final_obs" not in info
        assert seen_life_loss and info["_episode_return"][0]


# ---- bad input and lifecycle -------------------------------------------------------------------


def test_bad_actions_and_resets():
    with make("Pong-v5", 2) as envs:
        envs.reset(seed=0)
        with pytest.raises(TypeError, match="must be integers"):
            envs.step(np.zeros(2, dtype=np.float32))
        with pytest.raises(ValueError, match=r"shape \(2,\)"):
            envs.step(np.zeros(3, dtype=np.int64))
        with pytest.raises(ValueError, match=r"action 6 is out of range \[0, 6\)"):
            envs.step(np.array([0, 6]))
        with pytest.raises(ValueError, match=r"action -1 is out of range"):
            envs.step(np.array([-1, 0]))
        with pytest.raises(ValueError, match=r"env id 2 is out of range"):
            envs.send(np.zeros(1, dtype=np.int64), [2])
        with pytest.raises(ValueError, match="no reset options other than reset_mask"):
            envs.reset(options={"noop_max": 0})
        with pytest.raises(ValueError, match="seeds"):
            envs.reset(seed=[1])
        envs.step(np.array([0, 5]))  # still usable after the errors


def test_use_after_close_raises():
    envs = make("Pong-v5", 2)
    envs.close()
    calls = {
        "reset": envs.reset,
        "step": lambda: envs.step(np.zeros(2, dtype=np.int64)),
        "async_reset": envs.async_reset,
        "send": lambda: envs.send(np.zeros(2, dtype=np.int64)),
        "recv": envs.recv,
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match="the env pool is closed"):
            call()
        assert envs.closed, name


def test_without_ale_py(monkeypatch):
    code = (
        "import sys, onebox.envs; onebox.envs.make('CartPole-v1'); print('ale_py' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # ale-py is imported only for Atari envs

    monkeypatch.setitem(sys.modules, "ale_py", None)  # `import ale_py` now fails
    atari_games.games.cache_clear()
    try:
        assert "Pong-v5" not in onebox.envs.list_envs()  # ALE/ ids may stay, via Gymnasium
        with pytest.raises(ImportError, match=r'pip install "onebox\[atari\]"'):
            onebox.envs.make("Pong-v5")
    finally:
        atari_games.games.cache_clear()


def test_ledger_against_hand_computed_steps():
    """`atari_ledger` (the pool's per-env bookkeeping in C++) on one hand-checked batch."""
    from onebox import _engine

    # env 0: plays on (+3); env 1: loses a life; env 2: game over by truncation after a life's
    # reset step; env 3: its first result after a game over (ALE's NextStep reset step).
    ret = np.array([10.0, 2.0, -4.0, 99.0])
    length = np.array([5, 7, 9, 11], dtype=np.int64)
    lives = np.array([3, 3, 1, 0], dtype=np.int32)
    game_reset = np.array([False, False, False, True])
    life_reset = np.array([False, False, True, False])
    ids = np.array([2, 0, 3, 1], dtype=np.int32)  # ALE's order
    raw = np.array([-2, 3, 5, 0], dtype=np.int32)
    term = np.zeros(4, dtype=bool)
    trunc = np.array([True, False, False, False])
    new_lives = np.array([1, 3, 5, 2], dtype=np.int32)
    out = [np.empty(4, np.float32), *(np.empty(4, bool) for _ in range(3)), np.empty(4),
           np.empty(4, np.int64)]  # fmt: skip
    _engine.atari_ledger(ret, length, lives, game_reset, life_reset, ids, raw, term, trunc,
                         new_lives, *out, True, True, True)  # fmt: skip
    reward, terminated, over, lost, game_ret, game_len = out
    np.testing.assert_array_equal(reward, [0.0, 1.0, 1.0, 0.0])  # env 2's reset step pays 0
    np.testing.assert_array_equal(terminated, [False, False, False, True])
    np.testing.assert_array_equal(over, [True, False, False, False])
    np.testing.assert_array_equal(lost, [False, False, False, True])
    np.testing.assert_array_equal(game_ret, [-6.0, 0.0, 0.0, 0.0])  # unclipped: -4 - 2
    np.testing.assert_array_equal(game_len, [10, 0, 0, 0])
    np.testing.assert_array_equal(ret, [13.0, 2.0, 0.0, 0.0])  # env 3's reset step: a new game
    np.testing.assert_array_equal(length, [6, 8, 0, 0])
    np.testing.assert_array_equal(lives, [3, 2, 1, 5])
    np.testing.assert_array_equal(game_reset, [False, False, True, False])
    np.testing.assert_array_equal(life_reset, [False, True, False, False])
    with pytest.raises(IndexError, match="env id 4 out of range"):
        _engine.atari_ledger(ret, length, lives, game_reset, life_reset, ids + 2, raw, term,
                             trunc, new_lives, *out, True, True, True)  # fmt: skip
    with pytest.raises(TypeError):  # state arrays of another dtype would be copied: refused
        _engine.atari_ledger(ret.astype(np.float32), length, lives, game_reset, life_reset, ids,
                             raw, term, trunc, new_lives, *out, True, True, True)  # fmt: skip
