"""`onebox bench replay`: prioritized replay against cpprb, and Atari memory per transition.

Both tables hold `capacity` transitions of a vector observation (float32, `obs_dim` values), an
int64 action, a reward and a done flag, and are filled to capacity before timing. Then, in
`rounds` interleaved rounds (the order of the two libraries alternating), each library inserts
`num_envs` rows per call for `seconds`, then samples a batch of `batch_size` and updates the
priorities of the batch (random TD magnitudes) for `seconds`. A library's rate is the median over
the rounds, so that a drift in the machine's load hits both alike. onebox's table computes
n-step returns at insertion (here n = 1) and samples stratified as in the PER paper; cpprb's
PrioritizedReplayBuffer is its C++ segment tree behind Cython.

Memory: bytes per transition of a 1M-transition prioritized Atari table (4 x 84 x 84 uint8
stacks, frame_stack=4), counted from the arrays' sizes (the pages are not touched), against
storing the stacked observations (obs only, as with next observations taken from the next slot,
and obs plus next_obs, as cpprb's table above stores them).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from onebox.bench import common, figures
from onebox.replay import ReplayBuffer

ATARI_STACK = (4, 84, 84)


@dataclasses.dataclass
class ReplayBenchConfig:
    """Prioritized replay insert and sample+update rates against cpprb; Atari bytes/transition."""

    capacity: int = 1_000_000
    """Transitions each table holds (filled before timing)."""
    obs_dim: int = 16
    """Values of the float32 observation."""
    num_envs: int = 8
    """Rows per insert call (one env step of this many envs)."""
    batch_size: int = 512
    """Transitions per sample."""
    rounds: int = 5
    """Interleaved rounds; each rate is the median over them."""
    seconds: float = 1.0
    """Timed seconds per library, phase and round."""
    alpha: float = 0.6
    """Priority exponent of both tables."""
    beta: float = 0.4
    """Importance-weight exponent of both tables."""
    seed: int = 0
    """Seed of the data and of onebox's table."""
    output: Path | None = None
    """Markdown file to write the section into (e.g. docs/benchmarks.md)."""


class Onebox:
    name = "onebox"

    def __init__(self, config: ReplayBenchConfig) -> None:
        self.table = ReplayBuffer(
            config.capacity, (config.obs_dim,), np.float32, (), np.int64, config.num_envs,
            prioritized=True, alpha=config.alpha, beta=config.beta, seed=config.seed,
        )  # fmt: skip
        self.batch_size = config.batch_size

    def insert(self, obs: np.ndarray, act: np.ndarray, rew: np.ndarray, done: np.ndarray) -> None:
        self.table.add(obs, act, rew, done, np.zeros_like(done), obs)

    def sample_update(self, td: np.ndarray) -> None:
        batch = self.table.sample(self.batch_size)
        self.table.update_priorities(batch.indices, td)


class Cpprb:
    name = "cpprb"

    def __init__(self, config: ReplayBenchConfig) -> None:
        from cpprb import PrioritizedReplayBuffer

        env_dict = {
            "obs": {"shape": config.obs_dim, "dtype": np.float32},
            "act": {"shape": 1, "dtype": np.int64},
            "rew": {},
            "next_obs": {"shape": config.obs_dim, "dtype": np.float32},
            "done": {},
        }
        self.table = PrioritizedReplayBuffer(config.capacity, env_dict, alpha=config.alpha)
        self.batch_size, self.beta = config.batch_size, config.beta

    def insert(self, obs: np.ndarray, act: np.ndarray, rew: np.ndarray, done: np.ndarray) -> None:
        self.table.add(obs=obs, act=act, rew=rew, next_obs=obs, done=done)

    def sample_update(self, td: np.ndarray) -> None:
        batch = self.table.sample(self.batch_size, beta=self.beta)
        self.table.update_priorities(batch["indexes"], td)


def atari_memory(capacity: int) -> dict[str, float]:
    """Bytes per transition: deduplicated frames against stacked observations."""
    table = ReplayBuffer(
        capacity, ATARI_STACK, np.uint8, (), np.int64, 8, prioritized=True, frame_stack=4
    )
    stack = int(np.prod(ATARI_STACK))
    # The same table's other fields (actions, returns, discounts, priority trees), less the two
    # frame positions a stacked table does without.
    others = (table.nbytes - table.frames.frames.nbytes) / table.capacity - 16
    return {
        "dedup": table.nbytes / table.capacity,
        "stacked": stack + others,
        "stacked_next": 2 * stack + others,
    }


