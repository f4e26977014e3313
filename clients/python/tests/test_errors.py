"""Each exception type from a real server response, and the retry policy observed on the
wire (429 retried honoring Retry-After; an exec never repeated once it may have run)."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import httpx
import pytest

from airlock import (
    Airlock,
    AirlockConnectionError,
    AirlockError,
    AsyncAirlock,
    GvisorUnavailable,
    InvalidRequest,
    IsolationUnavailable,
    Limits,
    MicroVmUnavailable,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    SandboxExpired,
    SandboxNotFound,
    Sandbox,
    ServiceUnavailable,
    SessionQuotaExceeded,
    Unauthorized,
    UnsupportedMediaType,
)

from conftest import API_KEY, Daemon, start_daemon


class Recorder:
    """An httpx client whose event hooks record every request and response status."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.statuses: list[int] = []
        self.times: list[float] = []
        self.client = httpx.Client(
            event_hooks={"request": [self._request], "response": [self._response]}
        )

    def _request(self, request: httpx.Request) -> None:
        self.sent.append(f"{request.method} {request.url.path}")

    def _response(self, response: httpx.Response) -> None:
        self.statuses.append(response.status_code)
        self.times.append(time.monotonic())


# --- 400 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda al: al.run("1", limits=Limits(memory_bytes=1 << 50)), "limits.memory_bytes"),
        (lambda al: al.run("1", language="ruby"), "language"),
        (lambda al: al.exec(["true"], files={"../escape": "x"}), "files[0].path"),
        (lambda al: al.exec(["true"], limits=Limits(cpus=0)), "limits.cpus"),
        (lambda al: al.sandbox(ttl_s=0), "ttl_s"),
    ],
)
def test_invalid_request_names_the_field(al: Airlock, call: Any, field: str) -> None:
    with pytest.raises(InvalidRequest) as ei:
        call(al)
    e = ei.value
    assert e.status == 400 and e.code == "invalid_request"
    assert e.field == field, e
    assert e.message and field in str(e)


def test_command_not_found_is_a_result_with_exit_127(al: Airlock) -> None:
    res = al.exec(["no-such-program-here"])
    assert res.exit_code == 127 and res.outcome == "exited" and res.signal is None
    assert "no-such-program-here: command not found" in res.stderr
    with al.sandbox() as sb:
        res = sb.exec(["/etc/passwd"])
        assert res.exit_code == 126 and "not an executable file" in res.stderr


def test_invalid_request_on_files(al: Airlock) -> None:
    with al.sandbox() as sb:
        with pytest.raises(InvalidRequest) as ei:
            sb.files.write("../outside", b"x")
        assert ei.value.field == "path"
        with pytest.raises(InvalidRequest) as ei:
            sb.files.write("ok.txt", b"x", mode=0o7777)
        assert ei.value.field == "mode"


def test_unknown_field_from_the_server(daemon: Daemon) -> None:
    """The server names an unknown field; the SDK surfaces it (sent by hand here, since
    the SDK only sends fields it knows)."""
    al = Airlock(daemon.url)
    with pytest.raises(InvalidRequest) as ei:
        al._send("POST", "/v1/exec", json={"cmd": ["true"], "bogus": 1})
    assert ei.value.field == "bogus"
    with pytest.raises(UnsupportedMediaType) as ei2:
        al._send("POST", "/v1/exec", content=b"{")  # sent as application/octet-stream
    assert ei2.value.status == 415 and ei2.value.code == "unsupported_media_type"
    with pytest.raises(NotFound) as ei3:
        al._send("GET", "/v1/no-such-route")
    assert type(ei3.value) is NotFound and ei3.value.message == "no such route"


# --- 401 ---------------------------------------------------------------------------------


