"""The process backend (`ProcessEnvPool`): Gymnasium envs in worker processes over shared memory.

Golden tests step a pool and Gymnasium's `SyncVectorEnv` side by side with the same seeds and
actions (CartPole-v1 and `ComboEnv`, an env with nested spaces and every kind of info) and require
identical results; the async API, worker counts and crash handling are checked against the pool's
own sync results. Most pools use the "fork" context because it starts fastest; the default
context gets its own tests.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
import subprocess
import sys
import textwrap
import time
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import onebox.envs
from learning import alive
from onebox.envs import EnvPool, ProcessEnvPool

pytestmark = pytest.mark.timeout(60)
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]


def make(env_id: str | None = "CartPole-v1", num_envs: int = 4, **kwargs: Any) -> ProcessEnvPool:
    kwargs.setdefault("context", "fork")
    kwargs.setdefault("num_threads", 2)
    return ProcessEnvPool(env_id, num_envs, **kwargs)


# ---- test envs ----------------------------------------------------------------------------------


class ComboEnv(gym.Env):
    """Nested Dict/Tuple spaces of every leaf kind; numeric, array, string and sparse infos;
    episodes that end at random (terminated) or at the time limit of `combo` (truncated)."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"]}

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-10, 10, (2,), np.float32),
                "parts": spaces.Tuple(
                    (spaces.Discrete(5), spaces.MultiDiscrete([3, 4]), spaces.MultiBinary(3))
                ),
            }
        )
        self.action_space = spaces.Tuple(
            (
                spaces.Discrete(3, start=-1),
                spaces.Box(-1, 1, (2,), np.float32),
                spaces.Dict({"md": spaces.MultiDiscrete([2, 5]), "mb": spaces.MultiBinary(2)}),
            )
        )

    def _obs(self) -> dict[str, Any]:
        bits = (self.pos > 0).astype(np.int8)
        return {
            "pos": self.pos.copy(),
            "parts": (self.t % 5, np.array([self.t % 3, self.t % 4]), np.append(bits, self.t % 2)),
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.t = 0
        scale = 1.0 if options is None else options.get("scale", 1.0)
        self.pos = (scale * self.np_random.uniform(-1, 1, 2)).astype(np.float32)
        return self._obs(), {"start": float(self.pos[0]), "tag": "reset"}

    def render(self) -> np.ndarray:
        return np.full((2, 3, 3), self.t, np.uint8)

    def step(self, action: Any) -> tuple:
        d, box, rest = action
        move = 0.1 * np.asarray(box) + 0.01 * int(d) + 0.001 * int(np.sum(rest["md"]))
        self.pos = np.clip(self.pos + move, -10, 10).astype(np.float32)
        self.t += 1
        reward = float(self.pos.sum()) + int(np.sum(rest["mb"]))
        info: dict[str, Any] = {
            "t": self.t,
            "speed": np.float32(np.abs(move).sum()),
            "flag": bool(self.pos[0] > 0),
            "vec": self.pos.copy(),
        }
        if self.t % 3 == 0:
            info["tag"] = f"t{self.t}"
        if reward > 1.0:
            info["bonus"] = 1.5
        return self._obs(), reward, bool(self.np_random.random() < 0.08), False, info


def combo(render_mode: str | None = None) -> gym.Env:
    return gym.wrappers.TimeLimit(ComboEnv(render_mode), max_episode_steps=12)


class CrashEnv(gym.Env):
    """Steps quietly until it gets action 1: then it raises, or segfaults. With `marker`, it does so
    only once (it leaves the marker file), so a restarted worker runs on."""

    observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float64)
    action_space = spaces.Discrete(2)

    def __init__(self, how: str = "raise", marker: str | None = None) -> None:
        self.how, self.marker = how, marker

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.x = float(self.np_random.uniform())
        return np.array([self.x]), {}

    def step(self, action: Any) -> tuple:
        if action == 1 and not (self.marker and os.path.exists(self.marker)):
            if self.marker:
                open(self.marker, "w").close()
            if self.how == "raise":
                raise ZeroDivisionError("boom from CrashEnv.step")
            ctypes.string_at(0)  # segfault
        self.x += 1.0
        return np.array([self.x]), 1.0, False, False, {}