def run(config: ReplayBenchConfig) -> int:
    """Fill both tables, time them in interleaved rounds, print (and optionally write) the table."""
    if config.capacity < config.batch_size or config.num_envs < 1 or config.rounds < 1:
        raise ValueError("--capacity must be >= --batch-size, --num-envs and --rounds >= 1")
    if config.seconds <= 0:
        raise ValueError("--seconds must be > 0")
    try:
        import cpprb  # noqa: F401
    except ImportError as e:
        raise ImportError(
            'the replay benchmark compares with cpprb: pip install "onebox[bench]"'
        ) from e
    console = common.console()
    rng = np.random.default_rng(config.seed)
    n = config.num_envs
    obs = rng.standard_normal((n, config.obs_dim)).astype(np.float32)
    act, rew = rng.integers(18, size=n), rng.standard_normal(n)
    done = np.zeros(n, dtype=bool)
    td = np.abs(rng.standard_normal(config.batch_size))
    load = os.getloadavg()[0]
    libs: list[Any] = [Onebox(config), Cpprb(config)]
    for lib in libs:
        console.print(f"filling {lib.name} with {config.capacity:,} transitions")
        for _ in range(-(-config.capacity // n)):
            lib.insert(obs, act, rew, done)
    inserts: dict[str, list[float]] = {lib.name: [] for lib in libs}
    samples: dict[str, list[float]] = {lib.name: [] for lib in libs}
    for r in range(config.rounds):
        for lib in libs if r % 2 == 0 else libs[::-1]:

            def insert(k: int, lib: Any = lib) -> None:
                for _ in range(k):
                    lib.insert(obs, act, rew, done)

            def sample_update(k: int, lib: Any = lib) -> None:
                for _ in range(k):
                    lib.sample_update(td)

            inserts[lib.name].append(common.measure(insert, n, config.seconds, 0.1).rate)
            samples[lib.name].append(common.measure(sample_update, 1, config.seconds, 0.1).rate)
        console.print(
            f"round {r + 1}: "
            + ", ".join(
                f"{lib.name} {common.format_rate(inserts[lib.name][-1])} rows/s inserted, "
                f"{common.format_rate(samples[lib.name][-1])} sample+update/s"
                for lib in libs
            )
        )
    load_after = os.getloadavg()[0]
    ins = {k: statistics.median(v) for k, v in inserts.items()}
    smp = {k: statistics.median(v) for k, v in samples.items()}
    header = ["library", "insert rows/s", "sample+update/s", "(range)", "transitions sampled/s"]
    rows = [
        [
            name,
            common.format_rate(ins[name]),
            common.format_rate(smp[name]),
            f"{common.format_rate(min(samples[name]))}-{common.format_rate(max(samples[name]))}",
            common.format_rate(smp[name] * config.batch_size),
        ]
        for name in ins
    ]
    ratio = smp["onebox"] / smp["cpprb"]
    mem = atari_memory(1_000_000)
    mem_header = ["Atari storage, 1M transitions", "bytes/transition", "GB", "vs dedup"]
    mem_rows = [
        [
            label,
            f"{mem[key]:,.0f}",
            f"{mem[key] * 1e6 / 1e9:.2f}",
            f"{mem[key] / mem['dedup']:.2f}×",
        ]
        for key, label in (
            ("dedup", "onebox frame_stack=4 (single frames)"),
            ("stacked", "stacked obs"),
            ("stacked_next", "stacked obs + next_obs"),
        )
    ]
    from rich.table import Table

    title = (
        f"Prioritized replay, {config.capacity:,} transitions of {config.obs_dim} float32, "
        f"insert {n} rows per call, sample {config.batch_size} + update priorities"
    )
    for t_title, t_header, t_rows in (
        (title, header, rows),
        ("Atari memory", mem_header, mem_rows),
    ):
        table = Table(title=t_title)
        for h in t_header:
            table.add_column(h, justify="left" if h == t_header[0] else "right")
        for row in t_rows:
            table.add_row(*row)
        console.print(table)
    share = mem["dedup"] / mem["stacked"]
    verdict = (
        f"onebox samples and updates at {common.format_ratio(ratio)} cpprb's rate (target >= 2×: "
        + ("met" if ratio >= 2 else "missed")
        + f"); Atari memory per transition is {share:.2f} of stacked storage (target <= 1/3: "
        + ("met" if share <= 1 / 3 else "missed")
        + ")."
    )
    console.print(verdict)
    console.print(f"1-minute load average: {load:.1f} at the start, {load_after:.1f} at the end.")
    if config.output is not None:
        machine = common.machine_info(("numpy", "cpprb"))
        lines = [
            "### Prioritized replay",
            "",
            title + ". " + __doc__.split("\n\n", 1)[1].replace("\n", " ").strip(),
            "",
            f"1-minute load average: {load:.1f} when the run began, {load_after:.1f} when it "
            "ended (the cores are shared with other work).",
            "",
            common.markdown_table(header, rows, [False] + [True] * 4),
            "",
            common.markdown_table(mem_header, mem_rows, [False] + [True] * 3),
            "",
            verdict,
            "",
            f"Command: `{common.command_line('onebox bench replay', config)}`",
            "",
            f"Date: {common.now()}",
            "",
            "Machine:",
            "",
            *[f"- {k}: {v}" for k, v in machine.items()],
        ]
        bars = figures.Bars(title, "per second (median)", ["insert rows", "sample+update"],
                            {name: [ins[name], smp[name]] for name in ins})  # fmt: skip
        path = common.write_section(config.output, "bench:replay", "\n".join(lines), bars)
        console.print(f"wrote the replay section of {path}")
    return 0
