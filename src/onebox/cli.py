"""The `onebox` command line.

    onebox envs                 list the envs
    onebox train ALGO           train an agent (ppo, a2c, a3c, impala, appo, apex, r2d2, dqn, pqn, sac);
                                `onebox train --resume RUN` continues a run
    onebox pbt ALGO             population-based training of a learner (ppo, a2c, pqn, dqn, sac,
                                impala, appo, apex, r2d2); `onebox pbt --resume RUN` continues
    onebox eval RUN             play a run's policy, optionally to a video
    onebox bench envs           env steps/s of onebox next to Gymnasium and EnvPool
    onebox bench train          PPO steps/s, sync and double-buffered
    onebox evolve ga|es|rs      neuroevolution (GA, ES, random search / ARS); `onebox evolve
                                --resume RUN` continues a run
    onebox bench evolve         population-evaluation frames/s
    onebox bench inference      inference server requests/s and latency
    onebox bench replay         prioritized replay against cpprb, Atari memory per transition
    onebox bench dqn            DQN steps/s against CleanRL's dqn_atari.py
    onebox bench apex           Ape-X learner updates/s alone and beside its actors
    onebox bench gpu            the GPU suite: one markdown report
    onebox bench ray            IMPALA steps/s with actors in process and on Ray actor hosts

Commands form a tree: a `Group` (`bench`) holds commands, a `Command` (`envs`) is a leaf with a
config dataclass, parsed by tyro (one docstring per field becomes its `--help`), and a function
that runs it. Both are named as "module:attribute" strings and imported only when that command is
chosen, so `onebox --help` stays fast and one command's heavy imports (torch, envpool) never slow
down another. To add a command, write its config and run function in their own module and add one
`Command` to `COMMANDS` (or to a group in it):

    "bench": Group("Benchmarks.", {
        "envs": Command("Env steps/s.", "onebox.bench.envs:EnvBenchConfig", "onebox.bench.envs:run")
    })

The `train` and `evolve` groups are built from `onebox.registry`, which the library reads too (to
tell which command made a run folder): a learner or an evolution algorithm is an entry there.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Sequence
from typing import Any

import tyro

from onebox import registry


@dataclasses.dataclass(frozen=True)
class Command:
    """A leaf command: `config` is parsed from the arguments and passed to `run`."""

    help: str
    """One line shown in the parent's `--help`."""
    config: str
    """The config dataclass, as "module:Name"."""
    run: str
    """The function called with the parsed config, as "module:name"; it may return an exit code."""


@dataclasses.dataclass(frozen=True)
class Group:
    """A command that only chooses among subcommands (`onebox bench ...`)."""

    help: str
    commands: dict[str, Command | Group]
    fallback: Command | None = None
    """Run when the arguments start with an option instead of a subcommand (`--resume ...`)."""
    refused: dict[str, str] = dataclasses.field(default_factory=dict)
    """Subcommand names the group knows but refuses, each with why (an error, not a usage)."""


@dataclasses.dataclass
class EnvsConfig:
    """List every env onebox can make, with its backend and why it gets that backend."""

    backend: str | None = None
    """Only this backend's envs (native, atari, process)."""
    match: str | None = None
    """Only ids containing this text (case-insensitive)."""
    spaces: bool = False
    """Also make each listed env once to show its spaces and time limit (slow for many)."""


@dataclasses.dataclass
class ResumeConfig:
    """Continue a run from its last checkpoint, with its own config."""

    resume: str
    """The run folder, e.g. runs/CartPole-v1__ppo__1__20261121-120000."""
    ray: str | None = None
    """Continue on the Ray cluster at this address (a run of IMPALA, APPO, Ape-X or evolve),
    e.g. a new one after the learner's machine died; config.json is updated."""
    hosts: int | None = None
    """With a run on Ray: continue with this many actor (or evaluation) hosts."""


@dataclasses.dataclass
class EvalConfig:
    """Play a trained policy and report its returns; optionally record a video."""

    run_dir: tyro.conf.Positional[str]
    """The run folder."""
    episodes: int = 10
    """Episodes to play."""
    video: bool = False
    """Also record the first episode to `<run>/videos/eval.mp4`."""
    member: int | None = None
    """With a population's run (`onebox pbt`): the member to play (default: the best by the
    population's objective at its last checkpoint)."""
    seed: int = 12345
    """Seed of the evaluation envs (distinct from training seeds)."""
    max_episode_steps: int | None = None
    """Episode cap in env steps (default: the run's own cap, else the env's time limit, else
    27,000 steps, said in the output, for an env that has none, as MinAtar's games)."""


