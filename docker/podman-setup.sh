#!/usr/bin/env bash
# Make a rootful podman usable on a machine with no Docker engine and no systemd.
#
# Idempotent: installs podman and runc from Debian's packages when `podman` is missing, and
# writes /etc/containers/containers.conf only when that file does not exist yet. The config
# is what this kind of machine needs (checked on the 2-vCPU dev/CI machine): no default
# ulimits (the sandbox refuses to raise them), the runc runtime and the cgroupfs cgroup
# manager (there is no systemd to hand cgroups to).
set -euo pipefail

if ! command -v podman >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "podman-setup: podman is missing and we are not root; install podman and runc" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq podman runc >/dev/null
fi

conf=/etc/containers/containers.conf
if [ ! -e "$conf" ] && [ "$(id -u)" -eq 0 ]; then
    mkdir -p /etc/containers
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
