"""The config fields every run shares, each defined once with its docstring (the CLI's help).

    RunConfig      every run: `onebox train` learners and `onebox evolve`
    TrainConfig    + the env's options: every learner
    TorchConfig    + torch's device, threads and determinism: every learner but A3C (whose
                   Hogwild workers share one model in CPU memory, one torch thread each)

A learner's `Config` inherits one of them and adds its own fields. A subclass may narrow a
field's type or change its default by declaring it again without a docstring (it keeps this
one): every learner narrows `preset` to a `Literal` of its env families.

A field whose default is None is left for the learner's `resolve` to fill (from the env
family's preset, or from the machine: thread counts), so that a resolved config has no holes
(`unresolved`); the few whose None is a value of its own (no LSTM, no gradient clip, the run
folder's default name) are named in the class's `OPTIONAL`.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, ClassVar

import tyro

Switch = Annotated[bool, tyro.conf.FlagConversionOff]
"""A bool the command line takes as a value, `--anneal-lr True` or `False`, for every learner
alike (also where a preset fills it: `Switch | None`)."""


def unresolved(config: Any) -> list[str]:
    """The fields of `config` still None that its `resolve` should have filled: those whose
    default is None, less the `OPTIONAL` ones of its class and its bases."""
    optional = set().union(*(vars(c).get("OPTIONAL", ()) for c in type(config).__mro__))
    return [f.name for f in dataclasses.fields(config)
            if f.default is None and getattr(config, f.name) is None and f.name not in optional]  # fmt: skip


@dataclasses.dataclass
class RunConfig:
    """The fields of every run."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"name", "progress"})
    """Fields whose None is a value of its own (see the module's docstring)."""

    env: str = "CartPole-v1"
    """Env id (`onebox envs` lists them)."""
    preset: str = "auto"
    """Hyperparameter preset, one per env family: `auto` picks the env's family (Atari, MinAtar,
    MuJoCo or continuous actions, else classic)."""
    seed: int = 1
    """Seed of everything random in the run: envs, network initialization, exploration and
    sampling."""
    runs_dir: str = "runs"
    """Where run folders are created."""
    name: str | None = None
    """Run folder name (default: ENV__ALGO__SEED__TIME)."""
    checkpoint_minutes: float = 10.0
    """Save a checkpoint this often (and always at the end or on Ctrl-C); 0 = only at the end."""
    progress: bool | None = None
    """Show a progress bar (default: when stderr is a terminal)."""
    track: bool = False
    """Also log to Weights & Biases."""
    wandb_project: str = "onebox"
    """Weights & Biases project for `--track`."""


@dataclasses.dataclass
class TrainConfig(RunConfig):
    """The fields of every learner of `onebox train`."""

    env_options: dict[str, str] = dataclasses.field(default_factory=dict)
    """The env's own options as KEY VALUE pairs, e.g. `--env-options stack_num 1`."""
    log_every: int | None = None
    """Env steps between two logs of the losses, learning rate, SPS and time split: they are
    logged at the end of the first step past each multiple, and at the run's end (default: the
    learner's: every update for PPO, PQN, IMPALA and APPO, 100 updates for A2C, 1,000 env steps
    for the others). Finished episodes are always logged as they come."""
    anneal_lr: Switch = False
    """Anneal the learning rate (every learning rate the learner has) linearly to 0 over the
    run's env steps."""


@dataclasses.dataclass
class TorchConfig(TrainConfig):
    """The fields of every learner that runs its networks on a device of its choice."""

    device: str = "auto"
    """Torch device: `auto` (CUDA if present), `cpu`, `cuda`, `cuda:1`, ..."""
    torch_threads: int | None = None
    """CPU threads for torch (default: the physical cores for Atari's CNNs on a CPU, else 1:
    small ops only lose from more, and beside a GPU more only take cores from the envs)."""
    torch_deterministic: bool = True
    """Deterministic cuDNN kernels."""
