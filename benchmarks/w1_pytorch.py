"""W1: fedjax_pfl's Ditto side by side with a plain PyTorch Ditto (PFLlib's).

The workload is PFLlib's Ditto on PFLlib's own Fashion-MNIST split
(``pfllib_fmnist_dir01/split.json.gz`` under the data directory: 20 clients,
Dirichlet 0.1, index lists into the concatenated ``train``/``t10k`` IDX files;
pixels ``(p/255 - 0.5)/0.5``); FedAvgCNN (582,026 parameters), full
participation; every round each client runs one epoch of SGD on the global model
from ``w^t`` and one epoch on its persistent personal model ``v_k`` with the
proximal term ``lam/2 ||v - w^t||^2`` (batch 10, shuffled, ``drop_last``, lr 0.005,
lam 1); the server averages the clients' models weighted by training-set size.

Both implementations run in one invocation: ``fedjax`` (``algorithms.ditto``,
rounds jitted one by one as ``simulate`` runs them on CPU) and ``torch`` (a serial
loop over clients with ``DataLoader(shuffle=True, drop_last=True)``,
``torch.optim.SGD`` and PFLlib's ``PerturbedGradientDescent`` for ``v_k``). Both
start from the same ``w^0`` (fedjax's initialization, ported to PyTorch's
layout). Every round ends with PFLlib's default evaluation of every client's
global and personal models (test accuracy and loss, training loss), timed apart:
``round_s`` is the median training round after a warm-up round (compilation is
reported apart as ``compile_s``), ``round_eval_s`` the median round with its
evaluation. Prints the ratio ``torch / fedjax`` (> 1: fedjax_pfl is faster) and
the pooled (sample-weighted) test accuracies after the same number of rounds.

    FEDJAX_PFL_DATA_DIR=/path/to/data flock /tmp/bench.lock \\
        python benchmarks/w1_pytorch.py --rounds 3 --out w1.jsonl
    python benchmarks/w1_pytorch.py --report w1.jsonl

PyTorch is optional (``pip install -e '.[bench]'``); without it the torch part
is skipped with a message.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

from fedjax_pfl import algorithms, data, evaluate_state, models
from fedjax_pfl.core import EngineConfig, client_mesh, execution

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import _meta, cpu_model, parse_or_report, read_jsonl, write_jsonl

try:
    import torch
except ImportError:  # the torch side is optional
    torch = None

SPLIT = "pfllib_fmnist_dir01/split.json.gz"
SPLIT_SPEC = data.FileSpec(
    "b7071bc42de7b453239897259118c2630da7c92ed1232b16322d6b0aac160891", 192_729)
IMPLS = ("fedjax", "torch")


# ------------------------------------------------------------------------ data


def load_clients(num_clients: int | None = None):
    """PFLlib's split: per-client ``(x [n, 28, 28, 1] float32, y [n] int64)``
    train and test lists (the first ``num_clients`` clients)."""
    root = data.resolve_data_dir()
    raw = data.read_verified(root, SPLIT, decompress=True, registry={SPLIT: SPLIT_SPEC})
    split = json.loads(raw)
    x_tr, y_tr, x_te, y_te = data.load_fashion_mnist()
    x = (np.concatenate([x_tr, x_te]).astype(np.float32) / 255.0 - 0.5) / 0.5
    x = x[..., None]
    y = np.concatenate([y_tr, y_te]).astype(np.int64)
    k = len(split["train"]) if num_clients is None else num_clients
    if not 1 <= k <= len(split["train"]):
        raise ValueError(f"--clients: must be in 1..{len(split['train'])}, got {k}")

    def take(lists):
        return [(x[np.asarray(ix)], y[np.asarray(ix)]) for ix in lists[:k]]

    return take(split["train"]), take(split["test"])


# ---------------------------------------------------------------------- fedjax


def cpu_devices(n: int) -> int:
    """Asks JAX for ``n`` CPU devices (it must not have started yet) and returns
    how many there are: with several, each device trains its own share of the
    cohort on its own core (``EngineConfig('map', mesh=...)``)."""
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:  # JAX already started (e.g. under pytest): keep its devices
        pass
    return min(n, jax.device_count())


def fedjax_engine(devices: int) -> EngineConfig:
    """The engine of the fedjax side: on CPU with ``devices > 1`` the cohort's
    clients run one loop per CPU device (one per core); on an accelerator one
    vmapped program in 4 size buckets."""
    if jax.default_backend() != "cpu":  # one batched program, size buckets
        return EngineConfig("vmap", buckets=4)
    return EngineConfig("map", 1, mesh=client_mesh(jax.devices()[:devices])
                        if devices > 1 else None)


def fedjax_ditto(model, *, lr, lam, batch_size, num_clients):
    """``algorithms.ditto`` with PFLlib's settings (run under
    :func:`fedjax_engine`)."""
    return algorithms.ditto(model, lam=lam, client_lr=lr, batch_size=batch_size,
                            local_epochs=1, personal_epochs=1, sampling="epoch",
                            drop_last=True, cohort="full", cohort_size=num_clients,
                            weighted=True), True


def fedjax_setup(train, test, args):
    """The data, the algorithm, its initial state and the run's key."""
    model = models.fedavg_cnn((28, 28, 1), 10)
    fed = data.from_client_arrays(train, test=test)
    # the cohort is split evenly over the devices
    args.devices = max(d for d in range(1, args.devices + 1) if len(train) % d == 0)
    alg, drop_last = fedjax_ditto(model, lr=args.lr, lam=args.lam,
                                  batch_size=args.batch_size, num_clients=len(train))
    key = jax.random.key(args.seed)
    state = alg.init(jax.random.split(key)[0], fed)  # as simulate splits the key
    if args.devices > 1:  # a copy on every device, as the rounds leave them
        rep = jax.sharding.NamedSharding(client_mesh(jax.devices()[:args.devices]),
                                         jax.sharding.PartitionSpec())
        fed, state = jax.device_put((fed, state), rep)
    return fed, alg, drop_last, state, key


