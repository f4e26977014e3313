"""The synchronous client against a real daemon: one-shot execs, sessions, files,
streaming, operations; results typed and matching the API."""

from __future__ import annotations

import dataclasses
import time

import httpx
import pytest

from airlock import (
    Airlock,
    DiskFull,
    EgressEntry,
    ExecResult,
    File,
    FileEntry,
    FileNotFound,
    Limits,
    Network,
    Outcome,
    Readiness,
    ResultEvent,
    SandboxInfo,
    SandboxNotFound,
    StderrEvent,
    StdoutEvent,
)


def test_run_python(al: Airlock) -> None:
    r = al.run("print(6*7)", language="python")
    assert isinstance(r, ExecResult)
    assert r.stdout == "42\n"
    assert r.stderr == ""
    assert r.exit_code == 0
    assert r.outcome is Outcome.EXITED and r.outcome == "exited"
    assert r.ok and r.shell_status == 0
    assert isinstance(r.memory_peak_bytes, int) and r.memory_peak_bytes > 0
    assert isinstance(r.queue_ms, float) and r.queue_ms >= 0
    assert isinstance(r.wall_ms, float) and isinstance(r.setup_ms, float)
    assert r.egress == []
    assert r.stdout_bytes == 3 and not r.stdout_truncated
    assert r.extra == {}


def test_result_matches_the_api(al: Airlock, daemon) -> None:
    """Every field of the API's ExecResult schema is a typed field here, and the raw JSON
    round-trips through the dataclass."""
    doc = al.openapi()
    required = doc["components"]["schemas"]["ExecResult"]["required"]
    names = {f.name for f in dataclasses.fields(ExecResult)}
    assert set(required) <= names, set(required) - names
    egress_required = doc["components"]["schemas"]["EgressEntry"]["required"]
    assert set(egress_required) == {f.name for f in dataclasses.fields(EgressEntry)}
    raw = httpx.post(daemon.url + "/v1/exec", json={"language": "bash", "code": "echo hi; exit 3"}).json()
    r = ExecResult.from_dict(raw)
    assert r.to_dict() == raw
    assert r.exit_code == 3 and r.stdout == "hi\n"


def test_languages(al: Airlock) -> None:
    assert al.run("console.log(6*7)", language="javascript").stdout == "42\n"
    assert al.run("echo $((6*7))", language="bash").stdout == "42\n"


def test_exec_with_everything(al: Airlock) -> None:
    r = al.exec(
        ["bash", "-c", 'cat; echo " $GREETING"; od -An -tx1 blob.bin; stat -c %a run.sh; ./run.sh; cat dir/t.txt'],
        files={
            "blob.bin": b"\x00\xff\x10",
            "run.sh": File("#!/bin/sh\necho ran\n", mode=0o755),
            "dir/t.txt": "text ✓",
        },
        env={"GREETING": "hello"},
        stdin="from stdin",
        limits=Limits(memory_bytes=64 * 1024 * 1024, timeout_ms=5_000, pids=32, output_bytes=4096),
    )
    assert r.ok, r
    lines = r.stdout.splitlines()
    assert lines[0] == "from stdin hello"
    assert lines[1].split() == ["00", "ff", "10"]
    assert lines[2] == "755"
    assert lines[3] == "ran"
    assert lines[4] == "text ✓"


def test_stdin_bytes_and_limits_dict(al: Airlock) -> None:
    r = al.exec(["cat"], stdin=b"raw", limits={"timeout_ms": 2000})
    assert r.stdout == "raw"


def test_shell(al: Airlock) -> None:
    r = al.shell("echo a | tr a b; echo err >&2; exit 4")
    assert r.stdout == "b\n" and r.stderr == "err\n"
    assert r.exit_code == 4 and not r.ok and r.shell_status == 4
    assert r.output == "b\nerr\n"


def test_exec_rejects_a_string_cmd(al: Airlock) -> None:
    with pytest.raises(TypeError, match="argv"):
        al.exec("ls -l")  # type: ignore[arg-type]


