#!/usr/bin/env python3
"""Writes an OCI image layout (a directory: `oci-layout`, `index.json`, `blobs/sha256/…`)
from host files, with the Python standard library only: the image the benchmarks and the
SDK's tests run, made on the spot so nothing comes from the internet.

    python3 bench/oci_layout.py OUT_DIR --layer /bin/busybox=bin/busybox --link bin/sh=busybox \
        --env PATH=/bin --cmd sh,-c,'echo hi' [--gzip] [--ref NAME]

As a module: `write_layout(out_dir, layers, config, ref=None)` where each layer is a list
of `(path_in_image, host_path_or_bytes_or_None_for_dir, mode)` entries or
`("symlink", path, target)` tuples.
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import tarfile
import time


def _blob(out, data):
    digest = hashlib.sha256(data).hexdigest()
    d = os.path.join(out, "blobs", "sha256")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, digest), "wb") as f:
        f.write(data)
    return "sha256:" + digest, len(data)


def layer_tar(entries):
    """One uncompressed layer tar. Entries: (path, source, mode) with source a host path,
    bytes, or None for a directory; or ("symlink", path, target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        seen = set()
        for entry in entries:
            if entry[0] == "symlink":
                _, path, target = entry
                parents(tar, seen, path)
                info = tarfile.TarInfo(path)
                info.type = tarfile.SYMTYPE
                info.linkname = target
                info.mtime = 0
                tar.addfile(info)
                continue
            path, source, mode = entry
            parents(tar, seen, path)
            info = tarfile.TarInfo(path)
            info.mode = mode
            info.mtime = 0
            if source is None:
                info.type = tarfile.DIRTYPE
                seen.add(path)
                tar.addfile(info)
            else:
                data = source if isinstance(source, bytes) else open(source, "rb").read()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def parents(tar, seen, path):
    parts = path.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d and d not in seen:
            seen.add(d)
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            info.mtime = 0
            tar.addfile(info)


def write_layout(out, layers, config, ref=None, compress=True):
    """Writes the layout; returns the manifest's digest."""
    os.makedirs(out, exist_ok=True)
    descriptors, diff_ids = [], []
    for entries in layers:
        raw = layer_tar(entries)
        diff_ids.append("sha256:" + hashlib.sha256(raw).hexdigest())
        data = gzip.compress(raw, mtime=0) if compress else raw
        digest, size = _blob(out, data)
        media = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if compress else "")
        descriptors.append({"mediaType": media, "digest": digest, "size": size})
    cfg = {
        "architecture": "amd64",
        "os": "linux",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(0)),
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    cdigest, csize = _blob(out, json.dumps(cfg, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cdigest, "size": csize},
        "layers": descriptors,
    }
    mdigest, msize = _blob(out, json.dumps(manifest, sort_keys=True).encode())
    desc = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mdigest, "size": msize,
            "platform": {"architecture": "amd64", "os": "linux"}}
    if ref:
        desc["annotations"] = {"org.opencontainers.image.ref.name": ref}
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [desc]}, f)
    with open(os.path.join(out, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    return mdigest


APPLETS = ("sh", "ls", "cat", "echo", "env", "id", "pwd", "sleep", "touch", "true", "false", "printf", "wc",
           "head", "mkdir", "rm", "chmod", "ln", "cp", "mv", "grep", "sed", "test", "[", "tr", "stat", "find")


def busybox_layer(applets=APPLETS):
    """A layer with Debian's static busybox as /bin/busybox and its applets as links."""
    entries = [("bin/busybox", "/bin/busybox", 0o755)]
    entries += [("symlink", f"bin/{a}", "busybox") for a in applets]
    return entries


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layer", action="append", default=[], help="HOST=PATH_IN_IMAGE (one layer each)")
    ap.add_argument("--busybox", action="store_true", help="a first layer with static busybox in /bin")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--cmd", default=None, help="comma-separated Cmd")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--ref", default=None)
    ap.add_argument("--no-gzip", action="store_true")
    a = ap.parse_args()
    layers = [busybox_layer()] if a.busybox else []
    for spec in a.layer:
        host, path = spec.split("=", 1)
        if os.path.isdir(host):
            entries = []
            for dirpath, dirnames, filenames in os.walk(host):
                rel = os.path.relpath(dirpath, host)
                base = path if rel == "." else f"{path}/{rel}"
                for n in sorted(filenames):
                    p = os.path.join(dirpath, n)
                    if os.path.islink(p):
                        entries.append(("symlink", f"{base}/{n}", os.readlink(p)))
                    elif os.path.isfile(p):
                        entries.append((f"{base}/{n}", p, os.stat(p).st_mode & 0o777))
            layers.append(entries)
        else:
            layers.append([(path, host, os.stat(host).st_mode & 0o777)])
    config = {"Env": a.env or ["PATH=/usr/local/bin:/usr/bin:/bin"]}
    if a.cmd:
        config["Cmd"] = a.cmd.split(",")
    if a.workdir:
        config["WorkingDir"] = a.workdir
    print(write_layout(a.out, layers, config, ref=a.ref, compress=not a.no_gzip))


if __name__ == "__main__":
    main()