def test_unauthorized(strict: Daemon) -> None:
    for key in (None, "wrong-key-wrong-key-wrong"):
        with Airlock(strict.url, api_key=key) as al:
            with pytest.raises(Unauthorized) as ei:
                al.run("print(1)")
            assert ei.value.status == 401 and ei.value.code == "unauthorized"
            with pytest.raises(Unauthorized):
                al.list_sandboxes()
            assert al.health()  # /healthz needs no key
    with Airlock(strict.url, api_key=API_KEY) as al:
        assert al.run("print(1)").stdout == "1\n"


def test_api_key_from_env(strict: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRLOCK_API_KEY", API_KEY)
    with Airlock(strict.url) as al:
        assert al.list_sandboxes() == []


# --- 404 / 410 ---------------------------------------------------------------------------


def test_sandbox_not_found(al: Airlock) -> None:
    with pytest.raises(SandboxNotFound) as ei:
        al.get_sandbox("0000000000000000")
    assert ei.value.status == 404 and ei.value.code == "not_found"
    sb = Sandbox(al, "0000000000000000", None, None)
    for call in (
        lambda: sb.run("1"),
        lambda: sb.files.read("x"),
        lambda: sb.files.write("x", b""),
        lambda: sb.files.list(),
        lambda: sb.delete(),
    ):
        with pytest.raises(SandboxNotFound):
            call()
    assert issubclass(SandboxNotFound, NotFound)


def test_sandbox_expired(al: Airlock) -> None:
    sb = al.sandbox(ttl_s=1)
    time.sleep(1.6)
    for call in (lambda: sb.run("print(1)"), lambda: sb.files.read("x"), lambda: sb.info()):
        with pytest.raises(SandboxExpired) as ei:
            call()
        assert ei.value.status == 410 and ei.value.code == "expired"
    sb.close()  # gone already: no error


# --- 413 ---------------------------------------------------------------------------------


def test_payload_too_large(strict: Daemon) -> None:
    with Airlock(strict.url, api_key=API_KEY) as al:
        with pytest.raises(PayloadTooLarge) as ei:
            al.exec(["true"], files={"big.bin": b"x" * 64 * 1024})
        assert ei.value.status == 413 and ei.value.code == "body_too_large"
        with al.sandbox() as sb:
            with pytest.raises(PayloadTooLarge):
                sb.files.write("big.bin", b"y" * 1024 * 1024)
            sb.files.write("small.bin", b"y" * 1024)
        # the client still works after the server closed that connection
        assert al.run("print(2)").stdout == "2\n"


# --- 429 and retries ---------------------------------------------------------------------


def test_rate_limited_carries_retry_after(strict: Daemon) -> None:
    rec = Recorder()
    with Airlock(strict.url, api_key=API_KEY) as holder, Airlock(
        strict.url, api_key=API_KEY, max_retries=0, http_client=rec.client
    ) as al:
        with holder.sandbox():  # holds the only slot
            t0 = time.monotonic()
            with pytest.raises(RateLimited) as ei:
                al.run("print(1)")
            assert time.monotonic() - t0 < 5
            e = ei.value
            assert e.status == 429 and e.code in ("queue_timeout", "queue_full")
            assert e.retry_after is not None and e.retry_after >= 1
            with pytest.raises(RateLimited):
                al.sandbox()
    assert rec.statuses == [429, 429]  # max_retries=0: one request each


def test_retries_on_429_until_the_slot_frees(strict: Daemon) -> None:
    rec = Recorder()
    with Airlock(strict.url, api_key=API_KEY) as holder, Airlock(
        strict.url, api_key=API_KEY, max_retries=2, http_client=rec.client
    ) as al:
        sb = holder.sandbox()
        freed = threading.Timer(0.6, sb.delete)
        freed.start()
        t0 = time.monotonic()
        r = al.run("print('got in')")
        freed.join()
        assert r.stdout == "got in\n"
    assert rec.statuses[0] == 429 and rec.statuses[-1] == 200, rec.statuses
    assert rec.sent == ["POST /v1/exec"] * len(rec.statuses)
    # Retry-After (1 s) was honored between the 429 and the next attempt.
    assert rec.times[1] - rec.times[0] >= 0.95
    assert time.monotonic() - t0 < 10


def test_retries_are_bounded(strict: Daemon) -> None:
    rec = Recorder()
    with Airlock(strict.url, api_key=API_KEY) as holder, Airlock(
        strict.url, api_key=API_KEY, max_retries=2, http_client=rec.client
    ) as al:
        with holder.sandbox():
            with pytest.raises(RateLimited):
                al.run("print(1)")
    assert rec.statuses == [429, 429, 429]


def test_retry_after_longer_than_allowed_is_not_waited(strict: Daemon) -> None:
    rec = Recorder()
    with Airlock(strict.url, api_key=API_KEY) as holder, Airlock(
        strict.url, api_key=API_KEY, max_retries=5, max_retry_wait=0.5, http_client=rec.client
    ) as al:
        with holder.sandbox():
            with pytest.raises(RateLimited):
                al.run("print(1)")
    assert rec.statuses == [429]


@pytest.mark.anyio
async def test_async_retries_on_429(strict: Daemon) -> None:
    statuses: list[int] = []

    async def hook(resp: httpx.Response) -> None:
        statuses.append(resp.status_code)

    http = httpx.AsyncClient(event_hooks={"response": [hook]})
    async with AsyncAirlock(strict.url, api_key=API_KEY, http_client=http) as al:
        with Airlock(strict.url, api_key=API_KEY) as holder:
            sb = holder.sandbox()
            freed = threading.Timer(0.6, sb.delete)
            freed.start()
            r = await al.run("print('async in')")
            freed.join()
        assert r.stdout == "async in\n"
    await http.aclose()
    assert statuses[0] == 429 and statuses[-1] == 200


def test_connection_refused_is_retried_then_raised() -> None:
    rec = Recorder()
    with Airlock("http://127.0.0.1:9", max_retries=2, backoff=0.01, http_client=rec.client) as al:
        with pytest.raises(AirlockConnectionError) as ei:
            al.run("print(1)")
    assert isinstance(ei.value, AirlockError) and ei.value.status is None
    assert rec.sent == ["POST /v1/exec"] * 3  # never reached a server: safe to repeat


# --- 503 ---------------------------------------------------------------------------------


def test_service_unavailable_and_exec_not_retried(tmp_path) -> None:
    """SIGTERM with an exec in flight: when the grace ends the exec is killed and answered
    503. The program ran, so the client must not run it again."""
    d = start_daemon(tmp_path, "--pool", "1", "--grace", "1s")
    rec = Recorder()
    try:
        with Airlock(d.url, max_retries=3, http_client=rec.client) as al:
            outcome: dict[str, Any] = {}

            def long_exec() -> None:
                try:
                    outcome["result"] = al.exec(["sleep", "30"], limits=Limits(timeout_ms=60_000))
                except AirlockError as e:
                    outcome["error"] = e

            t = threading.Thread(target=long_exec)
            t.start()
            time.sleep(0.8)
            d.proc.send_signal(signal.SIGTERM)
            t.join(30)
            assert not t.is_alive()
        err = outcome.get("error")
        assert isinstance(err, ServiceUnavailable), outcome
        assert err.status == 503 and err.code == "shutting_down"
        assert rec.sent == ["POST /v1/exec"] and rec.statuses == [503]
        assert d.proc.wait(30) == 0
    finally:
        d.stop()


# --- 429 session_quota (issue 12, item 4) --------------------------------------------------


def test_one_client_can_hold_every_sandbox_slot(tmp_path) -> None:
    """A caller at ``--max-sessions-per-key`` gets :class:`SessionQuotaExceeded` (a
    :class:`RateLimited`) naming the quota, at once and without retries; its sessions are
    listed for it; deleting one lets it create another."""
    d = start_daemon(tmp_path, "--pool", "1", "--max-sessions-per-key", "2", "--queue-timeout", "20s")
    rec = Recorder()
    try:
        with Airlock(d.url, max_retries=3, http_client=rec.client) as al:
            first = al.sandbox(ttl_s=120)
            second = al.sandbox(ttl_s=60)
            assert {s.id for s in al.list_sandboxes()} == {first.id, second.id}
            rec.sent.clear()
            rec.statuses.clear()
            t0 = time.monotonic()
            with pytest.raises(SessionQuotaExceeded) as ei:
                al.sandbox()
            assert time.monotonic() - t0 < 10
            e = ei.value
            assert isinstance(e, RateLimited)
            assert e.status == 429 and e.code == "session_quota"
            assert "--max-sessions-per-key (2)" in e.message, e.message
            # When the caller's first session expires (the 60 s one).
            assert e.retry_after is not None and 30 <= e.retry_after <= 60, e.retry_after
            assert rec.sent == ["POST /v1/sandboxes"] and rec.statuses == [429], "retried"
            first.delete()
            third = al.sandbox()
            assert {s.id for s in al.list_sandboxes()} == {second.id, third.id}
            second.delete()
            third.delete()
            assert al.list_sandboxes() == []
    finally:
        d.stop()


@pytest.mark.anyio
async def test_async_session_quota(tmp_path) -> None:
    d = start_daemon(tmp_path, "--pool", "1", "--max-sessions-per-key", "1")
    try:
        async with AsyncAirlock(d.url) as al:
            sb = await al.sandbox()
            with pytest.raises(SessionQuotaExceeded) as ei:
                await al.sandbox()
            assert ei.value.code == "session_quota"
            assert [s.id for s in await al.list_sandboxes()] == [sb.id]
            await sb.delete()
    finally:
        d.stop()


# --- 503 gvisor_unavailable ----------------------------------------------------------------


def test_a_host_without_gvisor_raises_gvisor_unavailable_at_once(tmp_path) -> None:
    # runsc is missing for this daemon.
    d = start_daemon(tmp_path / "d", "--pool", "0", env={"AIRLOCK_RUNSC": str(tmp_path / "no-runsc")})
    try:
        with Airlock(d.url, max_retries=3) as al:
            for call in (lambda: al.sandbox(isolation="gvisor"), lambda: al.exec(["true"], isolation="gvisor")):
                t0 = time.monotonic()
                with pytest.raises(GvisorUnavailable) as ei:
                    call()
                assert time.monotonic() - t0 < 5, "retried"
                e = ei.value
                assert isinstance(e, IsolationUnavailable) and isinstance(e, ServiceUnavailable)
                assert e.status == 503 and e.code == "gvisor_unavailable", e
                assert "runsc" in str(e), e
            assert al.exec(["echo", "ok"]).stdout == "ok\n"
    finally:
        d.stop()


# --- 503 microvm_unavailable ---------------------------------------------------------------


def test_a_host_without_micro_vms_raises_microvm_unavailable_at_once(tmp_path) -> None:
    # Micro-VMs cannot run here: their state directory would be beneath a regular file.
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    d = start_daemon(tmp_path / "d", "--pool", "0", env={"AIRLOCK_VM_STATE": str(blocker / "vm")})
    try:
        with Airlock(d.url, max_retries=3) as al:
            for call in (lambda: al.sandbox(isolation="microvm"), lambda: al.exec(["true"], isolation="microvm")):
                t0 = time.monotonic()
                with pytest.raises(MicroVmUnavailable) as ei:
                    call()
                # A condition of the host: raised at once, not retried.
                assert time.monotonic() - t0 < 5, "retried"
                e = ei.value
                assert isinstance(e, ServiceUnavailable)
                assert e.status == 503 and e.code == "microvm_unavailable", e
            # The namespace tier still serves.
            assert al.exec(["echo", "ok"]).stdout == "ok\n"
    finally:
        d.stop()
