"""`onebox evolve ga|es|rs`: the evolution loop with a run folder, logging and exact resume.

Each generation asks the algorithm for individuals, evaluates them with a `PopulationEvaluator`
and tells it their returns. The run folder (`onebox.run`) gets the config, TensorBoard and CSV
scalars at env-frame steps (`fitness/best`, `fitness/mean`, `fitness/median`, `fitness/score` -
the current solution's mean return -, `charts/frames`, `charts/frames_per_s`, time split),
`checkpoint.pt` (every `checkpoint_minutes`, at the end and on Ctrl-C) and `curve.png`.
`--resume RUN_DIR` continues from the checkpoint exactly: genomes or center, optimizer,
normalizer, RNG and frame counter; `--generations` and `--frame-budget` may be raised.
`load_policy` gives `onebox eval` the best individual.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from onebox.evo.core import Algorithm, Generation
from onebox.evo.es import ES, ESParams
from onebox.evo.evaluator import PopulationEvaluator
from onebox.evo.ga import GA, GAParams
from onebox.evo.rs import ARS, RandomSearch, RSParams
from onebox.nn.population import PopulationNet, default_arch


@dataclass
class EvolveConfig:
    """Settings every neuroevolution algorithm shares."""

    env: str = "CartPole-v1"
    """Env id (`onebox envs` lists them)."""
    generations: int = 100
    """Generations to run (in total, counting resumed ones)."""
    frame_budget: int = 0
    """Stop after the generation that reaches this many env frames (0: no budget)."""
    seed: int = 0
    """Seed of the algorithm's random stream (genomes, noise, env seeds)."""
    arch: Literal["mlp", "cnn"] | None = None
    """Network: a tanh MLP, or the Nature CNN (default: the CNN for (C, H, W) images, such as
    Atari's, else the MLP)."""
    hidden: tuple[int, ...] = ()
    """Hidden sizes (default: (64, 64) for the mlp, (512,) for the cnn's fc layer); `0` alone
    makes the mlp a linear policy (as ARS's)."""
    num_slots: int | None = None
    """Networks evaluated at once (K), in two pipelined groups (default: 256 for the mlp, 64 for
    the cnn)."""
    num_threads: int | None = None
    """Engine worker threads per slot group (default: physical cores / 2)."""
    torch_threads: int = 1
    """torch intra-op threads for the networks on the CPU."""
    max_episode_steps: int | None = None
    """Episode cap in env steps (default: the env's time limit)."""
    native_rollout: bool = True
    """Evaluate with the engine's closed-loop rollouts (the network in C++, whole episodes, no
    Python per step) where they fit: native envs and a linear or one-hidden-layer mlp, float32 on
    the CPU. Returns agree with the torch networks' to float precision."""
    max_envs: int = 4096
    """Most envs held at once by native and process pools (one per queued episode; more episodes
    play in rounds). Atari pools hold one env per slot."""
    device: str = "cpu"
    """torch device of the networks ("cuda" on a GPU)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Network precision; bfloat16/float16 halve weight memory and bandwidth (meant for GPUs;
    on the CPU bfloat16 may be faster than float32, float16 much slower)."""
    runs_dir: Path = Path("runs")
    """Folder that holds run folders."""
    name: str | None = None
    """Run folder name (default: env__algo__seed__time)."""
    resume: Path | None = None
    """Continue the run in this folder from its checkpoint."""
    checkpoint_minutes: float = 10.0
    """Minutes between checkpoints (one is always written at the end)."""
    track: bool = False
    """Also log to Weights & Biases."""
    progress: bool | None = None
    """Show a progress bar (default: when stderr is a terminal)."""


@dataclass
class GAConfig(EvolveConfig, GAParams):
    """Deep GA (Uber): truncation selection, elitism with re-evaluation, Gaussian mutation."""


@dataclass
class ESConfig(EvolveConfig, ESParams):
    """OpenAI ES: antithetic pairs, centered ranks, Adam, weight decay, observation normalization."""


@dataclass
class RSConfig(EvolveConfig, RSParams):
    """Random search: fresh random networks, or ARS (augmented random search)."""


AnyConfig = GAConfig | ESConfig | RSConfig


def algo_name(config: AnyConfig) -> str:
    """ "ga", "es", "rs-random" or "rs-ars"."""
    if isinstance(config, GAConfig):
        return "ga"
    if isinstance(config, ESConfig):
        return "es"
    if isinstance(config, RSConfig):
        return f"rs-{config.mode}"
    raise TypeError(f"not an evolve config: {type(config).__name__}")


def net_hidden(config: AnyConfig) -> tuple[int, ...] | None:
    """The network's hidden sizes from `--hidden`: None (the architecture's default) when unset,
    () for a linear policy (`--hidden 0`)."""
    hidden = tuple(config.hidden)
    if hidden == (0,):
        return ()
    if any(h < 1 for h in hidden):
        raise ValueError(
            f"--hidden takes positive sizes, or 0 alone for a linear policy; got {hidden}"
        )
    return hidden or None


def make_evaluator(config: AnyConfig) -> PopulationEvaluator:
    """The population evaluator a config describes."""
    return PopulationEvaluator(
        config.env,
        arch=config.arch,
        hidden=net_hidden(config),
        num_slots=config.num_slots,
        num_threads=config.num_threads,
        max_episode_steps=config.max_episode_steps,
        max_envs=config.max_envs,
        device=config.device,
        dtype=config.dtype,
        native_rollout=config.native_rollout,
    )


