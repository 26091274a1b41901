"""Gymnasium conformance of every backend: the pools under Gymnasium's own vector wrappers, the
rest of the `VectorEnv` API (`call`, `get_attr`, `set_attr`, `np_random_seed`, `Disabled`
autoreset with `reset_mask`), and the errors Gymnasium raises (`ResetNeeded` for a step before
`reset`, `TypeError` for actions that are not a batch). The process backend is checked against
Gymnasium's `SyncVectorEnv` running the same envs with the same seeds.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import ResetNeeded
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers import vector as vw
from gymnasium.wrappers.utils import RunningMeanStd

import onebox.envs

pytestmark = pytest.mark.timeout(120)
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]
HAS_ALE = importlib.util.find_spec("ale_py") is not None
needs_ale = pytest.mark.skipif(not HAS_ALE, reason='needs ale-py: pip install "onebox[atari]"')


def pool(backend: str, env_id: str, num_envs: int = 2, **kwargs: Any) -> onebox.envs.EnvPool:
    """A small pool: 2 envs; the process backend forks 2 workers; Atari episodes of 30 steps."""
    if backend == "process":
        kwargs.setdefault("context", "fork")
        kwargs.setdefault("num_threads", 2)
    elif backend == "atari":
        kwargs.setdefault("num_threads", 2)
        kwargs.setdefault("max_num_frames_per_episode", 120)
    return onebox.envs.make(env_id, num_envs, backend=backend, **kwargs)


# A discrete env of each backend; the process backend runs Gymnasium's own CartPole.
DISCRETE = [
    ("native", "CartPole-v1"),
    ("process", "CartPole-v1"),
    pytest.param("atari", "Pong-v5", marks=needs_ale),
]


def actions_of(envs: gym.vector.VectorEnv, seed: int) -> Callable[[], Any]:
    space = envs.action_space
    space.seed(seed)
    return space.sample


# ---- step before reset --------------------------------------------------------------------------


@pytest.mark.parametrize(("backend", "env_id"), DISCRETE)
def test_step_or_send_before_reset_raises_reset_needed(backend, env_id):
    with pool(backend, env_id) as envs:
        zeros = np.zeros(2, np.int64)
        with pytest.raises(ResetNeeded, match=r"reset\(\)"):
            envs.step(zeros)
        with pytest.raises(ResetNeeded, match=r"reset\(\)"):
            envs.send(zeros)
        envs.reset(seed=0)  # still usable, and then steps
        envs.step(zeros)
    with pool(backend, env_id) as envs:
        envs.async_reset()
        envs.recv()
        envs.send(zeros)  # async_reset counts as a reset
        envs.recv()


def test_native_envs_start_from_their_seeds():
    """Before, a native pool stepped from an all-zero state, the same whatever the seed."""
    with pool("native", "CartPole-v1", seed=0) as a, pool("native", "CartPole-v1", seed=7) as b:
        assert not np.array_equal(a.reset()[0], b.reset()[0])


# ---- actions that are not a batch ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "env_id"), [*DISCRETE, ("native", "Pendulum-v1"), ("process", "Pendulum-v1")]
)
def test_actions_that_are_not_a_batch_raise_type_error(backend, env_id):
    with pool(backend, env_id) as envs:
        envs.reset(seed=0)
        good = envs.action_space.sample()
        for bad in (good[0], good[:1], np.concatenate([good, good]), None):
            with pytest.raises(TypeError):
                envs.step(bad)
        with pytest.raises(ValueError):  # still a ValueError, as onebox raised before
            envs.step(good[:1])
        envs.step(good)


# ---- np_random_seed -----------------------------------------------------------------------------


@pytest.mark.parametrize(("backend", "env_id"), DISCRETE)
def test_np_random_seed_as_gymnasium_reports_it(backend, env_id):
    with pool(backend, env_id, num_envs=3, seed=5) as envs:
        envs.reset()
        assert envs.np_random_seed == (5, 6, 7)
        envs.reset(seed=3)
        assert envs.np_random_seed == (3, 4, 5)
        envs.reset(seed=[9, 1, 4])
        envs.reset()  # an unseeded reset keeps the seeds, as in Gymnasium
        assert envs.np_random_seed == (9, 1, 4)
        assert envs.get_attr("np_random_seed") == (9, 1, 4)
    sync = gym.make_vec("CartPole-v1", 3, vectorization_mode="sync")
    sync.reset(seed=3)
    assert sync.np_random_seed == (3, 4, 5)


# ---- call, get_attr, set_attr -------------------------------------------------------------------


class Counter(gym.Env):
    """An env with an attribute and a method, to reach through `call`/`get_attr`/`set_attr`."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.scale = 1.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), self.scale, False, False, {}

    def scaled(self, x: float, *, offset: float = 0.0) -> float:
        return self.scale * x + offset