COMMANDS: dict[str, Command | Group] = {
    "train": Group(
        "Train an agent: `ppo`, `a2c`, `a3c`, `impala`, `appo`, `apex`, `r2d2`, `dqn`, `pqn`, "
        "`sac`; "
        "`onebox train "
        "--resume RUN` continues a run.",
        {
            name: Command(entry.help, config=entry.config, run="onebox.algos.launch:train")
            for name, entry in registry.LEARNERS.items()
        },
        fallback=Command(
            "Continue a run from its last checkpoint.",
            config="onebox.cli:ResumeConfig",
            run="onebox.algos.launch:resume",
        ),
    ),
    "pbt": Group(
        "Population-based training: a population of one learner's members trained at once, "
        "the worst copying the best and perturbing their hyperparameters; `onebox pbt --resume "
        "RUN` continues a run.",
        {
            name: Command(entry.help, config=entry.config, run="onebox.pbt.run:start")
            for name, entry in registry.POPULATIONS.items()
        },
        fallback=Command(
            "Continue a population from its last checkpoint.",
            config="onebox.cli:ResumeConfig",
            run="onebox.pbt.run:resume",
        ),
        refused=registry.NO_POPULATION,
    ),
    "eval": Command(
        "Play a trained run's policy; `--video` writes an mp4.",
        config="onebox.cli:EvalConfig",
        run="onebox.algos.launch:evaluate",
    ),
    "envs": Command(
        "List every env with its backend and why (`--spaces` for spaces and time limits).",
        config="onebox.cli:EnvsConfig",
        run="onebox.cli:list_envs",
    ),
    "bench": Group(
        "Benchmarks: `envs` (env steps/s against Gymnasium and EnvPool), `train`, `evolve`, "
        "`inference`, `replay`, `dqn`, `apex`, `gpu` (the GPU suite), `ray`.",
        {
            "envs": Command(
                "Env steps/s of onebox sync and async next to Gymnasium and EnvPool.",
                config="onebox.bench.envs:EnvBenchConfig",
                run="onebox.bench.envs:run",
            ),
            "train": Command(
                "PPO env steps/s, sync and double-buffered, with the time split.",
                config="onebox.bench.train:TrainBenchConfig",
                run="onebox.bench.train:run",
            ),
            "inference": Command(
                "Inference server requests/s, env steps/s and latency per actors and batch.",
                config="onebox.bench.inference:InferenceBenchConfig",
                run="onebox.bench.inference:run",
            ),
            "evolve": Command(
                "Population-evaluation frames/s against env-only and one-at-a-time evaluation.",
                config="onebox.bench.evolve:EvolveBenchConfig",
                run="onebox.bench.evolve:run",
            ),
            "gpu": Command(
                "The GPU suite in one markdown report (benchmarks/gpu.sh installs and tests first).",
                config="onebox.bench.gpu_common:GpuBenchConfig",
                run="onebox.bench.gpu:run",
            ),
            "replay": Command(
                "Prioritized replay insert and sample+update rates against cpprb; Atari memory.",
                config="onebox.bench.replay:ReplayBenchConfig",
                run="onebox.bench.replay:run",
            ),
            "dqn": Command(
                "DQN's learning-phase env steps/s against CleanRL's dqn_atari.py.",
                config="onebox.bench.dqn:DqnBenchConfig",
                run="onebox.bench.dqn:run",
            ),
            "apex": Command(
                "Ape-X learner updates/s alone and with 1, 2, 4 actors beside it.",
                config="onebox.bench.apex:ApexBenchConfig",
                run="onebox.bench.apex:run",
            ),
            "ray": Command(
                "IMPALA env steps/s: actors in process against 2 and 4 Ray actor hosts.",
                config="onebox.bench.cluster:RayBenchConfig",
                run="onebox.bench.cluster:run",
            ),
        },
    ),
    "evolve": Group(
        "Neuroevolution: ga, es, rs; `onebox evolve --resume RUN` continues a run.",
        {
            name: Command(entry.help, config=entry.config, run="onebox.evo.run:run")
            for name, entry in registry.ALGORITHMS.items()
        },
        fallback=Command(
            "Continue an evolve run from its last checkpoint.",
            config="onebox.cli:ResumeConfig",
            run="onebox.evo.run:resume",
        ),
    ),
}

