"""Studies (a preset over a grid and seeds, resumable as a whole), their report
(mean +- std and a 95 % t interval across seeds), config files, presets of
one's own, inert settings and the command line's one-line stop."""

import csv
import json
import math
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from fedjax_pfl import experiments
from fedjax_pfl.experiments import _study
from fedjax_pfl.experiments._cli import main

TINY = {"clients": 12, "max_size": 60, "rounds": 2, "eval_every": 2,
        "local_steps": 2, "batch_size": 5, "cohort_size": 4}
ACC = "global/test/accuracy/mean"


@pytest.mark.parametrize("text,seeds", [
    ("0-4", [0, 1, 2, 3, 4]), ("0,3,7", [0, 3, 7]), ("2", [2]),
    ("0-1,5", [0, 1, 5]), ([1, 2], [1, 2]),
])
def test_parse_seeds(text, seeds):
    assert experiments.parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "a-b", "3-1", "-1", "0,0", [0, -2], [True]])
def test_parse_seeds_refuses(text):
    with pytest.raises(ValueError, match="seeds"):
        experiments.parse_seeds(text)


def test_across_seeds():
    got = experiments.across_seeds([0.5, 0.7, 0.6])
    half = 4.30265273 * 0.1 / math.sqrt(3)  # t(0.975, 2) * std / sqrt(n)
    assert got["n"] == 3 and got["mean"] == pytest.approx(0.6)
    assert got["std"] == pytest.approx(0.1)
    assert got["ci_low"] == pytest.approx(0.6 - half, rel=1e-6)
    assert got["ci_high"] == pytest.approx(0.6 + half, rel=1e-6)
    one = experiments.across_seeds([0.5])
    assert one["mean"] == 0.5 and math.isnan(one["std"]) and math.isnan(one["ci_low"])
    with pytest.raises(ValueError, match="values: one number per seed"):
        experiments.across_seeds([[0.5]])


def test_grid_values_split_on_commas_except_free_text():
    assert _study.split_grid("ditto-synthetic", {"method": "ditto,global",
                                                 "lam": "0.1, 1"}) == {
        "method": ["ditto", "global"], "lam": ["0.1", "1"]}
    assert _study.split_grid("lindt-table3", {"hidden": "128,64"}) == {
        "hidden": ["128,64"]}


def test_inert_combinations_collapse_and_bad_ones_fail_first():
    runs = _study.expand("ditto-synthetic", {"method": ["ditto", "term"],
                                             "term_t": [0.5, 1.0]}, [0, 1])
    assert [(r["setting"], r["seed"]) for r in runs] == [
        ("method=ditto", 0), ("method=ditto", 1),
        ("method=term,term_t=0.5", 0), ("method=term,term_t=0.5", 1),
        ("method=term,term_t=1.0", 0), ("method=term,term_t=1.0", 1)]
    assert runs[0]["overrides"] == {"method": "ditto"}
    with pytest.raises(ValueError, match="ratio: attack=A1 needs"):
        _study.expand("ditto-synthetic", {"attack": ["A1"], "ratio": [0.0, 0.5]},
                      [0])
    with pytest.raises(ValueError, match="vary the seed with seeds"):
        _study.expand("ditto-synthetic", {"seed": [0, 1]}, [0])


