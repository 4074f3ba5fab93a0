"""LINDT's Table 3 (CIFAR-10, NFL setting) as a preset, and the builders that
``benchmarks/lindt_nfl.py`` shares (docs/results/lindt.md explains the scale)."""

from __future__ import annotations

import math

import jax
import numpy as np

from fedjax_pfl import (
    aggregators,
    algorithms,
    attacks,
    data,
    metrics,
    models,
    privacy,
)
from fedjax_pfl.core import KeyTag
from fedjax_pfl.validation import check_choice

from ._config import Experiment, Key, Preset, check_attack, preflight, run_keys
from ._private import private_accuracy
from ._registry import engine
from ._registry import register as _register

LINDT_METHODS = ("fedavg", "fb", "tm", "apfl", "fedprox", "lindt", "lindt_tm",
                 "lindt_detect")
PAPER_NOISE_NORM = 0.9697  # sigma sqrt(d) of the paper's CNN at sigma = 0.001
SHAKE_NOISE_NORM = 0.9055  # sigma sqrt(d) of the paper's LSTM (819,920) at 0.001
SHAKE_MIN_POINTS = 10_000  # the paper keeps roles with >= 10,000 datapoints
SHAKE_BACKDOOR_TARGET = 0  # '\n' in LEAF's vocabulary
DEPLOYED = {"fb": "fb", "apfl": "personal", "lindt": "personal", "lindt_tm": "personal",
            "lindt_detect": "personal"}


def lindt_data(source: str, num_clients: int | None, attack_ratio: float, seed: int,
               scheme: str = "mixed", *, test_cap: int | None = None,
               poison: bool = True, image_size: int = 16,
               class_sigma: float = 0.0):
    """``(FederatedData, malicious mask, input dim)``: CIFAR-10 at
    ``image_size`` (16: each 2x2 block averaged, for the MLP; 32: the paper's
    images, for its CNN), flattened and standardized per input (or a 10-class
    Gaussian mixture, ``synthetic``), LINDT's allocation, and the semantic
    backdoor on the malicious clients; or ``shakespeare``
    (:func:`shakespeare_data`; ``scheme`` must be ``by_role``).
    ``poison=False``: the same clients and mask, no backdoor (the federation
    after its attackers stop). ``class_sigma``: see :func:`data.lindt_cifar`."""
    check_choice("image_size", image_size, (16, 32))
    if source == "shakespeare":
        if scheme != "by_role":
            raise ValueError(f"scheme: Shakespeare is partitioned by role only "
                             f"('by_role'), got {scheme!r}")
        return shakespeare_data(num_clients, attack_ratio, seed, test_cap=test_cap,
                                poison=poison)
    if num_clients is None:
        num_clients = 100
    check_attack("backdoor", attack_ratio, num_clients, "attack_ratio")
    if source == "cifar10":
        x_tr, y_tr, x_te, y_te = data.load_cifar10(layout="npy")

        def prep(x):  # 32x32x3 uint8 -> image_size^2 x 3 (2x2 means), flattened
            x = x.astype(np.float32) / 255.0
            if image_size == 16:
                x = x.reshape(-1, 16, 2, 16, 2, 3).mean((2, 4))
            return x.reshape(len(x), -1)

        x_tr, x_te = prep(x_tr), prep(x_te)
        mu, sd = x_tr.mean(0), x_tr.std(0) + 1e-6
        x_tr, x_te = (x_tr - mu) / sd, (x_te - mu) / sd
    else:  # no data needed (smoke runs)
        rng = np.random.default_rng(seed)
        means = rng.normal(size=(10, 16)).astype(np.float32)
        y_tr = rng.integers(0, 10, 60 * num_clients)
        y_te = rng.integers(0, 10, 12 * num_clients)
        x_tr = means[y_tr] + 1.5 * rng.normal(size=(len(y_tr), 16)).astype(np.float32)
        x_te = means[y_te] + 1.5 * rng.normal(size=(len(y_te), 16)).astype(np.float32)
    fd = data.lindt_cifar(x_tr, y_tr, x_te, y_te, scheme, num_clients=num_clients,
                          class_sigma=class_sigma, seed=seed)
    mal = attacks.malicious_clients(num_clients, attack_ratio, seed)
    if attack_ratio > 0 and poison:
        fd = attacks.semantic_backdoor(fd, mal, seed=seed)
    return fd, mal, x_tr.shape[1]


