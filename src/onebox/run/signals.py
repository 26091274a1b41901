"""`GracefulInterrupt`: Ctrl-C (or SIGTERM) asks the training loop to save a checkpoint and stop."""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulInterrupt:
    """Within `with GracefulInterrupt() as stop:`, SIGINT and SIGTERM set `stop.requested`.

    The loop checks `stop.requested`, saves a checkpoint and exits. A second SIGINT raises
    `KeyboardInterrupt` (for when saving hangs). The previous handlers come back on exit. Signal
    handlers can only be installed from the main thread; elsewhere this is inert (`requested`
    stays False).
    """

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None
        """The signal that set `requested`."""
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> GracefulInterrupt:
        self.requested = False
        self.signum = None
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._previous[sig] = signal.getsignal(sig)
                signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    @property
    def installed(self) -> bool:
        """Whether the handlers are installed (inside the `with`, on the main thread)."""
        return bool(self._previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        self.requested = True
        self.signum = signum
        name = signal.Signals(signum).name
        # os.write: print() is not safe to re-enter if the signal lands inside another print
        os.write(
            2, f"\n{name}: saving a checkpoint, then stopping (Ctrl-C again to abort)\n".encode()
        )
