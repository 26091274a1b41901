"""Which Atari games there are and how they are configured: ale-py's single-player ROMs as
"<Game>-v5" ids, and the options of onebox's Atari pool (`onebox.envs.atari.AtariEnvPool`) with
their presets, checked before a pool is built."""

from __future__ import annotations

import functools
import re
from typing import Any

from onebox.envs.base import apply_options

INSTALL_HINT = 'Atari envs need ale-py >= 0.11: pip install "onebox[atari]"'

OPTIONS: dict[str, tuple[Any, str]] = {
    "frameskip": (4, "emulator frames per step, the action repeated and the rewards summed"),
    "maxpool": (True, "observe the pixel-wise max of the last two frames of a step"),
    "grayscale": (True, "grayscale frames (False: RGB, a trailing axis of 3)"),
    "img_height": (84, "frame height after resizing (area interpolation)"),
    "img_width": (84, "frame width after resizing"),
    "stack_num": (4, "frames stacked in an observation, oldest first"),
    "noop_max": (30, "a reset takes a random number of no-ops below this (0 or 1: none)"),
    "use_fire_reset": (True, "press FIRE at reset (and after a life loss) in games that have it"),
    "episodic_life": (True, "terminated at each lost life; the game itself goes on"),
    "reward_clip": (True, "rewards clipped to their sign; info keeps the true score"),
    "repeat_action_probability": (0.0, "sticky actions: chance the previous action is repeated"),
    "full_action_space": (False, "all 18 actions instead of the game's minimal set"),
    "max_num_frames_per_episode": (108_000, "truncate a game after this many frames (0: never)"),
}
"""Every option: name -> (its value in the "envpool" preset, doc)."""

PRESETS: dict[str, dict[str, Any]] = {
    "envpool": {name: default for name, (default, _) in OPTIONS.items()},
    "machado": {
        **{name: default for name, (default, _) in OPTIONS.items()},
        "repeat_action_probability": 0.25,
        "full_action_space": True,
        "episodic_life": False,
        "use_fire_reset": False,
    },
}
"""Option defaults by preset. "envpool": the EnvPool / CleanRL training setting. "machado": Machado
et al. (2018): sticky actions 0.25, the full 18 actions, no episodic life, no FIRE reset (the rest
as "envpool")."""

_MULTIPLAYER_ONLY = frozenset({"combat", "joust", "maze_craze", "warlords"})
"""ROMs ale-py ships that ALE cannot run single-player (ale-py registers no v5 env for them)."""

_ID = re.compile(r"^(?:ALE/)?([A-Z][A-Za-z0-9]*)-v5$")


def ale_module() -> Any:
    """The `ale_py` module; ImportError with the install command without it."""
    try:
        import ale_py
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return ale_py


@functools.cache
def games() -> dict[str, str]:
    """Game name ("MsPacman") -> ROM id ("ms_pacman") for every single-player ROM of ale-py."""
    ale_py = ale_module()
    return {
        ale_py.registration.rom_id_to_name(rom): rom
        for rom in ale_py.roms.get_all_rom_ids()
        if rom not in _MULTIPLAYER_ONLY
    }


def atari_ids() -> list[str]:
    """Every ALE game as "<Game>-v5"; empty without ale-py."""
    try:
        return sorted(f"{game}-v5" for game in games())
    except ImportError:
        return []


def game_name(env_id: str) -> str | None:
    """The game of a "<Game>-v5" or "ALE/<Game>-v5" id ("Pong"), else None."""
    m = _ID.match(env_id)
    return m.group(1) if m else None


def rom_id(env_id: str) -> str:
    """ale-py's ROM id of an Atari env id: "ALE/MsPacman-v5" -> "ms_pacman"."""
    game = game_name(env_id)
    if game is None or game not in games():
        raise ValueError(f"{env_id!r} is not an ALE game id")
    return games()[game]


def resolve_atari_options(env_id: str, preset: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The preset's options with `kwargs` applied, names, types and ranges checked."""
    if preset not in PRESETS:
        raise ValueError(f"unknown Atari preset {preset!r}; choose one of {', '.join(PRESETS)}")
    config = apply_options(env_id, OPTIONS, PRESETS[preset], kwargs)
    for name in ("frameskip", "img_height", "img_width", "stack_num"):
        if config[name] < 1:
            raise ValueError(f"{name} must be >= 1, got {config[name]}")
    if not 0 <= config["noop_max"] < 2**31:
        raise ValueError(f"noop_max must be >= 0, got {config['noop_max']}")
    if not 0 <= config["max_num_frames_per_episode"] < 2**31:
        raise ValueError(
            "max_num_frames_per_episode must be >= 0 (0: no cap), "
            f"got {config['max_num_frames_per_episode']}"
        )
    if not 0.0 <= config["repeat_action_probability"] <= 1.0:
        raise ValueError(
            f"repeat_action_probability must be in [0, 1], got {config['repeat_action_probability']}"
        )
    return config