# ---- comparison helpers -------------------------------------------------------------------------


def assert_tree_equal(got: Any, ref: Any, where: str = "") -> None:
    if isinstance(ref, dict):
        assert isinstance(got, dict) and set(got) == set(ref), (where, sorted(got), sorted(ref))
        for k in ref:
            assert_tree_equal(got[k], ref[k], f"{where}[{k!r}]")
    elif isinstance(ref, tuple | list):
        assert type(got) is type(ref) and len(got) == len(ref), where
        for k, (g, r) in enumerate(zip(got, ref, strict=True)):
            assert_tree_equal(g, r, f"{where}[{k}]")
    elif isinstance(ref, np.ndarray) and ref.dtype == object:
        assert got.dtype == object and got.shape == ref.shape, where
        for k, (g, r) in enumerate(zip(got, ref, strict=True)):
            assert_tree_equal(g, r, f"{where}[{k}]")
    elif ref is None or isinstance(ref, str):
        assert got == ref, (where, got, ref)
    else:
        ref = np.asarray(ref)
        got = np.asarray(got)
        if where.count("[") <= 1 or "final_info" in where:  # batched arrays: same dtype too
            assert got.dtype == ref.dtype, (where, got.dtype, ref.dtype)
        np.testing.assert_array_equal(got, ref, err_msg=where)


