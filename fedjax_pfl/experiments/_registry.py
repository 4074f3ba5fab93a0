"""The preset registry (every preset module registers into it) and the
engine a preset's ``strategy`` key selects."""

from __future__ import annotations

from fedjax_pfl.core import EngineConfig

from ._config import Preset

PRESETS: dict[str, Preset] = {}


def register(preset: Preset) -> Preset:
    """Adds ``preset`` to :data:`PRESETS` under its name."""
    PRESETS[preset.name] = preset
    return preset


def engine(cfg) -> EngineConfig:
    """The execution engine of a preset run (``strategy='auto'``: the backend's
    measured default)."""
    return EngineConfig(None if cfg["strategy"] == "auto" else cfg["strategy"])
