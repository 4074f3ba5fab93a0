"""Figures for papers: one colour per model in every figure, means that say how
they are weighted, vector files and 300 dpi PNGs, no attack wording without an
attack, mathtext instead of raw ``V^G``, legends that hide no data."""

import re
import struct
import subprocess
import sys
from pathlib import Path

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from matplotlib.colors import to_hex  # noqa: E402

from fedjax_pfl import plots  # noqa: E402

RNG = np.random.default_rng(0)
VIEWS = ("global", "personal", "finetuned")
PER_CLIENT = {v: RNG.uniform(0.2, 1.0, 40) for v in VIEWS}
LAMS = np.array([0.0, 0.1, 1.0, 10.0])


def _history():
    rows = []
    for r in range(0, 50, 5):
        row = {"round": r, "train/loss": 2.0 / (1 + r)}
        for i, v in enumerate(VIEWS):
            for j, s in enumerate(("mean", "mean_unweighted", "worst10")):
                row[f"{v}/test/accuracy/{s}"] = 0.5 + 0.1 * i - 0.1 * j + r / 200
        rows.append(row)
    return rows


def _sweep(model="personal"):
    base = np.linspace(0.6, 0.8, LAMS.size)
    return {f"{model}/test/accuracy/mean": base,
            f"{model}/test/accuracy/mean_unweighted": base - 0.02,
            f"{model}/test/accuracy/worst10": base - 0.3,
            f"{model}/test/accuracy/std": base / 5}


def _nfl():
    return [{"round": r, "nfl/delta": 0.5 - 0.03 * r, "nfl/detected": int(r >= 7),
             "nfl/beta": -5.0 + 0.5 * r} for r in range(12)]


# Every figure function, called without an attack or a mask (adversary_ratio
# is the attack figure: its x axis is the fraction of malicious clients).
FIGURES = {
    "cdf": lambda **kw: plots.client_accuracy_distribution(PER_CLIENT, kind="both",
                                                          **kw),
    "curves": lambda **kw: plots.training_curves(
        _history(), [[f"{v}/test/accuracy/{s}" for v in VIEWS
                      for s in ("mean", "mean_unweighted", "worst10")],
                     ["train/loss"]], **kw),
    "lambda": lambda **kw: plots.lambda_sweep(
        LAMS, _sweep(), per_client=PER_CLIENT["global"][:20].reshape(LAMS.size, 5),
        **kw),
    "nfl": lambda **kw: plots.nfl_curves(_nfl(), **kw),
}
ALL = {**FIGURES, "adversary": lambda **kw: plots.adversary_ratio(
    [0.0, 0.5], {"FedAvg": [0.8, 0.5], "Ditto": [0.9, 0.8]}, **kw)}


def _texts(fig) -> list[str]:
    out = [fig._suptitle.get_text()] if fig._suptitle else []
    legends = [ax.get_legend() for ax in fig.axes] + list(fig.legends)
    for ax in fig.axes:
        out += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
    for g in legends:
        if g is not None:
            out += [t.get_text() for t in g.get_texts()]
    return [t for t in out if t]


def _line_color(fig, prefix: str) -> str:
    found = {to_hex(ln.get_color()) for ax in fig.axes for ln in ax.get_lines()
             if ln.get_label().startswith(prefix)}
    assert len(found) == 1, (prefix, found)
    return found.pop()


# ----------------------------------------------------------------- colours


def test_a_model_has_one_colour_in_every_figure():
    a, b = PER_CLIENT["global"], PER_CLIENT["personal"]
    cdf = plots.client_accuracy_distribution({"personal": b, "global": a})
    hist = plots.client_accuracy_distribution(
        {"local": a, "global": b, "personal": a}, kind="hist")  # other order
    handles, names = hist.axes[0].get_legend_handles_labels()  # one bar per model
    bars = {n: to_hex(h.get_facecolor()) for h, n in zip(handles, names, strict=True)}
    curves = plots.training_curves(_history(), ["personal/test/accuracy/worst10",
                                                "global/test/accuracy/mean"])
    adv = plots.adversary_ratio([0.0, 0.5], {"local": [0.5, 0.4],
                                             "personal": [0.9, 0.8],
                                             "global": [0.7, 0.2]})
    sweeps = {m: plots.lambda_sweep(LAMS, _sweep(m), model=m)
              for m in ("global", "personal")}
    for name in ("global", "personal"):
        seen = {_line_color(cdf, name), bars[name], _line_color(curves, name),
                _line_color(adv, name), _line_color(sweeps[name], "mean weighted")}
        assert seen == {plots.model_color(name)}, (name, seen)
    assert _line_color(cdf, "global") != _line_color(cdf, "personal")


