"""The asynchronous client: :class:`AsyncAirlock`, :class:`AsyncSandbox`,
:class:`AsyncFiles`, :class:`AsyncProcesses`, :class:`AsyncExecStream`,
:class:`AsyncProcessStream`. Same methods as the sync client, awaited."""

from __future__ import annotations

import asyncio
import builtins
import inspect
import json as _json
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Literal, Mapping, Sequence

import httpx

from . import _core, errors
from ._terminal import TerminalOpening
from .client import _stream_body
from .types import (
    Approval,
    Execution,
    ExecutionError,
    ExecResult,
    ExitEvent,
    FileEntry,
    FilesArg,
    Limits,
    Network,
    Port,
    Process,
    ProcessEvent,
    ProcessOutput,
    Readiness,
    Result,
    ResultEvent,
    SandboxInfo,
    Snapshot,
    SnapshotList,
    StreamEvent,
    snapshot_id,
)

__all__ = [
    "AsyncAirlock",
    "AsyncExecStream",
    "AsyncFiles",
    "AsyncProcessStream",
    "AsyncProcesses",
    "AsyncSandbox",
]


class AsyncExecStream(AsyncIterator[StreamEvent]):
    """``async for ev in al.stream(...)``: output events as they arrive, then one
    :class:`~airlock.ResultEvent`. Use ``async with`` (or :meth:`aclose`) when you may stop
    early: closing the connection makes the service kill the program."""

    def __init__(
        self,
        opener: Callable[[], Awaitable[httpx.Response]],
        describe: str,
        watch: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._opener = opener
        self._describe = describe
        self._watch = watch
        self._watcher: asyncio.Future[None] | None = None
        self._resp: httpx.Response | None = None
        self._events: AsyncGenerator[StreamEvent, None] | None = None
        self._done = False
        self.result: ExecResult | None = None

    async def _gen(self, resp: httpx.Response) -> AsyncGenerator[StreamEvent, None]:
        parser = _core.SSEParser()
        async for line in resp.aiter_lines():
            pair = parser.feed(line)
            if pair is not None:
                ev = _core.to_event(*pair)
                if ev is not None:
                    yield ev
        pair = parser.flush()
        if pair is not None:
            ev = _core.to_event(*pair)
            if ev is not None:
                yield ev

    def __aiter__(self) -> AsyncExecStream:
        return self

    async def __anext__(self) -> StreamEvent:
        if self._done:
            raise StopAsyncIteration
        try:
            if self._events is None:
                if self._watch is not None and self._watcher is None:
                    self._watcher = asyncio.ensure_future(self._watch())
                self._resp = await self._opener()
                self._events = self._gen(self._resp)
            ev = await self._events.__anext__()
        except StopAsyncIteration:
            await self.aclose()
            if self.result is None:
                raise errors.AirlockConnectionError(
                    f"{self._describe}: the stream ended without a result event"
                ) from None
            raise
        except httpx.TransportError as e:
            await self.aclose()
            raise _core.wrap_transport_error(e, "POST", self._describe) from e
        except BaseException:
            await self.aclose()
            raise
        if isinstance(ev, ResultEvent):
            self.result = ev.result
            if self._watcher is not None:  # the program has ended: nothing more to answer
                await _cancel(self._watcher)
        return ev

    async def wait(self) -> ExecResult:
        """Consumes the remaining events and returns the result."""
        async for _ in self:
            pass
        assert self.result is not None
        return self.result

    async def aclose(self) -> None:
        self._done = True
        if self._watcher is not None:
            await _cancel(self._watcher)
        if self._events is not None:
            await self._events.aclose()
        if self._resp is not None:
            await self._resp.aclose()

    async def __aenter__(self) -> AsyncExecStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncAirlock:
    """The asynchronous client of ``airlock serve``; see :class:`~airlock.Airlock` for the
    parameters, timeouts and retry policy."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        timeout_margin: float = 30.0,
        max_retries: int = 2,
        max_retry_wait: float = 60.0,
        backoff: float = 0.25,
        headers: Mapping[str, str] | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self._config = _core.make_config(
            base_url,
            api_key,
            timeout=timeout,
            connect_timeout=connect_timeout,
            timeout_margin=timeout_margin,
            max_retries=max_retries,
            max_retry_wait=max_retry_wait,
            backoff=backoff,
            headers=headers,
        )
        self._owns_http = http_client is None
        self._http = http_client if http_client is not None else httpx.AsyncClient()

    @property
    def base_url(self) -> str:
        return self._config.base_url

    def __repr__(self) -> str:
        return f"AsyncAirlock({self._config.base_url!r})"

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncAirlock:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- transport -------------------------------------------------------------------

    async def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        params: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
        not_found: type[errors.NotFound] = errors.SandboxNotFound,
        stream: bool = False,
        accept_status: tuple[int, ...] = (),
    ) -> httpx.Response:
        cfg = self._config
        url = cfg.base_url + path
        headers = dict(cfg.headers)
        if json is not None:
            content = _json.dumps(json).encode()
            headers["content-type"] = "application/json"
        elif content is not None:
            headers["content-type"] = "application/octet-stream"
        headers["accept"] = "text/event-stream" if stream else "application/json"
        attempt = 0
        while True:
            request = self._http.build_request(
                method,
                url,
                content=content,
                params=params,
                headers=headers,
                timeout=timeout or _core.plain_timeout(cfg),
            )
            try:
                resp = await self._http.send(request, stream=stream)
            except httpx.TransportError as e:
                if attempt < cfg.max_retries and _core.retry_on_error(method, e):
                    delay = _core.retry_delay(cfg, attempt, None)
                    assert delay is not None
                    _core.logger.info("%s %s: %s; retrying in %.2fs", method, path, e, delay)
                    await asyncio.sleep(delay)
                    attempt += 1
                    continue
                raise _core.wrap_transport_error(e, method, url) from e
            if resp.status_code < 400 or resp.status_code in accept_status:
                return resp
            try:
                if stream:
                    await resp.aread()
                err = errors.from_response(
                    resp.status_code, resp.content, resp.headers, not_found=not_found
                )
            except httpx.TransportError as e:
                raise _core.wrap_transport_error(e, method, url) from e
            finally:
                await resp.aclose()
            if attempt < cfg.max_retries and _core.retry_on_status(
                method, path, resp.status_code, err.code
            ):
                delay = _core.retry_delay(cfg, attempt, err.retry_after)
                if delay is not None:
                    _core.logger.info(
                        "%s %s: %s; retrying in %.2fs", method, path, err, delay
                    )
                    await asyncio.sleep(delay)
                    attempt += 1
                    continue
            raise err

    async def _exec(self, path: str, body: dict[str, Any], default_ms: int | None) -> ExecResult:
        resp = await self._send(
            "POST", path, json=body, timeout=_core.exec_timeout(self._config, body, default_ms)
        )
        return ExecResult.from_dict(_core.parse_json(resp))

    def _stream(
        self,
        path: str,
        body: dict[str, Any],
        default_ms: int | None,
        watch: Callable[[], Awaitable[None]] | None = None,
    ) -> AsyncExecStream:
        timeout = _core.exec_timeout(self._config, body, default_ms)
        return AsyncExecStream(
            lambda: self._send("POST", path, json=body, timeout=timeout, stream=True),
            self._config.base_url + path,
            watch,
        )

    # --- one-shot execs --------------------------------------------------------------

    async def run(
        self,
        code: str,
        language: str = "python",
        *,
        stdin: str | bytes | None = None,
        files: FilesArg = None,
        env: Mapping[str, str] | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        network: Network | Mapping[str, Any] | str | None = None,
        isolation: str | None = None,
        image: str | None = None,
        files_changed_in: Sequence[str] | None = None,
    ) -> ExecResult:
        """Runs ``code`` (``python``, ``javascript`` or ``bash``) in a fresh sandbox;
        ``isolation="gvisor"`` runs it under gVisor's user-space kernel,
        ``isolation="microvm"`` inside a micro-VM of its own. ``image="python:3.12-slim"``
        runs it in that image from the service's image store (its ``PATH`` and other
        ``Env`` come first; the request's ``env`` wins). ``files_changed_in`` as in
        :meth:`Airlock.run <airlock.Airlock.run>`."""
        body = _core.exec_body(
            language=language, code=code, stdin=stdin, files=files, env=env, limits=limits,
            network=network, isolation=isolation, image=image, files_changed_in=files_changed_in,
        )
        return await self._exec("/v1/exec", body, None)

    async def exec(
        self,
        cmd: Sequence[str],
        *,
        stdin: str | bytes | None = None,
        files: FilesArg = None,
        env: Mapping[str, str] | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        network: Network | Mapping[str, Any] | str | None = None,
        isolation: str | None = None,
        image: str | None = None,
        files_changed_in: Sequence[str] | None = None,
    ) -> ExecResult:
        """Runs the argv ``cmd`` in a fresh sandbox."""
        body = _core.exec_body(
            cmd=cmd, stdin=stdin, files=files, env=env, limits=limits, network=network,
            isolation=isolation, image=image, files_changed_in=files_changed_in,
        )
        return await self._exec("/v1/exec", body, None)

    async def shell(
        self,
        command: str,
        *,
        stdin: str | bytes | None = None,
        files: FilesArg = None,
        env: Mapping[str, str] | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        network: Network | Mapping[str, Any] | str | None = None,
        isolation: str | None = None,
        image: str | None = None,
        files_changed_in: Sequence[str] | None = None,
    ) -> ExecResult:
        """Runs ``bash -c command`` in a fresh sandbox."""
        return await self.exec(
            ["bash", "-c", command], stdin=stdin, files=files, env=env, limits=limits,
            network=network, isolation=isolation, image=image, files_changed_in=files_changed_in,
        )

    def stream(
        self,
        code: str | None = None,
        language: str = "python",
        *,
        cmd: Sequence[str] | None = None,
        stdin: str | bytes | None = None,
        files: FilesArg = None,
        env: Mapping[str, str] | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        network: Network | Mapping[str, Any] | str | None = None,
        files_changed_in: Sequence[str] | None = None,
    ) -> AsyncExecStream:
        """``async for ev in al.stream(code)``: output events, then the result."""
        body = _stream_body(code, language, cmd, stdin, files, env, limits, network, files_changed_in)
        return self._stream("/v1/exec", body, None)

    # --- sessions --------------------------------------------------------------------

    def sandbox(
        self,
        *,
        ttl_s: int | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        network: Network | Mapping[str, Any] | str | None = None,
        isolation: str | None = None,
        image: str | None = None,
        from_snapshot: Snapshot | str | None = None,
        on_idle: Literal["none", "pause"] | None = None,
        idle_timeout_s: int | None = None,
    ) -> _SandboxCreation:
        """Creates a session sandbox: ``async with al.sandbox() as sb:`` (deleted on
        exit) or ``sb = await al.sandbox()``. ``isolation="gvisor"`` or ``"microvm"`` gives the
        session a gVisor sandbox or a micro-VM of its own. ``from_snapshot``, ``on_idle``
        and ``idle_timeout_s`` as in :meth:`Airlock.sandbox <airlock.Airlock.sandbox>`."""
        return _SandboxCreation(
            self, ttl_s, limits, network, isolation, image, from_snapshot, on_idle, idle_timeout_s
        )

    async def _create(
        self,
        ttl_s: int | None,
        limits: Limits | Mapping[str, Any] | None,
        network: Network | Mapping[str, Any] | str | None,
        isolation: str | None,
        image: str | None = None,
        from_snapshot: Snapshot | str | None = None,
        on_idle: str | None = None,
        idle_timeout_s: int | None = None,
    ) -> AsyncSandbox:
        body = _core.create_body(
            ttl_s, limits, network, isolation, image, from_snapshot, on_idle, idle_timeout_s
        )
        resp = await self._send(
            "POST",
            "/v1/sandboxes",
            json=body,
            timeout=_core.state_timeout(self._config) if from_snapshot is not None else None,
            not_found=errors.SnapshotNotFound,
        )
        data = _core.parse_json(resp)
        lim = Limits.coerce(limits)
        return AsyncSandbox(self, data["id"], data.get("expires_at"), lim.timeout_ms if lim else None)

    async def get_sandbox(self, sandbox_id: str) -> AsyncSandbox:
        resp = await self._send("GET", _core.sandbox_path(sandbox_id))
        info = SandboxInfo.from_dict(_core.parse_json(resp))
        return AsyncSandbox(self, info.id, info.expires_at, None)

    async def list_sandboxes(self) -> builtins.list[SandboxInfo]:
        data = _core.parse_json(await self._send("GET", "/v1/sandboxes"))
        return [SandboxInfo.from_dict(d) for d in data]

    # --- snapshots -------------------------------------------------------------------

    async def list_snapshots(self) -> SnapshotList:
        """The caller's snapshots, with the store's ``used_bytes`` and ``budget_bytes``."""
        return SnapshotList.from_dict(_core.parse_json(await self._send("GET", "/v1/snapshots")))

    async def get_snapshot(self, snapshot: Snapshot | str) -> Snapshot:
        resp = await self._send("GET", _core.snapshot_path(snapshot), not_found=errors.SnapshotNotFound)
        return Snapshot.from_dict(_core.parse_json(resp))

    async def delete_snapshot(self, snapshot: Snapshot | str) -> None:
        await self._send("DELETE", _core.snapshot_path(snapshot), not_found=errors.SnapshotNotFound)

    # --- operations ------------------------------------------------------------------

    async def health(self) -> bool:
        try:
            resp = await self._send("GET", "/healthz")
        except errors.AirlockConnectionError:
            return False
        return bool(_core.parse_json(resp).get("status") == "ok")

    async def ready(self) -> Readiness:
        resp = await self._send("GET", "/readyz", accept_status=(503,))
        return Readiness.from_dict(_core.parse_json(resp))

    async def metrics(self) -> str:
        return (await self._send("GET", "/metrics")).text

    async def openapi(self) -> dict[str, Any]:
        return dict(_core.parse_json(await self._send("GET", "/openapi.json")))


class _SandboxCreation:
    """What :meth:`AsyncAirlock.sandbox` returns: awaitable (the sandbox) and an async
    context manager (the sandbox, deleted on exit)."""

    def __init__(
        self,
        client: AsyncAirlock,
        ttl_s: int | None,
        limits: Limits | Mapping[str, Any] | None,
        network: Network | Mapping[str, Any] | str | None,
        isolation: str | None,
        image: str | None = None,
        from_snapshot: Snapshot | str | None = None,
        on_idle: str | None = None,
        idle_timeout_s: int | None = None,
    ) -> None:
        self._args = (client, ttl_s, limits, network, isolation, image, from_snapshot, on_idle, idle_timeout_s)
        self._sandbox: AsyncSandbox | None = None

    def __await__(self) -> Generator[Any, None, AsyncSandbox]:
        client, *args = self._args
        return client._create(*args).__await__()

    async def __aenter__(self) -> AsyncSandbox:
        client, *args = self._args
        self._sandbox = await client._create(*args)
        return self._sandbox

    async def __aexit__(self, *exc: object) -> None:
        if self._sandbox is not None:
            await self._sandbox.aclose()


class AsyncFiles:
    """The files of a session sandbox's /workspace (see :class:`~airlock.Files`)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def write(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        params = {"path": path}
        if mode is not None:
            params["mode"] = format(mode, "o")
        await self._sb._client._send(
            "PUT", _core.sandbox_path(self._sb.id, "/files"), content=content, params=params
        )

    async def read(self, path: str) -> bytes:
        resp = await self._sb._client._send(
            "GET",
            _core.sandbox_path(self._sb.id, "/files"),
            params={"path": path},
            not_found=errors.FileNotFound,
        )
        return resp.content

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read(path)).decode(encoding)

    async def list(self) -> builtins.list[FileEntry]:
        resp = await self._sb._client._send("GET", _core.sandbox_path(self._sb.id, "/files"))
        return [FileEntry.from_dict(d) for d in _core.parse_json(resp)]


