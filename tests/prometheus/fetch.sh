#!/usr/bin/env bash
# Fetch Debian's Prometheus (2.42) into .cache/prometheus without installing
# it system-wide: `apt-get download` needs no root, `dpkg -x` unpacks the .deb.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.cache/prometheus
if [ -x "$dest/usr/bin/prometheus" ]; then
  exit 0
fi
mkdir -p "$dest"
tmp=$(mktemp -d)
(cd "$tmp" && apt-get download prometheus >/dev/null 2>&1)
dpkg -x "$tmp"/prometheus_*.deb "$dest"
rm -rf "$tmp"
"$dest/usr/bin/prometheus" --version | head -1
