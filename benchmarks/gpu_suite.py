"""Helpers of ``benchmarks/gpu_suite.sh``: the environment check and the report.

``env DIR``: imports every module the package and its benchmarks need, one at a
time, and prints exactly which are missing (with the pip name to carry); with
``--wheels WHEELDIR`` first installs the missing ones from that folder
(``pip install --no-deps --no-index``). Then prints Python, jax, the devices and
the package versions, and writes ``DIR/env.json``. Exit status 1 when a required
module is missing, ``fedjax_pfl`` does not import, or ``--expect-gpu`` is given
and jax's default backend is not ``gpu``.

``report DIR``: reads ``DIR/env.json``, the step records ``DIR/*.status`` and
the JSONL records of every benchmark step, and writes ``DIR/gpu.md`` (device,
jax version, the suite's command, a table of the steps, then each benchmark's
``--report`` table) and ``DIR/docs_results/`` (``gpu.md`` and the JSONL records
as ``<benchmark>_gpu.jsonl``); ``--docs DOCDIR`` also copies those into DOCDIR.

    python benchmarks/gpu_suite.py env runs/gpu --wheels .whl --expect-gpu
    python benchmarks/gpu_suite.py report runs/gpu --docs docs/results
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent

# (import name, pip name): what the package, dp-accounting and the suite import
REQUIRED = (
    ("numpy", "numpy"), ("scipy", "scipy"), ("jax", "jax"), ("jaxlib", "jaxlib"),
    ("flax", "flax"), ("optax", "optax"), ("chex", "chex"),
    ("orbax.checkpoint", "orbax-checkpoint"), ("tqdm", "tqdm"), ("absl", "absl-py"),
    ("attr", "attrs"), ("wrapt", "wrapt"), ("tree", "dm-tree"), ("mpmath", "mpmath"),
    ("dp_accounting", "dp-accounting"), ("pytest", "pytest"),
)
OPTIONAL = (("torch", "torch"), ("xdist", "pytest-xdist"))
VERSIONS = ("jax", "jaxlib", "numpy", "scipy", "flax", "optax", "chex",
            "orbax-checkpoint", "dp-accounting", "dm-tree", "attrs", "torch", "pytest")

# benchmark -> (suite steps whose JSONL it reads, section title, report takes a list)
SECTIONS = (
    ("w1_pytorch", ("w1",), "W1: Ditto on PFLlib's FMNIST split, fedjax_pfl vs PyTorch",
     False, "w1"),
    ("throughput", ("throughput", "throughput_cnn"),
     "Engine round vs a Python loop over clients (1,000 and 10,000 clients)", True,
     "throughput"),
    ("ditto_cost", ("ditto_cost",), "Ditto: a sweep of 8 lambdas in one program", False,
     "ditto_cost"),
    ("privacy", ("privacy", "privacy_1000"), "The DP local step (ghost norms, vmap)",
     True, "privacy"),
    ("ditto_fmnist", ("ditto_fmnist",), "Ditto's Fashion-MNIST setting, 100 rounds",
     False, "ditto_fmnist"),
)


def _try_import(name: str) -> str | None:
    """``None`` if ``name`` imports, else the error in one line."""
    try:
        importlib.import_module(name)
        return None
    except Exception as e:  # noqa: BLE001 - a broken install is missing too
        return f"{type(e).__name__}: {e}".splitlines()[0]


def _missing(mods) -> dict[str, tuple[str, str]]:
    out = {}
    for mod, pip in mods:
        err = _try_import(mod)
        if err is not None:
            out[mod] = (pip, err)
    return out


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _nvidia_smi() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
             "--format=csv,noheader"], check=False, capture_output=True, text=True,
            timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi failed: {e}"


def _install(pips: list[str], wheels: pathlib.Path) -> None:
    """``pip install --no-deps --no-index`` of those of ``pips`` that have a wheel
    in ``wheels`` (one absent wheel would make pip install none of them)."""
    if not wheels.is_dir():
        print(f"--wheels {wheels}: no such folder; nothing installed")
        return
    files = [f.name.lower() for f in wheels.glob("*.whl")]
    have = [p for p in pips
            if any(f.startswith(re.sub(r"[-_.]+", "_", p).lower() + "-") for f in files)]
    if lacking := [p for p in pips if p not in have]:
        print(f"no wheel in {wheels} for: {' '.join(lacking)}")
    if have:
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
               "--find-links", str(wheels), *have]
        print("installing:", " ".join(cmd))
        subprocess.run(cmd, check=False)
        importlib.invalidate_caches()


def env(args) -> int:
    out = pathlib.Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    missing = _missing(REQUIRED)
    if missing and args.wheels:
        _install(sorted({pip for pip, _ in missing.values()}), pathlib.Path(args.wheels))
        missing = _missing(REQUIRED)
    optional = _missing(OPTIONAL)
    for mod, (pip, err) in missing.items():
        print(f"MISSING (required): {pip} (import {mod}): {err}")
    for mod, (pip, err) in optional.items():
        print(f"missing (optional): {pip} (import {mod}): {err}")
    if missing:
        print("carry these wheels and install them with: pip install --no-deps "
              "--no-index --find-links .whl " + " ".join(p for p, _ in missing.values()))
    else:
        print("all required modules import")
    info = {"python": sys.version.split()[0], "executable": sys.executable,
            "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "missing_required": {m: p for m, (p, _) in missing.items()},
            "missing_optional": {m: p for m, (p, _) in optional.items()},
            "versions": {d: _version(d) for d in VERSIONS},
            "nvidia_smi": _nvidia_smi(), "command": os.environ.get("GPU_SUITE_COMMAND")}
    ok = not missing
    if "jax" not in missing:
        import jax

        devs = jax.devices()
        info.update(jax=jax.__version__, backend=jax.default_backend(),
                    device_kind=devs[0].device_kind, num_devices=len(devs),
                    devices=[str(d) for d in devs])
        try:
            stats = devs[0].memory_stats() or {}
        except Exception:  # noqa: BLE001 - CPU devices have none
            stats = {}
        if stats.get("bytes_limit"):
            info["device_memory_gib"] = round(stats["bytes_limit"] / 2**30, 1)
        if args.expect_gpu and info["backend"] != "gpu":
            print(f"ERROR: jax's default backend is {info['backend']!r}, not 'gpu' "
                  "(is the CUDA plugin installed and visible?)")
            ok = False
    err = _try_import("fedjax_pfl")
    info["fedjax_pfl_import_error"] = err
    if err is not None:
        print("fedjax_pfl does not import:", err)
        ok = False
    if "torch" not in optional:
        import torch

        info["torch_cuda"] = bool(torch.cuda.is_available())
    try:
        info["git_sha"] = subprocess.check_output(
            ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, text=True,
            stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.SubprocessError):
        info["git_sha"] = None
    for k in ("python", "jax", "backend", "device_kind", "num_devices",
              "device_memory_gib", "devices", "nvidia_smi", "cpu_count", "git_sha"):
        if k in info:
            print(f"{k}: {info[k]}")
    print("versions:", ", ".join(f"{k} {v}" for k, v in info["versions"].items() if v))
    (out / "env.json").write_text(json.dumps(info, indent=1) + "\n")
    return 0 if ok else 1


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # flax dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


STEP_ORDER = ("env", "tests", "w1", "throughput", "throughput_cnn", "ditto_cost",
              "privacy", "privacy_1000", "ditto_fmnist", "report")


def _steps(d: pathlib.Path) -> dict[str, dict]:
    """The ``<step>.status`` records of ``d``, in the suite's order."""
    order = {name: i for i, name in enumerate(STEP_ORDER)}
    steps = {}
    for p in sorted(d.glob("*.status"),
                    key=lambda p: (order.get(p.stem, len(order)), p.stem)):
        name, status, rc, secs, limit, cmd = p.read_text().rstrip("\n").split("\t", 5)
        steps[name] = {"status": status, "rc": rc, "seconds": secs, "limit": limit,
                       "command": cmd}
    return steps


