#!/bin/sh
# Install lnk and what it needs on Debian/Ubuntu.  With --test, also what the test suite needs.
set -eu
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
PKGS="bubblewrap"
if [ "${1:-}" = "--test" ]; then
  PKGS="$PKGS openssh-server openssh-client iproute2 socat zstd age rsync restic borgbackup sqlite3 time"
fi
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
PIP="python3 -m pip install -q --disable-pip-version-check"
if [ "${1:-}" = "--test" ]; then
  $PIP -e '.[test]'
else
  $PIP .
fi
