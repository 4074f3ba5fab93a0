"""Experiment presets: named, validated configurations of the papers' runs.

A :class:`Preset` is a paper experiment (a table's setting) with its
hyperparameters as typed, validated keys; ``resolve`` turns ``--set key=value``
strings into a checked config BEFORE any data is loaded, so a typo or an invalid
value costs nothing and the error lists what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax

from fedjax_pfl.core import check_engine, evaluate_state, execution
from fedjax_pfl.data import FederatedData


@dataclasses.dataclass(frozen=True)
class Key:
    """One configuration key.

    Attributes:
      default: the paper's value (or the CPU-scaled one, said in ``help``); its
        type is the key's type (``None`` defaults need ``type``).
      help: one line.
      choices: allowed values, if the key is categorical.
      low, high: inclusive numeric bounds (``high_open`` makes ``high`` exclusive).
      type: overrides the type taken from ``default``.
      check: ``value -> error message or None`` for what the above cannot say.
      only_if: ``(other_key, values)``: the key has an effect only while
        ``other_key`` is one of ``values`` (e.g. TERM's tilt only with
        ``method=term``); setting it otherwise is refused, since it would
        silently do nothing.
    """

    default: Any
    help: str = ""
    choices: tuple | None = None
    low: float | None = None
    high: float | None = None
    high_open: bool = False
    type: type | None = None
    check: Callable[[Any], str | None] | None = None
    only_if: tuple[str, tuple] | None = None

    @property
    def kind(self) -> type:
        return self.type or type(self.default)


class Experiment(NamedTuple):
    """What a preset's builder returns: everything ``simulate`` needs.

    Attributes:
      algorithm: the :class:`fedjax_pfl.Algorithm`.
      data: the federated data (attacked, where the config says so).
      eval_mask: ``[num_clients]`` mask for the summaries (benign clients), or None.
      privacy: a :class:`fedjax_pfl.privacy.Monitor` or None.
      views: the evaluated models to compare in the plots, e.g.
        ``("global", "personal")``.
      info: extra facts for the run's config file (data sizes, epsilon plan...).
      callback: an optional ``simulate(callback=...)`` adding keys to each
        history row (e.g. LINDT's gain beta).
    """

    algorithm: Any
    data: Any
    eval_mask: Any = None
    privacy: Any = None
    views: tuple[str, ...] = ("global",)
    info: Mapping[str, Any] = {}
    callback: Callable | None = None


@dataclasses.dataclass(frozen=True)
class Preset:
    """A paper experiment.

    Attributes:
      name: the CLI name, e.g. ``ditto-fmnist``.
      paper: the paper and table it reproduces.
      summary: one line.
      scaled: what is scaled down for CPU relative to the paper (empty if nothing).
      keys: the configuration keys.
      build: ``config -> Experiment`` (loads data, builds the algorithm).
      needs: datasets it reads from ``$FEDJAX_PFL_DATA_DIR`` (empty: synthetic).
      rules: ``config -> error message or None``: checks across keys (e.g. an
        attack needs a malicious ratio), run on the resolved config before any
        data is loaded.
      cost: the measured time and peak memory of a run at the defaults, as
        ``fedjax-pfl list`` shows it (empty: not measured).
    """

    name: str
    paper: str
    summary: str
    scaled: str
    keys: Mapping[str, Key]
    build: Callable[[dict], Experiment]
    needs: tuple[str, ...] = ()
    rules: tuple[Callable[[dict], str | None], ...] = ()
    cost: str = ""

    def defaults(self) -> dict[str, Any]:
        return {k: v.default for k, v in self.keys.items()}


# Keys every preset has (the driver's).
def run_keys(rounds: int, eval_every: int, strategy: str = "auto") -> dict[str, Key]:
    return {
        "rounds": Key(rounds, "communication rounds", low=1),
        "eval_every": Key(eval_every, "rounds between evaluations", low=1),
        "checkpoint_every": Key(None, "rounds between checkpoints, a multiple "
                                "of eval_every (default: every evaluation; 0: no "
                                "checkpoints, and no resume)", low=0, type=int),
        "seed": Key(0, "seeds the data partition, the attackers and the run", low=0),
        "strategy": Key(strategy, "client-parallel strategy (auto: the backend's "
                        "measured default; unroll: the cohort without a loop, "
                        "for small cohorts)",
                        choices=("auto", "vmap", "map", "unroll")),
    }


def _parse(name: str, key: Key, text: str) -> Any:
    kind = key.kind
    try:
        if kind is bool:
            low = text.strip().lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return low in ("true", "1", "yes")
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        return str(text)
    except ValueError:
        raise ValueError(f"{name}: expected {_KIND_NAMES.get(kind, kind.__name__)}, "
                         f"got {text!r}") from None


_KIND_NAMES = {int: "an integer", float: "a number", bool: "true or false",
               str: "a string"}


def check_value(name: str, key: Key, value: Any) -> None:
    """Raises ValueError naming ``name`` and what is allowed."""
    if key.check is not None and (problem := key.check(value)):
        raise ValueError(f"{name}: {problem}, got {value!r}")
    if key.choices is not None and value not in key.choices:
        raise ValueError(f"{name}: must be one of {list(key.choices)}, got {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError(f"{name}: must be a number (finite), got {value!r}")
        if key.low is not None and value < key.low:
            raise ValueError(f"{name}: must be >= {key.low}, got {value!r}")
        if key.high is not None and (value >= key.high if key.high_open
                                     else value > key.high):
            op = "<" if key.high_open else "<="
            raise ValueError(f"{name}: must be {op} {key.high}, got {value!r}")


def resolve(preset: Preset, overrides: Mapping[str, Any] | None = None) -> dict:
    """The preset's defaults with ``overrides`` applied and every value checked.

    ``overrides`` values may be strings (from ``--set key=value``), parsed by the
    key's type, or already typed. Raises ``ValueError`` for an unknown key (the
    message lists the valid keys) or an invalid value (it names the key and the
    allowed values or range)."""
    cfg = preset.defaults()
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ValueError(f"overrides: must be a mapping of key -> value, got "
                         f"{overrides!r}")
    for name, value in (overrides or {}).items():
        if name not in preset.keys:
            raise ValueError(f"{name}: not a key of preset {preset.name!r}; valid "
                             f"keys: {', '.join(sorted(preset.keys))}")
        key = preset.keys[name]
        if isinstance(value, str) and key.kind is not str:
            value = _parse(name, key, value)
        elif key.kind is float and isinstance(value, int) and not isinstance(value,
                                                                              bool):
            value = float(value)
        elif not isinstance(value, key.kind):
            raise ValueError(f"{name}: expected {_KIND_NAMES.get(key.kind)}, got "
                             f"{value!r}")
        cfg[name] = value
    for name, key in preset.keys.items():
        check_value(name, key, cfg[name])
    for name in overrides or ():
        if problem := inert(preset, cfg, name):
            raise ValueError(problem)
    for rule in preset.rules:
        if problem := rule(cfg):
            raise ValueError(problem)
    ce, ee = cfg.get("checkpoint_every", 0), cfg.get("eval_every", 1)
    if ce and ce % ee:
        raise ValueError(f"checkpoint_every: must be a multiple of eval_every "
                         f"({ee}), got {ce}")
    return cfg


def inert(preset: Preset, cfg: Mapping[str, Any], name: str) -> str | None:
    """Why key ``name`` has no effect in ``cfg`` (its ``only_if`` does not
    hold), or None."""
    cond = preset.keys[name].only_if
    if cond is None or cfg[cond[0]] in cond[1]:
        return None
    allowed = ", ".join(map(str, cond[1]))
    return (f"{name}: has no effect unless {cond[0]} is {allowed} (here "
            f"{cond[0]}={cfg[cond[0]]!r}); set {cond[0]}, or leave {name} out")


def attack_needs_ratio(attack: str = "attack", ratio: str = "ratio"):
    """A preset rule: an attack needs a malicious ratio above 0, and a ratio
    above 0 needs an attack (either alone would run a clean experiment)."""
    def rule(cfg):
        if cfg[attack] != "none" and cfg[ratio] == 0:
            return (f"{ratio}: {attack}={cfg[attack]} needs the fraction of "
                    f"malicious clients, e.g. {ratio}=0.5; with {ratio}=0 no client "
                    "attacks")
        if cfg[attack] == "none" and cfg[ratio] > 0:
            return (f"{ratio}: {cfg[ratio]} has no effect without an attack "
                    f"({attack}=none); set {attack}, or {ratio}=0")
        return None
    return rule


CONFIG_KEYS = ("preset", "seeds", "out", "set")


def load_config(path) -> dict[str, Any]:
    """A run or study from a TOML (``.toml``) or YAML (``.yaml``/``.yml``) file::

        preset = "ditto-synthetic"
        seeds = "0-4"              # or [0, 1, 2]; optional
        out = "runs/my-study"      # optional
        [set]
        rounds = 100
        method = ["ditto", "global"]   # a list of values: one run each

    Returns the mapping (``set`` values typed as written). Raises
    ``ValueError`` naming the file and what is wrong."""
    import os

    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise ValueError(f"config: {path!r} is not a file")
    text = open(path, encoding="utf-8").read()
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in (".toml", ".yaml", ".yml"):
        raise ValueError(f"config: {path} must end in .toml, .yaml or .yml")
    try:
        if suffix == ".toml":
            import tomllib

            cfg = tomllib.loads(text)
        else:
            import yaml

            cfg = yaml.safe_load(text) or {}
    except Exception as e:  # the parsers' own errors, with line numbers
        raise ValueError(f"config: {path} cannot be read: {e}") from None
    if not isinstance(cfg, Mapping):
        raise ValueError(f"config: {path} must hold a table of settings")
    unknown = sorted(set(cfg) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"config: {path} has unknown entries {unknown}; allowed: "
                         f"{', '.join(CONFIG_KEYS)} (preset keys go in [set])")
    if not isinstance(cfg.get("set", {}), Mapping):
        raise ValueError(f"config: {path}: `set` must be a table of key = value")
    for k, v in cfg.get("set", {}).items():
        if isinstance(v, (Mapping, list)) and (isinstance(v, Mapping) or any(
                isinstance(x, (Mapping, list)) for x in v)):
            raise ValueError(f"config: {path}: set.{k} must be a value or a list "
                             f"of values, got {v!r}")
    return dict(cfg)


def parse_sets(items: list[str] | None) -> dict[str, str]:
    """``['a=1', 'b=x']`` -> ``{'a': '1', 'b': 'x'}``; rejects malformed items."""
    out = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--set: expected key=value, got {item!r}")
        out[name.strip()] = value.strip()
    return out


def check_attack(attack: str, ratio: float, num_clients: int,
                 name: str = "ratio") -> None:
    """A malicious ``ratio`` must make at least one client malicious (it is
    ``int(ratio * num_clients)`` clients) and needs an attack; checked once the
    number of clients is known (after loading the data)."""
    if attack == "none" and ratio > 0:
        raise ValueError(f"{name}: {ratio} has no effect without an attack "
                         "(attack=none); set attack, or ratio=0")
    if ratio > 0 and int(ratio * num_clients) == 0:
        raise ValueError(f"{name}: {ratio} of {num_clients} clients makes no client "
                         f"malicious (int(ratio * clients) = 0); use ratio >= "
                         f"{1 / num_clients:.3g}, or 0 for a clean run")


def preflight(algorithm, data, key, *, eval_mask=None, splits=("test",),
              views=None, engine=None) -> None:
    """Everything ``simulate(algorithm, data, key=key, eval_mask=eval_mask,
    splits=splits)`` checks before its first round, without running anything
    (``jax.eval_shape`` traces only): the evaluation options and mask, the
    evaluated ``views``, the data against the models (features that fit their
    input, labels inside their classes) and one round on this data (e.g. a
    cohort larger than the number of clients). Presets call it after loading the
    data and before writing any file or training anything (even the private
    reference models some presets train while they are built). ``engine``:
    the run's :class:`fedjax_pfl.EngineConfig` (as ``simulate`` takes it).

    Raises:
      ValueError: naming the argument or ``data``.
    """
    if not isinstance(data, FederatedData):
        raise ValueError(f"data: must be a FederatedData, got {type(data).__name__}")
    if not all(callable(getattr(algorithm, a, None))
               for a in ("init", "round_step", "eval_models")):
        raise ValueError(f"algorithm: must be an Algorithm, got "
                         f"{type(algorithm).__name__}")
    check_engine(engine)
    init_key, run_key = jax.random.split(key)
    template = jax.eval_shape(lambda k: algorithm.init(k, data), init_key)
    jax.eval_shape(lambda s: evaluate_state(
        algorithm, s, data, key=key, views=views, splits=splits, mask=eval_mask,
        engine=engine), template)
    with execution(engine):
        jax.eval_shape(lambda s, d, k: algorithm.round_step(s, d, k), template,
                       data, run_key)
