"""`onebox bench envs`: env steps/s of onebox next to Gymnasium and EnvPool, in one run.

Every backend steps the same task with the same number of envs (and threads, where it has
threads), in its own natural loop: `step` over all envs for the sync APIs, `recv` then `send` for
the envs just received for the async ones (batch size num_envs/2). Actions are random valid
actions drawn once before timing, so the policy costs nothing; each measurement runs for a fixed
time after a warm-up.

Backends are rows of `PEERS`: a name, a family (what `--peers` also accepts) and a function that
builds a `Loop` for a `Task`, or raises `Unavailable` to say why it cannot (not installed, no
such env, too many processes); those, and the sync and async loops, are `onebox.bench.loops`',
shared with the Atari rows (`onebox.bench.atari_peers`) and the process backend's rows
(`onebox.bench.process_peers`). Other env families (Atari against ALE's AtariVectorEnv, MuJoCo)
are more rows: `make` functions that map the env id to their own and build their vector env.
MinAtar's native games (`MinAtar/Breakout-v1`, ...) run against the `minatar` package, whose
Gymnasium envs the Gymnasium rows and the process rows make (`register_minatar`).
"""

from __future__ import annotations

import dataclasses
import difflib
import statistics
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from onebox.bench import atari_peers, common, figures, process_peers
from onebox.bench.loops import (
    Loop,
    Task,
    Unavailable,
    async_loop,
    half,
    register_minatar,
    sync_loop,
)

ASYNC_VECTOR_MAX_ENVS = 64
"""Gymnasium's AsyncVectorEnv runs one process per env: it is skipped above this many envs."""


@dataclasses.dataclass(frozen=True)
class Peer:
    """A backend of the benchmark."""

    name: str
    """Its `--peers` name."""
    family: str
    """The library; `--peers FAMILY` runs every backend of that family."""
    label: str
    """Its name in the table."""
    make: Callable[[Task], Loop]
    """Build the env and its loop for a task; raise `Unavailable` if it cannot."""


# ---- onebox ------------------------------------------------------------------------------------


def _onebox(task: Task, batch_size: int | None) -> Any:
    import onebox.envs

    if task.env_id not in onebox.envs.list_envs():
        raise Unavailable(f"n/a: onebox has no {task.env_id}")
    return onebox.envs.make(
        task.env_id,
        task.num_envs,
        batch_size=batch_size,
        num_threads=task.num_threads,
        seed=task.seed,
    )


def onebox_sync(task: Task) -> Loop:
    return sync_loop(_onebox(task, None), task, task.num_envs)


def onebox_async(task: Task) -> Loop:
    batch = half(task.num_envs)
    return async_loop(_onebox(task, batch), task, batch)


# ---- closed loop: a linear policy, one parameter vector per env (as in ES / random search) ------


def _linear_weights(pool: Any, task: Task) -> Any:
    import numpy as np

    rng = np.random.default_rng(task.seed)
    size = (task.num_envs, pool.policy_size(0))
    return (0.1 * rng.standard_normal(size)).astype(np.float32)


def onebox_rollout(task: Task) -> Loop:
    """`rollout(weights)`: whole episodes with the policy evaluated in C++."""
    pool = _onebox(task, None)
    if not hasattr(pool.single_action_space, "low"):
        raise Unavailable("n/a: linear Box policy only")
    weights = _linear_weights(pool, task)
    rollout = pool.rollout

    def run(k: int) -> int:
        return sum(int(rollout(weights)[1].sum()) for _ in range(k))

    return Loop(run, task.num_envs, pool.close)


def onebox_python_policy(task: Task) -> Loop:
    """The same policy in NumPy, stepping the pool from Python and summing the returns."""
    import numpy as np

    pool = _onebox(task, None)
    if not hasattr(pool.single_action_space, "low"):
        raise Unavailable("n/a: linear Box policy only")
    n_obs = pool.single_observation_space.shape[0]
    weights = _linear_weights(pool, task).astype(np.float64)
    w = weights[:, : -pool.single_action_space.shape[0]].reshape(task.num_envs, -1, n_obs)
    b = weights[:, -pool.single_action_space.shape[0] :]
    low, high = pool.single_action_space.low, pool.single_action_space.high
    obs = pool.reset(seed=task.seed)[0]
    returns = np.zeros(task.num_envs)

    def run(k: int) -> None:
        nonlocal obs
        for _ in range(k):
            act = np.clip(np.matmul(w, obs[:, :, None])[:, :, 0] + b, low, high)
            obs, rew = pool.step(act.astype(np.float32))[:2]
            returns[:] += rew

    return Loop(run, task.num_envs, pool.close)


