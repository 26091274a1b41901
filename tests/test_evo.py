"""Neuroevolution: population networks, the population evaluator, GA/ES/RS, runs and resume."""

from __future__ import annotations

import csv
import math
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gymnasium import spaces

import onebox.envs
from onebox.algos.launch import eval_envs, play
from onebox.cli import main
from onebox.envs.base import EPISODE_CAP, time_limit
from onebox.evo.build import params_of
from onebox.evo.core import centered_ranks
from onebox.evo.es import ES, ESParams
from onebox.evo.evaluator import EvalResult, PopulationEvaluator
from onebox.evo.ga import GA, GAParams, rebuild
from onebox.evo.presets import MINATAR_CAP, PRESETS, Preset, env_family
from onebox.evo.run import ESConfig, GAConfig, RSConfig, load_policy, resolve, run
from onebox.nn.population import PopulationNet
from onebox.run import load_checkpoint, load_config


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Each test with one torch thread: runs earlier in the session may have set more, and on a
    busy 2-core machine two threads' spin-waits made a 7 s test outrun its 300 s timeout."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---- population networks ---------------------------------------------------------------------


def _mlp_reference(net: PopulationNet, flat: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
    """One individual's MLP forward, layer by layer with F.linear."""
    x, off = obs, 0
    for k, lay in enumerate(net.layers):
        n_in, n_out = lay.weight
        w = flat[off : off + n_in * n_out].reshape(n_in, n_out)
        b = flat[off + n_in * n_out : off + n_in * n_out + n_out]
        off += n_in * n_out + n_out
        x = F.linear(x, w.T, b)
        if k < len(net.layers) - 1:
            x = torch.tanh(x)
    return x


def test_mlp_forward_on_slot_subsets_matches_each_network_alone() -> None:
    net = PopulationNet("mlp", spaces.Box(-1, 1, (5,)), spaces.Discrete(3), 7, hidden=(8, 6))
    flats = torch.stack([net.init_params(i) for i in range(7)])
    flats[:, -3:] = torch.randn(7, 3)  # non-zero output biases
    net.set_slots(slice(None), flats)
    assert torch.equal(net.get_slots(slice(None)), flats)
    obs = torch.randn(4, 5)
    for slots in (slice(2, 6), torch.tensor([6, 0, 3, 3])):
        out = net.forward(obs, slots)
        ids = range(2, 6) if isinstance(slots, slice) else slots.tolist()
        ref = torch.stack([_mlp_reference(net, flats[i], obs[k]) for k, i in enumerate(ids)])
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
        assert np.array_equal(net.act(obs.numpy(), slots), ref.argmax(1).numpy())


@pytest.mark.parametrize("conv", ["grouped", "im2col"])
def test_cnn_forward_matches_per_network_convolutions(conv: str) -> None:
    obs_space = spaces.Box(0, 255, (2, 40, 40), dtype=np.uint8)
    net = PopulationNet("cnn", obs_space, spaces.Discrete(4), 3, hidden=(16,), conv=conv)
    assert net.conv == conv
    flats = torch.stack([net.init_params(10 + i) for i in range(3)])
    net.set_slots(slice(None), flats)
    obs = torch.randint(0, 256, (3, 2, 40, 40), dtype=torch.uint8)
    slots = torch.tensor([2, 0, 1])
    out = net.forward(obs, slots)
    for k, i in enumerate(slots.tolist()):
        x, off = obs[k : k + 1].float() / 255.0, 0
        for j, lay in enumerate(net.layers):
            nw, nb = math.prod(lay.weight), math.prod(lay.bias)
            w = flats[i, off : off + nw].reshape(lay.weight)
            b = flats[i, off + nw : off + nw + nb]
            off += nw + nb
            if lay.kind == "conv":
                x = torch.relu(F.conv2d(x, w, b, stride=lay.stride))
            else:
                x = F.linear(x.flatten(1), w.T, b)
                x = torch.relu(x) if j < len(net.layers) - 1 else x
        torch.testing.assert_close(out[k], x[0], rtol=1e-4, atol=1e-5)


MINATAR_SPACE = spaces.Box(0, 1, (10, 10, 4), dtype=np.bool_)


@pytest.mark.parametrize(
    ("arch", "space", "conv", "hidden", "actions"),
    [("minatar", MINATAR_SPACE, "grouped", (128,), 6),
     ("minatar", MINATAR_SPACE, "im2col", (16,), 3),
     ("mlp", spaces.Box(-1, 1, (6,)), "auto", (64, 20), 5),
     ("cnn", spaces.Box(0, 255, (4, 84, 84), dtype=np.uint8), "grouped", (512,), 6)],
)  # fmt: skip
def test_a_network_computes_the_same_bits_whatever_runs_beside_it(
    arch: str, space: spaces.Box, conv: str, hidden: tuple[int, ...], actions: int
) -> None:
    """The slot groups run 1 to K/G networks per call as episodes end, each group from its own
    first slot: a network's outputs must be the same bits in every batch and at every position
    in it, or a near-tie between two actions can turn the other way and a fitness depend on K.
    Two ways that failed before: a lone MinAtar network in a grouped convolution (oneDNN
    computed it as a plain one), and dense layers whose width is not a multiple of 8 (Pong's
    and Seaquest's 6 actions), which torch's batched matmul computed differently by position."""
    net = PopulationNet(arch, space, spaces.Discrete(actions), 16, hidden=hidden, conv=conv)
    net.set_slots(slice(None), torch.stack([net.init_params(i) for i in range(16)]))
    space.seed(0)
    obs = torch.as_tensor(np.stack([space.sample() for _ in range(16)]))
    full = net.forward(obs, slice(0, 16))
    for first in (0, 1, 3, 5):
        for n in (1, 2, 3, 8):
            part = slice(first, first + n)
            assert torch.equal(net.forward(obs[part], part), full[part]), (first, n)


def test_continuous_actions_stay_in_bounds() -> None:
    act = spaces.Box(np.array([-2.0, 0.0]), np.array([2.0, 1.0]))
    net = PopulationNet("mlp", spaces.Box(-1, 1, (3,)), act, 4)
    net.set_slots(slice(None), 10 * torch.stack([net.init_params(i) for i in range(4)]))
    a = net.act(np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32), slice(0, 4))
    assert a.shape == (4, 2)
    assert (a[:, 0] >= -2).all() and (a[:, 0] <= 2).all() and (a[:, 1] >= 0).all()


