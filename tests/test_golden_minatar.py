"""Golden tests: the native MinAtar games step exactly like the `minatar` package.

The package's own Gymnasium envs (`minatar.gym`, in a SyncVectorEnv as `gymnasium.make_vec` builds
it) and a onebox pool get the same seeds (env i: seed + i) and the same random actions. The native
games draw from the same numpy RandomState stream as the package, so observations, rewards and
the terminated/truncated flags must be equal at every step: across many episode ends (next-step
autoreset), a reset without a seed (every stream and last action go on) and a reset with a new
seed (which starts onebox's env as a new one, its last action, for sticky actions, back to no-op:
the package keeps it, so the test clears the package's before that reset; see
`test_a_seeded_reset_plays_as_a_new_env`). A game is a row of GAMES; its cases run with the
package's defaults (sticky actions 0.1, difficulty ramping) and with other options.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterator

import gymnasium
import numpy as np
import pytest

import onebox.envs

minatar_gym = pytest.importorskip("minatar.gym")

# The package's -v0 ids are deprecated in Gymnasium's eyes (a -v1 exists); onebox has both.
pytestmark = pytest.mark.filterwarnings("ignore:.*is out of date:DeprecationWarning")

GAMES = {
    # env id (-v1: minimal action set; -v0: all 6 actions) -> steps after the first reset (4 envs
    # each); Freeway's episodes last 2501 steps, so it needs more to see them end.
    "MinAtar/Breakout-v1": 1000,
    "MinAtar/Breakout-v0": 1000,
    "MinAtar/Freeway-v1": 2600,
    "MinAtar/Freeway-v0": 2600,
    "MinAtar/Asterix-v1": 1000,
    "MinAtar/Asterix-v0": 1000,
    "MinAtar/Seaquest-v1": 1000,
    "MinAtar/Seaquest-v0": 1000,
    "MinAtar/SpaceInvaders-v1": 1000,
    "MinAtar/SpaceInvaders-v0": 1000,
}
"""The native MinAtar ids under test and their steps after the first reset (with a seed)."""

LATER_STEPS = 300
"""Steps after each later reset: one without a seed, then one with a new seed."""

OPTIONS = {
    "defaults": {},
    "no-sticky-no-ramp": {"sticky_action_prob": 0.0, "difficulty_ramping": False},
    "half-sticky-other-actions": {"sticky_action_prob": 0.5, "use_minimal_action_set": None},
}
"""Option sets of the cases; `use_minimal_action_set: None` flips the id's default."""

NUM_ENVS = 4


@pytest.fixture(scope="module", autouse=True)
def package_ids() -> Iterator[list[str]]:
    """The package's Gymnasium ids, registered for this module only (Gymnasium 1.x does not load
    the package's entry point by itself)."""
    before = set(gymnasium.registry)
    minatar_gym.register_envs()
    added = sorted(set(gymnasium.registry) - before)
    yield added
    for env_id in added:
        del gymnasium.registry[env_id]


def resolve(env_id: str, options: dict) -> dict:
    options = dict(options)
    if "use_minimal_action_set" in options:
        options["use_minimal_action_set"] = env_id.endswith("-v0")
    return options


def assert_same_step(ref: tuple, nat: tuple, where: str) -> None:
    for name, a, b in zip(
        ("obs", "reward", "terminated", "truncated"), ref[:4], nat[:4], strict=True
    ):
        if not np.array_equal(np.asarray(a, dtype=b.dtype), b):
            raise AssertionError(f"{where}: {name} differs:\npackage {a}\nonebox  {b}")


