"""Images through the SDK and MCP: ``image=`` on run, exec, shell and sandbox (sync and
async), ``SandboxInfo.image``/``image_digest``, an unknown image as ``InvalidRequest`` on
field ``image``, and ``run_code``/``create_sandbox`` with ``image`` over MCP (``airlock mcp
--image-store``, stdio). The images are built from host files (conftest.py's
``image_store``); the daemon serves them from that store."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import AsyncIterator

import anyio
import pytest

from airlock import Airlock, AsyncAirlock, InvalidRequest, Outcome

from conftest import Daemon, ImageStore, airlock_bin, snapshot_dir

PY_PROBE = "import json, os; print(json.dumps([os.environ.get('IMAGE_VAR'), os.getuid(), os.path.exists('/bin/busybox')]))"


def test_run_exec_and_shell_in_an_image(image_daemon: Daemon, image_store: ImageStore) -> None:
    with Airlock(image_daemon.url) as al:
        r = al.run(PY_PROBE, image=image_store.python)
        assert r.outcome is Outcome.EXITED and r.exit_code == 0, r
        assert json.loads(r.stdout) == ["from-image", 1000, True]
        # The host's python3 is not in the busybox image.
        r = al.exec(["sh", "-c", "echo $IMAGE_VAR; test -e /usr/bin/python3 || echo no-python"],
                    image=image_store.busybox, env={"IMAGE_VAR": "mine"})
        assert r.stdout == "mine\nno-python\n", r
        r = al.shell("echo $PATH; pwd", image=image_store.python)
        assert r.stdout == "/usr/bin:/bin\n/workspace\n", r
        # shell() is `bash -c`: an image without bash has no such program.
        r = al.shell("true", image=image_store.busybox)
        assert r.exit_code == 127 and "bash" in r.stderr, r
        r = al.run(PY_PROBE, image=image_store.python, isolation="gvisor")
        assert json.loads(r.stdout) == ["from-image", 1000, True], r


def test_sandbox_in_an_image(image_daemon: Daemon, image_store: ImageStore) -> None:
    with Airlock(image_daemon.url) as al:
        with al.sandbox(image=image_store.python) as sb:
            info = sb.info()
            assert info.image == f"docker.io/{image_store.python}", info
            assert info.image_digest and info.image_digest.startswith("sha256:") and len(info.image_digest) == 71
            sb.files.write("data.txt", "kept\n")
            r = sb.exec(["python3", "-c", "print(open('data.txt').read().strip())"])
            assert r.stdout == "kept\n", r
            sb.exec(["sh", "-c", "echo more > out.txt"])
            assert sb.files.read_text("out.txt") == "more\n"
            listed = [s for s in al.list_sandboxes() if s.id == sb.id]
            assert len(listed) == 1 and listed[0].image == info.image and listed[0].image_digest == info.image_digest
        # A session without an image shows none.
        with al.sandbox() as sb:
            assert sb.info().image is None and sb.info().image_digest is None


def test_an_unknown_image_is_invalid_request_on_field_image(image_daemon: Daemon) -> None:
    with Airlock(image_daemon.url) as al:
        with pytest.raises(InvalidRequest) as e:
            al.run("print(1)", image="nosuch/image:1")
        assert e.value.field == "image" and e.value.code == "invalid_request", e.value
        with pytest.raises(InvalidRequest) as e:
            with al.sandbox(image="nosuch/image:1"):
                pass
        assert e.value.field == "image", e.value


def test_async_image_runs_and_sandboxes(image_daemon: Daemon, image_store: ImageStore) -> None:
    async def go() -> None:
        async with AsyncAirlock(image_daemon.url) as al:
            r = await al.run(PY_PROBE, image=image_store.python)
            assert json.loads(r.stdout) == ["from-image", 1000, True], r
            r = await al.exec(["sh", "-c", "echo $IMAGE_VAR"], image=image_store.busybox)
            assert r.stdout == "from-image\n", r
            r = await al.shell("id -u", image=image_store.python)
            assert r.stdout == "1000\n", r
            async with al.sandbox(image=image_store.busybox) as sb:
                info = await sb.info()
                assert info.image == f"docker.io/{image_store.busybox}" and info.image_digest, info
                await sb.exec(["sh", "-c", "echo kept > f"])
                r = await sb.exec(["cat", "f"])
                assert r.stdout == "kept\n", r
            with pytest.raises(InvalidRequest) as e:
                await al.exec(["true"], image="nosuch/image:1")
            assert e.value.field == "image", e.value

    anyio.run(go)


# ---------------------------------------------------------------------------------------
# MCP
# ---------------------------------------------------------------------------------------


@asynccontextmanager
async def mcp_session(store: ImageStore) -> AsyncIterator[object]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(
        command=str(airlock_bin()), args=["mcp", "--pool", "1", "--image-store", str(store.path), "--snapshot-dir", snapshot_dir()]
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


def test_mcp_run_code_and_create_sandbox_with_an_image(image_store: ImageStore) -> None:
    async def go() -> None:
        async with mcp_session(image_store) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert "image" in tools["run_code"].input_schema["properties"]
            assert "image" in tools["create_sandbox"].input_schema["properties"]
            r = await s.call_tool("run_code", {"language": "python", "code": PY_PROBE, "image": image_store.python})
            assert r.is_error is False, [c.text for c in r.content]
            assert json.loads(r.structured_content["stdout"]) == ["from-image", 1000, True]
            r = await s.call_tool("run_code", {"language": "bash", "code": "echo $PATH", "image": image_store.python})
            assert r.is_error is False and r.structured_content["stdout"] == "/usr/bin:/bin\n", r
            bad = await s.call_tool("run_code", {"language": "bash", "code": "true", "image": "nosuch/image:1"})
            assert bad.is_error is True and "image" in " ".join(c.text for c in bad.content), bad
            created = await s.call_tool("create_sandbox", {"image": image_store.python})
            assert created.is_error is False, [c.text for c in created.content]
            sid = created.structured_content["sandbox_id"]
            r = await s.call_tool("exec", {"sandbox_id": sid, "cmd": ["python3", "-c", PY_PROBE]})
            assert json.loads(r.structured_content["stdout"]) == ["from-image", 1000, True], r
            closed = await s.call_tool("close_sandbox", {"sandbox_id": sid})
            assert closed.is_error is False

    anyio.run(go)