def _header(info: dict) -> list[str]:
    """The title and the device, versions and command lines of ``gpu.md``."""
    v = info.get("versions", {})
    mem = f", {info['device_memory_gib']} GiB" if info.get("device_memory_gib") else ""
    smi = f"; nvidia-smi: {info['nvidia_smi']}" if info.get("nvidia_smi") else ""
    command = info.get("command") or "bash benchmarks/gpu_suite.sh"
    return [
        "# fedjax_pfl on a GPU", "",
        ("Written by `benchmarks/gpu_suite.sh` (`benchmarks/gpu_suite.py report`) "
         "from the JSONL records of one run; every benchmark measures its baseline "
         "in the same run, so read the ratios."), "",
        (f"* **Device**: {info.get('device_kind', '?')} x {info.get('num_devices', '?')}"
         f" (jax backend `{info.get('backend', '?')}`{mem}), "
         f"{info.get('cpu_count', '?')} CPU cores{smi}"),
        (f"* **jax {info.get('jax', '?')}** (jaxlib {v.get('jaxlib')}), Python "
         f"{info.get('python', '?')}, numpy {v.get('numpy')}, flax {v.get('flax')}, "
         f"optax {v.get('optax')}, torch {v.get('torch')}, dp-accounting "
         f"{v.get('dp-accounting')}; git {info.get('git_sha')}"),
        f"* **Command**: `{command}`",
    ]