def test_colours_depend_on_the_names_not_their_order():
    names = ["FedAvg", "FedAvg + median", "FedAvg + trimmed mean", "Ditto",
             "lam = 0.1", "lam = 1", "lam = 10"]
    colors = plots.model_colors(names)
    assert colors == plots.model_colors(names[::-1])
    assert len(set(colors.values())) == len(names)  # told apart in one figure
    assert set(colors.values()) <= set(plots.PALETTE)
    assert colors["FedAvg"] == plots.model_color("global")  # exact names keep theirs
    assert colors["Ditto"] == plots.model_color("personal")
    views = ("global", "personal", "local", "finetuned", "dual", "private")
    assert len({plots.model_color(v) for v in views}) == len(views)
    both = plots.model_colors(["fedavg", "global", "Ditto", "personal"])
    assert both["global"] == plots.model_color("global") != both["fedavg"]
    assert both["personal"] == plots.model_color("personal") != both["Ditto"]
    assert plots.model_color("Fed-Avg") == plots.model_color("FEDAVG")
    assert plots.model_color("Ditto, lam = 1") == plots.model_color("ditto")


def test_unknown_names_hash_the_same_in_every_process():
    """No use of Python's salted hash(): another PYTHONHASHSEED, same colours."""
    style = Path(plots.__file__).with_name("_style.py")
    names = ["lam = 0.1", "my method", "q-FFL"]
    code = ("import importlib.util, sys\n"
            f"s = importlib.util.spec_from_file_location('s', {str(style)!r})\n"
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m)\n"
            f"print([m.model_color(n) for n in {names!r}])")
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                             text=True, check=True, env={"PYTHONHASHSEED": seed})
        assert out.stdout.strip() == str([plots.model_color(n) for n in names])


# ------------------------------------------------------------------ labels


def test_every_mean_says_how_it_is_weighted():
    for name, make in ALL.items():
        for text in _texts(make()):
            if re.search(r"\bmean\b", text):
                assert "weighted" in text, (name, text)
    labels = {"global/test/accuracy/mean": "test",
              "global/val/accuracy/mean": "val",
              "global/test/accuracy/mean_unweighted": "unw",
              "personal/test/accuracy/mean": "personal, weighted mean",  # as given
              "global/test/accuracy/worst10": "worst"}
    rows = [{"round": 0, **dict.fromkeys(labels, 0.5)}]
    fig = plots.training_curves(rows, list(labels), labels=labels)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "test (weighted by test examples)", "val (weighted by val examples)",
        "unw (unweighted)", "personal, weighted mean", "worst"]


def test_no_attack_wording_without_an_attack_or_a_mask():
    for name, make in FIGURES.items():
        for text in _texts(make()):
            assert not re.search(r"benign|malicious|attack", text, re.I), (name, text)
    masked = plots.client_accuracy_distribution(PER_CLIENT, mask=[1, 0] * 20)
    assert "20 clients in mask" in masked.axes[0].get_title()


def test_symbols_are_rendered_math_not_raw_text(tmp_path):
    for name, make in ALL.items():
        fig = make(path=tmp_path / f"{name}.png")  # drawing parses the mathtext
        for text in _texts(fig):
            plain = re.sub(r"\$[^$]*\$", "", text)
            assert plain.count("$") == 0, (name, text)
            assert not re.search(r"[\\^]|_\{", plain), (name, text)
            assert not re.search(r"\b(Delta|beta|epsilon|lambda|alpha)\b", plain), (
                name, text)
    nfl = plots.nfl_curves(_nfl())
    assert "(V^G_i - V^P_i)$" in nfl.axes[1].get_ylabel()
    assert plots.lambda_sweep(LAMS, _sweep()).axes[0].get_xlabel() == r"$\lambda$"