@pytest.mark.parametrize("options", list(OPTIONS), ids=list(OPTIONS))
@pytest.mark.parametrize("env_id", list(GAMES))
def test_same_trajectories_as_the_package(env_id: str, options: str) -> None:
    kwargs = resolve(env_id, OPTIONS[options])
    ref = gymnasium.make_vec(env_id, num_envs=NUM_ENVS, vectorization_mode="sync", **kwargs)
    pool = onebox.envs.make(env_id, NUM_ENVS, num_threads=1, **kwargs)
    assert pool.single_observation_space == ref.single_observation_space
    assert pool.single_action_space == ref.single_action_space
    rng = np.random.default_rng(7)
    ends = 0
    # Seed 3, then a reset without a seed (the streams go on), then a new seed.
    phases = ((3, GAMES[env_id]), (None, LATER_STEPS), (2**32 - 1 - NUM_ENVS, LATER_STEPS))
    for phase, (seed, steps) in enumerate(phases):
        if phase and seed is not None:  # onebox's seeded reset also forgets the last action
            for env in ref.envs:
                env.unwrapped.game.last_action = 0
        obs_ref, _ = ref.reset(seed=seed)
        obs, _ = pool.reset(seed=seed)
        assert obs.dtype == np.bool_ and obs.shape == (
            NUM_ENVS,
            *ref.single_observation_space.shape,
        )
        assert np.array_equal(obs_ref, obs), f"phase {phase}: reset observations differ"
        for t in range(steps):
            actions = rng.integers(0, ref.single_action_space.n, NUM_ENVS)
            nat = pool.step(actions)
            assert_same_step(ref.step(actions), nat, f"phase {phase}, step {t}")
            ends += int(nat[2].sum())
    assert ends >= NUM_ENVS, f"only {ends} episode ends: the episodes must end and restart"
    ref.close()
    pool.close()


def _play(env: gymnasium.vector.VectorEnv, seed: int, actions: np.ndarray) -> list:
    """The observations and rewards of a reset with `seed`, then `actions`."""
    out = [env.reset(seed=seed)[0]]
    for a in actions:
        obs, reward, *_ = env.step(np.array([a]))
        out += [obs, reward]
    return out


def _same(a: list, b: list) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("env_id", ["MinAtar/Breakout-v1", "MinAtar/SpaceInvaders-v1"])
def test_a_seeded_reset_plays_as_a_new_env(env_id: str) -> None:
    """After any history, a reset with seed s plays as a new env reset with s: what makes an
    evolved network's fitness depend on its episode's seed alone (`onebox.evo`), whatever the
    env played before. The package's env keeps its last action across a seeded reset, so with
    sticky actions its first steps after one can repeat the last episode's action; onebox's
    starts that memory afresh (the one place where it does not replay the package)."""
    rng = np.random.default_rng(1)
    kwargs = {"sticky_action_prob": 0.5}
    package_differs = False
    for seed in range(8):
        history, actions = rng.integers(1, 3, 40), rng.integers(0, 3, 30)
        played, new = (onebox.envs.make(env_id, 1, num_threads=1, **kwargs) for _ in range(2))
        ref_played, ref_new = (gymnasium.make_vec(env_id, 1, **kwargs) for _ in range(2))
        _play(played, 100 + seed, history)
        _play(ref_played, 100 + seed, history)
        fresh = _play(new, seed, actions)
        assert _same(_play(played, seed, actions), fresh)
        assert _same(_play(ref_new, seed, actions), fresh)  # new envs: onebox replays the package
        package_differs |= not _same(_play(ref_played, seed, actions), fresh)
        for env in (played, new, ref_played, ref_new):
            env.close()
    assert package_differs  # what this guards against does happen in these 8 seeds


@pytest.mark.parametrize("env_id", ["MinAtar/Breakout-v1", "MinAtar/Asterix-v1"])
def test_seeds_above_32_bits_seed_as_a_two_word_key(env_id: str) -> None:
    # RandomState(seed) rejects seeds >= 2**32; onebox seeds them as RandomState([low, high]).
    seed = 2**40 + 12345
    pool = onebox.envs.make(env_id, 1, seed=seed, num_threads=1)
    ref = gymnasium.make(env_id).unwrapped
    random = np.random.RandomState([seed & 0xFFFFFFFF, seed >> 32])
    ref.game.random = ref.game.env.random = random
    ref.game.reset()
    assert np.array_equal(pool.reset()[0][0], ref.game.state())
    rng = np.random.default_rng(0)
    for t in range(500):
        a = int(rng.integers(ref.action_space.n))
        nat = pool.step(np.array([a]))
        if ref.game.env.terminal:  # the pool resets on this step (next-step autoreset)
            ref.game.reset()
            expected = (ref.game.state(), 0, False, False)
        else:
            expected = ref.step(a)
        assert_same_step(tuple(np.asarray([v]) for v in expected), nat, f"step {t}")
    pool.close()