def test_timeout_is_a_result(al: Airlock) -> None:
    t0 = time.monotonic()
    r = al.exec(["sleep", "10"], limits=Limits(timeout_ms=300))
    assert time.monotonic() - t0 < 5
    assert r.outcome is Outcome.TIMEOUT and r.timed_out
    assert r.exit_code is None and r.signal == 9
    assert r.shell_status == 124


def test_oom_is_a_result(al: Airlock) -> None:
    r = al.run(
        "x = []\nwhile True: x.append(bytearray(10**6))",
        limits=Limits(memory_bytes=32 * 1024 * 1024, timeout_ms=10_000),
    )
    assert r.outcome is Outcome.OOM and r.oom_killed
    assert r.shell_status == 137


def test_output_truncation(al: Airlock) -> None:
    r = al.run("print('x' * 10000)", limits=Limits(output_bytes=100))
    assert r.stdout_truncated and len(r.stdout) == 100 and r.stdout_bytes == 10001


def test_network_proxy_reports_egress(al: Airlock) -> None:
    """A denied name is refused by policy before any lookup: nothing leaves the host."""
    code = (
        "import urllib.request\n"
        "try:\n"
        "    urllib.request.urlopen('http://blocked.invalid/', timeout=5)\n"
        "except Exception as e:\n"
        "    print(e)\n"
    )
    r = al.run(code, network=Network.proxy(allow=["allowed.invalid"]))
    assert "403" in r.stdout
    assert len(r.egress) == 1
    e = r.egress[0]
    assert isinstance(e, EgressEntry)
    assert e.host == "blocked.invalid" and e.port == 80 and e.allowed is False
    assert e.reason == "not in allowlist"


def test_network_none_is_explicit(al: Airlock) -> None:
    r = al.run("import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=1)\nexcept OSError as e:\n    print('no network')", network=Network.none())
    assert r.stdout == "no network\n"
    assert r.egress == []


def test_sandbox_session(al: Airlock) -> None:
    with al.sandbox(ttl_s=600) as sb:
        assert isinstance(sb.id, str) and sb.expires_at and sb.expires_at > time.time()
        sb.files.write("data.csv", b"a,b\n1,2\n")
        sb.files.write("sub/dir/note.txt", "hello ✓")
        sb.files.write("tool.sh", "#!/bin/sh\necho tool\n", mode=0o755)
        assert sb.files.read("data.csv") == b"a,b\n1,2\n"
        assert sb.files.read("/workspace/data.csv") == b"a,b\n1,2\n"
        assert sb.files.read_text("sub/dir/note.txt") == "hello ✓"
        listing = sb.files.list()
        assert all(isinstance(e, FileEntry) for e in listing)
        by_path = {e.path: e for e in listing}
        assert by_path["data.csv"].size == 8 and not by_path["data.csv"].dir
        assert by_path["sub"].dir and by_path["sub/dir/note.txt"].size == len("hello ✓".encode())
        assert by_path["tool.sh"].mode == 0o755

        r = sb.exec(["wc", "-l", "data.csv"])
        assert r.stdout.split()[0] == "2" and r.id == sb.id
        r = sb.run("open('out.txt', 'w').write('made inside')\nprint(open('data.csv').read().count(','))")
        assert r.stdout == "2\n"
        assert sb.files.read("out.txt") == b"made inside"
        assert sb.shell("./tool.sh && cat /tmp/x 2>/dev/null || echo none").stdout == "tool\nnone\n"
        sb.shell("echo kept > /tmp/x")
        assert sb.exec(["cat", "/tmp/x"]).stdout == "kept\n"
        r = sb.exec(["cat"], stdin="in", files={"f.txt": "file"}, env={"A": "1"})
        assert r.stdout == "in" and sb.files.read("f.txt") == b"file"

        info = sb.info()
        assert isinstance(info, SandboxInfo) and info.id == sb.id and info.usage.execs >= 6
        assert sb.id in [s.id for s in al.list_sandboxes()]
        again = al.get_sandbox(sb.id)
        assert again.files.read("out.txt") == b"made inside"

        with pytest.raises(FileNotFound) as ei:
            sb.files.read("missing.txt")
        assert ei.value.status == 404 and ei.value.code == "not_found"
    # deleted on exit
    with pytest.raises(SandboxNotFound):
        al.get_sandbox(sb.id)
    sb.close()  # idempotent


