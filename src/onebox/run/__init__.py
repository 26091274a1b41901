"""Run infrastructure shared by every learner and by neuroevolution.

A run lives in `runs/<name>/`: `config.json` (the resolved config), TensorBoard events and
`metrics.csv` (`Logger`), `checkpoint.pt` (`Checkpointer`, written atomically) and `curve.png`
(`plot_curves`). `RunSession` (`onebox.run.session`) puts them together for a training loop: the
folder, the logs, the checkpoints, the progress bar, Ctrl-C and resume. The config fields every
run shares are defined once in `onebox.run.config` (`RunConfig`, `TrainConfig`, `TorchConfig`),
and presets are typed (`onebox.run.presets.Presets`).
"""

from onebox.run.checkpoint import Checkpointer, load_checkpoint
from onebox.run.folder import load_config, new_run_dir, save_config
from onebox.run.logger import Logger, import_wandb
from onebox.run.plots import plot_curves
from onebox.run.progress import Progress
from onebox.run.rng import rng_state, set_rng_state
from onebox.run.session import RunSession
from onebox.run.signals import GracefulInterrupt
from onebox.run.timing import InFlight, TimeSplit
from onebox.run.video import write_video

__all__ = [
    "Checkpointer",
    "GracefulInterrupt",
    "InFlight",
    "Logger",
    "Progress",
    "RunSession",
    "TimeSplit",
    "import_wandb",
    "load_checkpoint",
    "load_config",
    "new_run_dir",
    "plot_curves",
    "rng_state",
    "save_config",
    "set_rng_state",
    "write_video",
]
