"""`onebox evolve ga|es|rs`: the evolution loop with a run folder, logging and exact resume.

Each generation asks the algorithm for individuals, evaluates them with a `PopulationEvaluator`
and tells it their returns. The run folder (`onebox.run`) gets the config, TensorBoard and CSV
scalars at env-frame steps (`fitness/best`, `fitness/mean`, `fitness/median`, `fitness/score` -
the current solution's mean return -, `charts/frames`, `charts/frames_per_s`, time split),
`checkpoint.pt` (every `checkpoint_minutes`, at the end and on Ctrl-C) and `curve.png`.
`onebox evolve --resume RUN_DIR` continues from the checkpoint exactly: genomes or center,
optimizer, normalizer, RNG and frame counter (`onebox evolve ALGO --resume RUN_DIR` also takes
`--generations` and `--frame-budget`, to run longer). `load_policy` gives `onebox eval` the best
individual.

Fields left unset come from a preset per algorithm and env family (`onebox.evo.presets`); the
resolved config, every preset value filled in, is what `config.json` holds. Everything is checked,
the env made and the algorithm built before the run folder is created.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

import onebox.envs
from onebox import cluster
from onebox.evo.build import make_algorithm, make_evaluator, net_hidden, params_of
from onebox.evo.core import Algorithm, Generation
from onebox.evo.es import ESParams
from onebox.evo.evaluator import EpisodeSeeds, PopulationEvaluator
from onebox.evo.ga import GAParams
from onebox.evo.presets import env_family, preset_fields
from onebox.evo.rs import RSParams
from onebox.nn.population import PopulationNet, default_arch
from onebox.run.config import RunConfig
from onebox.run.presets import check_fields, fill_preset
from onebox.run.session import RunSession


@dataclass
class EvolveConfig(RunConfig):
    """Settings every neuroevolution algorithm shares (with every run's, `RunConfig`)."""

    preset: Literal["auto", "classic", "mujoco", "atari", "minatar"] = "auto"
    seed: int = 0
    generations: int | None = None
    """Generations to run, in total, counting resumed ones (preset: 10-40 classic, 1000 MuJoCo,
    100 Atari)."""
    frame_budget: int | None = None
    """Stop after the generation that reaches this many env frames (0 or unset: no budget; on
    resume, unset keeps the run's)."""
    arch: Literal["mlp", "cnn", "minatar"] | None = None
    """Network: a tanh MLP, the Nature CNN or the MinAtar paper's CNN (default: the Nature CNN for
    (C, H, W) images, such as Atari's, the MinAtar CNN for MinAtar's bool grids, else the MLP)."""
    hidden: tuple[int, ...] | None = None
    """Hidden sizes (default: the preset's, else (64, 64) for the mlp and (512,) for the cnn's fc
    layer); `0` alone makes the mlp a linear policy (as ARS's, the MuJoCo preset of `rs`)."""
    num_slots: int | None = None
    """Networks evaluated at once (K), split among the slot groups (default: 256 for the mlp, 64
    for the cnn and the minatar network)."""
    slot_groups: int = 2
    """Pipelined groups of slots, each with its own env pool: while one group's networks run, the
    others' envs step. More keep more pools in flight, with smaller network batches."""
    num_threads: int | None = None
    """Engine worker threads per slot group (default: physical cores / `--slot-groups`; all the
    physical cores for Atari pools stepped in turn, `--pool-turns`)."""
    pool_turns: bool | None = None
    """Atari: the slot groups' pools step one at a time, each with every engine core, while the
    other groups run their networks; False: they step at once, sharing the cores. Default: in
    turn with the networks on a GPU, at once on the CPU. Fitnesses do not depend on it."""
    torch_threads: int = 1
    """torch intra-op threads for the networks on the CPU."""
    max_episode_steps: int | None = None
    """Episode cap in env steps (preset: 5,000 MinAtar; default: the env's time limit, or 27,000
    steps, with a warning, for an env that has none)."""
    native_rollout: bool = True
    """Evaluate with the engine's closed-loop rollouts (the network in C++, whole episodes, no
    Python per step) where they fit: native envs and a linear or one-hidden-layer mlp, float32 on
    the CPU. Returns agree with the torch networks' to float precision."""
    max_envs: int = 4096
    """Most envs held at once by native and process pools (one per queued episode; more episodes
    play in rounds). Atari pools hold one env per slot."""
    episode_seeds: EpisodeSeeds = "pair"
    """`pair`: every episode starts with a reset seeded by its own seed, so fitnesses do not
    depend on `--num-slots`, threads, timing or Ray hosts; ALE reloads the ROM for each (about
    0.1 s of CPU an episode on Atari). `env` (Atari only): each env is seeded once per generation
    and its later episodes start unseeded, continuing its random stream (no reload): faster,
    reproducible for the same `--num-slots` (and, with `--ray`, the same hosts), but fitnesses
    depend on which env plays which episode."""
    device: str = "cpu"
    """torch device of the networks ("cuda" on a GPU)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Network precision; bfloat16/float16 halve weight memory and bandwidth (meant for GPUs;
    on the CPU bfloat16 may be faster than float32, float16 much slower)."""
    resume: Path | None = None
    """Continue the run in this folder from its checkpoint (with `--generations` and
    `--frame-budget` taken from the command line; `onebox evolve --resume RUN` keeps them)."""
    ray: str | None = None
    """Evaluate the population on the Ray cluster at this address (HOST:PORT, as `ray start
    --head` prints it, or `auto`: the cluster of this machine); the algorithm stays in this
    process, and fitnesses are those of a run on one machine. Needs `pip install
    "onebox[ray]"`; see docs/cluster.md."""
    eval_hosts: int | None = None
    """With `--ray`: Ray processes that evaluate shares of the population, each with its own
    evaluator (default: one per node of the cluster)."""
    host_restarts: int = 3
    """With `--ray`: how often one evaluation host may be replaced before the run fails."""


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


def command_name(config: AnyConfig) -> str:
    """ "ga", "es" or "rs": the `onebox evolve` command of this config."""
    if isinstance(config, GAConfig):
        return "ga"
    if isinstance(config, ESConfig):
        return "es"
    if isinstance(config, RSConfig):
        return "rs"
    raise TypeError(f"not an evolve config: {type(config).__name__}")


def algo_name(config: AnyConfig) -> str:
    """ "ga", "es", "rs-random" or "rs-ars"."""
    name = command_name(config)
    return f"rs-{config.mode}" if isinstance(config, RSConfig) else name


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


def resolve(config: AnyConfig) -> AnyConfig:
    """Fill the env family's preset into the fields left None and check every field; raise
    ValueError on bad input (the env itself is checked when the evaluator makes it)."""
    if onebox.envs.backend_of(config.env) is None:
        onebox.envs.make(config.env)  # raises the unknown-id error with suggestions
    family = env_family(config.env) if config.preset == "auto" else config.preset
    algo = command_name(config)
    values = check_fields(type(config), preset_fields(algo, family), f"{algo} preset {family!r}")
    config = fill_preset(config, values)
    config = dataclasses.replace(config, preset=family, frame_budget=config.frame_budget or 0)
    if config.generations < 1:
        raise ValueError(f"--generations must be >= 1, got {config.generations}")
    if config.frame_budget < 0:
        raise ValueError(f"--frame-budget must be >= 0, got {config.frame_budget}")
    if config.torch_threads < 1:
        raise ValueError(f"--torch-threads must be >= 1, got {config.torch_threads}")
    if config.checkpoint_minutes < 0:
        raise ValueError(f"--checkpoint-minutes must be >= 0, got {config.checkpoint_minutes}")
    if config.host_restarts < 0:
        raise ValueError(f"--host-restarts must be >= 0, got {config.host_restarts}")
    cluster.check_flags(config.ray, config.eval_hosts, "--eval-hosts", {})
    net_hidden(config)
    params_of(config).check()
    return config


CHECKPOINT_KEYS = ("algo", "frames", "elapsed", "rng", "best", "obs_norm")
"""What an evolve run's checkpoint holds."""


def stored_config(run_dir: Path, command: str | None = None) -> AnyConfig:
    """The config of the evolve run in `run_dir`; ValueError if the folder holds no evolve run,
    or (given `command`: "ga", "es" or "rs") one of another algorithm."""
    from onebox.registry import command_of
    from onebox.run import load_config

    group, name = command_of(run_dir)
    if group != "evolve":
        raise ValueError(
            f"{run_dir} is a `onebox {group} {name}` run, not an evolve run; continue it with "
            f"`onebox train --resume {run_dir}`"
        )
    if command is not None and name != command:
        raise ValueError(
            f"{run_dir} is a `onebox evolve {name}` run; continue it with "
            f"`onebox evolve --resume {run_dir}`"
        )
    return load_config(run_dir)


def open_resumed(run_dir: Path, config: AnyConfig) -> tuple[AnyConfig, dict[str, Any]]:
    """The stored config of the evolve run in `run_dir`, with `config`'s generations and frame
    budget where given, checked, and its checkpoint; ValueError if the folder holds no run of
    `config`'s algorithm or cannot be continued. Writes nothing."""
    from onebox.run import load_checkpoint

    stored = stored_config(run_dir, command_name(config))
    given = [f.name for f in dataclasses.fields(params_of(config))
             if f.name != "mode" and getattr(config, f.name) is not None]  # fmt: skip
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(
            f"{flags}: a resumed run keeps its settings (config.json); only --generations and "
            "--frame-budget may change"
        )
    limits = {"generations": config.generations, "frame_budget": config.frame_budget}
    stored = dataclasses.replace(stored, **{k: v for k, v in limits.items() if v is not None})
    stored = resolve(stored)
    return stored, load_checkpoint(run_dir, keys=CHECKPOINT_KEYS)


def resume(config: Any) -> int:
    """`onebox evolve --resume RUN`: continue an evolve run with its own settings."""
    run_dir = Path(config.resume)
    stored = stored_config(run_dir)
    cluster.rehost(run_dir, stored, config.ray, config.hosts, "eval_hosts", resolve)
    return run(type(stored)(resume=run_dir))  # every setting from config.json


def run(config: AnyConfig) -> int:
    """Run (or resume) an evolution run; return 0."""
    if config.resume is not None:
        run_dir = Path(config.resume)
        config, state = open_resumed(run_dir, config)
        session = RunSession(config, algo_name(config), resume=run_dir, checkpoint=state,
                             step_key="frames")  # fmt: skip
    else:
        config = resolve(config)
        session = RunSession(config, algo_name(config), step_key="frames")
    connected = cluster.connect(config.ray) if config.ray is not None else False
    torch.set_num_threads(config.torch_threads)
    with make_evaluator(config) as evaluator, contextlib.ExitStack() as hosts:
        algo = make_algorithm(config, evaluator)
        if config.ray is not None:
            hosts.callback(cluster.disconnect, connected)  # last (callbacks run in reverse)
        if session.checkpoint is not None:
            algo.load_state_dict(session.checkpoint["algo"])
        evaluator.frames = session.step
        step = step_generation
        if config.ray is not None:
            from onebox.cluster.evolve_hosts import RayPopulation

            population = RayPopulation(config, config.eval_hosts or cluster.cpu_nodes(), algo,
                                       config.host_restarts)  # fmt: skip
            hosts.callback(population.close)
            step = population.step

        def checkpoint() -> dict[str, Any]:
            return {"algo": algo.state_dict(), "best": algo.best().cpu().clone(),
                    "obs_norm": algo.obs_norm()}  # fmt: skip

        total = config.generations
        assert total is not None
        # all checked, the env made and the algorithm built: now the run folder
        with session.start(checkpoint, total=total, progress=algo.generation,
                           description=f"evolve {algo_name(config)} {config.env}",
                           curve="fitness/score"):  # fmt: skip
            while algo.generation < total and not session.stopping:
                if config.frame_budget and evaluator.frames >= config.frame_budget:
                    break
                t0, frames0 = time.perf_counter(), evaluator.frames
                evaluator.timing.reset()
                gen = step(algo, evaluator)
                seconds = time.perf_counter() - t0
                times = evaluator.timing.totals()
                session.log(
                    evaluator.frames,
                    {
                        "fitness/best": float(np.max(gen.fitness)),
                        "fitness/mean": float(np.mean(gen.fitness)),
                        "fitness/median": float(np.median(gen.fitness)),
                        "fitness/score": gen.score,
                        "charts/generation": gen.generation,
                        "charts/frames": evaluator.frames,
                        "charts/frames_per_s": (evaluator.frames - frames0) / seconds,
                        **{f"time/{name}_s": seconds for name, seconds in times.items()},
                        **({"charts/host_restarts": population.restarts()} if config.ray else {}),
                        **gen.extra,
                    },
                )
                session.update(evaluator.frames, progress=algo.generation, shown=gen.score)
    print(f"run folder: {session.run_dir}")
    return 0


def load_policy(run_dir: Path, config: Any) -> Callable[[np.ndarray], np.ndarray]:
    """The best individual of a run as a function from a batch of observations to actions."""
    import onebox.envs
    from onebox.run import load_checkpoint

    state = load_checkpoint(Path(run_dir), keys=CHECKPOINT_KEYS)
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
