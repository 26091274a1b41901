"""Read the MinAtar paper's DQN and AC(0.8) learning curves off its figure, at given frame budgets.

The figure is `img/learning_curves.gif` of the `minatar` repository (github.com/kenjyoung/MinAtar;
the README's "Results"): for each game, the moving average of the last 100 training episodes'
returns, the mean of 30 seeds, against frames (0 to 5M). This finds a curve's pixels (DQN's
blue, AC(0.8)'s green) in the column of each budget and maps their median row through the
panel's axis ticks (located once in the 3038 x 1629 image, below). Where a curve is steep the
reading's error is its slope times about 0.01M frames (half a pixel column is 0.0036M).

    python benchmarks/minatar_paper_curves.py PATH/TO/learning_curves.gif 0.3 0.5 1.0
"""

from __future__ import annotations

import sys

import numpy as np
from PIL import Image

CURVES = {"DQN": (1, 115, 178), "AC(0.8)": (2, 158, 115)}
"""Each curve's colour (matplotlib's colorblind palette: blue, green)."""
NEAR = 4
"""Columns either side to look in where another curve is drawn over this one (0.03M frames)."""
PANELS = {
    "Seaquest": (614, 754, 624, 228, 20),
    "Breakout": (1569, 1708, 637, 286, 15),
    "Asterix": (106, 246, 1407, 1000, 20),
    "Freeway": (1202, 1341.5, 1398, 987, 50),
    "SpaceInvaders": (2295, 2434, 1400, 957, 200),
}
"""Per game, in image pixels: x of 0 frames, x of 1M frames, y of return 0, y of the top tick,
the top tick's return."""


def curve_return(image: np.ndarray, curve: str, game: str, millions: float) -> float | None:
    """The value of `curve` (a key of CURVES) in `game`'s panel at `millions` M frames, from the
    nearest column within `NEAR` pixels that shows it; None where another curve covers it."""
    x0, x1, y0, y_top, top = PANELS[game]
    colour = np.abs(image - np.array(CURVES[curve])).sum(-1) < 60
    x, x_end = round(x0 + millions * (x1 - x0)), round(x0 + 5 * (x1 - x0))
    top_edge = y_top - (y0 - y_top) / 4  # this panel's plot area only (above its top tick)
    for dx in sorted(range(-NEAR, NEAR + 1), key=abs):
        rows = np.flatnonzero(colour[:, min(x + dx, x_end)])
        rows = rows[(rows > top_edge) & (rows < y0 + 10)]
        if len(rows):
            return float((y0 - np.median(rows)) / (y0 - y_top) * top)
    return None


def main() -> None:
    image = np.asarray(Image.open(sys.argv[1]).convert("RGB")).astype(int)
    budgets = [float(b) for b in sys.argv[2:]] or [1.0]
    print("| game | curve | " + " | ".join(f"{b}M frames" for b in budgets) + " |")
    print("| --- | --- |" + " --: |" * len(budgets))
    for game in PANELS:
        for curve in CURVES:
            read = [curve_return(image, curve, game, b) for b in budgets]
            values = " | ".join("covered" if v is None else f"{v:.1f}" for v in read)
            print(f"| {game} | {curve} | {values} |")


if __name__ == "__main__":
    main()
