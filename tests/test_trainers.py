"""Every learner as a trainer under the one driver: resolved configs without holes; learning
rates annealed to 0 when asked and logged as `charts/learning_rate`; a hyperparameter set on a
running trainer reaching its next update (the optimizer and the loss); a trainer's state copied
into a fresh trainer giving the same next update; resumed runs seeding their envs by the one
rule, their counters and optimizer state going on."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from learning import metric
from onebox import cli, run
from onebox.algos import driver
from onebox.algos.trainer import ANNEAL, POSITIVE, UNIT, EnvSeeds, Hyperparams, Trainer, tunables
from onebox.nn.networks import ActorCritic
from onebox.registry import LEARNERS
from onebox.run.config import unresolved
from onebox.sampling import Sampler

CPU = torch.device("cpu")

FAMILIES = {
    "ppo": ["CartPole-v1", "Pendulum-v1", "MinAtar/Breakout-v1", "Pong-v5"],
    "a2c": ["CartPole-v1", "Pendulum-v1", "Pong-v5"],
    "a3c": ["CartPole-v1", "Pong-v5"],
    "pqn": ["CartPole-v1", "MinAtar/Breakout-v1", "Pong-v5"],
    "dqn": ["CartPole-v1", "MinAtar/Breakout-v1", "Pong-v5"],
    "sac": ["Pendulum-v1"],
    "impala": ["CartPole-v1", "Pong-v5"],
    "appo": ["CartPole-v1", "MinAtar/Breakout-v1", "Pong-v5"],
    "apex": ["CartPole-v1", "Pong-v5"],
    "r2d2": ["CartPole-v1", "Pong-v5"],
}
"""An env of each env family each learner has a preset for."""


def module(name: str) -> Any:
    return importlib.import_module(f"onebox.algos.{name}")


# ---- resolved configs have no holes --------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "env"), [(name, env) for name, envs in FAMILIES.items() for env in envs]
)
def test_a_resolved_config_has_no_holes(name: str, env: str) -> None:
    m = module(name)
    assert unresolved(m.Config(env=env)), "an unresolved config has holes: the check can fail"
    config = m.resolve(m.Config(env=env))
    assert unresolved(config) == []
    assert config.log_every > 0


def test_every_learner_has_presets_for_the_families_tested() -> None:
    assert set(FAMILIES) == set(LEARNERS)


# ---- hyperparameters: bounds, names, schedules ---------------------------------------------------


def test_hyperparameters_check_names_and_bounds_and_follow_schedules() -> None:
    hp = Hyperparams("toy", tunables(learning_rate=POSITIVE, gamma=UNIT),
                     {"learning_rate": 0.5, "gamma": 0.9})  # fmt: skip
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    hp.bind("learning_rate", opt)
    assert opt.param_groups[0]["lr"] == 0.5  # bound: the optimizer holds the rate at once
    with pytest.raises(ValueError, match="toy cannot set clip_coef: its tunable hyperparameters "
                                         "are learning_rate, gamma"):  # fmt: skip
        hp.set(clip_coef=0.1)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\], got 2"):
        hp.set(gamma=2.0)
    with pytest.raises(ValueError, match=r"learning_rate must be in \(0, inf\)"):
        hp.set(learning_rate=0.0)
    assert hp.values() == {"learning_rate": 0.5, "gamma": 0.9}  # nothing changed
    with pytest.raises(ValueError, match="toy cannot schedule clip_coef"):  # cannot follow it
        hp.schedule("clip_coef", ANNEAL)
    hp.schedule("learning_rate", ANNEAL)
    hp.progress = 0.75
    assert (
        hp.learning_rate == pytest.approx(0.125) and opt.param_groups[0]["lr"] == hp.learning_rate
    )
    hp.set(learning_rate=0.2)  # the base changes; the schedule still applies
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05) and hp.gamma == 0.9
    copy_ = Hyperparams("toy", hp.bounds, {"learning_rate": 1.0, "gamma": 0.5})
    copy_.load_state_dict(hp.state_dict())
    assert copy_.base() == hp.base()


# ---- annealing -----------------------------------------------------------------------------------

SHORT = {
    "ppo": ["--total-steps", "2048"],
    "a2c": ["--total-steps", "400"],
    "a3c": ["--total-steps", "3200", "--actors", "2"],
    "pqn": ["--total-steps", "2048"],
    "dqn": ["--total-steps", "600", "--learning-starts", "500"],
    "sac": ["--env", "Pendulum-v1", "--total-steps", "300", "--learning-starts", "200"],
    "impala": ["--total-steps", "800"],
    "appo": ["--total-steps", "640"],
    "apex": ["--total-steps", "3000", "--learning-starts", "500"],
    "r2d2": ["--total-steps", "3000", "--learning-starts", "20"],
}
"""A short CartPole (SAC: Pendulum) run of each learner."""


def train(tmp_path: Path, name: str, *args: str) -> Path:
    argv = ["train", name, "--runs-dir", str(tmp_path), "--name", "run", *SHORT[name], *args]
    assert cli.main(argv) == 0
    return tmp_path / "run"


@pytest.mark.parametrize("name", list(LEARNERS))
def test_every_learning_rate_anneals_to_zero_when_asked(tmp_path: Path, name: str) -> None:
    """Logged at every step (`--log-every 1`): the rate falls, and the last update's is within
    that step's share of the run of 0."""
    run_dir = train(tmp_path, name, "--anneal-lr", "True", "--log-every", "1")
    config = run.load_config(run_dir)
    for rate in module(name).Trainer.make_learner.learning_rates:
        rows = metric(run_dir, f"charts/{rate}")
        assert len(rows) >= 2, rate
        values = [v for _, v in rows]
        assert values == sorted(values, reverse=True) and values[-1] < values[0]
        assert values[0] <= getattr(config, rate)
        # The last step began at `before` and ended at `last`, at or past the run's end T: its
        # rate, base * (T - before) / T, is at most base * (last - before) / last.
        (before, _), (last, lr) = rows[-2], rows[-1]
        assert 0 <= lr <= getattr(config, rate) * (last - before) / last * (1 + 1e-9)