def test_process_call_get_attr_set_attr_reach_the_workers_envs():
    with pool("process", None, num_envs=3, env_fn=Counter) as envs:
        envs.reset(seed=0)
        assert envs.get_attr("scale") == (1.0, 1.0, 1.0)
        envs.set_attr("scale", [1.0, 2.0, 3.0])
        assert envs.get_attr("scale") == (1.0, 2.0, 3.0)
        np.testing.assert_array_equal(envs.step(np.zeros(3, np.int64))[1], [1.0, 2.0, 3.0])
        assert envs.call("scaled", 2.0, offset=1.0) == (3.0, 5.0, 7.0)
        envs.set_attr("scale", 0.5)  # one value for every env
        assert envs.call("scale") == (0.5, 0.5, 0.5)
        with pytest.raises(AttributeError, match="nope"):
            envs.get_attr("nope")
        with pytest.raises(TypeError):  # raised by the env in its worker
            envs.call("scaled")
        with pytest.raises(ValueError, match="one value per env"):
            envs.set_attr("scale", [1.0, 2.0])
        assert envs.get_attr("scale") == (0.5, 0.5, 0.5)  # the workers went on
        envs.step(np.zeros(3, np.int64))


@pytest.mark.parametrize(
    ("backend", "env_id", "option", "value"),
    [
        ("native", "CartPole-v1", "sutton_barto_reward", False),
        pytest.param("atari", "Pong-v5", "frameskip", 4, marks=needs_ale),
    ],
)
def test_native_and_atari_attributes(backend, env_id, option, value):
    with pool(backend, env_id) as envs:
        envs.reset(seed=2)
        assert envs.get_attr(option) == (value, value)
        assert envs.get_attr("action_space") == (envs.single_action_space,) * 2
        assert envs.get_attr("spec")[0].id == env_id
        assert envs.call("np_random_seed") == (2, 3)
        with pytest.raises(AttributeError, match="get_attr and call know"):
            envs.get_attr("nope")
        with pytest.raises(AttributeError, match="make a new pool"):
            envs.set_attr(option, value)
        with pytest.raises(TypeError, match="no methods"):
            envs.call("render", 1)


# ---- Disabled autoreset and reset_mask ----------------------------------------------------------


def test_process_disabled_autoreset_matches_sync_vector_env():
    """Step until envs end, reset only those with reset_mask, as Gymnasium's SyncVectorEnv."""
    mode = AutoresetMode.DISABLED
    sync = SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3, autoreset_mode=mode)
    with pool("process", "CartPole-v1", num_envs=3, autoreset_mode="Disabled") as envs:
        assert envs.metadata["autoreset_mode"] == mode
        obs, _ = envs.reset(seed=4)
        np.testing.assert_array_equal(obs, sync.reset(seed=4)[0])
        sample = actions_of(envs, 0)
        resets = 0
        for _ in range(80):
            a = sample()
            ours, theirs = envs.step(a), sync.step(a)
            for x, y in zip(ours[:4], theirs[:4], strict=True):
                np.testing.assert_array_equal(x, y)
            ended = ours[2] | ours[3]
            if ended.any():
                with pytest.raises(ResetNeeded, match="reset_mask"):
                    envs.step(a)
                seeds = list(range(100 + resets * 3, 103 + resets * 3))
                obs, _ = envs.reset(seed=seeds, options={"reset_mask": ended})
                np.testing.assert_array_equal(
                    obs, sync.reset(seed=seeds, options={"reset_mask": ended})[0]
                )
                resets += 1
        assert resets >= 2


def test_native_disabled_autoreset_and_reset_mask():
    with pool("native", "CartPole-v1", num_envs=3, autoreset_mode="disabled") as envs:
        obs, _ = envs.reset(seed=0)
        sample = actions_of(envs, 0)
        ended = np.zeros(3, bool)
        while not ended.any():
            last, _, term, trunc, _ = envs.step(sample())
            ended = term | trunc
        with pytest.raises(ResetNeeded, match="autoreset is disabled"):
            envs.step(sample())
        with pytest.raises(ResetNeeded):
            envs.send(sample())
        obs, _ = envs.reset(seed=20, options={"reset_mask": ended})
        np.testing.assert_array_equal(obs[~ended], last[~ended])  # the others keep theirs
        with pool("native", "CartPole-v1", num_envs=3) as fresh:  # a reset env: its seed's start
            np.testing.assert_array_equal(obs[ended], fresh.reset(seed=20)[0][ended])
        assert envs.np_random_seed == tuple(20 + i if e else i for i, e in enumerate(ended))
        envs.step(sample())  # every env runs again