def split_info(info: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pool's own keys (env_id, episode statistics) and the rest, which Gymnasium also has."""
    own = {
        k: info.pop(k)
        for k in (
            "env_id",
            "episode_return",
            "episode_length",
            "_episode_return",
            "_episode_length",
        )
        if k in info
    }
    return own, info


def combo_actions(space: spaces.Space, n: int, steps: int, seed: int) -> list[Any]:
    from gymnasium.vector.utils import batch_space

    batched = batch_space(space, n)
    batched.seed(seed)
    return [batched.sample() for _ in range(steps)]


# ---- golden against SyncVectorEnv ---------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_cartpole_matches_sync_vector_env(mode):
    n, steps = 5, 300
    pool = make("CartPole-v1", n, autoreset_mode=mode, max_episode_steps=30)
    ref = SyncVectorEnv(
        [lambda: gym.make("CartPole-v1", max_episode_steps=30)] * n, autoreset_mode=mode
    )
    with pool:
        obs, info = pool.reset(seed=3)
        r_obs, r_info = ref.reset(seed=3)
        np.testing.assert_array_equal(obs, r_obs)
        assert split_info(info)[1] == r_info == {}
        rng = np.random.default_rng(0)
        returns, lengths = np.zeros(n), np.zeros(n, int)
        ended = {"terminated": 0, "truncated": 0}
        for _ in range(steps):
            # Balance the pole, badly in some envs, so that episodes end both ways.
            actions = (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)
            flip = rng.random(n) < np.linspace(0.1, 0.5, n)
            actions[flip] = 1 - actions[flip]
            obs, reward, term, trunc, info = pool.step(actions)
            r_obs, r_reward, r_term, r_trunc, r_info = ref.step(actions)
            for got, want in ((obs, r_obs), (reward, r_reward), (term, r_term), (trunc, r_trunc)):
                np.testing.assert_array_equal(got, want)
                assert got.dtype == want.dtype
            own, rest = split_info(info)
            assert_tree_equal(rest, r_info)
            np.testing.assert_array_equal(own["env_id"], np.arange(n))
            returns += reward
            lengths += reward != 0  # CartPole pays 1 per step; reset steps pay 0
            done = term | trunc
            if done.any():
                np.testing.assert_array_equal(own["_episode_return"], done)
                np.testing.assert_array_equal(own["_episode_length"], done)
                np.testing.assert_array_equal(own["episode_return"][done], returns[done])
                np.testing.assert_array_equal(own["episode_length"][done], lengths[done])
                returns[done], lengths[done] = 0, 0
            else:
                assert "_episode_return" not in own and "_episode_length" not in own
            ended["terminated"] += int(term.sum())
            ended["truncated"] += int(trunc.sum())
        assert min(ended.values()) >= 3, ended


@pytest.mark.parametrize("mode", MODES)
def test_nested_spaces_and_infos_match_sync_vector_env(mode):
    n, steps = 4, 120
    pool = make(None, n, env_fn=combo, autoreset_mode=mode, num_threads=3)
    ref = SyncVectorEnv([combo] * n, autoreset_mode=mode)
    assert pool.single_observation_space == ref.single_observation_space
    assert pool.single_action_space == ref.single_action_space
    assert pool.observation_space == ref.observation_space
    assert pool.action_space == ref.action_space
    with pool:
        obs, info = pool.reset(seed=11, options={"scale": 2.0})
        r_obs, r_info = ref.reset(seed=11, options={"scale": 2.0})
        assert_tree_equal(obs, r_obs)
        assert_tree_equal(split_info(info)[1], r_info)
        ended = np.zeros(2, int)
        for actions in combo_actions(pool.single_action_space, n, steps, seed=5):
            obs, reward, term, trunc, info = pool.step(actions)
            r_obs, r_reward, r_term, r_trunc, r_info = ref.step(actions)
            assert_tree_equal(obs, r_obs)
            assert obs in pool.observation_space
            for got, want in ((reward, r_reward), (term, r_term), (trunc, r_trunc)):
                np.testing.assert_array_equal(got, want)
            assert_tree_equal(split_info(info)[1], r_info)
            ended += term.sum(), trunc.sum()
        assert ended.min() >= 3, ended


# ---- async API ----------------------------------------------------------------------------------


def per_env_trajectories(pool: ProcessEnvPool, actions: np.ndarray) -> np.ndarray:
    """Observations [t, env] from the sync API: t = 0 is the reset."""
    obs, _ = pool.reset(seed=1)
    return np.stack([obs] + [pool.step(a)[0] for a in actions])


def test_async_recv_returns_batch_size_envs_each_sent_env_once_and_matches_sync():
    n, b, steps = 8, 3, 30
    actions = np.random.default_rng(2).integers(0, 2, (steps, n))
    with make("CartPole-v1", n, num_threads=3) as pool:
        want = per_env_trajectories(pool, actions)
    with make("CartPole-v1", n, batch_size=b, num_threads=3) as pool:
        pool.async_reset(seed=1)
        t = np.zeros(n, int)  # observations received per env
        sent = set(range(n))
        rng = np.random.default_rng(3)
        while t.min() <= steps:
            obs, reward, _term, _trunc, info = pool.recv()
            ids = info["env_id"]
            assert ids.shape == (b,) and obs.shape == (b, 4) and reward.shape == (b,)
            assert set(ids.tolist()) <= sent and len(set(ids.tolist())) == b
            sent -= set(ids.tolist())
            for row, i in enumerate(ids):
                np.testing.assert_array_equal(obs[row], want[t[i], i])
            t[ids] += 1
            going = [i for i in ids if t[i] <= steps]
            rng.shuffle(going)
            if going:
                pool.send(actions[t[going] - 1, going], going)
                sent |= set(going)
            if len(sent) < b:  # too few in flight for another batch: finish them via reset
                break


def test_async_reset_with_work_in_flight_and_sync_reset_drops_it():
    with make("CartPole-v1", 6, batch_size=2) as pool:
        ref, _ = pool.reset(seed=4)
        pool.send(np.zeros(6, np.int64))
        obs, _ = pool.reset(seed=4)  # drops the pending steps
        np.testing.assert_array_equal(obs, ref)
        pool.send(np.zeros(4, np.int64), [0, 1, 2, 3])
        pool.async_reset(seed=4)
        seen = []
        for _ in range(3):
            obs, reward, *_, info = pool.recv()
            np.testing.assert_array_equal(obs, ref[info["env_id"]])
            assert (reward == 0).all()
            seen += info["env_id"].tolist()
        assert sorted(seen) == list(range(6))


@pytest.mark.parametrize(("workers", "spin_us"), [(1, 200.0), (2, 0), (2, 5.0), (5, 1000)])
def test_results_do_not_depend_on_the_number_of_workers_or_spinning(workers, spin_us):
    actions = combo_actions(ComboEnv().action_space, 5, 40, seed=9)
    with make(None, 5, env_fn=combo, num_threads=1) as pool:
        ref = [pool.reset(seed=0)[0]] + [pool.step(a)[0] for a in actions]
    with make(None, 5, env_fn=combo, num_threads=workers, spin_us=spin_us) as pool:
        assert pool.num_threads == workers
        got = [pool.reset(seed=0)[0]] + [pool.step(a)[0] for a in actions]
    assert_tree_equal(got, ref)


def test_copy_false_returns_views_that_the_next_call_overwrites():
    with make("CartPole-v1", 4, copy=False, batch_size=2) as pool:
        obs0, _ = pool.reset(seed=0)
        saved = obs0.copy()
        obs1, *_ = pool.step(np.ones(4, np.int64))
        assert np.shares_memory(obs0, obs1) and not np.array_equal(obs0, saved)
        pool.send(np.ones(4, np.int64))
        a = pool.recv()[0]
        kept = a.copy()
        b = pool.recv()[0]
        assert np.shares_memory(a, b) and not np.array_equal(a, kept)
    with make("CartPole-v1", 4) as pool:
        obs0, _ = pool.reset(seed=0)
        saved = obs0.copy()
        pool.step(np.ones(4, np.int64))
        np.testing.assert_array_equal(obs0, saved)


def test_first_reset_uses_the_constructor_seed():
    with make("CartPole-v1", 3, seed=7) as a, make("CartPole-v1", 3) as b:
        np.testing.assert_array_equal(a.reset()[0], b.reset(seed=7)[0])


def test_render_returns_each_envs_frame_in_env_order():
    with make(None, 3, env_fn=combo) as pool:
        assert pool.render() is None  # no render_mode
    with make(None, 3, env_fn=functools.partial(combo, "rgb_array"), batch_size=1) as pool:
        assert pool.render_mode == "rgb_array"
        assert pool.metadata["render_modes"] == ["rgb_array"]
        pool.reset(seed=0)
        actions = pool.action_space.sample()
        pool.step(actions)
        pool.send(tuple_rows(actions, [1]), [1])  # rendered after this pending step
        frames = pool.render()
        assert len(frames) == 3 and all(f.shape == (2, 3, 3) for f in frames)
        assert [int(f[0, 0, 0]) for f in frames] == [1, 2, 1]
        assert pool.recv()[4]["env_id"].tolist() == [1]


def tuple_rows(actions: Any, rows: list[int]) -> Any:
    """Rows `rows` of a batch of (nested) actions."""
    if isinstance(actions, dict):
        return {k: tuple_rows(v, rows) for k, v in actions.items()}
    if isinstance(actions, tuple):
        return tuple(tuple_rows(v, rows) for v in actions)
    return actions[rows]


# ---- crashes ------------------------------------------------------------------------------------


def crash_pool(how: str, marker: str | None = None, **kwargs: Any) -> ProcessEnvPool:
    return make(None, 4, env_fn=functools.partial(CrashEnv, how, marker), **kwargs)


def test_exception_in_step_raises_with_env_id_and_worker_traceback():
    pool = crash_pool("raise")
    pool.reset(seed=0)
    with pytest.raises(RuntimeError) as e:
        pool.step(np.array([0, 0, 1, 0]))
    text = str(e.value)
    assert "env 2 (CrashEnv)" in text and "worker 1" in text
    assert "ZeroDivisionError: boom from CrashEnv.step" in text and "Traceback" in text
    with pytest.raises(RuntimeError, match="unusable after a crash"):
        pool.step(np.zeros(4, np.int64))
    procs = [p.proc for p in pool._procs]
    assert all(p.exitcode is not None for p in procs)  # every worker was stopped
    pool.close()


def test_segfault_in_step_raises_with_the_signal_and_trace():
    pool = crash_pool("segfault", batch_size=1)
    pool.reset(seed=0)
    pool.send(np.array([1]), [1])
    with pytest.raises(RuntimeError) as e:
        pool.recv()
    text = str(e.value)
    assert "env 1 (CrashEnv)" in text and "worker 0" in text
    assert "SIGSEGV" in text and "in step" in text  # faulthandler's Python trace
    pool.close()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["raise", "segfault"])
