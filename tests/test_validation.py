"""fedjax_pfl.validation: accepted values, every refused class, the argument's
name in the message, and traced values under jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_pfl import validation as v

NAN, INF = float("nan"), float("inf")
WRONG_TYPES = ["0.5", b"1", None, True, False, np.True_, [1, "a"], object()]


def _refused(fn, name="arg"):
    """``fn`` raises a ValueError whose message starts with ``name: must``
    (or ``name: <path>`` for the path checks)."""
    with pytest.raises(ValueError) as err:
        fn()
    assert str(err.value).startswith(f"{name}: "), str(err.value)
    return str(err.value)


def _under_jit(check, *args, **kwargs):
    """Runs ``check('arg', traced, ...)`` inside jit; returns the output."""
    def f(x):
        check("arg", x, *args, **kwargs)
        return x * 2

    return jax.jit(f)


def test_is_concrete():
    assert v.is_concrete(1.0) and v.is_concrete(jnp.ones(3)) and v.is_concrete(None)
    seen = []
    jax.jit(lambda x: seen.append(v.is_concrete(x)) or x)(1.0)
    jax.vmap(lambda x: seen.append(v.is_concrete(x)) or x)(jnp.ones(2))
    jax.grad(lambda x: seen.append(v.is_concrete(x)) or x)(1.0)
    assert seen == [False, False, False]


# ------------------------------------------------------------------ numbers


@pytest.mark.parametrize("value", [0.0, 1, -3.5, np.float32(2), np.int64(4),
                                   jnp.float32(0.1), np.array([1.0, 2.0]),
                                   jnp.arange(3)])
def test_check_number_accepts_finite_numbers(value):
    v.check_number("arg", value)


@pytest.mark.parametrize("value, kw", [
    (NAN, {}), (INF, {}), (-INF, {}), (np.array([1.0, NAN]), {}),
    (-0.1, {"lo": 0.0}), (0.0, {"lo": 0.0, "lo_open": True}),
    (2.0, {"hi": 1.0}), (1.0, {"hi": 1.0, "hi_open": True}),
    (np.ones(2), {"scalar": True}),
])
def test_check_number_refuses_out_of_range(value, kw):
    msg = _refused(lambda: v.check_number("arg", value, **kw))
    assert "must be" in msg and "got" in msg


@pytest.mark.parametrize("value", WRONG_TYPES + [1j, np.array([True])])
def test_check_number_refuses_wrong_types(value):
    _refused(lambda: v.check_number("arg", value))


def test_check_number_interval_in_message():
    assert "[0.0, 1.0)" in _refused(
        lambda: v.check_number("lr", 5.0, lo=0.0, hi=1.0, hi_open=True), "lr")
    assert "(0.0, inf)" in _refused(
        lambda: v.check_number("lr", -1.0, lo=0.0, lo_open=True), "lr")


@pytest.mark.parametrize("value", [1e-9, 3, np.float64(2.5), np.array([0.1, 4.0]),
                                   jnp.ones(2)])
def test_check_positive_accepts(value):
    v.check_positive("arg", value)


@pytest.mark.parametrize("value", [0.0, -1.0, NAN, INF, np.array([1.0, 0.0])]
                         + WRONG_TYPES)
def test_check_positive_refuses(value):
    _refused(lambda: v.check_positive("arg", value))


def test_check_positive_integer():
    v.check_positive("n", 3, integer=True)
    for bad in (0, -2, 2.0, True, "3", None):
        _refused(lambda: v.check_positive("n", bad, integer=True), "n")


@pytest.mark.parametrize("value", [0.0, 0, 2.5, np.zeros(3), jnp.float32(1.0)])
def test_check_nonnegative_accepts(value):
    v.check_nonnegative("arg", value)


@pytest.mark.parametrize("value", [-1e-9, -1, NAN, INF, np.array([0.0, -1.0])]
                         + WRONG_TYPES)
def test_check_nonnegative_refuses(value):
    _refused(lambda: v.check_nonnegative("arg", value))


@pytest.mark.parametrize("value", [1.0, 0.5, 1e-12, np.float32(0.25), 1])
def test_check_probability_accepts(value):
    v.check_probability("arg", value)


@pytest.mark.parametrize("value", [0.0, -0.1, 1.5, NAN, INF, np.array([0.5])]
                         + WRONG_TYPES)
def test_check_probability_refuses(value):
    _refused(lambda: v.check_probability("arg", value))


@pytest.mark.parametrize("value", [1.0, 1e-9, INF, np.array([0.5, INF]), 3])
def test_check_clip_accepts(value):
    v.check_clip("arg", value)


@pytest.mark.parametrize("value", [0.0, -1.0, NAN, -INF, np.array([1.0, 0.0])]
                         + WRONG_TYPES)
def test_check_clip_refuses(value):
    _refused(lambda: v.check_clip("arg", value))


def test_check_probability_allow_zero():
    v.check_probability("q", 0.0, allow_zero=True)
    assert "[0, 1]" in _refused(
        lambda: v.check_probability("q", -0.1, allow_zero=True), "q")
    assert "(0, 1]" in _refused(lambda: v.check_probability("q", 0.0), "q")


@pytest.mark.parametrize("check, kw", [
    (v.check_number, {"lo": 0.0, "lo_open": True}), (v.check_positive, {}),
    (v.check_nonnegative, {}), (v.check_probability, {}),
])
def test_numeric_checks_skip_traced_values(check, kw):
    # -1 would be refused; traced it passes (hyperparameters may be swept)
    out = _under_jit(check, **kw)(jnp.float32(-1.0))
    assert float(out) == -2.0
    jax.vmap(lambda x: check("arg", x, **kw))(jnp.array([-1.0, 2.0]))
    jax.grad(lambda x: check("arg", x, **kw) or x * x)(-1.0)


# ------------------------------------------------------------------ integers


@pytest.mark.parametrize("value", [0, 5, np.int32(3), np.uint8(7), np.array(4),
                                   jnp.int32(2)])
def test_check_int_accepts_and_returns_int(value):
    out = v.check_int("arg", value, lo=0)
    assert type(out) is int and out == int(value)


@pytest.mark.parametrize("value, kw", [
    (-1, {"lo": 0}), (11, {"hi": 10}), (0, {"lo": 1, "hi": 3}), (4, {"lo": 1, "hi": 3}),
    (2.0, {}), (NAN, {}), (INF, {}), (np.float32(1), {}), (np.array([1, 2]), {}),
    ("3", {}), (b"3", {}), (None, {}), (True, {}), (False, {}), (np.True_, {}),
])
def test_check_int_refuses(value, kw):
    msg = _refused(lambda: v.check_int("arg", value, **kw))
    assert "integer" in msg


def test_check_int_messages_and_none():
    assert ">= 1" in _refused(lambda: v.check_int("k", 0, lo=1), "k")
    assert "in [1, 3]" in _refused(lambda: v.check_int("k", 9, lo=1, hi=3), "k")
    assert "<= 3" in _refused(lambda: v.check_int("k", 9, hi=3), "k")
    assert v.check_int("k", None, allow_none=True) is None
    assert "(or None)" in _refused(lambda: v.check_int("k", -1, lo=0,
                                                       allow_none=True), "k")
    _refused(lambda: v.check_int("k", None), "k")


def test_check_int_refuses_traced_values_with_a_clear_message():
    # counts set loop lengths and shapes: a traced count cannot be used
    with pytest.raises(ValueError, match="arg: must be a static integer.*traced"):
        _under_jit(v.check_int, lo=0)(jnp.int32(3))


def test_check_count():
    assert v.check_count("rounds", 0) == 0 and v.check_count("rounds", 7) == 7
    for bad in (-1, 1.5, "2", None, True, NAN):
        msg = _refused(lambda: v.check_count("rounds", bad), "rounds")
        assert "integer >= 0" in msg


# ------------------------------------------------------------------- choices


def test_check_choice():
    v.check_choice("psi", "l2", ("l2", "l1"))
    v.check_choice("n", 2, [1, 2])
    v.check_choice("k", "a", {"a": 1, "b": 2})  # a mapping's keys
    for bad in ("L2", "", None, 3, ["l2"], np.array(["l2", "l1"]), True):
        msg = _refused(lambda: v.check_choice("psi", bad, ("l2", "l1", 1)), "psi")
        assert "must be one of ('l2', 'l1', 1)" in msg


def test_check_choice_bool_is_not_an_integer_choice():
    _refused(lambda: v.check_choice("n", True, (1, 2)), "n")
    v.check_choice("flag", True, (True, False))


def test_check_choice_under_jit():
    # choices are static (Python) values: a traced value is never one of them
    out = jax.jit(lambda x: (v.check_choice("m", "irls", ("irls",)), x)[1])(1.0)
    assert float(out) == 1.0


# --------------------------------------------------------------------- masks


@pytest.mark.parametrize("mask", [
    np.array([True, False, True]), [1, 0, 1], np.array([1.0, 0.0, 1.0], np.float32),
    jnp.array([0, 1, 1]), (True, True, False),
])
def test_check_mask_accepts(mask):
    out = v.check_mask("eval_mask", mask, 3)
    assert out.dtype == bool and out.shape == (3,)
    np.testing.assert_array_equal(out, np.asarray(mask) > 0)


@pytest.mark.parametrize("mask", [
    np.ones(4, bool), np.ones((3, 1), bool), np.ones(2), [0, 1, 2], [0.5, 1.0, 0.0],
    [NAN, 1.0, 0.0], ["a", "b", "c"], None, True, "abc", 3,
])
def test_check_mask_refuses(mask):
    msg = _refused(lambda: v.check_mask("eval_mask", mask, 3), "eval_mask")
    assert "mask" in msg or "shape" in msg


def test_check_mask_traced_checks_only_the_shape():
    f = jax.jit(lambda m: (v.check_mask("mask", m, 3), m.sum())[1])
    assert float(f(jnp.array([0.5, 1.0, 2.0]))) == 3.5
    with pytest.raises(ValueError, match=r"mask: must have shape \(4,\)"):
        jax.jit(lambda m: (v.check_mask("mask", m, 4), m)[1])(jnp.ones(3))


# --------------------------------------------------------------------- paths


def test_check_dir(tmp_path):
    f = tmp_path / "f.txt"
    f.write_text("x")
    v.check_dir("out", None)
    v.check_dir("out", tmp_path)  # exists, a folder
    v.check_dir("out", str(tmp_path / "new" / "deeper"))  # will be created
    msg = _refused(lambda: v.check_dir("out", f), "out")
    assert "must be a folder" in msg and "is a file" in msg
    msg = _refused(lambda: v.check_dir("out", f / "sub" / "dir"), "out")
    assert repr(str(f)) in msg
    for bad in (3, b"/tmp", "", ["a"]):
        _refused(lambda: v.check_dir("out", bad), "out")


def test_check_file(tmp_path):
    f = tmp_path / "h.jsonl"
    v.check_file("jsonl_path", None)
    v.check_file("jsonl_path", f)  # new file in an existing folder
    v.check_file("jsonl_path", tmp_path / "a" / "b.jsonl")  # folders made later
    f.write_text("{}\n")
    v.check_file("jsonl_path", str(f))  # an existing file is fine (appended)
    msg = _refused(lambda: v.check_file("jsonl_path", tmp_path), "jsonl_path")
    assert "is a folder" in msg
    msg = _refused(lambda: v.check_file("jsonl_path", f / "x.jsonl"), "jsonl_path")
    assert "is a file, not a folder" in msg
    for bad in (0, "", b"x"):
        _refused(lambda: v.check_file("jsonl_path", bad), "jsonl_path")


def test_module_imports_only_numpy_and_jax():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(v))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    assert roots <= {"__future__", "os", "collections", "numpy", "jax"}, roots