@pytest.mark.parametrize(("backend", "env_id"), DISCRETE)
@pytest.mark.parametrize("mode", MODES)
def test_reset_mask_resets_only_the_envs_masked(backend, env_id, mode):
    with pool(backend, env_id, autoreset_mode=mode) as envs:
        envs.reset(seed=0)
        sample = actions_of(envs, 1)
        for _ in range(3):
            obs, *_ = envs.step(sample())
        mask = np.array([False, True])
        new, info = envs.reset(seed=50, options={"reset_mask": mask})
        np.testing.assert_array_equal(new[0], obs[0])
        with pool(backend, env_id) as fresh:
            np.testing.assert_array_equal(new[1], fresh.reset(seed=50)[0][1])
        assert envs.np_random_seed == (0, 51)
        for key, value in info.items():
            if key.startswith("_"):
                assert not value[0], key  # the info holds only the reset env's entries
        with pytest.raises(TypeError, match="reset_mask"):
            envs.reset(options={"reset_mask": [True, False]})
        with pytest.raises(ValueError, match="reset_mask"):
            envs.reset(options={"reset_mask": np.zeros(2, bool)})
        envs.step(sample())


@needs_ale
def test_atari_has_no_disabled_autoreset():
    with pytest.raises(ValueError, match="cannot be disabled"):
        pool("atari", "Pong-v5", autoreset_mode="Disabled")


# ---- Gymnasium's vector wrappers ----------------------------------------------------------------

WRAPPED = [
    ("native", "CartPole-v1", {}),
    ("process", "CartPole-v1", {}),
    ("native", "Pendulum-v1", {"max_episode_steps": 15}),
    ("process", "Pendulum-v1", {"max_episode_steps": 15}),
    pytest.param("atari", "Pong-v5", {}, marks=needs_ale),
]
STEPS = 40


def hand_returns(rewards: list[np.ndarray], dones: list[np.ndarray], mode: AutoresetMode):
    """The returns and lengths of the episodes that end at each step, summed by hand."""
    ret, length = np.zeros(len(rewards[0])), np.zeros(len(rewards[0]), int)
    prev = np.zeros(len(rewards[0]), bool)
    out = []
    for r, d in zip(rewards, dones, strict=True):
        if mode == AutoresetMode.NEXT_STEP:  # the step after an end is a reset step
            ret[prev], length[prev] = 0.0, 0
            ret[~prev] += r[~prev]
            length[~prev] += 1
        else:
            ret += r
            length += 1
        out.append((ret[d].copy(), length[d].copy()))
        if mode == AutoresetMode.SAME_STEP:
            ret[d], length[d] = 0.0, 0
        prev = d
    return out


@pytest.mark.parametrize(("backend", "env_id", "kwargs"), WRAPPED)
@pytest.mark.parametrize("mode", MODES)
def test_record_episode_statistics_and_dict_info_to_list(backend, env_id, kwargs, mode):
    with pool(backend, env_id, autoreset_mode=mode, **kwargs) as raw:
        envs = vw.DictInfoToList(vw.RecordEpisodeStatistics(raw))
        envs.reset(seed=0)
        sample = actions_of(envs, 0)
        rewards, dones, stats = [], [], []
        for _ in range(STEPS):
            _, r, term, trunc, infos = envs.step(sample())
            assert isinstance(infos, list) and len(infos) == 2
            d = term | trunc
            rewards.append(r)
            dones.append(d)
            got = [i for i in range(2) if "episode" in infos[i]]
            assert got == np.flatnonzero(d).tolist()
            stats.append(
                (
                    np.array([infos[i]["episode"]["r"] for i in got]),
                    np.array([infos[i]["episode"]["l"] for i in got]),
                    [infos[i] for i in got],
                )
            )
        assert np.concatenate(dones).sum() >= 2, "no episode ended: the test checks nothing"
        for (r, n, ended), (want_r, want_n) in zip(
            stats, hand_returns(rewards, dones, mode), strict=True
        ):
            np.testing.assert_allclose(r, want_r)
            np.testing.assert_array_equal(n, want_n)
            if backend != "native":  # the pool's own statistics agree
                for info, wr, wn in zip(ended, want_r, want_n, strict=True):
                    assert info["episode_return"] == pytest.approx(wr)
                    assert info["episode_length"] == wn
        assert envs.env.episode_count == np.concatenate(dones).sum()


