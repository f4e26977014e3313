"""Snapshots, restore, fork, pause and resume, and each exec's ``files_changed``, with the
sync and the async client, against the real daemon (namespaces tier: filesystem
snapshots). Every daemon of the fixtures has a snapshot store of its own in a temp dir."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from airlock import (
    Airlock,
    AsyncAirlock,
    AsyncSandbox,
    FileChange,
    IncompatibleSnapshot,
    InvalidRequest,
    Sandbox,
    SandboxConflict,
    SandboxNotFound,
    SandboxPaused,
    Snapshot,
    SnapshotBudgetExceeded,
    SnapshotList,
    SnapshotNotFound,
    SnapshotsUnavailable,
)
from conftest import Daemon, ImageStore, start_daemon

# What a session's files look like, from inside: every path under /workspace and /tmp with
# its type and content (symlinks by target), sorted.
TREE = (
    "cd / && find workspace tmp -mindepth 1 | LC_ALL=C sort | while read -r p; do "
    'if [ -L "$p" ]; then echo "$p -> $(readlink "$p")"; '
    'elif [ -d "$p" ]; then echo "$p/"; '
    'else echo "$p: $(cat "$p") $(stat -c %a "$p")"; fi; done'
)


def tree(sb: Sandbox) -> str:
    r = sb.shell(TREE)
    assert r.ok, r.stderr
    return r.stdout


def prepare(sb: Sandbox) -> None:
    """A file, an executable, an empty directory, a symlink and a file in /tmp."""
    sb.files.write("a.txt", "one")
    sb.files.write("bin/tool.sh", "#!/bin/sh\necho tool\n", mode=0o755)
    r = sb.shell("mkdir -p empty && ln -s a.txt link && echo scratch > /tmp/t")
    assert r.ok, r.stderr


PREPARED = (
    "tmp/t: scratch 644\n"
    "workspace/a.txt: one 644\n"
    "workspace/bin/\n"
    "workspace/bin/tool.sh: #!/bin/sh\necho tool 755\n"
    "workspace/empty/\n"
    "workspace/link -> a.txt\n"
)


@pytest.fixture
def sb(al: Airlock) -> Iterator[Sandbox]:
    with al.sandbox(ttl_s=300) as s:
        yield s


def test_snapshot_then_restore_brings_back_exactly_its_files(al: Airlock, sb: Sandbox) -> None:
    prepare(sb)
    assert tree(sb) == PREPARED
    snap = sb.snapshot()
    assert isinstance(snap, Snapshot)
    assert re.fullmatch(r"snap-[0-9a-f]{16}", snap.snapshot_id) and snap.id == snap.snapshot_id
    assert snap.kind == "filesystem"  # the namespaces tier keeps files only
    assert snap.sandbox_id == sb.id and snap.isolation == "namespaces" and snap.image is None
    assert snap.files >= 3 and snap.bytes >= len("one") + len("scratch\n")
    assert abs(snap.created_at - time.time()) < 60

    # after it: a file changed, one added, one deleted, the directory and /tmp gone
    sb.files.write("a.txt", "changed")
    sb.files.write("later.txt", "written after the snapshot")
    r = sb.shell("rm bin/tool.sh && rmdir empty && rm /tmp/t && echo new > /tmp/new")
    assert r.ok, r.stderr
    assert tree(sb) != PREPARED

    info = sb.restore(snap)
    assert info.id == sb.id and info.status == "running"
    assert tree(sb) == PREPARED
    assert sb.files.read_text("a.txt") == "one"
    # the session goes on: it runs and writes as before, and a restore by id works too
    sb.files.write("again.txt", "x")
    sb.restore(snap.snapshot_id)
    assert tree(sb) == PREPARED


def test_from_snapshot_starts_a_new_session_with_its_files(al: Airlock, sb: Sandbox) -> None:
    prepare(sb)
    snap = sb.snapshot(kind="filesystem")
    assert snap.kind == "filesystem"
    sb.files.write("a.txt", "parent changed it later")
    with Sandbox.from_snapshot(al, snap, ttl_s=120) as child:
        assert child.id != sb.id
        assert tree(child) == PREPARED
        info = child.info()
        assert info.from_snapshot == snap.snapshot_id and info.isolation == "namespaces"
        child.files.write("a.txt", "child's")
        assert sb.files.read_text("a.txt") == "parent changed it later"
    with al.sandbox(from_snapshot=snap.snapshot_id) as other:  # by id, through sandbox()
        assert tree(other) == PREPARED
    # image and isolation come from the snapshot: giving one is refused, naming it
    with pytest.raises(InvalidRequest) as e:
        al.sandbox(from_snapshot=snap, isolation="gvisor")
    assert e.value.field == "isolation"


def test_fork_makes_independent_copies(al: Airlock, sb: Sandbox) -> None:
    prepare(sb)
    forks = sb.fork(3, ttl_s=120)
    try:
        assert len(forks) == 3 and all(isinstance(f, Sandbox) for f in forks)
        assert len({f.id for f in forks} | {sb.id}) == 4
        assert all(f.expires_at is not None and f.expires_at > time.time() for f in forks)
        for i, f in enumerate(forks):
            assert tree(f) == PREPARED
            f.files.write("a.txt", f"fork {i}")
            f.files.write(f"only-{i}.txt", str(i))
        for i, f in enumerate(forks):
            assert f.files.read_text("a.txt") == f"fork {i}"
            names = sorted(e.path for e in f.files.list() if e.path.startswith("only-"))
            assert names == [f"only-{i}.txt"]
        assert sb.files.read_text("a.txt") == "one"
        assert tree(sb) == PREPARED
    finally:
        for f in forks:
            f.close()
    with pytest.raises(InvalidRequest) as e:
        sb.fork(0)
    assert e.value.field == "count"
    with pytest.raises(InvalidRequest) as e:
        sb.fork(17)  # the server's --max-fork defaults to 16
    assert e.value.field == "count"


def test_pause_refuses_work_until_resume(sb: Sandbox) -> None:
    sb.files.write("a.txt", "one")
    info = sb.pause()
    assert info.status == "paused" and info.id == sb.id
    assert sb.info().status == "paused"
    assert sb.pause().status == "paused"  # idempotent
    with pytest.raises(SandboxPaused) as e:
        sb.exec(["true"])
    assert isinstance(e.value, SandboxConflict) and e.value.status == 409 and e.value.code == "paused"
    with pytest.raises(SandboxPaused):
        sb.files.read("a.txt")
    with pytest.raises(SandboxPaused):
        sb.processes.start(["sleep", "1"])
    info = sb.resume()
    assert info.status == "running"
    assert sb.resume().status == "running"  # idempotent
    r = sb.exec(["cat", "a.txt"])
    assert r.ok and r.stdout == "one"


def test_on_idle_pause_pauses_and_resumes_by_itself(al: Airlock) -> None:
    with al.sandbox(ttl_s=120, on_idle="pause", idle_timeout_s=1) as sb:
        assert sb.info().on_idle == "pause"
        sb.files.write("a.txt", "kept")

        def status() -> str:
            # the listing does not touch the session (a request to it would keep it awake)
            return next(s for s in al.list_sandboxes() if s.id == sb.id).status

        deadline = time.monotonic() + 20
        while status() != "paused":
            assert time.monotonic() < deadline, "not paused 20 s after its 1 s idle timeout"
            time.sleep(0.25)
        r = sb.exec(["cat", "a.txt"])  # resumed by the request itself
        assert r.ok and r.stdout == "kept"
        assert sb.info().status == "running"
    with al.sandbox() as plain:
        assert plain.info().on_idle == "none"


def test_files_changed_names_created_modified_deleted(sb: Sandbox) -> None:
    sb.files.write("a.txt", "one")
    sb.files.write("gone.txt", "bye")
    sb.files.write("old-name.txt", "moved")
    r = sb.shell(
        "echo hello > new.txt && echo more >> a.txt && rm gone.txt && mkdir dir "
        "&& mv old-name.txt new-name.txt && ln -s a.txt sym && echo t > /tmp/t"
    )
    assert r.ok, r.stderr
    assert all(isinstance(c, FileChange) for c in r.files_changed)
    got = [(c.path, c.change, c.kind, c.bytes) for c in r.files_changed]
    assert got == [
        ("/workspace/a.txt", "modified", "file", len("one") + len("more\n")),
        ("/workspace/dir", "created", "dir", 0),
        ("/workspace/gone.txt", "deleted", "file", len("bye")),
        ("/workspace/new-name.txt", "created", "file", len("moved")),
        ("/workspace/new.txt", "created", "file", len("hello\n")),
        ("/workspace/old-name.txt", "deleted", "file", len("moved")),
        ("/workspace/sym", "created", "symlink", len("a.txt")),
    ], got
    assert r.files_changed_truncated is False
    assert r.to_dict()["files_changed"][0] == {
        "path": "/workspace/a.txt", "change": "modified", "kind": "file", "bytes": 8,
    }

    # nothing changed: an empty changeset
    r = sb.exec(["cat", "a.txt"])
    assert r.files_changed == [] and r.files_changed_truncated is False
    # /tmp only when asked; [] turns it off
    r = sb.shell("echo x > /tmp/u && echo y > w.txt", files_changed_in=["/tmp"])
    assert [(c.path, c.change) for c in r.files_changed] == [("/tmp/u", "created")]
    r = sb.shell("echo x > /tmp/v && echo y > w2.txt", files_changed_in=["/workspace", "/tmp"])
    assert [(c.path, c.change) for c in r.files_changed] == [("/tmp/v", "created"), ("/workspace/w2.txt", "created")]
    r = sb.shell("echo y > w3.txt", files_changed_in=[])
    assert r.files_changed == []
    with pytest.raises(InvalidRequest) as e:
        sb.exec(["true"], files_changed_in=["/etc"])
    assert e.value.field == "files_changed_in[0]"
    with pytest.raises(TypeError):
        sb.exec(["true"], files_changed_in="/tmp")  # type: ignore[arg-type]
    # streamed, and in a one-shot exec
    res = sb.stream(cmd=["bash", "-c", "echo s > streamed.txt"]).wait()
    assert [(c.path, c.change) for c in res.files_changed] == [("/workspace/streamed.txt", "created")]


def test_one_shot_exec_reports_files_changed(al: Airlock) -> None:
    r = al.shell("echo out > made.txt && mkdir d")
    assert r.ok, r.stderr
    assert [(c.path, c.change, c.kind) for c in r.files_changed] == [
        ("/workspace/d", "created", "dir"),
        ("/workspace/made.txt", "created", "file"),
    ]


def test_many_changes_are_truncated(sb: Sandbox) -> None:
    r = sb.shell("mkdir m && cd m && for i in $(seq 1 1100); do : > f$i; done")
    assert r.ok, r.stderr
    assert r.files_changed_truncated is True
    assert len(r.files_changed) == 1000
    paths = [c.path for c in r.files_changed]
    assert paths == sorted(paths)


def test_list_get_delete(al: Airlock, sb: Sandbox) -> None:
    sb.files.write("a.txt", "one")
    snap = sb.snapshot()
    listed = al.list_snapshots()
    assert isinstance(listed, SnapshotList) and isinstance(listed, list)
    assert snap.snapshot_id in [s.snapshot_id for s in listed]
    assert listed.budget_bytes > 0 and 0 < listed.used_bytes <= listed.budget_bytes
    got = al.get_snapshot(snap.snapshot_id)
    assert got == snap
    assert al.get_snapshot(snap) == snap
    al.delete_snapshot(snap)
    assert snap.snapshot_id not in [s.snapshot_id for s in al.list_snapshots()]
    with pytest.raises(SnapshotNotFound):
        al.get_snapshot(snap)
    with pytest.raises(SnapshotNotFound):
        al.delete_snapshot(snap.snapshot_id)
    # the session it was taken of goes on
    assert sb.exec(["cat", "a.txt"]).stdout == "one"


def test_unknown_snapshot_is_not_found(al: Airlock, sb: Sandbox) -> None:
    unknown = "snap-0123456789abcdef"
    with pytest.raises(SnapshotNotFound) as e:
        al.get_snapshot(unknown)
    assert e.value.status == 404 and e.value.code == "not_found"
    with pytest.raises(SnapshotNotFound):
        sb.restore(unknown)
    with pytest.raises(SnapshotNotFound):
        al.sandbox(from_snapshot=unknown)
    with pytest.raises(SnapshotNotFound):
        al.delete_snapshot(unknown)
    # a 404 naming the sandbox stays SandboxNotFound
    snap = sb.snapshot()
    try:
        gone = Sandbox(al, "0123456789abcdef", None, None)
        with pytest.raises(SandboxNotFound):
            gone.restore(snap)
        with pytest.raises(SandboxNotFound):
            gone.snapshot()
    finally:
        al.delete_snapshot(snap)


def test_full_snapshot_where_the_tier_cannot_is_refused(sb: Sandbox) -> None:
    with pytest.raises(InvalidRequest) as e:
        sb.snapshot(kind="full")
    assert e.value.field == "kind"


@pytest.fixture(scope="module")
def small_budget(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon whose snapshot store holds 64 KiB at most."""
    d = start_daemon(tmp_path_factory.mktemp("small-budget"), "--pool", "1", "--snapshot-budget", "64K")
    yield d
    d.stop()


