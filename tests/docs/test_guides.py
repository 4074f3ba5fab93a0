"""The guides run: the python blocks of docs/own_experiment.md (in order, at a
smaller size) and of docs/models.md."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "own_experiment.md"

# (what the guide says, what the test runs): each must occur in the guide, so a
# guide edit that drops one fails here instead of silently running at full size.
SMALLER = [
    ("size=20_000", "size=2_000"),
    ("size=(20_000, 20)", "size=(2_000, 20)"),
    ("num_clients=100", "num_clients=12"),
    ("range(50)", "range(6)"),
    ("cohort_size=10", "cohort_size=4"),
    ("num_local_steps=10", "num_local_steps=2"),
    ("num_rounds=300, eval_every=25", "num_rounds=4, eval_every=2"),
    ("checkpoint_every=50", "checkpoint_every=2"),
    ("patience=100", "patience=2"),
]


def python_blocks(text: str) -> list[str]:
    """The fenced python blocks of a markdown page, in order, dedented (blocks
    inside list items are indented)."""
    blocks = []
    for indent, body in re.findall(r"^( *)```python\n(.*?)^\1```", text, re.S | re.M):
        lines = body.split("\n")
        blocks.append("\n".join(line[len(indent):] for line in lines))
    return blocks


def test_guide_blocks_are_found():
    blocks = python_blocks(GUIDE.read_text())
    assert len(blocks) >= 8
    assert any("again = fp.simulate" in b for b in blocks)  # the indented one


def test_own_experiment_guide_runs(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    code = "\n".join(python_blocks(GUIDE.read_text()))
    for big, small in SMALLER:
        assert big in code, big
        code = code.replace(big, small)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    exec(compile(code, str(GUIDE), "exec"), {"__name__": "own_experiment"})
    out = capsys.readouterr().out
    assert "FederatedData(clients=12, " in out and "classes=10)" in out
    assert (tmp_path / "runs" / "ditto-a1-curves.png").stat().st_size > 0
    assert (tmp_path / "runs" / "ditto-a1-clients.png").stat().st_size > 0


def test_models_page_runs(capsys):
    code = "\n".join(python_blocks((ROOT / "docs" / "models.md").read_text()))
    exec(compile(code, "docs/models.md", "exec"), {"__name__": "models_page"})
    printed = capsys.readouterr().out.split()
    assert printed[-3:] == ["15770"] * 3  # num_params: Model, module, params
