"""Neuroevolution on Atari (ALE's engine) and on the process backend, and reduced precision."""

from __future__ import annotations

import csv
import functools
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

import onebox.envs
from onebox.cli import main
from onebox.envs.atari import AtariEnvPool
from onebox.evo.evaluator import PopulationEvaluator
from onebox.nn.population import PopulationNet
from onebox.run import load_checkpoint, load_config

pytest.importorskip("ale_py")
torch.set_num_threads(1)


# ---- AtariEnvPool: seeded partial reset --------------------------------------------------------


def test_reset_envs_resets_only_those_envs_like_a_fresh_seeded_reset() -> None:
    with (
        onebox.envs.make("Breakout-v5", 4, num_threads=1) as envs,
        onebox.envs.make("Breakout-v5", 2, num_threads=1) as fresh,
    ):
        envs.reset(seed=0)
        for t in range(20):
            obs, *_ = envs.step(np.full(4, t % 4))
        first, info = envs.reset_envs([3, 1], [70, 50])
        assert np.array_equal(info["env_id"], [3, 1]) and first.shape == (2, 4, 84, 84)
        ref, _ = fresh.reset(seed=[50, 70])
        assert np.array_equal(first, ref[::-1]) and not np.array_equal(first, obs[[3, 1]])
        rng = np.random.default_rng(0)
        for k in range(60):  # the reset envs go on exactly as freshly seeded ones; the others
            a = rng.integers(0, 4, 4)  # go on from where they were
            obs, rew, term, trunc, _ = envs.step(a)
            ref, ref_rew, ref_term, ref_trunc, _ = fresh.step(a[[1, 3]])
            assert np.array_equal(obs[[1, 3]], ref) and np.array_equal(rew[[1, 3]], ref_rew)
            assert np.array_equal(term[[1, 3]] | trunc[[1, 3]], ref_term | ref_trunc)
            if k == 0:
                assert not np.array_equal(obs[[0, 2]], ref)  # envs 0 and 2 were not reset


def test_reset_envs_rejects_bad_input() -> None:
    with onebox.envs.make("Pong-v5", 2, num_threads=1) as envs:
        with pytest.raises(RuntimeError, match="full reset"):
            envs.reset_envs([0])
        envs.reset(seed=1)
        with pytest.raises(ValueError, match="out of range"):
            envs.reset_envs([2])
        with pytest.raises(ValueError, match="duplicates"):
            envs.reset_envs([1, 1])
        with pytest.raises(ValueError, match="at least one"):
            envs.reset_envs(np.zeros(0, dtype=np.int64))
        with pytest.raises(ValueError, match="seeds"):
            envs.reset_envs([0, 1], [5])
        envs.send(np.zeros(2, dtype=np.int64))
        with pytest.raises(RuntimeError, match="waiting for its action"):
            envs.reset_envs([0])
        envs.recv()
        first, _ = envs.reset_envs([0], 4)  # usable again
        assert first.shape == (1, 4, 84, 84)
    envs = onebox.envs.make("Pong-v5", 4, batch_size=2, num_threads=1)
    with envs, pytest.raises(RuntimeError, match="batch_size == num_envs"):
        envs.reset_envs([0])


# ---- the evaluator on Atari ----------------------------------------------------------------------


def _replay(ev: PopulationEvaluator, params: torch.Tensor, owner: np.ndarray, seed: int) -> tuple:
    """Every (individual, episode) pair played at once in one plain synchronous pool: pair j in
    env j, reset with seed `seed + j`, its individual's network in slot j."""
    n = len(owner)
    net = PopulationNet("cnn", ev.observation_space, ev.action_space, n, hidden=(16,))
    net.set_slots(slice(None), params[torch.from_numpy(owner)])
    returns, lengths = np.zeros(n), np.zeros(n, dtype=np.int64)
    running = np.ones(n, dtype=bool)
    with ev.make_env(n) as envs:
        obs, _ = envs.reset(seed=[seed + j for j in range(n)])
        while running.any():
            obs, rew, term, trunc, _ = envs.step(net.act(obs, slice(0, n)))
            returns += rew * running
            lengths += running
            running &= ~(term | trunc)
    return returns, lengths


