"""The contract every factory of ``fedjax_pfl.algorithms`` keeps.

Every public callable of ``fedjax_pfl.algorithms`` whose return annotation is
``Algorithm`` is discovered and checked on tiny data (a 6-8-3 MLP, four
synthetic clients, cohorts of 2, one local step, an engine with ``unroll=1``):

1. every numeric keyword hyperparameter refuses NaN, inf, a negative number,
   zero, a string and a bool (an integer one also a fraction; a tuple of numbers
   the same values inside a tuple, and an empty tuple) with a ``ValueError``
   naming it, when the factory is called or at ``init``, before any round,
   unless ``SPECS[...].allowed`` documents the value (``lam=0``: no coupling,
   ``clip=inf``: no clipping, ...);
2. every choice argument refuses an unknown value by name, and every flag
   (a bool default) a value that is not a bool;
3. a jitted round equals the same round called without ``jit``;
4. the jitted round compiles once across three rounds;
5. the vmap engine equals the map engine run one client at a time (the
   lifted kernel == a loop over single clients, at the factory level).

3 and 5 are one comparison (see :func:`test_round_contract`) so that each
factory compiles one whole round; XLA's fast compile mode is on for it.
A new factory fails ``test_every_factory_has_a_spec`` until ``SPECS`` has an
entry for it: how to build it on tiny data and which "bad" values it allows.
"""

import functools
import inspect
import math
import re
from typing import NamedTuple

import jax
import numpy as np
import pytest

from fedjax_pfl import algorithms, models
from fedjax_pfl import data as fdata
from fedjax_pfl import toolkit as tk
from fedjax_pfl.core import Algorithm, EngineConfig, execution

MLP = models.mlp((6,), 3, hidden=(8,))
KEY = jax.random.key(0)  # the run key of every round


@functools.cache
def _data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=4, dim=6, num_classes=3,
                                   min_size=20, max_size=40,
                                   fractions=(0.8, 0, 0.2), seed=5)


@functools.cache
def _dual():
    return algorithms.dual_mlp((6,), 3, (8,))


def _discover() -> dict:
    """Every public callable of ``fedjax_pfl.algorithms`` returning Algorithm."""
    out = {}
    for name in sorted(dir(algorithms)):
        fn = getattr(algorithms, name)
        if name.startswith("_") or not callable(fn) or inspect.isclass(fn):
            continue
        try:
            ann = inspect.signature(fn).return_annotation
        except (TypeError, ValueError):
            continue
        if ann is Algorithm or (isinstance(ann, str)
                                and ann.split(".")[-1] == "Algorithm"):
            out[name] = fn
    return out


FACTORIES = _discover()


class Spec(NamedTuple):
    """How to build a factory on tiny data, and what it allows.

    Attributes:
      kwargs: keywords it needs beyond ``BASE`` (required arguments, smaller
        settings).
      allowed: ``{argument: kinds}``, the kinds of "bad" values (``nan``,
        ``inf``, ``negative``, ``zero``, ``string``, ``bool``, ``fraction``,
        ``empty``) that are valid for that argument, each with a reason.
      wraps: for a factory taking ``**kwargs``, the factory they go to (its
        keywords are checked too).
      fixed: keywords of ``wraps`` that the wrapper sets itself.
      dual: builds on ``algorithms.dual_mlp`` instead of the MLP (LINDT).
    """

    kwargs: dict = {}
    allowed: dict = {}
    wraps: str | None = None
    fixed: tuple = ()
    dual: bool = False


# Applied to every factory that has the argument.
COMMON_ALLOWED: dict = {}
FINETUNE_VIEW = {  # fedavg-style finetuning views
    "finetune_steps": {"zero"},  # 0: no finetuned view (the default)
    "finetune_lam": {"zero"},  # 0: plain finetuning
}
FEDPLUS_ALLOWED = {
    "sigma": {"zero"},  # kappa = 1: the FedAvg / local-training reductions
    "init_mix": {"zero"},  # continue from w_k (Fed+ itself)
    "agg_tol": {"zero"},  # run all agg_iters
}
FEDPLUS_WRAPPED = Spec({"sigma": 0.1}, FEDPLUS_ALLOWED, wraps="fedplus",
                       fixed=("psi",))
