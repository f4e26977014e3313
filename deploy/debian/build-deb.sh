#!/usr/bin/env bash
# Builds the Debian package of airlock from what `cargo build` made, with the project's
# own files only (docs/install.md):
#
#   deploy/debian/build-deb.sh [BUILT_DIR] [OUT_DIR]
#
# BUILT_DIR: where airlock, airlock-guest, airlock-gvisor-agent and
# libairlock_gvisor_compat.so were built (default target/release: `make deb` builds them).
# OUT_DIR: where the .deb goes (default target/debian). Prints the .deb's path.
#
# Layout: /usr/bin/airlock; its helpers in /usr/libexec/airlock (where airlock looks for
# them); the unit in /lib/systemd/system; /etc/default/airlock (a conffile: extra flags for
# `airlock serve`); /etc/airlock/api-keys is made by postinst (a random key), not shipped.
# Needs dpkg-deb, and dpkg-shlibdeps (dpkg-dev) for the library dependencies.
# DEB_COMPRESSION: dpkg-deb's -Z (default xz; the tests use gzip: xz takes a minute over
# a debug build's binaries).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
built=$(cd "${1:-$root/target/release}" && pwd)
out=${2:-$root/target/debian}
mkdir -p "$out"
out=$(cd "$out" && pwd)

for f in airlock airlock-guest airlock-gvisor-agent libairlock_gvisor_compat.so; do
    [[ -f $built/$f ]] || { echo "build-deb: $built/$f is missing (make build, or cargo build -p airlock -p airlock-guest -p airlock-gvisor -p airlock-gvisor-compat)" >&2; exit 1; }
done

# The version the binary reports (`airlock 0.1.0`): a native package, no Debian revision.
version=$("$built/airlock" --version | awk '{print $2}')
[[ $version =~ ^[0-9][0-9A-Za-z.+~-]*$ ]] || { echo "build-deb: cannot read a version from '$built/airlock --version'" >&2; exit 1; }
arch=$(dpkg --print-architecture)
# Reproducible timestamps: the last commit's date when in a git checkout.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || date +%s)}

stage=$(mktemp -d "${TMPDIR:-/tmp}/airlock-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT
pkg=$stage/airlock_${version}_${arch}
umask 022
install -d "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/usr/libexec/airlock" "$pkg/lib/systemd/system" \
    "$pkg/etc/default" "$pkg/usr/share/doc/airlock"

# Binaries, stripped as Debian's packaging tools strip them (symbols are not shipped).
strip_() { strip --remove-section=.comment --remove-section=.note "$@"; }
install -m 0755 "$built/airlock" "$pkg/usr/bin/airlock"
install -m 0755 "$built/airlock-guest" "$built/airlock-gvisor-agent" "$pkg/usr/libexec/airlock/"
install -m 0644 "$built/libairlock_gvisor_compat.so" "$pkg/usr/libexec/airlock/"
strip_ "$pkg/usr/bin/airlock" "$pkg/usr/libexec/airlock/airlock-guest" "$pkg/usr/libexec/airlock/airlock-gvisor-agent"
strip_ --strip-unneeded "$pkg/usr/libexec/airlock/libairlock_gvisor_compat.so"

# The guest agent is a static PIE on purpose (`make` links it so: it is the micro-VM's
# /init, and its initramfs holds no loader or library), which lintian takes for a shared
# library without dependencies; it is told.
install -d "$pkg/usr/share/lintian/overrides"
printf 'airlock: shared-library-lacks-prerequisites [usr/libexec/airlock/airlock-guest]\n' \
    > "$pkg/usr/share/lintian/overrides/airlock"
chmod 0644 "$pkg/usr/share/lintian/overrides/airlock"

install -m 0644 "$root/deploy/systemd/airlock.service" "$pkg/lib/systemd/system/airlock.service"
install -m 0644 "$here/default" "$pkg/etc/default/airlock"
install -m 0644 "$here/copyright" "$pkg/usr/share/doc/airlock/copyright"
# A native package's changelog: one entry for this version.
{
    echo "airlock ($version) unstable; urgency=medium"
    echo
    echo "  * Built from the airlock source tree by deploy/debian/build-deb.sh."
    echo
    echo " -- airlock developers <airlock@noreply.invalid>  $(date -u -R -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9n > "$pkg/usr/share/doc/airlock/changelog.gz"
chmod 0644 "$pkg/usr/share/doc/airlock/changelog.gz"

for script in postinst prerm postrm; do
    install -m 0755 "$here/$script" "$pkg/DEBIAN/$script"
done
echo /etc/default/airlock > "$pkg/DEBIAN/conffiles"

# Shared-library dependencies of the ELF files (libc6, libgcc-s1), as dpkg-shlibdeps finds
# them; it wants a debian/control to read, so it runs in a scratch source tree.
shlibs=$(
    mkdir -p "$stage/src/debian"
    printf 'Source: airlock\n\nPackage: airlock\nArchitecture: any\n' > "$stage/src/debian/control"
    cd "$stage/src"
    dpkg-shlibdeps -O "$pkg/usr/bin/airlock" "$pkg/usr/libexec/airlock/airlock-guest" \
        "$pkg/usr/libexec/airlock/airlock-gvisor-agent" "$pkg/usr/libexec/airlock/libairlock_gvisor_compat.so" \
        2>/dev/null | sed -n 's/^shlibs:Depends=//p'
)
[[ -n $shlibs ]] || { echo "build-deb: dpkg-shlibdeps found no dependencies (is dpkg-dev installed?)" >&2; exit 1; }

installed_size=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@SHLIBS@/$shlibs/" \
    -e "s/@INSTALLED_SIZE@/$installed_size/" "$here/control" > "$pkg/DEBIAN/control"

find "$pkg" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
deb=$out/airlock_${version}_${arch}.deb
dpkg-deb --root-owner-group -Z"${DEB_COMPRESSION:-xz}" --build "$pkg" "$deb" >/dev/null
echo "$deb"
