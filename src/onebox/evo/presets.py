"""Presets of `onebox evolve`: per algorithm and env family, the hyperparameters, the generations
and the network a run starts from. Any field given on the command line wins over its preset.

- `classic` (classic control and any other small env): small populations that solve CartPole-v1
  within a minute on two cores. ES's center first scored 475 or more after 2 to 8 generations for
  11 of seeds 0-12, after 27 and 38 for the other two (seeds 0 and 7): hence 40 generations.
- `mujoco`: ES as Salimans et al. ran MuJoCo (sigma 0.02, Adam 0.01, weight decay 0.005, a 64-64
  tanh MLP, observation normalization), with a population sized for one machine; ARS V2-t with a
  linear policy and HalfCheetah's settings of Mania et al. (step 0.02, 32 directions, the top 4,
  noise 0.03; the paper tunes these per env); the GA with a population of 1,000.
- `atari`: the deep GA's Atari settings (Such et al.: population 1,000, truncation 20, sigma
  0.002, elite re-evaluation on 30 episodes), OpenAI ES's (population 5,000), and random search.
- `minatar` (`MinAtar/*` ids, the MinAtar paper's small CNN): populations of 256 that fit two
  cores, sigma 0.02 (the networks' weights are N(0, 1/fan_in), as for Atari, but the net is
  small), no observation normalization (the inputs are 0/1 grids). The GA on
  MinAtar/Breakout-v1 with a 1M-frame budget (108-131 generations, seeds 1-3) gave elites that
  scored 2.9-4.9 over 100 episodes (random play: 0.4; docs/results.md); sigma 0.01 or 0.005 did
  no better, nor did a 5M-frame budget. ES: 1.4-2.5 at 1M frames (sigma 0.05: 1.3-2.4, 0.1:
  0.5); RS (ARS): 3.4-4.3.
  Episodes end at `MINATAR_CAP` steps.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import onebox.envs
from onebox.evo.es import ESParams
from onebox.evo.ga import GAParams
from onebox.evo.rs import RSParams

Family = Literal["classic", "mujoco", "atari", "minatar"]


@dataclass(frozen=True)
class Preset:
    """One env family's defaults for one algorithm."""

    params: GAParams | ESParams | RSParams
    """The algorithm's hyperparameters, every field set."""
    generations: int
    """Generations to run."""
    hidden: tuple[int, ...] | None = None
    """Hidden sizes (`(0,)`: a linear policy); None: the architecture's default."""
    max_episode_steps: int | None = None
    """Episode cap in env steps; None: the env's time limit (see `PopulationEvaluator`)."""


MINATAR_CAP = 5_000
"""The `minatar` presets' episode cap: MinAtar's games have no time limit, and an evolved network
can play one episode forever (waiting at Seaquest's surface); learners' MinAtar episodes were at
most about 2,100 steps (Space Invaders, PPO and APPO at 1M steps; Freeway's games end at 2,500),
and a cap near that keeps such networks from spending a generation's frames."""

PRESETS: dict[str, dict[Family, Preset]] = {
    "ga": {
        "classic": Preset(GAParams(population=64, truncation=8, sigma=0.05, episodes=1,
                                   elite_candidates=4, elite_episodes=10), generations=10),
        "mujoco": Preset(GAParams(population=1000, truncation=20, sigma=0.02, episodes=1,
                                  elite_candidates=10, elite_episodes=10), generations=1000),
        "atari": Preset(GAParams(population=1000, truncation=20, sigma=0.002, episodes=1,
                                 elite_candidates=10, elite_episodes=30), generations=100),
        "minatar": Preset(GAParams(population=256, truncation=16, sigma=0.02, episodes=1,
                                   elite_candidates=8, elite_episodes=10), generations=200,
                           max_episode_steps=MINATAR_CAP),
    },
    "es": {
        "classic": Preset(ESParams(population=48, sigma=0.05, lr=0.05, weight_decay=0.0,
                                   episodes=1, center_episodes=5, obs_norm=True), generations=40),
        "mujoco": Preset(ESParams(population=1000, sigma=0.02, lr=0.01, weight_decay=0.005,
                                  episodes=1, center_episodes=5, obs_norm=True),
                         generations=1000, hidden=(64, 64)),
        "atari": Preset(ESParams(population=5000, sigma=0.02, lr=0.01, weight_decay=0.005,
                                 episodes=1, center_episodes=5, obs_norm=True), generations=100),
        "minatar": Preset(ESParams(population=256, sigma=0.02, lr=0.01, weight_decay=0.005,
                                   episodes=1, center_episodes=5, obs_norm=False),
                          generations=200, max_episode_steps=MINATAR_CAP),
    },
    "rs": {
        "classic": Preset(RSParams(population=48, sigma=0.05, lr=0.05, top_directions=8,
                                   episodes=1, center_episodes=5, obs_norm=True), generations=15),
        "mujoco": Preset(RSParams(population=64, sigma=0.03, lr=0.02, top_directions=4,
                                  episodes=1, center_episodes=5, obs_norm=True),
                         generations=1000, hidden=(0,)),
        "atari": Preset(RSParams(population=100, sigma=0.02, lr=0.02, top_directions=16,
                                 episodes=1, center_episodes=5, obs_norm=True), generations=100),
        "minatar": Preset(RSParams(population=100, sigma=0.02, lr=0.02, top_directions=8,
                                   episodes=1, center_episodes=5, obs_norm=False),
                          generations=200, max_episode_steps=MINATAR_CAP),
    },
}  # fmt: skip
"""Per algorithm ("ga", "es", "rs") and env family."""


def env_family(env_id: str) -> Family:
    """Atari by backend, MinAtar by its `MinAtar/` ids, MuJoCo by Gymnasium's registration of the
    id, else classic."""
    if onebox.envs.backend_of(env_id) == "atari":
        return "atari"
    if env_id.startswith("MinAtar/"):
        return "minatar"
    import gymnasium

    spec = gymnasium.envs.registry.get(env_id)
    entry = spec.entry_point if spec is not None else None
    if isinstance(entry, str) and entry.startswith("gymnasium.envs.mujoco"):
        return "mujoco"
    return "classic"


def preset_fields(algo: str, family: Family) -> dict[str, object]:
    """The config fields a preset fills: the params', `generations` and `hidden`."""
    preset = PRESETS[algo][family]
    return {**dataclasses.asdict(preset.params), "generations": preset.generations,
            "hidden": preset.hidden, "max_episode_steps": preset.max_episode_steps}  # fmt: skip
