#!/usr/bin/env bash
# Install the Debian packages needed for the local test SLURM cluster.
# Idempotent: returns at once when everything is already installed.
# Must run as root (CI and the dev machines run as root; there is no sudo).
set -euo pipefail

PKGS=(slurm-wlm slurm-client slurmdbd munge mariadb-server)

missing=()
for p in "${PKGS[@]}"; do
  # dpkg-query prints "install ok installed" only for fully installed packages.
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install.sh: all packages already installed"
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
# apt-get update only if there are no package lists yet, or if the install
# fails (stale lists).
if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
  apt-get update -qq
fi
# policy-rc.d: we are not under systemd; keep maintainer scripts from trying to
# start daemons (start.sh starts them itself, with our own config).
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "install.sh: installed ${missing[*]}"