# ------------------------------------------------------------------- files


def _png_size_and_dpi(data: bytes):
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    i = data.index(b"pHYs")
    ppm_x, ppm_y, unit = struct.unpack(">IIB", data[i + 4:i + 13])
    assert unit == 1  # metres
    return (width, height), (ppm_x * 0.0254, ppm_y * 0.0254)


@pytest.mark.parametrize("name", list(ALL))
def test_pdf_and_svg_are_vector_png_is_300_dpi(tmp_path, name):
    before = dict(matplotlib.rcParams)
    fig = ALL[name](path=tmp_path / name, formats=("pdf", "svg", "png"))
    assert dict(matplotlib.rcParams) == before  # no global state changed
    pdf = (tmp_path / f"{name}.pdf").read_bytes()
    assert pdf.startswith(b"%PDF")
    assert b"/Subtype /Image" not in pdf  # drawn as paths, not a bitmap
    assert b"/Type3" not in pdf  # TrueType fonts, as publishers ask
    svg = (tmp_path / f"{name}.svg").read_bytes()
    assert b"<svg" in svg[:1000] and b"<image" not in svg
    size, dpi = _png_size_and_dpi((tmp_path / f"{name}.png").read_bytes())
    np.testing.assert_allclose(dpi, (300, 300), atol=0.01)
    np.testing.assert_allclose(size, fig.get_size_inches() * 300, atol=1)
    ALL[name](path=tmp_path / "again.pdf")  # no timestamp: the same bytes
    assert (tmp_path / "again.pdf").read_bytes() == pdf


def test_one_path_writes_its_format_and_bad_paths_are_refused(tmp_path):
    plots.nfl_curves(_nfl(), path=tmp_path / "a.svg")
    assert b"<svg" in (tmp_path / "a.svg").read_bytes()[:1000]
    plots.nfl_curves(_nfl(), path=tmp_path / "b.png", formats="pdf")
    assert (tmp_path / "b.pdf").read_bytes().startswith(b"%PDF")
    assert not (tmp_path / "b.png").exists()
    for kwargs, arg in [({"path": tmp_path / "c"}, "path"),
                        ({"path": tmp_path / "c.txt"}, "path"),
                        ({"formats": ("pdf",)}, "formats"),
                        ({"path": tmp_path / "c", "formats": ("gif",)}, "formats"),
                        ({"path": tmp_path / "c", "formats": ()}, "formats")]:
        with pytest.raises(ValueError, match="^" + arg):
            plots.nfl_curves(_nfl(), **kwargs)
    assert not list(tmp_path.glob("c*"))


def test_a_long_legend_sits_right_of_the_axes_which_keep_their_size():
    few = plots.adversary_ratio([0.0, 0.5], {"a": [0.8, 0.5], "b": [0.9, 0.8]})
    many = plots.adversary_ratio([0.0, 0.5], {f"method {i}": [0.8, 0.5 + i / 10]
                                              for i in range(5)})
    assert few.axes[0].get_legend() is not None and not few.legends
    assert many.axes[0].get_legend() is None and len(many.legends) == 1
    for fig in (few, many):
        fig.draw_without_rendering()
    (ax,), (legend,) = many.axes, many.legends
    assert legend.get_window_extent().x0 >= ax.get_window_extent().x1  # no overlap
    assert many.get_figwidth() > few.get_figwidth()

    def width(f):
        return f.axes[0].get_window_extent().width / f.dpi

    assert abs(width(many) - width(few)) < 0.05


def test_save_figure_writes_a_resized_figure_of_any_origin(tmp_path):
    fig = ALL["adversary"]()
    fig.set_size_inches(3.3, 2.6)  # one journal column
    files = plots.save_figure(fig, tmp_path / "col.png", formats=["png", "pdf"])
    assert files == [str(tmp_path / "col.png"), str(tmp_path / "col.pdf")]
    size, _ = _png_size_and_dpi((tmp_path / "col.png").read_bytes())
    assert size == (990, 780)
    with pytest.raises(ValueError, match="^path"):
        plots.save_figure(fig, tmp_path / "col.jpg")