def test_ids_options_and_spaces_match_the_package(package_ids: list[str]) -> None:
    """Every package id onebox has natively takes the package's options with its defaults."""
    native = [i for i in package_ids if onebox.envs.backend_of(i) == "native"]
    assert set(GAMES) <= set(native)
    params = inspect.signature(minatar_gym.Environment.__init__).parameters
    for env_id in native:
        options = onebox.envs.env_options(env_id)
        spec = gymnasium.spec(env_id)
        assert options["use_minimal_action_set"][0] == spec.kwargs["use_minimal_action_set"]
        for name in ("sticky_action_prob", "difficulty_ramping"):
            assert options[name][0] == params[name].default, (env_id, name)
        ref = gymnasium.make(env_id)
        pool = onebox.envs.make(env_id, 2)
        assert pool.single_observation_space == ref.observation_space
        assert pool.single_action_space == ref.action_space
        assert pool.spec.max_episode_steps == spec.max_episode_steps  # none
        ref.close()
        pool.close()


# ---- long games: Seaquest and Space Invaders played well enough to ramp up ----------------------
# Random actions end Seaquest within ~30 steps and never clear a Space Invaders wave, so they
# never reach the difficulty ramp, full diver loads or crowded screens. Here a planner plays
# them: a simple controller's action unless a lookahead in a copy of the package's game (that
# action, then no-ops) scores better. Its choices drive both envs alike; every step is compared.


def copy_game(game: object, random: np.random.RandomState) -> object:
    """A copy of a package game to plan in, drawing from `random` (copying the game's own stream
    would cost more than the whole plan; the sticky draws make the real spawns differ anyway)."""
    sim = copy.copy(game)
    for name, value in vars(game).items():
        if isinstance(value, np.ndarray):
            setattr(sim, name, value.copy())
        elif isinstance(value, list):
            setattr(sim, name, [list(v) if isinstance(v, list) else v for v in value])
    sim.random = random
    return sim


def lookahead(game: object, action: int, horizon: int, random: np.random.RandomState) -> float:
    sim = copy_game(game, random)
    total = 0.0
    for k in range(horizon):
        r, dead = sim.act(action if k == 0 else 0)
        total += r
        if dead:
            return total - 1000.0 + k
    return total


def toward(target: int, at: int, less: int, more: int, there: int) -> int:
    """The action that moves from `at` toward `target` on a line, or `there` once at it."""
    return there if target == at else (more if target > at else less)


def seaquest_controller(obs: np.ndarray, actions: list[int]) -> int:
    """Surface when full or low on oxygen with a diver aboard, else fetch the nearest diver."""
    n, left, up, right, down, fire = range(6)
    y, x = (int(v[0]) for v in np.nonzero(obs[:, :, 0]))
    carried, oxygen = int(obs[9, :, 8].sum()), int(obs[9, :, 7].sum())
    if carried and (carried == 6 or oxygen <= 3):
        return actions.index(up)
    dy, dx = np.nonzero(obs[:, :, 9])
    if not len(dy):
        return actions.index(down if y < 4 else fire)
    k = int(np.argmin(np.abs(dy - y) + np.abs(dx - x)))
    if dy[k] != y:
        return actions.index(down if dy[k] > y else (up if y > 1 else n))
    return actions.index(toward(int(dx[k]), x, left, right, fire))