class AsyncSandbox:
    """A session sandbox (see :class:`~airlock.Sandbox`); ``async with`` deletes it."""

    def __init__(
        self,
        client: AsyncAirlock,
        sandbox_id: str,
        expires_at: float | None,
        default_timeout_ms: int | None,
    ) -> None:
        self._client = client
        self.id = sandbox_id
        self.expires_at = expires_at
        self._default_ms = default_timeout_ms
        self.files = AsyncFiles(self)
        self.processes = AsyncProcesses(self)
        """Programs running in the background of the session."""
        self._closed = False

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.id!r})"

    async def run(
        self,
        code: str,
        language: str = "python",
        *,
        stdin: str | bytes | None = None,
        files: FilesArg = None,
        env: Mapping[str, str] | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        on_approval: _core.OnApproval | None = None,
        files_changed_in: Sequence[str] | None = None,
    ) -> ExecResult:
        """Runs ``code`` in the session; ``on_approval`` and ``files_changed_in`` as in
        :meth:`exec`."""
        body = _core.exec_body(
            language=language, code=code, stdin=stdin, files=files, env=env, limits=limits,
            files_changed_in=files_changed_in,
        )
        return await self._exec(body, on_approval)

    async def exec(
        self,
        cmd: Sequence[str],
        *,
        stdin: str | bytes | None = None,
        files: FilesArg = None,
        env: Mapping[str, str] | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        on_approval: _core.OnApproval | None = None,
        files_changed_in: Sequence[str] | None = None,
    ) -> ExecResult:
        """Runs the argv ``cmd`` in the session. ``on_approval`` (a function or a
        coroutine function) answers each connection the session's policy holds while the
        exec runs, as in :meth:`Sandbox.exec <airlock.Sandbox.exec>`; it runs in a task
        on the event loop (a plain function should return quickly), cancelled when the
        exec returns. Unanswered means denied after ``approval_timeout_ms``.
        ``files_changed_in`` as in :meth:`Sandbox.exec <airlock.Sandbox.exec>`."""
        body = _core.exec_body(
            cmd=cmd, stdin=stdin, files=files, env=env, limits=limits, files_changed_in=files_changed_in
        )
        return await self._exec(body, on_approval)

    async def shell(
        self,
        command: str,
        *,
        stdin: str | bytes | None = None,
        files: FilesArg = None,
        env: Mapping[str, str] | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        on_approval: _core.OnApproval | None = None,
        files_changed_in: Sequence[str] | None = None,
    ) -> ExecResult:
        return await self.exec(
            ["bash", "-c", command], stdin=stdin, files=files, env=env, limits=limits,
            on_approval=on_approval, files_changed_in=files_changed_in,
        )

    async def _exec(self, body: dict[str, Any], on_approval: _core.OnApproval | None) -> ExecResult:
        path = _core.sandbox_path(self.id, "/exec")
        if on_approval is None:
            return await self._client._exec(path, body, self._default_ms)
        watcher = asyncio.ensure_future(_watch_approvals(self, on_approval))
        try:
            return await self._client._exec(path, body, self._default_ms)
        finally:
            await _cancel(watcher)

    def stream(
        self,
        code: str | None = None,
        language: str = "python",
        *,
        cmd: Sequence[str] | None = None,
        stdin: str | bytes | None = None,
        files: FilesArg = None,
        env: Mapping[str, str] | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        on_approval: _core.OnApproval | None = None,
        files_changed_in: Sequence[str] | None = None,
    ) -> AsyncExecStream:
        """Streams an exec in the session; ``on_approval`` answers held connections from
        when iteration starts until the stream ends or is closed."""
        body = _stream_body(code, language, cmd, stdin, files, env, limits, None, files_changed_in)
        watch: Callable[[], Awaitable[None]] | None = None
        if on_approval is not None:
            callback = on_approval
            watch = lambda: _watch_approvals(self, callback)  # noqa: E731
        return self._client._stream(_core.sandbox_path(self.id, "/exec"), body, self._default_ms, watch)

    async def info(self) -> SandboxInfo:
        resp = await self._client._send("GET", _core.sandbox_path(self.id))
        return SandboxInfo.from_dict(_core.parse_json(resp))

    # --- snapshots, forks, pause -----------------------------------------------------------

    @classmethod
    def from_snapshot(cls, client: AsyncAirlock, snapshot: Snapshot | str, **kw: Any) -> _SandboxCreation:
        """``client.sandbox(from_snapshot=snapshot, **kw)``: awaitable, or ``async with``."""
        return client.sandbox(from_snapshot=snapshot, **kw)

    async def snapshot(self, kind: Literal["auto", "filesystem", "full"] | None = None) -> Snapshot:
        """See :meth:`Sandbox.snapshot <airlock.Sandbox.snapshot>`."""
        resp = await self._client._send(
            "POST",
            _core.sandbox_path(self.id, "/snapshots"),
            json=_core.snapshot_body(kind),
            timeout=_core.state_timeout(self._client._config),
        )
        return Snapshot.from_dict(_core.parse_json(resp))

    async def restore(self, snapshot: Snapshot | str) -> SandboxInfo:
        """See :meth:`Sandbox.restore <airlock.Sandbox.restore>`."""
        resp = await self._client._send(
            "POST",
            _core.sandbox_path(self.id, "/restore"),
            json={"snapshot_id": snapshot_id(snapshot)},
            timeout=_core.state_timeout(self._client._config),
            not_found=errors.SnapshotNotFound,
        )
        return SandboxInfo.from_dict(_core.parse_json(resp))

    async def fork(self, count: int, *, ttl_s: int | None = None) -> builtins.list[AsyncSandbox]:
        """See :meth:`Sandbox.fork <airlock.Sandbox.fork>`."""
        resp = await self._client._send(
            "POST",
            _core.sandbox_path(self.id, "/fork"),
            json=_core.fork_body(count, ttl_s),
            timeout=_core.state_timeout(self._client._config),
        )
        return [
            AsyncSandbox(self._client, d["id"], d.get("expires_at"), self._default_ms)
            for d in _core.parse_json(resp)["sandboxes"]
        ]

    async def pause(self) -> SandboxInfo:
        """See :meth:`Sandbox.pause <airlock.Sandbox.pause>`."""
        resp = await self._client._send("POST", _core.sandbox_path(self.id, "/pause"), json={})
        return SandboxInfo.from_dict(_core.parse_json(resp))

    async def resume(self) -> SandboxInfo:
        """See :meth:`Sandbox.resume <airlock.Sandbox.resume>`."""
        resp = await self._client._send("POST", _core.sandbox_path(self.id, "/resume"), json={})
        return SandboxInfo.from_dict(_core.parse_json(resp))

    # --- code interpreter --------------------------------------------------------------

    async def run_code(
        self,
        code: str,
        *,
        timeout: float | None = None,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        on_result: Callable[[Result], Any] | None = None,
        on_error: Callable[[ExecutionError], Any] | None = None,
    ) -> Execution:
        """Runs a Python cell in the session's kernel (see :meth:`Sandbox.run_code
        <airlock.Sandbox.run_code>`); callbacks may be functions or coroutine functions,
        awaited in order as events arrive."""
        body, timeout_ = _core.code_request(self._client._config, code, timeout, self._default_ms)
        path = _core.sandbox_path(self.id, "/code")
        callbacks = {"stdout": on_stdout, "stderr": on_stderr, "result": on_result, "error": on_error}
        if all(c is None for c in callbacks.values()):
            resp = await self._client._send("POST", path, json=body, timeout=timeout_)
            return Execution.from_dict(_core.parse_json(resp))
        resp = await self._client._send("POST", path, json=body, timeout=timeout_, stream=True)
        parser = _core.SSEParser()
        try:
            lines = resp.aiter_lines()
            while True:
                line = await lines.__anext__()
                ev = _core.code_events(parser, line)
                if ev is not None:
                    kind, value = ev
                    if kind == "done":
                        return value  # type: ignore[no-any-return]
                    cb = callbacks[kind]
                    if cb is not None:
                        r = cb(value)
                        if inspect.isawaitable(r):
                            await r
        except StopAsyncIteration:
            ev = _core.code_events(parser, None)
            if ev is not None and ev[0] == "done":
                return ev[1]  # type: ignore[no-any-return]
            raise errors.AirlockConnectionError(
                f"POST {self._client.base_url}{path}: the stream ended without a done event"
            ) from None
        except httpx.TransportError as e:
            raise _core.wrap_transport_error(e, "POST", self._client.base_url + path) from e
        finally:
            await resp.aclose()

    async def restart_code(self) -> None:
        """Replaces the session's kernel with a new one (state cleared)."""
        cfg = self._client._config
        timeout = httpx.Timeout(cfg.timeout + _core.KERNEL_START_MARGIN_S, connect=cfg.connect_timeout)
        await self._client._send("POST", _core.sandbox_path(self.id, "/code/restart"), json={}, timeout=timeout)

    # --- terminal ------------------------------------------------------------------------

    def pty(self, rows: int = 24, cols: int = 80, cmd: str | Sequence[str] | None = None) -> TerminalOpening:
        """A terminal in the session (see :meth:`Sandbox.pty <airlock.Sandbox.pty>`):
        ``async with sb.pty() as term:`` (hung up on exit) or ``term = await sb.pty()``."""
        return TerminalOpening(self._client._config, self.id, rows, cols, cmd)

    # --- ports ---------------------------------------------------------------------------

    async def expose(self, port: int) -> Port:
        """See :meth:`Sandbox.expose <airlock.Sandbox.expose>`."""
        resp = await self._client._send("POST", _core.sandbox_path(self.id, "/ports"), json=_core.port_body(port))
        return Port.from_dict(_core.parse_json(resp), self._client.base_url)

    async def unexpose(self, port: int | Port) -> None:
        """See :meth:`Sandbox.unexpose <airlock.Sandbox.unexpose>`."""
        n = port.port if isinstance(port, Port) else port
        await self._client._send(
            "DELETE", _core.sandbox_path(self.id, f"/ports/{int(n)}"), not_found=errors.PortNotFound
        )

    async def ports(self) -> builtins.list[Port]:
        resp = await self._client._send("GET", _core.sandbox_path(self.id, "/ports"))
        return [Port.from_dict(p, self._client.base_url) for p in _core.parse_json(resp)["ports"]]

    # --- network -----------------------------------------------------------------------

    async def network(self) -> Network:
        """The session's network policy now (secrets with ``value=None``)."""
        resp = await self._client._send("GET", _core.sandbox_path(self.id, "/network"))
        net = Network.coerce(_core.parse_json(resp))
        assert net is not None
        return net

    async def update_network(
        self,
        *,
        allow: Sequence[str] | None = None,
        allow_cidrs: Sequence[str] | None = None,
        deny: Sequence[str] | None = None,
        on_denied: Literal["deny", "ask"] | None = None,
    ) -> Network:
        """Changes the session's policy for its next connections (see
        :meth:`Sandbox.update_network <airlock.Sandbox.update_network>`)."""
        body = _core.network_patch(allow, allow_cidrs, deny, on_denied)
        resp = await self._client._send("PATCH", _core.sandbox_path(self.id, "/network"), json=body)
        net = Network.coerce(_core.parse_json(resp))
        assert net is not None
        return net

    async def approvals(self, wait: float | None = None) -> builtins.list[Approval]:
        """The connections held for approval now; with ``wait`` (seconds, at most 60),
        waits that long for one when none is held."""
        params, timeout = _core.approvals_request(self._client._config, wait)
        resp = await self._client._send(
            "GET", _core.sandbox_path(self.id, "/approvals"), params=params, timeout=timeout
        )
        return [Approval.from_dict(a) for a in _core.parse_json(resp)["approvals"]]

    async def approve(self, approval: Approval | int, decision: _core.ApprovalAnswer | str) -> None:
        """Answers a held connection (see :meth:`Sandbox.approve <airlock.Sandbox.approve>`)."""
        aid = _core.approval_id(approval)
        await self._client._send(
            "POST",
            _core.sandbox_path(self.id, f"/approvals/{aid}"),
            json={"decision": _core.decision(decision)},
            not_found=errors.ApprovalNotFound,
        )

    async def delete(self) -> None:
        await self._client._send("DELETE", _core.sandbox_path(self.id))
        self._closed = True

    async def aclose(self) -> None:
        """Deletes the sandbox unless already gone (idempotent)."""
        if self._closed:
            return
        try:
            await self.delete()
        except (errors.NotFound, errors.SandboxExpired):
            self._closed = True

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _watch_approvals(sb: AsyncSandbox, callback: _core.OnApproval) -> None:
    """Long-polls ``sb``'s held connections and answers each with what ``callback``
    returns, until cancelled (when the exec it serves returns)."""
    answered: set[int] = set()
    while True:
        try:
            held = await sb.approvals(wait=_core.APPROVAL_POLL_S)
        except (errors.NotFound, errors.SandboxExpired, errors.InvalidRequest) as e:
            _core.logger.warning("on_approval: sandbox %s cannot ask: %s", sb.id, e)
            return
        except errors.AirlockError as e:
            _core.logger.warning("on_approval: listing approvals of %s: %s", sb.id, e)
            await asyncio.sleep(0.5)
            continue
        fresh = [a for a in held if a.id not in answered]
        if not fresh:
            await asyncio.sleep(0.05)
            continue
        for approval in fresh:
            answered.add(approval.id)
            try:
                answer = callback(approval)
                if inspect.isawaitable(answer):
                    answer = await answer
            except Exception:
                _core.logger.exception(
                    "on_approval raised for %s:%s; denying", approval.host, approval.port
                )
                answer = "deny"
            try:
                await sb.approve(approval, _core.callback_decision(answer, approval))
            except errors.ApprovalNotFound:
                pass
            except errors.AirlockError as e:
                _core.logger.warning("on_approval: answering %s: %s", approval.id, e)


