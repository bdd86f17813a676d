"""A light agent install: ``pip install .[agent]`` into a clean venv brings the agent and
nothing of the collector, the simulator or the audit.

The package is built from a copy of the working tree (the files the Dockerfile copies, without
compiled artefacts), so the Cython build runs as it does on an agent host; pip's cache keeps
repeated runs short. Needs a compiler and a package index (PyPI, or pip's configured mirror).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Other roles' dependencies: on an agent host neither installed nor imported.
NOT_FOR_AGENTS = ("duckdb", "fastapi", "scipy", "matplotlib", "httpx", "uvicorn", "pyroute2")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _sources(dest: Path) -> Path:
    """The files a package build reads, copied to ``dest``: no .so, no generated .c."""
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    for top in sorted({d.split("/")[0] for d in package_dir.values()}):
        shutil.copytree(
            ROOT / top, dest / top, ignore=shutil.ignore_patterns("*.so", "*.c", "__pycache__")
        )
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    return dest


def _run(argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    assert r.returncode == 0, f"{argv}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def agent_venv() -> Iterator[Path]:
    tmp = Path(tempfile.mkdtemp(prefix="fleetlens-agent-install-"))
    try:
        venv = tmp / "venv"
        # No pip of its own (ensurepip took 5 s): this pip installs into it, with the venv's
        # interpreter (pip --python), build isolation and resolution as on an agent host.
        _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
        src = _sources(tmp / "src")
        _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
              "-q", f"{src}[agent]"], cwd=tmp, timeout=1500)  # fmt: skip
        yield venv
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_PROBE = """
import importlib.util, json, sys
from fleetlens.cli import main
import fleetlens.probe.agent
try:
    code = main(["agent", "--help"])
except SystemExit as e:
    code = e.code
heavy = {m.split(".")[0] for m in sys.modules} & set(sys.argv[1:])
installed = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None]
print(json.dumps({"code": code, "imported": sorted(heavy), "installed": installed}))
"""


def test_agent_imports_without_other_roles_dependencies(agent_venv: Path, tmp_path: Path) -> None:
    py = str(agent_venv / "bin" / "python")
    out = _run([py, "-c", _PROBE, *NOT_FOR_AGENTS], cwd=tmp_path).stdout
    seen = json.loads(out.splitlines()[-1])
    assert seen["code"] in (0, None), out
    assert seen["installed"] == [], seen  # pip brought none of them
    assert seen["imported"] == [], seen
    # The installed copy is the one imported, not the checkout.
    where = _run([py, "-c", "import fleetlens; print(fleetlens.__file__)"], cwd=tmp_path).stdout
    assert Path(where.strip()).is_relative_to(agent_venv), where


def test_fleetlens_agent_help_exits_0(agent_venv: Path, tmp_path: Path) -> None:
    r = _run([str(agent_venv / "bin" / "fleetlens"), "agent", "--help"], cwd=tmp_path)
    assert "--collector" in r.stdout


@pytest.mark.parametrize(
    "argv", [["lab", "--help"], ["collector", "--db", "x.duckdb", "--insecure-no-auth"]]
)
def test_another_roles_command_names_its_extra(
    agent_venv: Path, tmp_path: Path, argv: list[str]
) -> None:
    r = subprocess.run(
        [str(agent_venv / "bin" / "fleetlens"), *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert r.returncode == 2, r
    hint = f"which this install lacks: pip install 'fleetlens[{argv[0]}]'"
    assert hint in r.stderr and "Traceback" not in r.stderr, r.stderr
