"""`onebox pbt LEARNER`: a population of one learner's trainers as one run.

    onebox pbt ppo --env MinAtar/Breakout-v1 --population 8 --total-steps 1000000
    onebox pbt --resume RUN
    onebox eval RUN [--member i]

The run's folder holds config.json (the learner's config and the population's settings),
`metrics.csv` in long format with a member column (each member's episodes and stats, the
population's own rows with an empty member), one TensorBoard folder per member
(`members/<i>`), `lineage.json` (every member's hyperparameters at its start and at each copy,
with its parent, their scores and the parent's state hash), the plots of `onebox.pbt.plots`,
and one checkpoint of the whole population (each member's trainer state, the population's
generator, windows and lineage) from which a resumed run continues the same lineage.

The members share this process and its device; each steps its own env pools in turn. What a
member does in a step, how its schedules, seeds and logs go, is the driver's
(`onebox.algos.driver`), so a member is exactly a run of its learner.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import math
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

import onebox.envs
from onebox import registry, run
from onebox.algos import driver
from onebox.algos.common import parse_env_options
from onebox.algos.trainer import EnvSeeds, Range, Trainer
from onebox.envs.base import time_limit
from onebox.nn.accel import resolve_device
from onebox.pbt import shared
from onebox.pbt.configs import learner_module, member_config
from onebox.pbt.explore import Explore, check_quantile, draw, mutation_space
from onebox.pbt.plots import LINEAGE_FILE, plot_population
from onebox.pbt.population import Population, best_of
from onebox.run.config import unresolved

CHECKPOINT_KEYS = ("learner", "members", "population", "env_seeds")
READY_SHARE = 20
"""The default `--ready`: a twentieth of `--total-steps`."""


def resolve(config: Any) -> Any:
    """The population's own checks and the learner's resolve, which sees no `--ray` (the
    population's: its members as Tune trials, not the learner's actors on Ray hosts);
    ValueError: nothing written."""
    apart = [flag for flag, on in (("--process-actors", getattr(config, "process_actors", False)),
                                   ("--server-process", getattr(config, "server_process", False)))
             if on]  # fmt: skip
    if apart:
        raise ValueError(
            f"a population's members share their process: drop {', '.join(apart)} (their "
            "actors run as threads)"
        )
    if getattr(config, "actor_hosts", None) is not None:
        raise ValueError(
            "--actor-hosts places a learner's actors on Ray hosts; a population's members keep "
            "their actors in their own process (with --ray, the members are the Ray trials)"
        )
    learner = learner_module(config).resolve(dataclasses.replace(config, ray=None))
    config = dataclasses.replace(learner, ray=config.ray)
    if isinstance(config.population, bool) or config.population < 2:
        raise ValueError(f"--population must be at least 2 members, got {config.population}")
    if config.ready is None:
        config = dataclasses.replace(config, ready=max(1, config.total_steps // READY_SHARE))
    if config.ready <= 0:
        raise ValueError(f"--ready must be a positive number of env steps, got {config.ready}")
    if config.ready >= config.total_steps and config.selection != "none":
        raise ValueError(
            f"--ready {config.ready} is not below --total-steps {config.total_steps}: no member "
            "would ever copy another (for independent members say --selection none)"
        )
    check_quantile(config.quantile)
    Explore(config.resample_probability, tuple(config.perturb))
    config = dataclasses.replace(config, engine=resolve_engine(config))
    config = dataclasses.replace(config, updates=resolve_updates(config))
    if config.workers is None:
        workers = min(config.population, onebox.envs.physical_cores())
        config = dataclasses.replace(config, workers=workers)
    if not 1 <= config.workers <= config.population:
        raise ValueError(
            f"--workers must be from 1 to --population ({config.population}), got {config.workers}"
        )
    if config.objective_episodes < 1:
        raise ValueError(
            f"--objective-episodes must be at least 1, got {config.objective_episodes}"
        )
    if config.ray_restarts < 0:
        raise ValueError(f"--ray-restarts must be >= 0, got {config.ray_restarts}")
    return config


def resolve_engine(config: Any) -> str:
    """`--engine` made concrete: `shared` where the members fit one engine
    (`onebox.pbt.shared.unfit`), else `own`; ValueError for `shared` where they do not."""
    if config.ray is not None:
        if config.engine == "shared":
            raise ValueError("--engine shared shares one process's envs; with --ray each member "
                             "is a Tune trial of its own: drop --engine shared")  # fmt: skip
        return "own"
    why = engine_unfit(config)
    if config.engine == "shared" and why is not None:
        raise ValueError(f"--engine shared does not fit: {why}; use --engine own")
    return "own" if config.engine == "own" or why is not None else "shared"


def resolve_updates(config: Any) -> str:
    """`--updates` made concrete (`--engine` already is): `batched` on a shared engine whose
    learner has a batched update (`update_together`) and on a GPU, else `separate`;
    ValueError for `batched` where there is none."""
    batchable = config.engine == "shared" and (
        learner_module(config).Trainer.make_learner.update_together is not None
    )
    if config.updates == "batched" and not batchable:
        raise ValueError(
            f"--updates batched needs a shared engine (--engine {config.engine}) and a learner "
            f"with a batched update (PPO; {config.LEARNER}'s members update separately): drop "
            "--updates batched"
        )
    if config.updates == "auto":
        return "batched" if batchable and resolve_device(config.device).type == "cuda" else (
            "separate")  # fmt: skip
    return config.updates


def engine_unfit(config: Any) -> str | None:
    """Why the members cannot share one engine (None: they can), from a probe of the env."""
    with onebox.envs.make(config.env, 1, num_threads=1, seed=config.seed,
                          **parse_env_options(config.env_options)) as probe:  # fmt: skip
        return shared.unfit(config, learner_module(config), probe.single_action_space)


def check_ready(config: Any, trainer: Trainer) -> None:
    """Raise ValueError when `--ready` gives each of a member's envs fewer steps than an episode
    of the env can last (its time limit): rounds would rank members on no finished episode."""
    with onebox.envs.make(config.env, 1, num_threads=1, seed=config.seed,
                          **parse_env_options(config.env_options)) as probe:  # fmt: skip
        limit = time_limit(probe.spec)
    if limit is not None and config.ready // trainer.num_envs < limit:
        raise ValueError(
            f"--ready {config.ready} gives each of a member's {trainer.num_envs} envs "
            f"{config.ready // trainer.num_envs} steps between two rounds, fewer than an episode "
            f"of {config.env} can last ({limit}): raise --ready to at least "
            f"{trainer.num_envs * limit}"
        )


def train(config: Any, resume: Path | None = None) -> Path:
    """Train a population (or, with `resume`, continue the one in that folder, `config` then
    its stored one); return the run folder. Bad input raises ValueError before anything is
    written."""
    name = config.LEARNER
    module = learner_module(config)
    session = run.RunSession.open(config, resume, f"{name}-pbt", resolve, keys=CHECKPOINT_KEYS)
    config, state = session.config, session.checkpoint
    holes = unresolved(config)
    if holes:
        raise RuntimeError(f"{name}'s resolve left {', '.join(holes)} unset")
    if state is not None:
        driver.check_learner(state, name, session.run_dir)
    if config.ray is not None:
        if state is not None:
            raise ValueError(
                f"{session.run_dir} ran on Ray, where Tune restarts a lost member from its own "
                "checkpoint while the run goes on; a run whose driver stopped starts anew"
            )
        return _train_on_ray(session, config, module)
    seeds = EnvSeeds(config.seed, int(state["env_seeds"]) if state is not None else 0)
    members: list[Trainer] = []
    engine = (
        shared.SharedEnvs(config, config.population, config.workers)
        if config.engine == "shared"
        else None
    )
    try:
        for i in range(config.population):
            parts = {} if engine is None else {"lane": engine.lanes[i]}
            members.append(driver.make_trainer(module, member_config(config, i), seeds, **parts))
        if engine is not None:
            engine.bind(members)
        space = checked_space(config, members[0])
        population = Population(members, space, np.random.default_rng(config.seed),
                                ready=config.ready, selection=config.selection,
                                quantile=config.quantile,
                                explore=Explore(config.resample_probability,
                                                tuple(config.perturb)),
                                episodes=config.objective_episodes)  # fmt: skip
        refilled = []
        if state is None:
            population.draw()
        else:
            for i, (member, saved) in enumerate(zip(members, state["members"], strict=True)):
                member.load_state_dict(saved)
                if member.replay is not None and not driver.load_replay(
                    config, replay_path(session.run_dir, i), member.replay
                ):
                    refilled.append(f"member {i}: {member.refill()}")
            population.load_state_dict(state["population"])

        def checkpoint() -> dict[str, Any]:
            for i, member in enumerate(members):
                if member.replay is not None and config.save_replay:
                    member.replay.save(replay_path(session.run_dir, i))
            write_population_lineage(session.run_dir, population)
            return {"learner": name, "members": [m.state_dict() for m in members],
                    "population": population.state_dict(), "env_seeds": seeds.used}  # fmt: skip

        total = members[0].total_steps
        with contextlib.ExitStack() as stack:
            stack.enter_context(session.start(checkpoint, total=total, curve=None,
                                              members=config.population))  # fmt: skip
            for member in members:
                member.interrupted = lambda: session.stopping  # type: ignore[method-assign]
                stack.enter_context(member)
            for note in [*members[0].notes(), population_note(config, space), *refilled]:
                session.logger.note(population.step, note)
            write_population_lineage(session.run_dir, population)
            _loop(session, config, population, engine)
    finally:
        for member in members:
            member.close()
        if engine is not None:
            engine.close()
    plot_population(session.run_dir, population.best())
    return session.run_dir


def checked_space(config: Any, trainer: Trainer) -> dict[str, Range]:
    """The mutated hyperparameters' ranges (`--mutate`), and `--ready` checked against the env,
    from one member's `trainer`; ValueError on bad input."""
    learner = trainer.learner
    space = mutation_space(config.LEARNER, learner.search, learner.tunable, trainer.hp.names,
                           [f.name for f in dataclasses.fields(config)], config.mutate)  # fmt: skip
    check_ready(config, trainer)
    return space


