#!/bin/sh
# Install lnk and what it needs on Debian/Ubuntu.  With --test, also everything the
# test suite runs for real: sshd and network namespaces, S3/GCS servers, the peers
# the benches compare against.
set -eu
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
PKGS="bubblewrap libseccomp2 util-linux"
if [ "${1:-}" = "--test" ]; then
  PKGS="$PKGS openssh-server openssh-client iproute2 socat zstd age rsync restic borgbackup \
sqlite3 time radosgw ceph-mon ceph-osd"
fi
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
PY="${PYTHON:-python3}"
PIP="$PY -m pip install -q --disable-pip-version-check"
# a Debian python3 marked externally managed takes --break-system-packages (pip >= 23)
if $PY -c 'import sys, sysconfig, os; sys.exit(0 if sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'; then
  PIP="$PIP --break-system-packages"
fi
if [ "${1:-}" = "--test" ]; then
  $PIP -e '.[test]'
  $PIP -e adapters/hermes
  # the real Hermes the tests run, in a virtualenv of its own (its exact pins clash with
  # lnk's), made once; the tests hand it to lnk-hermes install as LNK_HERMES_VENV
  # (hermes-agent is pinned exactly in the adapter: lnk_hermes.HARNESS_RELEASE)
  HERMES=$(sed -n 's/^HARNESS_RELEASE = "\(.*\)"/\1/p' adapters/hermes/lnk_hermes/__init__.py)
  HERMES_VENV="${LNK_HERMES_VENV:-$HOME/.cache/lnk/hermes-$HERMES}"
  if [ ! -x "$HERMES_VENV/bin/hermes" ]; then
    $PY -m venv "$HERMES_VENV"
    "$HERMES_VENV/bin/python" -m pip install -q --disable-pip-version-check "hermes-agent==$HERMES"
  fi
else
  $PIP .
  $PIP adapters/hermes
fi
