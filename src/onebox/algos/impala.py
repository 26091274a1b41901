"""IMPALA (Espeholt et al. 2018) on the central inference server: actors and learner decoupled,
V-trace correcting for the policy lag.

    onebox train impala --env CartPole-v1 --actors 2

Actor threads each own an env pool. They only step envs: every step's observations go to the
`InferenceServer`, which batches all actors' requests into one forward pass of the current
network (SEED RL's central inference). Each actor cuts its stream into unrolls of `unroll` steps
that record the behaviour log-probabilities and the weights' version that chose each action, and
puts them on a bounded queue. The learner takes `batch_unrolls` unrolls at a time, recomputes
log-probabilities and values with the current weights, and minimises the V-trace policy-gradient
loss, the value loss against the V-trace targets and an entropy bonus; it updates the weights in
place under the server's version counter. Policy lag (learner version minus behaviour version)
is logged as `charts/policy_lag`.

Truncated episodes bootstrap from their final observation, valued by the learner's current
network, as `onebox.algos.vtrace` expects (`r + gamma * V(final obs)` with the end flag set).
"""

from __future__ import annotations

import copy
import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

import onebox.envs
from onebox import run
from onebox.algos.common import (
    check_positive,
    fill_preset,
    greedy_policy,
    open_run,
    parse_env_options,
    probe_env,
    resolve_device,
    seed_everything,
)
from onebox.algos.vtrace import vtrace
from onebox.nn.networks import ActorCritic
from onebox.sampling import EpisodeTracker
from onebox.sampling.inference import InferenceServer, InferResult

PRESETS: dict[str, dict[str, Any]] = {
    "classic": dict(
        total_steps=500_000, actors=2, envs_per_actor=8, unroll=20, batch_unrolls=2,
        learning_rate=2e-3, optimizer="adam", max_grad_norm=0.5,
    ),
    "atari": dict(
        total_steps=10_000_000, actors=4, envs_per_actor=8, unroll=20, batch_unrolls=4,
        learning_rate=6e-4, optimizer="rmsprop", max_grad_norm=40.0,
    ),
}  # fmt: skip
"""Per env family: IMPALA's Atari settings (32 env-unrolls of 20 steps per batch, RMSProp 6e-4,
grad clip 40), and a smaller, faster-learning setting for classic control."""


@dataclasses.dataclass
class Config:
    """Train an agent with IMPALA (V-trace). Fields left unset come from the env family's preset."""

    env: str = "CartPole-v1"
    """Env id (`onebox envs` lists them); discrete actions."""
    env_options: dict[str, str] = dataclasses.field(default_factory=dict)
    """The env's own options as KEY VALUE pairs, e.g. `--env-options stack_num 1`."""
    preset: Literal["auto", "classic", "atari"] = "auto"
    """Hyperparameter preset: `auto` picks by env (Atari or classic)."""
    total_steps: int | None = None
    """Env steps to train for (preset: 500k classic, 10M Atari)."""
    actors: int | None = None
    """Actor threads, each owning an env pool (preset: 2 classic, 4 Atari)."""
    envs_per_actor: int | None = None
    """Envs in each actor's pool (preset: 8)."""
    unroll: int | None = None
    """Steps per unroll (preset: 20)."""
    batch_unrolls: int | None = None
    """Unrolls per learner batch (preset: 2 classic, 4 Atari: 32 env-unrolls of 20 steps)."""
    learning_rate: float | None = None
    """Learning rate (preset: Adam 2e-3 classic, RMSProp 6e-4 Atari), linearly annealed."""
    optimizer: Literal["adam", "rmsprop"] | None = None
    """Optimizer (preset: adam classic; rmsprop with eps 0.01 for Atari, as IMPALA)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 over the run."""
    gamma: float = 0.99
    """Discount factor."""
    rho_bar: float = 1.0
    """V-trace clip of the importance weights in the value targets."""
    c_bar: float = 1.0
    """V-trace clip of the trace-cutting coefficients."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient (IMPALA's baseline cost)."""
    max_grad_norm: float | None = None
    """Gradient norm clip (preset: 0.5 classic, 40 Atari)."""
    queue_unrolls: int | None = None
    """Unrolls the actors may have waiting for the learner (default: 2 batches); bounds the lag."""
    inference: Literal["central", "local"] = "central"
    """`central`: every step's inference is batched across actors on the server (SEED RL);
    `local`: each actor runs its own copy of the network, synced from the learner every
    `sync_every` updates (IMPALA)."""
    sync_every: int = 1
    """With `--inference local`: learner updates between weight syncs to the actors."""
    max_batch: int = 1024
    """Inference server: most envs per forward pass."""
    timeout_ms: float = 1.0
    """Inference server: how long a request waits for others to join its batch."""
    num_threads: int = 1
    """Env pool threads per actor."""
    torch_threads: int | None = None
    """CPU threads for torch (default: 1 classic, physical cores Atari)."""
    seed: int = 1
    """Seed of the envs, the network initialization and the sampling."""
    device: str = "auto"
    """Torch device: `auto` (CUDA if present), `cpu`, `cuda`, ..."""
    runs_dir: str = "runs"
    """Where run folders are created."""
    name: str | None = None
    """Run folder name (default: env__impala__seed__time)."""
    checkpoint_minutes: float = 10.0
    """Save a checkpoint this often (and always at the end or on Ctrl-C); 0 = only at the end."""
    progress: bool | None = None
    """Show a progress bar (default: when stderr is a terminal)."""
    track: bool = False
    """Also log to Weights & Biases."""
    wandb_project: str = "onebox"
    """Weights & Biases project for `--track`."""

    @property
    def batch_size(self) -> int:
        """Env steps per learner batch."""
        assert self.unroll and self.batch_unrolls and self.envs_per_actor
        return self.unroll * self.batch_unrolls * self.envs_per_actor


