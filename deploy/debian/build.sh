#!/usr/bin/env bash
# `make deb`: a Debian package of this tree, dist/shoal_<version>_<arch>.deb.
#
# The `shoal` command comes with its own virtualenv under /opt/shoal/venv,
# built on Debian's python3.11 from this tree and its dependencies' wheels
# (PyPI), rather than as Debian's python3-* packages: Debian 12 has no msgspec
# and an older pamqp than Shoal is tested with, and the broker's C extensions
# are built against the same interpreter that runs them. The venv is made in
# a staging directory and moved to its place by rewriting the paths in its
# scripts (a venv records where it was made).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PYTHON=${PYTHON:-/usr/bin/python3}
VERSION=$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
ARCH=$(dpkg --print-architecture)
STAGE=$ROOT/.build/deb/stage
VENV=/opt/shoal/venv
rm -rf "$STAGE"
mkdir -p "$STAGE$VENV" "$STAGE/DEBIAN" "$ROOT/dist"

echo "== the virtualenv ($VENV), with shoal built from this tree"
"$PYTHON" -m venv "$STAGE$VENV"
"$STAGE$VENV/bin/pip" install -q --upgrade pip
# A clean copy of the tree: what git tracks, no build outputs of a checkout.
SRC=$ROOT/.build/deb/src
rm -rf "$SRC" && mkdir -p "$SRC"
git ls-files -z | xargs -0 cp --parents -t "$SRC"
"$STAGE$VENV/bin/pip" install -q --no-compile "$SRC"
rm -rf "$SRC"
# Moved to /opt/shoal/venv: every script's path to the staging directory.
grep -rlF "$STAGE$VENV" "$STAGE$VENV" | xargs sed -i "s#$STAGE$VENV#$VENV#g"
rm -rf "$STAGE$VENV/bin/Activate.ps1"
find "$STAGE$VENV" -name __pycache__ -type d -prune -exec rm -rf {} +
# Compiled here, as their installed paths: the broker, running as its
# unprivileged user, could not write them, and root's runs would leave files
# the package does not own.
"$PYTHON" -m compileall -q -j 0 -s "$STAGE" -p / "$STAGE$VENV/lib" >/dev/null

echo "== the command, the units, the user, the directories, the settings"
install -d "$STAGE/usr/bin"
ln -s "$VENV/bin/shoal" "$STAGE/usr/bin/shoal"
install -D -m 644 deploy/shoal.service "$STAGE/usr/lib/systemd/system/shoal.service"
install -D -m 644 deploy/shoal.socket "$STAGE/usr/lib/systemd/system/shoal.socket"
install -D -m 644 deploy/shoal.sysusers.conf "$STAGE/usr/lib/sysusers.d/shoal.conf"
install -D -m 644 deploy/shoal.tmpfiles.conf "$STAGE/usr/lib/tmpfiles.d/shoal.conf"
install -D -m 644 deploy/shoal.toml "$STAGE/etc/shoal/shoal.toml"
install -D -m 644 README.md "$STAGE/usr/share/doc/shoal/README.md"
for doc in shovels cluster access durability; do
  install -m 644 "docs/$doc.md" "$STAGE/usr/share/doc/shoal/"
done

echo "== DEBIAN/"
SIZE=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
sed -e "s/@VERSION@/$VERSION/" -e "s/@ARCH@/$ARCH/" -e "s/@SIZE@/$SIZE/" \
  deploy/debian/control.in > "$STAGE/DEBIAN/control"
echo /etc/shoal/shoal.toml > "$STAGE/DEBIAN/conffiles"
for script in postinst prerm postrm; do
  install -m 755 "deploy/debian/$script" "$STAGE/DEBIAN/$script"
done

OUT=$ROOT/dist/shoal_${VERSION}_${ARCH}.deb
fakeroot dpkg-deb --build -Zxz "$STAGE" "$OUT" >/dev/null
echo "$OUT"