def test_over_the_budget_is_refused_and_nothing_is_kept(small_budget: Daemon) -> None:
    with Airlock(small_budget.url) as al, al.sandbox() as sb:
        sb.files.write("small.txt", "fits")
        kept = sb.snapshot()
        sb.shell("head -c 1048576 /dev/urandom > big.bin")
        with pytest.raises(SnapshotBudgetExceeded) as e:
            sb.snapshot()
        assert e.value.status == 507 and e.value.code == "snapshot_budget"
        listed = al.list_snapshots()
        assert [s.snapshot_id for s in listed] == [kept.snapshot_id]
        assert listed.budget_bytes == 64 * 1024 and listed.used_bytes <= listed.budget_bytes
        al.delete_snapshot(kept)
        assert al.list_snapshots().used_bytes == 0


def test_a_snapshot_keeps_its_image_and_refuses_another(image_daemon: Daemon, image_store: ImageStore) -> None:
    with Airlock(image_daemon.url) as al, al.sandbox(image=image_store.busybox) as bb:
        bb.files.write("a.txt", "in busybox\n")
        snap = bb.snapshot()
        image = bb.info().image
        assert snap.image == image and snap.image_digest == bb.info().image_digest and image
        try:
            with Sandbox.from_snapshot(al, snap) as child:  # the image comes with it
                info = child.info()
                assert (info.image, info.from_snapshot) == (image, snap.snapshot_id)
                r = child.exec(["sh", "-c", "cat a.txt; test -e /usr/bin/python3 || echo no-python"])
                assert r.stdout == "in busybox\nno-python\n", r
            with al.sandbox(image=image_store.python) as py:
                py.files.write("mine.txt", "kept")
                with pytest.raises(IncompatibleSnapshot) as e:
                    py.restore(snap)
                assert e.value.status == 409 and e.value.code == "incompatible_snapshot"
                assert py.files.read_text("mine.txt") == "kept"  # nothing changed
            with pytest.raises(InvalidRequest) as ei:
                al.sandbox(from_snapshot=snap, image=image_store.python)
            assert ei.value.field == "image"
        finally:
            al.delete_snapshot(snap)


