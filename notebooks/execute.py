"""Rebuild the tutorials' .ipynb from their jupytext .py sources and execute them.

Each ``notebooks/NN_*.ipynb`` is regenerated from ``NN_*.py`` (the .py is the
source; edit it, not the .ipynb) and run top to bottom in a fresh Python 3
kernel at full size; the printed text and the figures (embedded PNG) are saved
in the .ipynb. The metadata is made deterministic (no execution timestamps,
kernel ``python3``, no Python version, cell ids derived from the cells'
sources), so executing an unchanged source again changes only what its
numbers change. Commit the .py and the .ipynb together::

    pip install -e ".[jupyter]"
    python notebooks/execute.py                  # all five at full size: ~5 min on
                                                 # 2 CPU cores (03_robustness: 3)
    python notebooks/execute.py 03_robustness    # some of them
    python notebooks/execute.py --smoke --out /tmp/nb   # tiny settings, elsewhere

``tests/notebooks`` checks that the committed .ipynb match their .py sources
and were executed in order without errors, and (``-m slow``) runs every
notebook in a kernel at the smoke size.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
KERNEL = "python3"
# Written into the notebook's metadata: how big a run made its outputs.
SIZES = {"full": "full size", "smoke": "FEDJAX_PFL_NOTEBOOK_SMOKE=1 (tiny settings)"}


def sources() -> list[pathlib.Path]:
    """The jupytext sources of the tutorials, in order."""
    return sorted(HERE.glob("[0-9][0-9]_*.py"))


def build(py: pathlib.Path):
    """The notebook of a jupytext .py source, without outputs, with
    deterministic cell ids (a hash of the cell's type and source)."""
    import jupytext

    nb = jupytext.read(py)
    seen: dict[str, int] = {}
    for cell in nb.cells:
        digest = hashlib.sha1(f"{cell.cell_type}\n{cell.source}".encode()).hexdigest()
        n = seen[digest[:8]] = seen.get(digest[:8], -1) + 1
        cell.id = digest[:8] if n == 0 else f"{digest[:8]}-{n}"
    return nb


def execute(nb, *, smoke: bool = False, figures=None, timeout: int | None = 3600,
            env=None):
    """Runs ``nb`` in place in a fresh ``python3`` kernel of this Python (in a
    temporary directory) and makes its metadata deterministic.

    Args:
      nb: a notebook from :func:`build`.
      smoke: tiny settings (``FEDJAX_PFL_NOTEBOOK_SMOKE=1``).
      figures: a folder to also save the figures in as PNG files
        (``FEDJAX_PFL_NOTEBOOK_OUT``; default: none written).
      timeout: seconds per cell (``None``: no limit).
      env: the kernel's environment (default: this process's).

    Returns:
      ``nb``, with its outputs.

    Raises:
      nbclient.exceptions.CellExecutionError: a cell raised; its traceback.
    """
    import nbclient
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    env = dict(os.environ if env is None else env)
    env.pop("FEDJAX_PFL_NOTEBOOK_OUT", None)
    env.pop("FEDJAX_PFL_NOTEBOOK_SMOKE", None)
    env.pop("MPLBACKEND", None)  # the notebooks ask for the inline backend
    if smoke:
        env["FEDJAX_PFL_NOTEBOOK_SMOKE"] = "1"
    if figures is not None:
        env["FEDJAX_PFL_NOTEBOOK_OUT"] = str(pathlib.Path(figures).resolve())
    # ipykernel's own python3 kernel, run by this interpreter (no kernel dirs:
    # a user's python3 kernelspec may point to another environment)
    km = AsyncKernelManager(kernel_name=KERNEL,
                            kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    with tempfile.TemporaryDirectory(prefix="fedjax_pfl_nb_") as cwd:
        client = nbclient.NotebookClient(
            nb, km=km, kernel_name=KERNEL, timeout=timeout, record_timing=False,
            coalesce_streams=True, resources={"metadata": {"path": cwd}})
        client.execute(env=env)
    nb.metadata.kernelspec = {"display_name": "Python 3", "language": "python",
                              "name": KERNEL}
    nb.metadata.get("language_info", {}).pop("version", None)
    nb.metadata.fedjax_pfl = {"executed": SIZES["smoke" if smoke else "full"]}
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*",
                        help="notebooks to run, e.g. 01_quickstart (default: all)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny settings (FEDJAX_PFL_NOTEBOOK_SMOKE=1); needs --out")
    parser.add_argument("--out", type=pathlib.Path,
                        help="write the executed .ipynb here (default: notebooks/)")
    parser.add_argument("--timeout", type=int, default=3600,
                        help="seconds per cell (default 3600)")
    args = parser.parse_args(argv)
    if args.smoke and args.out is None:
        parser.error("--smoke needs --out: the committed notebooks hold "
                     "full-size outputs")
    known = {p.stem: p for p in sources()}
    names = [n.removesuffix(".py").removesuffix(".ipynb") for n in args.names]
    unknown = sorted(set(names) - set(known))
    if unknown:
        parser.error(f"unknown notebook(s) {unknown}; known: {sorted(known)}")
    try:
        import ipykernel  # noqa: F401
        import jupytext
        import nbclient  # noqa: F401
    except ImportError as e:
        parser.error(f"{e.name} is missing: pip install -e \".[jupyter]\"")
    out = args.out or HERE
    out.mkdir(parents=True, exist_ok=True)

    for name in names or sorted(known):
        start = time.perf_counter()
        nb = execute(build(known[name]), smoke=args.smoke, timeout=args.timeout)
        jupytext.write(nb, out / f"{name}.ipynb", fmt="ipynb")
        print(f"{name}: executed in {time.perf_counter() - start:.0f} s -> "
              f"{out / f'{name}.ipynb'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