def invaders_controller(obs: np.ndarray, actions: list[int]) -> int:
    """Go under the nearest column of aliens and fire."""
    x = int(np.nonzero(obs[9, :, 0])[0][0])
    cols = np.nonzero(obs[:, :, 1].any(axis=0))[0]
    target = int(cols[np.argmin(np.abs(cols - x))])
    return actions.index(toward(target, x, 1, 3, 5))


LONG_GAMES = {
    # env id -> (controller, planning horizon, episode return to play for, steps, difficulty ramp
    # index to reach with ramping: a step per surfacing in Seaquest, per cleared wave in Space
    # Invaders)
    "MinAtar/Seaquest-v1": (seaquest_controller, 8, 15, 2000, 3),
    "MinAtar/SpaceInvaders-v1": (invaders_controller, 7, 30, 800, 1),
}
"""Games the planner plays until an episode's return reaches the goal; random actions then end
the episode, and the next one must start at the initial difficulty again."""


@pytest.mark.parametrize("options", ["defaults", "no-sticky-no-ramp"])
@pytest.mark.parametrize("env_id", list(LONG_GAMES))
def test_long_games_with_the_difficulty_ramp(env_id: str, options: str) -> None:
    controller, horizon, goal, steps, ramp_goal = LONG_GAMES[env_id]
    kwargs = OPTIONS[options]
    ref = gymnasium.make(env_id, **kwargs).unwrapped
    pool = onebox.envs.make(env_id, 1, seed=11, num_threads=1, **kwargs)
    obs = pool.reset()[0]
    assert np.array_equal(ref.reset(seed=11)[0], obs[0])
    game, moves = ref.game.env, range(len(ref.action_set))
    rng, planning = np.random.default_rng(11), np.random.RandomState(0)
    ramp, goals, ends, full_loads, episode_return = 0, 0, 0, 0, 0.0
    for t in range(steps):
        if episode_return < goal:
            want = controller(obs[0], ref.action_set)
            scores = [lookahead(game, ref.action_set[a], horizon, planning) for a in moves]
            a = want if scores[want] >= max(scores) else int(np.argmax(scores))
        else:
            a = int(rng.integers(len(moves)))
        nat = pool.step(np.array([a]))
        if game.terminal:  # the pool resets on this step (next-step autoreset)
            expected = (ref.reset()[0], 0, False, False)
            ends, goals, episode_return = ends + 1, goals + (episode_return >= goal), 0.0
        else:
            expected = ref.step(a)
        assert_same_step(tuple(np.asarray([v]) for v in expected[:4]), nat, f"step {t}")
        if "Seaquest" in env_id:  # its timers and object lists too
            np.testing.assert_array_equal(pool.get_state(0), seaquest_state(game), f"step {t}")
        obs, reward = nat[0], float(nat[1][0])
        episode_return += reward
        full_loads += reward > 1  # Seaquest: surfacing with 6 divers pays for the oxygen left
        ramp = max(ramp, game.ramp_index)
    pool.close()
    assert goals >= 1, "no episode reached the goal and ended"
    if kwargs.get("difficulty_ramping", True):
        assert ramp >= ramp_goal
    else:
        assert ramp == 0
    if "Seaquest" in env_id:
        assert full_loads >= 1


# ---- Seaquest's object lists ---------------------------------------------------------------------
# The package removes Seaquest's objects by value (the first equal list) while iterating in reverse,
# so when two objects coincide in every field the other one goes and the one at hand is visited
# again. Here the package's game and the native one start from the same set-up states with such
# twins (two bullets that meet, two divers) and must agree on the whole state, list order included.

SEAQUEST_SCALARS = (
    "oxygen", "diver_count", "sub_x", "sub_y", "sub_or", "e_spawn_speed", "e_spawn_timer",
    "d_spawn_timer", "move_speed", "ramp_index", "shot_timer", "surface", "terminal",
)  # fmt: skip
SEAQUEST_LISTS = ("f_bullets", "e_bullets", "e_fish", "e_subs", "divers")