def test_restart_on_crash_reports_truncated_and_steps_on(tmp_path, mode, how):
    marker = str(tmp_path / "crashed")
    with crash_pool(how, marker, restart_on_crash=True, autoreset_mode=mode) as pool:
        obs0, _ = pool.reset(seed=0)
        pool.step(np.zeros(4, np.int64))
        obs, _reward, term, trunc, info = pool.step(np.array([0, 0, 0, 1]))  # env 3 crashes
        # Worker 1 hosts envs 2 and 3: both episodes are lost and reported truncated.
        np.testing.assert_array_equal(trunc, [False, False, True, True])
        assert not term.any()
        np.testing.assert_array_equal(info["_worker_restarted"], [False, False, True, True])
        np.testing.assert_array_equal(obs[:2, 0], obs0[:2, 0] + 2)  # worker 0 ran on
        assert (obs[2:, 0] < 1).all()  # fresh episodes (CrashEnv starts in [0, 1))
        if mode == AutoresetMode.SAME_STEP:
            assert info["_final_obs"].tolist() == [False, False, True, True]
        obs2, reward2, term2, trunc2, info2 = pool.step(np.array([0, 0, 1, 1]))
        assert not (term2.any() or trunc2.any()) and "_worker_restarted" not in info2
        if mode == AutoresetMode.NEXT_STEP:  # the reset step returns the new episode's start
            np.testing.assert_array_equal(obs2[2:], obs[2:])
            assert (reward2[2:] == 0).all()
        else:
            np.testing.assert_array_equal(obs2[2:, 0], obs[2:, 0] + 1)
        assert pool._procs[1].restarts == 1 and pool._procs[0].restarts == 0