def test_population_net_rejects_bad_input() -> None:
    box, disc = spaces.Box(-1, 1, (4,)), spaces.Discrete(2)
    with pytest.raises(ValueError, match="dtype must be one of"):
        PopulationNet("mlp", box, disc, 2, dtype="float64")
    with pytest.raises(ValueError, match="num_slots"):
        PopulationNet("mlp", box, disc, 0)
    with pytest.raises(ValueError, match="conv must be"):
        PopulationNet("mlp", box, disc, 2, conv="winograd")
    with pytest.raises(ValueError, match="cnn"):
        PopulationNet("mlp", spaces.Box(0, 255, (4, 84, 84), dtype=np.uint8), disc, 2)
    net = PopulationNet("mlp", box, disc, 2)
    with pytest.raises(ValueError, match="shape"):
        net.set_slots(slice(0, 1), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="observations"):
        net.forward(torch.zeros(2, 4), slice(0, 1))


# ---- evaluator ---------------------------------------------------------------------------------


def _random_population(ev: PopulationEvaluator, n: int) -> torch.Tensor:
    return torch.stack([ev.net.init_params(100 + i) for i in range(n)])


def test_returns_are_true_episode_returns_with_per_pair_seeds() -> None:
    with PopulationEvaluator("CartPole-v1", num_slots=4, num_threads=1, max_envs=8) as ev:
        params = _random_population(ev, 5)
        result = ev.evaluate(params, 2, seed=7)
    net = PopulationNet("mlp", ev.observation_space, ev.action_space, 1)
    env = onebox.envs.make("CartPole-v1", num_envs=1, num_threads=1)
    for j in range(10):
        net.set_slots(slice(0, 1), params[j // 2 : j // 2 + 1])
        obs, _ = env.reset(seed=7 + j)
        total, steps = 0.0, 0
        while True:
            obs, r, term, trunc, _ = env.step(net.act(obs, slice(0, 1)))
            total, steps = total + r[0], steps + 1
            if term[0] or trunc[0]:
                break
        assert result.returns[j] == total and result.lengths[j] == steps
    env.close()
    assert result.frames == result.lengths.sum()
    assert np.allclose(result.fitness(), result.returns.reshape(5, 2).mean(1))


def test_fitness_is_the_same_whatever_slots_groups_threads_and_rounds() -> None:
    runs = []
    for slots, groups, threads, max_envs in ((2, 2, 1, 2), (6, 2, 2, 8), (64, 2, 1, 4096),
                                             (17, 2, 2, 20), (1, 1, 1, 1), (9, 3, 1, 12),
                                             (16, 5, 2, 30)):  # fmt: skip
        with PopulationEvaluator(
            "CartPole-v1", num_slots=slots, slot_groups=groups, num_threads=threads,
            max_envs=max_envs,
        ) as ev:  # fmt: skip
            assert len(ev.sizes) == groups and sum(ev.sizes) == slots
            params = _random_population(ev, 30)
            episodes = np.arange(30) % 3 + 1
            r = ev.evaluate(params, episodes, seed=11, obs_stats=True)
            runs.append((r.returns, r.lengths, r.obs_stats.total, r.obs_stats.total_sq))
    for other in runs[1:]:
        for a, b in zip(runs[0], other, strict=True):
            assert np.array_equal(a, b)


def test_minatar_fitness_depends_on_the_episode_seed_alone() -> None:
    """MinAtar with sticky actions: the envs remember their last action, and a pool reused by
    the next `evaluate` holds envs that played other episodes; a pair's seeded reset must still
    start its env as a new one (its first steps repeat no earlier action), for any K."""

    def evaluate(ev: PopulationEvaluator, start: int) -> EvalResult:
        params = torch.stack([ev.net.init_params(start + i) for i in range(24)])
        return ev.evaluate(params, 2, seed=start)

    runs = []
    for slots, groups in ((2, 2), (8, 2), (9, 3)):
        with PopulationEvaluator(
            "MinAtar/Breakout-v1", num_slots=slots, slot_groups=groups, num_threads=1,
            env_kwargs={"sticky_action_prob": 0.5}, max_episode_steps=300,
        ) as ev:  # fmt: skip
            evaluate(ev, 0)
            runs.append(evaluate(ev, 100))  # in envs that played the first call's episodes
    with PopulationEvaluator(
        "MinAtar/Breakout-v1", num_slots=4, num_threads=1,
        env_kwargs={"sticky_action_prob": 0.5}, max_episode_steps=300,
    ) as ev:  # fmt: skip
        runs.append(evaluate(ev, 100))  # in new envs
    for r in runs[1:]:
        assert np.array_equal(r.returns, runs[0].returns)
        assert np.array_equal(r.lengths, runs[0].lengths)


def test_the_time_split_adds_up_to_the_time_played() -> None:
    """Native pools: one thread plays both groups, and its env, reset, inference, params and
    other seconds are disjoint parts of the call's wall time."""
    with PopulationEvaluator("CartPole-v1", num_slots=4, num_threads=1) as ev:
        params = _random_population(ev, 6)
        ev.evaluate(params, 2, seed=3)  # makes the pools
        ev.timing.reset()
        t0 = time.perf_counter()
        ev.evaluate(params, 2, seed=3)
        wall = time.perf_counter() - t0
    totals = ev.timing.totals()
    assert {"env", "reset", "inference", "other"} <= totals.keys()
    assert totals["other"] > 0 and totals["reset"] > 0 and min(totals.values()) >= 0
    assert sum(totals.values()) <= wall
    # Both groups' pools are in flight most of the time: one is sent while the other plays.
    flight = ev.in_flight.fractions()
    assert len(flight) == 3 and sum(flight) == pytest.approx(1.0) and flight[2] > 0


def test_episode_cap_and_frame_counting() -> None:
    with PopulationEvaluator("Pendulum-v1", num_slots=8, num_threads=1, max_episode_steps=30) as ev:
        r = ev.evaluate(_random_population(ev, 6), 1, seed=0)
        assert (r.lengths == 30).all() and r.frames == 180 and ev.frames == 180
        r = ev.evaluate(_random_population(ev, 2), 1, seed=1)
        assert ev.frames == 240


def test_an_env_without_time_limit_gets_a_cap() -> None:
    """A network that never leaves MinAtar Seaquest's surface plays forever (it never runs out of
    oxygen): the evaluator caps such an env's episodes, with a warning, or at the given cap."""
    with pytest.warns(UserWarning, match="MinAtar/Seaquest-v1 has no time limit"):
        ev = PopulationEvaluator("MinAtar/Seaquest-v1", num_slots=2, num_threads=1)
    with ev:
        assert ev.max_episode_steps == EPISODE_CAP
    with PopulationEvaluator(
        "MinAtar/Seaquest-v1", num_slots=2, num_threads=1, max_episode_steps=40
    ) as ev:
        zeros = torch.zeros(2, ev.num_params)  # all-zero logits: action 0, no-op, at the surface
        r = ev.evaluate(zeros, 1, seed=0)
        assert (r.lengths == 40).all() and (r.returns == 0).all()
    assert resolve(GAConfig(env="MinAtar/Seaquest-v1")).max_episode_steps == MINATAR_CAP


def test_eval_caps_an_env_without_time_limit(capsys) -> None:
    """`onebox eval`'s pool: an env with no time limit gets `EPISODE_CAP` steps, said on stdout,
    or `--max-episode-steps`; a run's own cap otherwise (an evolve run's `max_episode_steps`)."""
    saved = SimpleNamespace(env="MinAtar/Seaquest-v1")
    asked = SimpleNamespace(seed=0, video=False, max_episode_steps=None)
    with eval_envs(saved, asked) as envs:
        assert time_limit(envs.spec) == EPISODE_CAP
    assert "MinAtar/Seaquest-v1 has no time limit: episodes end at 27,000 steps" in (
        capsys.readouterr().out
    )
    noop = lambda obs, starts: np.zeros(1, np.int64)  # noqa: E731  (waits at the surface)
    with eval_envs(saved, SimpleNamespace(seed=0, video=False, max_episode_steps=25)) as envs:
        assert play(noop, envs, 2, seed=0)[1] == [25, 25]
    with eval_envs(SimpleNamespace(env="MinAtar/Seaquest-v1", max_episode_steps=30), asked) as e:
        assert time_limit(e.spec) == 30
    assert capsys.readouterr().out == ""
    assert main(["eval", "runs/any", "--max-episode-steps", "0"]) == 2
    assert "--max-episode-steps must be positive, got 0" in capsys.readouterr().err


def test_evaluator_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="num_slots"):
        PopulationEvaluator("CartPole-v1", num_slots=1)
    with pytest.raises(ValueError, match=r"num_slots must be an integer >= slot_groups \(3"):
        PopulationEvaluator("CartPole-v1", num_slots=2, slot_groups=3)
    for groups in (0, 1.5, True):
        with pytest.raises(ValueError, match="slot_groups must be an integer >= 1"):
            PopulationEvaluator("CartPole-v1", slot_groups=groups)
    for threads in (0, 2.0):
        with pytest.raises(ValueError, match="num_threads must be an integer >= 1"):
            PopulationEvaluator("CartPole-v1", num_threads=threads)
    with pytest.raises(ValueError, match="unknown device 'bogus'"):
        PopulationEvaluator("CartPole-v1", device="bogus")
    with pytest.raises(ValueError, match="onebox envs"):
        PopulationEvaluator("NoSuchEnv-v0")
    with pytest.raises(ValueError, match=r"pool_turns .* is for Atari pools"):
        PopulationEvaluator("CartPole-v1", pool_turns=True)
    with PopulationEvaluator("CartPole-v1", num_slots=2, num_threads=1) as ev:
        with pytest.raises(ValueError, match="params"):
            ev.evaluate(torch.zeros(3, 5), 1, seed=0)
        with pytest.raises(ValueError, match="seed"):
            ev.evaluate(_random_population(ev, 2), 1, seed=-1)
        with pytest.raises(ValueError, match="episodes"):
            ev.evaluate(_random_population(ev, 2), -1, seed=0)


# ---- algorithms ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env_id", "hidden", "norm"),
    [("CartPole-v1", (16,), False), ("CartPole-v1", (), True), ("Pendulum-v1", (8,), True),
     ("Pendulum-v1", (), False)],
)  # fmt: skip
def test_native_rollouts_match_the_slot_groups(env_id: str, hidden: tuple, norm: bool) -> None:
    """Linear and one-layer mlps on native envs run as the engine's rollouts: the same episodes
    (seeds, lengths, frames, observation sums) and returns as the torch networks in the slot
    groups, to float precision (the C++ policy computes in float64)."""
    results = []
    for native in (False, True):
        with PopulationEvaluator(
            env_id, hidden=hidden, num_slots=8, num_threads=1, max_envs=32, native_rollout=native
        ) as ev:
            assert ev.rollout_ok == native
            params = torch.stack([ev.net.init_params(s) for s in range(24)])
            d = ev.net.obs_shape[0]
            on = (np.linspace(-0.5, 0.5, d), np.linspace(0.5, 2, d)) if norm else None
            results.append((ev.evaluate(params, 2, 7, obs_norm=on, obs_stats=norm), ev.frames))
    (a, frames_a), (b, frames_b) = results  # 48 pairs: two calls of 32 envs, the second padded
    np.testing.assert_array_equal(a.lengths, b.lengths)
    assert frames_a == frames_b == a.lengths.sum()
    if env_id == "CartPole-v1":  # argmax of the same outputs: the same episodes exactly
        np.testing.assert_array_equal(a.returns, b.returns)
    else:  # Pendulum: float32 against float64 actions over 200 steps
        np.testing.assert_allclose(a.returns, b.returns, rtol=1e-5, atol=1e-3)
    if norm:
        assert a.obs_stats.count == b.obs_stats.count
        np.testing.assert_allclose(a.obs_stats.total, b.obs_stats.total, rtol=1e-5, atol=1e-3)
        np.testing.assert_allclose(a.obs_stats.total_sq, b.obs_stats.total_sq, rtol=1e-5)


