"""Typed presets: per env family, the values of the config fields a user leaves unset.

A learner's presets are checked against its config class when its module is imported: each key
must name a field whose default is None (the fields a preset fills), each value must be of that
field's type. A misspelt key or a value of the wrong type is a TypeError naming the learner, the
preset, the key and the fields a preset may set:

    PRESETS = Presets(Config, {
        "classic": dict(total_steps=500_000, num_envs=4),
        "atari": dict(total_steps=10_000_000, num_envs=8),
    })
    config = PRESETS.fill(config, "classic")   # the fields left None, from the preset

`onebox evolve`'s presets are dataclasses of hyperparameters (`onebox.evo.presets`); their
values go through the same check (`check_fields`) when a run fills them in.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from onebox.run.folder import as_field_type


def check_fields(
    cls: type, values: Mapping[str, Any], where: str, names: list[str] | None = None
) -> dict[str, Any]:
    """`values` for fields of the dataclass `cls`, each as its field's type holds it; TypeError
    starting with `where` for a key that is not one of `names` (default: every init field of
    `cls`) or a value of the wrong type."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    allowed = list(fields) if names is None else names
    hints = typing.get_type_hints(cls)
    out = {}
    for key, value in values.items():
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            what = "has no field" if key not in fields else "cannot set the field"
            raise TypeError(
                f"{where}: {cls.__qualname__} {what} {key!r}{hint}; the fields it may set are "
                f"{', '.join(allowed)}"
            )
        out[key] = as_field_type(value, hints[key], key, where)
    return out


def learner_name(cls: type) -> str:
    """The learner a config class belongs to: its module's last name (`ppo` for
    `onebox.algos.ppo.Config`)."""
    return cls.__module__.rsplit(".", 1)[-1]


class Presets(Mapping[str, Mapping[str, Any]]):
    """A learner's presets by env family, checked against its config class `cls` when made (see
    the module's docstring); read-only."""

    def __init__(self, cls: type, presets: Mapping[str, Mapping[str, Any]]) -> None:
        self.cls = cls
        unset = [f.name for f in dataclasses.fields(cls) if f.init and f.default is None]
        self._presets = {
            family: MappingProxyType(
                check_fields(cls, values, f"{learner_name(cls)} preset {family!r}", unset)
            )
            for family, values in presets.items()
        }

    def __getitem__(self, family: str) -> Mapping[str, Any]:
        return self._presets[family]

    def __iter__(self) -> Iterator[str]:
        return iter(self._presets)

    def __len__(self) -> int:
        return len(self._presets)

    def of(self, family: str) -> Mapping[str, Any]:
        """The preset of `family`; ValueError naming the ones the learner has if there is none."""
        if family not in self._presets:
            raise ValueError(
                f"no {family!r} preset for {learner_name(self.cls)} (it has "
                f"{', '.join(self._presets)}); pick one with --preset"
            )
        return self._presets[family]

    def fill(self, config: Any, family: str) -> Any:
        """`config` with the fields left None taken from `family`'s preset, and `preset` set to
        `family`."""
        return dataclasses.replace(fill_preset(config, self.of(family)), preset=family)


def fill_preset(config: Any, preset: Mapping[str, Any]) -> Any:
    """`config` with every field that is None replaced by the preset's value."""
    missing = {
        f.name: preset[f.name]
        for f in dataclasses.fields(config)
        if getattr(config, f.name) is None and f.name in preset
    }
    return dataclasses.replace(config, **missing)
