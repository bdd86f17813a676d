"""The layering contract (pyproject.toml, run by scripts/test.sh) catches what it promises.

Each case mirrors the installed package tree into a temporary directory, adds one module with
one import and runs lint-imports there: an import against the layering must be reported by
name, an import the layering allows must not be.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

pytestmark = pytest.mark.skipif(
    not LINT_IMPORTS.exists(), reason="import-linter not installed (pip install -e '.[dev]')"
)


def _lint_with(tmp_path: Path, module: str, line: str) -> str:
    """lint-imports' report on the package tree plus ``module`` holding ``line``."""
    tree = tmp_path / "tree"
    built = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "package_tree.py"), str(tree)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(built.stdout.strip()) == tree
    path = tree.joinpath(*module.split(".")).with_suffix(".py")
    assert path.parent.is_dir() and not path.exists(), path
    path.write_text(line + "\n")
    r = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Analyzed" in r.stdout, r.stdout + r.stderr  # it ran on the tree
    return r.stdout


@pytest.mark.parametrize(
    ("module", "imported"),
    [
        ("fleetlens.layering_case", "fleetlens.api.store"),  # the vocabulary imports a component
        ("fleetlens.layering_case", "fleetlens.probe.agent"),
        ("fleetlens.probe.layering_case", "fleetlens.sync.solver"),  # the agent imports an engine
        ("fleetlens.sync.layering_case", "fleetlens.triangulate.engine"),  # engines: independent
        ("fleetlens.triangulate.layering_case", "fleetlens.api.store"),  # an engine reaches up
        ("fleetlens.api.layering_case", "fleetlens.fixtures.sim.stream"),
        ("fleetlens.fixtures.layering_case", "fleetlens.demo"),  # nothing imports the apps
    ],
)
def test_an_import_against_the_layering_is_reported(
    tmp_path: Path, module: str, imported: str
) -> None:
    report = _lint_with(tmp_path, module, f"import {imported}")
    assert f"{module} -> {imported} (l.1)" in report, report


@pytest.mark.parametrize(
    ("module", "imported"),
    [
        ("fleetlens.api.layering_case", "fleetlens.sync.solver"),
        ("fleetlens.fixtures.layering_case", "fleetlens.api.store"),
        ("fleetlens.probe.layering_case", "fleetlens.records"),
    ],
)
def test_an_import_the_layering_allows_is_not_reported(
    tmp_path: Path, module: str, imported: str
) -> None:
    report = _lint_with(tmp_path, module, f"import {imported}")
    assert module not in report, report


def test_the_tree_holds_every_packaged_component(tmp_path: Path) -> None:
    report = _lint_with(tmp_path, "fleetlens.layering_case", "")
    files = int(report.split("Analyzed ")[1].split()[0])
    components = ("fleetlens", "probe", "sync", "triangulate", "api", "fixtures")
    sources = [p for d in components for p in (ROOT / d).rglob("*.py")]
    # One more: the case module. Fewer: a package missing from [tool.setuptools] packages.
    assert files == len(sources) + 1, (files, len(sources))
