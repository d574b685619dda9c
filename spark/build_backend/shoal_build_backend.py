"""The project's PEP 517 build backend: setuptools' own, plus two path
entries in editable wheels: one so that Spark finds format("shoal") by
itself, one so that static tools (mypy, an editor's go-to-definition, any
reader of imports) get from `shoal.workers.x` to `workers/x.py`.

Static tools: setuptools maps `shoal.*` onto the repository's top-level
folders (pyproject's package-dir), and its editable install resolves them
through an import hook that only a running interpreter can follow. So the
editable wheel also gets `shoal_import_links.pth`, naming `.build/import`,
where `shoal/<package>` is a link to each folder (made here, at install:
a fresh checkout needs no other step). Tools that read .pth files find the
packages there, and the interpreter imports them through the same links
(the path comes before the hook), so both see the same files under the same
names (docs/ARCHITECTURE.md, "Code layout").

PySpark 4 discovers data sources by listing top-level modules named
`pyspark_*` with pkgutil.iter_modules(), which sees only directories on
sys.path. A regular wheel installs the package pyspark_shoal in site-packages
and needs nothing more. An editable install (`pip install -e`) with our
package-dir mapping is served by setuptools' import hook instead, which
pkgutil cannot list; so its wheel also gets a .pth file naming
spark/discovery, a folder that holds pyspark_shoal/ and nothing else (no
other top-level name leaks onto sys.path). An sdist gets this file, which
setuptools would leave out (it packs what it installs): a wheel is built
from an sdist with the sdist's backend."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
import tomllib
import zipfile
from typing import Any

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F403  (every other hook, unchanged)

PTH = "shoal_spark_discovery.pth"
DISCOVERY = os.path.join("spark", "discovery")
LINKS_PTH = "shoal_import_links.pth"
LINKS = os.path.join(".build", "import")
BACKEND = "spark/build_backend/shoal_build_backend.py"


def build_editable(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    name = str(build_meta.build_editable(wheel_directory, config_settings, metadata_directory))
    # PEP 517 runs the hooks in the project's root: the path is absolute.
    entry = os.path.abspath(DISCOVERY) + "\n"
    add_file(os.path.join(wheel_directory, name), PTH, entry.encode())
    add_file(os.path.join(wheel_directory, name), LINKS_PTH, (link_tree() + "\n").encode())
    return name


def link_tree() -> str:
    """Make .build/import/shoal/<package> -> <folder> for each `shoal.<package>`
    of pyproject's package-dir; returns the absolute path of .build/import."""
    with open("pyproject.toml", "rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    root = os.path.abspath(LINKS)
    namespace = os.path.join(root, "shoal")
    os.makedirs(namespace, exist_ok=True)
    for package, folder in mapping.items():
        if not package.startswith("shoal.") or package.count(".") != 1:
            continue
        link = os.path.join(namespace, package.removeprefix("shoal."))
        target = os.path.relpath(os.path.abspath(folder), namespace)
        if os.path.islink(link) and os.readlink(link) == target:
            continue
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(target, link)
    return root


def add_file(wheel: str, arcname: str, data: bytes) -> None:
    """Add a file to the root of a wheel, with its line in RECORD."""
    with zipfile.ZipFile(wheel) as z:
        members = [(info, z.read(info)) for info in z.infolist()]
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(arcname, data)
        for info, content in members:
            if info.filename.endswith(".dist-info/RECORD"):
                content += f"{arcname},sha256={digest},{len(data)}\n".encode()
            z.writestr(info, content)


def build_sdist(sdist_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    name = str(build_meta.build_sdist(sdist_directory, config_settings))
    path = os.path.join(sdist_directory, name)
    with tarfile.open(path) as old:
        members = [(m, old.extractfile(m) if m.isfile() else None) for m in old.getmembers()]
        contents = [(m, f.read() if f is not None else None) for m, f in members]
    top = name.removesuffix(".tar.gz")
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as new:
        for member, data in contents:
            new.addfile(member, io.BytesIO(data) if data is not None else None)
        new.add(BACKEND, arcname=f"{top}/{BACKEND}")
    return name