def run_fedjax(fed, alg, drop_last, state, key, args):
    run_key = jax.random.split(key)[1]
    engine = fedjax_engine(args.devices)
    # simulate's CPU path
    one = jax.jit(lambda s, d, k: alg.round_step(s, d, k), donate_argnums=0)
    t0 = time.perf_counter()
    with execution(engine):  # the round is traced (lowered) under the engine
        step = one.lower(state, fed, run_key).compile()
    compile_s = time.perf_counter() - t0
    ev_fn = jax.jit(lambda s, d: evaluate_state(
        alg, s, d, key=key, views=("global", "personal"), splits=("train", "test"),
        engine=engine))
    # evaluation on one device: the rounds leave the state copied on every
    # device, and a program over copies would run the same work on each
    one_dev = jax.devices()[0]
    eval_fed = jax.device_put(fed, one_dev)
    t0 = time.perf_counter()
    ev_compiled = ev_fn.lower(jax.device_put(state, one_dev), eval_fed).compile()
    eval_compile_s = time.perf_counter() - t0

    def train_round(state):
        return jax.block_until_ready(step(state, fed, run_key)[0])

    def evaluate(state):
        ev = jax.block_until_ready(ev_compiled(jax.device_put(state, one_dev),
                                               eval_fed))
        return {v: float(ev[f"{v}/test/accuracy/mean"]) for v in ("global", "personal")}

    out = _time_rounds(train_round, evaluate, state, args.rounds, "fedjax")
    return dict(out, compile_s=compile_s, eval_compile_s=eval_compile_s,
                drop_last=drop_last)


# ----------------------------------------------------------------------- torch


if torch is not None:

    class FedAvgCNN(torch.nn.Module):
        """PFLlib's ``FedAvgCNN`` (``in_features=1, num_classes=10, dim=1024``)."""

        def __init__(self):
            super().__init__()
            nn = torch.nn
            self.conv1 = nn.Sequential(nn.Conv2d(1, 32, 5), nn.ReLU(inplace=True),
                                       nn.MaxPool2d(2))
            self.conv2 = nn.Sequential(nn.Conv2d(32, 64, 5), nn.ReLU(inplace=True),
                                       nn.MaxPool2d(2))
            self.fc1 = nn.Sequential(nn.Linear(1024, 512), nn.ReLU(inplace=True))
            self.fc = nn.Linear(512, 10)

        def forward(self, x):
            x = torch.flatten(self.conv2(self.conv1(x)), 1)
            return self.fc(self.fc1(x))

    class PerturbedGradientDescent(torch.optim.Optimizer):
        """PFLlib's Ditto/FedProx optimizer: ``p -= lr (grad + mu (p - g))``."""

        def __init__(self, params, lr, mu):
            super().__init__(params, {"lr": lr, "mu": mu})

        @torch.no_grad()
        def step(self, global_params):
            for group in self.param_groups:
                for p, g in zip(group["params"], global_params, strict=True):
                    d_p = p.grad + group["mu"] * (p - g)
                    p.add_(d_p, alpha=-group["lr"])