def test_atari_fitness_does_not_depend_on_slots_groups_threads_or_turns_and_equals_a_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Asterix: random networks score differently and some lose the game before the cap, so
    slots are refilled at different times. Pools stepped in turn never step two at once."""
    stepping = {"now": 0, "most": 0}
    count = threading.Lock()
    send, recv = AtariEnvPool.send, AtariEnvPool.recv

    def counted_send(pool: AtariEnvPool, *args: object) -> None:
        with count:
            stepping["now"] += 1
            stepping["most"] = max(stepping["most"], stepping["now"])
        send(pool, *args)

    def counted_recv(pool: AtariEnvPool) -> tuple:
        out = recv(pool)
        with count:
            stepping["now"] -= 1
        return out

    monkeypatch.setattr(AtariEnvPool, "send", counted_send)
    monkeypatch.setattr(AtariEnvPool, "recv", counted_recv)
    runs = []
    for slots, groups, threads, turns in ((2, 2, 1, False), (5, 2, 2, True), (4, 3, 1, True)):
        stepping["most"] = 0
        with PopulationEvaluator(
            "Asterix-v5", num_slots=slots, slot_groups=groups, num_threads=threads,
            hidden=(16,), max_episode_steps=210, pool_turns=turns,
        ) as ev:  # fmt: skip
            assert ev.pool_turns is turns
            params = torch.stack([ev.net.init_params(100 + i) for i in range(3)])
            t0 = time.perf_counter()
            runs.append(ev.evaluate(params, 2, seed=5))
            wall = time.perf_counter() - t0
            assert ev.frames == runs[-1].frames == 4 * runs[-1].lengths.sum()
            totals = ev.timing.totals()  # each group's thread: parts of its own time
            assert totals["other"] > 0 and sum(totals.values()) <= groups * wall
            assert totals["reset"] > 0  # every pair's seeded reset (ALE reloads the ROM)
            assert ("turn" in totals) is turns
            assert stepping["most"] == 1 if turns else stepping["most"] >= 1
            flight = ev.in_flight.fractions()  # 0 to `groups` pools in flight (or resetting)
            assert 2 <= len(flight) <= groups + 1 and sum(flight) == pytest.approx(1.0)
    a = runs[0]
    for b in runs[1:]:
        assert np.array_equal(a.returns, b.returns) and np.array_equal(a.lengths, b.lengths)
    assert len(set(a.returns.tolist())) > 1 and (a.lengths < 210).any() and a.lengths.max() == 210
    returns, lengths = _replay(ev, params, a.owner, seed=5)
    assert np.array_equal(a.returns, returns) and np.array_equal(a.lengths, lengths)


def test_env_seeds_reload_once_per_generation_and_stay_deterministic_for_one_k() -> None:
    """episode_seeds="env": each group's first pairs play as with pair seeds (their envs' one
    seeded reset of the call); the later ones start from the engine's own unseeded resets (no
    reset call); the same K gives the same fitnesses whatever the threads, and a second call
    with the same seed repeats the first."""
    kwargs = dict(num_slots=2, hidden=(16,), max_episode_steps=210)
    with PopulationEvaluator("Asterix-v5", num_threads=1, **kwargs) as ev:
        params = torch.stack([ev.net.init_params(100 + i) for i in range(3)])
        exact = ev.evaluate(params, 2, seed=5)
    runs, seeded = [], []
    for threads in (1, 2):
        with PopulationEvaluator(
            "Asterix-v5", num_threads=threads, episode_seeds="env", **kwargs
        ) as ev:
            runs.append(ev.evaluate(params, 2, seed=5))
            for pool in ev.pools:  # record what the later pairs' resets are given
                pool.reset_envs = functools.partial(
                    lambda f, ids, seeds=None: seeded.append(seeds) or f(ids, seeds),
                    pool.reset_envs,
                )
            runs.append(ev.evaluate(params, 2, seed=5))
            assert ev.frames == runs[-1].frames + runs[-2].frames
    for r in runs[1:]:
        assert np.array_equal(r.returns, runs[0].returns)
        assert np.array_equal(r.lengths, runs[0].lengths)
    first = [0, 1]  # group k's first pair is pair k
    assert np.array_equal(runs[0].returns[first], exact.returns[first])
    assert np.array_equal(runs[0].lengths[first], exact.lengths[first])
    assert seeded == [] and (runs[0].lengths > 0).all()  # every pair played, none reset
    assert not np.array_equal(runs[0].returns, exact.returns)  # later pairs: other starts


def test_env_seeds_only_for_atari() -> None:
    with pytest.raises(ValueError, match=r"for Atari pools.*leave 'pair'"):
        PopulationEvaluator("CartPole-v1", num_slots=2, episode_seeds="env")
    with pytest.raises(ValueError, match="episode_seeds must be 'pair' or 'env'"):
        PopulationEvaluator("Pong-v5", num_slots=2, episode_seeds="episode")  # type: ignore[arg-type]


def test_atari_error_in_a_group_thread_is_raised_and_the_evaluator_recovers() -> None:
    with PopulationEvaluator(
        "Pong-v5", num_slots=2, num_threads=1, hidden=(16,), max_episode_steps=5
    ) as ev:
        params = torch.stack([ev.net.init_params(i) for i in range(4)])

        def bad(idx: np.ndarray) -> torch.Tensor:  # a parameter source giving wrong rows
            return params[torch.from_numpy(idx)][:, :-1]

        with pytest.raises(ValueError, match="parameters must have shape"):
            ev.evaluate(bad, np.ones(4, dtype=np.int64), seed=0)
        r = ev.evaluate(params, 1, seed=0)  # fresh pools
        assert (r.lengths == 5).all() and r.frames == 4 * 5 * 4


def test_atari_evaluator_rejects_a_clipped_or_per_life_fitness() -> None:
    for name in ("episodic_life", "reward_clip"):
        with pytest.raises(ValueError, match=f"true whole-game score.*{name}"):
            PopulationEvaluator("Pong-v5", num_slots=2, env_kwargs={name: True})


def _metric(run_dir: Path, tag: str) -> list[float]:
    with open(run_dir / "metrics.csv") as f:
        return [float(r["value"]) for r in csv.DictReader(f) if r["tag"] == tag]


def test_cli_evolve_ga_on_pong_writes_a_run_and_resumes(tmp_path: Path) -> None:
    args = [
        "evolve", "ga", "--env", "Pong-v5", "--population", "4", "--truncation", "2",
        "--elite-candidates", "1", "--elite-episodes", "1", "--sigma", "0.01",
        "--num-slots", "4", "--num-threads", "1", "--max-episode-steps", "25",
        "--runs-dir", str(tmp_path), "--name", "pong", "--progress", "False",
    ]  # fmt: skip
    assert main([*args, "--generations", "1"]) == 0
    run_dir = tmp_path / "pong"
    config = load_config(run_dir)
    assert config.arch is None and config.env == "Pong-v5"  # the CNN, chosen for the images
    first = load_checkpoint(run_dir)
    assert first["algo"]["generation"] == 1 and first["best"].numel() > 1_000_000
    # 5 episodes (4 + the elite candidate's), 25 steps each, 4 frames per step
    assert first["frames"] == 5 * 25 * 4 == _metric(run_dir, "charts/frames")[0]
    assert main(["evolve", "ga", "--resume", str(run_dir), "--generations", "2"]) == 0
    second = load_checkpoint(run_dir)
    assert second["algo"]["generation"] == 2
    # 4 + 1 or 2 elite candidates (the top one, and the elite if it is not the top one)
    assert second["frames"] - first["frames"] in (500, 600)
    assert _metric(run_dir, "charts/frames") == [500.0, second["frames"]]
    assert (run_dir / "curve.png").stat().st_size > 0


def test_cli_evolve_with_env_seeds_resumes_exactly(tmp_path: Path) -> None:
    """--episode-seeds env: a run resumed after a generation equals one run straight through
    (each generation seeds its envs afresh, so no env history crosses a checkpoint)."""
    args = [
        "evolve", "ga", "--env", "Asterix-v5", "--population", "4", "--truncation", "2",
        "--elite-candidates", "1", "--elite-episodes", "1", "--num-slots", "2",
        "--num-threads", "1", "--max-episode-steps", "150", "--episode-seeds", "env",
        "--runs-dir", str(tmp_path), "--progress", "False",
    ]  # fmt: skip
    assert main([*args, "--name", "straight", "--generations", "2"]) == 0
    assert main([*args, "--name", "split", "--generations", "1"]) == 0
    assert main(["evolve", "ga", "--resume", str(tmp_path / "split"), "--generations", "2"]) == 0
    assert load_config(tmp_path / "split").episode_seeds == "env"
    straight, split = load_checkpoint(tmp_path / "straight"), load_checkpoint(tmp_path / "split")
    assert straight["frames"] == split["frames"]
    assert torch.equal(straight["best"], split["best"])
    means = _metric(tmp_path / "straight", "fitness/mean")
    assert means == _metric(tmp_path / "split", "fitness/mean") and min(means) > 0


# ---- the process backend -------------------------------------------------------------------------


def test_process_backend_fitness_does_not_depend_on_slots_or_threads() -> None:
    runs = []
    for slots, threads in ((2, 1), (7, 2)):
        with PopulationEvaluator(
            "CartPole-v1",
            backend="process",
            num_slots=slots,
            num_threads=threads,
            max_envs=8,
            env_kwargs={"context": "fork"},
        ) as ev:
            assert ev.backend == "process"
            params = torch.stack([ev.net.init_params(100 + i) for i in range(6)])
            r = ev.evaluate(params, np.arange(6) % 2 + 1, seed=3, obs_stats=True)
            assert isinstance(ev.pools[0], onebox.envs.ProcessEnvPool)
            runs.append((r.returns, r.lengths, r.obs_stats.total))
    for x, y in zip(*runs, strict=True):
        assert np.array_equal(x, y)
    assert len(set(runs[0][0].tolist())) > 1


# ---- reduced precision ---------------------------------------------------------------------------


@functools.cache
def _pong_observations(n: int) -> np.ndarray:
    with onebox.envs.make("Pong-v5", 8, num_threads=1) as envs:
        obs, _ = envs.reset(seed=0)
        frames, rng = [obs], np.random.default_rng(0)
        while len(frames) * 8 < n:
            for _ in range(5):
                obs, *_ = envs.step(rng.integers(0, 6, 8))
            frames.append(obs)
    return np.concatenate(frames)[:n]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reduced_precision_actions_agree_with_float32(dtype: str) -> None:
    """The same networks in float32 and in reduced precision pick the same action on most
    observations (ties between near-equal outputs may flip); float16 either agrees as well or,
    where torch lacks the kernels, is refused with a clear error."""
    obs_space = spaces.Box(0, 255, (4, 84, 84), dtype=np.uint8)
    n, fc = 32, (64,)  # the Nature conv stack, a narrower fc layer to keep the test fast
    try:
        low = PopulationNet("cnn", obs_space, spaces.Discrete(6), n, hidden=fc, dtype=dtype)
    except ValueError as e:
        assert dtype == "float16" and "float16" in str(e)
        return
    full = PopulationNet("cnn", obs_space, spaces.Discrete(6), n, hidden=fc)
    params = torch.stack([full.init_params(i) for i in range(n)])
    params[:, -6:] = 0.1 * torch.randn(n, 6)  # output biases, so actions vary between networks
    full.set_slots(slice(None), params)
    low.set_slots(slice(None), params)
    assert low.weights[0].dtype == getattr(torch, dtype)
    obs = _pong_observations(n)
    a32, a16 = full.act(obs, slice(0, n)), low.act(obs, slice(0, n))
    assert len(set(a32.tolist())) > 2  # not one constant action
    assert (a32 == a16).mean() >= 0.9
    out32, out16 = full.forward(obs, slice(0, n)), low.forward(obs, slice(0, n))
    torch.testing.assert_close(out16, out32, rtol=0.05, atol=0.05)

    mlp = PopulationNet("mlp", spaces.Box(-5, 5, (8,)), spaces.Discrete(4), 64)
    mlp_low = PopulationNet("mlp", spaces.Box(-5, 5, (8,)), spaces.Discrete(4), 64, dtype=dtype)
    p = torch.stack([mlp.init_params(i) for i in range(64)])
    mlp.set_slots(slice(None), p)
    mlp_low.set_slots(slice(None), p)
    x = np.random.default_rng(1).normal(size=(64, 8)).astype(np.float32)
    assert (mlp.act(x, slice(0, 64)) == mlp_low.act(x, slice(0, 64))).mean() >= 0.9


def test_bench_evolve_atari_mode_writes_a_section(tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
    code = main(
        [
            "bench", "evolve", "--env", "Pong-v5", "--population", "2", "--num-slots", "2",
            "--hidden", "16", "--max-episode-steps", "20", "--seconds", "0.1",
            "--output", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    text = out.read_text()
    assert "bench:evolve:Pong-v5:cnn:cpu" in text and "of cnn 16" in text
    assert "seeded reset" in text and "--arch cnn" in text  # the command spells out defaults


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_slot_groups_on_their_own_streams_play_as_on_the_cpu() -> None:
    """On CUDA each slot group queues its work on its own stream, and the parameters it loads
    are made on the default stream by its prefetch helper. A missed wait (actions from
    observations not yet copied, networks not yet loaded) would change most fitnesses; float32
    on CUDA against the CPU may flip an action on a near-tie, so one pair of six may differ."""
    tf32, torch.backends.cudnn.allow_tf32 = torch.backends.cudnn.allow_tf32, False
    try:
        runs = []
        for device, slots, groups in (("cpu", 2, 2), ("cuda", 2, 2), ("cuda", 6, 3)):
            with PopulationEvaluator(
                "Asterix-v5", num_slots=slots, slot_groups=groups, num_threads=1,
                hidden=(16,), max_episode_steps=210, device=device,
            ) as ev:  # fmt: skip
                params = torch.stack([ev.net.init_params(100 + i) for i in range(3)])
                runs.append(ev.evaluate(params.to(device), 2, seed=5))
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    cpu = runs[0]
    for r in runs[1:]:
        same = (r.returns == cpu.returns) & (r.lengths == cpu.lengths)
        assert same.sum() >= 5, (r.returns, cpu.returns)
