"""Run infrastructure shared by every learner and by neuroevolution.

A run lives in `runs/<name>/`: `config.json` (the resolved config), TensorBoard events and
`metrics.csv` (`Logger`), `checkpoint.pt` (`Checkpointer`, written atomically) and `curve.png`
(`plot_curves`). A training loop puts them together:

    run_dir = new_run_dir(env_id=cfg.env_id, algo="ppo", seed=cfg.seed)
    save_config(run_dir, cfg)
    ckpt = Checkpointer(run_dir, every_minutes=10)
    with Logger(run_dir) as log, Progress(total) as bar, GracefulInterrupt() as stop:
        while step < total and not stop.requested:
            ...
            log.episodes(step, returns, lengths)
            bar.update(step, log.recent_return)
            if ckpt.due():
                ckpt.save({"model": ..., "step": step, "elapsed": log.elapsed(), "rng": rng_state()})
        ckpt.save(...)
    plot_curves(run_dir)
"""

from onebox.run.checkpoint import Checkpointer, load_checkpoint
from onebox.run.folder import load_config, new_run_dir, save_config
from onebox.run.logger import Logger, import_wandb
from onebox.run.plots import plot_curves
from onebox.run.progress import Progress
from onebox.run.rng import rng_state, set_rng_state
from onebox.run.signals import GracefulInterrupt
from onebox.run.timing import TimeSplit
from onebox.run.video import write_video

__all__ = [
    "Checkpointer",
    "GracefulInterrupt",
    "Logger",
    "Progress",
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
