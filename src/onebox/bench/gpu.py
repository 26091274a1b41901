"""`onebox bench gpu`: the GPU suite, one markdown report (`benchmarks/gpu.sh` installs onebox, runs
the CUDA tests, then this).

Parts, in order (each reuses the benchmark of its own `onebox bench` command):

- envs: Pong-v5 env steps/s of the engine alone against EnvPool, same envs and threads.
- train: APPO on 128 Pong envs in the shapes that bear on what bounds it (thread or process
  actors, the server in one or two processes of its own, its policy compiled there or in the
  learner's process, a batching wait), APPO's Atari preset, PPO's throughput preset
  (double-buffered, 128 envs) in float32 and bf16, PPO's Atari preset (`part_train` lists the rows, most wanted first): SPS, the time
  split, the inference server's batch, latency, load and calls' parts, the actors' time split,
  and SPS as a share of the engine alone stepping the same envs with random actions (goal:
  >= 60%).
- evolve: 1,000 Nature CNNs on Pong-v5, each slot group's pool with all the engine threads,
  in the shapes that bear on the goal (groups of 125 or 62 slots, episodes of 300 or 600
  steps, pools in turn or at once, a seeded reset per env per evaluation or per episode,
  float32 or bfloat16; `part_evolve` lists the rows, most wanted first): population frames/s
  against the same pools stepped with random actions (goal: >= 90%) and against one group's
  pool alone, the evaluator's time split (seeded resets among it) and the time with 0, 1,
  2, ... pools in flight.
- inference: the inference server on the device serving 16 thread actors Nature-CNN requests.
- offpolicy (this part and `learn` are in `onebox.bench.gpu_runs`): Ape-X and R2D2 with their
  Atari presets (8 process actors of 16 envs, the learner and the inference server on the
  device) for 45 s each: env frames/s and learner updates/s.
- pbt (in `onebox.bench.gpu_runs`): a population of 16 PPO members on MinAtar Breakout on one
  engine, its updates batched and separate, against one member: env steps/s and the
  population's wall time over one member's at the same steps per member (goal: <= 1.5x).
- policy: the inference call alone, a Nature-CNN (and MLP) actor-critic acting on a batch of 8 and
  of 64 observations already on the device, actions fetched to the host: float32 eager and
  compiled (`--compile`: CUDA graphs on a GPU), and bf16 at 64, with the first (compiling) call's
  time.
- learn: PPO on Pong-v5 with the throughput preset until the deadline (or `learn_minutes`): the
  score reached and when (goal: a mean of 20 over 20 games within 8 minutes).

With `--tiny` every size shrinks to seconds of work: a check of the whole pipeline (on a CPU,
say). The report then says, at its top, that its numbers measure nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from onebox.bench import common, gpu_runs
from onebox.bench.gpu_common import ENV, FRAMES, PARTS, GpuBenchConfig, keep, table

SIZES: dict[bool, dict[str, Any]] = {
    False: dict(seconds=3.0, env_counts=(32, 128), iterations=3, throughput_envs=128, steps=None,
                appo_actors=8, population=1000, slots=250, episode_cap=300, actors=16,
                actor_envs=32, batches=(8, 64), learn_envs=64, offpolicy_seconds=45.0,
                offpolicy_starts={"apex": 20_000, "r2d2": 250}, offpolicy_args=(),
                pbt_population=16, pbt_steps=262_144, pbt_seconds=100.0, pbt_args=()),
    True: dict(seconds=0.3, env_counts=(4,), iterations=1, throughput_envs=4, steps=16,
               appo_actors=2, population=6, slots=4, episode_cap=10, actors=2, actor_envs=2,
               batches=(2,), learn_envs=4, offpolicy_seconds=40.0,
               offpolicy_starts={"apex": 200, "r2d2": 10},
               offpolicy_args=("--actors", "2", "--envs-per-actor", "2", "--batch-size", "8"),
               pbt_population=2, pbt_steps=256, pbt_seconds=60.0,
               pbt_args=("--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2")),
}  # fmt: skip
"""The suite's sizes, full and `--tiny`. The off-policy runs' learning starts (transitions for
Ape-X, sequences of 40 new steps for R2D2) are below their presets' 50,000 and 1,000, which would
spend much of a short run filling the table."""


def run(config: GpuBenchConfig) -> int:
    """Run the parts asked for, write `OUT/report.md`, print where it is."""
    from onebox.nn.accel import resolve_device

    device = resolve_device(config.device)
    if device.type != "cuda" and not config.tiny and set(config.parts) != {"policy"}:
        raise ValueError(
            f"the GPU suite runs on CUDA, got {device}; for a dry run of the pipeline on this "
            "machine pass --tiny --device cpu (or measure this device's inference call alone "
            "with --parts policy)"
        )
    unknown = [p for p in config.parts if p not in PARTS]
    if unknown:
        raise ValueError(f"unknown parts {unknown}; choose from {', '.join(PARTS)}")
    size = SIZES[config.tiny]
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    console = common.console()
    sections = [_header(config, device)]
    engine: dict[tuple[str, int], float] = {}
    failed = []
    for part in (p for p in PARTS if p in config.parts):
        t0 = time.perf_counter()
        console.print(f"[bold]{part}[/bold] ...")
        if part != "learn" and _out_of_time(config, 60):
            body = f"## {part}\n\nSkipped: less than a minute was left before the deadline."
        else:
            try:
                if part in gpu_runs.PART_FNS:  # `onebox train` in a process; its folder
                    body = gpu_runs.PART_FNS[part](config, device, size, out)
                else:
                    body = PART_FNS[part](config, device, size, engine)
                if "\n**Failed: " in body:  # a row of it raised; the others are in the report
                    failed.append(part)
            except Exception:  # the report says it, and the other parts still run
                failed.append(part)
                trace = traceback.format_exc().strip().splitlines()[-12:]
                body = "\n".join([f"## {part}", "", "**Failed:**", "", "```", *trace, "```"])
                console.print(f"[red]{part} failed[/red]:\n" + "\n".join(trace))
        sections.append(f"{body}\n\n_{part}: {time.perf_counter() - t0:.0f} s of wall time._")
        (out / "report.md").write_text("\n\n".join(sections) + "\n")  # what is done survives
    console.print(f"wrote {out / 'report.md'}")
    if failed:
        console.print(f"[red]failed: {', '.join(failed)}[/red] (the report shows why)")
        return 1
    return 0


def _out_of_time(config: GpuBenchConfig, seconds: float) -> bool:
    """Whether less than `seconds` are left before the suite's deadline."""
    return config.deadline is not None and time.time() > config.deadline - seconds