def params_to_torch(params, net) -> None:
    """Copies flax FedAvgCNN parameters into ``net`` (PyTorch layout: conv kernels
    HWIO -> OIHW; the first dense layer's inputs flattened HWC -> CHW)."""
    p = jax.tree.map(np.asarray, params)
    d0 = p["Dense_0"]["kernel"].reshape(4, 4, 64, 512).transpose(3, 2, 0, 1)
    arrays = {
        "conv1.0.weight": p["Conv_0"]["kernel"].transpose(3, 2, 0, 1),
        "conv1.0.bias": p["Conv_0"]["bias"],
        "conv2.0.weight": p["Conv_1"]["kernel"].transpose(3, 2, 0, 1),
        "conv2.0.bias": p["Conv_1"]["bias"],
        "fc1.0.weight": d0.reshape(512, 1024), "fc1.0.bias": p["Dense_0"]["bias"],
        "fc.weight": p["Dense_1"]["kernel"].T, "fc.bias": p["Dense_1"]["bias"],
    }
    net.load_state_dict({k: torch.from_numpy(np.array(v, np.float32))  # a copy
                         for k, v in arrays.items()})


def params_from_torch(net) -> dict:
    """The inverse of :func:`params_to_torch` (NumPy arrays, flax layout)."""
    s = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    d0 = s["fc1.0.weight"].reshape(512, 64, 4, 4).transpose(2, 3, 1, 0)
    return {"Conv_0": {"kernel": s["conv1.0.weight"].transpose(2, 3, 1, 0),
                       "bias": s["conv1.0.bias"]},
            "Conv_1": {"kernel": s["conv2.0.weight"].transpose(2, 3, 1, 0),
                       "bias": s["conv2.0.bias"]},
            "Dense_0": {"kernel": d0.reshape(1024, 512), "bias": s["fc1.0.bias"]},
            "Dense_1": {"kernel": s["fc.weight"].T, "bias": s["fc.bias"]}}