def seaquest_state(game: object) -> np.ndarray:
    """The package game's state in the layout of the native game's get_state."""
    state = [float(getattr(game, name)) for name in SEAQUEST_SCALARS]
    for name in SEAQUEST_LISTS:
        objects = getattr(game, name)
        state.append(len(objects))
        for o in objects:
            state.extend([*o, 0, 0][:5])
    return np.array(state)


SEAQUEST_TWINS = {
    # The rear bullet catches up with its twin where a fish is: the fish and the front twin go
    # (removed by value), the rear one is visited again and flies on, now after the middle one.
    "bullets": {
        "sub_x": 5, "sub_y": 6,
        "f_bullets": [[8, 4, True], [2, 6, False], [7, 4, True]],
        "e_fish": [[8, 4, True, 3]],
    },
    # The sub, one diver short of full, moves onto a diver whose twin then arrives there: the
    # first is picked up (removed by value), the twin is visited again and stays, now last.
    "divers": {
        "sub_x": 4, "sub_y": 3, "sub_or": True, "diver_count": 5,
        "divers": [[5, 3, True, 5], [1, 7, False, 3], [4, 3, True, 0]],
    },
}  # fmt: skip


@pytest.mark.parametrize("twins", list(SEAQUEST_TWINS))
def test_seaquest_twin_objects_as_in_the_package(twins: str) -> None:
    env_id = "MinAtar/Seaquest-v1"
    ref = gymnasium.make(env_id, sticky_action_prob=0.0).unwrapped
    pool = onebox.envs.make(env_id, 1, seed=5, num_threads=1, sticky_action_prob=0.0)
    pool.reset()
    ref.reset(seed=5)
    game = ref.game.env
    for name, value in SEAQUEST_TWINS[twins].items():
        setattr(game, name, value)
    pool.set_state(0, seaquest_state(game))
    np.testing.assert_array_equal(pool.get_state(0), seaquest_state(game))
    right = ref.action_set.index(3)
    for t in range(12):
        action = right if twins == "divers" and t == 0 else 0
        nat = pool.step(np.array([action]))
        expected = ref.step(action)
        assert_same_step(tuple(np.asarray([v]) for v in expected[:4]), nat, f"step {t}")
        np.testing.assert_array_equal(pool.get_state(0), seaquest_state(game), f"step {t}")


def test_seaquest_state_errors() -> None:
    pool = onebox.envs.make("MinAtar/Seaquest-v1", 1)
    pool.reset()
    state = pool.get_state(0)
    with pytest.raises(ValueError, match="Seaquest state: too few values"):
        pool.set_state(0, state[:-1])
    with pytest.raises(ValueError, match="Seaquest state: too many values"):
        pool.set_state(0, np.append(state, 0.0))
    state[2] = 10.0
    with pytest.raises(ValueError, match=r"Seaquest state: sub x must be an integer in \[0, 9\]"):
        pool.set_state(0, state)


# ---- bad input ---------------------------------------------------------------------------------


def test_unknown_game_lists_the_minatar_ids() -> None:
    with pytest.raises(
        ValueError, match=r"unknown env id 'MinAtar/Pong-v1'.*MinAtar ids:.*Breakout"
    ):
        onebox.envs.make("MinAtar/Pong-v1", 2)


def test_an_option_the_game_does_not_have() -> None:
    with pytest.raises(TypeError, match=r"MinAtar/Breakout-v1 has no option 'frameskip'"):
        onebox.envs.make("MinAtar/Breakout-v1", 2, frameskip=4)
    with pytest.raises(TypeError, match=r"Did you mean sticky_action_prob"):
        onebox.envs.make("MinAtar/Breakout-v1", 2, sticky_action_probability=0.2)


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan")])
def test_sticky_action_prob_outside_0_1(p: float) -> None:
    with pytest.raises(ValueError, match=r"sticky_action_prob must be a probability in \[0, 1\]"):
        onebox.envs.make("MinAtar/Asterix-v1", 2, sticky_action_prob=p)
