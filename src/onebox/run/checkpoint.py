"""Checkpoints: `run_dir/"checkpoint.pt"`, written atomically every N minutes and at the end.

A save writes a temporary file in the run folder, fsyncs it, renames it over `checkpoint.pt` and
fsyncs the folder, so a crash or SIGKILL at any moment leaves either the previous checkpoint or the
new one, never a torn file.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

CHECKPOINT_FILE = "checkpoint.pt"
_TMP_PREFIX = f".{CHECKPOINT_FILE}.tmp"


class Checkpointer:
    """Saves `run_dir/"checkpoint.pt"`; `due()` says when `every_minutes` have passed since the last.

    `every_minutes <= 0` means never due (save only at the end). The timer starts at construction.
    """

    def __init__(self, run_dir: Path, every_minutes: float) -> None:
        self.run_dir = Path(run_dir)
        self.every_seconds = float(every_minutes) * 60.0
        self.path = self.run_dir / CHECKPOINT_FILE
        self._last = time.monotonic()
        for stale in self.run_dir.glob(f"{_TMP_PREFIX}*"):  # left by a save that was killed
            stale.unlink(missing_ok=True)

    def due(self) -> bool:
        """True when `every_minutes` have passed since the last save (or since construction)."""
        return self.every_seconds > 0 and time.monotonic() - self._last >= self.every_seconds

    def save(self, state: dict[str, Any]) -> Path:
        """Write `state` with `torch.save` to `checkpoint.pt` atomically; reset the timer."""
        import torch

        if not isinstance(state, dict):
            raise TypeError(f"a checkpoint is a dict of state, got {type(state).__name__}")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.run_dir / f"{_TMP_PREFIX}{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(self.run_dir)
        self._last = time.monotonic()
        return self.path


def load_checkpoint(run_dir: Path, map_location: str = "cpu") -> dict[str, Any]:
    """Load `run_dir/"checkpoint.pt"`, with tensors moved to `map_location`.

    Uses `torch.load(weights_only=False)`: a checkpoint holds numpy and Python RNG states and other
    plain objects that the weights-only unpickler refuses. Unpickling runs code, so only load
    checkpoints you wrote (onebox only loads its own run folders).
    """
    import torch

    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: the run in {run_dir} has no checkpoint yet (one is written every "
            "few minutes and at the end), so it cannot be resumed"
        )
    state = torch.load(path, map_location=map_location, weights_only=False)
    if not isinstance(state, dict):
        raise ValueError(f"{path} does not hold a onebox checkpoint (a dict), got {type(state)}")
    return state


def _fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable (a no-op where folders cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