DP = {"clip": 1.0, "noise_multiplier": 0.5, "sampling_rate": 0.25,
      "max_batch_size": 16}
DP_ALLOWED = {"clip": {"inf"}, "noise_multiplier": {"zero"}}  # the non-private run
DP_SGD = ("dp_fedavg", "dp_fedprox", "dp_scaffold", "dp_feddyn", "dp_qffl", "ali_dpfl")

# Tiny settings every factory gets when it has the keyword.
BASE = dict(num_local_steps=1, batch_size=8, cohort_size=2, cohort="uniform",
            weighted=False)
# The engines the rounds run under (execution is never a factory argument).
VMAP = EngineConfig("vmap", unroll=1)
MAP = EngineConfig("map", map_batch_size=1, unroll=1)

SPECS = {
    "afl": Spec(allowed={"lambda_lr": {"zero"}}),  # lam stays uniform (FedAvg)
    # R_s < R_c (adaptive) and up to 3 steps a round
    "ali_dpfl": Spec({**DP, "num_rounds": 2, "max_steps": 6, "tau_init": 2,
                      "tau_max": 3}, {
        **DP_ALLOWED,
        "loss_clip": {"inf"},  # no loss-change bound (not accounted)
        "loss_noise_multiplier": {"zero"},  # an exact loss change (not accounted)
    }),
    "apfl": Spec(allowed={
        "alpha": {"zero"},  # alpha in [0, 1]; 0: the global model only
        "alpha_lr": {"zero"},  # alpha stays at its initial value
    }),
    "ditto": Spec(allowed={
        **FINETUNE_VIEW,
        "lam": {"zero"},  # local training (the lam = 0 reduction)
        "min_val_examples": {"zero"},  # every client selects its lambda
        "fallback_lam": {"zero"},  # any lambda >= 0
        "lam_grid": {"zero"},  # candidates >= 0
    }),
    "dp_fedavg": Spec(DP, {
        "clip": {"inf"},  # no clipping (documented)
        "noise_multiplier": {"zero"},  # no noise
    }),
    "dp_feddyn": Spec(DP, DP_ALLOWED),
    "dp_fedprox": Spec(DP, {**DP_ALLOWED, "mu": {"zero"}}),  # mu = 0: DP-FedAvg
    "dp_qffl": Spec(DP, {
        **DP_ALLOWED,
        "q": {"zero"},  # DP-FedSGD with the unweighted mean
        "loss_clip": {"inf"},  # no loss bound (not accounted, documented)
        "loss_noise_multiplier": {"zero"},  # the exact loss (not accounted)
    }),
    "dp_scaffold": Spec(DP, DP_ALLOWED),
    "ewc": Spec(allowed={"lam": {"zero"}}),  # plain finetuning (documented)
    "fedavg": Spec(allowed=FINETUNE_VIEW),
    "fedavg_plus": FEDPLUS_WRAPPED,
    "fedcomed_plus": FEDPLUS_WRAPPED,
    "feddyn": Spec(),
    "fedfair": Spec({"sampling_rate": 0.25, "max_batch_size": 16}, {
        "lam": {"zero"},  # FedSGD
        "loss_clip_floor": {"zero"},  # the paper: no floor
    }, wraps="fedfdp",
                    fixed=("clip", "noise_multiplier", "loss_clip",
                           "loss_noise_multiplier", "adaptive_loss_clip")),
    "fedfdp": Spec({"sampling_rate": 0.25, "max_batch_size": 16}, {
        "lam": {"zero"},  # DP-FedSGD
        "clip": {"inf"},  # no clipping (FedFair)
        "noise_multiplier": {"zero"},
        "loss_clip": {"inf"},  # the exact mean loss is released (FedFair)
        "loss_noise_multiplier": {"zero"},
        "loss_clip_floor": {"zero"},  # the paper: no floor
    }),
    "fedgeomed_plus": FEDPLUS_WRAPPED,
    "fedplus": Spec({"sigma": 0.1}, FEDPLUS_ALLOWED),
    "fedprox": Spec(allowed={**FINETUNE_VIEW, "mu": {"zero"}}),  # mu = 0: FedAvg
    "fedrep": Spec({"head_steps": 1}),
    "l2sgd": Spec(allowed={"lam": {"zero"}}),  # local training
    "lg_fedavg": Spec(),
    "lindt": Spec(dual=True, allowed={
        "clip": {"inf"},  # no clipping (the default)
        "noise_std": {"zero"},  # no noise (the default)
        # a traceable threshold on a count of rounds: any number >= 0
        "r_prime": {"zero", "fraction"},
        "finetune_top_steps": {"zero"},  # no fb view (the default)
    }),
    "local_only": Spec(),
    "mapper": Spec({"lam_grid": (0.25, 0.75)},
                   {"lam_grid": {"zero"}}),  # weights in [0, 1]
    "mocha": Spec(allowed={"lam1": {"zero"}, "lam2": {"zero"}}),  # no coupling
    "per_fedavg": Spec(allowed={"alpha": {"zero"}}),  # no inner step: FedAvg-like
    "pfedme": Spec(),
    "qffl": Spec(allowed={"q": {"zero"}}),  # q = 0: FedAvg (documented)
    "scaffold": Spec(),
    "skl": Spec(allowed={"lam": {"zero"}}),  # plain finetuning (documented)
}

