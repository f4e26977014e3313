"""Test fixtures: real ``airlock serve`` daemons started by the test session.

The binary comes from ``$AIRLOCK_BIN`` (default ``<repo>/target/debug/airlock``). Each
daemon listens on ``127.0.0.1:0``; the fixture reads the port from the first stdout line,
waits for ``/readyz``, and stops the daemon with SIGTERM at the end. Nothing here or in the
tests reaches beyond loopback.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import httpx
import pytest

if TYPE_CHECKING:
    from airlock import Airlock

REPO = Path(__file__).resolve().parents[3]
API_KEY = "sdk-test-key-0123456789abcdef"
API_KEY_NAME = "sdk-tests"


def airlock_bin() -> Path:
    return Path(os.environ.get("AIRLOCK_BIN") or REPO / "target" / "debug" / "airlock")


_SNAPSHOT_ROOT: list[str] = []


def snapshot_dir() -> str:
    """A fresh snapshot store for one ``airlock serve`` or ``airlock mcp``
    (``--snapshot-dir``): two of them never share one, and none uses the host's default
    (/var/lib/airlock/snapshots). All are removed when the test process exits."""
    import atexit
    import shutil
    import tempfile

    if not _SNAPSHOT_ROOT:
        _SNAPSHOT_ROOT.append(tempfile.mkdtemp(prefix="airlock-sdk-test-snapshots-"))
        atexit.register(shutil.rmtree, _SNAPSHOT_ROOT[0], True)
    return tempfile.mkdtemp(dir=_SNAPSHOT_ROOT[0])


@dataclass
class Daemon:
    """A running ``airlock serve``."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    args: list[str] = field(default_factory=list)
    api_key: str | None = None

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_daemon(
    tmp: Path,
    *args: str,
    api_key: str | None = None,
    ready_timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> Daemon:
    """Starts ``airlock serve --listen 127.0.0.1:0 --snapshot-dir TMP/snapshots ARGS``
    (without ``--snapshot-dir`` when ARGS give one; with ``env`` added to its
    environment) and waits until it is ready."""
    binary = airlock_bin()
    if not binary.exists():
        pytest.fail(
            f"airlock binary not found at {binary}: run `cargo build` in {REPO} or set AIRLOCK_BIN",
            pytrace=False,
        )
    tmp.mkdir(parents=True, exist_ok=True)
    out = tmp / "stdout"
    log = tmp / "stderr"
    # Every daemon gets a snapshot store of its own unless ARGS name one: two daemons never
    # share one (the default, /var/lib/airlock/snapshots, is held by one daemon at a time).
    own = [] if "--snapshot-dir" in args else ["--snapshot-dir", str(tmp / "snapshots")]
    argv = [str(binary), "serve", "--listen", "127.0.0.1:0", *own, *args]
    environ = {k: v for k, v in os.environ.items() if k != "AIRLOCK_API_KEYS"} | (env or {})
    with open(out, "wb") as o, open(log, "wb") as e:
        proc = subprocess.Popen(argv, stdout=o, stderr=e, stdin=subprocess.DEVNULL, env=environ)
    deadline = time.monotonic() + ready_timeout
    url = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{argv} exited {proc.returncode}:\n{log.read_text(errors='replace')}", pytrace=False)
        m = re.search(r"listening on (http://\S+)", out.read_text(errors="replace"))
        if m:
            url = m.group(1)
            break
        time.sleep(0.02)
    if url is None:
        proc.kill()
        pytest.fail(f"{argv} did not print its address in {ready_timeout}s", pytrace=False)
    daemon = Daemon(url=url, proc=proc, log=log, args=list(args), api_key=api_key)
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return daemon
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    daemon.stop()
    pytest.fail(f"{argv} was not ready in {ready_timeout}s:\n{daemon.log_text()}", pytrace=False)


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """The open daemon (loopback, no API keys) most tests use."""
    d = start_daemon(tmp_path_factory.mktemp("daemon"), "--pool", "2", "--grace", "5s")
    yield d
    d.stop()


@pytest.fixture(scope="session")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon with API keys, a 16 KiB body limit, one sandbox at most and a 200 ms
    admission queue: 401, 413 and 429 with Retry-After come from it."""
    tmp = tmp_path_factory.mktemp("strict")
    keys = tmp / "keys"
    keys.write_text(f"{API_KEY_NAME}:{API_KEY}\n")
    keys.chmod(0o600)
    d = start_daemon(
        tmp,
        "--api-keys", str(keys),
        "--max-body", "16K",
        "--max-sandboxes", "1",
        "--queue-timeout", "200ms",
        "--pool", "1",
        api_key=API_KEY,
    )
    yield d
    d.stop()


@pytest.fixture
def url(daemon: Daemon) -> str:
    return daemon.url


@pytest.fixture
def al(daemon: Daemon) -> Iterator[Airlock]:
    from airlock import Airlock  # imported here: test_mcp.py shares this directory, not the SDK

    with Airlock(daemon.url) as client:
        yield client


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"



# ---------------------------------------------------------------------------------------
# Images (test_images.py): a store holding a busybox and a python image, both OCI layouts
# written from host files by bench/oci_layout.py and bench/images.py (nothing from the
# internet), imported with the real `airlock image import`; a daemon serving from it.
# ---------------------------------------------------------------------------------------

BUSYBOX_IMAGE = "airlock-sdk-test/busybox:1"
PYTHON_IMAGE = "airlock-sdk-test/python:1"
IMAGE_CMD = ["sh", "-c", "echo image-cmd in $(pwd) as $(id -u)"]


@dataclass
class ImageStore:
    """A store (``--image-store``) with :data:`BUSYBOX_IMAGE` and :data:`PYTHON_IMAGE`."""

    path: Path
    busybox: str = BUSYBOX_IMAGE
    python: str = PYTHON_IMAGE


@pytest.fixture(scope="session")
def image_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImageStore]:
    import functools
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    import images  # bench/images.py
    request_cleanup: list = []
    import oci_layout  # bench/oci_layout.py

    tmp = tmp_path_factory.mktemp("images")
    # The store itself lives where every directory on its path lets others through:
    # pytest's base temp dir is 0700, and a store below such a directory cannot be bound
    # into a sandbox today (crates/airlock/tests/images.rs,
    # a_store_below_a_private_directory_serves_images, ignored as a BUG).
    import shutil
    import tempfile

    store_dir = Path(tempfile.mkdtemp(prefix="airlock-sdk-test-images-"))
    store_dir.chmod(0o755)
    request_cleanup.append(lambda: shutil.rmtree(store_dir, ignore_errors=True))
    store = store_dir / "store"
    # Every busybox applet (the images' shells run `pwd`, `id`, `test`, …).
    applets = tuple(
        a for a in subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True, check=True).stdout.split()
        if a != "busybox"
    )
    full_busybox = functools.partial(oci_layout.busybox_layer, applets=applets)
    config = {"Env": ["PATH=/usr/bin:/bin", "IMAGE_VAR=from-image"], "Cmd": IMAGE_CMD, "WorkingDir": "/bin"}
    oci_layout.write_layout(str(tmp / "bb"), [full_busybox()], config, ref="bb:1")
    original = oci_layout.busybox_layer
    oci_layout.busybox_layer = full_busybox
    try:
        layers = images.python_layers()
    finally:
        oci_layout.busybox_layer = original
    # bash too, with its libraries: `shell()` and MCP's language "bash" run `bash -c`.
    ldd = subprocess.run(["ldd", "/bin/bash"], capture_output=True, text=True, check=True).stdout
    bash = [("usr/bin/bash", "/bin/bash", 0o755)]
    for lib in re.findall(r"(/\S+\.so[.\d]*)", ldd):
        inside = lib if lib.startswith("/usr/") else "/usr" + lib
        bash.append((inside.lstrip("/"), os.path.realpath(lib), 0o755))
    layers.append(bash)
    oci_layout.write_layout(str(tmp / "py"), layers, config, ref="py:1", compress=False)
    for layout, name in [(tmp / "bb", BUSYBOX_IMAGE), (tmp / "py", PYTHON_IMAGE)]:
        p = subprocess.run(
            [str(airlock_bin()), "image", "--image-store", str(store), "import", str(layout), "--name", name],
            capture_output=True, text=True,
        )
        assert p.returncode == 0, f"airlock image import {layout}: {p.stderr}"
    yield ImageStore(path=store)
    for f in request_cleanup:
        f()


@pytest.fixture(scope="session")
def image_daemon(tmp_path_factory: pytest.TempPathFactory, image_store: ImageStore) -> Iterator[Daemon]:
    """A daemon serving images from :func:`image_store` (namespaces pool of 1, gVisor
    pool of 1)."""
    d = start_daemon(
        tmp_path_factory.mktemp("image-daemon"),
        "--image-store", str(image_store.path), "--pool", "1", "--gvisor-pool", "1", "--grace", "5s",
    )
    yield d
    d.stop()