def resolve(config: Config) -> Config:
    """Fill the preset and check every field; raise ValueError before any work starts."""
    env_kwargs = parse_env_options(config.env_options)
    if onebox.envs.backend_of(config.env) is None:
        onebox.envs.make(config.env)  # raises the unknown-id error with suggestions
    family, obs_space, act_space = probe_env(config.env, **env_kwargs)
    ActorCritic.check_spaces(obs_space, act_space)
    if family == "continuous":
        raise ValueError(f"impala here takes discrete actions; {config.env} has continuous ones")
    family = config.preset if config.preset != "auto" else family
    config = fill_preset(config, PRESETS[family])
    if config.preset == "auto":
        config = dataclasses.replace(config, preset=family)
    if config.torch_threads is None:
        threads = onebox.envs.physical_cores() if family == "atari" else 1
        config = dataclasses.replace(config, torch_threads=threads)
    if config.queue_unrolls is None:
        config = dataclasses.replace(config, queue_unrolls=2 * (config.batch_unrolls or 1))
    check_positive(config, "total_steps", "actors", "envs_per_actor", "unroll", "batch_unrolls")
    check_positive(config, "learning_rate", "max_grad_norm", "queue_unrolls", "max_batch")
    check_positive(config, "num_threads", "torch_threads", "rho_bar", "c_bar", "sync_every")
    if config.envs_per_actor > config.max_batch:  # type: ignore[operator]
        raise ValueError(
            f"--envs-per-actor ({config.envs_per_actor}) must be <= --max-batch ({config.max_batch})"
        )
    if not 0 <= config.gamma <= 1:
        raise ValueError(f"--gamma must be in [0, 1], got {config.gamma}")
    resolve_device(config.device)
    return config


# ---- actors -------------------------------------------------------------------------------------


@dataclasses.dataclass
class Unroll:
    """`unroll` steps of one actor's envs, (T, N, ...) arrays, and where it stops."""

    obs: np.ndarray
    actions: np.ndarray
    logprobs: np.ndarray
    rewards: np.ndarray
    ends: np.ndarray
    versions: np.ndarray
    next_obs: np.ndarray
    """The observations after the last step, to bootstrap from."""
    truncated: list[tuple[int, int, np.ndarray]]
    """(step, env, final observation) of each truncated (not terminated) episode end."""
    returns: list[float]
    lengths: list[int]


