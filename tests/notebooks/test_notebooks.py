"""The tutorials: every committed .ipynb is its .py source executed top to bottom
without errors (outputs saved by notebooks/execute.py), they use only the public
API, and they run in a kernel at the smoke size and draw their figures."""

import importlib.util
import os
import pathlib
import re

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
    "05_nfl_lindt": ["05_nfl.png", "05_beta.png", "05_client_gain.png"],
}
PRIVATE = re.compile(r"fedjax_pfl(\.\w+)*\._|from fedjax_pfl[\w.]* import _"
                     r"|\bfp\.\w*\._|\b(algorithms|attacks|aggregators|core|data|"
                     r"metrics|models|plots|privacy)\._")
REGENERATE = "python notebooks/execute.py {name}"


def _script():
    spec = importlib.util.spec_from_file_location("execute", NOTEBOOKS / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pngs(nb) -> int:
    return sum("image/png" in out.get("data", {}) for cell in nb.cells
               if cell.cell_type == "code" for out in cell.outputs)


def test_every_notebook_is_tested():
    assert sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.py")) == sorted(FIGURES)
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == sorted(FIGURES)


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_notebook_uses_public_api(name):
    text = (NOTEBOOKS / f"{name}.py").read_text()
    assert "formats: ipynb,py:percent" in text  # the jupytext header
    code = "\n".join(line for line in text.splitlines()
                     if not line.lstrip().startswith("#"))
    assert not PRIVATE.search(code), PRIVATE.search(code).group(0)
    assert "FEDJAX_PFL_NOTEBOOK_SMOKE" in code


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_committed_notebook_is_its_source_executed(name):
    """Same cells as the .py (so the outputs cannot drift from the source), run
    in order in one fresh kernel at full size, every code cell with its outputs
    and no error, figures embedded, deterministic metadata."""
    pytest.importorskip("jupytext")
    import nbformat

    again = REGENERATE.format(name=name)
    expected = _script().build(NOTEBOOKS / f"{name}.py")
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    assert [(c.cell_type, c.source) for c in nb.cells] == \
        [(c.cell_type, c.source) for c in expected.cells], f"out of date: {again}"
    assert [c.id for c in nb.cells] == [c.id for c in expected.cells], \
        f"not written by notebooks/execute.py: {again}"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), \
        f"not executed top to bottom in a fresh kernel: {again}"
    for cell in code:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"cell {cell.id} raised {errors[0].ename}: {again}"
        assert "execution" not in cell.metadata, f"timestamps left in: {again}"
    assert nb.metadata.get("fedjax_pfl", {}).get("executed") == "full size", again
    assert nb.metadata.kernelspec.name == "python3"
    assert "version" not in nb.metadata.get("language_info", {})
    assert _pngs(nb) >= len(FIGURES[name]), f"figures missing: {again}"


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """The suite's persistent JAX compilation cache (tests/conftest.py), so
    the kernels load the programs an earlier run compiled; a cache of this
    run only when the suite's is off."""
    import jax

    return (jax.config.jax_compilation_cache_dir
            or str(tmp_path_factory.mktemp("jax_cache")))


# Every notebook runs in a kernel in the default suite (CI runs them, it does
# not only check the committed outputs).
@pytest.mark.parametrize("name", sorted(FIGURES))
def test_notebook_runs_in_a_kernel_and_draws_its_figures(name, tmp_path,
                                                         compile_cache):
    pytest.importorskip("jupytext")
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    script = _script()
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               JAX_COMPILATION_CACHE_DIR=compile_cache,
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    nb = script.execute(script.build(NOTEBOOKS / f"{name}.py"), smoke=True,
                        figures=tmp_path, env=env, timeout=300)
    assert _pngs(nb) >= len(FIGURES[name])  # displayed inline
    for fig in FIGURES[name]:  # and saved where FEDJAX_PFL_NOTEBOOK_OUT says
        path = tmp_path / fig
        assert path.exists(), f"{name} did not write {fig}: {os.listdir(tmp_path)}"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
