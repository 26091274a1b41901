"""Checkpoints: `run_dir/"checkpoint.pt"`, written atomically every N minutes and at the end.

A checkpoint holds plain data only: tensors, Python numbers, strings, None, and dicts, lists and
tuples of them (numpy arrays are stored as tensors, numpy scalars as Python numbers). It is read
with torch's weights-only loader, which builds nothing else, so a checkpoint from someone else's
run folder cannot run code when evaluated or resumed: one that holds other objects is refused.

A save writes a temporary file in the run folder, fsyncs it, renames it over `checkpoint.pt` and
fsyncs the folder, so a crash or SIGKILL at any moment leaves either the previous checkpoint or the
new one, never a torn file.
"""

from __future__ import annotations

import collections
import os
import pickle
import re
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

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
        """Write `plain(state)` with `torch.save` to `checkpoint.pt` atomically; reset the timer."""
        import torch

        if not isinstance(state, dict):
            raise TypeError(f"a checkpoint is a dict of state, got {type(state).__name__}")
        state = plain(state)
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


def plain(value: Any, where: str = "state") -> Any:
    """`value` as the plain data a checkpoint holds: numpy arrays become tensors and numpy scalars
    Python numbers, inside dicts (str or int keys), lists and tuples; anything else raises
    TypeError naming where it is (torch's weights-only loader would refuse to read it back)."""
    import torch

    if isinstance(value, np.generic):  # before float: np.float64 is a float subclass
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, (list, tuple)):
        items = [plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if type(value) in (dict, collections.OrderedDict):
        out = type(value)()
        for key, v in value.items():
            if not isinstance(key, (str, int)):
                raise TypeError(f"{where}: checkpoint keys are str or int, got {key!r}")
            out[key] = plain(v, f"{where}[{key!r}]")
        if hasattr(value, "_metadata"):  # a module's state_dict: its version numbers
            out._metadata = plain(value._metadata, f"{where}._metadata")  # type: ignore[attr-defined]
        return out
    raise TypeError(
        f"{where}: a {type(value).__name__} cannot go into a checkpoint, which holds only "
        "tensors, numbers, strings, None, and dicts, lists and tuples of them"
    )


def load_checkpoint(
    run_dir: Path, map_location: str = "cpu", keys: Collection[str] = ()
) -> dict[str, Any]:
    """Load `run_dir/"checkpoint.pt"`, with tensors moved to `map_location`; ValueError if it
    lacks one of `keys` (what the caller's learner writes: a checkpoint of another learner).

    Reads with `torch.load(weights_only=True)`, which builds only tensors and plain containers;
    a file that needs anything more (any other class or function: the way a pickle runs code) is
    refused with a ValueError, as is a damaged file.
    """
    import torch

    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: the run in {run_dir} has no checkpoint yet (one is written every "
            "few minutes and at the end)"
        )
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        why = re.search(r"WeightsUnpickler error: ([^\n]*?)(?: Please use|$)", str(e), re.M)
        if why is None or not why.group(1).strip():
            raise ValueError(f"{path} cannot be read as a checkpoint (damaged?)") from None
        raise ValueError(
            f"{path} holds objects that are not plain weights ({why.group(1).strip()}); onebox "
            "does not execute it"
        ) from None
    except (RuntimeError, EOFError, OSError) as e:
        raise ValueError(f"{path} cannot be read as a checkpoint ({e})") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path} does not hold a onebox checkpoint (a dict), got {type(state)}")
    missing = [key for key in keys if key not in state]
    if missing:
        raise ValueError(
            f"{path} lacks {', '.join(map(repr, missing))}: it was not written by the learner "
            f"of this run's config.json (copied from another run?)"
        )
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