class TorchDitto:
    """PFLlib's Ditto, serial over clients: per client ``ptrain`` (one epoch of
    ``PerturbedGradientDescent`` on ``v_k`` anchored at ``w^t``) then ``train``
    (one epoch of SGD from ``w^t``); the server averages weighted by size."""

    def __init__(self, train, test, w0, *, lr, lam, batch_size, seed):
        from torch.utils.data import DataLoader, TensorDataset

        def tensors(x, y):  # NHWC -> NCHW
            return TensorDataset(torch.from_numpy(np.ascontiguousarray(
                x.transpose(0, 3, 1, 2))), torch.from_numpy(y))

        self.lr, self.lam = lr, lam
        self.loaders = [DataLoader(tensors(*c), batch_size, shuffle=True,
                                   drop_last=True,
                                   generator=torch.Generator().manual_seed(seed + k))
                        for k, c in enumerate(train)]
        self.test_loaders = [DataLoader(tensors(*c), batch_size) for c in test]
        self.counts = [len(c[1]) for c in train]
        self.glob, self.local = FedAvgCNN(), FedAvgCNN()
        params_to_torch(w0, self.glob)
        self.personal = [FedAvgCNN() for _ in train]
        for v in self.personal:
            v.load_state_dict(self.glob.state_dict())
        self.loss = torch.nn.CrossEntropyLoss()

    def _epoch(self, net, loader, opt, *step_args):
        net.train()
        for x, y in loader:
            loss = self.loss(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step(*step_args)

    def round(self) -> None:
        w_t = [p.detach().clone() for p in self.glob.parameters()]
        acc = [torch.zeros_like(p) for p in w_t]
        total = float(sum(self.counts))
        for k, loader in enumerate(self.loaders):
            v = self.personal[k]
            self._epoch(v, loader, PerturbedGradientDescent(
                v.parameters(), lr=self.lr, mu=self.lam), w_t)
            with torch.no_grad():
                for p, w in zip(self.local.parameters(), w_t, strict=True):
                    p.copy_(w)
            self._epoch(self.local, loader,
                        torch.optim.SGD(self.local.parameters(), lr=self.lr))
            with torch.no_grad():
                for a, p in zip(acc, self.local.parameters(), strict=True):
                    a.add_(p, alpha=self.counts[k] / total)
        with torch.no_grad():
            for p, a in zip(self.glob.parameters(), acc, strict=True):
                p.copy_(a)

    def evaluate(self) -> dict:
        """PFLlib's ``evaluate`` + ``evaluate_personalized``: every client's test
        accuracy and loss and training loss (the personal one with PFLlib's
        ``mu/2 ||w - v||`` term), for the global and personal models. Returns the
        pooled test accuracies (AUC, which PFLlib adds with sklearn, is left out)."""
        with torch.no_grad():
            out = {}
            for view in ("global", "personal"):
                correct = [self._eval_client(k, view) for k in range(len(self.loaders))]
                out[view] = sum(correct) / max(sum(len(t.dataset) for t in
                                                   self.test_loaders), 1)
            return out

    def _eval_client(self, k, view) -> int:
        net = self.glob if view == "global" else self.personal[k]
        net.eval()
        correct = 0
        for x, y in self.test_loaders[k]:
            logits = net(x)
            self.loss(logits, y).item()
            correct += int((logits.argmax(1) == y).sum())
        for x, y in self.loaders[k]:
            loss = self.loss(net(x), y)
            if view == "personal":  # as PFLlib: both models flattened per batch
                gm = torch.cat([p.view(-1) for p in self.glob.parameters()])
                pm = torch.cat([p.view(-1) for p in net.parameters()])
                loss = loss + 0.5 * self.lam * torch.norm(gm - pm, p=2)
            loss.item()
        return correct


def run_torch(train, test, w0, args):
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    impl = TorchDitto(train, test, w0, lr=args.lr, lam=args.lam,
                      batch_size=args.batch_size, seed=args.seed)
    out = _time_rounds(lambda s: (impl.round(), s)[1], lambda s: impl.evaluate(),
                       None, args.rounds, "torch")
    return dict(out, torch=torch.__version__, torch_threads=torch.get_num_threads())


# -------------------------------------------------------------------- driver


def _time_rounds(train_round, evaluate, state, rounds, name):
    """Runs ``rounds`` rounds, each followed by an evaluation, timing both; the
    first round is the warm-up (its time is ``first_round_s``). The process CPU
    time of each training round is kept too: about ``cores x wall`` on a quiet
    machine, less when other processes take cores away."""
    train_s, eval_s, cpu_s, hist = [], [], [], []
    for r in range(rounds):
        t0, c0 = time.perf_counter(), time.process_time()
        state = train_round(state)
        t1 = time.perf_counter()
        cpu_s.append(time.process_time() - c0)
        acc = evaluate(state)
        t2 = time.perf_counter()
        train_s.append(t1 - t0)
        eval_s.append(t2 - t1)
        hist.append(acc)
        print(f"  {name} round {r + 1}: train {t1 - t0:.2f} s (CPU {cpu_s[-1]:.1f} s), "
              f"eval {t2 - t1:.2f} s, global {acc['global']:.4f}, personal "
              f"{acc['personal']:.4f}", flush=True)
    timed = slice(1, None) if rounds > 1 else slice(None)  # drop the warm-up
    tr, ev = np.asarray(train_s[timed]), np.asarray(eval_s[timed])
    return {"first_round_s": train_s[0], "round_s": float(np.median(tr)),
            "eval_s": float(np.median(ev)), "round_eval_s": float(np.median(tr + ev)),
            "timed_rounds": max(rounds - 1, 0), "train_s_all": train_s,
            "eval_s_all": eval_s, "train_cpu_s_all": cpu_s,
            "global_acc": hist[-1]["global"], "personal_acc": hist[-1]["personal"],
            "acc_history": hist}


def _machine() -> dict:
    return {"cpu_model": cpu_model(), "cores": len(os.sched_getaffinity(0))}


def report(path: str) -> str:
    """Markdown table of a ``--out`` file: one row per implementation and run,
    then ``torch / fedjax`` for runs that have both."""
    runs: dict[str, dict] = {}
    for r in read_jsonl(path):
        runs.setdefault(r["run_id"], {})[r["impl"]] = r
    lines = [("| run (git) | impl | devices | clients | rounds | compile s | "
              "train round s | round + eval s | global acc | personal acc |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for run_id, recs in runs.items():
        for impl, r in recs.items():
            comp = f"{r['compile_s']:.1f}" if "compile_s" in r else "-"
            dev = r.get("devices", 1) if impl == "fedjax" else "-"
            lines.append(f"| {run_id} ({r['git_sha']}) | {impl} | {dev} | "
                         f"{r['clients']} | {r['rounds']} | {comp} | "
                         f"{r['round_s']:.2f} | {r['round_eval_s']:.2f} | "
                         f"{r['global_acc']:.4f} | {r['personal_acc']:.4f} |")
        if set(IMPLS) <= set(recs):
            f, t = recs["fedjax"], recs["torch"]
            lines.append(f"| {run_id} | **torch / fedjax** | | | | | "
                         f"**{t['round_s'] / f['round_s']:.2f}** | "
                         f"**{t['round_eval_s'] / f['round_eval_s']:.2f}** | | |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3,
                   help="training rounds, the first a warm-up (not timed)")
    p.add_argument("--impl", nargs="+", default=list(IMPLS), choices=IMPLS)
    p.add_argument("--clients", type=int, default=None,
                   help="the first K clients only (smoke runs); default all 20")
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--lam", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--torch-threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--devices", type=int, default=len(os.sched_getaffinity(0)),
                   help="CPU devices for fedjax (one client loop per core; 1 = one "
                   "device whose operations use every core)")
    args = parse_or_report(p, argv, report)
    if args is None:
        return []
    if args.devices < 1:
        p.error("--devices: must be >= 1")
    args.devices = cpu_devices(args.devices)
    if args.rounds < 1:
        p.error("--rounds: must be >= 1")
    impls = [i for i in IMPLS if i in args.impl]
    if "torch" in impls and torch is None:
        print("torch is not installed (pip install -e '.[bench]'): skipping the "
              "PyTorch side")
        impls.remove("torch")
    train, test = load_clients(args.clients)
    counts = [len(c[1]) for c in train]
    meta = dict(_meta(), **_machine(),
                torch=None if torch is None else torch.__version__)
    meta["run_id"] = meta["date"]
    config = {"workload": "ditto/pfllib_fmnist_dir01", "model": "fedavg_cnn",
              "clients": len(train), "rounds": args.rounds, "lr": args.lr,
              "lam": args.lam, "batch_size": args.batch_size, "local_epochs": 1,
              "personal_epochs": 1, "weighted": True, "seed": args.seed,
              "devices": args.devices,
              "train_rows": sum(counts), "test_rows": sum(len(c[1]) for c in test),
              "sgd_steps_per_round": 2 * sum(n // args.batch_size for n in counts)}
    print(f"W1: {config['clients']} clients, {config['train_rows']} train / "
          f"{config['test_rows']} test rows, {config['sgd_steps_per_round']} SGD steps "
          f"a round (drop_last); {meta['cpu_model']}, {meta['cores']} cores")
    fed, alg, drop_last, state, key = fedjax_setup(train, test, args)
    w0 = jax.tree.map(np.array, state.server.params)  # both start from this w^0
    results = {}
    if "fedjax" in impls:
        results["fedjax"] = run_fedjax(fed, alg, drop_last, state, key, args)
    del state, fed
    if "torch" in impls:
        results["torch"] = dict(run_torch(train, test, w0, args), drop_last=True)
    records = []
    for impl, res in results.items():
        rec = {**meta, **config, "impl": impl, **res}
        records.append(rec)
        comp = f", compile {res['compile_s']:.1f} s" if "compile_s" in res else ""
        print(f"{impl:>6}: {res['round_s']:.2f} s / training round{comp}; "
              f"{res['round_eval_s']:.2f} s with evaluation; pooled test acc after "
              f"{args.rounds} rounds: global {res['global_acc']:.4f}, personal "
              f"{res['personal_acc']:.4f}")
    if len(results) == 2:
        f, t = results["fedjax"], results["torch"]
        print(f"torch / fedjax: {t['round_s'] / f['round_s']:.2f} (training round), "
              f"{t['round_eval_s'] / f['round_eval_s']:.2f} (with evaluation); "
              "> 1: fedjax_pfl is faster")
    write_jsonl(args.out, records)
    return records


if __name__ == "__main__":
    main()