@pytest.mark.parametrize("name", ["ppo", "dqn"])
def test_without_annealing_the_rate_stays(tmp_path: Path, name: str) -> None:
    run_dir = train(tmp_path, name, "--anneal-lr", "False", "--log-every", "1")
    rates = {v for _, v in metric(run_dir, "charts/learning_rate")}
    assert rates == {run.load_config(run_dir).learning_rate}


# ---- one update: hyperparameters set between updates, state copies -------------------------------

TEST_CONFIGS: dict[str, dict[str, Any]] = {
    "ppo": {"total_steps": 4096, "num_steps": 32},
    "a2c": {"total_steps": 4096},
    "a3c": {"total_steps": 4096, "actors": 1},
    "pqn": {"total_steps": 4096, "num_steps": 32},
    "dqn": {"total_steps": 4096, "learning_starts": 64, "batch_size": 32, "train_frequency": 1,
            "target_network_frequency": 1, "max_grad_norm": 10.0, "prioritized": True},
    "sac": {"env": "Pendulum-v1", "total_steps": 4096, "learning_starts": 64, "batch_size": 32,
            "autotune": False, "policy_frequency": 1},
    "impala": {"total_steps": 4096},
    "appo": {"total_steps": 4096},
    "apex": {"total_steps": 4096, "learning_starts": 64, "batch_size": 32, "target_update": 1,
             "samples_per_insert": 0.0},
    "r2d2": {"total_steps": 4096, "learning_starts": 4, "batch_size": 4, "target_update": 1,
             "samples_per_insert": 0.0},
}  # fmt: skip
"""Small configs whose next update every hyperparameter changes: a target network moved at
every update (`tau`), SAC's actor updated at every update and alpha not learned (its value
tunable)."""

NEW_VALUES = {"learning_rate": 0.5, "policy_lr": 0.5, "q_lr": 0.5, "gamma": 0.5,
              "gae_lambda": 0.5, "q_lambda": 0.1, "clip_coef": 1e-3, "ent_coef": 0.5,
              "vf_coef": 2.0, "max_grad_norm": 1e-4, "rho_bar": 0.1, "c_bar": 0.1, "tau": 0.5,
              "alpha": 0.5, "priority_eta": 0.1}  # fmt: skip
"""A value for each hyperparameter, far enough from its preset's to change an update (learning
rates: half the preset's)."""


class Priorities:
    """A learner's replay table for one update: records the priorities it writes back."""

    prioritized = True

    def __init__(self) -> None:
        self.written: list[np.ndarray] = []
        self.buffer: list[Any] = []  # Ape-X's and R2D2's updates chart its size

    def update_priorities(self, indices: Any, priorities: Any) -> None:
        self.written.append(np.asarray(priorities))