def _attempt(label: str, failures: list[str], measure: Callable[..., Any], *args: Any) -> Any:
    """`measure(*args)`, or None with the end of its traceback added to `failures` (the
    report's lines), so that one row that raises costs its part only that row."""
    try:
        return measure(*args)
    except Exception:
        trace = traceback.format_exc().strip().splitlines()[-12:]
        failures += ["", f"**Failed: {label}**", "", "```", *trace, "```"]
        print(f"{label} failed:\n" + "\n".join(trace), file=sys.stderr)
        return None


def _skipped(labels: list[str]) -> list[str]:
    """The report's line for the rows of a part left out at the deadline (none: nothing)."""
    if not labels:
        return []
    return ["", f"Not run, the deadline being near: {'; '.join(labels)}."]


def _header(config: GpuBenchConfig, device: torch.device) -> str:
    machine = common.machine_info(("torch", "numpy", "gymnasium", "ale-py", "envpool"))
    lines = ["# onebox GPU suite", ""]
    if config.warning is not None and Path(config.warning).is_file():
        lines += [f"**{Path(config.warning).read_text().strip()}**", ""]
    if device.type != "cuda" and config.tiny:
        lines += [f"**Ran on {device}, not a GPU, at tiny sizes (`--tiny`): a check of the "
                  "pipeline. Its numbers measure nothing.**", ""]  # fmt: skip
    elif device.type != "cuda":
        lines += [f"**Ran on {device}, not a GPU: the inference call alone, on this CPU.**", ""]
    elif config.tiny:
        lines += [
            "**Tiny sizes (`--tiny`): a check of the pipeline; the numbers mean little.**",
            "",
        ]
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        machine["gpu"] = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, " + (
            f"{props.multi_processor_count} SMs, CUDA {torch.version.cuda}"
        )
        machine["driver"] = _nvidia_smi("driver_version")
    machine["cpu count"] = str(os.cpu_count())
    machine["load"] = f"{os.getloadavg()[0]:.1f} (1-minute load average at the start)"
    lines += [f"Date: {common.now()}", "", "Machine:", ""]
    lines += [f"- {k}: {v}" for k, v in machine.items()]
    lines += ["", f"Command: `{common.command_line('onebox bench gpu', config)}`"]
    if config.tests is not None and Path(config.tests).is_file():
        lines += ["", "## CUDA tests", "", "```", Path(config.tests).read_text().strip(), "```"]
    return "\n".join(lines)