# ---- Gymnasium ---------------------------------------------------------------------------------


def _gymnasium_spec(task: Task) -> Any:
    import gymnasium as gym

    register_minatar(task.env_id)
    try:
        return gym.spec(task.env_id)
    except gym.error.Error as e:
        raise Unavailable(f"n/a: Gymnasium has no {task.env_id}") from e


def gymnasium_sync(task: Task) -> Loop:
    import gymnasium as gym

    if atari_peers.is_atari(task.env_id):
        return sync_loop(atari_peers.gymnasium_vector_env(task, "sync"), task, task.num_envs)
    _gymnasium_spec(task)
    env = gym.make_vec(task.env_id, num_envs=task.num_envs, vectorization_mode="sync")
    return sync_loop(env, task, task.num_envs)


def gymnasium_async(task: Task) -> Loop:
    import gymnasium as gym

    if task.num_envs > ASYNC_VECTOR_MAX_ENVS:
        raise Unavailable(f"skipped: > {ASYNC_VECTOR_MAX_ENVS} envs (one process each)")
    if atari_peers.is_atari(task.env_id):
        return sync_loop(atari_peers.gymnasium_vector_env(task, "async"), task, task.num_envs)
    _gymnasium_spec(task)
    env = gym.make_vec(task.env_id, num_envs=task.num_envs, vectorization_mode="async")
    return sync_loop(env, task, task.num_envs)


def gymnasium_vector(task: Task) -> Loop:
    import gymnasium as gym

    if _gymnasium_spec(task).vector_entry_point is None:
        raise Unavailable(f"n/a: no numpy-vectorized {task.env_id} in Gymnasium")
    env = gym.make_vec(task.env_id, num_envs=task.num_envs, vectorization_mode="vector_entry_point")
    return sync_loop(env, task, task.num_envs)


# ---- EnvPool -----------------------------------------------------------------------------------


def _envpool(task: Task, batch_size: int) -> Any:
    try:
        import envpool
    except ImportError as e:
        raise Unavailable("not installed") from e
    if task.env_id not in envpool.list_all_envs():
        raise Unavailable(f"n/a: EnvPool has no {task.env_id}")
    return envpool.make_gymnasium(
        task.env_id,
        num_envs=task.num_envs,
        batch_size=batch_size,
        num_threads=min(task.num_threads, task.num_envs),  # as onebox: no idle threads
        seed=task.seed,
        **atari_peers.envpool_options(task.env_id),
    )


def envpool_sync(task: Task) -> Loop:
    return sync_loop(_envpool(task, task.num_envs), task, task.num_envs)


def envpool_async(task: Task) -> Loop:
    batch = half(task.num_envs)
    return async_loop(_envpool(task, batch), task, batch)


PEERS: tuple[Peer, ...] = (
    Peer("onebox-sync", "onebox", "onebox sync", onebox_sync),
    Peer("onebox-async", "onebox", "onebox async", onebox_async),
    Peer("onebox-process", "process", "onebox process", process_peers.process_sync),
    Peer("onebox-process-async", "process", "onebox process async", process_peers.process_async),
    Peer("gymnasium-sync", "gymnasium", "Gymnasium SyncVectorEnv", gymnasium_sync),
    Peer("gymnasium-async", "gymnasium", "Gymnasium AsyncVectorEnv", gymnasium_async),
    Peer("gymnasium-vector", "gymnasium", "Gymnasium numpy-vectorized", gymnasium_vector),
    Peer("envpool-sync", "envpool", "EnvPool sync", envpool_sync),
    Peer("envpool-async", "envpool", "EnvPool async", envpool_async),
    Peer("ale-sync", "ale", "ALE AtariVectorEnv sync", atari_peers.ale_sync),
    Peer("ale-async", "ale", "ALE AtariVectorEnv async", atari_peers.ale_async),
    Peer("policy-python", "policy", "onebox sync + NumPy linear policy", onebox_python_policy),
    Peer("policy-rollout", "policy", "onebox rollout, linear policy in C++", onebox_rollout),
)
"""Every backend, in table order."""

_FAMILIES = tuple(dict.fromkeys(p.family for p in PEERS))
PeerName = Literal[tuple(p.name for p in PEERS) + _FAMILIES]  # type: ignore[valid-type]


# ---- the command -------------------------------------------------------------------------------


