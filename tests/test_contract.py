"""The command line's contract with its user: every command (train, evolve, eval, and resume of
either) checks its input before it writes anything, and answers a user error with one line on
stderr and exit code 2, never a traceback; a checkpoint is read without running any code in it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from onebox import cli, run
from onebox.algos import ppo

RS_RANDOM = ["--mode", "random", "--population", "4", "--num-slots", "4", "--num-threads", "1"]


def fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the command, expect a user error: exit code 2 and one line on stderr; return it."""
    capsys.readouterr()
    assert cli.main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("onebox: error: ") and "\n" not in err, err
    return err


def evolve_run(root: Path, name: str = "evo", generations: int = 1) -> Path:
    argv = ["evolve", "rs", *RS_RANDOM, "--generations", str(generations),
            "--runs-dir", str(root), "--name", name, "--progress", "False"]  # fmt: skip
    assert cli.main(argv) == 0
    return root / name


def train_run_folder(root: Path, config: ppo.Config) -> Path:
    """A folder as `onebox train ppo` leaves it after resolving `config` (no checkpoint)."""
    folder = root / "train"
    folder.mkdir(parents=True)
    run.save_config(folder, config)
    return folder


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """The runs folder of the test: empty, and every test checks nothing new appears in it."""
    path = tmp_path / "runs"
    path.mkdir()
    return path


def folders(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()}


# ---- a new run checks everything first ---------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["rs", "--population", "8"], "--top-directions must be in [1, population / 2 = 4]"),
        (["es", "--population", "7"], "--population must be an even number"),
        (["ga", "--truncation", "0"], "--truncation must be in [1, population=64]"),
        (["ga", "--sigma", "-1"], "--sigma must be positive"),
        (["ga", "--generations", "0"], "--generations must be >= 1"),
        (["es", "--lr", "0"], "--lr must be positive"),
        (["rs", "--hidden", "0", "64"], "--hidden takes positive sizes"),
        (["rs", "--frame-budget", "-1"], "--frame-budget must be >= 0"),
        (["ga", "--env", "CartPol-v1"], "Did you mean"),
        (["ga", "--num-slots", "1"], "num_slots"),
        (["ga", "--slot-groups", "0"], "slot_groups must be an integer >= 1"),
        (["es", "--num-threads", "0"], "num_threads must be an integer >= 1"),
        (["rs", "--device", "bogus"], "unknown device 'bogus'"),
    ],
)
def test_a_bad_evolve_config_writes_nothing(runs, capsys, argv, message) -> None:
    err = fails(capsys, "evolve", *argv, "--runs-dir", str(runs))
    assert message in err
    assert not folders(runs)


def test_an_existing_run_name_is_refused(runs, capsys) -> None:
    evolve_run(runs, "taken")
    before = sorted(p.name for p in (runs / "taken").iterdir())
    err = fails(capsys, "evolve", "rs", *RS_RANDOM, "--runs-dir", str(runs), "--name", "taken")
    assert "already exists" in err and "--resume" in err
    assert sorted(p.name for p in (runs / "taken").iterdir()) == before


def test_a_runs_dir_that_is_a_file(runs, capsys) -> None:
    (runs / "file").write_text("")
    err = fails(capsys, "evolve", "rs", *RS_RANDOM, "--runs-dir", str(runs / "file"))
    assert "file" in err
    assert folders(runs) == {"file"}