def test_restart_reseeds_deterministically(tmp_path):
    got = []
    for k in range(2):
        with crash_pool("raise", str(tmp_path / f"m{k}"), restart_on_crash=True) as pool:
            pool.reset(seed=0)
            got.append(pool.step(np.array([0, 1, 0, 0]))[0])
    np.testing.assert_array_equal(got[0], got[1])


def test_restart_on_crash_in_async_mode(tmp_path):
    marker = str(tmp_path / "crashed")
    with crash_pool("raise", marker, restart_on_crash=True, batch_size=2) as pool:
        pool.async_reset(seed=0)
        pool.recv()
        pool.recv()
        pool.send(np.array([1, 0]), [0, 1])
        pool.send(np.array([0, 0]), [2, 3])
        results = {}
        for _ in range(2):
            _, _, _, trunc, info = pool.recv()
            results.update(zip(info["env_id"].tolist(), trunc.tolist(), strict=True))
        assert results == {0: True, 1: True, 2: False, 3: False}


# ---- lifecycle ----------------------------------------------------------------------------------


def test_close_and_garbage_collection_stop_the_workers():
    pool = make("CartPole-v1", 4)
    pids = [p.proc.pid for p in pool._procs]
    shm = f"/dev/shm/{pool._block.name}"
    assert os.path.exists(shm)
    pool.async_reset()
    pool.close()
    assert not any(alive(pid) for pid in pids)
    assert not os.path.exists(shm)  # the shared memory was unlinked
    with pytest.raises(RuntimeError, match="closed"):
        pool.recv()
    pool.close()  # twice is fine

    pool = make("CartPole-v1", 4)
    pids = [p.proc.pid for p in pool._procs]
    del pool
    gc.collect()
    assert not any(alive(pid) for pid in pids)