def _nvidia_smi(field: str) -> str:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)  # fmt: skip
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown (no nvidia-smi)"


# ---- policy: the inference call ----------------------------------------------------------------


def part_policy(config: GpuBenchConfig, device: torch.device, size: dict, _: Any) -> str:
    from onebox.bench.inference import observations, policy_net
    from onebox.nn.accel import Accel

    rows = []
    for network in config.networks:
        for batch in size["batches"]:
            obs = torch.as_tensor(observations(network, batch, 0), device=device)
            eager = None
            variants = [("float32", False), ("float32", True)]
            if batch == max(size["batches"]):  # bf16 at the largest batch only: compiling is slow
                variants += [("bf16", False), ("bf16", True)]
            for precision, compiled in variants:
                net = policy_net(network, str(device))
                policy = Accel(device, precision, compiled).policy(net)  # type: ignore[arg-type]
                t0 = time.perf_counter()
                policy.act(obs)[0].cpu()
                first = time.perf_counter() - t0

                def call(k: int, policy: Any = policy, obs: torch.Tensor = obs) -> None:
                    for _ in range(k):
                        policy.act(obs)[0].cpu()  # the one host wait: fetching the actions

                rate = common.measure(call, 1, size["seconds"], warmup=0.5).rate
                eager = eager if eager is not None else rate
                keep(rows, [f"{network}, batch {batch}", precision,
                             "compiled" if compiled else "eager", f"{1e3 / rate:.3f} ms",
                             common.format_rate(rate * batch), common.format_ratio(rate / eager),
                             f"{first:.1f} s"])  # fmt: skip
    header = ["policy", "precision", "mode", "per call", "obs/s", "× eager float32", "first call"]
    return "\n".join([
        "## The inference call", "",
        f"An actor-critic acting on a batch already on {device}, its actions fetched to the "
        "host, per call (the mean over the measured window). Compiled: "
        "`--compile` (torch.compile; on CUDA in reduce-overhead mode, a CUDA graph). First "
        "call: its wall time, compilation included.", "",
        table(header, rows),
    ])  # fmt: skip


# ---- envs: the engine alone against EnvPool -----------------------------------------------------


def _engine(config: GpuBenchConfig, size: dict, n: int, names: tuple[str, ...]) -> list[Any]:
    from onebox.bench import envs

    task = envs.Task(ENV, n, config.env_threads)
    return [envs.measure_peer(p, task, size["seconds"], 0.5) for p in envs.select_peers(names)]


def part_envs(config: GpuBenchConfig, device: torch.device, size: dict, engine: dict) -> str:
    from onebox.bench import envs

    results = []
    for n in size["env_counts"]:
        results += _engine(config, size, n, ("onebox-sync", "onebox-async", "envpool"))
    for r in results:
        if r.rate is not None:
            engine[(r.peer.name, r.num_envs)] = r.rate
    header, rows = envs.table_rows(results)
    header.insert(3, "frames/s")
    for row, r in zip(rows, results, strict=True):
        row.insert(3, common.format_rate(FRAMES * r.rate) if r.rate else "-")
    return "\n".join([
        f"## {ENV}: the engine alone against EnvPool", "",
        f"{config.env_threads} threads for both; async backends receive num_envs/2 envs per "
        f"`recv`; random actions; {size['seconds']:g} s per measurement. Frames/s = "
        f"{FRAMES} × steps/s (frame skip 4).", "",
        table(header, rows),
    ])  # fmt: skip


# ---- train: SPS and time split ------------------------------------------------------------------


