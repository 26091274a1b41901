"""onebox.run: run folder, config, logger, checkpoints, RNG, signals, timing, plots, video."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import torch

import onebox.run.timing
from onebox.run import (
    Checkpointer,
    GracefulInterrupt,
    InFlight,
    Logger,
    Progress,
    TimeSplit,
    load_checkpoint,
    load_config,
    new_run_dir,
    plot_curves,
    rng_state,
    save_config,
    set_rng_state,
    write_video,
)

# ---- run folder and config -----------------------------------------------------------------------


def test_new_run_dir_default_name(tmp_path):
    path = new_run_dir(tmp_path, env_id="ALE/Pong-v5", algo="ppo", seed=3)
    assert path.is_dir() and path.parent == tmp_path
    assert re.fullmatch(r"ALE_Pong-v5__ppo__3__\d{8}-\d{6}", path.name)


def test_new_run_dir_collision(tmp_path):
    path = new_run_dir(tmp_path, "mine", env_id="CartPole-v1", algo="ppo", seed=0)
    assert new_run_dir(tmp_path, "mine", env_id="CartPole-v1", algo="ppo", seed=0) == path  # empty
    (path / "config.json").write_text("{}")
    with pytest.raises(FileExistsError, match=r"--resume.*--name"):
        new_run_dir(tmp_path, "mine", env_id="CartPole-v1", algo="ppo", seed=0)
    with pytest.raises(ValueError, match="folder name"):
        new_run_dir(tmp_path, "a/b", env_id="CartPole-v1", algo="ppo", seed=0)


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    lr: float = 2.5e-4
    betas: tuple[float, float] = (0.9, 0.999)


@dataclasses.dataclass
class TrainConfig:
    env_id: str = "CartPole-v1"
    mode: Literal["sync", "async"] = "sync"
    hidden: tuple[int, ...] = (64, 64)
    out: Path = Path("runs")
    resume: Path | None = None
    max_steps: int | None = None
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    schedule: list[float] = dataclasses.field(default_factory=lambda: [1.0, 0.5])
    anneal: bool = True


def test_config_round_trip(tmp_path):
    config = TrainConfig(
        mode="async",
        hidden=(256, 128, 32),
        out=Path("/tmp/x"),
        resume=Path("runs/old"),
        optim=OptimConfig(lr=1.0, betas=(0.5, 0.25)),
    )
    path = save_config(tmp_path, config)
    doc = json.loads(path.read_text())
    assert doc["type"].endswith(":TrainConfig") and doc["config"]["optim"]["lr"] == 1.0
    assert path.read_text().startswith("{\n  ")  # pretty-printed
    for loaded in (load_config(tmp_path), load_config(tmp_path, TrainConfig)):
        assert loaded == config
        assert isinstance(loaded.hidden, tuple) and isinstance(loaded.optim.betas, tuple)
        assert isinstance(loaded.out, Path) and isinstance(loaded.resume, Path)
        assert isinstance(loaded.optim.lr, float) and loaded.max_steps is None
    save_config(tmp_path, TrainConfig())
    assert load_config(tmp_path) == TrainConfig()


def test_config_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_config(tmp_path)
    path = save_config(tmp_path, TrainConfig())
    doc = json.loads(path.read_text())
    doc["config"]["clip_coef"] = 0.1
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="clip_coef"):
        load_config(tmp_path)
    del doc["config"]["clip_coef"]
    doc["config"]["mode"] = "threads"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="threads"):
        load_config(tmp_path)
    del doc["config"]["mode"]  # a field added since the save takes its default
    path.write_text(json.dumps(doc))
    assert load_config(tmp_path).mode == "sync"
    with pytest.raises(TypeError, match="dataclass"):
        save_config(tmp_path, {"lr": 1.0})


# ---- logger ------------------------------------------------------------------------------------


def read_csv(run_dir: Path) -> list[list[str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.reader(f))


def test_csv_long_format(tmp_path):
    with Logger(tmp_path) as log:
        log.scalars(10, {"losses/value": 0.5, "charts/SPS": 1000})
        log.episodes(20, [1.5, 2.5], np.array([7, 9]))
    rows = read_csv(tmp_path)
    assert rows[0] == ["step", "time", "tag", "value"]
    body = [(int(s), tag, float(v)) for s, _, tag, v in rows[1:]]
    assert body == [
        (10, "losses/value", 0.5),
        (10, "charts/SPS", 1000.0),
        (20, "charts/episodic_return", 1.5),
        (20, "charts/episodic_length", 7.0),
        (20, "charts/episodic_return", 2.5),
        (20, "charts/episodic_length", 9.0),
    ]
    assert all(0 <= float(t) < 60 for _, t, _, _ in rows[1:])


def test_resume_truncates_csv_and_continues_elapsed(tmp_path):
    with Logger(tmp_path) as log:
        for step in (10, 20, 30):
            log.scalars(step, {"x": step})
    with open(tmp_path / "metrics.csv", "a") as f:
        f.write("40,1.0,x")  # a row cut short by SIGKILL
    with Logger(tmp_path, start_step=20, elapsed=100.0) as log:
        assert log.elapsed() >= 100.0
        log.scalars(30, {"x": 31})
    rows = read_csv(tmp_path)[1:]
    assert [(int(s), float(v)) for s, _, _, v in rows] == [(10, 10.0), (20, 20.0), (30, 31.0)]
    assert float(rows[1][1]) < 100 <= float(rows[2][1])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path))
    acc.Reload()  # the first run's step 30 was purged by the resume
    assert [(e.step, e.value) for e in acc.Scalars("x")] == [(10, 10.0), (20, 20.0), (30, 31.0)]


def test_tensorboard_events_readable(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Logger(tmp_path) as log:
        log.scalars(5, {"losses/approx_kl": 0.25})
        log.scalars(6, {"losses/approx_kl": 0.5, "charts/SPS": 900})
        log.episodes(8, [3.0, 4.0], [4, 6])
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("losses/approx_kl")] == [(5, 0.25), (6, 0.5)]
    assert [(e.step, e.value) for e in acc.Scalars("charts/SPS")] == [(6, 900.0)]
    assert [(e.step, e.value) for e in acc.Scalars("charts/episodic_return")] == [(8, 3), (8, 4)]
    assert [(e.step, e.value) for e in acc.Scalars("charts/episodic_length")] == [(8, 4), (8, 6)]


def test_recent_return_window(tmp_path):
    with Logger(tmp_path) as log:
        assert log.recent_return is None
        log.episodes(1, np.arange(30, dtype=np.float32), np.ones(30, dtype=np.int64))
        assert log.recent_return == pytest.approx(np.mean(np.arange(10, 30)))
        log.episodes(2, np.arange(100, 200), np.ones(100))
        assert log.recent_returns == list(map(float, range(100, 200)))
        assert log.recent_return == pytest.approx(np.mean(np.arange(180, 200)))
        with pytest.raises(ValueError, match="lengths"):
            log.episodes(3, [1.0, 2.0], [1])
        log.episodes(4, [500.0], [1])  # after the checkpoint below: dropped on resume
    with Logger(tmp_path, start_step=2) as log:  # the window continues from the metrics file
        assert log.recent_returns == list(map(float, range(100, 200)))


def test_track_without_wandb_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.raises(ValueError, match="pip install wandb"):
        Logger(tmp_path, track=True)
    assert not (tmp_path / "metrics.csv").exists()


# ---- checkpoints and RNG -----------------------------------------------------------------------


def test_checkpoint_round_trip_and_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint yet"):
        load_checkpoint(tmp_path)
    state = {"model": {"w": torch.arange(4.0)}, "step": 7, "rng": rng_state()}
    Checkpointer(tmp_path, every_minutes=0).save(state)
    loaded = load_checkpoint(tmp_path)
    assert loaded["step"] == 7 and torch.equal(loaded["model"]["w"], torch.arange(4.0))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_checkpoint_of_numpy_values_loads_weights_only(tmp_path):
    """numpy scalars (np.float64 is a float subclass) and arrays are stored as plain numbers and
    tensors, which torch's weights-only loader reads back."""
    state = {"count": np.float64(2.5), "n": np.int64(3), "mean": np.arange(3.0)}
    Checkpointer(tmp_path, every_minutes=0).save(state)
    loaded = load_checkpoint(tmp_path)
    assert type(loaded["count"]) is float and loaded["count"] == 2.5 and loaded["n"] == 3
    assert torch.equal(loaded["mean"], torch.arange(3.0, dtype=torch.float64))


