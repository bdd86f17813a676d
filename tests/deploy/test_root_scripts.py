"""scripts/root.sh, sourced by main.sh, setup.sh and test.sh: run as root, or again through
sudo, or stop with a clear message when there is no sudo (a fresh Debian machine)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IS_ROOT = os.geteuid() == 0
NOBODY = 65534
# What root.sh and the caller below run; a PATH of only these has no sudo.
TOOLS = ("bash", "env", "id", "basename", "dirname")


@pytest.fixture
def box() -> Iterator[Path]:
    """A directory another user can read: the caller script, root.sh and a tool PATH."""
    d = Path(tempfile.mkdtemp(prefix="fleetlens-root-"))
    try:
        d.chmod(0o755)
        shutil.copy(ROOT / "scripts" / "root.sh", d / "root.sh")
        (d / "caller.sh").write_text(
            "#!/usr/bin/env bash\nset -euo pipefail\n"
            'source "$(dirname "$0")/root.sh"\necho "ran as $(id -u): $*"\n'
        )
        tools = d / "bin"
        tools.mkdir()
        for tool in TOOLS:
            found = shutil.which(tool)
            assert found, tool
            (tools / tool).symlink_to(found)
        for f in d.rglob("*"):
            if not f.is_symlink():
                f.chmod(0o755)
        yield d
    finally:
        shutil.rmtree(d)


def _as_user(
    box: Path, path: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the caller as a non-root user: this one, or nobody when the tests run as root."""
    setpriv = shutil.which("setpriv")
    if IS_ROOT and setpriv is None:
        pytest.skip("needs setpriv (util-linux) to run as another user")
    drop = [str(setpriv), f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    argv = [
        *(drop if IS_ROOT else []),
        str(box / "bin" / "bash"),
        str(box / "caller.sh"),
        "a b",
        "c",
    ]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=30, cwd=box, env={"PATH": path, **(env or {})}
    )


@pytest.mark.skipif(not IS_ROOT, reason="runs the caller as root")
def test_as_root_the_script_just_runs(box: Path) -> None:
    r = subprocess.run(
        ["bash", str(box / "caller.sh"), "a b", "c"], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0 and r.stdout == "ran as 0: a b c\n", r


def test_without_root_and_without_sudo_it_says_run_it_as_root(box: Path) -> None:
    r = _as_user(box, str(box / "bin"))
    assert r.returncode == 1, r
    assert r.stdout == ""  # the script body never ran
    assert (
        r.stderr == "caller.sh: needs root (network namespaces, Debian packages): run it as root\n"
    )


def test_without_root_it_runs_again_through_sudo_with_its_arguments(box: Path) -> None:
    fake = box / "sudo-bin"
    fake.mkdir(mode=0o755)
    (fake / "sudo").write_text('#!/bin/sh\nprintf "<%s>" "$@"\n')
    (fake / "sudo").chmod(0o755)
    r = _as_user(box, f"{fake}:{box / 'bin'}", {"PYTHON": "/opt/py 3/python"})
    assert r.returncode == 0, r
    caller = str(box / "caller.sh")
    assert r.stdout == f"<--><env><PYTHON=/opt/py 3/python><bash><{caller}><a b><c>", r.stdout
    plain = _as_user(box, f"{fake}:{box / 'bin'}")
    assert plain.stdout == f"<--><env><bash><{caller}><a b><c>", plain.stdout
