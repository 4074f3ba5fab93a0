"""The tutorials run headless (smoke settings) and draw their figures; they use
only the public API and their .ipynb twins match the .py sources."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
# Figures each notebook writes with FEDJAX_PFL_NOTEBOOK_SMOKE=1.
FIGURES = {
    "01_quickstart": ["01_training_curves.png", "01_client_accuracy.png"],
    "02_lambda_sweep": ["02_lambda_sweep.png", "02_curves.png",
                        "02_client_accuracy.png"],
    "03_robustness": ["03_A3.png"],
    "04_privacy": ["04_epsilon.png", "04_dp_fedavg.png", "04_fedfdp_clients.png"],
    "05_nfl_lindt": ["05_nfl.png", "05_client_gain.png"],
}
PRIVATE = re.compile(r"fedjax_pfl(\.\w+)*\._|from fedjax_pfl[\w.]* import _"
                     r"|\bfp\.\w*\._|\b(algorithms|attacks|aggregators|core|data|"
                     r"metrics|models|plots|privacy)\._")


def test_every_notebook_is_tested():
    assert sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.py")) == sorted(FIGURES)


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """A JAX compilation cache shared by the notebooks of this run only (they
    build the same synthetic data: about 10 % less CPU time, cold every run)."""
    return str(tmp_path_factory.mktemp("jax_cache"))


@pytest.mark.slow  # ~75 s of CPU for the five; run with -m slow
@pytest.mark.parametrize("name", sorted(FIGURES))
def test_notebook_runs_headless_and_draws_its_figures(name, tmp_path, compile_cache):
    src = NOTEBOOKS / f"{name}.py"
    env = dict(os.environ, FEDJAX_PFL_NOTEBOOK_SMOKE="1",
               FEDJAX_PFL_NOTEBOOK_OUT=str(tmp_path), MPLBACKEND="Agg",
               JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=compile_cache,
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    proc = subprocess.run([sys.executable, str(src)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for fig in FIGURES[name]:
        path = tmp_path / fig
        assert path.exists(), f"{name} did not write {fig}: {os.listdir(tmp_path)}"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_notebook_uses_public_api_and_is_paired(name):
    text = (NOTEBOOKS / f"{name}.py").read_text()
    assert "formats: ipynb,py:percent" in text  # the jupytext header
    code = "\n".join(line for line in text.splitlines()
                     if not line.lstrip().startswith("#"))
    assert not PRIVATE.search(code), PRIVATE.search(code).group(0)
    assert "FEDJAX_PFL_NOTEBOOK_SMOKE" in code
    jupytext = pytest.importorskip("jupytext")
    ipynb = NOTEBOOKS / f"{name}.ipynb"
    assert ipynb.exists(), f"run: jupytext --sync notebooks/{name}.py"
    py_nb = jupytext.reads(text, "py:percent")
    py_cells = [(c.cell_type, c.source) for c in py_nb.cells]
    nb_cells = [(c.cell_type, c.source) for c in jupytext.read(ipynb).cells]
    assert py_cells == nb_cells, f"out of sync: jupytext --sync notebooks/{name}.py"