CHILD = """
import io, sys, time
from pathlib import Path
import torch
from onebox.run import Checkpointer

real_save = torch.save

def half_then_hang(obj, f):  # write half the bytes, then wait to be killed
    buf = io.BytesIO()
    real_save(obj, buf)
    f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
    f.flush()
    print("half", flush=True)
    time.sleep(120)

torch.save = half_then_hang
Checkpointer(Path(sys.argv[1]), every_minutes=0).save({"step": 2, "w": torch.zeros(10_000)})
"""


def test_checkpoint_killed_mid_save_keeps_previous(tmp_path):
    Checkpointer(tmp_path, every_minutes=0).save({"step": 1, "w": torch.ones(10_000)})
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "half"
    finally:
        child.kill()  # SIGKILL
        child.wait(timeout=30)
        child.stdout.close()
    leftovers = [p for p in tmp_path.iterdir() if p.name != "checkpoint.pt"]
    assert leftovers, "the killed save should have left its temporary file"
    state = load_checkpoint(tmp_path)
    assert state["step"] == 1 and torch.equal(state["w"], torch.ones(10_000))
    Checkpointer(tmp_path, every_minutes=0)  # cleans the killed save's temporary file
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_checkpointer_due(tmp_path):
    never = Checkpointer(tmp_path, every_minutes=0)
    ckpt = Checkpointer(tmp_path, every_minutes=0.1 / 60)  # 0.1 s
    assert not ckpt.due()
    time.sleep(0.15)
    assert ckpt.due() and not never.due()
    ckpt.save({"step": 0})
    assert not ckpt.due()
    time.sleep(0.15)
    assert ckpt.due()


