#!/usr/bin/env bash
# Make a rootful podman usable on a machine with no Docker engine and no systemd.
#
# Idempotent: installs from Debian's packages whichever of podman and runc is missing (a
# machine can have podman without runc: podman then fails with 'default OCI runtime "runc"
# not found'), and writes /etc/containers/containers.conf only when that file does not
# exist yet. The config is what this kind of machine needs (checked on the 2-vCPU dev/CI
# machine): no default ulimits (the sandbox refuses to raise them), the runc runtime and
# the cgroupfs cgroup manager (there is no systemd to hand cgroups to).
#
# PODMAN_SETUP_CONF (the config file) and PODMAN_SETUP_SBIN (where runc is looked for
# besides PATH: it lives in /usr/sbin, outside a user's PATH) exist for
# tests/docker/test_scripts.py, which runs this script against stand-in commands.
set -euo pipefail

conf="${PODMAN_SETUP_CONF:-/etc/containers/containers.conf}"
sbin="${PODMAN_SETUP_SBIN-/usr/local/sbin:/usr/sbin:/sbin}"

found() { PATH="$PATH${sbin:+:$sbin}" command -v "$1" >/dev/null 2>&1; }

missing=()
found podman || missing+=(podman)
found runc || missing+=(runc)
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "podman-setup: ${missing[*]} missing and we are not root; install ${missing[*]}" \
            "(apt-get install ${missing[*]})" >&2
        exit 1
    fi
    echo "podman-setup: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -e "$conf" ] && [ "$(id -u)" -eq 0 ]; then
    mkdir -p "$(dirname "$conf")"
    cat >"$conf" <<'CONF'
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
    echo "podman-setup: wrote $conf"
fi

podman --version
