"""The project's PEP 517 build backend: setuptools' own, plus a path entry in
editable wheels so that Spark finds format("shoal") by itself.

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
import zipfile
from typing import Any

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F403  (every other hook, unchanged)

PTH = "shoal_spark_discovery.pth"
DISCOVERY = os.path.join("spark", "discovery")
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
    return name


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
