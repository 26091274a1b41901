"""Golden tests: the native classic-control envs step exactly like Gymnasium's.

For each env, a onebox pool and one Gymnasium env per pool env are stepped with the same actions.
After every reset of a pool env (the first one and each next-step autoreset) its internal state
is copied into the Gymnasium env; from there on both must agree at every step on observation,
reward and the terminated/truncated flags, across episodes that end both ways.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium
import numpy as np
import pytest

import onebox.envs

Policy = Callable[[np.ndarray, np.random.Generator], object]


# ---- policies: one random, one controller per env (alternated episode by episode) ------------


def random_discrete(n: int) -> Policy:
    return lambda obs, rng: int(rng.integers(n))


def random_box(low: float, high: float) -> Policy:
    # Deliberately wider than the action space: the env must clip.
    return lambda obs, rng: np.float32(rng.uniform(low, high))


def cartpole_pd(obs: np.ndarray, rng: np.random.Generator) -> object:
    x, x_dot, theta, theta_dot = obs
    return int(theta + 0.5 * theta_dot + 0.05 * x + 0.1 * x_dot > 0)


def acrobot_pump(obs: np.ndarray, rng: np.random.Generator) -> object:
    return 2 if obs[5] > 0 else 0  # torque along the actuated joint's velocity pumps energy in


def mountain_car_pump(obs: np.ndarray, rng: np.random.Generator) -> object:
    return 2 if obs[1] > 0 else 0


def mountain_car_continuous_pump(obs: np.ndarray, rng: np.random.Generator) -> object:
    return np.float32(1.5 if obs[1] >= 0 else -1.5)  # out of bounds: clipped force, full cost


def pendulum_pd(obs: np.ndarray, rng: np.random.Generator) -> object:
    cos, sin, theta_dot = obs
    return np.float32(-3.0 * np.arctan2(sin, cos) - 0.5 * theta_dot)


# ---- how to read a pool env's state into a Gymnasium env --------------------------------------


def set_gym_state(genv: gymnasium.Env, state: np.ndarray) -> None:
    genv.unwrapped.state = np.array(state, dtype=np.float64)


def gym_obs_of_state(env_id: str, genv: gymnasium.Env) -> np.ndarray:
    u = genv.unwrapped
    if env_id == "Acrobot-v1":
        return u._get_ob()
    if env_id == "Pendulum-v1":
        return u._get_obs()
    return np.array(u.state, dtype=np.float32)


def to_gym_action(a: object, dtype: type) -> object:
    if isinstance(a, int):
        return a
    return np.array([a], dtype=dtype)


# ---- the golden loop ---------------------------------------------------------------------------


def run_golden(
    env_id: str,
    policies: tuple[Policy, Policy],
    steps: int,
    num_envs: int = 2,
    seed: int = 7,
    gym_action_dtype: type = np.float64,
    **kwargs: object,
) -> dict[str, int]:
    """Step a pool and its Gymnasium twins in lockstep; returns step and episode-end counts.

    The pool takes float32 continuous actions; Gymnasium gets the same values as
    `gym_action_dtype`. With float64 (the default) Gymnasium computes the action terms in
    float64, as onebox does; with float32 actions NumPy 2's promotion rules (NEP 50) make it
    round them to float32 (Pendulum's `3.0 * u`, MountainCarContinuous's `force * power`), and
    Pendulum's upright balancing amplifies those 1e-8 differences past 1e-5 over an episode.
    """
    pool = onebox.envs.make(env_id, num_envs=num_envs, seed=seed, **kwargs)
    genvs = [gymnasium.make(env_id, disable_env_checker=True, **kwargs) for _ in range(num_envs)]
    rng = np.random.default_rng(seed)
    episodes = [0] * num_envs
    counts = {"steps": 0, "terminated": 0, "truncated": 0}

    def sync(i: int, obs_i: np.ndarray) -> None:
        genvs[i].reset(seed=seed + i)  # resets the time limit and per-episode bookkeeping
        set_gym_state(genvs[i], pool.get_state(i))
        np.testing.assert_array_equal(obs_i, gym_obs_of_state(env_id, genvs[i]))

    obs, _ = pool.reset(seed=seed)
    for i in range(num_envs):
        sync(i, obs[i])
    done = np.zeros(num_envs, dtype=bool)
    for t in range(steps):
        acts = [policies[(i + episodes[i]) % 2](obs[i], rng) for i in range(num_envs)]
        obs, rew, term, trunc, _ = pool.step(np.array(acts).reshape(pool.action_space.shape))
        assert obs.dtype == np.float32 and rew.dtype == np.float64
        for i in range(num_envs):
            if done[i]:  # next-step autoreset: the action was ignored, this is the reset obs
                assert (rew[i], term[i], trunc[i]) == (0.0, False, False)
                episodes[i] += 1
                sync(i, obs[i])
                continue
            gobs, grew, gterm, gtrunc, _ = genvs[i].step(to_gym_action(acts[i], gym_action_dtype))
            where = f"{env_id} env {i} step {t} episode {episodes[i]}"
            np.testing.assert_allclose(obs[i], gobs, atol=1e-5, rtol=0, err_msg=where)
            np.testing.assert_allclose(rew[i], grew, atol=1e-5, rtol=0, err_msg=where)
            assert (bool(term[i]), bool(trunc[i])) == (gterm, gtrunc), where
            counts["steps"] += 1
            counts["terminated"] += int(gterm)
            counts["truncated"] += int(gtrunc)
        done = term | trunc
    pool.close()
    for g in genvs:
        g.close()
    return counts


GOLDEN = {
    # env id: (random policy, controller, pool steps); each pool has 2 envs.
    "CartPole-v1": (random_discrete(2), cartpole_pd, 1100),
    "Acrobot-v1": (random_discrete(3), acrobot_pump, 1100),
    "MountainCar-v0": (random_discrete(3), mountain_car_pump, 700),
    "MountainCarContinuous-v0": (random_box(-2.0, 2.0), mountain_car_continuous_pump, 1200),
    "Pendulum-v1": (random_box(-3.0, 3.0), pendulum_pd, 500),
}


@pytest.mark.parametrize("env_id", sorted(GOLDEN))
def test_golden_trajectories(env_id: str) -> None:
    random_policy, controller, steps = GOLDEN[env_id]
    counts = run_golden(env_id, (random_policy, controller), steps)
    assert counts["steps"] >= 2 * 500 - 10
    assert counts["truncated"] >= 1
    if env_id != "Pendulum-v1":  # Pendulum never terminates
        assert counts["terminated"] >= 1


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("Pendulum-v1", {"g": 9.81}),
        ("MountainCar-v0", {"goal_velocity": 0.01}),
        ("MountainCarContinuous-v0", {"goal_velocity": 0.02}),
        ("CartPole-v1", {"sutton_barto_reward": True}),
    ],
)
def test_golden_with_options(env_id: str, kwargs: dict[str, object]) -> None:
    random_policy, controller, _ = GOLDEN[env_id]
    counts = run_golden(env_id, (random_policy, controller), 400, seed=3, **kwargs)
    assert counts["steps"] > 0


@pytest.mark.parametrize("env_id", ["MountainCarContinuous-v0", "Pendulum-v1"])
def test_one_step_float32_actions(env_id: str) -> None:
    """From many states, one step agrees with Gymnasium fed float32 actions too.

    Long trajectories are compared with float64 actions: NumPy 2 makes Gymnasium round a few
    float32-action terms to float32, and Pendulum amplifies such differences over an episode.
    """
    rng = np.random.default_rng(5)
    n = 64
    pool = onebox.envs.make(env_id, num_envs=n, seed=5)
    genv = gymnasium.make(env_id, disable_env_checker=True).unwrapped
    genv.reset(seed=5)
    pool.reset()
    if env_id == "Pendulum-v1":
        states = np.stack([rng.uniform(-8, 8, n), rng.uniform(-8, 8, n)], axis=1)
    else:  # mid-episode, Gymnasium holds a float32 state
        states = np.stack([rng.uniform(-1.2, 0.6, n), rng.uniform(-0.07, 0.07, n)], axis=1)
        states = states.astype(np.float32)
    actions = rng.uniform(-3, 3, (n, 1)).astype(np.float32)
    for i in range(n):
        pool.set_state(i, states[i])
    obs, rew, term, _, _ = pool.step(actions)
    for i in range(n):
        genv.state = states[i].copy()
        gobs, grew, gterm, _, _ = genv.step(actions[i].copy())
        np.testing.assert_allclose(obs[i], gobs, atol=1e-5, rtol=0)
        np.testing.assert_allclose(rew[i], grew, atol=1e-5, rtol=0)
        assert bool(term[i]) == gterm
    pool.close()


# ---- spaces, specs, options, initial states ---------------------------------------------------

IDS = sorted(GOLDEN)


def assert_same_space(ours: gymnasium.Space, theirs: gymnasium.Space) -> None:
    assert type(ours) is type(theirs)
    if isinstance(theirs, gymnasium.spaces.Discrete):
        assert (ours.n, ours.start, ours.dtype) == (theirs.n, theirs.start, theirs.dtype)
        return
    assert (ours.shape, ours.dtype) == (theirs.shape, theirs.dtype)
    np.testing.assert_array_equal(ours.low, theirs.low)
    np.testing.assert_array_equal(ours.high, theirs.high)
    assert ours == theirs


@pytest.mark.parametrize("env_id", IDS)
def test_spaces_and_spec(env_id: str) -> None:
    pool = onebox.envs.make(env_id, num_envs=3)
    genv = gymnasium.make(env_id)
    assert_same_space(pool.single_observation_space, genv.observation_space)
    assert_same_space(pool.single_action_space, genv.action_space)
    gspec = gymnasium.spec(env_id)
    assert pool.spec.max_episode_steps == gspec.max_episode_steps
    assert pool.spec.reward_threshold == gspec.reward_threshold
    pool.close()
    genv.close()


OPTIONS = {
    "Acrobot-v1": {},
    "CartPole-v1": {"sutton_barto_reward": False, "hide_velocities": False},
    "MountainCar-v0": {"goal_velocity": 0.0},
    "MountainCarContinuous-v0": {"goal_velocity": 0.0},
    "Pendulum-v1": {"g": 10.0},
}


@pytest.mark.parametrize("env_id", IDS)
def test_options_declared(env_id: str) -> None:
    declared = onebox.envs.env_options(env_id)
    assert {name: default for name, (default, _) in declared.items()} == OPTIONS[env_id]
    assert all(doc for _, doc in declared.values())


def test_options_change_dynamics() -> None:
    def first_steps(**kwargs: object) -> np.ndarray:
        pool = onebox.envs.make("Pendulum-v1", num_envs=1, seed=0, **kwargs)
        pool.reset()
        out = [pool.step(np.zeros((1, 1), np.float32))[0] for _ in range(5)]
        pool.close()
        return np.concatenate(out)

    assert not np.array_equal(first_steps(), first_steps(g=9.81))
    np.testing.assert_array_equal(first_steps(), first_steps(g=10.0))


def test_cartpole_hide_velocities_observes_position_and_angle_only() -> None:
    """With `hide_velocities` CartPole steps as ever (same rewards, ends and states) but shows
    only (x, theta): columns 0 and 2 of the full observation."""
    pools = [onebox.envs.make("CartPole-v1", 4, seed=5, hide_velocities=h) for h in (False, True)]
    assert pools[1].single_observation_space.shape == (2,)
    for bound in ("low", "high"):
        full_bound = getattr(pools[0].single_observation_space, bound)
        np.testing.assert_array_equal(
            getattr(pools[1].single_observation_space, bound), full_bound[[0, 2]]
        )
    (full, _), (hidden, _) = (p.reset() for p in pools)
    rng = np.random.default_rng(0)
    for _ in range(300):
        np.testing.assert_array_equal(hidden, full[:, [0, 2]])
        actions = rng.integers(0, 2, 4)
        (full, *rest_f), (hidden, *rest_h) = (p.step(actions) for p in pools)
        for a, b in zip(rest_f[:3], rest_h[:3], strict=True):
            np.testing.assert_array_equal(a, b)
    for p in pools:
        p.close()


# Gymnasium's initial-state distributions: (low, high) per state element.
INITIAL = {
    "Acrobot-v1": ([-0.1] * 4, [0.1] * 4),
    "CartPole-v1": ([-0.05] * 4, [0.05] * 4),
    "MountainCar-v0": ([-0.6, 0.0], [-0.4, 0.0]),
    "MountainCarContinuous-v0": ([-0.6, 0.0], [-0.4, 0.0]),
    "Pendulum-v1": ([-np.pi, -1.0], [np.pi, 1.0]),
}


@pytest.mark.parametrize("env_id", IDS)
def test_initial_state_distribution(env_id: str) -> None:
    n = 256
    pool = onebox.envs.make(env_id, num_envs=n, seed=123)
    pool.reset()
    states = np.stack([pool.get_state(i) for i in range(n)])
    low, high = (np.array(b) for b in INITIAL[env_id])
    assert np.all(states >= low) and np.all(states <= high)
    span = high - low
    # Uniform over the whole range: the extremes come close to the bounds.
    np.testing.assert_allclose(states.min(0), low, atol=0.05 * span.max())
    np.testing.assert_allclose(states.max(0), high, atol=0.05 * span.max())
    assert len(np.unique(states[:, 0])) == n
    if env_id == "Acrobot-v1":  # Gymnasium draws it as float32
        np.testing.assert_array_equal(states, states.astype(np.float32))
    pool.reset(seed=123)
    np.testing.assert_array_equal(states, np.stack([pool.get_state(i) for i in range(n)]))
    pool.close()
