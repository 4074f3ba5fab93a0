"""The preset registry (every preset module registers into it) and the
engine a preset's ``strategy`` key selects."""

from __future__ import annotations

from fedjax_pfl.core import EngineConfig

from ._config import Preset

PRESETS: dict[str, Preset] = {}


BUILTIN: set[str] = set()  # the package's own presets


def register(preset: Preset) -> Preset:
    """Adds one of the package's presets to :data:`PRESETS`."""
    PRESETS[preset.name] = preset
    BUILTIN.add(preset.name)
    return preset


def register_preset(preset: Preset, *, replace: bool = False) -> Preset:
    """Registers a preset of your own, so ``run_preset``, ``run_study`` and
    ``fedjax-pfl run/list`` know it (from the command line: put the call in a
    Python file and pass ``--preset-file FILE`` or set ``$FEDJAX_PFL_PRESETS``).

    Raises:
      ValueError: ``preset`` is not a :class:`Preset`, lacks the keys every run
        reads (``rounds``, ``eval_every``, ``seed``, ``checkpoint_every``,
        ``strategy``: :func:`run_keys` makes them), or its name is a built-in
        preset's (or, without ``replace``, another registered one's).
    """
    if not isinstance(preset, Preset):
        raise ValueError(f"preset: must be an experiments.Preset, got "
                         f"{type(preset).__name__}")
    if not isinstance(preset.name, str) or not preset.name:
        raise ValueError(f"preset.name: must be a non-empty string, got "
                         f"{preset.name!r}")
    missing = [k for k in ("rounds", "eval_every", "seed", "checkpoint_every",
                           "strategy") if k not in preset.keys]
    if missing:
        raise ValueError(f"preset.keys: {preset.name} lacks {missing}; start from "
                         "experiments.run_keys(rounds, eval_every)")
    if preset.name in BUILTIN:
        raise ValueError(f"preset.name: {preset.name!r} is a built-in preset; "
                         "choose another name")
    if preset.name in PRESETS and not replace and PRESETS[preset.name] is not preset:
        raise ValueError(f"preset.name: {preset.name!r} is already registered; "
                         "pass replace=True to replace it")
    PRESETS[preset.name] = preset
    return preset


def load_preset_file(path) -> None:
    """Runs the Python file ``path``, which registers presets with
    :func:`register_preset`. Raises ``ValueError`` naming the file."""
    import os
    import runpy

    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise ValueError(f"preset file: {path!r} is not a file")
    try:
        runpy.run_path(os.fspath(path), run_name="fedjax_pfl_presets")
    except ValueError as e:
        raise ValueError(f"preset file {path}: {e}") from None


def engine(cfg) -> EngineConfig:
    """The execution engine of a preset run (``strategy='auto'``: the backend's
    measured default)."""
    return EngineConfig(None if cfg["strategy"] == "auto" else cfg["strategy"])
