"""`onebox bench ray`: IMPALA's env steps/s with its actors in the learner's process against the
same actors on 2 and 4 Ray actor hosts of this machine, and the bytes sent per env step.

Every case trains IMPALA with the same actors, envs per actor and unrolls (the env family's
preset unless given), in a throwaway run folder; SPS is taken from the run's own `metrics.csv`,
between its last log and its first log at which every actor host had sent an unroll (Ray starts
the host processes one after another). In process: thread actors, each with its own synced copy of the
policy (`--inference local`), and the central inference server (`--inference central`, the
default on one machine). On Ray: a local Ray instance this command starts (`ray.init` with
`--ray-cpus` CPUs and a small object store), each host one process with one copy of the policy,
behind the host's own inference server where it runs several actors. Rounds interleave the cases, so that load from elsewhere falls on all of them.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import statistics
import tempfile
from pathlib import Path

from onebox.bench import common, figures


@dataclasses.dataclass
class RayBenchConfig:
    """IMPALA env steps/s: actors in process against actors on Ray hosts of this machine."""

    env: str = "CartPole-v1"
    """Env id."""
    hosts: tuple[int, ...] = (2, 4)
    """Ray actor host counts to measure (besides the in-process actors)."""
    actors: int = 4
    """Actors in every case (spread over the hosts)."""
    envs_per_actor: int | None = None
    """Envs per actor (default: the preset's)."""
    total_steps: int = 100_000
    """Env steps per case and round."""
    rounds: int = 2
    """Interleaved rounds; the table gives each case's median."""
    ray_cpus: int | None = None
    """CPUs the local Ray instance offers (default: the largest host count)."""
    object_store_mb: int = 300
    """The local Ray instance's object store size."""
    output: Path | None = None
    """Markdown file to write this env's section into (e.g. docs/benchmarks.md)."""


def measure(config: RayBenchConfig, case: str, root: Path, n: int) -> tuple[float, float | None]:
    """(env steps/s, bytes sent per env step or None) of one IMPALA run of `case`."""
    from onebox.algos import driver, impala

    fields: dict = {"inference": "local"}
    if case == "central":
        fields = {"inference": "central"}
    elif case.startswith("ray"):
        fields = {"ray": "auto", "actor_hosts": int(case.removeprefix("ray-"))}
    run_config = impala.Config(
        env=config.env, actors=config.actors, envs_per_actor=config.envs_per_actor,
        total_steps=config.total_steps, runs_dir=str(root), name=f"{case}-{n}",
        checkpoint_minutes=0.0, progress=False, **fields,
    )  # fmt: skip
    run_dir = driver.train(run_config)
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    # From the first log at which every actor host has sent an unroll (they start one by one).
    hosts = {r["tag"].split("/")[1] for r in rows if r["tag"].startswith("hosts/")}
    sent: dict[str, int] = {}
    begin = 0
    for r in rows:
        if r["tag"].endswith("/unrolls_sent") and float(r["value"]) > 0:
            sent.setdefault(r["tag"].split("/")[1], int(r["step"]))
    if hosts:
        begin = max(sent.get(h, 2**62) for h in hosts)
    sps = [(int(r["step"]), float(r["time"])) for r in rows
           if r["tag"] == "charts/SPS" and int(r["step"]) >= begin]  # fmt: skip
    if len(sps) < 2:
        raise RuntimeError(f"{case}: too few logs after every host started; raise --total-steps")
    (s0, t0), (s1, t1) = sps[0], sps[-1]
    per_step = [float(r["value"]) for r in rows if r["tag"] == "charts/bytes_per_env_step"]
    return (s1 - s0) / (t1 - t0), (per_step[-1] if per_step else None)


def run(config: RayBenchConfig) -> int:
    """Measure each case in interleaved rounds, print the table, write the section if asked."""
    from onebox import cluster

    if config.rounds < 1 or config.total_steps < 1 or config.actors < 1:
        raise ValueError("--rounds, --total-steps and --actors must be positive")
    if any(h < 1 or h > config.actors for h in config.hosts):
        raise ValueError(f"--hosts must be in [1, --actors={config.actors}], got {config.hosts}")
    ray = cluster.import_ray()
    console = common.console()
    load = os.getloadavg()[0]
    cpus = config.ray_cpus or max(config.hosts)
    cases = ["local", "central", *(f"ray-{h}" for h in config.hosts)]
    results: dict[str, list[tuple[float, float | None]]] = {c: [] for c in cases}
    ray.init(num_cpus=cpus, object_store_memory=config.object_store_mb * 2**20,
             include_dashboard=False, log_to_driver=False)  # fmt: skip
    try:
        with tempfile.TemporaryDirectory() as root:
            for n in range(config.rounds):
                for case in cases:
                    results[case].append(measure(config, case, Path(root), n))
                    console.print(f"round {n + 1} {case}: {results[case][-1][0]:.0f} steps/s")
    finally:
        ray.shutdown()
    local = statistics.median(s for s, _ in results["local"])
    names = {"local": "in process, local policies", "central": "in process, central inference"}
    header = ["actors run", "env steps/s (median)", "rounds", "× in process (local)",
              "bytes sent / env step"]  # fmt: skip
    rows = []
    for case in cases:
        sps = statistics.median(s for s, _ in results[case])
        sent = results[case][-1][1]
        rows.append([
            names.get(case, f"{case.removeprefix('ray-')} Ray hosts"), f"{sps:.0f}",
            " / ".join(f"{s:.0f}" for s, _ in results[case]), f"{sps / local:.2f}×",
            "-" if sent is None else f"{sent:.1f}",
        ])  # fmt: skip
    common.print_table(
        console, f"IMPALA on {config.env}: actors in process vs on Ray hosts", header, rows
    )
    if config.output is not None:
        lines = [
            f"### Ray actor hosts, IMPALA on {config.env}",
            "",
            f"{config.actors} actors in every case, IMPALA's preset otherwise, "
            f"{config.total_steps:,} env steps per run, {config.rounds} interleaved rounds "
            f"(each round's figure in `rounds`). Ray: a local instance with {cpus} CPUs, one "
            "process per host, its actors served by the host's own inference server when it "
            "runs several (one actor calls its policy copy directly). Bytes sent: the unrolls' "
            "arrays that reached the learner, per env step (weights going the other way are not "
            "counted).",
            "",
            f"1-minute load average when the run began: {load:.1f}.",
            "",
            common.markdown_table(header, rows, [False] + [True] * (len(header) - 1)),
            "",
            *common.provenance("onebox bench ray", config, ("numpy", "torch", "ray")),
        ]
        bars = figures.Bars(f"IMPALA on {config.env}: actors in process vs on Ray hosts",
                            "env steps/s (median)", [config.env],
                            {row[0]: [float(row[1])] for row in rows})  # fmt: skip
        path = common.write_section(config.output, f"bench:ray:{config.env}", "\n".join(lines),
                                    bars)  # fmt: skip
        console.print(f"wrote the {config.env} section of {path}")
    return 0
