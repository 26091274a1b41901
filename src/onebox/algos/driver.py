"""The driver: runs any learner's trainer (`onebox.algos.trainer`) as a run, and owns what every
run does the same way.

    run_dir = driver.train(ppo.Config(env="CartPole-v1"))      # or train(config, resume=RUN)
    policy = driver.load_policy(run_dir, run.load_config(run_dir))

A learner module (`onebox.algos.ppo`, ...) has `Config`, `resolve(config)` and `Trainer` (its
family's trainer with its learner); the driver finds it from the config's class. Written here
once, for every learner:

- the run session (`onebox.run.RunSession`): run folder, config.json, logs, progress bar,
  checkpoints every `--checkpoint-minutes`, Ctrl-C, curve, resume;
- schedules: with `--anneal-lr` each of the learner's learning rates falls linearly to 0 over
  the run's env steps (the driver sets the run's progress before every step that a schedule
  reads);
- seeding: the trainer seeds its envs from the run's `EnvSeeds`, whose count the checkpoint
  keeps, so a resumed run's envs start with seeds no earlier episode used;
- logging: finished episodes as they come; the stats of the newest update with the learning
  rates (`charts/learning_rate`, CleanRL's key), the trainer's own charts, SPS and the time
  split at the end of the first step past each multiple of `--log-every` env steps, and at
  the run's end;
- replay: with `--save-replay` the trainer's replay table is saved beside each checkpoint and
  a resumed run continues with it; without, a resumed run refills it and says so.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

import onebox.envs
from onebox import run
from onebox.algos.common import parse_env_options
from onebox.algos.trainer import ANNEAL, EnvSeeds, Learner, Step, Trainer
from onebox.run.config import unresolved
from onebox.run.presets import learner_name

REPLAY_FILE = "replay.npz"
"""The replay table saved beside the checkpoint with `--save-replay`."""
CHECKPOINT_KEYS = ("learner", "trainer", "env_seeds")
"""What a learner's checkpoint holds besides the session's counters: the learner's name, the
trainer's state and the env seeds handed out."""


def learner_module(config: Any) -> ModuleType:
    """The module of the learner whose config this is (it defines `Config`, `resolve` and
    `Trainer`)."""
    return importlib.import_module(type(config).__module__)


def train(config: Any, resume: Path | None = None) -> Path:
    """Train (or, with `resume`, continue the run in that folder, `config` then being its
    stored one); return the run folder. Bad input raises ValueError before anything is
    written."""
    module, name = learner_module(config), learner_name(type(config))
    session = run.RunSession.open(config, resume, name, module.resolve, keys=CHECKPOINT_KEYS)
    config, state = session.config, session.checkpoint
    holes = unresolved(config)
    if holes:  # a bug of the learner's resolve, not of the user's input
        raise RuntimeError(f"{name}'s resolve left {', '.join(holes)} unset")
    if state is not None:
        check_learner(state, name, session.run_dir)
    seeds = EnvSeeds(config.seed, int(state["env_seeds"]) if state is not None else 0)
    trainer = make_trainer(module, config, seeds)  # envs and networks: still nothing written
    try:
        refilled: str | None = None
        if state is not None:
            trainer.load_state_dict(state["trainer"])
            if trainer.replay is not None and not load_replay(
                config, session.run_dir / REPLAY_FILE, trainer.replay
            ):
                refilled = trainer.refill()
        session.timer = trainer.timer
        trainer.interrupted = lambda: session.stopping  # type: ignore[method-assign]

        def checkpoint() -> dict[str, Any]:
            if trainer.replay is not None and config.save_replay:  # first: never older than it
                trainer.replay.save(session.run_dir / REPLAY_FILE)
            return {"learner": name, "trainer": trainer.state_dict(), "env_seeds": seeds.used}

        with session.start(checkpoint, total=trainer.total_steps), trainer:
            for note in trainer.notes():
                session.logger.note(trainer.global_step, note)
            if refilled is not None:
                session.logger.note(trainer.global_step, "resumed without a saved replay buffer "
                                    f"(train with --save-replay to keep it): {refilled}")  # fmt: skip
            _loop(session, config, trainer)
    finally:
        trainer.close()
    return session.run_dir


def make_trainer(module: ModuleType, config: Any, seeds: EnvSeeds, **parts: Any) -> Trainer:
    """The learner module's trainer for a resolved `config`, its envs seeded from `seeds`, its
    learning rates annealed when `config.anneal_lr` says (nothing started yet); `parts`: what
    its trainer takes besides (an on-policy trainer's `lane`, `onebox.pbt.shared`)."""
    trainer: Trainer = module.Trainer(config, seeds, **parts)
    if config.anneal_lr:
        for rate in trainer.learner.learning_rates:
            trainer.hp.schedule(rate, ANNEAL)
    return trainer