async def _cancel(task: asyncio.Future[None]) -> None:
    """Cancels an approvals watcher and waits for it to end."""
    task.cancel()
    # asyncio.wait, not await: the watcher's own cancellation is not raised here, while a
    # cancellation of the caller still is.
    await asyncio.wait([task])
    if not task.cancelled() and task.exception() is not None:
        _core.logger.error("answering approvals", exc_info=task.exception())


class AsyncProcessStream(AsyncIterator[ProcessEvent]):
    """``async for ev in sb.processes.stream(p)``: see :class:`~airlock.ProcessStream`."""

    def __init__(self, opener: Callable[[], Awaitable[httpx.Response]], describe: str) -> None:
        self._opener = opener
        self._describe = describe
        self._resp: httpx.Response | None = None
        self._events: AsyncGenerator[ProcessEvent, None] | None = None
        self._done = False
        self.process: Process | None = None

    async def _gen(self, resp: httpx.Response) -> AsyncGenerator[ProcessEvent, None]:
        parser = _core.SSEParser()
        async for line in resp.aiter_lines():
            pair = parser.feed(line)
            if pair is not None:
                ev = _core.to_process_event(*pair)
                if ev is not None:
                    yield ev
        pair = parser.flush()
        if pair is not None:
            ev = _core.to_process_event(*pair)
            if ev is not None:
                yield ev

    def __aiter__(self) -> AsyncProcessStream:
        return self

    async def __anext__(self) -> ProcessEvent:
        if self._done:
            raise StopAsyncIteration
        try:
            if self._events is None:
                self._resp = await self._opener()
                self._events = self._gen(self._resp)
            ev = await self._events.__anext__()
        except StopAsyncIteration:
            await self.aclose()
            if self.process is None:
                raise errors.AirlockConnectionError(
                    f"{self._describe}: the stream ended without an exit event"
                ) from None
            raise
        except httpx.TransportError as e:
            await self.aclose()
            raise _core.wrap_transport_error(e, "GET", self._describe) from e
        except BaseException:
            await self.aclose()
            raise
        if isinstance(ev, ExitEvent):
            self.process = ev.process
            await self.aclose()
        return ev

    async def aclose(self) -> None:
        self._done = True
        if self._events is not None:
            await self._events.aclose()
        if self._resp is not None:
            await self._resp.aclose()

    async def __aenter__(self) -> AsyncProcessStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncProcesses:
    """Background processes of a session (see :class:`~airlock.Processes`)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def _send(self, method: str, path: str, **kw: Any) -> Any:
        resp = await self._sb._client._send(method, path, not_found=errors.ProcessNotFound, **kw)
        return _core.parse_json(resp)

    async def start(
        self,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
    ) -> Process:
        """See :meth:`Processes.start <airlock.Processes.start>`."""
        body = _core.process_body(cmd, env, workdir, stdin, timeout)
        return Process.from_dict(await self._send("POST", _core.sandbox_path(self._sb.id, "/exec"), json=body))

    async def list(self) -> builtins.list[Process]:
        data = await self._send("GET", _core.sandbox_path(self._sb.id, "/processes"))
        return [Process.from_dict(p) for p in data["processes"]]

    async def get(self, process: Process | str) -> Process:
        return Process.from_dict(await self._send("GET", _core.process_path(self._sb.id, process)))

    async def output(self, process: Process | str) -> ProcessOutput:
        return ProcessOutput.from_dict(
            await self._send("GET", _core.process_path(self._sb.id, process, "/output"))
        )

    def stream(
        self, process: Process | str, *, follow: bool = True, timeout: float | None = None
    ) -> AsyncProcessStream:
        """See :meth:`Processes.stream <airlock.Processes.stream>`."""
        path = _core.process_path(self._sb.id, process, "/output")
        params = {"follow": "true" if follow else "false"}
        client = self._sb._client
        t = _core.follow_timeout(client._config, timeout)
        return AsyncProcessStream(
            lambda: client._send(
                "GET", path, params=params, timeout=t, stream=True, not_found=errors.ProcessNotFound
            ),
            client.base_url + path,
        )

    async def write_stdin(self, process: Process | str, data: str | bytes, *, eof: bool = False) -> Process:
        body = _core.stdin_body(data, eof)
        return Process.from_dict(
            await self._send("POST", _core.process_path(self._sb.id, process, "/stdin"), json=body)
        )

    async def close_stdin(self, process: Process | str) -> Process:
        return await self.write_stdin(process, "", eof=True)

    async def signal(self, process: Process | str, signal: str | int = "SIGTERM") -> Process:
        body = {"signal": _core.signal_name(signal)}
        return Process.from_dict(
            await self._send("POST", _core.process_path(self._sb.id, process, "/signal"), json=body)
        )

    async def kill(self, process: Process | str) -> Process:
        return await self.signal(process, "SIGKILL")

    async def wait(self, process: Process | str, timeout: float = 30.0) -> Process:
        body, t = _core.wait_request(self._sb._client._config, timeout)
        return Process.from_dict(
            await self._send("POST", _core.process_path(self._sb.id, process, "/wait"), json=body, timeout=t)
        )
