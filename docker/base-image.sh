#!/usr/bin/env bash
# Build a minimal Debian base image with python3 and import it into the container engine.
#
# Why: this machine reaches Debian's packages and PyPI but no container registry, so the
# official Python slim image cannot be pulled. The Dockerfile takes its base image as the
# BASE_IMAGE build argument; the smoke test passes the image this script makes.
#
# Invariant: the image name carries this script's content version
# (localhost/dq-base:<suite>-v<version>), and the image is only built when that name is
# missing (or FORCE=1), so repeated smoke runs reuse it and a changed recipe gets a new name.
# Site-local CA certificates of the host (/usr/local/share/ca-certificates/*.crt, Debian's
# place for them) are copied into the image, so pip and apt inside the build work behind
# the same TLS-inspecting proxy as the host.
#
# Usage: docker/base-image.sh [IMAGE]. Prints the image name as the only line on stdout
# (progress goes to stderr). Env: DQ_BASE_SUITE (default bookworm), DEBOOTSTRAP_MIRROR
# (default: debootstrap's own), CONTAINER_ENGINE (default podman). Needs root.
set -euo pipefail

version=2  # bump when the image content below changes
suite="${DQ_BASE_SUITE:-bookworm}"
image="${1:-localhost/dq-base:$suite-v$version}"
engine="${CONTAINER_ENGINE:-podman}"

say() { echo "base-image: $*" >&2; }

if [ "${FORCE:-0}" != 1 ] && "$engine" image inspect "$image" >/dev/null 2>&1; then
    say "$image already present, reusing it"
    echo "$image"
    exit 0
fi

if ! command -v debootstrap >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

work="$(mktemp -d /var/tmp/dq-base.XXXXXX)"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"

say "debootstrap $suite into $rootfs (a minute or two)"
# minbase: essential + apt only. python3-venv brings ensurepip so the build stage can make
# a virtualenv; ca-certificates lets pip and apt use TLS inside the build.
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$suite" "$rootfs" ${DEBOOTSTRAP_MIRROR:+"$DEBOOTSTRAP_MIRROR"} >"$work/debootstrap.log" 2>&1 \
    || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }

shopt -s nullglob
local_cas=(/usr/local/share/ca-certificates/*.crt)
if [ "${#local_cas[@]}" -gt 0 ]; then
    mkdir -p "$rootfs/usr/local/share/ca-certificates"
    cp "${local_cas[@]}" "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null 2>&1
    say "added ${#local_cas[@]} site-local CA certificate(s)"
fi

# Keep the image small: no package lists, caches, docs or man pages.
chroot "$rootfs" apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/* \
    "$rootfs"/var/log/*.log "$rootfs"/tmp/*

say "importing as $image"
# Only instructions both `docker import` and `podman import` accept (ENV, CMD).
tar -C "$rootfs" --numeric-owner -cf - . | "$engine" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$image" >/dev/null 2>"$work/import.log" \
    || { cat "$work/import.log" >&2; exit 1; }
say "$("$engine" image inspect "$image" --format '{{.Id}} {{.Size}} bytes')"
echo "$image"