def test_a_store_in_use_by_another_daemon_is_unavailable(tmp_path: Path, daemon: Daemon) -> None:
    """The reason every daemon of these tests has a store of its own: a second daemon on
    the same directory serves everything but snapshots (503, not retried)."""
    store = str(tmp_path / "shared")
    first = start_daemon(tmp_path / "first", "--pool", "0", "--snapshot-dir", store)
    try:
        second = start_daemon(tmp_path / "second", "--pool", "0", "--snapshot-dir", store)
        try:
            with Airlock(second.url) as al:
                t0 = time.monotonic()
                with pytest.raises(SnapshotsUnavailable) as e:
                    al.list_snapshots()
                assert e.value.status == 503 and e.value.code == "snapshots_unavailable"
                assert time.monotonic() - t0 < 5  # not retried
                assert al.health()
        finally:
            second.stop()
        with Airlock(first.url) as al:
            assert al.list_snapshots() == []
    finally:
        first.stop()


def test_paused_session_refuses_a_stream_and_keeps_its_processes(sb: Sandbox) -> None:
    p = sb.processes.start(["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.05; done"])
    time.sleep(0.3)
    sb.pause()
    with pytest.raises(SandboxPaused):
        sb.stream(cmd=["true"]).wait()
    with pytest.raises(SandboxPaused):
        sb.run_code("1")
    frozen = sb.processes.get(p)  # it can be looked at, frozen
    assert frozen.running
    sb.resume()
    first = int(sb.exec(["cat", "/tmp/n"]).stdout)
    time.sleep(0.3)
    assert int(sb.exec(["cat", "/tmp/n"]).stdout) > first  # it goes on after the resume
    assert sb.processes.get(p).running