@dataclasses.dataclass
class EnvBenchConfig:
    """Measure env steps/s of onebox (sync and async) next to Gymnasium's vector envs and EnvPool,
    on the same task, numbers of envs and threads, and print them side by side.

    Async backends receive num_envs/2 envs per `recv`. Gymnasium's AsyncVectorEnv (one process per
    env) is skipped above 64 envs. With `--output FILE`, the results replace this env's section of
    FILE, between `<!-- bench:envs:ENV -->` and `<!-- /bench:envs:ENV -->`, or are appended."""

    env: str = "CartPole-v1"
    """Env id (see `onebox envs`); peers that do not have it are marked n/a."""
    num_envs: tuple[int, ...] = (8, 64, 512)
    """Numbers of envs: every backend is measured at each."""
    num_threads: int | None = None
    """Worker threads of onebox and EnvPool (default: the physical cores)."""
    seconds: float = 2.0
    """Time of each measurement, after the warm-up, in seconds."""
    warmup: float = 0.5
    """Warm-up before each measurement, in seconds (not counted)."""
    peers: tuple[PeerName, ...] = _FAMILIES  # type: ignore[valid-type]
    """Backends to run, by name, or by family (onebox, process, gymnasium, envpool, ale, policy)
    for all of its own. The policy family runs a linear policy closed-loop: from Python, and with
    `rollout`."""
    seed: int = 0
    """Seed of the envs and of the random actions."""
    output: Path | None = None
    """Markdown file to write the results to (e.g. docs/benchmarks.md), in this env's section."""
    section: str | None = None
    """Label of the section to write, after the env id (e.g. `process`), so that a run of a few
    peers does not replace the env's main section."""
    rounds: int = 1
    """Measure every backend this many times, in interleaved rounds (each backend once per round),
    and report the median, with the range: drifts in the machine's load then hit every backend
    alike."""


@dataclasses.dataclass(frozen=True)
class Result:
    """One measurement, or why there is none."""

    peer: Peer
    num_envs: int
    rate: float | None
    note: str = ""
    rates: tuple[float, ...] = ()
    """Every round's steps/s, when measured in rounds (`rate` is their median)."""


def select_peers(names: tuple[str, ...]) -> list[Peer]:
    """The backends named (or whose family is named) in `names`, in table order."""
    known = {p.name for p in PEERS} | set(_FAMILIES)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown peers {unknown}; choose from {sorted(known)}")
    return [p for p in PEERS if p.name in names or p.family in names]


def measure_peer(peer: Peer, task: Task, seconds: float, warmup: float) -> Result:
    """Build the backend, time its loop, close it."""
    with warnings.catch_warnings():  # the peers' own (EnvPool warns about its spaces' bounds)
        warnings.simplefilter("ignore")
        try:
            loop = peer.make(task)
        except Unavailable as e:
            return Result(peer, task.num_envs, None, str(e))
        try:
            timing = common.measure(loop.run, loop.steps_per_call, seconds, warmup)
        finally:
            loop.close()
    return Result(peer, task.num_envs, timing.rate)


