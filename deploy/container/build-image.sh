#!/usr/bin/env bash
# Builds the image of deploy/container/Dockerfile without a container engine:
#
#   1. the runtime root: Debian bookworm's minbase (what debian:bookworm-slim is, with the
#      same documentation left out) plus deploy/container/packages.txt, made by mmdebstrap
#      as a tarball, cached under $AIRLOCK_CI_CACHE keyed by the hash of everything it is
#      made from, and imported once into containers-storage as localhost/airlock-base:<key>;
#   2. the two binaries of `cargo build --release` (or of --bin-dir) and entrypoint.sh
#      copied on top, at the Dockerfile's paths, with its entrypoint, port and health check; committed with
#      buildah in Docker's format (OCI configs have no HEALTHCHECK) into containers-storage,
#      where podman runs it.
#
# Usage: deploy/container/build-image.sh [--tag NAME] [--bin-dir DIR]
#   --tag NAME     the image's name [localhost/airlock:latest]
#   --bin-dir DIR  take airlock and airlock-guest from DIR instead of building them with
#                  `cargo build --release` (the tests pass target/debug, which CI has built)
#
# Needs root, mmdebstrap and buildah (Debian packages), and the network the first time.
# A second build with the same packages takes seconds. Prints the image's id last.
set -euo pipefail
# Docker's image format throughout: OCI image configs have no HEALTHCHECK.
export BUILDAH_FORMAT=docker

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
tag=localhost/airlock:latest
bin_dir=
while [ $# -gt 0 ]; do
    case "$1" in
        --tag) tag="$2"; shift 2 ;;
        --bin-dir) bin_dir="$2"; shift 2 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "build-image.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

# The Dockerfile's runtime: these must match it (the container test compares them).
suite=bookworm
entrypoint='["/usr/libexec/airlock/container-entrypoint", "/usr/bin/airlock", "serve", "--listen", "0.0.0.0:8080"]'
port=8080
airlock_path=/usr/bin/airlock
guest_path=/usr/libexec/airlock/airlock-guest
gvisor_agent_path=/usr/libexec/airlock/airlock-gvisor-agent
gvisor_compat_path=/usr/libexec/airlock/libairlock_gvisor_compat.so
entrypoint_path=/usr/libexec/airlock/container-entrypoint
# The Dockerfile's exec form, as shell words (buildah splits them into the CMD form).
healthcheck='python3 -c "import urllib.request; urllib.request.urlopen('"'"'http://127.0.0.1:8080/healthz'"'"', timeout=4)"'

packages="$(sed -e 's/#.*//' "$here/packages.txt" | tr -s ' \t\n' '\n' | sed '/^$/d')"
[ -n "$packages" ] || { echo "build-image.sh: $here/packages.txt lists no package" >&2; exit 2; }

# mmdebstrap's whole input: the key of the cached root.
mmdebstrap_args=(
    --variant=minbase
    --include="$(echo "$packages" | paste -sd,)"
    # debian:bookworm-slim's exclusions: no manuals, docs or translations (copyrights kept).
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --dpkgopt='path-exclude=/usr/share/info/*'
    # The micro-VM tier fetches its guest kernel with `apt-get download`: keep the lists.
    --skip=cleanup/apt/lists
    "$suite"
)
mirrors=(
    "deb http://deb.debian.org/debian $suite main"
    "deb http://deb.debian.org/debian $suite-updates main"
    "deb http://deb.debian.org/debian-security $suite-security main"
)
key="$(printf '%s\n' "${mmdebstrap_args[@]}" "${mirrors[@]}" | sha256sum | cut -c1-16)"
cache="${AIRLOCK_CI_CACHE:-/var/cache/airlock-ci}/container"
rootfs="$cache/rootfs-$key.tar"
base="localhost/airlock-base:$key"
mkdir -p "$cache"

step() { printf 'build-image.sh: %s (%ss)\n' "$1" "$SECONDS" >&2; }

if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
    if [ ! -s "$rootfs" ]; then
        step "mmdebstrap $suite with $(echo "$packages" | paste -sd' ') -> $rootfs"
        # Older roots of other package lists are of no further use.
        rm -rf "$cache"/rootfs-*.tar "$cache"/partial-*.tar
        mmdebstrap --quiet --format=tar "${mmdebstrap_args[@]}" "$cache/partial-$key.tar" "${mirrors[@]}"
        mv "$cache/partial-$key.tar" "$rootfs"
    fi
    step "importing $rootfs as $base"
    ctr="$(buildah from scratch)"
    trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
    buildah add --quiet "$ctr" "$rootfs" / >/dev/null
    buildah config --os linux --arch amd64 --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
    buildah commit --quiet --format docker --rm "$ctr" "$base" >/dev/null
    trap - EXIT
fi

if [ -z "$bin_dir" ]; then
    step "cargo build --release -p airlock -p airlock-guest -p airlock-gvisor -p airlock-gvisor-compat"
    (cd "$repo" && cargo build --release --locked -p airlock -p airlock-guest -p airlock-gvisor -p airlock-gvisor-compat)
    # The guest agent linked again, static, as `make` does (no loader or library in the
    # micro-VM's initramfs).
    (cd "$repo" && cargo rustc --release --locked -p airlock-guest --bin airlock-guest -- -C target-feature=+crt-static)
    bin_dir="$repo/target/release"
fi
for bin in airlock airlock-guest airlock-gvisor-agent libairlock_gvisor_compat.so; do
    [ -f "$bin_dir/$bin" ] || { echo "build-image.sh: no $bin_dir/$bin" >&2; exit 2; }
done

step "adding the binaries from $bin_dir -> $tag"
ctr="$(buildah from --pull-never "$base")"
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
buildah copy --quiet --chmod 0755 "$ctr" "$bin_dir/airlock" "$airlock_path" >/dev/null
buildah copy --quiet --chmod 0755 "$ctr" "$bin_dir/airlock-guest" "$guest_path" >/dev/null
buildah copy --quiet --chmod 0755 "$ctr" "$bin_dir/airlock-gvisor-agent" "$gvisor_agent_path" >/dev/null
buildah copy --quiet --chmod 0644 "$ctr" "$bin_dir/libairlock_gvisor_compat.so" "$gvisor_compat_path" >/dev/null
buildah copy --quiet --chmod 0755 "$ctr" "$here/entrypoint.sh" "$entrypoint_path" >/dev/null
buildah config \
    --entrypoint "$entrypoint" --cmd '' \
    --port "$port" \
    --healthcheck "CMD $healthcheck" \
    --healthcheck-interval 10s --healthcheck-timeout 5s \
    --healthcheck-start-period 30s --healthcheck-retries 3 \
    --label org.opencontainers.image.source=deploy/container/Dockerfile \
    "$ctr"
id="$(buildah commit --quiet --format docker --rm "$ctr" "$tag")"
trap - EXIT
step "built $tag"
echo "$id"
