"""Golden tests: the native MuJoCo envs step exactly like Gymnasium's v5 envs.

A onebox pool and one Gymnasium env per pool env are stepped with the same random actions (drawn
20% wider than the action bounds, so MuJoCo's control clamping and the unclipped control costs are
exercised). After every reset of a pool env, its (qpos, qvel) is copied into the Gymnasium env with
`MujocoEnv.set_state`; from there on both call the same libmujoco on the same model with the same
controls, so observations, terminated and truncated flags must agree exactly, at every step.

Both must run on the same MuJoCo: onebox on the libmujoco it ships (the build's, 3.3.7), Gymnasium
on the `mujoco` package installed. Other versions differ: with mujoco 4.0.0, observations differ
after one step by ~1e-15 (HalfCheetah, Hopper, Walker2d, Swimmer, Pusher), 1e-7 (Ant), 1e-6
(Humanoid) and 1 (HumanoidStandup), and chaos grows the small ones to O(1) within ~100 steps;
only the two inverted pendulums agree. So the step-by-step tests run only when the installed
`mujoco` is onebox's version (`pip install mujoco==3.3.7`), and are skipped otherwise, saying so.

Rewards and infos are float64 sums that onebox computes in C++ in the same order as NumPy
(pairwise sums, float32 control costs as NumPy 2 rounds them). The remaining differences are in
the last bits (seen: 1 ulp in distances, in InvertedDoublePendulum's velocity penalty, in Humanoid's
velocities): `np.linalg.norm` goes through BLAS `dot` (which may fuse multiply-adds), NumPy's
`v ** 2` through `pow`, Humanoid's center of mass through `np.einsum` (its own summation order),
and Humanoid divides a
difference of two nearly equal centers of mass by dt = 0.015, which scales a 1e-16 rounding
difference to ~1e-13. Rewards and infos are therefore compared with rtol = atol = 1e-10 — six
orders of magnitude above those rounding effects and far below any modelling error (a wrong term,
weight, sign or clip changes them by >= 1e-4).
"""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest

import onebox.envs
from onebox.envs.mujoco_module import mujoco_library, mujoco_module

mujoco = pytest.importorskip("mujoco")  # Gymnasium's MuJoCo envs need it
pytestmark = pytest.mark.skipif(mujoco_module() is None, reason="onebox was built without MuJoCo")
BUNDLED = mujoco_library()[0] if mujoco_module() is not None else None
same_mujoco = pytest.mark.skipif(
    mujoco.__version__ != BUNDLED,
    reason=f"Gymnasium's envs run on mujoco {mujoco.__version__}, onebox's on its own "
    f"{BUNDLED}, whose physics differ: `pip install mujoco=={BUNDLED}` to compare them",
)

ENVS = [
    "Ant-v5",
    "HalfCheetah-v5",
    "Hopper-v5",
    "Humanoid-v5",
    "HumanoidStandup-v5",
    "InvertedDoublePendulum-v5",
    "InvertedPendulum-v5",
    "Pusher-v5",
    "Reacher-v5",
    "Swimmer-v5",
    "Walker2d-v5",
]
TOL = {"rtol": 1e-10, "atol": 1e-10}


def gym_info_value(info: dict, key: str) -> float:
    """Gymnasium's value for a onebox info key (array infos are split: tendon_length_0, ...)."""
    if key in info:
        return float(info[key])
    name, _, index = key.rpartition("_")
    return float(info[name][int(index)])