def test_a_file_beyond_the_disk_is_disk_full_and_the_sandbox_still_works(al: Airlock) -> None:
    # Issue 12, item 7: a failed upload left every later request with a stale error.
    mib = 1024 * 1024
    sb = al.sandbox(ttl_s=60, limits=Limits(disk_bytes=4 * mib))
    try:
        with pytest.raises(DiskFull) as e:
            sb.files.write("big.bin", b"x" * (6 * mib))
        assert e.value.status == 507 and e.value.code == "disk_full"
        assert "the sandbox's disk (4 MiB) has no room for file 'big.bin' (6 MiB)" in str(e.value)
        sb.files.write("a.bin", b"a" * (3 * mib))
        with pytest.raises(DiskFull, match="of it is free"):
            sb.files.write("b.bin", b"b" * (2 * mib))
        sb.files.write("note.txt", "still here")
        assert sb.files.read("note.txt") == b"still here"
        assert sorted(f.path for f in sb.files.list()) == ["a.bin", "note.txt"]
        assert sb.exec(["sh", "-c", "wc -c < a.bin"]).stdout == f"{3 * mib}\n"
    finally:
        sb.delete()


def test_sandbox_limits_and_delete(al: Airlock) -> None:
    sb = al.sandbox(ttl_s=60, limits=Limits(memory_bytes=128 * 1024 * 1024, timeout_ms=500))
    try:
        r = sb.exec(["sleep", "5"])
        assert r.outcome is Outcome.TIMEOUT
        r = sb.exec(["sleep", "1"], limits=Limits(timeout_ms=3000))
        assert r.ok
    finally:
        sb.delete()
    with pytest.raises(SandboxNotFound):
        sb.delete()


def test_stream_events_then_result(al: Airlock) -> None:
    events = list(al.stream("import sys\nfor i in range(3): print(i, flush=True)\nprint('e', file=sys.stderr)"))
    assert isinstance(events[-1], ResultEvent)
    assert all(isinstance(e, (StdoutEvent, StderrEvent)) for e in events[:-1])
    out = "".join(e.data for e in events if isinstance(e, StdoutEvent))
    err = "".join(e.data for e in events if isinstance(e, StderrEvent))
    assert out == "0\n1\n2\n" and err == "e\n"
    result = events[-1].result
    assert result.stdout == out and result.ok


def test_stream_delivers_output_before_the_end(al: Airlock) -> None:
    seen: list[tuple[float, object]] = []
    t0 = time.monotonic()
    with al.stream(cmd=["bash", "-c", "echo first; sleep 1; echo second"]) as s:
        for ev in s:
            seen.append((time.monotonic() - t0, ev))
    first_at = next(t for t, e in seen if isinstance(e, StdoutEvent) and "first" in e.data)
    result_at = next(t for t, e in seen if isinstance(e, ResultEvent))
    assert result_at - first_at > 0.5, seen
    assert s.result is not None and s.result.stdout == "first\nsecond\n"


def test_stream_wait_and_early_close(al: Airlock) -> None:
    assert al.stream("print(1)").wait().stdout == "1\n"
    s = al.stream(cmd=["bash", "-c", "echo go; sleep 30"], limits=Limits(timeout_ms=60_000))
    t0 = time.monotonic()
    with s:
        first = next(s)
        assert isinstance(first, StdoutEvent) and first.data == "go\n"
    assert time.monotonic() - t0 < 10
    assert list(s) == []


