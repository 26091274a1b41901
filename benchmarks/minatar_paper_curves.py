"""Read the MinAtar paper's DQN learning curves off its figure, at given frame budgets.

The figure is `img/learning_curves.gif` of the `minatar` repository (github.com/kenjyoung/MinAtar;
the README's "Results"): for each game, the moving average of the last 100 training episodes'
returns, the mean of 30 seeds, against frames (0 to 5M). This finds the DQN curve's pixels (its
blue) in the column of each budget and maps their median row through the panel's axis ticks
(located once in the 3038 x 1629 image, below). Where a curve is steep the reading's error is its
slope times about 0.01M frames (half a pixel column is 0.0036M).

    python benchmarks/minatar_paper_curves.py PATH/TO/learning_curves.gif 0.3 0.5 1.0
"""

from __future__ import annotations

import sys

import numpy as np
from PIL import Image

DQN_BLUE = (1, 115, 178)
"""The DQN curve's colour (matplotlib's colorblind palette blue)."""
PANELS = {
    "Seaquest": (614, 754, 624, 228, 20),
    "Breakout": (1569, 1708, 637, 286, 15),
    "Asterix": (106, 246, 1407, 1000, 20),
    "Freeway": (1202, 1341.5, 1398, 987, 50),
    "SpaceInvaders": (2295, 2434, 1400, 957, 200),
}
"""Per game, in image pixels: x of 0 frames, x of 1M frames, y of return 0, y of the top tick,
the top tick's return."""


def dqn_return(image: np.ndarray, game: str, millions: float) -> float:
    """The DQN curve's value in `game`'s panel at `millions` M frames."""
    x0, x1, y0, y_top, top = PANELS[game]
    blue = np.abs(image - np.array(DQN_BLUE)).sum(-1) < 60
    rows = np.flatnonzero(blue[:, round(x0 + millions * (x1 - x0))])
    rows = rows[(rows > y_top - 30) & (rows < y0 + 10)]  # this panel's plot area only
    return float((y0 - np.median(rows)) / (y0 - y_top) * top)


def main() -> None:
    image = np.asarray(Image.open(sys.argv[1]).convert("RGB")).astype(int)
    budgets = [float(b) for b in sys.argv[2:]] or [1.0]
    print("| game | " + " | ".join(f"{b}M frames" for b in budgets) + " |")
    print("| --- |" + " --: |" * len(budgets))
    for game in PANELS:
        values = " | ".join(f"{dqn_return(image, game, b):.1f}" for b in budgets)
        print(f"| {game} | {values} |")


if __name__ == "__main__":
    main()
