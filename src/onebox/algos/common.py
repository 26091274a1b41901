"""What every learner shares: device choice, seeding, env options from the command line, env
families, config checks and the greedy policies of `onebox eval`."""

from __future__ import annotations

import ast
import dataclasses
import random
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch

import onebox.envs
from onebox.nn.accel import resolve_device
from onebox.run.config import TorchConfig
from onebox.run.presets import Presets

Family = Literal["classic", "atari", "continuous", "minatar"]


def torch_threads(family: str, device: str) -> int:
    """Torch's CPU threads when a config leaves them out: the physical cores for Atari's CNNs on
    a CPU, else 1. Small networks only lose from more; with the networks on a GPU, more would
    only take cores from the env threads (idle OpenMP threads spin before they sleep)."""
    if family == "atari" and resolve_device(device).type == "cpu":
        return onebox.envs.physical_cores()
    return 1


def fill_threads(config: Any, family: str) -> Any:
    """`config` with the thread counts it left None: env threads, the physical cores (shared
    among the actors, for a learner that has them), and `torch_threads`."""
    if config.num_threads is None:
        actors = getattr(config, "actors", 1)  # a learner without actors has one pool
        threads = max(1, onebox.envs.physical_cores() // actors)
        config = dataclasses.replace(config, num_threads=threads)
    if config.torch_threads is None:
        config = dataclasses.replace(config, torch_threads=torch_threads(family, config.device))
    return config


def seed_everything(seed: int, deterministic: bool = True) -> None:
    """Seed Python, numpy and torch; optionally make cuDNN deterministic."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = deterministic


def setup_torch(config: TorchConfig) -> torch.device:
    """Seed everything and set torch's threads as `config` says; return its device."""
    device = resolve_device(config.device)
    seed_everything(config.seed, config.torch_deterministic)
    torch.set_num_threads(config.torch_threads)
    return device


def fill_log_every(config: Any, default: int) -> Any:
    """`config` with `log_every` (env steps between two logs) set to the learner's `default`
    where the user left it unset; ValueError if it is not positive."""
    if config.log_every is None:
        config = dataclasses.replace(config, log_every=default)
    check_positive(config, "log_every")
    return config


def parse_env_options(options: dict[str, str]) -> dict[str, Any]:
    """Command-line env options ("KEY VALUE" strings) to Python values: numbers, booleans and
    quoted strings as Python literals, anything else as the string itself."""
    out: dict[str, Any] = {}
    for key, text in options.items():
        try:
            out[key] = ast.literal_eval(text) if isinstance(text, str) else text
        except (ValueError, SyntaxError):
            out[key] = text
    return out


def probe_env(env_id: str, **env_kwargs: Any) -> tuple[Family, Any, Any]:
    """An env's preset family (Atari by backend, MinAtar by its `MinAtar/` ids, else continuous or
    classic by its actions) and its single observation and action spaces, from a one-env probe,
    which also checks the env's options: bad ones, or an env that cannot be made, raise
    ValueError."""
    try:
        probe = onebox.envs.make(env_id, num_envs=1, num_threads=1, **env_kwargs)
    except TypeError as e:  # an unknown option or one of the wrong type
        raise ValueError(str(e)) from None
    except RuntimeError as e:  # a worker process could not make the env (a missing dependency)
        raise ValueError(str(e).splitlines()[0]) from None
    with probe:
        obs_space, act_space = probe.single_observation_space, probe.single_action_space
    if onebox.envs.backend_of(env_id) == "atari":
        return "atari", obs_space, act_space
    if env_id.startswith("MinAtar/"):
        return "minatar", obs_space, act_space
    return ("continuous" if hasattr(act_space, "low") else "classic"), obs_space, act_space


def check_positive(config: Any, *names: str) -> None:
    """Raise ValueError naming the first of `names` that is not a positive number."""
    for name in names:
        value = getattr(config, name)
        if value is None or value <= 0:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be positive, got {value}")


def check_lstm(lstm: int | None) -> None:
    """Raise ValueError unless `lstm` (an LSTM core's size) is None or positive."""
    if lstm is not None and lstm < 1:
        raise ValueError(
            f"--lstm is the LSTM core's size and must be positive, got {lstm}; leave it unset "
            "for a feed-forward net"
        )


Policy = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""`policy(obs, starts) -> actions` for a batch of envs; `starts[i]`: obs[i] begins an episode."""


def greedy_policy(
    net: Any,
    device: torch.device | str,
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Policy:
    """A trained `ActorCritic` as `onebox eval` plays it: the mode of its action distribution.

    A recurrent net keeps its LSTM state between calls, zeroed for the envs `starts` flags.
    `transform` maps observations first (e.g. a frozen observation normalizer)."""
    net.eval()
    state: list[Any] = [None]

    def policy(obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
        x = torch.as_tensor(transform(obs) if transform is not None else obs, device=device)
        if state[0] is None:
            state[0] = net.initial_state(len(obs), device)
        starts_t = torch.as_tensor(np.asarray(starts, np.bool_), device=device)
        action, _, _, state[0] = net.step(x, starts_t, state[0], deterministic=True)
        return action.cpu().numpy()

    return policy


SpaceCheck = Callable[[Any, Any], Any]
"""(observation space, action space) -> raises ValueError when a learner cannot take them."""


def resolve_env(config: Any, presets: Presets, check_spaces: SpaceCheck) -> Any:
    """What every learner's config resolution starts with: check the env, its options and its
    spaces (`check_spaces`), fill the env family's preset (or `config.preset`'s) into the fields
    left None, pick thread counts, and check total_steps, num_envs, gamma and the device; raise
    ValueError on bad input."""
    env_kwargs = parse_env_options(config.env_options)
    if onebox.envs.backend_of(config.env) is None:
        onebox.envs.make(config.env)  # raises the unknown-id error with suggestions
    family, obs_space, act_space = probe_env(config.env, **env_kwargs)
    check_spaces(obs_space, act_space)
    family = config.preset if config.preset != "auto" else family
    config = presets.fill(config, family)
    config = fill_threads(config, family)
    check_positive(config, "total_steps", "num_envs", "torch_threads")
    if not 0 <= config.gamma <= 1:
        raise ValueError(f"--gamma must be in [0, 1], got {config.gamma}")
    resolve_device(config.device)
    return config


def adam(params: Any, lr: float, device: torch.device, **kwargs: Any) -> torch.optim.Adam:
    """Adam, with torch's fused kernel on CPU and CUDA: one pass over all parameters per step
    instead of about ten tensor ops per parameter (the same update up to float rounding)."""
    fused = True if device.type in ("cpu", "cuda") else None
    return torch.optim.Adam(params, lr=lr, fused=fused, **kwargs)


def greedy_q_policy(
    q: Callable[[torch.Tensor], torch.Tensor], device: torch.device | str
) -> Policy:
    """A trained Q-network as `onebox eval` plays it: the action of highest Q."""

    @torch.no_grad()
    def policy(obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
        return q(torch.as_tensor(obs, device=device)).argmax(-1).cpu().numpy()

    return policy
