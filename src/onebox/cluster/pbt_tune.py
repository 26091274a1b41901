"""Population-based training on a Ray cluster: each member a Ray Tune trial (`Member`, a
`tune.Trainable` around the learner's onebox trainer) under Tune's own `PopulationBasedTraining`
scheduler; no scheduler of onebox's.

    onebox pbt ppo --env MinAtar/Breakout-v1 --population 16 --ray HOST:PORT

A trial's `step` trains its member to the next multiple of `--ready` env steps and reports its
objective (the mean return of its last `--objective-episodes` episodes since it last copied);
Tune ranks the trials by it, and an exploit restores a trial from the parent's checkpoint
(`save_checkpoint`: the trainer's whole state) then sets the explored hyperparameters, so the
child runs on with the parent's weights and optimizer state and its own new hyperparameters
(not the stale-weights exploit of ray-project/ray#28509). Every trial checkpoints after each
step; a trial whose node is lost restarts from its last checkpoint on another node (Tune's
`FailureConfig`), the other members going on.

Every checkpoint of every trial is kept (a member that lags may exploit a checkpoint its parent
saved several steps before; a bounded `num_to_keep` would delete it under the exploit, as Tune's
users found in ray#8441): the run folder grows by a member's state per member and ready interval.

Tune explores as it does: a value times a factor of `--perturb` or a fresh draw from the range
(a discount's factor applies to the value itself here, not to 1 - x as in one process), then
kept in the range. Its experiment lives in the run folder's `tune/` (on a cluster of several
machines, the run folder must be on storage every node reaches); at the end the run folder gets
what a run in one process has: `metrics.csv` with a member column, `lineage.json` (from the
copies its trials report), the plots and a population checkpoint for `onebox eval RUN
--member i`.
"""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from onebox.algos import driver
from onebox.algos.trainer import EnvSeeds, Range, Trainer
from onebox.pbt.configs import learner_module, member_config
from onebox.pbt.population import objective, state_hash
from onebox.run.checkpoint import plain

MEMBER_FILE = "member.pt"
SEED_BLOCK = 10_000_019
"""Member i's envs draw their seeds from the run's seed + i x this: trials in other processes
share no counter, so each member has a block of its own ..."""
SEEDS_PER_START = 10_000
"""... in which each start of its trainer (at iteration k: a restart after a lost node, or an
exploit) takes the seeds from k x this on, so no two starts replay an episode's seed."""
EXPERIMENT = "tune"
"""The Tune experiment's folder inside the run folder."""


def member_index(trial_id: str) -> int:
    """A trial's member: Tune numbers its trials in the order it made them (`..._00003`)."""
    return int(trial_id[-5:])