def make_trainer(name: str) -> Trainer:
    m = module(name)
    config = m.resolve(dataclasses.replace(m.Config(), **TEST_CONFIGS[name],
                                           **({"device": "cpu"} if name != "a3c" else {})))  # fmt: skip
    return m.Trainer(config, EnvSeeds(config.seed))


def trained_state_and_batch(name: str) -> tuple[dict[str, Any], Any]:
    """A trainer's state after some updates, and the batch its learner would update on next."""
    trainer = make_trainer(name)
    if name == "a3c":  # its updates run in worker processes: a rollout of a worker's copy here
        learner = trainer.learner
        with onebox_pool(trainer.config) as pool:
            sampler = Sampler(pool, learner.net, trainer.config.num_steps)
            sampler.reset(seed=0)
            batch = copy.deepcopy(sampler.collect())
        for _ in range(3):
            attach(learner).update(batch)
        return trainer.state_dict(), batch
    with trainer:
        while trainer.updates < 3:
            trainer.step()
        if hasattr(trainer, "sampler"):
            batch = copy.deepcopy(trainer.sampler.collect())
        elif hasattr(trainer, "channel"):
            batch = trainer.channel.take(lambda: False)
        else:
            batch = trainer.replay.sample(trainer.config.batch_size)
        return trainer.state_dict(), batch


def onebox_pool(config: Any) -> Any:
    import onebox.envs

    return onebox.envs.make(config.env, 2, seed=0, autoreset_mode="SameStep")


def attach(learner: Any) -> Any:
    """A3C's learner with a worker's copy of the shared network (as a worker has)."""
    local = ActorCritic(*driver.probe_spaces(learner.config))
    local.load_state_dict(learner.net.state_dict())
    learner.attach(local)
    return learner


def fresh(name: str, state: dict[str, Any], **values: float) -> tuple[Any, Priorities]:
    """A fresh trainer's learner with `state` loaded, `values` set, its replay a recorder."""
    trainer = make_trainer(name)
    trainer.load_state_dict(state)
    learner = trainer.learner
    if values:
        learner.hp.set(**values)
    recorder = Priorities()
    if hasattr(learner, "replay"):
        learner.replay = recorder
    if name == "a3c":
        attach(learner)
    trainer.close()
    return learner, recorder


def update(learner: Any, batch: Any) -> dict[str, torch.Tensor]:
    """Every tensor of the learner's state after one update on `batch` from a fixed seed."""
    torch.manual_seed(0)
    learner.update(copy.deepcopy(batch))
    out: dict[str, torch.Tensor] = {}
    flatten(learner.state_dict(), "", out)
    return out


def flatten(value: Any, prefix: str, out: dict[str, torch.Tensor]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(v, f"{prefix}/{k}", out)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            flatten(v, f"{prefix}/{i}", out)
    elif torch.is_tensor(value):
        out[prefix] = value.detach().clone()
    elif isinstance(value, (int, float)):
        out[prefix] = torch.tensor(float(value))


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module", params=list(LEARNERS))
def trained(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any], Any]:
    name = request.param
    torch.manual_seed(0)
    state, batch = trained_state_and_batch(name)
    return name, state, batch


def test_a_copied_state_gives_the_same_next_update(trained: Any) -> None:
    """Two fresh trainers given one trainer's state make the same update on the same batch
    from the same seed, to the bit (network, optimizer, target, counters)."""
    name, state, batch = trained
    a, pa = fresh(name, state)
    b, pb = fresh(name, state)
    assert same(update(a, batch), update(b, batch))
    assert all(np.array_equal(x, y) for x, y in zip(pa.written, pb.written, strict=True))


def test_each_hyperparameter_set_reaches_the_next_update(trained: Any) -> None:
    """For each tunable hyperparameter: set on a fresh copy, a learning rate is in its optimizer
    at once, and the next update differs from the unchanged copy's (the value reached the loss,
    the optimizer, the target network or the priorities written back)."""
    name, state, batch = trained
    reference, ref_priorities = fresh(name, state)
    expected = update(reference, batch)
    names = reference.hp.names
    assert names, name
    for hp in names:
        base = reference.hp.base()[hp]
        value = base * NEW_VALUES[hp] if hp in reference.learning_rates else NEW_VALUES[hp]
        assert not math.isclose(value, base), (name, hp)
        learner, priorities = fresh(name, state, **{hp: value})
        if hp in learner.learning_rates:
            opts = [o for o in vars(learner).values() if isinstance(o, torch.optim.Optimizer)]
            bound = [o for o in opts if o.param_groups[0]["lr"] == value]
            assert bound, (name, hp)  # the optimizer holds the new rate before the update
        got = update(learner, batch)
        moved = not same(got, expected) or any(
            not np.array_equal(x, y)
            for x, y in zip(priorities.written, ref_priorities.written, strict=True)
        )
        assert moved, f"{name}: setting {hp} to {value} changed nothing in its next update"