def population_note(config: Any, space: dict[str, Range]) -> str:
    """What the run's log says of the population at its start."""
    ranges = ", ".join(f"{n} {r.low:g}:{r.high:g} ({r.scale})" for n, r in space.items())
    how = {"truncation": f"the bottom {config.quantile:g} copy the top {config.quantile:g}",
           "tournament": "each member meets one other at random and copies it if it scores higher",
           "none": "no copies (independent members)"}[config.selection]  # fmt: skip
    threads = f"{config.workers} thread" + ("s" if config.workers > 1 else "")
    if config.ray is not None:
        where = f"as Ray Tune trials on {config.ray}"
    elif config.engine == "shared":
        batchable = learner_module(config).Trainer.make_learner.update_together is not None
        if config.updates == "batched":
            updates = "their updates batched: one stacked pass per minibatch (--updates batched)"
        else:
            slower = "; batched, one stacked pass, measured 2x slower on a 2-core CPU"
            updates = (f"their updates separate, on {threads} (--updates separate"
                       f"{slower if batchable else ''})")  # fmt: skip
        where = (f"in this process on one engine: one env pool of {config.population} x "
                 f"{config.num_envs} envs stepped together, one batched forward acting for "
                 f"every member (--engine shared), {updates}")  # fmt: skip
    else:
        why = engine_unfit(config)
        where = ("in this process, each on its own env pools (--engine own"
                 + (f"; shared does not fit: {why}" if why is not None else "")
                 + f"), stepped by {threads}")  # fmt: skip
    return (
        f"population of {config.population} {config.LEARNER} members {where}; every "
        f"{config.ready:,} env steps per member: {how}, ranked by the mean return of each "
        f"member's last {config.objective_episodes} episodes; mutating {ranges}"
    )


