"""The client's retry and timeout policy, unit-tested with httpx's MockTransport (the
wire-level behaviour against a real daemon is in test_errors.py). These cover the cases a
real daemon cannot be made to produce on demand: a connection broken mid-request."""

from __future__ import annotations

import json
import time
from typing import Callable

import httpx
import pytest

from airlock import (
    Airlock,
    AirlockConnectionError,
    AirlockTimeout,
    AsyncAirlock,
    Limits,
    RateLimited,
    ServiceUnavailable,
)
from airlock._core import SSEParser

RESULT = {
    "id": "x", "outcome": "exited", "exit_code": 0, "signal": None, "timed_out": False,
    "oom_killed": False, "stdout": "ok\n", "stderr": "", "stdout_truncated": False,
    "stderr_truncated": False, "stdout_bytes": 3, "stderr_bytes": 0, "wall_ms": 1.0,
    "setup_ms": 1.0, "cpu_ms": 1.0, "memory_peak_bytes": 1, "egress": [], "queue_ms": 0.0,
}


def client(handler: Callable[[httpx.Request], httpx.Response], **kw: object) -> tuple[Airlock, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def wrapped(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    http = httpx.Client(transport=httpx.MockTransport(wrapped))
    kw.setdefault("backoff", 0.001)
    return Airlock("http://airlock.test", http_client=http, **kw), seen  # type: ignore[arg-type]


def error(status: int, code: str, retry_after: str | None = None) -> httpx.Response:
    headers = {"retry-after": retry_after} if retry_after else {}
    return httpx.Response(status, json={"error": {"code": code, "message": code}}, headers=headers)


def test_exec_is_not_retried_after_a_broken_connection() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.")

    al, seen = client(handler, max_retries=3)
    with pytest.raises(AirlockConnectionError):
        al.run("print(1)")
    assert len(seen) == 1  # it may have run: never repeated
    with pytest.raises(AirlockConnectionError):
        al.sandbox()  # creating a session is not idempotent either
    assert len(seen) == 2


def test_exec_is_not_retried_after_a_read_timeout() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out")

    al, seen = client(handler, max_retries=3)
    with pytest.raises(AirlockTimeout):
        al.exec(["true"])
    assert len(seen) == 1


def test_connect_errors_are_retried_for_every_request() -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] < 3:
            raise httpx.ConnectError("connection refused")
        return httpx.Response(200, json=RESULT)

    al, seen = client(handler, max_retries=2)
    assert al.run("print(1)").stdout == "ok\n"
    assert len(seen) == 3


def test_idempotent_requests_are_retried_after_a_broken_connection() -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            raise httpx.ReadError("connection reset")
        return httpx.Response(200, content=b"data")

    from airlock import Sandbox

    al, seen = client(handler, max_retries=2)
    assert Sandbox(al, "abc", None, None).files.read("f") == b"data"
    assert [r.method for r in seen] == ["GET", "GET"]


def test_429_is_retried_honoring_retry_after() -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            return error(429, "queue_timeout", "0.2")
        return httpx.Response(200, json=RESULT)

    al, seen = client(handler, max_retries=2)
    t0 = time.monotonic()
    assert al.run("print(1)").ok
    assert time.monotonic() - t0 >= 0.2
    assert len(seen) == 2


def test_429_retries_are_bounded_and_raise_with_retry_after() -> None:
    al, seen = client(lambda r: error(429, "queue_full", "0"), max_retries=2)
    with pytest.raises(RateLimited) as ei:
        al.run("1")
    assert len(seen) == 3 and ei.value.retry_after == 0.0 and ei.value.code == "queue_full"


def test_503_is_not_retried_for_an_exec_but_is_for_the_rest() -> None:
    al, seen = client(lambda r: error(503, "shutting_down"), max_retries=2)
    with pytest.raises(ServiceUnavailable):
        al.run("1")
    assert len(seen) == 1
    with pytest.raises(ServiceUnavailable):
        al.sandbox()
    assert len(seen) == 4  # 1 + (1 + 2 retries)


def test_max_retries_zero() -> None:
    al, seen = client(lambda r: error(429, "queue_timeout", "0"), max_retries=0)
    with pytest.raises(RateLimited):
        al.run("1")
    assert len(seen) == 1


def test_exec_timeout_is_the_request_timeout_plus_margin() -> None:
    timeouts: list[dict[str, float]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        timeouts.append(request.extensions["timeout"])
        if request.url.path == "/v1/sandboxes":
            return httpx.Response(201, json={"id": "s1", "expires_at": 0})
        if request.url.path == "/readyz":
            return httpx.Response(
                503,
                json={"ready": False, "pool_ready": 0, "pool_target": 2, "stopping": True, "sandboxes_active": 0},
            )
        return httpx.Response(200, json=RESULT)

    al, _ = client(handler, timeout_margin=7, timeout=3, connect_timeout=2)
    al.run("1", limits=Limits(timeout_ms=120_000))
    al.run("1")
    sb = al.sandbox(limits=Limits(timeout_ms=50_000))
    sb.run("1")
    sb.run("1", limits=Limits(timeout_ms=1_000))
    assert al.ready().stopping  # a 503 from /readyz is an answer, not an error
    reads = [t["read"] for t in timeouts]
    assert reads == [127.0, 17.0, 3.0, 57.0, 8.0, 3.0]
    assert all(t["connect"] == 2 for t in timeouts)


def test_request_shape_and_auth() -> None:
    bodies: list[dict[str, object]] = []
    headers: list[httpx.Headers] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        headers.append(request.headers)
        return httpx.Response(200, json=RESULT)

    al, _ = client(handler, api_key="k" * 20)
    from airlock import File, Network

    al.exec(
        ["python3", "main.py"],
        files={"main.py": "print(1)", "b.bin": b"\x00", "x.sh": File("echo", mode=0o755)},
        env={"A": "1"},
        stdin="in",
        limits=Limits(memory_bytes=1 << 27, timeout_ms=2000),
        network=Network.proxy(allow=["pypi.org"]),
    )
    assert bodies[0] == {
        "cmd": ["python3", "main.py"],
        "stdin": "in",
        "files": [
            {"path": "main.py", "content": "print(1)"},
            {"path": "b.bin", "content": "AA==", "encoding": "base64"},
            {"path": "x.sh", "content": "echo", "mode": 0o755},
        ],
        "env": {"A": "1"},
        "limits": {"memory_bytes": 1 << 27, "timeout_ms": 2000},
        "network": {"mode": "proxy", "allow": ["pypi.org"], "allow_cidrs": []},
    }
    assert headers[0]["authorization"] == "Bearer " + "k" * 20
    assert headers[0]["content-type"] == "application/json"
    al.run("print(1)")
    assert bodies[1] == {"language": "python", "code": "print(1)"}


def test_unknown_result_fields_are_kept() -> None:
    al, _ = client(lambda r: httpx.Response(200, json={**RESULT, "outcome": "frozen", "new_field": 1}))
    r = al.run("1")
    assert r.extra == {"new_field": 1} and r.outcome == "frozen"


def test_sse_parser() -> None:
    p = SSEParser()
    lines = [": keep-alive", "event: stdout", "data: {\"data\":", "data: \"a\"}", "", "", "event: result\r", "data:x", ""]
    out = [ev for ev in (p.feed(line) for line in lines) if ev]
    assert out == [("stdout", '{"data":\n"a"}'), ("result", "x")]


@pytest.mark.anyio
async def test_async_retry_policy() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) == 1:
            return error(429, "queue_timeout", "0.1")
        if request.url.path == "/v1/exec" and len(seen) == 3:
            raise httpx.RemoteProtocolError("gone")
        return httpx.Response(200, json=RESULT)

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    async with AsyncAirlock("http://airlock.test", http_client=http, backoff=0.001) as al:
        assert (await al.run("1")).ok
        assert len(seen) == 2
        with pytest.raises(AirlockConnectionError):
            await al.run("1")
        assert len(seen) == 3
    await http.aclose()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    "status, code, expected",
    [
        (400, "invalid_request", "InvalidRequest"),
        (400, "malformed_json", "InvalidRequest"),
        (401, "unauthorized", "Unauthorized"),
        (404, "not_found", "SandboxNotFound"),
        (409, "busy", "SandboxConflict"),
        (410, "expired", "SandboxExpired"),
        (413, "body_too_large", "PayloadTooLarge"),
        (415, "unsupported_media_type", "UnsupportedMediaType"),
        (429, "queue_full", "RateLimited"),
        (500, "sandbox_error", "ServerError"),
        (502, "bad_gateway", "ServerError"),
        (503, "shutting_down", "ServiceUnavailable"),
        (418, "teapot", "AirlockError"),
    ],
)
def test_every_status_maps_to_its_exception(status: int, code: str, expected: str) -> None:
    import airlock

    al, _ = client(lambda r: error(status, code), max_retries=0)
    with pytest.raises(airlock.AirlockError) as ei:
        al.get_sandbox("x")
    assert type(ei.value).__name__ == expected
    assert ei.value.status == status and ei.value.code == code


@pytest.mark.parametrize(
    "code, expected",
    [("queue_timeout", "RateLimited"), ("shutting_down", "ServiceUnavailable"), ("internal", "ServerError"), ("busy", "SandboxConflict")],
)
def test_stream_error_events_map_to_exceptions(code: str, expected: str) -> None:
    body = (
        'event: stdout\ndata: {"data":"partial\\n"}\n\n'
        f'event: error\ndata: {{"error":{{"code":"{code}","message":"m","field":null}}}}\n\n'
    )
    al, _ = client(lambda r: httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"}))
    s = al.stream("print(1)")
    first = next(s)
    assert first.data == "partial\n"  # type: ignore[union-attr]
    with pytest.raises(Exception) as ei:
        next(s)
    assert type(ei.value).__name__ == expected and ei.value.code == code  # type: ignore[attr-defined]