def test_workers_exit_with_the_parent():
    script = textwrap.dedent(
        """
        import numpy as np, onebox.envs
        if __name__ == "__main__":
            pool = onebox.envs.make("CartPole-v1", 4, backend="process", num_threads=2)
            pool.reset()
            pool.step(np.zeros(4, np.int64))
            print(*[p.proc.pid for p in pool._procs])
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr[-3000:]
    pids = [int(x) for x in out.stdout.split()]
    assert len(pids) == 2 and not any(alive(pid) for pid in pids)


@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_workers_exit_when_the_parent_is_killed(context):
    script = textwrap.dedent(
        f"""
        import os, signal, numpy as np, onebox.envs
        if __name__ == "__main__":
            pool = onebox.envs.make("CartPole-v1", 4, backend="process", context="{context}")
            pool.reset()
            pool.step(np.zeros(4, np.int64))
            print(*[p.proc.pid for p in pool._procs], flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup of any kind
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)
    pids = [int(x) for x in out.stdout.split()]
    assert len(pids) == 2, out.stderr[-3000:]
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids)


def test_default_context_runs_lambdas():
    pool = ProcessEnvPool(env_fn=lambda: gym.make("CartPole-v1"), num_envs=2, num_threads=2)
    assert pool._ctx.get_start_method() in ("forkserver", "spawn")
    with pool:
        obs, _ = pool.reset(seed=0)
        ref = SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
        np.testing.assert_array_equal(obs, ref.reset(seed=0)[0])


# ---- make, registration -------------------------------------------------------------------------


def test_make_routes_to_the_process_backend():
    assert onebox.envs.backend_of("CartPole-v1") == "native"
    assert onebox.envs.backend_of("FrozenLake-v1") == "process"
    assert {"FrozenLake-v1", "CartPole-v1", "LunarLander-v3"} <= set(onebox.envs.list_envs())
    with onebox.envs.make("CartPole-v1", 2, backend="process", context="fork") as pool:
        assert isinstance(pool, ProcessEnvPool) and isinstance(pool, EnvPool)
        assert pool.spec.id == "CartPole-v1" and pool.spec.max_episode_steps == 500
    with onebox.envs.make("FrozenLake-v1", 2, context="fork", is_slippery=False) as pool:
        assert pool.single_observation_space == spaces.Discrete(16)
        assert pool.spec.kwargs["is_slippery"] is False
        pool.reset()
        obs, *_ = pool.step(np.array([1, 2]))
        assert obs.dtype == np.int64
    with onebox.envs.make(env_fn=combo, num_envs=2, context="fork") as pool:
        assert isinstance(pool, ProcessEnvPool) and pool.num_envs == 2


# ---- bad input ----------------------------------------------------------------------------------


def test_bad_construction_arguments():
    with pytest.raises(ValueError, match=r"unknown env id 'CartPol-v1'.*Did you mean.*CartPole-v1"):
        ProcessEnvPool("CartPol-v1", 2)
    with pytest.raises(ValueError, match="give env_id"):
        ProcessEnvPool(None, 2)
    with pytest.raises(TypeError, match="env_fn must be a callable"):
        ProcessEnvPool(env_fn=3, num_envs=2)
    with pytest.raises(TypeError, match="give them to your env_fn"):
        ProcessEnvPool(env_fn=combo, num_envs=2, max_episode_steps=3)
    with pytest.raises(ValueError, match="context must be one of"):
        ProcessEnvPool("CartPole-v1", 2, context="threads")
    for spin in (-1, float("nan"), 2e6, "200", True):
        with pytest.raises(ValueError, match=r"spin_us must be a number of microseconds"):
            ProcessEnvPool("CartPole-v1", 2, spin_us=spin)
    with pytest.raises(ValueError, match="num_envs must be a positive integer"):
        ProcessEnvPool("CartPole-v1", 0)
    with pytest.raises(ValueError, match="env_fn runs in the process backend"):
        onebox.envs.make(env_fn=combo, backend="native")