FLOAT_BAD = dict(nan=math.nan, inf=math.inf, negative=-1.0, zero=0.0,
                 string="0.1", bool=True)
INT_BAD = dict(nan=math.nan, inf=math.inf, negative=-1, zero=0, string="1",
               bool=True, fraction=2.5)


def _annotation(p: inspect.Parameter) -> list[str]:
    ann = p.annotation
    if ann is inspect.Parameter.empty:
        return []
    text = ann if isinstance(ann, str) else inspect.formatannotation(ann)
    return [part.strip() for part in text.split("|")]


def _numeric_kind(p: inspect.Parameter) -> str | None:
    """``'float'``, ``'int'``, ``'floats'``/``'ints'`` (a tuple of numbers) or
    None, from the annotation and the default."""
    parts = _annotation(p)
    d = p.default
    if isinstance(d, (int, float)) and not isinstance(d, bool):
        parts.append(type(d).__name__)
    if "float" in parts:
        return "float"
    if "int" in parts:
        return "int"
    for part in parts:
        if part.startswith("tuple[") and re.search(r"\bfloat\b", part):
            return "floats"
        if part.startswith("tuple[") and re.search(r"\bint\b", part):
            return "ints"
    return None


def _is_choice(p: inspect.Parameter) -> bool:
    return "str" in _annotation(p) or isinstance(p.default, str)


def _keywords(name: str) -> dict[str, inspect.Parameter]:
    """The factory's keyword parameters, those of the factory its ``**kwargs``
    go to included (less the ones the wrapper fixes)."""
    spec = SPECS.get(name, Spec())
    params = inspect.signature(FACTORIES[name]).parameters
    out = {k: p for k, p in params.items() if p.kind == p.KEYWORD_ONLY}
    if spec.wraps is not None:
        inner = inspect.signature(FACTORIES[spec.wraps]).parameters
        out.update({k: p for k, p in inner.items() if p.kind == p.KEYWORD_ONLY
                    and k not in out and k not in spec.fixed})
    return out


def _kwargs(name: str, **over) -> dict:
    keys = _keywords(name)
    kw = {k: v for k, v in BASE.items() if k in keys}
    kw.update(SPECS[name].kwargs)
    kw.update(over)
    return kw


def _build(name: str, **over) -> Algorithm:
    model = _dual() if SPECS[name].dual else MLP
    return FACTORIES[name](model, **_kwargs(name, **over))


def _refused_by_name(name: str, arg: str, value) -> str | None:
    """None when building ``name`` with ``arg=value`` (and its ``init``)
    raises a ValueError naming ``arg``; otherwise what happened."""
    try:
        alg = _build(name, **{arg: value})
        alg.init(jax.random.key(1), _data())
    except ValueError as e:
        if re.search(rf"(?<!\w){re.escape(arg)}(?!\w)", str(e)):
            return None
        return f"ValueError not naming {arg}: {e}"
    except Exception as e:  # noqa: BLE001 - reported, not swallowed
        return f"{type(e).__name__} instead of ValueError: {e}"
    return "accepted"