def draws() -> tuple:
    return random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist()


def test_rng_round_trip():
    state = rng_state()
    first = draws()
    draws()
    set_rng_state(state)
    assert draws() == first
    with pytest.raises(ValueError, match="rng_state"):
        set_rng_state({"python": state["python"]})


def test_rng_state_survives_a_checkpoint(tmp_path):
    Checkpointer(tmp_path, every_minutes=0).save({"rng": rng_state()})
    first = draws()
    set_rng_state(load_checkpoint(tmp_path)["rng"])
    assert draws() == first


# ---- signals, timing, progress -----------------------------------------------------------------


def wait_for(flag, seconds: float = 2.0) -> bool:
    end = time.monotonic() + seconds
    while not flag() and time.monotonic() < end:
        time.sleep(0.01)
    return flag()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_graceful_interrupt(sig, capfd):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with GracefulInterrupt() as stop:
        assert stop.installed and not stop.requested
        os.kill(os.getpid(), sig)
        assert wait_for(lambda: stop.requested)
        assert stop.signum == sig
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert {s: signal.getsignal(s) for s in before} == before
    assert "saving a checkpoint" in capfd.readouterr().err


def test_graceful_interrupt_is_inert_off_the_main_thread():
    before = signal.getsignal(signal.SIGINT)
    seen = []

    def body():
        with GracefulInterrupt() as stop:
            seen.append((stop.installed, signal.getsignal(signal.SIGINT)))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [(False, before)]


def test_time_split():
    split = TimeSplit()
    split.add("env", 3.0)
    split.add("learn", 1.0)
    assert split.fractions() == {"env": 0.75, "learn": 0.25}
    with split("env"):
        time.sleep(0.02)
    with split("inference"):
        pass
    totals = split.totals()
    assert 3.02 <= totals["env"] < 3.5 and 0 <= totals["inference"] < 0.01
    assert sum(split.fractions().values()) == pytest.approx(1.0)
    split.reset()
    assert split.totals() == {} and split.fractions() == {}
    with pytest.raises(ValueError, match="cpu=True"):
        split.cpu_totals()


def test_time_split_with_cpu_seconds_tells_waiting_from_running():
    split = TimeSplit(("sleep", "spin", "unused"), cpu=True)
    assert split.totals() == split.cpu_totals() == {"sleep": 0.0, "spin": 0.0, "unused": 0.0}
    with split("sleep"):
        time.sleep(0.05)
    with split("spin"):
        start = time.thread_time()
        while time.thread_time() - start < 0.05:
            pass
    wall, cpu = split.totals(), split.cpu_totals()
    assert wall["sleep"] >= 0.05 and cpu["sleep"] < 0.5 * wall["sleep"]
    assert 0.05 <= cpu["spin"] <= wall["spin"] + 0.01
    split.reset()  # the named sections stay, at 0
    assert split.totals() == split.cpu_totals() == {"sleep": 0.0, "spin": 0.0, "unused": 0.0}