def test_env_errors_at_startup_name_the_problem():
    with pytest.raises(TypeError, match=r"env_fn must return a gymnasium\.Env, got int"):
        make(None, 2, env_fn=lambda: 3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        make("CartPole-v1", 2, nope=1)

    class TextEnv(gym.Env):
        observation_space = spaces.Text(5)
        action_space = spaces.Discrete(2)

    with pytest.raises(TypeError, match=r"cannot share observation_space = Text.*supports Box"):
        make(None, 2, env_fn=TextEnv)


def test_bad_actions_and_ids_are_rejected_without_side_effects():
    with make("CartPole-v1", 4, batch_size=2) as pool:
        pool.reset(seed=0)
        with pytest.raises(ValueError, match=r"actions must have shape \(4,\)"):
            pool.step(np.zeros(3, np.int64))
        with pytest.raises(TypeError, match="actions must be integers, got dtype float64"):
            pool.step(np.zeros(4))
        with pytest.raises(ValueError, match=r"action 2 for env 3 is out of range"):
            pool.step(np.array([0, 1, 0, 2]))
        with pytest.raises(ValueError, match=r"action -1 for env 1 is out of range"):
            pool.send(np.array([0, -1]), [0, 1])
        with pytest.raises(ValueError, match=r"env id 4 is out of range \[0, 4\)"):
            pool.send(np.zeros(1, np.int64), [4])
        with pytest.raises(ValueError, match="env id 1 appears twice"):
            pool.send(np.zeros(2, np.int64), [1, 1])
        with pytest.raises(TypeError, match="env_ids must be integers"):
            pool.send(np.zeros(1, np.int64), [0.0])
        with pytest.raises(RuntimeError, match=r"recv\(\) with nothing pending"):
            pool.recv()
        pool.send(np.zeros(1, np.int64), [1])
        with pytest.raises(RuntimeError, match="1 envs are pending but batch_size is 2"):
            pool.recv()
        with pytest.raises(ValueError, match="env id 1 was already sent and not yet received"):
            pool.send(np.zeros(2, np.int64), [2, 1])
        with pytest.raises(RuntimeError, match="1 envs have async steps pending"):
            pool.step(np.zeros(4, np.int64))
        pool.send(np.zeros(1, np.int64), [2])  # the rejected sends left env 2 free
        assert sorted(pool.recv()[4]["env_id"].tolist()) == [1, 2]
        obs, *_ = pool.step(np.zeros(4, np.int64))  # still usable
        assert obs.shape == (4, 4)
    with make(None, 2, env_fn=combo) as pool:
        pool.reset(seed=0)
        good = pool.action_space.sample()
        with pytest.raises(TypeError, match=r"actions\[2\] must be a dict with the key 'md'"):
            pool.step((good[0], good[1], {"mb": good[2]["mb"]}))
        bad_box = np.full((2, 2), np.nan, np.float32)
        with pytest.raises(ValueError, match=r"actions\[1\]: action for env 0 contains NaN"):
            pool.step((good[0], bad_box, good[2]))
        pool.step(good)


def test_bad_reset_arguments():
    with make("CartPole-v1", 2) as pool:
        with pytest.raises(ValueError, match="got 3 seeds for 2 envs"):
            pool.reset(seed=[1, 2, 3])
        with pytest.raises(TypeError, match="options must be a dict"):
            pool.reset(options=[1])
        seeded, _ = pool.reset(seed=[5, 9])
        with make("CartPole-v1", 1, seed=9) as other:
            np.testing.assert_array_equal(seeded[1], other.reset()[0][0])