# ---- the one seeding rule and resume ------------------------------------------------------------


@pytest.mark.parametrize("name", ["ppo", "dqn", "impala", "apex"])
def test_a_trainer_seeds_its_envs_from_the_runs_count(name: str) -> None:
    m = module(name)
    config = m.resolve(dataclasses.replace(m.Config(), **TEST_CONFIGS[name], device="cpu"))
    for used in (0, 40):
        seeds = EnvSeeds(config.seed, used)
        trainer = m.Trainer(config, seeds)
        try:
            first = trainer.seeds[0] if hasattr(trainer, "seeds") else trainer.seed
            envs = (
                config.actors * config.envs_per_actor
                if hasattr(config, "actors")
                else (config.num_envs)
            )
            assert first == config.seed + used and seeds.used == used + envs
        finally:
            trainer.close()


@pytest.mark.parametrize(("name", "envs"), [("ppo", 4), ("dqn", 1), ("impala", 16), ("a3c", 16)])
def test_a_resumed_run_takes_fresh_seeds_and_goes_on(tmp_path: Path, name: str, envs: int) -> None:
    """Each start of a run seeds its envs after the seeds its earlier starts used (the count in
    the checkpoint), and the counters and the optimizer's state go on from the checkpoint."""
    extra = ["--save-replay"] if name == "dqn" else []
    run_dir = train(tmp_path, name, *extra)
    before = run.load_checkpoint(run_dir)
    assert before["env_seeds"] == envs
    config = run.load_config(run_dir)
    run.save_config(run_dir, dataclasses.replace(config, total_steps=2 * config.total_steps))
    assert cli.main(["train", "--resume", str(run_dir)]) == 0
    after = run.load_checkpoint(run_dir)
    assert after["env_seeds"] == 2 * envs
    assert after["global_step"] >= 2 * config.total_steps > before["global_step"]
    assert after["trainer"]["updates"] > before["trainer"]["updates"]
    steps = [optimizer_steps(s) for s in (before, after)]
    assert steps[1] > steps[0] > 0
    if name == "dqn":  # it resumed with its saved replay: no refill to tell of
        assert (run_dir / "replay.npz").exists() and not (run_dir / "log.txt").exists()


def optimizer_steps(state: dict[str, Any]) -> float:
    """The Adam or RMSprop step count of the learner's optimizer in a checkpoint."""
    learner = state["trainer"]["learner"]
    return float(next(iter(learner["optimizer"]["state"].values()))["step"])


def test_a_checkpoint_of_another_learner_is_refused(tmp_path: Path, capsys) -> None:
    """Every learner's checkpoint has the same keys; the learner's name in it tells them apart."""
    ppo_dir = train(tmp_path / "ppo", "ppo")
    dqn_dir = train(tmp_path / "dqn", "dqn")
    (ppo_dir / "checkpoint.pt").write_bytes((dqn_dir / "checkpoint.pt").read_bytes())
    capsys.readouterr()
    for command in (["train", "--resume"], ["eval"]):
        assert cli.main([*command, str(ppo_dir)]) == 2
        err = capsys.readouterr().err
        assert "was written by 'dqn', not by 'ppo'" in err and "\n" not in err.strip()


def test_the_walkthrough_quotes_the_learner_as_written() -> None:
    """Every code block of docs/adding-a-learner.md is the text of PQN's module (or of the file
    its first line names), so the walkthrough cannot drift from the code."""
    root = Path(__file__).resolve().parents[1]
    doc = (root / "docs" / "adding-a-learner.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert len(blocks) >= 8
    for block in blocks:
        first, _, rest = block.partition("\n")
        path, text = "src/onebox/algos/pqn.py", block
        if first.startswith("# src/"):
            path, text = first[2:].split(",")[0], rest
        assert text in (root / path).read_text(), f"not in {path}:\n{text}"