class Weights:
    """The learner's latest published weights, `(version, state_dict)`, for local inference."""

    def __init__(self, net: nn.Module, version: int) -> None:
        self.latest: tuple[int, dict[str, torch.Tensor]] = (version, {})
        self.publish(net, version)

    def publish(self, net: nn.Module, version: int) -> None:
        """Snapshot `net`'s weights as `version` (one atomic attribute swap)."""
        self.latest = (version, {k: v.detach().clone() for k, v in net.state_dict().items()})


class Actor(threading.Thread):
    """Steps its env pool with actions from the server (or its own synced copy of the network)
    and queues unrolls until stopped."""

    def __init__(
        self,
        index: int,
        config: Config,
        server: InferenceServer,
        out: queue.Queue,
        seed: int,
        weights: tuple[Weights, ActorCritic] | None = None,
    ) -> None:
        super().__init__(name=f"impala-actor-{index}", daemon=True)
        self.index, self.config, self.server, self.out, self.seed = index, config, server, out, seed
        self.weights = weights
        self.version = -1  # of the local network's weights
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.envs = make_envs(config, seed)

    def infer(self, ids: np.ndarray, obs: np.ndarray, dones: np.ndarray) -> InferResult:
        """Actions from the server, or from the local network after syncing its weights."""
        if self.weights is None:
            return self.server.infer(self.index, ids, obs, dones)
        weights, net = self.weights
        version, state = weights.latest
        if version != self.version:
            net.load_state_dict(state)
            self.version = version
        action, logprob, value = net.act(torch.as_tensor(obs, device=next(net.parameters()).device))
        return InferResult(
            action.cpu().numpy(), logprob.cpu().numpy(), value.cpu().numpy(), version
        )

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # handed to the learner, which raises it
            self.error = e
        finally:
            self.envs.close()

    def _loop(self) -> None:
        c, envs = self.config, self.envs
        t_len, n = c.unroll or 0, envs.num_envs
        ids = np.arange(n)
        tracker = EpisodeTracker(n)
        obs, _ = envs.reset(seed=self.seed)
        dones = np.ones(n, bool)
        while not self.stop.is_set():
            buf_obs = np.empty((t_len, *obs.shape), obs.dtype)
            actions = np.empty((t_len, n), np.int64)
            logprobs = np.empty((t_len, n), np.float32)
            rewards = np.empty((t_len, n), np.float32)
            ends = np.empty((t_len, n), bool)
            versions = np.empty((t_len, n), np.int64)
            truncated: list[tuple[int, int, np.ndarray]] = []
            for t in range(t_len):
                result = self.infer(ids, obs, dones)
                buf_obs[t] = obs
                actions[t], logprobs[t], versions[t] = (
                    result.actions,
                    result.logprobs,
                    result.version,
                )
                obs, reward, term, trunc, info = envs.step(result.actions)
                dones = np.logical_or(term, trunc)
                tracker.update(ids, reward, dones, info)
                rewards[t], ends[t] = reward, dones
                for i in np.flatnonzero(np.logical_and(trunc, np.logical_not(term))):
                    truncated.append((t, int(i), np.array(info["final_obs"][i])))
            returns, lengths = tracker.pop()
            unroll = Unroll(buf_obs, actions, logprobs, rewards, ends, versions, obs.copy(),
                            truncated, returns, lengths)  # fmt: skip
            while not self.stop.is_set():
                try:
                    self.out.put(unroll, timeout=0.1)
                    break
                except queue.Full:
                    continue


def make_envs(config: Config, seed: int, num_envs: int | None = None) -> Any:
    """One actor's env pool (same-step autoreset: final observations of truncated episodes)."""
    return onebox.envs.make(
        config.env,
        num_envs or config.envs_per_actor,
        num_threads=config.num_threads,
        seed=seed,
        autoreset_mode="SameStep",
        **parse_env_options(config.env_options),
    )


# ---- the learner --------------------------------------------------------------------------------


