"""The README's API example runs (on a smaller problem)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_readme_api_example_runs(capsys):
    text = (ROOT / "README.md").read_text()
    code = re.search(r"## API in ten lines\s+```python\n(.*?)```", text, re.S).group(1)
    small = (code.replace("num_clients=100, max_size=1000", "num_clients=12, max_size=80")
             .replace("num_rounds=200, eval_every=50", "num_rounds=4, eval_every=2")
             .replace("num_rounds=100", "num_rounds=3"))
    assert small != code
    exec(compile(small, "README.md", "exec"), {})
    printed = capsys.readouterr().out.split("\n")
    assert len([line for line in printed if line.strip()]) == 2