@dataclasses.dataclass
class Logged:
    """What one member step left to log (the main thread writes it): its finished episodes and,
    when the cadence said so, its scalars."""

    step: int
    returns: list[float]
    lengths: list[int]
    scalars: dict[str, float] | None


class Stepper:
    """Steps members up to a target step, on whatever thread calls it: each step through the
    driver (`driver.advance`), its stats logged at the driver's cadence, the scalars taken at
    once (a trainer's charts are "since the last call")."""

    def __init__(self, config: Any, population: Population, session: run.RunSession) -> None:
        self.population, self.session = population, session
        self.cadences = [driver.Cadence(config.log_every) for _ in population.members]
        self.stats: list[dict[str, float]] = [{} for _ in population.members]

    def __call__(self, i: int, until: int) -> list[Logged]:
        member, out = self.population.members[i], []
        while member.global_step < until and not member.done and not self.session.stopping:
            before = member.global_step
            result = driver.advance(member)
            self.stats[i] = result.stats or self.stats[i]
            step, scalars = member.global_step, None
            last = member.done or self.session.stopping
            if self.stats[i] and self.cadences[i].due(before, step, last):
                scalars = {**driver.charts(member, self.stats[i]), **hyperparams(member),
                           **member_rates(member)}  # fmt: skip
            out.append(Logged(step, result.returns, result.lengths, scalars))
        return out


CHUNKS = 4
"""A ready interval is stepped in this many chunks: the progress bar, checkpoints and Ctrl-C
come between two."""