# --- async ---------------------------------------------------------------------------------


async def atree(sb: AsyncSandbox) -> str:
    r = await sb.shell(TREE)
    assert r.ok, r.stderr
    return r.stdout


@pytest.mark.anyio
async def test_async_snapshot_restore_fork_from_snapshot(url: str) -> None:
    async with AsyncAirlock(url) as al, al.sandbox(ttl_s=300) as sb:
        await sb.files.write("a.txt", "one")
        r = await sb.shell("mkdir -p empty && ln -s a.txt link && echo scratch > /tmp/t")
        assert [(c.path, c.change) for c in r.files_changed] == [
            ("/workspace/empty", "created"), ("/workspace/link", "created"),
        ]
        before = await atree(sb)
        snap = await sb.snapshot()
        assert snap.kind == "filesystem" and snap.sandbox_id == sb.id

        await sb.files.write("a.txt", "changed")
        await sb.files.write("b.txt", "later")
        assert (await sb.restore(snap)).status == "running"
        assert await atree(sb) == before

        async with AsyncSandbox.from_snapshot(al, snap) as child:
            assert await atree(child) == before
            assert (await child.info()).from_snapshot == snap.snapshot_id
        child2 = await al.sandbox(from_snapshot=snap.snapshot_id)
        try:
            assert await atree(child2) == before
        finally:
            await child2.aclose()

        forks = await sb.fork(3)
        try:
            assert len({f.id for f in forks}) == 3 and all(isinstance(f, AsyncSandbox) for f in forks)
            for i, f in enumerate(forks):
                await f.files.write("a.txt", f"fork {i}")
            for i, f in enumerate(forks):
                assert await f.files.read_text("a.txt") == f"fork {i}"
            assert await sb.files.read_text("a.txt") == "one"
        finally:
            for f in forks:
                await f.aclose()