def test_in_flight_counts_time_by_workers_at_once(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(onebox.run.timing, "perf_counter", lambda: now[0])
    flight = InFlight()

    def at(t, call):
        now[0] = t
        call()

    at(0, flight.open)
    at(1, flight.start)
    at(3, flight.start)
    at(4, flight.stop)
    at(6, flight.stop)
    at(7, flight.close)
    at(10, flight.start)  # the clock is stopped: not counted, and `open` forgets it
    at(20, flight.open)
    at(22, flight.close)
    assert flight.fractions() == pytest.approx([4 / 9, 4 / 9, 1 / 9])
    flight.reset()
    assert flight.fractions() == []
    # A worker back that was never counted out (the clock opened while it was in flight)
    # would file time under a wrong count: refused.
    at(30, flight.open)
    with pytest.raises(RuntimeError, match="no worker in flight"):
        at(31, flight.stop)
    at(32, flight.start)  # and the count goes on from none
    at(34, flight.stop)
    at(35, flight.close)
    assert flight.fractions() == pytest.approx([3 / 5, 2 / 5])


def test_progress_disabled_and_enabled(capsys):
    with Progress(1000, enabled=False) as bar:
        for step in range(0, 1001, 100):
            bar.update(step, 1.0)
    assert capsys.readouterr().err == ""
    with Progress(1000, start_step=200, enabled=True, description="ppo") as bar:
        for step in range(200, 1001, 100):
            bar.update(step, 1.5 if step > 500 else None)
    err = capsys.readouterr().err
    assert "ppo" in err and "1000/1000" in err and "return 1.50" in err and "SPS" in err
    with pytest.raises(ValueError, match="start_step"):
        Progress(10, start_step=11)


# ---- plots and video ---------------------------------------------------------------------------


def test_plot_curves(tmp_path):
    with Logger(tmp_path) as log:
        log.scalars(1, {"losses/value": 1.0})
    assert plot_curves(tmp_path) is None
    with Logger(tmp_path, start_step=1) as log:
        for step in range(1, 60):
            log.episodes(step * 100, [step + np.sin(step)], [step])
    out = plot_curves(tmp_path)
    assert out == tmp_path / "curve.png"
    import matplotlib.image

    image = matplotlib.image.imread(out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.shape[1] > image.shape[0] > 100
    assert image[..., :3].std() > 0.05  # something was drawn
    assert plot_curves(tmp_path, "charts/episodic_length", tmp_path / "len.png").is_file()


def test_write_video_round_trip(tmp_path):
    import imageio.v2 as imageio

    levels = np.arange(7, dtype=np.uint8) * 30
    frames = np.broadcast_to(levels[:, None, None, None], (7, 48, 64, 3)).copy()
    path = write_video(frames, tmp_path / "sub" / "video.mp4", fps=15)
    with imageio.get_reader(path, format="FFMPEG") as reader:
        back = [frame for frame in reader]
    assert len(back) == 7 and back[0].shape == (48, 64, 3)
    assert np.abs(np.array([f.mean() for f in back]) - levels).max() < 6
    gray = [np.full((33, 47), 200, np.uint8)] * 3  # odd sizes are padded to even
    with imageio.get_reader(write_video(gray, tmp_path / "gray.mp4"), format="FFMPEG") as reader:
        back = [frame for frame in reader]
    assert len(back) == 3 and back[0].shape == (34, 48, 3)


def test_write_video_bad_frames(tmp_path):
    with pytest.raises(ValueError, match="no frames"):
        write_video([], tmp_path / "a.mp4")
    with pytest.raises(TypeError, match="uint8"):
        write_video(np.zeros((2, 8, 8, 3), np.float32), tmp_path / "a.mp4")
    with pytest.raises(ValueError, match=r"\(T, H, W, 3\)"):
        write_video(np.zeros((2, 8, 8, 4), np.uint8), tmp_path / "a.mp4")
    with pytest.raises(ValueError, match="one shape"):
        write_video([np.zeros((8, 8), np.uint8), np.zeros((8, 6), np.uint8)], tmp_path / "a.mp4")
    assert not (tmp_path / "a.mp4").exists()


def test_track_logs_to_wandb_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    with Logger(tmp_path, track=True, config=TrainConfig()) as log:
        log.scalars(1, {"losses/value": 0.5})
        log.episodes(2, [1.0, 3.0], [5, 7])
        run = wandb.run
        assert run is not None and run.name == tmp_path.name
        assert run.config["optim"]["lr"] == OptimConfig().lr
    run_id = (tmp_path / "wandb_id.txt").read_text().strip()
    assert run.id == run_id and list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    with Logger(tmp_path, start_step=2, track=True):  # a resumed run continues the same W&B run
        assert wandb.run is not None and wandb.run.id == run_id
