"""`onebox bench train`: learners' env steps per second, with the time split and policy lag.

Modes: PPO with the sync sampler (`sync`), PPO double-buffered (`double`), and APPO (`appo`: IMPALA's
asynchronous actors and central inference server, PPO's clipped loss on V-trace targets). Each
trains for `--iterations` timed updates after one warm-up update, with the env family's preset
(for Pong-v5: CleanRL's ppo_atari_envpool hyperparameters for PPO, IMPALA's Atari settings for
APPO), in a throwaway run folder. SPS is measured over the timed updates only, from the run's own
`metrics.csv`; the time split is the run's `time/*` fractions.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from onebox.bench import common, figures
from onebox.nn.accel import AccelFields
from onebox.sampling.actors import ACTOR_SECTIONS
from onebox.sampling.inference import CALL_SECTIONS

CLEANRL_ATARI_SPS = 240.0
"""CleanRL's ppo_atari_envpool on Pong-v5 on a 2-core machine like this one, as given in the
project's reference (`shared/reference.md`); its script is not on PyPI, so it is not rerun here."""


@dataclasses.dataclass
class TrainBenchConfig(AccelFields):
    """PPO SPS per sampler mode, with the time split between envs, inference and learning."""

    env: str = "Pong-v5"
    """Env id."""
    modes: tuple[Literal["sync", "double", "appo"], ...] = ("sync", "double", "appo")
    """What to measure: PPO sync, PPO double-buffered, APPO."""
    iterations: int = 3
    """Timed updates per mode, after one warm-up update."""
    num_envs: int | None = None
    """Envs (default: the preset's; 8 for Atari)."""
    num_steps: int | None = None
    """PPO's steps per env in each rollout (default: the preset's; 128 for Atari)."""
    num_threads: int | None = None
    """PPO's env pool threads (default: physical cores); APPO's actors share the cores."""
    actors: int | None = None
    """APPO's actors (default: the preset's; 4 for Atari)."""
    envs_per_actor: int | None = None
    """APPO's envs per actor (default: the preset's; 8 for Atari)."""
    process_actors: bool = False
    """APPO's actors as processes (`onebox train appo --process-actors`) rather than threads of
    the learner's process."""
    server_process: bool = False
    """With `--process-actors`: APPO's inference server in a process of its own (`onebox train
    appo --server-process`)."""
    server_processes: int = 1
    """With `--server-process`: APPO's server processes, each serving every N-th actor (`onebox
    train appo --server-processes`)."""
    env_splits: int = 1
    """APPO's pools per actor, stepped in turn (`onebox train appo --env-splits`)."""
    timeout_ms: float | None = None
    """How long APPO's inference server lets a request wait for others to join its batch
    (`onebox train appo --timeout-ms`; default: APPO's)."""
    torch_threads: int | None = None
    """Torch CPU threads (default: the learner's choice)."""
    device: str = "auto"
    """Torch device."""
    output: Path | None = None
    """Markdown file to write this env's section into (e.g. docs/benchmarks.md)."""


SERVER_HEADER = "inference server (batch, latency, busy; its calls' parts; on a core)"
"""The column of `Result.server_text`."""


@dataclasses.dataclass
class Result:
    mode: str
    sps: float
    split: dict[str, float]
    batch: int
    lag: float | None
    server: dict[str, float]
    """APPO: the inference server's charts (`charts/inference_batch`, `_latency_ms`, `_busy`,
    the calls' parts `_gather`, `_policy`, `_device`, `_answer`, and `_on_core`, as "batch",
    ...), means over the timed updates; empty for PPO."""
    actors: dict[str, float]
    """APPO: its actors' time split (`charts/actor_env`, `_inference`, `_blocked`,
    `_other`, as "env", ...), means over the timed updates; else empty."""

    def actors_text(self) -> str:
        """The actors' split as "env 40%, inference 50%, blocked 0%, other 10%", or "-"."""
        if not self.actors:
            return "-"
        return ", ".join(f"{k} {100 * v:.0f}%" for k, v in self.actors.items())

    def server_text(self) -> str:
        """The server's charts as "128 envs, 2.1 ms, busy 40%; gather 10%, policy 60%, device
        20%, answer 10%; on a core 70%", or "-"."""
        if not self.server:
            return "-"
        s = self.server
        text = f"{s['batch']:.0f} envs, {s['latency_ms']:.1f} ms, busy {100 * s['busy']:.0f}%"
        parts = [f"{k} {100 * s[k]:.0f}%" for k in CALL_SECTIONS if k in s]
        if parts:
            text += "; " + ", ".join(parts)
        if "on_core" in s:
            text += f"; on a core {100 * s['on_core']:.0f}%"
        return text


