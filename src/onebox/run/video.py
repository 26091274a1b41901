"""`write_video`: frames to an mp4 (H.264, via imageio's ffmpeg plugin)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def write_video(frames: Sequence[np.ndarray] | np.ndarray, path: str | Path, fps: int = 30) -> Path:
    """Write uint8 frames, (T, H, W, 3) RGB or (T, H, W) grayscale, to the mp4 `path`.

    H.264 needs even sizes: an odd height or width gets one black row or column.
    """
    if isinstance(fps, bool) or not isinstance(fps, int) or fps <= 0:
        raise ValueError(f"fps must be a positive int, got {fps!r}")
    if len(frames) == 0:
        raise ValueError("write_video got no frames; record at least one")
    shapes = {np.shape(f) for f in frames}
    if len(shapes) > 1:
        raise ValueError(f"all frames must have one shape, got {sorted(shapes)}")
    video = np.asarray(frames)
    if video.dtype != np.uint8:
        raise TypeError(
            f"frames must be uint8 (0-255), got {video.dtype}; convert with "
            "(frames * 255).clip(0, 255).astype(np.uint8) or .astype(np.uint8)"
        )
    if video.ndim == 3:
        video = np.repeat(video[..., None], 3, axis=-1)
    if video.ndim != 4 or video.shape[-1] != 3 or min(video.shape[1:3]) == 0:
        raise ValueError(
            f"frames must be (T, H, W, 3) RGB or (T, H, W) grayscale, got shape {np.shape(frames)}"
        )
    pad_h, pad_w = video.shape[1] % 2, video.shape[2] % 2
    if pad_h or pad_w:
        video = np.pad(video, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)))
    import imageio.v2 as imageio

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with imageio.get_writer(
        path, format="FFMPEG", mode="I", fps=fps, codec="libx264", macro_block_size=1
    ) as writer:
        for frame in video:
            writer.append_data(frame)
    return path
