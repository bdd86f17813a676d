"""``fleetlens lab`` arguments (parse level, no root): ``--name`` before or after the command."""

from __future__ import annotations

import pytest
from fleetlens.fixtures.lab import cli
from fleetlens.fixtures.lab.fabric import DEFAULT_NAME

# One invocation of every command, with its required arguments.
COMMANDS = [
    ["up", "--hosts", "2"],
    ["down"],
    ["status", "--json"],
    ["fault", "leaf1->spine0", "--loss", "5"],
    ["heal", "--all"],
    ["path", "h00/eth0", "h01/eth0", "--sport", "40001"],
    ["exec", "h00"],
    ["ping"],
]


@pytest.fixture(autouse=True)
def _no_lab_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETLENS_LAB", raising=False)


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0])
def test_name_is_accepted_before_and_after_the_command(argv: list[str]) -> None:
    cmd, *rest = argv
    assert cli._parser().parse_args(argv).name == DEFAULT_NAME
    assert cli._parser().parse_args(["--name", "lab2", *argv]).name == "lab2"
    assert cli._parser().parse_args([cmd, "--name", "lab2", *rest]).name == "lab2"
    if cmd != "exec":  # exec: what follows the host is the command to run
        assert cli._parser().parse_args([*argv, "--name", "lab2"]).name == "lab2"


def test_after_the_command_wins_and_the_environment_is_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert cli._parser().parse_args(["--name", "a", "status", "--name", "b"]).name == "b"
    monkeypatch.setenv("FLEETLENS_LAB", "envlab")
    assert cli._parser().parse_args(["status"]).name == "envlab"
    assert cli._parser().parse_args(["status", "--name", "b"]).name == "b"


def test_exec_leaves_the_commands_own_arguments_alone() -> None:
    a = cli._parser().parse_args(["exec", "--name", "lab2", "h03", "--", "tool", "--name", "x"])
    assert (a.name, a.host, a.argv) == ("lab2", "h03", ["tool", "--name", "x"])
    a = cli._parser().parse_args(["exec", "h03", "--", "tool", "--name", "x"])
    assert (a.name, a.argv) == (DEFAULT_NAME, ["tool", "--name", "x"])