def part_train(config: GpuBenchConfig, device: torch.device, size: dict, engine: dict) -> str:
    from onebox.algos import appo
    from onebox.bench import train

    n = size["throughput_envs"]
    actors = size["appo_actors"]  # the throughput APPO: its actors hold n envs in all
    shape = (actors, n // actors)
    half = (actors // 2, 2 * n // actors)  # half as many actors, twice the envs a request
    # (label, mode, envs, precision, APPO's actors x envs, compiled, APPO's options), the rows
    # most wanted first (APPO's goal is the one still missed; PPO's throughput met it on three
    # leases): those past the deadline are left.
    runs = [("APPO, throughput", "appo", None, "float32", shape, False, {}),
            ("APPO, throughput, process actors", "appo", None, "float32", shape, False,
             {"process_actors": True}),
            ("APPO, throughput, process actors, server in its own process", "appo", None,
             "float32", shape, False, {"process_actors": True, "server_process": True}),
            ("APPO, throughput, process actors, 2 server processes", "appo", None, "float32",
             shape, False, {"process_actors": True, "server_process": True,
                            "server_processes": 2}),
            ("APPO, throughput, process actors, server in its own process, compiled", "appo",
             None, "float32", shape, True, {"process_actors": True, "server_process": True}),
            ("APPO, throughput, compiled", "appo", None, "float32", shape, True, {}),
            ("APPO, throughput, process actors, compiled", "appo", None, "float32", shape, True,
             {"process_actors": True}),
            ("APPO, throughput, half the actors with twice the envs", "appo", None, "float32",
             half, False, {}),
            ("APPO, throughput, 1 ms batching wait (--timeout-ms 1)", "appo", None, "float32",
             shape, False, {"timeout_ms": 1.0}),
            ("APPO, Atari preset", "appo", None, "float32", None, False, {}),
            ("PPO, throughput", "double", n, "float32", None, False, {}),
            ("PPO, throughput", "double", n, "bf16", None, False, {}),
            ("PPO, Atari preset", "sync", None, "float32", None, False, {}),
            ("PPO, Atari preset, compiled", "sync", None, "float32", None, True, {})]  # fmt: skip
    rows, skipped, failures = [], [], []
    with tempfile.TemporaryDirectory() as root:
        for k, (label, mode, num_envs, precision, shape, compiled, appo_options) in enumerate(runs):
            if (rows or failures) and _out_of_time(config, 30):
                skipped.append(f"{label} ({mode}, {precision})")
                continue
            bench = train.TrainBenchConfig(env=ENV, modes=(mode,), iterations=size["iterations"],
                                           num_envs=num_envs, num_steps=size["steps"],
                                           num_threads=config.env_threads,
                                           actors=shape and shape[0],
                                           envs_per_actor=shape and shape[1],
                                           device=str(device), precision=precision,
                                           compile=compiled, **appo_options)  # type: ignore[arg-type]  # fmt: skip
            r = _attempt(f"{label} ({mode}, {precision})", failures, train.measure, bench, mode,
                         Path(root) / str(k))  # fmt: skip
            if r is None:
                continue
            if mode == "appo":
                c = appo.resolve(appo.Config(env=ENV, total_steps=1, actors=bench.actors,
                                             envs_per_actor=bench.envs_per_actor))  # fmt: skip
                envs_total, peer = (c.actors or 1) * (c.envs_per_actor or 1), "onebox-async"
            else:
                envs_total = num_envs or 8
                peer = "onebox-async" if mode == "double" else "onebox-sync"
            alone = engine.get((peer, envs_total))
            if alone is None:
                alone = _engine(config, size, envs_total, (peer,))[0].rate
                engine[(peer, envs_total)] = alone
            share = r.sps / alone if alone else float("nan")
            split = ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(r.split.items()))
            keep(rows, [f"{label} ({mode}, {envs_total} envs)", precision, str(r.batch),
                         f"{r.sps:.0f}", f"{r.sps / r.batch:.2f}", split or "-",
                         "-" if r.lag is None else f"{r.lag:.1f}", r.server_text(),
                         r.actors_text(),
                         common.format_rate(alone),
                         f"{100 * share:.0f}%", "met" if share >= 0.6 else "missed"])  # fmt: skip
    header = ["run", "precision", "batch", "SPS", "updates/s", "time split", "policy lag",
              train.SERVER_HEADER, "actors' time", "engine alone", "SPS / engine",
              "goal >= 60%"]  # fmt: skip
    return "\n".join([
        f"## Training throughput, {ENV}", "",
        f"{size['iterations']} timed update(s) after one warm-up (`onebox bench train`); engine "
        f"alone: the same number of envs stepped by onebox ({config.env_threads} threads) with "
        "random actions, sync for the sync sampler, async otherwise. For APPO, SPS is also the "
        "inference server's rate and updates/s the learner's, measured together; its server: "
        "envs per policy call, a request's mean time in the server (waiting for its batch, "
        "then the call), the share of the time in policy calls, the shares of the calls' time "
        "in their parts (gather: requests joined onto the GPU; policy: its work queued; device: "
        "waiting for the outputs; answer: each request its rows) and the share of their host "
        "parts the server thread ran on a core (the rest: waiting for the GIL or a core; with "
        "2 server processes, busy is their mean); the actors' time: in their env pools, "
        "waiting for actions, waiting for the learner to take their unrolls, the rest of "
        "their loop (recording, waiting for the GIL).", "",
        table(header, rows), *_skipped(skipped), *failures,
    ])  # fmt: skip


# ---- inference server ---------------------------------------------------------------------------


def part_inference(config: GpuBenchConfig, device: torch.device, size: dict, _: Any) -> str:
    from onebox.bench import inference

    actors, envs = size["actors"], size["actor_envs"]
    bench = inference.InferenceBenchConfig(envs_per_actor=envs, seconds=size["seconds"],
                                           network="nature-cnn", device=str(device))  # fmt: skip
    rows = []
    for max_batch in sorted({actors * envs // 2, actors * envs}):
        r = inference.measure(bench, "thread", actors, max_batch)
        keep(rows, [str(max_batch), common.format_rate(r.env_steps_per_s),
                     common.format_rate(r.requests_per_s), f"{r.p50_ms:.2f} ms",
                     f"{r.p99_ms:.2f} ms", f"{r.mean_batch:.0f}"])  # fmt: skip
    header = ["max batch", "env steps/s", "requests/s", "p50", "p99", "mean batch"]
    return "\n".join([
        "## Inference server, Nature CNN", "",
        f"{actors} thread actors, each sending {envs} random Pong frames per request in a "
        f"closed loop, the server batching them on {device} (`onebox bench inference`).", "",
        table(header, rows),
    ])  # fmt: skip


# ---- evolve: population frames/s ----------------------------------------------------------------


def part_evolve(config: GpuBenchConfig, device: torch.device, size: dict, _: Any) -> str:
    from onebox.bench import evolve
    from onebox.nn.population import PopulationNet

    threads = config.env_threads
    group = size["slots"] // 2  # networks per forward call: one slot group's
    calls, failures = [], []
    for dtype in ("float32", "bfloat16"):
        bench = evolve.resolve(evolve.EvolveBenchConfig(
            env=ENV, population=size["population"], device=str(device), dtype=dtype,
            seconds=size["seconds"],
        ))  # fmt: skip
        auto = PopulationNet.conv_for(device, dtype)
        ms = {conv: _attempt(f"forward, {dtype}, {conv}", failures, evolve.forward_ms, bench,
                             group, conv)
              for conv in ("grouped", "im2col")}  # fmt: skip
        calls.append([dtype, *(f"{v:.2f} ms" if v is not None else "failed" for v in ms.values()),
                      auto])  # fmt: skip
    rows, skipped, params = [], [], 0
    # Two or three groups of `group` slots each, or two of half as many, their pools stepped in
    # turn or at once. A seeded reset (a ROM reload) costs about 270 Pong steps of CPU, and with
    # env seeds each env pays one per evaluation: half the slots, each env plays twice the
    # episodes per reset; twice the cap, each episode is twice as long (the population then
    # makes at most E*L / (E*L + 270) of env-only, E episodes of L steps per env: 82% for the
    # first row, 95% for the second, 90% for the third, whose pools are twice the second's;
    # docs/benchmarks.md). The rows most wanted first: a row takes 70-100 s, and those past the
    # deadline are left.
    cap = size["episode_cap"]
    for dtype, seeds, groups, turns, size_, cap_ in (
        ("float32", "env", 2, True, group, cap),
        ("float32", "env", 2, True, group // 2, 2 * cap),
        ("float32", "env", 2, True, group, 2 * cap),
        ("float32", "env", 2, False, group, cap),
        ("bfloat16", "env", 2, True, group, cap),
        ("float32", "pair", 2, True, group, cap),
        ("float32", "env", 3, True, group, cap),
    ):
        label = (f"{dtype}, {seeds} seeds, {groups} groups of {size_}, "
                 f"{'in turn' if turns else 'at once'}, episodes of {cap_} steps")  # fmt: skip
        if (rows or failures) and _out_of_time(config, 100):
            skipped.append(label)
            continue
        slots = size_ * groups
        bench = evolve.resolve(evolve.EvolveBenchConfig(
            env=ENV, population=size["population"], num_slots=(slots,),
            max_episode_steps=cap_, slot_groups=groups, num_threads=threads,
            pool_turns=turns, device=str(device), dtype=dtype, seconds=size["seconds"],
            episode_seeds=seeds,
        ))  # fmt: skip
        r = _attempt(label, failures, evolve.population_rate, bench, slots, True)
        if r is None:
            continue
        params, share = r.params, r.frames / r.env_only
        keep(rows, [dtype, seeds, f"{groups} of {size_}", "in turn" if turns else "at once",
                     str(cap_), common.format_rate(r.frames), common.format_rate(r.env_only),
                     common.format_rate(r.one_pool),
                     f"{100 * share:.0f}%", f"{100 * r.split.get('inference', 0.0):.0f}%",
                     f"{100 * r.split.get('params', 0.0):.0f}%",
                     f"{100 * r.split.get('other', 0.0):.0f}%",
                     f"{100 * r.split.get('turn', 0.0):.0f}%",
                     f"{100 * r.split.get('reset', 0.0):.0f}%", r.in_flight_text(),
                     "met" if share >= 0.9 else "missed"])  # fmt: skip
    header = ["precision", "episode seeds", "slot groups", "pools step", "episode cap",
              "population frames/s", "env-only frames/s", "one pool alone", "share",
              "inference share", "params share", "other share", "turn share", "reset share",
              "time with 0, 1, ... pools in flight", "goal >= 90%"]  # fmt: skip
    return "\n".join([
        f"## Evolution: {size['population']:,} Nature CNNs on {ENV}", "",
        f"`onebox bench evolve`: slot groups of {group} slots (two or three: "
        "`--slot-groups`, more pools in flight with network batches as large; or two of "
        f"{group // 2}: each env plays twice the episodes per seeded reset), each with its own "
        f"engine pool of {threads} threads, the pools stepped in turn (one at a time, with "
        "every core, while the other groups run their networks: `--pool-turns`, the default "
        "on a GPU) or at once, sharing the cores; each env step its own individual's network "
        f"({params:,} parameters) on {device}; episodes capped at {cap} steps (one row at "
        f"{2 * cap}: Pong's games with such networks last longer, so every episode is capped); "
        "env only: the same pools with random actions. Episode seeds `pair`: every episode "
        "starts with its own seeded reset, for which ALE reloads the ROM (fitnesses independent "
        "of K); `env`: one seeded reset per env per evaluation, the later episodes unseeded "
        "(`onebox evolve --episode-seeds env`). One pool alone: one group's pool stepped by "
        "itself with random actions, about the most pools stepped in turn can make. Shares of "
        "the evaluator's time: inference (the networks' forward, loading parameters into "
        "slots), params (waiting for the individuals' parameters, made ahead on a helper "
        "thread: here each a fresh random network, a slice of the shared noise table), other "
        "(the rest of the group's loop: bookkeeping, copies, waiting for the GIL), turn "
        "(waiting for the turn to step), reset (seeded resets); the env share is what is left. "
        "Pools in flight: the shares of the population run's time with 0, 1, 2, ... of the "
        "groups' pools stepping (sent, not yet received) or resetting.", "",
        table(header, rows), *_skipped(skipped), *failures, "",
        f"The population forward alone (`bench.evolve.forward_ms`): {group} networks (one slot "
        "group) each on its own observation already on the device, actions fetched to the host; "
        "conv layers as one grouped `conv2d` or as `unfold` + one `baddbmm` (im2col); auto: "
        "what `PopulationNet(conv='auto')` picks here.", "",
        table(["precision", "grouped", "im2col", "auto"], calls),
    ])  # fmt: skip


PART_FNS = {"policy": part_policy, "envs": part_envs, "train": part_train,
            "inference": part_inference, "evolve": part_evolve}  # fmt: skip
"""The parts measured in this process; the training runs' parts are `onebox.bench.gpu_runs`'."""