@pytest.mark.parametrize("backend", ["native", "process"])
def test_record_episode_statistics_with_disabled_autoreset(backend):
    """The caller resets ended envs with reset_mask; the wrapper restarts only their statistics
    (it reads the mask after the pool's reset: the pool must leave `options` as it was)."""
    with pool(backend, "CartPole-v1", autoreset_mode="Disabled") as raw:
        envs = vw.RecordEpisodeStatistics(raw)
        envs.reset(seed=0)
        sample = actions_of(envs, 0)
        rewards, dones, stats = [], [], []
        for _ in range(STEPS):
            _, r, term, trunc, info = envs.step(sample())
            d = term | trunc
            rewards.append(r)
            dones.append(d)
            stats.append(info["episode"]["r"][d] if d.any() else np.zeros(0))
            if d.any():
                envs.reset(options={"reset_mask": d})
        assert np.concatenate(dones).sum() >= 2
        # as in SameStep, every step counts towards an episode: no reset steps
        by_hand = hand_returns(rewards, dones, AutoresetMode.SAME_STEP)
        for got, (want, _) in zip(stats, by_hand, strict=True):
            np.testing.assert_allclose(got, want)


@pytest.mark.parametrize(("backend", "env_id", "kwargs"), WRAPPED)
@pytest.mark.parametrize("mode", MODES)
def test_normalize_observation_and_reward(backend, env_id, kwargs, mode):
    """NormalizeObservation's statistics are those of the raw observations, and NormalizeReward
    scales every env's reward of a step by one positive factor; through episode ends.
    Gymnasium's observation wrappers refuse SameStep pools (their final observations would go
    unnormalized), ours as its own."""
    make = lambda: pool(backend, env_id, autoreset_mode=mode, **kwargs)  # noqa: E731
    same_step = mode == AutoresetMode.SAME_STEP
    with make() as twin, make() as inner:
        if same_step:
            with pytest.raises(ValueError, match="Expected autoreset_mode to be NEXT_STEP"):
                vw.NormalizeObservation(inner)
            envs = vw.NormalizeReward(inner, gamma=0.9)
        else:
            envs = vw.NormalizeReward(vw.NormalizeObservation(inner), gamma=0.9)
        raw_obs, _ = twin.reset(seed=0)
        obs, _ = envs.reset(seed=0)
        rms = RunningMeanStd(shape=twin.single_observation_space.shape)

        def check_obs() -> None:
            if same_step:
                np.testing.assert_array_equal(obs, raw_obs)
                return
            rms.update(raw_obs.astype(np.float64))
            want = (raw_obs - rms.mean) / np.sqrt(rms.var + 1e-8)
            np.testing.assert_allclose(obs, want, rtol=1e-5, atol=1e-6)

        check_obs()
        sample = actions_of(twin, 0)
        ended = 0
        for _ in range(STEPS):
            a = sample()
            raw_obs, raw_r, term, trunc, _ = twin.step(a)
            obs, r, *_ = envs.step(a)
            check_obs()
            nonzero = raw_r != 0
            if nonzero.any():
                scale = r[nonzero] / raw_r[nonzero]
                assert (scale > 0).all()
                np.testing.assert_allclose(scale, scale[0], rtol=1e-6)
            ended += int((term | trunc).sum())
        assert ended >= 2


@pytest.mark.parametrize("backend", ["native", "process"])
@pytest.mark.parametrize("mode", MODES)
def test_clip_and_rescale_action(backend, mode):
    """Pendulum's actions through ClipAction and RescaleAction([-1, 1]) step the pool as the
    clipped or rescaled actions step a twin."""
    make = lambda: pool(backend, "Pendulum-v1", autoreset_mode=mode, max_episode_steps=15)  # noqa: E731
    for wrap, convert in (
        (vw.ClipAction, lambda a: np.clip(a, -2.0, 2.0)),
        (lambda e: vw.RescaleAction(e, -1.0, 1.0), lambda a: 2.0 * a),
    ):
        with make() as twin, make() as inner:
            envs = wrap(inner)
            np.testing.assert_array_equal(envs.reset(seed=3)[0], twin.reset(seed=3)[0])
            rng = np.random.default_rng(0)
            for _ in range(20):
                a = rng.uniform(-3.0, 3.0, (2, 1)).astype(np.float32)
                if wrap is not vw.ClipAction:
                    a = np.clip(a, -1.0, 1.0)
                ours, theirs = envs.step(a), twin.step(convert(a).astype(np.float32))
                for x, y in zip(ours[:4], theirs[:4], strict=True):
                    np.testing.assert_allclose(x, y, rtol=1e-6)
