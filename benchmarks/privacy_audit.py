"""Empirical privacy audit: canary runs, a Clopper-Pearson lower bound on
epsilon, compared with the accountant's epsilon.

Two mechanisms, each audited as implemented (honest) and with a bug
(``noise_off``: noise multiplier 0 while the accountant is asked for the
configured one; ``clip_off``: a clip the canary never reaches, the noise
still ``sigma * clip``):

* ``local_dp_sgd``: ``privacy.dp_local_train`` of one client, Poisson rate
  ``q``, ``K`` steps, ``normalize="expected"``; add/remove adjacency (the
  canary record is there or not). Accountant:
  ``epsilon(dp_sgd_event(q, sigma, 1, K), delta)``.
* ``client_dp_fedavg``: ``algorithms.fedavg`` with
  ``client_level_dp(mean(weighted=False), S, z)``, ``T`` rounds, a uniform
  cohort of ``m`` of ``N`` clients; replace-one adjacency (the canary client
  holds the canary record or a zero record). Accountant:
  ``epsilon(client_level_event(m, N, z, T, sampling="fixed_size"), delta)``.

The canary is white-box: a linear model with the linear loss ``-y <w, x>``,
so each example's gradient does not depend on the parameters; the other
records have zero features (zero gradient) and the canary's features are
``--canary-norm`` times a unit vector, far above the clip. A run's score is
the final parameter along that vector. For every configuration ``--runs``
runs per world (chunks of ``--chunk`` vmapped runs, one jitted program per
audit): the first half of each world's runs picks the threshold, the second
half gives the bound (``privacy.epsilon_lower_bound``, confidence
``1 - alpha``). ``max_epsilon`` is the largest bound that many runs can show
(every held-out run classified right).

    python benchmarks/privacy_audit.py --runs 50000 \\
        --out docs/results/privacy_audit.jsonl
    python benchmarks/privacy_audit.py --report docs/results/privacy_audit.jsonl
    python benchmarks/privacy_audit.py --smoke
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl import aggregators, algorithms, models, privacy
from fedjax_pfl import data as fdata
from fedjax_pfl.core import EngineConfig, execution

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import _meta, cpu_model, parse_or_report, read_jsonl, write_jsonl

MECHANISMS = ("honest", "noise_off", "clip_off")


def linear_model(dim: int) -> models.Model:
    """``x -> <w, x>`` (w starts at 0) with the per-example loss ``-y <w, x>``:
    the gradient ``-y x`` is the same at every ``w``."""
    return models.from_flax(
        nn.Dense(1, use_bias=False, kernel_init=nn.initializers.zeros), (dim,),
        loss="squared_error")._replace(loss=lambda out, y: -out[:, 0] * y)


def records(n: int, dim: int, canary_norm: float | None) -> tuple:
    """``n`` zero records, the first replaced by the canary ``canary_norm e_0``
    unless ``canary_norm`` is None; labels 1."""
    x = np.zeros((n, dim), np.float32)
    if canary_norm is not None:
        x[0, 0] = canary_norm
    return x, np.ones((n,), np.float32)


def mechanism(name: str, clip: float, noise: float, canary_norm: float):
    """``(clip, noise multiplier)`` that the mechanism ``name`` runs with."""
    if name == "honest":
        return clip, noise
    if name == "noise_off":
        return clip, 0.0
    loose = 2.0 * canary_norm  # never binds; the noise std stays noise * clip
    return loose, noise * clip / loose


def local_dp_sgd_scores(cfg: dict, chunk: int):
    """A jitted ``(clip, noise, key) -> (scores_out [chunk], scores_in
    [chunk])``: client 0 holds ``n_records`` zero records (no canary), client
    1 the canary plus the same records; one ``dp_local_train`` per run."""
    model = linear_model(cfg["dim"])
    n = cfg["n_records"]
    data = fdata.from_client_arrays([records(n, cfg["dim"], None),
                                     records(n + 1, cfg["dim"], cfg["canary_norm"])])
    params = model.init(jax.random.key(0))

    @jax.jit
    def scores(clip, noise, key):
        dp = privacy.make_dp_config(clip, noise, "poisson",
                                    sampling_rate=cfg["sampling_rate"],
                                    max_batch_size=n + 1, normalize="expected")

        def run(client, k):
            p, _, _ = privacy.dp_local_train(
                model, params, data.train, client, k, lr=cfg["lr"],
                num_steps=cfg["steps"], batch_size=1, sampling="poisson", dp=dp)
            return p["kernel"][0, 0]

        s = jax.vmap(run)(jnp.repeat(jnp.arange(2), chunk),
                          jax.random.split(key, 2 * chunk))
        return s[:chunk], s[chunk:]

    return scores


def client_dp_fedavg_scores(cfg: dict, chunk: int):
    """A jitted ``(clip, noise, key) -> (scores_out, scores_in)``: ``rounds``
    rounds of DP-FedAvg per run; every client holds one zero record except
    client 0 in the world with the canary."""
    model = linear_model(cfg["dim"])
    base = fdata.from_client_arrays([records(1, cfg["dim"], None)
                                     for _ in range(cfg["clients"])])
    x_in = base.train.x.at[0, 0].set(cfg["canary_norm"])

    @jax.jit
    def scores(clip, noise, key):
        alg = algorithms.fedavg(
            model, client_lr=cfg["lr"], num_local_steps=1, batch_size=1,
            sampling="full_batch", cohort_size=cfg["cohort_size"],
            cohort="uniform",
            aggregator=privacy.client_level_dp(aggregators.mean(weighted=False),
                                               clip, noise))

        def run(world, k):
            x = jnp.where(world, x_in, base.train.x)
            d = dataclasses.replace(base, train=dataclasses.replace(base.train, x=x))
            state = alg.init(jax.random.key(0), d)
            with execution(EngineConfig("vmap")):
                state, _ = jax.lax.scan(lambda s, _: alg.round_step(s, d, k), state,
                                        None, length=cfg["rounds"])
            return state.server.params["kernel"][0, 0]

        s = jax.vmap(run)(jnp.repeat(jnp.arange(2) > 0, chunk),
                          jax.random.split(key, 2 * chunk))
        return s[:chunk], s[chunk:]

    return scores


def accountant_epsilon(audit: str, cfg: dict, noise: float, delta: float) -> float:
    if audit == "local_dp_sgd":
        event = privacy.dp_sgd_event(cfg["sampling_rate"], noise, 1, cfg["steps"])
    else:
        event = privacy.client_level_event(cfg["cohort_size"], cfg["clients"], noise,
                                           cfg["rounds"], sampling="fixed_size")
    return privacy.epsilon(event, delta)


def max_epsilon(trials_out: int, trials_in: int, delta: float, alpha: float) -> float:
    """The bound when every held-out run is classified right."""
    tpr_lo = privacy.clopper_pearson(trials_in, trials_in, alpha)[0]
    fpr_hi = privacy.clopper_pearson(0, trials_out, alpha)[1]
    return float(max(np.log((tpr_lo - delta) / fpr_hi),
                     np.log((1 - fpr_hi - delta) / (1 - tpr_lo))))


def audit_scores(scores_fn, clip, noise, runs: int, chunk: int, key):
    """``runs`` scores per world, ``chunk`` at a time (keys ``fold_in(key, i)``)."""
    outs, ins = [], []
    for i in range(-(-runs // chunk)):
        o, n = scores_fn(jnp.float32(clip), jnp.float32(noise),
                         jax.random.fold_in(key, i))
        outs.append(np.asarray(o))
        ins.append(np.asarray(n))
    return np.concatenate(outs)[:runs], np.concatenate(ins)[:runs]


CONFIGS = {
    "local_dp_sgd": dict(dim=2, n_records=199, sampling_rate=0.25, steps=10,
                         clip=1.0, lr=1.0, canary_norm=100.0,
                         adjacency="add_remove", normalize="expected"),
    "client_dp_fedavg": dict(dim=2, clients=10, cohort_size=5, rounds=4, clip=1.0,
                             lr=1.0, canary_norm=100.0, adjacency="replace_one",
                             cohort="uniform", out_record="zero"),
}
SCORES = {"local_dp_sgd": local_dp_sgd_scores,
          "client_dp_fedavg": client_dp_fedavg_scores}


def report(path: str) -> str:
    """Markdown table of the records of ``--out``."""
    rows = read_jsonl(path)
    lines = ["| audit | noise multiplier | mechanism | accountant eps | audited eps "
             "(95 %) | max shown | threshold | TPR | FPR | above accountant |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a = r["audit_result"]
        lines.append(
            f"| {r['audit']} | {r['noise_multiplier']:g} | {r['mechanism']} | "
            f"{r['accountant_epsilon']:.3f} | **{a['epsilon']:.3f}** | "
            f"{r['max_epsilon']:.2f} | {a['threshold']:.4g} | {a['tpr']:.4f} | "
            f"{a['fpr']:.4f} | {r['above_accountant']} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=50_000, help="runs per world")
    p.add_argument("--chunk", type=int, default=5_000,
                   help="runs per world in one vmapped call")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--audits", nargs="+", default=list(CONFIGS),
                   choices=list(CONFIGS))
    p.add_argument("--local-sigmas", nargs="+", type=float, default=[1.0, 2.0, 4.0],
                   help="noise multipliers of local_dp_sgd")
    p.add_argument("--client-zs", nargs="+", type=float, default=[3.0, 5.0, 8.0],
                   help="noise multipliers of client_dp_fedavg")
    p.add_argument("--smoke", action="store_true",
                   help="a tiny run (200 runs per world, one noise multiplier)")
    args = parse_or_report(p, argv, report)
    if args is None:
        return []
    if args.smoke:
        args.runs, args.chunk = 200, 100
        args.local_sigmas, args.client_zs = args.local_sigmas[:1], args.client_zs[:1]
    if args.runs < 4 or args.chunk < 1:
        p.error("--runs must be >= 4 and --chunk >= 1")
    chunk = min(args.chunk, args.runs)
    meta = dict(_meta(), cpu_model=cpu_model())
    noises = {"local_dp_sgd": args.local_sigmas, "client_dp_fedavg": args.client_zs}
    out = []
    print(f"{'audit':>16} {'noise':>6} {'mechanism':>10} {'acct eps':>9} "
          f"{'audit eps':>9} {'max':>6} {'TPR':>7} {'FPR':>7} {'s':>6}")
    for ai, audit in enumerate(args.audits):
        cfg = CONFIGS[audit]
        scores_fn = SCORES[audit](cfg, chunk)
        for ni, noise in enumerate(noises[audit]):
            acct = accountant_epsilon(audit, cfg, noise, args.delta)
            for mi, name in enumerate(MECHANISMS):
                clip, z = mechanism(name, cfg["clip"], noise, cfg["canary_norm"])
                key = jax.random.fold_in(jax.random.key(args.seed),
                                         (ai * 100 + ni) * 10 + mi)
                t0 = time.perf_counter()
                s_out, s_in = audit_scores(scores_fn, clip, z, args.runs, chunk, key)
                run_s = time.perf_counter() - t0
                res = privacy.epsilon_lower_bound(s_out, s_in, args.delta,
                                                  alpha=args.alpha)
                top = max_epsilon(res.trials_out, res.trials_in, args.delta,
                                  args.alpha)
                rec = dict(meta, benchmark="privacy_audit", audit=audit,
                           mechanism=name, noise_multiplier=noise,
                           config=dict(cfg, run_clip=clip, run_noise_multiplier=z),
                           runs_per_world=args.runs, chunk=chunk, seed=args.seed,
                           delta=args.delta, alpha=args.alpha,
                           accountant="rdp", accountant_epsilon=acct,
                           audit_result=res._asdict(), max_epsilon=top,
                           above_accountant=bool(res.epsilon > acct), run_s=run_s)
                out.append(rec)
                write_jsonl(args.out, [rec])
                print(f"{audit:>16} {noise:6g} {name:>10} {acct:9.3f} "
                      f"{res.epsilon:9.3f} {top:6.2f} {res.tpr:7.4f} "
                      f"{res.fpr:7.4f} {run_s:6.1f}")
    return out


if __name__ == "__main__":
    main()
