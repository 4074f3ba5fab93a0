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
