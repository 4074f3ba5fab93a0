"""benchmarks/xla_cpu_flags.runs: one records file holds several invocations
(appended with --out); the report splits them by their ``run`` field, and
records from before it existed where a (benchmark, setting) pair whose summary
was already written comes again."""

import pytest
from helpers import load_benchmark

xf = load_benchmark("xla_cpu_flags")


def _invocation(settings, benches=("privacy", "throughput")):
    recs = []
    for b in benches:
        for s in settings:
            recs += [{"bench": b, "setting": s, "model": "cnn", "clients": 10,
                      "variant": v, "step_s": 1.0, "round_s": 1.0}
                     for v in ("plain", "ghost")]
            recs.append({"bench": b, "setting": s, "user_s": 1.0, "system_s": 0.5,
                         "minor_faults": 10})  # the summary
    return recs


def test_runs_split_where_an_invocation_starts_again():
    first = _invocation(["xla", "package"])  # records without a run field
    second = _invocation(["xla", "package", "no_conv"])
    third = [dict(r, run="T3") for r in _invocation(["xla"], benches=("fedfdp",))]
    fourth = [dict(r, run="T4") for r in _invocation(["xla"], benches=("fedfdp",))]
    assert xf.runs(first + second + third + fourth) == [first, second, third, fourth]
    assert xf.runs(first) == [first] and xf.runs([]) == []


def test_report_one_section_per_run(tmp_path):
    path = str(tmp_path / "x.jsonl")
    meta = {"git_sha": "abc", "date": "2026-11-29T10:00:00"}
    recs = [dict(r, **meta) for r in
            _invocation(["xla", "package"]) + _invocation(["xla", "no_conv"])]
    xf.write_jsonl(path, recs)
    text = xf.report([path])
    assert text.count("Run ") == 2 and "Run 2: git abc," in text
    assert "| XLA defaults s | no_conv s (speedup) |" in text
    assert "| privacy | cnn | 10 | ghost | 1.0000 | 1.0000 (**1.00x**) |" in text


def test_cycles_give_median_and_range(tmp_path):
    path = str(tmp_path / "x.jsonl")
    recs = []
    for cycle, (xla_s, pkg_s) in enumerate([(3.0, 1.0), (5.0, 2.0), (4.0, 9.0)]):
        for setting, sec in (("xla", xla_s), ("package", pkg_s)):
            recs += [{"bench": "throughput", "setting": setting, "model": "cnn",
                      "clients": 100, "variant": "map:1", "round_s": sec,
                      "run": "T", "cycle": cycle, "git_sha": "abc",
                      "date": "2026-11-29T11:00:00"},
                     {"bench": "throughput", "setting": setting, "run": "T",
                      "cycle": cycle, "user_s": 1.0, "system_s": 0.1,
                      "minor_faults": 1, "git_sha": "abc",
                      "date": "2026-11-29T11:00:00"}]
    xf.write_jsonl(path, recs)
    text = xf.report([path])
    assert text.count("Run ") == 1  # three cycles of one invocation
    assert "XLA defaults s (median of 3 cycles: min-max)" in text
    # medians 4 and 2: speedup 2.00x
    assert ("| throughput | cnn | 100 | map:1 | 4.0000: 3.0000-5.0000 | "
            "2.0000: 1.0000-9.0000 (**2.00x**) |") in text


def test_cycles_must_be_positive():
    with pytest.raises(SystemExit):
        xf.main(["--cycles", "0"])