def test_track_without_wandb_writes_nothing(runs, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    err = fails(capsys, "evolve", "rs", *RS_RANDOM, "--track", "--runs-dir", str(runs))
    assert "pip install wandb" in err
    err = fails(capsys, "train", "ppo", "--total-steps", "512", "--track", "--runs-dir", str(runs))
    assert "pip install wandb" in err
    assert not folders(runs)


# ---- resume and eval: the right command for the right run ---------------------------------------


def test_train_resume_of_an_evolve_run_points_to_evolve(runs, capsys) -> None:
    evo = evolve_run(runs)
    err = fails(capsys, "train", "--resume", str(evo))
    assert "is a run of `onebox evolve" in err and f"onebox evolve --resume {evo}" in err
    assert folders(runs) == {"evo"}


def test_evolve_resume_of_a_train_run_or_another_algorithm(runs, capsys) -> None:
    train = train_run_folder(runs, ppo.Config(total_steps=512))
    err = fails(capsys, "evolve", "--resume", str(train))
    assert "not an evolve run" in err and f"onebox train --resume {train}" in err
    evo = evolve_run(runs)
    err = fails(capsys, "evolve", "ga", "--resume", str(evo))
    assert "`onebox evolve rs` run" in err and f"onebox evolve --resume {evo}" in err
    assert folders(runs) == {"train", "evo"}


def test_evolve_resume_continues_and_eval_plays_an_evolve_run(runs, capsys) -> None:
    evo = evolve_run(runs)
    assert cli.main(["evolve", "--resume", str(evo)]) == 0  # already done: one generation
    assert run.load_checkpoint(evo)["algo"]["generation"] == 1
    assert cli.main(["evolve", "rs", "--resume", str(evo), "--generations", "2"]) == 0
    assert run.load_checkpoint(evo)["algo"]["generation"] == 2
    assert run.load_config(evo).generations == 2
    err = fails(capsys, "evolve", "rs", "--resume", str(evo), "--population", "8")
    assert "--population: a resumed run keeps its settings" in err
    capsys.readouterr()
    assert cli.main(["eval", str(evo), "--episodes", "2"]) == 0
    assert "CartPole-v1: 2 episodes" in capsys.readouterr().out
    assert folders(runs) == {"evo"}


@pytest.mark.parametrize("command", [["train", "--resume"], ["evolve", "--resume"], ["eval"]])
def test_missing_or_damaged_run_folders(runs, capsys, command) -> None:
    err = fails(capsys, *command, str(runs / "nope"))
    assert "nope is not a onebox run folder: it does not exist" in err
    (runs / "empty").mkdir()
    assert "has no config.json" in fails(capsys, *command, str(runs / "empty"))
    (runs / "bad").mkdir()
    (runs / "bad" / "config.json").write_text("{not json")
    assert "is not a onebox config file" in fails(capsys, *command, str(runs / "bad"))
    (runs / "foreign").mkdir()
    doc = {"type": "onebox.bench.train:TrainBenchConfig", "config": {}}
    (runs / "foreign" / "config.json").write_text(json.dumps(doc))
    err = fails(capsys, *command, str(runs / "foreign"))
    assert "'onebox.bench.train:TrainBenchConfig', which no `onebox train`" in err
    assert folders(runs) == {"empty", "bad", "foreign"}


def test_a_run_without_a_checkpoint(runs, capsys) -> None:
    train = train_run_folder(runs, ppo.Config(total_steps=512))
    assert "has no checkpoint yet" in fails(capsys, "train", "--resume", str(train))
    assert "has no checkpoint yet" in fails(capsys, "eval", str(train))
    evo = evolve_run(runs)
    (evo / "checkpoint.pt").unlink()
    assert "has no checkpoint yet" in fails(capsys, "evolve", "--resume", str(evo))
    assert sorted(p.name for p in train.iterdir()) == ["config.json"]


def test_a_checkpoint_of_another_learner(runs, capsys) -> None:
    train = train_run_folder(runs, ppo.Config(total_steps=512))
    evo = evolve_run(runs)
    (train / "checkpoint.pt").write_bytes((evo / "checkpoint.pt").read_bytes())
    for command in (["train", "--resume"], ["eval"]):
        err = fails(capsys, *command, str(train))
        assert "checkpoint.pt lacks 'learner'" in err and "not written by the learner" in err
    assert sorted(p.name for p in train.iterdir()) == ["checkpoint.pt", "config.json"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("total_steps", -5, "--total-steps must be positive"),
        ("total_steps", "many", "total_steps='many' is not an int"),
        ("gamma", 2.0, "--gamma must be in [0, 1]"),
        ("sampler", "triple", "'triple' is not one of"),
        ("no_such_field", 1, "no_such_field"),
    ],
)
def test_an_edited_config_is_checked_again_on_resume(runs, capsys, field, value, message) -> None:
    train = train_run_folder(runs, ppo.Config(total_steps=512))
    path = train / "config.json"
    doc = json.loads(path.read_text())
    doc["config"][field] = value
    path.write_text(json.dumps(doc))
    assert message in fails(capsys, "train", "--resume", str(train))
    assert sorted(p.name for p in train.iterdir()) == ["config.json"]


# ---- checkpoints hold plain data only ------------------------------------------------------------


class Payload:
    """Unpickling this runs `open(marker, "w")`: what a malicious checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("command", [["eval"], ["train", "--resume"], ["evolve", "--resume"]])
def test_a_checkpoint_that_would_run_code_is_refused(runs, tmp_path, capsys, command) -> None:
    folder = train_run_folder(runs, ppo.Config()) if command[0] == "train" else evolve_run(runs)
    marker = tmp_path / "marker"
    torch.save({"agent": Payload(marker), "algo": Payload(marker)}, folder / "checkpoint.pt")
    err = fails(capsys, *command, str(folder))
    assert "checkpoint.pt holds objects that are not plain weights" in err
    assert "onebox does not execute it" in err
    assert not marker.exists()


def test_a_damaged_checkpoint_is_a_clear_error(runs, capsys) -> None:
    evo = evolve_run(runs)
    data = (evo / "checkpoint.pt").read_bytes()
    (evo / "checkpoint.pt").write_bytes(data[: len(data) // 2])
    assert "cannot be read as a checkpoint" in fails(capsys, "eval", str(evo))


def test_checkpoints_refuse_what_the_weights_only_loader_could_not_read(tmp_path) -> None:
    with pytest.raises(TypeError, match=r"state\['x'\]\[1\]: a \w*Path cannot go"):
        run.Checkpointer(tmp_path, 0).save({"x": [1, tmp_path]})
    assert not (tmp_path / "checkpoint.pt").exists()