def _loop(session: run.RunSession, config: Any, population: Population,
          engine: shared.SharedEnvs | None) -> None:  # fmt: skip
    """Step the members, `--workers` threads at once, a chunk of a ready interval at a time
    (on a shared `engine`: one rollout of every member's envs, then one step each), until all
    are done or the run is stopped; a round of exploit and explore whenever every member has
    passed the next ready point."""
    members, stepper = population.members, Stepper(config, population, session)
    groups = [list(range(w, len(members), config.workers)) for w in range(config.workers)]

    def run_group(group: list[int], until: int) -> list[tuple[int, list[Logged]]]:
        return [(i, stepper(i, until)) for i in group]

    with concurrent.futures.ThreadPoolExecutor(config.workers, "pbt-worker") as pool:
        while not population.done and not session.stopping:
            if engine is not None:
                engine.advance()
                until = population.step + 1  # one step each: the rollout's shares
            else:
                ready = (population.rounds + 1) * population.ready
                until = min(ready, population.step + max(1, population.ready // CHUNKS))
            for future in [pool.submit(run_group, g, until) for g in groups]:
                for i, logged in future.result():
                    for item in logged:
                        population.record(i, item.returns)
                        if item.returns:
                            session.logger.episodes(item.step, item.returns, item.lengths,
                                                    member=i)  # fmt: skip
                        if item.scalars is not None:
                            session.logger.scalars(item.step, item.scalars, member=i)
            if population.due():
                _round(session, population, engine)
            session.update(population.step, shown=population.score(population.best()))
    for i, member in enumerate(members):
        last = member.finish()
        if last.returns:
            session.logger.episodes(member.global_step, last.returns, last.lengths, member=i)
        population.record(i, last.returns)
    best = population.score(population.best())
    session.log(population.step, {"pbt/best_objective": float("nan") if best is None else best,
                                  **population_rates(session, population, engine)})  # fmt: skip
    session.step = population.step


def _round(session: run.RunSession, population: Population,
           engine: shared.SharedEnvs | None) -> None:  # fmt: skip
    """One exploit-and-explore round, logged: each copy in the log, every member's objective
    and (new) hyperparameters as scalars, the lineage file rewritten."""
    step = population.step
    scores = population.scores()
    chosen = population.exploit_and_explore()
    copies = ", ".join(f"{child} <- {parent}" for child, parent in chosen) or "none"
    session.logger.note(step, f"round {population.rounds}: objectives "
                        + ", ".join("-" if s is None else f"{s:.2f}" for s in scores)
                        + f"; copies (child <- parent): {copies}")  # fmt: skip
    for i, member in enumerate(population.members):
        score = scores[i]
        session.logger.scalars(step, {**hyperparams(member),
                                      **({} if score is None else {"pbt/objective": score})},
                               member=i)  # fmt: skip
    session.log(step, {"pbt/copies": len(chosen),
                       **population_rates(session, population, engine)})  # fmt: skip
    write_population_lineage(session.run_dir, population)


def _train_on_ray(session: run.RunSession, config: Any, module: ModuleType) -> Path:
    """The population as Ray Tune trials (`onebox.cluster.pbt_tune`); the run folder then
    gets what a population in one process writes."""
    from onebox import cluster
    from onebox.cluster import pbt_tune

    probe = driver.make_trainer(module, member_config(config, 0), EnvSeeds(config.seed))
    try:
        space = checked_space(config, probe)
    finally:
        probe.close()
    rng = np.random.default_rng(config.seed)
    draws = [draw(space, rng) for _ in range(config.population)]  # as `Population.draw`
    connected = cluster.connect(config.ray)  # a bad address raises here: nothing written
    saved: dict[str, Any] = {}
    try:
        with session.start(lambda: saved, total=config.total_steps, curve=None,
                           members=config.population):  # fmt: skip
            session.logger.note(0, population_note(config, space))
            records = pbt_tune.train(config, session.run_dir, space, draws)
            events = pbt_tune.lineage(records, draws)
            write_lineage(session.run_dir, space, config.population, config.ready, events)
            for i, record in enumerate(records):
                log_trial(session, i, record["rows"])
            saved.update(learner=config.LEARNER, env_seeds=0,
                         members=[r["state"]["trainer"] for r in records],
                         population={"rng": rng.bit_generator.state,
                                     "windows": [r["state"]["window"] for r in records],
                                     "rounds": config.total_steps // config.ready,
                                     "lineage": events})  # fmt: skip
            step = min(int(s["global_step"]) for s in saved["members"])
            session.update(step)
            session.log(step, {"pbt/restarts": sum(r["restarts"] for r in records)})
    finally:
        cluster.disconnect(connected)
    plot_population(session.run_dir, best_member(saved))
    return session.run_dir


def log_trial(session: run.RunSession, member: int, rows: list[dict[str, Any]]) -> None:
    """A Tune trial's reported steps as a member's rows of `metrics.csv` (a step redone after a
    restart is logged once)."""
    logged = -1
    for row in rows:
        step = int(row["env_steps"])
        if step <= logged:
            continue
        logged = step
        if row["episode_returns"]:
            session.logger.episodes(step, row["episode_returns"], row["episode_lengths"],
                                    member=member)  # fmt: skip
        scalars = {f"hyperparams/{k}": v for k, v in row["hyperparams"].items()}
        if math.isfinite(row["objective"]):
            scalars["pbt/objective"] = row["objective"]
        session.logger.scalars(step, scalars, member=member)


def population_rates(session: run.RunSession, population: Population,
                     engine: shared.SharedEnvs | None) -> dict[str, float]:  # fmt: skip
    """`charts/SPS`: env steps per second of all members together since this process began;
    on a shared engine also its seconds so far stepping the envs and acting
    (`engine/env_seconds`, `engine/inference_seconds`) and, with `--updates batched`, updating
    every member at once (`engine/learn_seconds`; separate, each member's `time/learn` is its
    update's share of its own time)."""
    per_member = session.rates(population.step)["charts/SPS"]
    seconds = {} if engine is None else engine.timer.totals()
    return {"charts/SPS": per_member * len(population.members),
            **{f"engine/{name}_seconds": v for name, v in seconds.items()}}  # fmt: skip


def hyperparams(member: Trainer) -> dict[str, float]:
    """A member's hyperparameters' base values as scalars (`hyperparams/<name>`)."""
    return {f"hyperparams/{name}": value for name, value in member.hp.base().items()}


def member_rates(member: Trainer) -> dict[str, float]:
    """The shares of a member's wall time (`time/...`) as its trainer's timer splits it."""
    return {f"time/{k}": v for k, v in member.timer.fractions().items()}


def replay_path(run_dir: Path, member: int) -> Path:
    """Where `--save-replay` keeps member `member`'s replay table beside the checkpoint."""
    return Path(run_dir) / f"replay-{member}.npz"


def write_population_lineage(run_dir: Path, population: Population) -> Path:
    """Write the population's `lineage.json`."""
    return write_lineage(run_dir, population.space, len(population.members), population.ready,
                         population.lineage)  # fmt: skip


def write_lineage(run_dir: Path, space: dict[str, Range], members: int, ready: int,
                  events: list[dict[str, Any]]) -> Path:  # fmt: skip
    """Write `lineage.json` (atomically): the mutated ranges and every lineage event."""
    path = Path(run_dir) / LINEAGE_FILE
    data = {"space": {n: [r.low, r.high, r.scale] for n, r in space.items()},
            "members": members, "ready": ready, "events": events}  # fmt: skip
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def best_member(state: dict[str, Any]) -> int:
    """The member a checkpoint ranks first: the highest mean return of its window (member 0
    when none has finished an episode)."""
    return best_of(state["population"]["windows"])


def load_policy(run_dir: Path, config: Any, member: int | None = None, device: str = "cpu") -> Any:
    """The greedy policy of a population's member (default: the best by its objective at the
    last checkpoint), as `onebox eval` plays it."""
    state = run.load_checkpoint(run_dir, keys=CHECKPOINT_KEYS)
    driver.check_learner(state, config.LEARNER, run_dir)
    n = len(state["members"])
    if member is None:
        member = best_member(state)
    elif not 0 <= member < n:
        raise ValueError(f"--member {member}: this population has members 0 to {n - 1}")
    return driver.greedy(learner_module(config), member_config(config, member),
                         state["members"][member]["learner"], device)  # fmt: skip


def start(config: Any) -> int:
    """`onebox pbt LEARNER`: train a population; print where it went."""
    print(f"run folder: {train(config)}")
    return 0


def resume(config: Any) -> int:
    """`onebox pbt --resume RUN`: continue a population from its last checkpoint."""
    run_dir = Path(config.resume)
    group, name = registry.command_of(run_dir)
    if group != "pbt":
        raise ValueError(
            f"{run_dir} is a run of `onebox {group} {name}`; continue it with "
            f"`onebox {group} --resume {run_dir}`"
        )
    if config.ray is not None or config.hosts is not None:
        raise ValueError("a population runs in one process: --ray and --hosts do not apply")
    print(f"run folder: {train(run.load_config(run_dir), resume=run_dir)}")
    return 0
