"""Mirror the installed package layout as a tree of symlinks, for the static checkers.

The components install as subpackages of ``fleetlens`` through setuptools' ``package-dir``
mapping (``api/`` becomes ``fleetlens.api``). The editable install resolves that mapping with an
import hook, which mypy and grimp (import-linter) do not run: they look for ``fleetlens/api/``
on disk. This builds that directory tree from pyproject.toml (each listed package's source
files, linked, so the checkers read the working tree) and prints its root; put it first on
MYPYPATH / PYTHONPATH. Only listed packages are mirrored, as a non-editable install ships them.

    python scripts/package_tree.py [DEST]      # default: build/package-tree
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_SUFFIXES = (".py", ".pyi")


def source_dir(package: str, package_dir: dict[str, str]) -> Path:
    """Where ``package``'s files live: the longest mapped prefix, then the remaining names."""
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        mapped = package_dir.get(".".join(parts[:cut]))
        if mapped is not None:
            return ROOT.joinpath(mapped, *parts[cut:])
    return ROOT.joinpath(*parts)


def build(dest: Path) -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    if dest.exists():
        shutil.rmtree(dest)
    for package in config["packages"]:
        src = source_dir(package, config.get("package-dir", {}))
        out = dest.joinpath(*package.split("."))
        out.mkdir(parents=True, exist_ok=True)
        for f in sorted(src.iterdir()):
            if f.is_file() and f.suffix in SOURCE_SUFFIXES:
                (out / f.name).symlink_to(f)


def main(argv: list[str]) -> int:
    dest = Path(argv[0]) if argv else ROOT / "build" / "package-tree"
    build(dest.resolve())
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