@pytest.mark.anyio
async def test_async_pause_resume_list_get_delete(url: str) -> None:
    async with AsyncAirlock(url) as al, al.sandbox() as sb:
        await sb.files.write("a.txt", "one")
        assert (await sb.pause()).status == "paused"
        with pytest.raises(SandboxPaused):
            await sb.exec(["cat", "a.txt"])
        assert (await sb.resume()).status == "running"
        assert (await sb.exec(["cat", "a.txt"])).stdout == "one"

        snap = await sb.snapshot()
        listed = await al.list_snapshots()
        assert snap.snapshot_id in [s.snapshot_id for s in listed] and listed.budget_bytes > 0
        assert await al.get_snapshot(snap.snapshot_id) == snap
        await al.delete_snapshot(snap)
        with pytest.raises(SnapshotNotFound):
            await al.get_snapshot(snap)
        with pytest.raises(SnapshotNotFound):
            await sb.restore(snap)


# --- the README's example ------------------------------------------------------------------

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_snapshots_example(daemon: Daemon, tmp_path: Path) -> None:
    text = README.read_text()
    section = text[text.index("## Snapshots"):]
    section = section[: section.find("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, blocks
    script = tmp_path / "example.py"
    script.write_text(blocks[0])
    import airlock

    # the SDK under test, not whatever version is installed
    sdk = str(Path(airlock.__file__).resolve().parents[1])
    env = {**os.environ, "AIRLOCK_URL": daemon.url, "PYTHONPATH": sdk}
    env.pop("AIRLOCK_API_KEY", None)
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.stdout == README_OUTPUT, proc.stdout


README_OUTPUT = (
    "[('/workspace/plan.txt', 'created', 'file', 6)]\n"
    "filesystem\n"
    "v1\n"
    "['v1', 'v1', 'v1']\n"
    "draft\n"
    "paused\n"
    "SandboxPaused\n"
    "running\n"
    "True\n"
)


# --- the other tiers -------------------------------------------------------------------------


@pytest.mark.parametrize("tier", ["gvisor", "microvm"])
def test_snapshot_restore_fork_pause_on_tier(al: Airlock, tier: str) -> None:
    """The same calls on the other isolation tiers (the SDK does not care which ran them)."""
    with al.sandbox(isolation=tier, ttl_s=300) as sb:
        sb.files.write("a.txt", "one")
        r = sb.shell("mkdir -p empty && ln -s a.txt link && echo scratch > /tmp/t")
        assert r.ok, r.stderr
        assert [(c.path, c.change, c.kind) for c in r.files_changed] == [
            ("/workspace/empty", "created", "dir"), ("/workspace/link", "created", "symlink"),
        ]
        prepared = tree(sb)
        snap = sb.snapshot()
        assert snap.isolation == tier and snap.kind == "full", snap  # memory too
        sb.files.write("a.txt", "changed")
        sb.shell("rm -r empty /tmp/t && echo new > later.txt")
        assert sb.restore(snap).status == "running"
        assert tree(sb) == prepared
        forks = sb.fork(2)
        try:
            forks[0].files.write("a.txt", "fork 0")
            assert tree(forks[1]) == prepared
            assert sb.files.read_text("a.txt") == "one"
        finally:
            for f in forks:
                f.close()
        with Sandbox.from_snapshot(al, snap) as child:
            assert tree(child) == prepared and child.info().isolation == tier
        assert sb.pause().status == "paused"
        with pytest.raises(SandboxPaused):
            sb.exec(["true"])
        assert sb.resume().status == "running"
        assert sb.exec(["cat", "a.txt"]).stdout == "one"
        al.delete_snapshot(snap)