def test_native_rollouts_only_where_the_network_fits() -> None:
    for kwargs in ({}, {"hidden": (8, 8)}, {"dtype": "bfloat16"}, {"backend": "process"}):
        with PopulationEvaluator("CartPole-v1", num_slots=4, num_threads=1, **kwargs) as ev:
            assert not ev.rollout_ok  # default 64-64, two layers, bfloat16, not the engine
    with PopulationEvaluator("HalfCheetah-v5", hidden=(), num_slots=4, num_threads=1) as ev:
        assert ev.rollout_ok and ev.num_params == 17 * 6 + 6


def test_centered_ranks() -> None:
    assert np.allclose(centered_ranks(np.array([3.0, -1.0, 10.0])), [0.0, -0.5, 0.5])
    # Ties share their mean rank: [1, 1, 1] hold ranks 1-3 of 0-4, so each gets 2 of 4.
    assert np.allclose(centered_ranks(np.array([1.0, 0.0, 1.0, 5.0, 1.0])), [0, -0.5, 0, 0.5, 0])


def test_es_ignores_pairs_whose_returns_tie() -> None:
    """Only the pair whose returns differ moves ES's center: along its noise, by Adam's first
    step (lr in every coordinate where that noise is nonzero)."""
    params = ESParams(population=6, sigma=0.1, lr=0.01, weight_decay=0.0, episodes=1,
                      center_episodes=0, obs_norm=False)  # fmt: skip
    es = ES(50, lambda seed: torch.zeros(50), params, seed=0)
    es.ask()
    theta = es.theta.clone()
    es.update(np.array([1.0, 3.0, 1.0]), np.array([1.0, 0.0, 1.0]))  # pair 1 differs
    eps = es.weighted_noise(np.array([0.0, 1.0, 0.0]))
    assert torch.allclose(es.theta - theta, 0.01 * torch.sign(eps), atol=1e-6)