def make_agent(config: Config, envs: Any, device: torch.device) -> tuple[ActorCritic, Any]:
    net = ActorCritic(envs.single_observation_space, envs.single_action_space).to(device)
    if config.optimizer == "rmsprop":
        opt: Any = torch.optim.RMSprop(net.parameters(), lr=config.learning_rate or 0.0, eps=0.01)
    else:
        opt = torch.optim.Adam(net.parameters(), lr=config.learning_rate or 0.0, eps=1e-5)
    return net, opt


def stack(unrolls: list[Unroll], device: torch.device) -> dict[str, Any]:
    """Batch unrolls side by side: (T, B) tensors with B = unrolls x envs."""

    def cat(name: str) -> torch.Tensor:
        return torch.as_tensor(
            np.concatenate([getattr(u, name) for u in unrolls], 1), device=device
        )

    out = {k: cat(k) for k in ("obs", "actions", "logprobs", "rewards", "ends", "versions")}
    out["next_obs"] = torch.as_tensor(np.concatenate([u.next_obs for u in unrolls]), device=device)
    width = unrolls[0].actions.shape[1]
    out["truncated"] = [
        (t, k * width + i, o) for k, u in enumerate(unrolls) for t, i, o in u.truncated
    ]
    return out


def update(config: Config, net: ActorCritic, opt: Any, server: InferenceServer,
           batch: dict[str, Any]) -> dict[str, float]:  # fmt: skip
    """One V-trace gradient step on a batch of unrolls."""
    obs, actions = batch["obs"], batch["actions"]
    t_len, b = actions.shape
    lag = (server.version - batch["versions"]).float()  # learner version minus behaviour version
    dist, values = net.dist(obs.flatten(0, 1))
    logprobs = net.log_prob(dist, actions.flatten()).view(t_len, b)
    values = values.view(t_len, b)
    entropy = net.entropy(dist).mean()
    rewards = batch["rewards"].clone()
    with torch.no_grad():
        bootstrap = net.value(batch["next_obs"])
        if batch["truncated"]:
            final = torch.as_tensor(np.stack([o for _, _, o in batch["truncated"]]))
            v_final = net.value(final.to(obs.device))
            for k, (t, i, _) in enumerate(batch["truncated"]):
                rewards[t, i] += config.gamma * v_final[k]
    vt = vtrace(
        logprobs.detach() - batch["logprobs"], rewards, values.detach(), batch["ends"],
        bootstrap, config.gamma, config.rho_bar, config.c_bar,
    )  # fmt: skip
    pg_loss = -(vt.advantages * logprobs).mean()
    v_loss = 0.5 * ((vt.vs - values) ** 2).mean()
    loss = pg_loss + config.vf_coef * v_loss - config.ent_coef * entropy
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(net.parameters(), config.max_grad_norm or 0.0)
    with server.updating():
        opt.step()
    return {
        "losses/policy_loss": pg_loss.item(),
        "losses/value_loss": v_loss.item(),
        "losses/entropy": entropy.item(),
        "losses/mean_rho": vt.rhos.mean().item(),
        "charts/policy_lag": lag.mean().item(),
        "charts/policy_lag_max": lag.max().item(),
        "charts/learning_rate": opt.param_groups[0]["lr"],
    }


def train(config: Config, resume: Path | None = None) -> Path:
    """Train (or, with `resume`, continue the run in that folder); return the run folder."""
    return train_async(config, resume, "impala", resolve, update)


UpdateFn = Callable[[Any, ActorCritic, Any, InferenceServer, dict[str, Any]], dict[str, float]]
"""(config, net, optimizer, server, batch) -> stats: one learner step on a batch of unrolls."""