def advance(trainer: Trainer) -> Step:
    """One step of `trainer`, its schedules read at the run's progress before it."""
    schedule(trainer)
    return trainer.step()


def schedule(trainer: Trainer) -> None:
    """Set `trainer`'s scheduled hyperparameters to their values at the run's progress."""
    if trainer.hp.scheduled:
        trainer.hp.progress = trainer.global_step / trainer.total_steps


class Cadence:
    """When to log a trainer's stats: at the end of the first step past each multiple of
    `every` env steps, and at the run's end."""

    def __init__(self, every: int) -> None:
        self.every, self.logged = every, -1

    def due(self, before: int, step: int, last: bool) -> bool:
        """Whether a step from `before` to `step` env steps (`last`: the run's last) logs."""
        if step // self.every > before // self.every or (last and self.logged != step):
            self.logged = step
            return True
        return False


def charts(trainer: Trainer, stats: dict[str, float]) -> dict[str, float]:
    """What the driver logs with an update's `stats`: the learning rates, the update count and
    the trainer's own charts."""
    return {**stats, **lr_charts(trainer.learner), "charts/updates": trainer.updates,
            **trainer.charts()}  # fmt: skip


def _loop(session: run.RunSession, config: Any, trainer: Trainer) -> None:
    """Step the trainer until the run is done or stopped, logging as the module says."""
    cadence = Cadence(config.log_every)
    stats: dict[str, float] = {}
    while not trainer.done and not session.stopping:
        before = trainer.global_step
        result = advance(trainer)
        stats = result.stats or stats
        step = trainer.global_step
        session.episodes(step, result.returns, result.lengths)
        if stats and cadence.due(before, step, trainer.done or session.stopping):
            session.log(step, {**charts(trainer, stats), **session.rates(step)})
        session.update(step)
    last = trainer.finish()
    session.episodes(trainer.global_step, last.returns, last.lengths)
    if last.stats:
        session.log(trainer.global_step, last.stats)
    session.step = trainer.global_step


def check_learner(state: dict[str, Any], name: str, run_dir: Path) -> None:
    """Raise ValueError unless the checkpoint `state` was written by the learner `name`."""
    if state["learner"] != name:
        raise ValueError(
            f"{Path(run_dir) / 'checkpoint.pt'} was written by {state['learner']!r}, not by "
            f"{name!r} as this run's config.json says (copied from another run?)"
        )


def lr_charts(learner: Learner) -> dict[str, float]:
    """The learner's learning rates as the last update used them: `charts/learning_rate`
    (CleanRL's key), or `charts/<field>` for a learner with several (SAC's)."""
    return {f"charts/{name}": getattr(learner.hp, name) for name in learner.learning_rates}


def load_replay(config: Any, path: Path, replay: Any) -> bool:
    """On resume: load the replay table saved at `path` beside the checkpoint with
    `--save-replay` into `replay`; False if there is none (the run then refills it)."""
    if config.save_replay and path.exists():
        replay.resume_from(path)
        return True
    return False


def probe_spaces(config: Any) -> tuple[Any, Any]:
    """The single observation and action spaces of the run's env (a one-env pool)."""
    with onebox.envs.make(config.env, 1, num_threads=1, seed=config.seed,
                          autoreset_mode="SameStep",
                          **parse_env_options(config.env_options)) as probe:  # fmt: skip
        return probe.single_observation_space, probe.single_action_space


def load_policy(run_dir: Path, config: Any, device: str = "cpu") -> Any:
    """The trained policy of a run, as `onebox eval` plays it: `policy(obs, starts) ->
    actions` for a batch of envs (greedy; a recurrent one carries its state between calls)."""
    state = run.load_checkpoint(run_dir, keys=CHECKPOINT_KEYS)
    check_learner(state, learner_name(type(config)), run_dir)
    return greedy(learner_module(config), config, state["trainer"]["learner"], device)


def greedy(module: ModuleType, config: Any, state: dict[str, Any], device: str = "cpu") -> Any:
    """The greedy policy of the learner of `module` (a learner module) made from `config` with
    the learner state `state` (as `load_policy`)."""
    learner: Learner = module.Trainer.make_learner(config, *probe_spaces(config),
                                                   torch.device(device))  # fmt: skip
    learner.load_state_dict(state)
    return learner.greedy(torch.device(device))
