"""Static tools follow `shoal.*` imports to the files (docs/ARCHITECTURE.md,
"Code layout"): the editable install names .build/import in a .pth file, and
.build/import/shoal/<package> is each of pyproject's package folders."""

from __future__ import annotations

import site
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _packages() -> dict[str, str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {
        name.removeprefix("shoal."): folder
        for name, folder in mapping.items()
        if name.startswith("shoal.") and name.count(".") == 1
    }


def test_the_install_names_the_link_tree_in_a_pth_file() -> None:
    found = [
        Path(directory) / "shoal_import_links.pth"
        for directory in [*site.getsitepackages(), site.getusersitepackages()]
        if (Path(directory) / "shoal_import_links.pth").exists()
    ]
    assert found, f"no shoal_import_links.pth in {sys.prefix}'s site-packages"
    entry = Path(found[0].read_text().strip())
    assert entry == ROOT / ".build" / "import"
    assert str(entry) in sys.path


def test_every_package_resolves_to_its_folder() -> None:
    packages = _packages()
    assert {"broker", "workers", "shm", "store"} <= packages.keys()
    for package, folder in packages.items():
        link = ROOT / ".build" / "import" / "shoal" / package
        assert link.resolve() == (ROOT / folder).resolve(), package
        assert (link / "__init__.py").exists()


def test_mypy_reads_the_same_tree() -> None:
    with open(ROOT / "pyproject.toml", "rb") as f:
        assert tomllib.load(f)["tool"]["mypy"]["mypy_path"] == ".build/import"