def train_async(
    config: Config,
    resume: Path | None,
    algo: str,
    resolve_fn: Callable[[Any], Any],
    update_fn: UpdateFn,
) -> Path:
    """The actor-learner loop shared by IMPALA and APPO: actor threads on the inference server
    feed unrolls to `update_fn`; the run folder, logs, checkpoints and resume as PPO's."""
    config, run_dir, state = open_run(config, resume, algo, resolve_fn)
    assert config.total_steps is not None and config.actors is not None
    device = resolve_device(config.device)
    seed_everything(config.seed)
    torch.set_num_threads(config.torch_threads or 1)
    with make_envs(config, config.seed, num_envs=1) as probe:
        net, opt = make_agent(config, probe, device)
        obs_space, act_space = probe.single_observation_space, probe.single_action_space
    updates, global_step, elapsed = 0, 0, 0.0
    if state is not None:
        net.load_state_dict(state["net"])
        opt.load_state_dict(state["optimizer"])
        updates, global_step, elapsed = state["updates"], state["global_step"], state["elapsed"]
        run.set_rng_state(state["rng"])
    num_updates = max(1, config.total_steps // config.batch_size)
    # Env states cannot be saved: on resume the envs restart with seeds no earlier run used.
    seed0 = config.seed + 10_000 * updates

    # A batch is full once every actor has asked: no actor then waits out the timeout.
    n = config.envs_per_actor or 1
    max_batch = min(config.max_batch, config.actors * n)
    server = InferenceServer(net.act, obs_space, act_space, max_batch, config.timeout_ms, device)
    server.version = updates
    unrolls: queue.Queue[Unroll] = queue.Queue(maxsize=config.queue_unrolls or 1)
    weights = Weights(net, updates) if config.inference == "local" else None
    actors = [
        Actor(a, config, server, unrolls, seed0 + a * n,
              (weights, copy.deepcopy(net)) if weights is not None else None)
        for a in range(config.actors)
    ]  # fmt: skip
    logger = run.Logger(run_dir, start_step=global_step, elapsed=elapsed, track=config.track,
                        project=config.wandb_project, config=config)  # fmt: skip
    checkpointer = run.Checkpointer(run_dir, config.checkpoint_minutes)
    split = run.TimeSplit()

    def save() -> None:
        logger.flush()
        checkpointer.save({
            "net": net.state_dict(), "optimizer": opt.state_dict(), "updates": updates,
            "global_step": global_step, "elapsed": logger.elapsed(), "rng": run.rng_state(),
        })  # fmt: skip

    start_time, start_step = time.perf_counter(), global_step
    with (
        run.Progress(config.total_steps, start_step=global_step, enabled=config.progress,
                     description=f"{algo} {config.env}") as progress,
        run.GracefulInterrupt() as interrupt,
    ):  # fmt: skip
        try:
            for actor in actors:
                actor.start()
            while updates < num_updates and not interrupt.requested:
                if config.anneal_lr:
                    opt.param_groups[0]["lr"] = (1 - updates / num_updates) * config.learning_rate
                batch = []
                with split("wait"):
                    while len(batch) < (config.batch_unrolls or 1):
                        try:
                            batch.append(unrolls.get(timeout=1.0))
                        except queue.Empty:
                            for actor in actors:
                                if actor.error is not None:
                                    raise RuntimeError(f"{actor.name} failed") from actor.error
                with split("learn"):
                    stats = update_fn(config, net, opt, server, stack(batch, device))
                updates += 1
                if weights is not None and updates % config.sync_every == 0:
                    weights.publish(net, server.version)
                global_step += config.batch_size
                returns = [r for u in batch for r in u.returns]
                if returns:
                    logger.episodes(global_step, returns, [x for u in batch for x in u.lengths])
                stats["charts/SPS"] = (global_step - start_step) / (
                    time.perf_counter() - start_time
                )
                stats.update({f"time/{k}": v for k, v in split.fractions().items()})
                logger.scalars(global_step, stats)
                progress.update(global_step, logger.recent_return)
                if checkpointer.due():
                    save()
            save()
        finally:
            for actor in actors:
                actor.stop.set()
            server.close()
            for actor in actors:
                actor.join()
            logger.close()
    run.plot_curves(run_dir)
    return run_dir


def resume(run_dir: Path) -> Path:
    """Continue the run in `run_dir` from its last checkpoint."""
    return train(run.load_config(run_dir, Config), resume=run_dir)


def load_policy(run_dir: Path, config: Config, device: str = "cpu") -> Any:
    """The trained policy of a run: a batch of observations -> a batch of greedy actions."""
    state = run.load_checkpoint(run_dir)
    with make_envs(config, config.seed, num_envs=1) as probe:
        net, _ = make_agent(config, probe, torch.device(device))
    net.load_state_dict(state["net"])
    return greedy_policy(net, device)