def _is_flag(p: inspect.Parameter) -> bool:
    return isinstance(p.default, bool)


def _cases(select):
    for name in sorted(FACTORIES):
        if name not in SPECS:
            continue
        for arg, p in _keywords(name).items():
            if select(p):
                yield pytest.param(name, arg, id=f"{name}-{arg}")


def test_discovery_finds_the_factories():
    known = {"afl", "ali_dpfl", "apfl", "ditto", "dp_fedavg", "dp_fedprox",
             "dp_scaffold", "dp_feddyn", "dp_qffl", "ewc", "fedavg", "local_only",
             "feddyn", "fedfdp", "fedfair", "fedavg_plus", "fedcomed_plus",
             "fedgeomed_plus", "fedplus", "fedprox", "l2sgd", "lindt", "mapper",
             "mocha", "per_fedavg", "pfedme", "qffl", "scaffold", "skl"}
    assert known <= set(FACTORIES), known - set(FACTORIES)


def test_every_factory_has_a_spec():
    missing = sorted(set(FACTORIES) - set(SPECS))
    assert not missing, f"add a SPECS entry (tiny settings, allowed values): {missing}"
    stale = sorted(set(SPECS) - set(FACTORIES))
    assert not stale, f"SPECS entries for names that are not factories: {stale}"
    for name in FACTORIES:
        has_var_kw = any(p.kind == p.VAR_KEYWORD for p in
                         inspect.signature(FACTORIES[name]).parameters.values())
        assert has_var_kw == (SPECS[name].wraps is not None), (
            f"{name}: a factory taking **kwargs needs Spec(wraps=...) so that "
            f"the keywords it forwards are checked")
    for name, spec in SPECS.items():
        if name in FACTORIES:
            unknown = set(spec.allowed) - set(_keywords(name))
            assert not unknown, f"{name}: allowed lists unknown arguments {unknown}"


@pytest.mark.parametrize(
    "name,arg", list(_cases(lambda p: _numeric_kind(p) is not None)))
def test_numeric_arguments_refuse_bad_values(name, arg):
    p = _keywords(name)[arg]
    kind = _numeric_kind(p)
    bad = FLOAT_BAD if kind.startswith("float") else INT_BAD
    if kind in ("floats", "ints"):
        bad = {**{k: (v,) for k, v in bad.items()}, "empty": ()}
    ok = SPECS[name].allowed.get(arg, set()) | COMMON_ALLOWED.get(arg, set())
    problems = []
    for label, value in bad.items():
        if label in ok:
            continue
        found = _refused_by_name(name, arg, value)
        if found is not None:
            problems.append(f"{arg}={value!r} ({label}): {found}")
    assert not problems, "\n".join(problems)


def test_execution_settings_are_the_engines():
    """No factory takes ``engine`` or ``unroll``; the engine refuses a bad
    ``unroll`` by name (lax.scan's meaning: a bool, or an integer >= 1)."""
    for name in FACTORIES:
        taken = {"engine", "unroll"} & set(_keywords(name))
        assert not taken, f"{name} takes {taken}"
    problems = []
    for label, value in INT_BAD.items():
        try:
            EngineConfig(unroll=value)
        except ValueError as e:
            if label == "bool" or not re.search(r"(?<!\w)unroll(?!\w)", str(e)):
                problems.append(f"unroll={value!r} ({label}): {e}")
        else:
            if label != "bool":
                problems.append(f"unroll={value!r} ({label}): accepted")
    assert not problems, "\n".join(problems)
    assert EngineConfig(unroll=False).unroll is False
    assert EngineConfig(unroll=1).unroll == 1


SHARED_DEFAULTS = {"num_local_steps": 10, "cohort_size": 10, "cohort": "uniform",
                   "client_lr": 0.1, "batch_size": 32, "weighted": True}