@pytest.mark.parametrize("sets,match", [
    ({"attack": "A1"}, "ratio: attack=A1 needs the fraction of malicious"),
    ({"ratio": "0.3"}, "ratio: 0.3 has no effect without an attack"),
    ({"term_t": "2"}, "term_t: has no effect unless method is term"),
    ({"method": "global", "lam": "0.5"}, "lam: has no effect unless method is ditto"),
    ({"fedmgda_eps": "0.2"}, "fedmgda_eps: has no effect unless aggregator is"),
])
def test_inert_or_contradictory_settings_are_refused_before_work(
        tmp_path, sets, match):
    with pytest.raises(ValueError, match=match):
        experiments.run_preset("ditto-synthetic", sets, out=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def final_rows(out):
    study = json.loads((out / "study.json").read_text())
    rows = {}
    for r in study["runs"]:
        lines = (out / r["dir"] / "history.jsonl").read_text().splitlines()
        rows[r["dir"]] = {k: v for k, v in json.loads(lines[-1]).items()
                          if k != "seconds"}
    return rows


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("study") / "s"
    res = experiments.run_study("ditto-synthetic", {**TINY, "method":
                                                    ["ditto", "global"]},
                                seeds=[0, 1], out=out, progress=False)
    return out, res


def test_a_study_runs_every_setting_and_seed_and_reports(study):
    out, res = study
    dirs = [r["dir"] for r in res["runs"]]
    assert dirs == ["method=ditto/seed0", "method=ditto/seed1",
                    "method=global/seed0", "method=global/seed1"]
    finals = final_rows(out)
    row = next(r for r in res["report"]["rows"]
               if r["setting"] == "method=ditto" and r["metric"] == ACC)
    vals = [finals[f"method=ditto/seed{s}"][ACC] for s in (0, 1)]
    assert vals[0] != vals[1]  # the seeds differ
    mean, std = sum(vals) / 2, abs(vals[0] - vals[1]) / math.sqrt(2)
    assert row["n"] == 2 and row["seeds"] == [0, 1]
    assert row["mean"] == pytest.approx(mean) and row["std"] == pytest.approx(std)
    half = 12.7062047 * std / math.sqrt(2)  # t(0.975, 1 degree of freedom)
    assert row["ci_low"] == pytest.approx(mean - half, rel=1e-6)
    assert row["ci_high"] == pytest.approx(mean + half, rel=1e-6)
    with open(out / "report.csv") as fh:
        table = list(csv.DictReader(fh))
    assert {(r["setting"], r["metric"]) for r in table} >= {
        ("method=ditto", ACC), ("method=global", ACC),
        ("method=ditto", "personal/test/accuracy/mean")}
    assert "| method=ditto | global/test/accuracy/mean | 2 |" in (
        out / "report.md").read_text()
    assert (out / "report.png").stat().st_size > 0
    assert (out / "report.pdf").read_bytes()[:4] == b"%PDF"
    # the same report from the run directories themselves
    again = experiments.study_report([out / d for d in dirs])
    assert again["rows"] == res["report"]["rows"]


@pytest.mark.slow  # 12 tiny runs; keeps the default suite near its 10 minutes
def test_an_interrupted_study_resumes_as_a_whole(tmp_path, study):
    ref_out, _ = study
    out = tmp_path / "s"
    grid = {**TINY, "rounds": 4, "method": ["ditto", "global"]}

    def signal_in_third_run(run):
        if run["dir"] != "method=global/seed0":
            return None

        def cb(state, row):
            if row["round"] == 2:
                os.kill(os.getpid(), signal.SIGINT)
        return cb

    import fedjax_pfl as fp
    with pytest.raises(fp.Interrupted):
        experiments.run_study("ditto-synthetic", grid, seeds=[0, 1], out=out,
                              progress=False, callback=signal_in_third_run)
    status = {r["dir"]: r["done"] for r in
              json.loads((out / "study.json").read_text())["runs"]}
    assert status == {"method=ditto/seed0": True, "method=ditto/seed1": True,
                      "method=global/seed0": False, "method=global/seed1": False}
    with pytest.raises(ValueError, match="already holds a study"):
        experiments.run_study("ditto-synthetic", grid, seeds=[0, 1], out=out,
                              progress=False)
    with pytest.raises(ValueError, match="holds another study"):
        experiments.run_study("ditto-synthetic", grid, seeds=[0, 2], out=out,
                              resume=True, progress=False)
    experiments.run_study("ditto-synthetic", grid, seeds=[0, 1], out=out,
                          resume=True, progress=False)
    whole = tmp_path / "whole"
    experiments.run_study("ditto-synthetic", grid, seeds=[0, 1], out=whole,
                          progress=False)
    assert final_rows(out) == final_rows(whole)


def test_config_files_toml_and_yaml_with_overrides(tmp_path, capsys):
    toml = tmp_path / "study.toml"
    toml.write_text(textwrap.dedent(f"""
        preset = "ditto-synthetic"
        seeds = "0-1"
        out = "{tmp_path / 'from-toml'}"
        [set]
        clients = 12
        max_size = 60
        rounds = 2
        eval_every = 2
        local_steps = 2
        batch_size = 5
        cohort_size = 4
        method = ["ditto", "global"]
        """))
    yaml = tmp_path / "run.yaml"
    yaml.write_text(textwrap.dedent("""
        preset: ditto-synthetic
        set: {clients: 12, max_size: 60, rounds: 2, eval_every: 2, local_steps: 2,
              batch_size: 5, cohort_size: 4, lam: 0.5}
        """))
    assert experiments.load_config(toml)["set"]["method"] == ["ditto", "global"]
    # --set replaces the file's values of a key: one setting, still two seeds
    assert main(["run", "--config", str(toml), "--set", "method=global",
                 "--quiet"]) == 0
    study = json.loads((tmp_path / "from-toml" / "study.json").read_text())
    assert [r["dir"] for r in study["runs"]] == ["default/seed0", "default/seed1"]
    assert study["grid"]["method"] == ["global"]
    with pytest.raises(SystemExit, match="seeds: give them with --seeds"):
        main(["run", "--config", str(toml), "--set", "seed=3,4", "--quiet"])
    # --set seed=a,b is --seeds a,b
    out = tmp_path / "seeds-by-set"
    assert main(["run", "--config", str(yaml), "--set", "seed=3,4", "--out",
                 str(out), "--quiet"]) == 0
    study = json.loads((out / "study.json").read_text())
    assert study["seeds"] == [3, 4] and "seed" not in study["grid"]
    out = tmp_path / "from-yaml"
    assert main(["run", "--config", str(yaml), "--out", str(out), "--quiet"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["config"]["lam"] == 0.5 and cfg["config"]["clients"] == 12
    for k in ("fedjax_pfl", "git_commit", "jax", "backend", "python"):
        assert k in cfg
    assert "round 2 |" in capsys.readouterr().err  # one log line per evaluation


@pytest.mark.parametrize("text,name,match", [
    ("preset = 1\nbogus = 2\n", "a.toml", r"unknown entries \['bogus'\]"),
    ("preset = \n", "b.toml", "cannot be read"),
    ("set: [1, 2]\n", "c.yaml", "`set` must be a table"),
    ("x = 1\n", "d.json", "must end in .toml"),
    ("[set]\nlam = [[1]]\n", "e.toml", "set.lam must be a value or a list"),
])
def test_bad_config_files_are_refused(tmp_path, text, name, match):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        experiments.load_config(path)


PRESET_FILE = textwrap.dedent("""
    from fedjax_pfl import algorithms, data, experiments, models

    def build(cfg):
        fed = data.fedprox_synthetic(1.0, 1.0, num_clients=8, max_size=40,
                                     seed=cfg["seed"])
        alg = algorithms.fedavg(models.logistic_regression((60,), 10),
                                client_lr=cfg["lr"], num_local_steps=2,
                                batch_size=4, cohort_size=3)
        return experiments.Experiment(alg, fed)

    experiments.register_preset(experiments.Preset(
        "my-fedavg", "my own", "FedAvg on synthetic data", "",
        {**experiments.run_keys(2, 2), "lr": experiments.Key(0.1, "lr", low=0.0)},
        build), replace=True)
    """)


def test_a_preset_of_ones_own_from_a_file(tmp_path, capsys, monkeypatch):
    path = tmp_path / "mine.py"
    path.write_text(PRESET_FILE)
    assert main(["list", "my-fedavg", "--preset-file", str(path)]) == 0
    assert "lr = 0.1" in capsys.readouterr().out
    monkeypatch.setenv("FEDJAX_PFL_PRESETS", str(path))
    assert main(["run", "my-fedavg", "--set", "lr=0.2", "--out",
                 str(tmp_path / "r"), "--quiet", "--checkpoint-every", "0"]) == 0
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert cfg["preset"] == "my-fedavg" and cfg["config"]["lr"] == 0.2
    assert not (tmp_path / "r" / "checkpoints").exists()
    with pytest.raises(ValueError, match="built-in preset"):
        experiments.register_preset(experiments.get_preset("ditto-synthetic"))
    with pytest.raises(ValueError, match="lacks"):
        experiments.register_preset(experiments.Preset(
            "x", "", "", "", {}, lambda cfg: None))


def test_run_files_have_the_permissions_of_plain_files(study):
    out, _ = study
    mask = os.umask(0)
    os.umask(mask)
    run = out / "method=ditto" / "seed0"
    for path in (out / "study.json", out / "report.md", run / "config.json",
                 run / "clients.csv", run / "history.jsonl"):
        assert path.stat().st_mode & 0o777 == 0o666 & ~mask, path


def test_version(capsys):
    import fedjax_pfl

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"fedjax-pfl {fedjax_pfl.__version__}"


def test_resume_without_checkpoints_is_refused(tmp_path):
    sets = {**TINY, "checkpoint_every": 0}
    experiments.run_preset("ditto-synthetic", sets, out=tmp_path / "r",
                           progress=False)
    with pytest.raises(ValueError, match="resume: the run writes no checkpoints"):
        experiments.run_preset("ditto-synthetic", sets, out=tmp_path / "r",
                               resume=True, progress=False)


@pytest.mark.slow  # ~20 s, a CLI subprocess (test_interrupt.py covers the driver)
def test_ctrl_c_on_the_command_line_stops_with_one_line(tmp_path):
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "fedjax_pfl.experiments._cli", "run",
           "ditto-synthetic", "--out", str(out), "--quiet",
           *[f"--set={k}={v}" for k, v in {**TINY, "rounds": 400}.items()]]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    for line in proc.stderr:  # the first evaluation's log line
        if line.startswith("round 2 |"):
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("fedjax-pfl run: stopped by SIGINT at round ")
    assert last.endswith(f"; continue with --resume (the run in {out})")
    stopped = int(last.split("at round ")[1].split(";")[0])
    rows = [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]
    assert rows[-1]["round"] == stopped < 400
    assert main(["run", "ditto-synthetic", "--out", str(out), "--quiet",
                 "--resume", *[f"--set={k}={v}" for k, v in
                               {**TINY, "rounds": 400}.items()]]) == 0
    rows = [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == list(range(0, 401, 2))


def test_config_files_out_holds_the_log(tmp_path, monkeypatch):
    # the log goes to the run directory the config file names, not runs/<preset>
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "one.yaml"
    cfg.write_text(textwrap.dedent(f"""
        preset: ditto-synthetic
        out: {tmp_path / 'cfg-out'}
        set: {{clients: 12, max_size: 60, rounds: 2, eval_every: 2, local_steps: 2,
              batch_size: 5, cohort_size: 4}}
        """))
    assert main(["run", "--config", str(cfg)]) == 0
    log = (tmp_path / "cfg-out" / "log.txt").read_text()
    assert "round 2 |" in log
    assert not (tmp_path / "runs").exists()