def make_algorithm(config: AnyConfig, evaluator: PopulationEvaluator) -> Algorithm:
    """The algorithm a config describes, over the evaluator's networks."""
    dim, init = evaluator.num_params, evaluator.net.init_params
    obs_shape = evaluator.net.obs_shape if evaluator.net.arch == "mlp" else None
    if isinstance(config, GAConfig):
        return GA(dim, init, config, config.seed)
    if isinstance(config, ESConfig):
        return ES(dim, init, config, config.seed, obs_shape)
    if config.mode == "ars":
        return ARS(dim, init, config, config.seed, obs_shape)
    return RandomSearch(dim, init, config, config.seed)


def step_generation(algo: Algorithm, evaluator: PopulationEvaluator) -> Generation:
    """Ask, evaluate and tell until the algorithm finishes a generation."""
    while True:
        ask = algo.ask()
        result = evaluator.evaluate(
            ask.params, ask.episodes, ask.seed, obs_norm=ask.obs_norm, obs_stats=ask.obs_stats
        )
        gen = algo.tell(result)
        if gen is not None:
            return gen


def _check(config: AnyConfig) -> None:
    if config.generations < 1:
        raise ValueError(f"--generations must be >= 1, got {config.generations}")
    if config.frame_budget < 0:
        raise ValueError(f"--frame-budget must be >= 0, got {config.frame_budget}")
    if config.torch_threads < 1:
        raise ValueError(f"--torch-threads must be >= 1, got {config.torch_threads}")
    net_hidden(config)


def run(config: AnyConfig) -> int:
    """Run (or resume) an evolution run; return 0."""
    from onebox.run import (
        Checkpointer,
        GracefulInterrupt,
        Logger,
        Progress,
        load_checkpoint,
        load_config,
        new_run_dir,
        plot_curves,
        rng_state,
        save_config,
        set_rng_state,
    )

    _check(config)
    state = None
    if config.resume is not None:
        run_dir = Path(config.resume)
        stored = load_config(run_dir)
        if type(stored) is not type(config):
            raise ValueError(
                f"{run_dir} is a {type(stored).__name__} run; resume it with its own command"
            )
        state = load_checkpoint(run_dir)
        config = dataclasses.replace(
            stored, generations=config.generations, frame_budget=config.frame_budget
        )
        save_config(run_dir, config)
    else:
        run_dir = new_run_dir(
            config.runs_dir,
            config.name,
            env_id=config.env,
            algo=algo_name(config),
            seed=config.seed,
        )
        save_config(run_dir, config)
    torch.set_num_threads(config.torch_threads)
    with make_evaluator(config) as evaluator:
        algo = make_algorithm(config, evaluator)
        elapsed = 0.0
        if state is not None:
            algo.load_state_dict(state["algo"])
            evaluator.frames = int(state["frames"])
            elapsed = float(state["elapsed"])
            set_rng_state(state["rng"])
        log = Logger(
            run_dir, start_step=evaluator.frames, elapsed=elapsed, track=config.track, config=config
        )
        ckpt = Checkpointer(run_dir, config.checkpoint_minutes)

        def save() -> None:
            ckpt.save(
                {
                    "algo": algo.state_dict(),
                    "frames": evaluator.frames,
                    "elapsed": log.elapsed(),
                    "rng": rng_state(),
                    "best": algo.best().clone(),
                    "obs_norm": algo.obs_norm(),
                }
            )

        total = config.generations
        with (
            log,
            Progress(
                total,
                start_step=min(algo.generation, total),
                enabled=config.progress,
                description=f"evolve {algo_name(config)} {config.env}",
            ) as bar,
            GracefulInterrupt() as stop,
        ):
            while algo.generation < total and not stop.requested:
                if config.frame_budget and evaluator.frames >= config.frame_budget:
                    break
                t0, frames0 = time.perf_counter(), evaluator.frames
                evaluator.timing.reset()
                gen = step_generation(algo, evaluator)
                seconds = time.perf_counter() - t0
                times = evaluator.timing.totals()
                log.scalars(
                    evaluator.frames,
                    {
                        "fitness/best": float(np.max(gen.fitness)),
                        "fitness/mean": float(np.mean(gen.fitness)),
                        "fitness/median": float(np.median(gen.fitness)),
                        "fitness/score": gen.score,
                        "charts/generation": gen.generation,
                        "charts/frames": evaluator.frames,
                        "charts/frames_per_s": (evaluator.frames - frames0) / seconds,
                        "time/env_s": times.get("env", 0.0),
                        "time/inference_s": times.get("inference", 0.0),
                        **gen.extra,
                    },
                )
                bar.update(algo.generation, gen.score)
                if ckpt.due():
                    save()
            save()
    plot_curves(run_dir, tag="fitness/score")
    print(f"run folder: {run_dir}")
    return 0


def load_policy(run_dir: Path, config: Any) -> Callable[[np.ndarray], np.ndarray]:
    """The best individual of a run as a function from a batch of observations to actions."""
    import onebox.envs
    from onebox.run import load_checkpoint

    state = load_checkpoint(Path(run_dir))
    probe = onebox.envs.make(config.env, num_envs=1, num_threads=1)
    try:
        obs_space, act_space = probe.single_observation_space, probe.single_action_space
    finally:
        probe.close()
    arch = config.arch or default_arch(obs_space)
    net = PopulationNet(arch, obs_space, act_space, 1, hidden=net_hidden(config))
    net.set_slots(slice(0, 1), state["best"].reshape(1, -1))
    if state["obs_norm"] is not None:
        net.set_obs_norm(*state["obs_norm"])

    def policy(obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
        obs = np.asarray(obs)
        return net.act(obs, torch.zeros(len(obs), dtype=torch.long))  # every row: slot 0

    return policy
