"""The asynchronous client against a real daemon (run with anyio's pytest plugin, which
comes with httpx)."""

from __future__ import annotations

import asyncio
import time

import pytest

from airlock import (
    AsyncAirlock,
    AsyncSandbox,
    ExecResult,
    FileEntry,
    FileNotFound,
    InvalidRequest,
    Limits,
    Outcome,
    ResultEvent,
    SandboxExpired,
    SandboxNotFound,
    StderrEvent,
    StdoutEvent,
)

pytestmark = pytest.mark.anyio


async def test_run_and_exec(url: str) -> None:
    async with AsyncAirlock(url) as al:
        r = await al.run("print(6*7)")
        assert isinstance(r, ExecResult) and r.stdout == "42\n" and r.outcome is Outcome.EXITED
        r = await al.exec(["cat", "f.bin"], files={"f.bin": b"\x01\x02"}, limits=Limits(timeout_ms=2000))
        assert r.stdout_bytes == 2
        r = await al.shell("echo $X", env={"X": "y"})
        assert r.stdout == "y\n"


async def test_concurrent_runs(url: str) -> None:
    async with AsyncAirlock(url) as al:
        results = await asyncio.gather(*(al.run(f"print({i} * 2)") for i in range(8)))
        assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(8)]
        assert len({r.id for r in results}) == 8


async def test_sandbox_context_manager(url: str) -> None:
    async with AsyncAirlock(url) as al:
        async with al.sandbox(ttl_s=120) as sb:
            assert isinstance(sb, AsyncSandbox)
            await sb.files.write("data.csv", b"a,b\n1,2\n")
            await sb.files.write("bin/t.sh", "#!/bin/sh\necho t\n", mode=0o700)
            assert await sb.files.read("data.csv") == b"a,b\n1,2\n"
            assert await sb.files.read_text("bin/t.sh") == "#!/bin/sh\necho t\n"
            entries = await sb.files.list()
            assert all(isinstance(e, FileEntry) for e in entries)
            assert {e.path for e in entries} >= {"data.csv", "bin", "bin/t.sh"}
            r = await sb.run("print(len(open('data.csv').readlines()))")
            assert r.stdout == "2\n"
            r = await sb.exec(["bin/t.sh"])
            assert r.stdout == "t\n"
            r = await sb.shell("echo made > out.txt")
            assert await sb.files.read("out.txt") == b"made\n"
            info = await sb.info()
            assert info.usage.execs == 3
            assert sb.id in [s.id for s in await al.list_sandboxes()]
            with pytest.raises(FileNotFound):
                await sb.files.read("nope")
        with pytest.raises(SandboxNotFound):
            await al.get_sandbox(sb.id)


async def test_sandbox_awaited(url: str) -> None:
    async with AsyncAirlock(url) as al:
        sb = await al.sandbox()
        try:
            assert (await sb.run("print('x')")).stdout == "x\n"
            assert (await al.get_sandbox(sb.id)).id == sb.id
        finally:
            await sb.delete()
        await sb.aclose()  # already deleted: no error


async def test_stream(url: str) -> None:
    async with AsyncAirlock(url) as al:
        events = [ev async for ev in al.stream("import sys\nprint(1)\nprint(2, file=sys.stderr)")]
        assert isinstance(events[-1], ResultEvent)
        assert "".join(e.data for e in events if isinstance(e, StdoutEvent)) == "1\n"
        assert "".join(e.data for e in events if isinstance(e, StderrEvent)) == "2\n"

        t0 = time.monotonic()
        stamps = []
        async with al.stream(cmd=["bash", "-c", "echo a; sleep 1; echo b"]) as s:
            async for ev in s:
                stamps.append((time.monotonic() - t0, ev))
        assert s.result is not None and s.result.stdout == "a\nb\n"
        first = next(t for t, e in stamps if isinstance(e, StdoutEvent))
        last = stamps[-1][0]
        assert last - first > 0.5

        assert (await al.stream("print(3)").wait()).stdout == "3\n"

        async with al.sandbox() as sb:
            await sb.files.write("x", "41")
            res = await sb.stream("print(int(open('x').read()) + 1)").wait()
            assert res.stdout == "42\n"


async def test_stream_error_before_start(url: str) -> None:
    async with AsyncAirlock(url) as al:
        with pytest.raises(InvalidRequest) as ei:
            async for _ in al.stream(cmd=["true"], limits={"cpus": 0}):
                pass
        assert ei.value.field == "limits.cpus"


async def test_command_not_found_is_a_result_with_exit_127(url: str) -> None:
    async with AsyncAirlock(url) as al:
        res = await al.stream(cmd=["no-such-program"]).wait()
        assert res.exit_code == 127 and res.outcome == "exited"
        assert "no-such-program: command not found" in res.stderr


async def test_expired(url: str) -> None:
    async with AsyncAirlock(url) as al:
        sb = await al.sandbox(ttl_s=1)
        await asyncio.sleep(1.6)
        with pytest.raises(SandboxExpired) as ei:
            await sb.run("print(1)")
        assert ei.value.status == 410 and ei.value.code == "expired"
        await sb.aclose()
