"""The README's API example runs as written (shortened to one simulated second)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parents[2] / "fixtures" / "sim" / "README.md"


def test_readme_api_example_runs() -> None:
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert code, "README lost its Python example"
    src = re.sub(r"sim\.(run|stream)\(10\)", r"sim.\1(1)", code.group(1))
    exec(compile(src, str(README), "exec"), {})