def shakespeare_data(num_clients: int | None, attack_ratio: float, seed: int, *,
                     min_points: int = SHAKE_MIN_POINTS, test_cap: int | None = None,
                     poison: bool = True):
    """``(FederatedData, malicious mask, sequence length)``: LINDT's SHAKE task.

    One client per speaking role (``data.load_shakespeare``: LEAF's json if the
    data dir has it, else the tiny corpus), each role's windows split 90 / 10
    into train and test as in the paper, roles with fewer than ``min_points``
    windows dropped, ``num_clients`` of the rest drawn at random (all if
    None), and the attackers' training labels all set to ``'\\n'``
    (:func:`attacks.target_backdoor`). ``test_cap`` keeps the first windows of
    each client's test split (evaluation cost; None keeps all). ``poison=False``
    leaves the attackers' labels clean.
    """
    if test_cap is not None and test_cap < 1:
        raise ValueError(f"test_cap: must be a positive integer or None, got "
                         f"{test_cap!r}")
    fd = data.load_shakespeare(train_fraction=0.9, x_dtype=np.uint8)
    points = np.asarray(fd.train.counts) + np.asarray(fd.test.counts)
    keep = np.flatnonzero(points >= min_points)
    if num_clients is not None:
        if not 2 <= num_clients <= keep.size:
            raise ValueError(f"num_clients: {keep.size} roles have >= {min_points} "
                             f"datapoints; choose 2 to {keep.size}, got {num_clients}")
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5A4E]))
        keep = np.sort(rng.choice(keep, num_clients, replace=False))
    n = keep.size
    check_attack("backdoor", attack_ratio, n, "attack_ratio")
    cut = slice(None, test_cap)
    fd = data.from_client_arrays(
        [fd.train.client(int(c)) for c in keep], None,
        [tuple(a[cut] for a in fd.test.client(int(c))) for c in keep],
        [fd.client_ids[int(c)] for c in keep])
    mal = attacks.malicious_clients(n, attack_ratio, seed)
    if attack_ratio > 0 and poison:
        fd = attacks.target_backdoor(fd, mal, target=SHAKE_BACKDOOR_TARGET)
    return fd, mal, int(np.asarray(fd.train.x).shape[1])


def lindt_noise_std(dual, noise_std: float | None,
                    norm: float = PAPER_NOISE_NORM) -> float:
    """``noise_std``, or the std giving the paper's noise norm (``norm``: the
    CIFAR CNN's by default) on this model."""
    if noise_std is not None:
        return noise_std
    return norm / math.sqrt(models.num_params(dual.model.init(jax.random.key(0))))