def test_ga_genome_rebuilt_from_seeds_is_bit_identical() -> None:
    with PopulationEvaluator("CartPole-v1", num_slots=16, num_threads=1) as ev:
        init = ev.net.init_params
        params = GAParams(population=16, truncation=4, sigma=0.05, episodes=1,
                          elite_candidates=2, elite_episodes=30)  # fmt: skip
        ga = GA(ev.num_params, init, params, seed=3)
        for _ in range(8):
            ask = ga.ask()
            ga.tell(ev.evaluate(ask.params, ask.episodes, ask.seed))
    assert ga.generation == 4
    deep = [g for g in ga.genomes if len(g) >= 4]
    assert deep, "after 4 generations children carry 4 seeds"
    for genome in deep:
        assert torch.equal(ga.weights(genome), rebuild(genome, init, params.sigma))
    restored = GA(ev.num_params, init, params, seed=99)
    restored.load_state_dict(ga.state_dict())
    assert torch.equal(restored.best(), ga.best())
    assert restored.genomes == ga.genomes


def test_ga_without_elite_reevaluation_takes_the_top_individual() -> None:
    with PopulationEvaluator("CartPole-v1", num_slots=8, num_threads=1) as ev:
        params = GAParams(population=8, truncation=2, sigma=0.05, episodes=1,
                          elite_candidates=0, elite_episodes=1)  # fmt: skip
        ga = GA(ev.num_params, ev.net.init_params, params, seed=0)
        ask = ga.ask()
        result = ev.evaluate(ask.params, ask.episodes, ask.seed)
        first = list(ga.genomes)
        gen = ga.tell(result)
    assert gen is not None and gen.score == result.fitness().max()
    assert ga.elite == first[int(np.argmax(result.fitness()))] == ga.genomes[0]
    assert all(len(g) == 2 and g[:1] in ga.parents for g in ga.genomes[1:])


