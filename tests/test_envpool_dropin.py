"""`onebox.envpool`, EnvPool's API on onebox: CleanRL's EnvPool scripts run with only their import
changed; EnvPool's arguments, info keys, elapsed-step counting and gym/gymnasium APIs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ale_py")

import onebox.envpool as envpool

CLEANRL = Path(__file__).resolve().parents[1].parent / "shared" / "peers" / "cleanrl"


# ---- CleanRL's EnvPool scripts, unchanged but for their import ---------------------------------


@pytest.mark.parametrize("script", ["ppo_atari_envpool.py", "pqn_atari_envpool.py"])
def test_cleanrl_envpool_script_runs(script: str, tmp_path: Path) -> None:
    pytest.importorskip("gym")
    source = CLEANRL / script
    if not source.is_file():
        pytest.skip(f"CleanRL's scripts are not at {CLEANRL}")
    text = source.read_text()
    assert text.count("\nimport envpool\n") == 1
    (tmp_path / script).write_text(
        text.replace("\nimport envpool\n", "\nimport onebox.envpool as envpool\n")
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")  # one torch thread: quick on a shared machine
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CLEANRL), env.get("PYTHONPATH")]))
    # 8 envs x 128 steps (the scripts' defaults), 2 iterations, on the CPU.
    run = subprocess.run(
        [sys.executable, script, "--total-timesteps", "2048", "--no-cuda"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "episodic_return=" in run.stdout, run.stdout[-3000:]  # a whole game of Breakout ended
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (tmp_path / "runs").glob("*/events.out.tfevents.*")
    acc = EventAccumulator(str(events))
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    assert {"charts/episodic_return", "charts/SPS"} <= set(scalars)
    returns = [e.value for e in acc.Scalars("charts/episodic_return")]
    assert returns and all(r >= 0 for r in returns)


# ---- arguments ---------------------------------------------------------------------------------


def test_atari_arguments_map_onto_the_atari_pool() -> None:
    envs = envpool.make_gymnasium(
        "Breakout-v5", num_envs=2, stack_num=2, img_height=64, img_width=48, frame_skip=3,
        noop_max=7, repeat_action_probability=0.1, full_action_space=True, use_fire_reset=False,
        episodic_life=True, max_episode_steps=1000, num_threads=1,
    )  # fmt: skip
    with envs:
        config = envs.spec.kwargs
        assert (config["stack_num"], config["img_height"], config["img_width"]) == (2, 64, 48)
        assert (config["frameskip"], config["noop_max"]) == (3, 7)
        assert config["repeat_action_probability"] == 0.1
        assert config["full_action_space"] and not config["use_fire_reset"]
        assert config["episodic_life"] and config["max_num_frames_per_episode"] == 3000
        assert envs.observation_space.shape == envs.single_observation_space.shape == (2, 64, 48)
        assert envs.action_space.n == 18
        obs, _ = envs.reset()
        assert obs.shape == (2, 2, 64, 48) and obs.dtype == np.uint8
    with envpool.make_gymnasium("Breakout-v5", num_envs=1) as envs:  # EnvPool's defaults
        config = envs.spec.kwargs
        assert not config["episodic_life"] and config["max_num_frames_per_episode"] == 108_000
        assert (config["stack_num"], config["frameskip"], config["noop_max"]) == (4, 4, 30)
        assert envs.action_space.n == 4


def test_rgb_frames_are_stacked_channels_first_as_envpool() -> None:
    import onebox.envs

    kwargs = dict(stack_num=3, noop_max=0, seed=5, num_threads=1)
    with (
        envpool.make_gymnasium("Pong-v5", num_envs=2, gray_scale=False, **kwargs) as envs,
        onebox.envs.make("Pong-v5", 2, grayscale=False, **kwargs) as raw,
    ):
        assert envs.observation_space.shape == (9, 84, 84)
        obs, _ = envs.reset()
        ref, _ = raw.reset()
        for _ in range(6):
            action = np.array([2, 3])
            obs, *_ = envs.step(action)
            ref, *_ = raw.step(action)
        assert ref.shape == (2, 3, 84, 84, 3)
        for frame in range(3):
            np.testing.assert_array_equal(
                obs[:, 3 * frame : 3 * frame + 3], ref[:, frame].transpose(0, 3, 1, 2)
            )


def test_reset_of_some_envs_restarts_their_count() -> None:
    with envpool.make_gymnasium("Pong-v5", num_envs=2, num_threads=1) as envs:
        envs.reset()
        for _ in range(3):
            envs.step(np.zeros(2, dtype=np.int64))
        obs, info = envs.reset(np.array([1]))
        assert obs.shape == (1, 4, 84, 84) and list(info["env_id"]) == [1]
        assert list(info["elapsed_step"]) == [0]
        *_, info = envs.step(np.zeros(2, dtype=np.int64))
        assert list(info["elapsed_step"]) == [4, 1]
    with (
        envpool.make_gymnasium("CartPole-v1", num_envs=2) as envs,
        pytest.raises(ValueError, match="needs an Atari pool"),
    ):
        envs.reset(np.array([1]))


def test_unsupported_arguments_are_named() -> None:
    with pytest.raises(TypeError, match=r"stak_num.*Did you mean stack_num"):
        envpool.make("Pong-v5", "gymnasium", stak_num=4)
    with pytest.raises(ValueError, match="use_inter_area_resize"):
        envpool.make("Pong-v5", "gymnasium", use_inter_area_resize=False)
    with pytest.raises(ValueError, match="max_num_players"):
        envpool.make("CartPole-v1", "gymnasium", max_num_players=2)
    with pytest.raises(ValueError, match="dm_env"):
        envpool.make("Pong-v5", "dm")
    with pytest.raises(TypeError, match="'stack_num'"):  # an Atari option for a native env
        envpool.make("CartPole-v1", "gym", stack_num=4)
    with pytest.raises(ValueError, match="max_episode_steps"):
        envpool.make("Pong-v5", "gym", max_episode_steps=0)


def test_per_env_seeds_are_given_to_the_first_reset() -> None:
    with (
        envpool.make_gymnasium("CartPole-v1", num_envs=2, seed=[3, 4]) as listed,
        envpool.make_gymnasium("CartPole-v1", num_envs=2, seed=3) as based,
        envpool.make_gymnasium("CartPole-v1", num_envs=2) as default,  # EnvPool's seed 42
    ):
        a, b, c = listed.reset()[0], based.reset()[0], default.reset()[0]
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)


# ---- info keys and elapsed steps ---------------------------------------------------------------


def test_reward_is_clipped_and_info_keeps_the_score() -> None:
    kwargs = dict(num_envs=2, seed=1, num_threads=1)
    rng = np.random.default_rng(0)
    with (
        envpool.make_gymnasium("SpaceInvaders-v5", reward_clip=True, **kwargs) as clipped,
        envpool.make_gymnasium("SpaceInvaders-v5", **kwargs) as plain,
    ):
        clipped.reset()
        plain.reset()
        scores = []
        for _ in range(300):
            action = rng.integers(0, 6, 2)
            _, r_clip, *_, info_clip = clipped.step(action)
            _, r_plain, *_, info_plain = plain.step(action)
            np.testing.assert_array_equal(r_plain, info_plain["reward"])
            np.testing.assert_array_equal(info_clip["reward"], info_plain["reward"])
            np.testing.assert_array_equal(r_clip, np.sign(r_plain))
            scores.append(r_plain)
        assert np.max(scores) > 1  # invaders are worth 5 to 30: clipping did change rewards


def test_lives_terminated_and_elapsed_steps_with_episodic_life() -> None:
    rng = np.random.default_rng(2)
    with envpool.make_gym("Breakout-v5", num_envs=2, episodic_life=True, seed=2) as envs:
        envs.reset()
        lives = np.full(2, 5)
        elapsed = np.zeros(2, dtype=int)
        life_reset = game_reset = np.zeros(2, dtype=bool)
        score = np.zeros(2)
        games = 0
        while games < 3:
            _, reward, done, info = envs.step(rng.integers(0, 4, 2))
            score += info["reward"]
            for i in range(2):
                if game_reset[i]:  # the step after a game over: a new game
                    assert info["elapsed_step"][i] == 0 and info["lives"][i] == 5
                    lives[i], elapsed[i], score[i] = 5, 0, 0.0
                elif life_reset[i]:  # the step after a lost life: the game goes on
                    assert info["elapsed_step"][i] == elapsed[i] and reward[i] == 0
                else:
                    elapsed[i] += 1
                    assert info["elapsed_step"][i] == elapsed[i]
            over = info["terminated"].astype(bool)
            assert not info["TimeLimit.truncated"].any()
            assert (info["lives"][over] == 0).all()
            lost = done & ~over
            assert (info["lives"][lost] == lives[lost] - 1).all()  # a life lost: done
            assert (info["lives"][~done] == np.where(game_reset, 5, lives)[~done]).all()
            np.testing.assert_allclose(score[over], info["episode_return"][over])  # pool's ledger
            lives = info["lives"].copy()
            life_reset, game_reset = lost, over
            games += over.sum()


def test_elapsed_steps_follow_the_emulator_frame_count() -> None:
    """Without episodic life, no-ops or FIRE at reset, a game's step count is ALE's frame count
    over the frame skip (rounded up: a game over stops the frame skip early)."""
    rng = np.random.default_rng(3)
    kwargs = dict(num_envs=2, noop_max=0, use_fire_reset=False, seed=3, num_threads=1)
    with envpool.make_gymnasium("Breakout-v5", **kwargs) as envs:
        _, info = envs.reset()
        assert (info["elapsed_step"] == 0).all()
        ends = 0
        while ends < 3:
            _, _, terminated, truncated, info = envs.step(rng.integers(0, 4, 2))
            frames = info["episode_frame_number"]
            np.testing.assert_array_equal(info["elapsed_step"], -(-frames // 4))
            np.testing.assert_array_equal(info["terminated"], terminated)
            ends += (terminated | truncated).sum()


# ---- gym vs gymnasium, async, attributes -------------------------------------------------------


def test_gym_and_gymnasium_apis_match_envpool_autoreset() -> None:
    gym = pytest.importorskip("gym")
    with (
        envpool.make("CartPole-v1", env_type="gym", num_envs=3, max_episode_steps=5) as old,
        envpool.make("CartPole-v1", env_type="gymnasium", num_envs=3, max_episode_steps=5) as new,
    ):
        assert isinstance(old.action_space, gym.spaces.Discrete)
        assert isinstance(old.observation_space, gym.spaces.Box)
        assert type(new.action_space).__module__.startswith("gymnasium")
        obs = old.reset()
        obs_new, info = new.reset()
        assert isinstance(obs, np.ndarray)
        np.testing.assert_array_equal(obs, obs_new)
        assert (info["elapsed_step"] == 0).all() and (info["players"]["env_id"] == [0, 1, 2]).all()
        # EnvPool's auto-reset table: steps 1..5, the 5th truncated, then a reset (elapsed 0)
        for t in [1, 2, 3, 4, 5, 0, 1]:
            obs, reward, done, info_old = old.step(np.zeros(3, dtype=np.int64))
            obs_new, reward_new, terminated, truncated, info = new.step(np.zeros(3, dtype=np.int64))
            np.testing.assert_array_equal(obs, obs_new)
            np.testing.assert_array_equal(reward, reward_new)
            np.testing.assert_array_equal(done, terminated | truncated)
            np.testing.assert_array_equal(info_old["TimeLimit.truncated"], truncated)
            assert "TimeLimit.truncated" not in info
            assert (info["elapsed_step"] == t).all() and (info_old["elapsed_step"] == t).all()
            assert truncated.all() == (t == 5)
    with envpool.make_gym("CartPole-v1", num_envs=2, gym_reset_return_info=True) as envs:
        obs, info = envs.reset()
        assert obs.shape == (2, 4) and (info["env_id"] == [0, 1]).all()


def test_async_send_recv_and_assignable_attributes() -> None:
    envs = envpool.make_gymnasium("CartPole-v1", num_envs=4, batch_size=2, num_threads=2)
    assert envs.is_async and len(envs) == 4
    envs.num_envs = 99  # CleanRL's scripts overwrite these; the pool keeps working
    envs.single_action_space = envs.action_space
    envs.single_observation_space = envs.observation_space
    steps = np.zeros(4, dtype=int)
    envs.async_reset()
    for _ in range(40):
        obs, _, terminated, truncated, info = envs.recv()
        ids = info["env_id"]
        assert obs.shape == (2, 4) and len(ids) == 2
        np.testing.assert_array_equal(info["elapsed_step"], steps[ids])
        steps[ids] = np.where(terminated | truncated, 0, steps[ids] + 1)  # next: reset or +1
        envs.send(np.ones(2, dtype=np.int64), ids)
    envs.close()