def lindt_algorithm(method, dual, mal, *, lr, lr_decay, cohort_size, steps, clip,
                    noise_std, trim, eps, r_prime, fb_steps, fb_lr,
                    local_epochs: float | None = 1.0, batch_size: int = 10,
                    v_init: str = "random", stop: str = "never",
                    stop_streak: int = metrics.STOP_STREAK,
                    grad_clip: float | None = None, apfl_alpha: float = 0.01,
                    apfl_adaptive: bool = True, fb_layers: int = 1):
    """A Table 3 method in the NFL environment (eq. 4 DP on every upload).
    LINDT's variants run ``local_epochs`` (None: ``steps`` steps, as APFL and
    FedProx always do), start their local models by ``v_init`` and end dual
    training by the stopping strategy ``stop`` (``algorithms.lindt``).
    ``grad_clip`` bounds every local step's gradient norm of the methods built
    on ``algorithms.lindt``; APFL and FedProx take no such bound (nor the
    attackers' step multiplier or ``lr_decay``) and ignore it. APFL's mixing
    weight starts at ``apfl_alpha`` (the paper: 0.01) and adapts
    (``apfl_adaptive``, the paper) or stays fixed. FB finetunes the top
    ``fb_layers`` layers (the paper: 1) for ``fb_steps`` steps at ``fb_lr``."""
    common = {"client_lr": lr, "batch_size": batch_size, "cohort_size": cohort_size}
    if method in ("apfl", "fedprox"):
        # Eq. 4's noise: std sigma on the mean = client_level_dp with z = sigma K/S.
        agg = privacy.client_level_dp(aggregators.mean(weighted=False), clip,
                                      noise_std * cohort_size / clip)
        if method == "apfl":
            return algorithms.apfl(dual.model, alpha=apfl_alpha,
                                   adaptive_alpha=apfl_adaptive, num_local_steps=steps,
                                   cohort="uniform", aggregator=agg, **common)
        return algorithms.fedprox(dual.model, mu=0.001, num_local_steps=steps,
                                  aggregator=agg, **common)
    mode = {"fedavg": "off", "fb": "off", "tm": "off", "lindt": "always",
            "lindt_tm": "always", "lindt_detect": "detect"}[method]
    return algorithms.lindt(
        dual, mode=mode, lr_decay=lr_decay, local_epochs=local_epochs,
        num_local_steps=steps,
        aggregator=aggregators.trimmed_mean(trim) if method.endswith("tm") else None,
        clip=clip, noise_std=noise_std, malicious=mal, malicious_multiplier=5,
        eps=eps, r_prime=r_prime,
        finetune_top_steps=fb_steps if method in ("fedavg", "fb") else 0,
        finetune_top_lr=fb_lr, finetune_top_layers=fb_layers, v_init=v_init,
        stop=stop, stop_streak=stop_streak, grad_clip=grad_clip, **common)


IMAGE_SIZE = {"mlp": 16, "cnn": 32}  # CIFAR-10 side length for each model


def cifar_dual(model: str, dim: int, hidden):
    """The CIFAR-10 dual model: the MLP of widths ``hidden`` on ``dim`` inputs,
    or the paper's CNN (its 32x32 images)."""
    if model == "cnn":
        return algorithms.dual_lindt_cnn()
    return algorithms.dual_mlp((dim,), 10, tuple(hidden))


MLP_NOISE_STD = 0.0089  # the paper's noise norm at sigma 0.003, on the 16x16 MLP


def _cnn_settings(cfg):
    """The CNN takes 32x32 CIFAR-10 images (the synthetic mixture is 16-dim),
    and the MLP's default noise std is 3x the paper's sigma 0.003 on it."""
    if cfg["model"] != "cnn":
        return None
    if cfg["data"] != "cifar10":
        return (f"model: 'cnn' takes CIFAR-10 images (data='cifar10'), got "
                f"data={cfg['data']!r}")
    if cfg["noise_std"] == MLP_NOISE_STD:
        return (f"noise_std: {MLP_NOISE_STD} is the MLP's default (the paper's "
                f"noise norm at sigma 0.003 on the MLP); with model=cnn give the "
                f"paper's sigma itself, e.g. noise_std=0.003, or 0 for sigma 0.001")
    return None