def report(args) -> int:
    d = pathlib.Path(args.dir)
    info = json.loads((d / "env.json").read_text()) if (d / "env.json").exists() else {}
    steps = _steps(d)
    docs = d / "docs_results"
    docs.mkdir(exist_ok=True)
    lines = [*_header(info), "", "## Steps", "",
             "| step | status | seconds | limit s | command |", "|---|---|---|---|---|"]
    for name, s in steps.items():
        lines.append(f"| {name} | {s['status']} | {s['seconds']} | {s['limit']} | "
                     f"`{s['command']}` |")
    for bench, names, title, multiple, out_name in SECTIONS:
        lines += ["", f"## {title}", ""]
        paths = [d / f"{n}.jsonl" for n in names]
        paths = [p for p in paths if p.exists() and p.stat().st_size > 0]
        for n in names:
            if n in steps:
                lines.append(f"`{steps[n]['command']}` ({steps[n]['status']})  ")
        if not paths:
            lines += ["", "No records."]
            continue
        merged = docs / f"{out_name}_gpu.jsonl"
        merged.write_text("".join(p.read_text() for p in paths))
        try:
            mod = _load(bench)
            table = mod.report([str(p) for p in paths] if multiple else str(merged))
        except Exception as e:  # noqa: BLE001 - one broken report keeps the rest
            table = f"(report failed: {type(e).__name__}: {e})"
        lines += ["", table]
    text = "\n".join(lines) + "\n"
    (d / "gpu.md").write_text(text)
    (docs / "gpu.md").write_text(text)
    print(text)
    if args.docs:
        dest = pathlib.Path(args.docs)
        dest.mkdir(parents=True, exist_ok=True)
        for p in docs.iterdir():
            shutil.copy(p, dest / p.name)
        print(f"copied {', '.join(sorted(p.name for p in docs.iterdir()))} to {dest}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("env", help="check imports and devices; write DIR/env.json")
    e.add_argument("dir")
    e.add_argument("--wheels", default=None, help="install missing modules from here")
    e.add_argument("--expect-gpu", action="store_true",
                   help="fail unless jax's default backend is gpu")
    r = sub.add_parser("report", help="write DIR/gpu.md from the records in DIR")
    r.add_argument("dir")
    r.add_argument("--docs", default=None, help="also copy gpu.md and *_gpu.jsonl here")
    args = p.parse_args(argv)
    return env(args) if args.cmd == "env" else report(args)


if __name__ == "__main__":
    sys.exit(main())