def test_stream_in_sandbox(al: Airlock) -> None:
    with al.sandbox() as sb:
        sb.files.write("n.txt", "5")
        events = list(sb.stream("print(int(open('n.txt').read()) * 2)"))
        assert events[0] == StdoutEvent("10\n")
        assert isinstance(events[-1], ResultEvent) and events[-1].result.id == sb.id
        events = list(sb.stream(cmd=["cat", "n.txt"]))
        assert events[-1].result.stdout == "5"


def test_operations(al: Airlock) -> None:
    assert al.health() is True
    ready = al.ready()
    assert isinstance(ready, Readiness) and ready.ready and ready.pool_target == 2
    assert "airlock_exec_total" in al.metrics()
    assert al.openapi()["openapi"].startswith("3.")


def test_health_of_nothing() -> None:
    with Airlock("http://127.0.0.1:9", max_retries=0) as dead:
        assert dead.health() is False


def test_env_defaults(monkeypatch: pytest.MonkeyPatch, daemon) -> None:
    monkeypatch.setenv("AIRLOCK_URL", daemon.url)
    with Airlock() as client:
        assert client.base_url == daemon.url
        assert client.run("print(1)").stdout == "1\n"


def test_memory_above_the_default_cap(al: Airlock) -> None:
    r = al.run("print(1)", limits=Limits(memory_bytes=512 * 1024 * 1024))
    assert r.ok
    with al.sandbox(limits=Limits(memory_bytes=512 * 1024 * 1024)) as sb:
        assert sb.run("print(1)").ok


def test_microvm_isolation_runs_under_the_guest_kernel(al: Airlock) -> None:
    # A micro-VM is booted for the request (seconds under software emulation).
    with open("/proc/sys/kernel/osrelease") as f:
        host_kernel = f.read().strip()
    r = al.exec(["cat", "/proc/sys/kernel/osrelease"], isolation="microvm",
                limits={"timeout_ms": 60_000})
    assert r.ok, r
    assert r.stdout.strip() and r.stdout.strip() != host_kernel, r
    assert r.id.startswith("vm-"), r


def test_a_microvm_session_keeps_its_files(al: Airlock) -> None:
    # A micro-VM is booted for the session (seconds under software emulation).
    with al.sandbox(isolation="microvm", limits={"timeout_ms": 60_000}) as sb:
        info = next(i for i in al.list_sandboxes() if i.id == sb.id)
        assert info.isolation == "microvm", info
        assert sb.exec(["sh", "-c", "echo kept > /workspace/f"]).ok
        r = sb.exec(["cat", "/workspace/f"])
        assert r.ok and r.stdout == "kept\n", r


def test_gvisor_isolation_runs_under_the_user_space_kernel(al: Airlock) -> None:
    # gVisor's Sentry answers uname with its own kernel version, not the host's.
    with open("/proc/sys/kernel/osrelease") as f:
        host_kernel = f.read().strip()
    r = al.run("import os; print(os.uname().release)", isolation="gvisor")
    assert r.ok, r
    assert r.stdout.strip() and r.stdout.strip() != host_kernel, r
    assert r.id.startswith("gv-"), r
    assert r.isolation == "gvisor" and r.platform, r


def test_a_gvisor_session_keeps_its_files(al: Airlock) -> None:
    with al.sandbox(isolation="gvisor") as sb:
        info = next(i for i in al.list_sandboxes() if i.id == sb.id)
        assert info.isolation == "gvisor", info
        sb.files.write("notes/a.txt", "kept\n")
        assert sb.exec(["sh", "-c", "cat notes/a.txt > /workspace/b.txt"]).ok
        assert sb.files.read("b.txt") == b"kept\n"


def test_a_bad_isolation_names_the_field(al: Airlock) -> None:
    from airlock import InvalidRequest

    with pytest.raises(InvalidRequest) as ei:
        al.run("print(1)", isolation="vm")
    assert ei.value.field == "isolation", ei.value