def run(config: EnvBenchConfig) -> int:
    """Run the benchmark, print the table, write the markdown section if asked."""
    import onebox.envs

    console, log = common.console(), common.console(stderr=True)
    if config.env not in onebox.envs.list_envs():
        close = difflib.get_close_matches(config.env, onebox.envs.list_envs(), n=3, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown env id {config.env!r}.{hint} `onebox envs` lists them.")
    if not config.num_envs or min(config.num_envs) < 1:
        raise ValueError(f"--num-envs must be positive integers, got {config.num_envs}")
    if config.seconds <= 0 or config.warmup < 0:
        raise ValueError("--seconds must be > 0 and --warmup >= 0")
    if config.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {config.rounds}")
    threads = config.num_threads or onebox.envs.physical_cores()
    config = dataclasses.replace(config, num_threads=threads)
    peers = select_peers(tuple(config.peers))

    results = []
    for n in config.num_envs:
        task = Task(config.env, n, threads, config.seed)
        rounds: list[list[Result]] = []
        for k in range(config.rounds):
            rounds.append([])
            for peer in peers:
                result = measure_peer(peer, task, config.seconds, config.warmup)
                speed = common.format_rate(result.rate) + " steps/s" if result.rate else result.note
                where = f"  (round {k + 1}/{config.rounds})" if config.rounds > 1 else ""
                log.print(
                    f"[dim]{peer.label:<28} {n:>6} envs  {speed}{where}[/dim]", highlight=False
                )
                rounds[-1].append(result)
        results += [median_result(list(same)) for same in zip(*rounds, strict=True)]

    machine = common.machine_info(("numpy", "gymnasium", "envpool", "ale-py", "mujoco"))
    header, rows = table_rows(results)
    title = f"{config.env}: env steps/s, {_threads(threads)}, {config.seconds:g} s per measurement"
    console.print(_rich_table(title, header, rows))
    console.print(_rich_machine(machine))
    if config.output is not None:
        command = common.command_line("onebox bench envs", config)
        body = markdown_section(config, header, rows, machine, command, common.now())
        key = section_key(config.env) + (f":{config.section}" if config.section else "")
        path = common.write_section(config.output, key, body, figure(title, results))
        console.print(f"wrote the {config.env} section of {path}")
    return 0


# ---- the report --------------------------------------------------------------------------------


def _threads(n: int | None) -> str:
    return f"{n} thread" + ("" if n == 1 else "s")


def section_key(env_id: str) -> str:
    return f"bench:envs:{env_id}"


def figure(title: str, results: list[Result]) -> figures.Bars:
    """The run's steps/s per backend (bars) and number of envs (groups)."""
    counts = list(dict.fromkeys(r.num_envs for r in results))
    values: dict[str, list[float | None]] = {}
    for r in results:
        values.setdefault(r.peer.label, [None] * len(counts))[counts.index(r.num_envs)] = r.rate
    return figures.Bars(title, "env steps/s", [f"{n} envs" for n in counts], values)


def median_result(results: list[Result]) -> Result:
    """One backend's rounds as one result: the median steps/s, every round's kept in `rates`.

    A backend unavailable in any round is reported unavailable."""
    first = results[0]
    if len(results) == 1 or any(r.rate is None for r in results):
        return next((r for r in results if r.rate is None), first)
    rates = tuple(r.rate for r in results if r.rate is not None)
    return Result(first.peer, first.num_envs, float(statistics.median(rates)), rates=rates)


def table_rows(results: list[Result]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: backend, envs, steps/s (the median of the rounds, and their range when
    there were several), then onebox's speed over the row's, for each onebox backend that ran
    ("onebox sync ×" = onebox sync steps/s / this row's steps/s, medians)."""
    ours = [p for p in dict.fromkeys(r.peer for r in results) if p.family in ("onebox", "process")]
    ranged = any(r.rates for r in results)
    header = ["backend", "envs", "steps/s", *(["range"] if ranged else [])]
    header += [f"{p.label} ×" for p in ours]
    rates = {(r.peer.name, r.num_envs): r.rate for r in results}
    rows = []
    for r in results:
        row = [r.peer.label, str(r.num_envs), common.format_rate(r.rate) if r.rate else r.note]
        if ranged:
            spread = "-"
            if r.rates:
                spread = f"{common.format_rate(min(r.rates))}-{common.format_rate(max(r.rates))}"
            row.append(spread)
        for p in ours:
            mine = rates.get((p.name, r.num_envs))
            row.append(common.format_ratio(mine / r.rate) if mine and r.rate else "-")
        rows.append(row)
    return header, rows


def _rich_table(title: str, header: list[str], rows: list[list[str]]) -> Any:
    from rich.table import Table

    table = Table(title=title)
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=i != 2)
    previous = None
    for row in rows:
        if previous is not None and row[1] != previous:
            table.add_section()
        previous = row[1]
        table.add_row(*row)
    return table


def _rich_machine(machine: dict[str, str]) -> Any:
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    for key, value in machine.items():
        table.add_row(f"[bold]{key}[/bold]", value)
    return table


def markdown_section(
    config: EnvBenchConfig,
    header: list[str],
    rows: list[list[str]],
    machine: dict[str, str],
    command: str,
    date: str,
) -> str:
    """The markdown of one env's results: table, command, date, machine."""
    right = [i > 0 for i in range(len(header))]
    lines = [
        f"### {config.env}" + (f" ({config.section})" if config.section else ""),
        "",
        f"{_threads(config.num_threads)} for onebox and EnvPool; async backends receive "
        f"num_envs/2 envs per `recv`; {config.seconds:g} s per measurement after "
        f"{config.warmup:g} s of warm-up"
        + (
            f"; {config.rounds} interleaved rounds (each backend once per round), steps/s is "
            "the median and range the lowest and highest round"
            if config.rounds > 1
            else ""
        )
        + ". In the × columns: that onebox backend's steps/s divided by the row's.",
        "",
        common.markdown_table(header, rows, right),
        "",
        f"Command: `{command}`",
        "",
        f"Date: {date}",
        "",
        "Machine:",
        "",
        *(f"- {key}: {value}" for key, value in machine.items()),
    ]
    return "\n".join(lines)