def measure(config: TrainBenchConfig, mode: str, root: Path) -> Result:
    """Train for 1 + `iterations` updates and read the timed part back from the run."""
    from onebox.algos import appo, driver, ppo

    if mode == "appo":
        module: Any = appo
        base: Any = appo.Config(env=config.env, total_steps=1, actors=config.actors,
                                envs_per_actor=config.envs_per_actor,
                                process_actors=config.process_actors,
                                server_process=config.server_process,
                                server_processes=config.server_processes,
                                env_splits=config.env_splits)  # fmt: skip
        fields: dict[str, Any] = {"timeout_ms": config.timeout_ms}
    else:
        module = ppo
        base = ppo.Config(env=config.env, num_envs=config.num_envs, num_steps=config.num_steps,
                          sampler=mode, total_steps=1)  # type: ignore[arg-type]  # fmt: skip
        fields = {"num_threads": config.num_threads or None}
    base = module.resolve(base)
    batch = base.batch_size
    run_config = dataclasses.replace(
        base,
        total_steps=batch * (config.iterations + 1),
        torch_threads=config.torch_threads or base.torch_threads,
        log_every=batch,  # every update: SPS over the timed ones
        device=config.device,
        precision=config.precision,
        compile=config.compile,
        runs_dir=str(root),
        name=f"bench-{mode}",
        checkpoint_minutes=0.0,
        progress=False,
        **{k: v for k, v in fields.items() if v is not None},
    )
    run_dir = driver.train(run_config)
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    sps_rows = [(int(r["step"]), float(r["time"])) for r in rows if r["tag"] == "charts/SPS"]
    (s0, t0), (s1, t1) = sps_rows[0], sps_rows[-1]
    last = sps_rows[-1][0]
    split = {
        r["tag"].removeprefix("time/"): float(r["value"])
        for r in rows
        if r["tag"].startswith("time/") and int(r["step"]) == last
    }
    lags = [float(r["value"]) for r in rows if r["tag"] == "charts/policy_lag"]
    lag = sum(lags) / len(lags) if lags else None
    server = _chart_means(rows, "charts/inference_", s0)
    actor = _chart_means(rows, "charts/actor_", s0)  # also actor_restarts, left out
    actors = {k: actor[k] for k in (*ACTOR_SECTIONS, "other") if k in actor}
    return Result(mode, (s1 - s0) / (t1 - t0), split, batch, lag, server, actors)


def _chart_means(rows: list[dict[str, str]], prefix: str, after: int) -> dict[str, float]:
    """The mean of each chart named `prefix` + name logged after step `after`, by name."""
    values: dict[str, list[float]] = {}
    for r in rows:
        if r["tag"].startswith(prefix) and int(r["step"]) > after:
            values.setdefault(r["tag"].removeprefix(prefix), []).append(float(r["value"]))
    return {k: sum(v) / len(v) for k, v in values.items()}


def run(config: TrainBenchConfig) -> int:
    """Measure each sampler mode, print the table, write the markdown section if asked."""
    if config.iterations <= 0:
        raise ValueError(f"--iterations must be positive, got {config.iterations}")
    console = common.console()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as root:
        results = [measure(config, m, Path(root)) for m in config.modes]
    sections = sorted({k for r in results for k in r.split})
    header = ["mode", "batch", "env steps/s", "frames/s", *sections, "policy lag"]
    served = any(r.server for r in results)
    if served:
        header.append(SERVER_HEADER)
    acted = any(r.actors for r in results)
    if acted:
        header.append("actors' time")
    header += ["× CleanRL (240)"]
    sync = next((r.sps for r in results if r.mode == "sync"), None)
    if sync:
        header.append("× PPO sync")
    frames = 4 if "-v5" in config.env and "/" not in config.env else 1
    rows = [
        [
            r.mode,
            str(r.batch),
            f"{r.sps:.0f}",
            f"{r.sps * frames:.0f}",
            *(f"{100 * r.split.get(k, 0.0):.0f}%" for k in sections),
            "-" if r.lag is None else f"{r.lag:.1f}",
            *([r.server_text()] if served else []),
            *([r.actors_text()] if acted else []),
            f"{r.sps / CLEANRL_ATARI_SPS:.2f}×",
            *([f"{r.sps / sync:.2f}×"] if sync else []),
        ]
        for r in results
    ]
    common.print_table(console, f"training throughput on {config.env}", header, rows)
    if config.output is not None:
        lines = [
            f"### Training throughput, {config.env}",
            "",
            f"{config.iterations} timed updates per mode after one warm-up update; each learner's "
            "preset (PPO: CleanRL's for this family; APPO: its own, IMPALA's on Atari), batch = "
            "env steps per update. Time split: each run's `time/*` shares. Policy lag: learner version minus "
            "behaviour version, mean over the run. Inference server (APPO): envs per policy "
            "call, a request's mean time in the server (waiting for its batch, then the call) "
            "and the share of the time in policy calls; the shares of the calls' time in their "
            "parts (gather: the requests joined onto the device; policy: the forward, on a GPU "
            "queued; device: waiting for the outputs on the host; answer: each request its "
            "rows) and the share of their host parts that the server thread ran on a core "
            "(the rest it waited for the GIL or a core); means over the timed updates; actors' "
            "time: in their env pools, waiting for actions, waiting for the learner to "
            "take their unrolls, the rest of their loop. "
            f"× CleanRL: against {CLEANRL_ATARI_SPS:.0f} SPS, the reference's figure for CleanRL's "
            "ppo_atari_envpool on a 2-core machine like this one (not rerun here). Frames/s "
            "count 4 frames per Atari step.",
            "",
            f"1-minute load average when the run began: {load:.1f}.",
            "",
            common.markdown_table(header, rows, [False] + [True] * (len(header) - 1)),
            "",
            *common.provenance(
                "onebox bench train", config, ("numpy", "torch", "gymnasium", "ale-py")
            ),
        ]
        bars = figures.Bars(f"training throughput on {config.env}", "env steps/s", [config.env],
                            {r.mode: [r.sps] for r in results})  # fmt: skip
        path = common.write_section(config.output, f"bench:train:{config.env}", "\n".join(lines),
                                    bars)  # fmt: skip
        console.print(f"wrote the {config.env} section of {path}")
    return 0
