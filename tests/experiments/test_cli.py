"""The fedjax-pfl console command."""

import json

import pytest

from fedjax_pfl.experiments._cli import main


def test_demo_prints_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "final.json"
    rc = main(["--num-clients", "6", "--num-rounds", "2", "--eval-every", "1",
               "--cohort-size", "3", "--num-local-steps", "2", "--max-size", "60",
               "--finetune-steps", "2", "--quiet", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    for name in ("global", "local", "finetuned", "ditto", "worst10", "benign"):
        assert name in text
    final = json.loads(out.read_text())
    assert final["ditto"]["round"] == 2 and final["data"]["malicious"] == 3
    assert 0.0 <= final["local"]["personal/test/accuracy/mean"] <= 1.0
    assert 0.0 <= final["ditto"]["personal/test/accuracy/std"] <= 0.5


def test_demo_rejects_bad_values():
    with pytest.raises(SystemExit, match="cohort-size"):
        main(["--num-clients", "3", "--cohort-size", "5"])
    with pytest.raises(SystemExit, match="num-rounds"):
        main(["--num-rounds", "0"])
    with pytest.raises(SystemExit, match="attack"):
        main(["--attack", "A9"])
    with pytest.raises(SystemExit, match="ratio"):
        main(["--ratio", "1.0"])


@pytest.mark.parametrize("argv, match", [
    (["--lam", "nan"], "--lam: must be non-negative and finite"),
    (["--client-lr", "0"], "--client-lr: must be positive"),
    (["--alpha", "-1"], "--alpha: must be non-negative"),
    (["--finetune-steps", "-1"], "--finetune-steps: must be an integer >= 0"),
    (["--max-size", "0"], "--max-size: must be an integer >= 1"),
    (["--num-clients", "10", "--ratio", "0.05"],
     "--ratio: 0.05 of 10 clients makes no client malicious"),
    (["--json", "{tmp}"], "--json: .* is a folder"),
    (["--json", "{tmp}/file/final.json"], "--json: cannot write"),
])
def test_demo_fails_before_any_training(tmp_path, monkeypatch, argv, match):
    from fedjax_pfl.experiments import _demo

    def never(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(_demo, "simulate", never)
    (tmp_path / "file").write_text("x")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit, match=match):
        main([*argv, "--quiet"])


def test_demo_json_folder_is_created(tmp_path, capsys):
    out = tmp_path / "new" / "final.json"
    assert main(["--num-clients", "4", "--num-rounds", "1", "--cohort-size", "2",
                 "--num-local-steps", "1", "--max-size", "30", "--finetune-steps",
                 "1", "--quiet", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["ditto"]["round"] == 1


def test_datasets_listing(tmp_path, capsys):
    assert main(["datasets", "--data-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    for name in ("mnist", "fashion_mnist", "femnist", "cifar10", "vehicle",
                 "celeba", "shakespeare"):
        assert name in text
    assert "missing" in text and "obtain" in text


def test_datasets_listing_real_data(capsys):
    import os

    data_dir = os.environ.get("FEDJAX_PFL_DATA_DIR")
    if not data_dir:
        pytest.skip("FEDJAX_PFL_DATA_DIR is not set")
    assert main(["datasets", "--data-dir", data_dir]) == 0
    text = capsys.readouterr().out
    assert "41,202" in text  # FEMNIST train rows, verified by hash
    assert text.count(" ok ") >= 5