def _metric(run_dir: Path, tag: str) -> list[float]:
    with open(run_dir / "metrics.csv") as f:
        return [float(r["value"]) for r in csv.DictReader(f) if r["tag"] == tag]


def _common(tmp_path: Path, name: str) -> dict:
    return dict(runs_dir=tmp_path, name=name, progress=False, num_threads=1, num_slots=32)


# ---- presets ---------------------------------------------------------------------------------


def test_every_preset_is_complete_and_valid() -> None:
    for algo, by_family in PRESETS.items():
        assert set(by_family) == {"classic", "mujoco", "atari", "minatar"}, algo
        for preset in by_family.values():
            preset.params.check()  # every field set, every value in range
            assert preset.generations >= 1
    with pytest.raises(TypeError, match="populaton"):
        Preset(GAParams(populaton=64), generations=10)  # type: ignore[call-arg]


CLASSES = {"ga": GAConfig, "es": ESConfig, "rs": RSConfig}


@pytest.mark.parametrize(
    ("env_id", "family"),
    [("CartPole-v1", "classic"), ("Pendulum-v1", "classic"), ("Acrobot-v1", "classic"),
     ("HalfCheetah-v5", "mujoco"), ("Hopper-v5", "mujoco"), ("MinAtar/Breakout-v1", "minatar")],
)  # fmt: skip
def test_the_preset_follows_the_env_family(env_id: str, family: str) -> None:
    assert env_family(env_id) == family
    for algo, cls in CLASSES.items():
        preset = PRESETS[algo][family]
        config = resolve(cls(env=env_id))
        assert config.preset == family and config.generations == preset.generations
        assert params_of(config) == preset.params and config.hidden == preset.hidden
        assert config.max_episode_steps == preset.max_episode_steps
        # any field given wins over the preset; the others still come from it
        config = resolve(cls(env=env_id, population=20, generations=3, hidden=(8,)))
        assert (config.population, config.generations, config.hidden) == (20, 3, (8,))
        assert config.sigma == preset.params.sigma and config.episodes == preset.params.episodes