DESCRIPTION = "onebox: fast deep RL and neuroevolution on one machine."


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command named by `argv` (default: `sys.argv[1:]`); return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        code = _dispatch(Group(DESCRIPTION, COMMANDS), args, "onebox")
    except SystemExit as e:  # tyro exits for --help and for bad arguments
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        code = 130
    except (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError) as e:
        # bad input a command found before starting (an unknown env id, a bad value, a missing
        # or foreign run folder, a damaged or unsafe checkpoint): one line, nothing written
        print(f"onebox: error: {e}", file=sys.stderr)
        code = 2
    except RuntimeError as e:
        from onebox.envs.render import RenderUnavailable  # imported only when needed

        if not isinstance(e, RenderUnavailable):
            raise
        print(f"onebox: error: {e}", file=sys.stderr)  # `--video` without what it needs
        code = 1
    return int(code or 0)


def _dispatch(node: Command | Group, args: list[str], prog: str) -> Any:
    if isinstance(node, Command):
        config_cls = _load(node.config)
        config = tyro.cli(config_cls, args=args, prog=prog, description=node.help)
        return _load(node.run)(config)
    if args and args[0] in node.commands:
        return _dispatch(node.commands[args[0]], args[1:], f"{prog} {args[0]}")
    if args and args[0] in node.refused:
        raise ValueError(f"`{prog} {args[0]}` is not available: {node.refused[args[0]]}")
    if node.fallback is not None and args and args[0] not in ("-h", "--help"):
        return _dispatch(node.fallback, args, prog)
    # `--help`, no subcommand or an unknown one: let tyro print the help or the error, from a
    # stand-in union of the subcommand names (their configs are not imported for this).
    choices = [_annotated(name, child.help) for name, child in node.commands.items()]
    if len(choices) == 1:
        choices.append(_annotated("", "", suppress=True))
    tyro.cli(_union(choices), args=args, prog=prog, description=node.help)
    return 2  # tyro accepted no subcommand (cannot happen: the union has no default)


def _annotated(name: str, help: str, suppress: bool = False) -> Any:
    from typing import Annotated

    if suppress:
        return Annotated[None, tyro.conf.Suppress]
    return Annotated[None, tyro.conf.subcommand(name, constructor=_nothing, description=help)]


def _union(options: list[Any]) -> Any:
    from typing import Union

    return Union[tuple(options)]  # noqa: UP007 (built at runtime)


def _nothing() -> None:
    return None


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


# ---- onebox envs ---------------------------------------------------------------------------------


def list_envs(config: EnvsConfig) -> int:
    """Print a table of the envs: id, backend and why, and with `--spaces` their spaces and limit."""
    from rich.table import Table

    import onebox.envs
    from onebox.bench.common import console

    if config.backend is not None and config.backend not in onebox.envs.BACKENDS:
        raise ValueError(
            f"unknown backend {config.backend!r}; choose one of {', '.join(onebox.envs.BACKENDS)}"
        )
    rows = []
    for env_id in onebox.envs.list_envs():
        if config.match is not None and config.match.lower() not in env_id.lower():
            continue
        choice = onebox.envs.choose_backend(env_id)
        if config.backend is not None and choice.backend != config.backend:
            continue
        why = f"[red]{choice.why}[/red]" if choice.fallback else choice.why
        rows.append((env_id, choice.backend or "", why))
    columns = ["env id", "backend", "why"]
    if config.spaces:
        columns += ["observation space", "action space", "time limit"]
    table = Table(title=f"onebox envs ({len(rows)})")
    for column in columns:
        table.add_column(column, no_wrap=column == "env id")
    for env_id, backend, why in rows:
        table.add_row(env_id, backend, why, *(_describe(env_id) if config.spaces else ()))
    console().print(table)
    return 0


def _describe(env_id: str) -> tuple[str, str, str]:
    """Spaces and time limit of an env, from a one-env pool; why not, if it cannot be made."""
    import onebox.envs

    try:
        env = onebox.envs.make(env_id, num_envs=1, num_threads=1)
    except Exception as e:  # a Gymnasium env whose dependencies are missing, ...
        return (f"cannot make: {type(e).__name__}", "", "")
    try:
        limit = env.spec.max_episode_steps if env.spec is not None else None
        return (
            format_space(env.single_observation_space),
            format_space(env.single_action_space),
            str(limit) if limit else "none",
        )
    finally:
        env.close()


def format_space(space: Any) -> str:
    """A short description of a Gymnasium space: Box bounds only when they are uniform."""
    import numpy as np
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return f"Discrete({space.n})" if space.start == 0 else f"Discrete({space.n}, {space.start})"
    if isinstance(space, spaces.Box):
        shape = tuple(space.shape)
        low, high = np.unique(space.low), np.unique(space.high)
        if low.size == 1 and high.size == 1:
            return f"Box({low[0]:g}, {high[0]:g}, {shape}, {space.dtype})"
        return f"Box({shape}, {space.dtype})"
    return str(space)
