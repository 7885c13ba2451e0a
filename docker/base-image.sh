#!/usr/bin/env bash
# Build a minimal Debian base image with python3 and import it into podman.
#
# Why: this machine reaches Debian's packages and PyPI but no container registry, so the
# official Python slim image cannot be pulled. The Dockerfile takes its base image as the
# BASE_IMAGE build argument; the smoke test passes the image this script makes.
#
# Invariant: the image is only (re)built when it is missing, was made by an older version of
# this script (label dq.base.version), or FORCE=1; repeated smoke runs reuse it.
# Site-local CA certificates of the host (/usr/local/share/ca-certificates/*.crt, Debian's
# place for them) are copied into the image, so pip and apt inside the build work behind the
# same TLS-inspecting proxy as the host. Usage: docker/base-image.sh [IMAGE] (default localhost/dq-base:bookworm).
# Env: DQ_BASE_SUITE (default bookworm), DEBOOTSTRAP_MIRROR (default: debootstrap's own),
# CONTAINER_ENGINE (default podman).
set -euo pipefail

image="${1:-localhost/dq-base:bookworm}"
suite="${DQ_BASE_SUITE:-bookworm}"
engine="${CONTAINER_ENGINE:-podman}"
version=2  # bump when the image content below changes

have="$("$engine" image inspect "$image" --format '{{index .Config.Labels "dq.base.version"}}' 2>/dev/null || true)"
if [ "${FORCE:-0}" != 1 ] && [ "$have" = "$version" ]; then
    echo "base-image: $image (version $version) already present, reusing it"
    exit 0
fi

if ! command -v debootstrap >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

work="$(mktemp -d /var/tmp/dq-base.XXXXXX)"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"

echo "base-image: debootstrap $suite into $rootfs (a few minutes)"
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
    chroot "$rootfs" update-ca-certificates >/dev/null
    echo "base-image: added ${#local_cas[@]} site-local CA certificate(s)"
fi

# Keep the image small: no package lists, caches, docs or man pages.
chroot "$rootfs" apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/* \
    "$rootfs"/var/log/*.log "$rootfs"/tmp/*

echo "base-image: importing as $image"
tar -C "$rootfs" --numeric-owner -cf - . | "$engine" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --change "LABEL dq.base.version=$version" \
    - "$image" >/dev/null 2>"$work/import.log" \
    || { cat "$work/import.log" >&2; exit 1; }
"$engine" image inspect "$image" --format 'base-image: {{.Id}} {{.Size}} bytes'