def run_golden(env_id: str, steps: int, num_envs: int = 2, seed: int = 5, **kwargs: object) -> dict:
    pool = onebox.envs.make(env_id, num_envs=num_envs, seed=seed, **kwargs)
    genvs = [gymnasium.make(env_id, disable_env_checker=True, **kwargs) for _ in range(num_envs)]
    rng = np.random.default_rng(seed)
    low, high = pool.single_action_space.low, pool.single_action_space.high
    mid, half = (low + high) / 2, (high - low) / 2
    counts = {"steps": 0, "terminated": 0, "truncated": 0}

    def sync(i: int, obs_i: np.ndarray, info: dict) -> None:
        genv = genvs[i]
        genv.reset(seed=seed + i)  # restarts Gymnasium's time limit
        u = genv.unwrapped
        state = pool.get_state(i)
        u.set_state(state[: u.model.nq], state[u.model.nq :])
        np.testing.assert_array_equal(obs_i, u._get_obs())
        ginfo = u._get_reset_info()  # reset infos: those Gymnasium has, the others are 0
        for k in keys:
            expected = (
                gym_info_value(ginfo, k) if k.rpartition("_")[0] in ginfo or k in ginfo else 0
            )
            np.testing.assert_allclose(info[k][i], expected, **TOL, err_msg=f"reset {k}")

    obs, info = pool.reset()
    keys = [k for k in info if not k.startswith("_") and k != "env_id"]
    for i in range(num_envs):
        sync(i, obs[i], info)
    done = np.zeros(num_envs, dtype=bool)
    for t in range(steps):
        actions = (mid + 1.2 * half * rng.uniform(-1, 1, (num_envs, len(low)))).astype(np.float32)
        obs, rew, term, trunc, info = pool.step(actions)
        for i in range(num_envs):
            if done[i]:  # next-step autoreset: this is a fresh episode
                assert (rew[i], term[i], trunc[i]) == (0.0, False, False)
                sync(i, obs[i], info)
                continue
            gobs, grew, gterm, gtrunc, ginfo = genvs[i].step(actions[i])
            where = f"{env_id} env {i} step {t}"
            np.testing.assert_array_equal(obs[i], gobs, err_msg=where)
            assert (bool(term[i]), bool(trunc[i])) == (gterm, gtrunc), where
            np.testing.assert_allclose(rew[i], grew, **TOL, err_msg=where)
            for k in keys:
                np.testing.assert_allclose(
                    info[k][i], gym_info_value(ginfo, k), **TOL, err_msg=f"{where} {k}"
                )
            counts["steps"] += 1
            counts["terminated"] += int(gterm)
            counts["truncated"] += int(gtrunc)
        done = term | trunc
    pool.close()
    return counts


@same_mujoco
@pytest.mark.parametrize("env_id", ENVS)
def test_golden(env_id: str) -> None:
    counts = run_golden(env_id, steps=1000)
    assert counts["steps"] >= 1000
    if env_id in ("Pusher-v5", "Reacher-v5"):  # 100- and 50-step time limits
        assert counts["truncated"] >= 10
    if env_id in ("Hopper-v5", "Walker2d-v5", "Humanoid-v5", "Ant-v5", "InvertedPendulum-v5"):
        assert counts["terminated"] >= 1  # random actions make them fall


@same_mujoco
@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("HalfCheetah-v5", {"exclude_current_positions_from_observation": False, "frame_skip": 3}),
        ("Hopper-v5", {"healthy_z_range": (0.9, 10.0), "ctrl_cost_weight": 0.3}),
        ("Walker2d-v5", {"terminate_when_unhealthy": False, "healthy_reward": 2.5}),
        ("Ant-v5", {"include_cfrc_ext_in_observation": False, "contact_force_range": (-0.5, 0.7)}),
        (
            "Humanoid-v5",
            {"include_cinert_in_observation": False, "contact_cost_range": (-1.0, 0.001)},
        ),
        ("HumanoidStandup-v5", {"include_cvel_in_observation": False, "impact_cost_weight": 1e-3}),
        ("Swimmer-v5", {"exclude_current_positions_from_observation": False}),
        ("Reacher-v5", {"reward_control_weight": 0.3, "reward_dist_weight": 2.0}),
        ("Pusher-v5", {"reward_near_weight": 0.25}),
        ("InvertedDoublePendulum-v5", {"healthy_reward": 3.0, "reset_noise_scale": 0.2}),
        ("InvertedPendulum-v5", {"reset_noise_scale": 0.1}),
    ],
)
def test_golden_options(env_id: str, kwargs: dict) -> None:
    """Constructor options change the env as they change Gymnasium's."""
    pool = onebox.envs.make(env_id, **kwargs)
    genv = gymnasium.make(env_id, disable_env_checker=True, **kwargs)
    assert pool.single_observation_space == genv.observation_space
    assert pool.single_action_space == genv.action_space
    run_golden(env_id, steps=150, num_envs=1, **kwargs)


@pytest.mark.parametrize("env_id", ENVS)
def test_spec_matches_gymnasium(env_id: str) -> None:
    pool = onebox.envs.make(env_id)
    genv = gymnasium.make(env_id, disable_env_checker=True)
    assert pool.single_observation_space == genv.observation_space
    assert pool.single_action_space == genv.action_space
    assert pool.spec.max_episode_steps == genv.spec.max_episode_steps
    assert pool.spec.reward_threshold == genv.spec.reward_threshold
    assert pool.unwrapped is pool
    declared = onebox.envs.env_options(env_id)
    assert "xml_file" in declared and "frame_skip" in declared
    assert declared["frame_skip"][0] == genv.unwrapped.frame_skip