def test_atari_gets_ubers_settings_and_a_preset_can_be_chosen() -> None:
    pytest.importorskip("ale_py")
    assert env_family("Pong-v5") == "atari"
    config = resolve(GAConfig(env="Pong-v5"))
    assert (config.population, config.truncation, config.sigma) == (1000, 20, 0.002)
    assert (config.elite_candidates, config.elite_episodes, config.generations) == (10, 30, 100)
    config = resolve(ESConfig(env="CartPole-v1", preset="atari"))
    assert config.preset == "atari" and config.population == 5000


def _plays_well(run_dir: Path) -> float:
    """Mean return of a run's best individual over 8 CartPole episodes on unseen seeds."""
    policy = load_policy(run_dir, load_config(run_dir))
    env = onebox.envs.make("CartPole-v1", num_envs=8, seed=12345)
    obs, _ = env.reset()
    total, alive = np.zeros(8), np.ones(8, dtype=bool)
    for _ in range(500):
        obs, r, term, trunc, _ = env.step(policy(obs, ~alive))
        total += r * alive
        alive &= ~(term | trunc)
    env.close()
    return float(total.mean())


@pytest.mark.parametrize(
    "cls",
    [pytest.param(GAConfig, marks=pytest.mark.slow), ESConfig, RSConfig],
    ids=["ga", "es", "ars"],
)
def test_classic_preset_solves_cartpole(tmp_path: Path, cls: type) -> None:
    """The default run (the classic preset; slots and threads do not change fitnesses) reaches
    CartPole's solved threshold, and its best individual plays as well on unseen seeds."""
    assert run(cls(**_common(tmp_path, "run"))) == 0
    config = load_config(tmp_path / "run")
    assert config.preset == "classic" and config.population is not None
    assert _metric(tmp_path / "run", "fitness/score")[-1] >= 475
    assert (tmp_path / "run" / "curve.png").stat().st_size > 0
    assert _plays_well(tmp_path / "run") >= 475


