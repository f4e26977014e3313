#!/bin/sh
# The image's entrypoint (/usr/libexec/airlock/container-entrypoint): gives airlock the
# container's own cgroups, writable, then becomes the command it is given
# (`airlock serve --listen 0.0.0.0:8080 …`).
#
# Container engines mount the cgroup hierarchies read-only unless the container is
# privileged, even when it has a cgroup namespace of its own (podman/docker
# --cgroupns=private, Kubernetes on cgroup v2): the namespace's root is then the
# container's own cgroup, whose subtree is the container's to divide, but its mount says
# ro. With a cgroup namespace of its own (every line of /proc/self/cgroup ends in ":/"),
# this remounts the hierarchies airlock uses read-write (a bind remount: the mount's flag
# only), and on a hybrid host, where the engine mounts no cgroup2, mounts the container's
# part of the unified hierarchy for cgroup.kill. Without one, or without CAP_SYS_ADMIN,
# it changes nothing, and the daemon refuses with one line naming what is missing.
set -u

own_namespace() {
    [ -r /proc/self/cgroup ] || return 1
    while IFS= read -r line; do
        case "$line" in
            *:/) ;;
            *) return 1 ;;
        esac
    done </proc/self/cgroup
}

if own_namespace; then
    for dir in /sys/fs/cgroup /sys/fs/cgroup/memory /sys/fs/cgroup/pids /sys/fs/cgroup/cpu \
        /sys/fs/cgroup/cpuacct /sys/fs/cgroup/cpu,cpuacct /sys/fs/cgroup/freezer \
        /sys/fs/cgroup/unified; do
        # Only a cgroup mount of its own (a symlink such as cpu -> cpu,cpuacct is skipped).
        [ -d "$dir" ] && [ ! -L "$dir" ] && mountpoint -q "$dir" || continue
        case "$(stat -f -c %T "$dir")" in
            cgroupfs | cgroup2fs) mount -o remount,bind,rw "$dir" 2>/dev/null || true ;;
        esac
    done
    # Hybrid host (v1 controllers on a tmpfs): the unified hierarchy too.
    if [ "$(stat -f -c %T /sys/fs/cgroup)" = tmpfs ] && ! mountpoint -q /sys/fs/cgroup/unified \
        && grep -qw cgroup2 /proc/filesystems; then
        # The engine's tmpfs is mode 0555: root needs CAP_DAC_OVERRIDE to add a directory,
        # or, as its owner, a chmod (no capability) around the mkdir.
        mode="$(stat -c %a /sys/fs/cgroup)"
        chmod u+w /sys/fs/cgroup 2>/dev/null
        mkdir -p /sys/fs/cgroup/unified 2>/dev/null \
            && mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 /sys/fs/cgroup/unified 2>/dev/null
        chmod "$mode" /sys/fs/cgroup 2>/dev/null || true
    fi
fi

exec "$@"