# (qpos noise, qvel noise) of each env's reset: ("u", s) uniform in [-s, s], ("n", s) normal.
RESET_NOISE = {
    "HalfCheetah-v5": (("u", 0.1), ("n", 0.1)),
    "Ant-v5": (("u", 0.1), ("n", 0.1)),
    "InvertedDoublePendulum-v5": (("u", 0.1), ("n", 0.1)),
    "Hopper-v5": (("u", 0.005), ("u", 0.005)),
    "Walker2d-v5": (("u", 0.005), ("u", 0.005)),
    "Swimmer-v5": (("u", 0.1), ("u", 0.1)),
    "Humanoid-v5": (("u", 0.01), ("u", 0.01)),
    "HumanoidStandup-v5": (("u", 0.01), ("u", 0.01)),
    "InvertedPendulum-v5": (("u", 0.01), ("u", 0.01)),
}


def _check_noise(noise: np.ndarray, kind: str, scale: float) -> None:
    """Uniform in [-s, s] has std s/sqrt(3) and stays inside; normal has std s and leaves it."""
    std = noise.std()
    if kind == "u":
        assert np.abs(noise).max() <= scale
        assert std == pytest.approx(scale / np.sqrt(3), rel=0.1)
    else:
        assert std == pytest.approx(scale, rel=0.1)
        assert np.abs(noise).max() > 1.5 * scale


@pytest.mark.parametrize("env_id", sorted(RESET_NOISE))
def test_reset_noise(env_id: str) -> None:
    """Reset states are Gymnasium's initial state plus noise of the same distribution and scale."""
    pool = onebox.envs.make(env_id, num_envs=40, seed=1)
    u = gymnasium.make(env_id).unwrapped
    nq = u.model.nq
    states = []
    for k in range(5):
        pool.reset(seed=100 * k)
        states += [pool.get_state(i) for i in range(pool.num_envs)]
    states = np.array(states)
    (qk, qs), (vk, vs) = RESET_NOISE[env_id]
    _check_noise(states[:, :nq] - u.init_qpos, qk, qs)
    _check_noise(states[:, nq:] - u.init_qvel, vk, vs)


def test_reset_goals() -> None:
    """Reacher's target is uniform in the disc of radius 0.2, Pusher's object far enough from
    the goal, as in Gymnasium; their velocities are zero."""
    reacher = onebox.envs.make("Reacher-v5", num_envs=200, seed=2)
    reacher.reset()
    s = np.array([reacher.get_state(i) for i in range(200)])
    goal = s[:, 2:4]
    assert np.linalg.norm(goal, axis=1).max() < 0.2
    assert goal.min() < -0.15 and goal.max() > 0.15
    assert np.all(s[:, 6:8] == 0) and np.abs(s[:, 4:6]).max() <= 0.005
    assert np.abs(s[:, :2]).max() <= 0.1

    pusher = onebox.envs.make("Pusher-v5", num_envs=200, seed=2)
    pusher.reset()
    u = gymnasium.make("Pusher-v5").unwrapped
    s = np.array([pusher.get_state(i) for i in range(200)])
    nq = u.model.nq
    np.testing.assert_array_equal(s[:, : nq - 4], np.broadcast_to(u.init_qpos[:-4], (200, nq - 4)))
    cyl = s[:, nq - 4 : nq - 2]
    assert np.linalg.norm(cyl, axis=1).min() > 0.17
    assert cyl[:, 0].min() >= -0.3 and cyl[:, 0].max() <= 0 and np.abs(cyl[:, 1]).max() <= 0.2
    assert np.all(s[:, nq - 2 : nq] == 0) and np.all(s[:, -4:] == 0)


def test_bad_options() -> None:
    with pytest.raises(TypeError, match="healthy_z_range"):
        onebox.envs.make("Hopper-v5", healthy_z_range=0.5)
    with pytest.raises(TypeError, match="tuple of 2"):
        onebox.envs.make("Hopper-v5", healthy_z_range=(0.5, 1.0, 2.0))
    with pytest.raises(TypeError, match="no option 'ctrl_cost'"):
        onebox.envs.make("HalfCheetah-v5", ctrl_cost=0.1)
    with pytest.raises(ValueError, match="does not exist"):
        onebox.envs.make("HalfCheetah-v5", xml_file="no_such_model.xml")
    with pytest.raises(ValueError, match="frame_skip"):
        onebox.envs.make("HalfCheetah-v5", frame_skip=0)
    with pytest.raises(ValueError, match="main_body"):
        onebox.envs.make("Ant-v5", main_body=99)
    with pytest.raises(ValueError, match="cannot load"):
        onebox.envs.make("HalfCheetah-v5", xml_file=__file__)
    pool = onebox.envs.make("Hopper-v5")
    with pytest.raises(ValueError, match="qpos then qvel"):
        pool.set_state(0, [0.0, 1.0])