def test_ars_linear_policy_solves_cartpole(tmp_path: Path) -> None:
    run(RSConfig(hidden=(0,), generations=25, **_common(tmp_path, "ars")))
    assert max(_metric(tmp_path / "ars", "fitness/score")) == 500.0
    # CartPole's 4 observations -> 2 action scores: 8 weights, 2 biases
    assert load_checkpoint(tmp_path / "ars")["best"].numel() == 10


def test_es_improves_pendulum() -> None:
    with PopulationEvaluator("Pendulum-v1", num_slots=32, num_threads=1) as ev:
        es = ES(
            ev.num_params,
            ev.net.init_params,
            ESParams(
                population=32,
                sigma=0.1,
                lr=0.05,
                weight_decay=0.0,
                episodes=1,
                center_episodes=4,
                obs_norm=True,
            ),
            seed=0,
            obs_shape=ev.net.obs_shape,
        )
        means = []
        for _ in range(20):
            ask = es.ask()
            r = ev.evaluate(
                ask.params, ask.episodes, ask.seed, obs_norm=ask.obs_norm, obs_stats=True
            )
            means.append(es.tell(r).fitness.mean())
    assert np.mean(means[-4:]) > np.mean(means[:4]) + 100


# ---- runs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["ga", "es"])
def test_resumed_run_equals_uninterrupted_run(tmp_path: Path, algo: str) -> None:
    cls, extra = {
        "ga": (GAConfig, dict(population=24, truncation=4, sigma=0.05, elite_candidates=3)),
        "es": (ESConfig, dict(population=24, sigma=0.05, lr=0.05, center_episodes=2)),
    }[algo]
    run(cls(generations=4, **extra, **_common(tmp_path, "whole")))
    run(cls(generations=2, **extra, **_common(tmp_path, "part")))
    run(cls(generations=4, resume=tmp_path / "part", **_common(tmp_path, "ignored")))
    for tag in ("fitness/score", "fitness/mean", "charts/frames"):
        assert _metric(tmp_path / "whole", tag) == _metric(tmp_path / "part", tag)
    a, b = load_checkpoint(tmp_path / "whole"), load_checkpoint(tmp_path / "part")
    assert a["frames"] == b["frames"] and torch.equal(a["best"], b["best"])
    assert a["algo"]["rng"] == b["algo"]["rng"] and a["algo"]["generation"] == 4


def test_cli_evolve_rs_random(tmp_path: Path) -> None:
    code = main(
        [
            "evolve", "rs", "--mode", "random", "--population", "16", "--generations", "2",
            "--num-slots", "8", "--num-threads", "1", "--runs-dir", str(tmp_path),
            "--name", "rs", "--progress", "False",
        ]
    )  # fmt: skip
    assert code == 0
    assert len(_metric(tmp_path / "rs", "fitness/best")) == 2
    run(RSConfig(mode="random", population=8, frame_budget=1, **_common(tmp_path, "budget")))
    frames = _metric(tmp_path / "budget", "charts/frames")
    assert len(frames) == 1 and frames[0] == load_checkpoint(tmp_path / "budget")["frames"] > 0
    assert main(["evolve", "ga", "--generations", "0", "--runs-dir", str(tmp_path)]) == 2
    assert main(["evolve", "ga", "--hidden", "0", "64", "--runs-dir", str(tmp_path)]) == 2


def test_bench_evolve_writes_a_section(tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
    code = main(
        [
            "bench", "evolve", "--population", "40", "--num-slots", "16", "--seconds", "0.2",
            "--output", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    text = out.read_text()
    assert "bench:evolve:CartPole-v1" in text and "one at a time" in text
    assert "| native rollout |" not in text  # the default 64-64 mlp does not fit a rollout
    argv = ["bench", "evolve", "--population", "40", "--num-slots", "16", "--seconds", "0.2",
            "--hidden", "8", "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "| native rollout |" in out.read_text()
