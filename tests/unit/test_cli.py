from __future__ import annotations

import subprocess
import sys

import pytest

from fleetlens.cli import SUBCOMMANDS


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetlens.cli", *args], capture_output=True, text=True
    )


def test_help_lists_every_command_with_one_line() -> None:
    out = _run("--help").stdout
    for name, (_, text) in SUBCOMMANDS.items():
        assert f"  {name:<10} {text}" in out


def test_subcommand_help_and_unknown_command() -> None:
    lab = _run("lab", "--help")
    assert lab.returncode == 0 and "fault" in lab.stdout and "path" in lab.stdout
    bad = _run("nonsense")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


@pytest.mark.parametrize(
    "argv", [[name, "--help"] for name in SUBCOMMANDS] + [["demo", "--sim", "--help"]]
)
def test_every_command_prints_its_help(argv: list[str]) -> None:
    out = _run(*argv)
    assert out.returncode == 0 and "usage:" in out.stdout, out.stderr