def test_shared_hyperparameters_have_one_default():
    """Paper settings live in the presets; a factory's own default for a shared
    name is the same everywhere (the local DP-SGD factories' Poisson sampling
    is their own), and the toolkit's FedAvg server halves default to the same
    weighted mean."""
    fns = {**FACTORIES, "tk.global_solver": tk.global_solver,
           "tk.layer_split_algorithm": tk.layer_split_algorithm}
    for name, f in fns.items():
        for p in inspect.signature(f).parameters.values():
            if p.name in SHARED_DEFAULTS and p.default is not inspect.Parameter.empty:
                if (name, p.name) == ("fedplus", "num_local_steps"):
                    assert p.default is None  # the stragglers' max, else 10
                    continue
                assert p.default == SHARED_DEFAULTS[p.name], (name, p.name)
            if p.name == "sampling" and name not in DP_SGD:  # Poisson
                assert p.default == "with_replacement", name


@pytest.mark.parametrize("name,arg", list(_cases(_is_choice)))
def test_choice_arguments_refuse_unknown_values(name, arg):
    found = _refused_by_name(name, arg, "__not_a_choice__")
    assert found is None, found


@pytest.mark.parametrize("name,arg", list(_cases(_is_flag)))
def test_flags_refuse_non_bools(name, arg):
    problems = [f"{arg}={value!r}: {found}" for value in ("no", 1)
                if (found := _refused_by_name(name, arg, value)) is not None]
    assert not problems, "\n".join(problems)


def _as_numpy(tree):
    def one(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x, np.float64)

    return jax.tree.map(one, tree)


def _differences(a, b) -> list[str]:
    """Paths of the leaves of two states that are not allclose at 1e-6."""
    a, b = _as_numpy(a[:3]), _as_numpy(b[:3])
    flat, tree = jax.tree_util.tree_flatten_with_path(a)
    other = jax.tree.leaves(b)
    assert tree == jax.tree.structure(b), "different state structures"
    return [f"{jax.tree_util.keystr(path)}: max |diff| "
            f"{np.nanmax(np.abs(x - y)) if x.size else 0:.3g}"
            for (path, x), y in zip(flat, other)
            if not np.allclose(x, y, rtol=1e-6, atol=1e-6, equal_nan=True)]


@pytest.fixture(scope="module")
def cheap_compiles():
    """XLA's fast compile mode for this module's rounds (the checks compare
    programs with one another, not their speed): about half the compile
    time."""
    old = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", old)


@pytest.mark.parametrize("name", sorted(n for n in FACTORIES if n in SPECS))
def test_round_contract(name, cheap_compiles):
    """3. jit == no jit and 5. vmap engine == map engine, compared at once:
    the jitted round of the vmap engine against the un-jitted round of the
    map engine (one client at a time), so each factory compiles one whole
    round (a jit or an engine difference each breaks the equality; when it
    breaks, an un-jitted vmap round tells which). 4. one trace over three
    jitted rounds."""
    data = _data()
    vmapped = _build(name)
    looped = _build(name)
    state0 = vmapped.init(jax.random.key(1), data)
    traces = []

    def counted(state, d, key):
        traces.append(None)
        return vmapped.round_step(state, d, key)

    step = jax.jit(counted)
    state = state0
    with execution(VMAP):
        for r in range(3):
            state, _ = step(state, data, KEY)
            if r == 0:
                jitted = state
    with execution(MAP):
        plain_map, _ = looped.round_step(state0, data, KEY)
    problems = []
    if len(traces) != 1:
        problems.append(f"the round was traced {len(traces)} times in 3 rounds")
    if diff := _differences(jitted, plain_map):
        with execution(VMAP):
            plain, _ = vmapped.round_step(state0, data, KEY)
        if d := _differences(jitted, plain):
            problems.append("jit != no jit: " + "; ".join(d))
        if d := _differences(plain, plain_map):
            problems.append("vmap engine != map engine: " + "; ".join(d))
        if len(problems) == (len(traces) != 1):
            problems.append("jitted vmap != un-jitted map: " + "; ".join(diff))
    assert not problems, "\n".join(problems)