def _lindt(cfg):
    fd, mal, dim = lindt_data(cfg["data"], cfg["clients"], cfg["attack_ratio"],
                              cfg["seed"], image_size=IMAGE_SIZE[cfg["model"]],
                              class_sigma=cfg["class_sigma"])
    dual = cifar_dual(cfg["model"], dim, (int(h) for h in cfg["hidden"].split(",")))
    noise = lindt_noise_std(dual, cfg["noise_std"] or None)
    m = cfg["method"]
    alg = lindt_algorithm(
        m, dual, mal, lr=cfg["lr"], lr_decay=cfg["lr_decay"],
        cohort_size=cfg["cohort_size"], steps=cfg["local_steps"], clip=cfg["clip"],
        noise_std=noise, trim=cfg["trim"], eps=cfg["eps"],
        r_prime=cfg["r_prime"] or cfg["rounds"] // 2, fb_steps=cfg["fb_steps"],
        fb_lr=cfg["fb_lr"])
    benign = (~mal).astype(np.float32)
    view = DEPLOYED.get(m, "global")
    views = ("global",) if view == "global" else ("global", view)
    # the run's checks (models vs data, one traced round) before the private
    # reference models are trained
    preflight(alg, fd, jax.random.key(cfg["seed"]), eval_mask=benign, views=views,
              engine=engine(cfg))
    private_key = jax.random.fold_in(jax.random.key(cfg["seed"]),
                                     KeyTag.NFL_PRIVATE_RUN)
    private = private_accuracy(
        dual.model, fd, private_key, client_lr=cfg["lr"],
        num_local_steps=cfg["private_steps"], batch_size=10,
        num_rounds=cfg["private_rounds"],
        eval_every=max(1, cfg["private_rounds"] // 10), engine=engine(cfg))
    return Experiment(alg, fd, benign, None, views,
                      {"noise_std": noise, "malicious": int(mal.sum()),
                       "private_acc_benign": 100 * float(np.nanmean(private[~mal]))},
                      metrics.gain_callback(alg, fd, private, view=view, mask=benign))


_register(Preset(
    "lindt-table3",
    "LINDT (negative federated learning), Table 3, CIFAR-10 NFL setting",
    "100 clients by LINDT's Mixed allocation, 20 % semantic-backdoor attackers "
    "(deer->horse, dog->frog, 5x local work), client DP clipping S = 15 + noise, "
    "10 clients a round; beta = deployed minus private accuracy, Delta and the "
    "detection round in the history",
    "CIFAR-10 downsampled to 16x16 with an MLP by default (model=cnn: the "
    "paper's 940k CNN on 32x32 images), noise std "
    "0.0089 (the paper's CNN noise norm at sigma 0.003), 200 rounds, r' = 100; "
    "docs/results/lindt.md",
    {**run_keys(200, 10),
     "data": Key("cifar10", "cifar10, or a Gaussian mixture (no download)",
                 choices=("cifar10", "synthetic")),
     "method": Key("lindt", "Table 3 method", choices=LINDT_METHODS),
     "clients": Key(100, "number of clients", low=2),
     "class_sigma": Key(0.0, "log-normal sigma of each client's class proportions "
                        "(0: a client's classes balanced)", low=0.0),
     "cohort_size": Key(10, "clients a round (10 %)", low=1),
     "attack_ratio": Key(0.2, "fraction of backdoor attackers", low=0.0, high=1.0,
                         high_open=True),
     "model": Key("mlp", "mlp (on 16x16 images) or cnn (the paper's "
                  "940,362-parameter CNN on 32x32 images; CIFAR-10 only)",
                  choices=("mlp", "cnn")),
     "hidden": Key("128,64", "MLP hidden widths, comma-separated",
                   check=lambda v: None if all(h.strip().isdigit() and int(h) > 0
                                               for h in v.split(",")) else
                   "must be comma-separated positive integers",
                   only_if=("model", ("mlp",))),
     "lr": Key(0.05, "client learning rate", low=1e-12),
     "lr_decay": Key(0.995, "learning-rate decay per round", low=0.0, high=1.0),
     "local_steps": Key(50, "local steps (APFL / FedProx; LINDT runs 1 epoch)", low=1),
     "clip": Key(15.0, "client DP clipping S", low=1e-12),
     "noise_std": Key(MLP_NOISE_STD, "DP noise std on the mean (0: the paper's "
                      "noise norm 0.97, i.e. sigma 0.001 on the CNN)", low=0.0),
     "eps": Key(0.1, "detection threshold epsilon", low=0.0),
     "r_prime": Key(100, "detection count r' (0: rounds / 2)", low=0),
     "trim": Key(0.1, "trimmed-mean fraction per side (tm, lindt_tm)", low=0.0,
                 high=0.5, high_open=True, only_if=("method", ("tm", "lindt_tm"))),
     "fb_steps": Key(100, "FB finetuning steps of the top layer", low=1),
     "fb_lr": Key(0.01, "FB learning rate", low=1e-12),
     "private_rounds": Key(20, "rounds of the private (local-only) models", low=1),
     "private_steps": Key(50, "local steps a round of the private models", low=1)},
    _lindt, ("cifar10",), rules=(_cnn_settings,)))