class Member:
    """A population member as a Tune trial (the class `trainable()` makes a `tune.Trainable`
    of, so that this module imports without Ray). Each trial has a process of its own: Tune
    restarts a paused trial (an exploit) in a new one, which builds the trainer (its envs take
    fresh seeds, see `SEEDS_PER_START`) and loads the checkpoint Tune restored (the trial's own
    or its parent's). Tune's `reuse_actors`, which hands a paused trial's process to another,
    is off: Ray 2.60 fails a trial outright, without the retries of `FailureConfig`, when the
    process it reuses died with its node (`TuneController._schedule_trial_reset` reports the
    failure of a PENDING trial, which `_process_trial_failure` never recovers)."""

    config: dict[str, Any]
    trial_id: str
    iteration: int

    def setup(self, config: dict[str, Any]) -> None:
        self.config, self.pbt = config, config["pbt"]
        self.module = learner_module(self.pbt)
        self.index = member_index(self.trial_id)
        self.trainer: Trainer | None = None
        self.pending: dict[str, Any] | None = None
        self.window: collections.deque[float] = collections.deque(
            maxlen=self.pbt.objective_episodes
        )
        self.restored: dict[str, Any] = {}

    def _ready(self) -> Trainer:
        """The trainer, built at the trial's first step in this process, with the checkpoint
        Tune restored loaded and the trial's hyperparameters set."""
        if self.trainer is None:
            first = self.pbt.seed + self.index * SEED_BLOCK + self.iteration * SEEDS_PER_START
            config = member_config(self.pbt, self.index)
            self.trainer = driver.make_trainer(self.module, config, EnvSeeds(first))
            self.trainer.start()
        state, self.pending = self.pending, None
        if state is not None:
            self.trainer.load_state_dict(state["trainer"])
            self.window.clear()
            if int(state["member"]) == self.index:
                self.window.extend(state["window"])
            self.restored = {"restored_from": int(state["member"]),
                             "restored_step": int(state["trainer"]["global_step"]),
                             "restored_hash": state_hash(state["trainer"]["learner"])}  # fmt: skip
        self.trainer.hp.set(**{name: float(self.config[name]) for name in self.config["space"]})
        return self.trainer

    def step(self) -> dict[str, Any]:
        """Train to the next ready point; the row reported (and appended to the member's
        `member-K.jsonl`): steps, objective, episodes, hyperparameters, the learner's state
        hash, the Ray node that ran it, and after a restore whose state it loaded."""
        import ray

        trainer = self.trainer if self.trainer is not None and self.pending is None else (
            self._ready())  # fmt: skip
        ready = self.pbt.ready
        until = (trainer.global_step // ready + 1) * ready
        returns: list[float] = []
        lengths: list[int] = []
        while trainer.global_step < until and not trainer.done:
            result = driver.advance(trainer)
            returns += result.returns
            lengths += result.lengths
        self.window.extend(returns)
        score = objective(self.window)
        score = -math.inf if score is None else score
        row = {"env_steps": trainer.global_step, "objective": score,
               "episode_returns": returns, "episode_lengths": lengths,
               "hyperparams": trainer.hp.base(),
               "state_hash": state_hash(trainer.learner.state_dict()),
               "node": ray.get_runtime_context().get_node_id(), **self.restored}  # fmt: skip
        with open(Path(self.config["rows"]) / f"member-{self.index}.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        self.restored = {}
        return {**row, "done": trainer.done}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        assert self.trainer is not None
        state = {"trainer": self.trainer.state_dict(), "member": self.index,
                 "window": list(self.window)}  # fmt: skip
        torch.save(plain(state), Path(checkpoint_dir) / MEMBER_FILE)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        """The trial's own last checkpoint (resumed, or restarted after a lost node) or a
        parent's (an exploit): loaded at the next step."""
        self.pending = torch.load(Path(checkpoint_dir) / MEMBER_FILE, weights_only=True)

    def cleanup(self) -> None:
        if self.trainer is not None:
            self.trainer.close()
            self.trainer = None


def trainable() -> type:
    """`Member` as a `tune.Trainable`."""
    from ray import tune

    return type("Member", (Member, tune.Trainable), {})


def clamp(space: dict[str, Range]) -> Any:
    """Tune's `custom_explore_fn`: each explored value kept inside its range."""

    def explore(config: dict[str, Any]) -> dict[str, Any]:
        for name, r in space.items():
            config[name] = min(r.high, max(r.low, float(config[name])))
        return config

    return explore


def train(config: Any, run_dir: Path, space: dict[str, Range],
          draws: list[dict[str, float]]) -> list[dict[str, Any]]:  # fmt: skip
    """Run the population as Tune trials under `PopulationBasedTraining` in `run_dir`'s
    `tune/`; return each member's record (`_member_record`), in member order. The caller is
    connected to the cluster."""
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    scheduler = PopulationBasedTraining(
        time_attr="env_steps", metric="objective", mode="max",
        perturbation_interval=config.ready, quantile_fraction=config.quantile,
        resample_probability=config.resample_probability,
        perturbation_factors=tuple(config.perturb),
        hyperparam_mutations={name: _resampler(r) for name, r in space.items()},
        custom_explore_fn=clamp(space),
    )  # fmt: skip
    resources = tune.with_resources(trainable(), {"cpu": config.torch_threads})
    rows = Path(run_dir).resolve() / EXPERIMENT
    rows.mkdir(parents=True, exist_ok=True)
    param_space = {
        "pbt": config, "space": list(space), "rows": str(rows),
        "draw": tune.grid_search(list(range(len(draws)))),
        **{name: tune.sample_from(_drawn(draws, name)) for name in space},
    }  # fmt: skip
    tuner = tune.Tuner(
        resources, param_space=param_space,
        tune_config=tune.TuneConfig(scheduler=scheduler, reuse_actors=False),
        run_config=tune.RunConfig(
            name=EXPERIMENT, storage_path=str(Path(run_dir).resolve()),
            stop={"done": True}, verbose=0,
            failure_config=tune.FailureConfig(max_failures=config.ray_restarts),
            # every checkpoint kept: a member behind may exploit one its parent saved several
            # steps ago (a bounded `num_to_keep` deletes it under the exploit, ray#8441)
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1,
                                                    checkpoint_at_end=True),
        ),
    )  # fmt: skip
    grid = tuner.fit()
    trials = tune.ExperimentAnalysis(str(rows)).trials
    failed = sorted(member_index(t.trial_id) for t in trials if t.status == "ERROR")
    if failed:
        raise RuntimeError(
            f"member(s) {', '.join(map(str, failed))} failed on Ray after "
            f"--ray-restarts {config.ray_restarts} restart(s) each (the first one's error "
            f"below; the others' rows up to then in {rows}); --ray-restarts N lets a member "
            "restart N times from its last checkpoint"
        ) from next(r.error for r in grid if r.error is not None)
    failures = {t.trial_id: t.run_metadata.num_failures for t in trials}
    records = []
    for result in sorted(grid, key=lambda r: member_index(r.metrics["trial_id"])):
        trial = result.metrics["trial_id"]
        member = member_index(trial)
        text = (rows / f"member-{member}.jsonl").read_text()
        records.append({
            "rows": [json.loads(line) for line in text.splitlines() if line.strip()],
            "state": torch.load(Path(result.checkpoint.path) / MEMBER_FILE, weights_only=True),
            "restarts": failures[trial],
        })  # fmt: skip
    return records


def _resampler(r: Range) -> Any:
    def resample() -> float:
        return r.sample(np.random.default_rng())

    return resample


def _drawn(draws: list[dict[str, float]], name: str) -> Any:
    def value(spec: Any) -> float:
        return draws[spec.config["draw"]][name]

    return value


def lineage(records: list[dict[str, Any]], draws: list[dict[str, float]]) -> list[dict[str, Any]]:
    """The lineage events of a Tune run, as a run in one process records them: each member's
    start, then each exploit its trial reported (a step that began by loading another member's
    checkpoint: the parent, the step and hash of that state, the hyperparameters explored),
    in the order of their steps."""
    events: list[dict[str, Any]] = [
        {"step": 0, "member": i, "parent": None, "parent_hash": None, "score": None,
         "hyperparams": dict(draw)}
        for i, draw in enumerate(draws)
    ]  # fmt: skip
    copies = [
        {"step": row["restored_step"], "member": i, "parent": row["restored_from"],
         "parent_hash": row["restored_hash"], "score": None, "hyperparams": row["hyperparams"]}
        for i, record in enumerate(records) for row in record["rows"]
        if row.get("restored_from") not in (None, i)
    ]  # fmt: skip
    return events + sorted(copies, key=lambda e: e["step"])
