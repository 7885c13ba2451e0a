# Sourced by docker/smoke.sh and docker/smoke-replicated.sh: picks the container engine and
# the compose command, and makes sure a base image exists.
#
# Sets `engine` (docker or podman) and the array `compose` (the compose command, without
# project or file). Docker with the compose plugin when a Docker daemon answers, else
# rootful podman with podman-compose (docker/podman-setup.sh installs and configures podman
# when missing). Exports DQ_BASE_IMAGE: as given, else (no registry reachable here) a local
# Debian image made once by docker/base-image.sh and reused afterwards.
# Needs `root` (the repository root) set by the caller.

if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1 \
    && docker compose version >/dev/null 2>&1; then
    engine=docker
    compose=(docker compose)
else
    engine=podman
    bash "$root/docker/podman-setup.sh" >/dev/null
    if command -v podman-compose >/dev/null 2>&1; then
        compose=(podman-compose)
    else
        [ -x "$root/.venv/bin/podman-compose" ] \
            || "$root/.venv/bin/python" -m pip install -q 'podman-compose>=1.2'  # extra "deploy"
        compose=("$root/.venv/bin/podman-compose")
    fi
fi

if [ -z "${DQ_BASE_IMAGE:-}" ]; then
    DQ_BASE_IMAGE="$(CONTAINER_ENGINE="$engine" bash "$root/docker/base-image.sh" | tail -n 1)"
fi
export DQ_BASE_IMAGE
