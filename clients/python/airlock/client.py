"""The synchronous client: :class:`Airlock`, :class:`Sandbox`, :class:`Files`,
:class:`Processes`, :class:`ExecStream`, :class:`ProcessStream`."""

from __future__ import annotations

import builtins
import json as _json
import threading
import time
from typing import Any, Callable, Generator, Iterator, Literal, Mapping, Sequence

import httpx

from . import _core, errors
from ._terminal import Terminal
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

__all__ = ["Airlock", "ExecStream", "Files", "ProcessStream", "Processes", "Sandbox"]


class ExecStream(Iterator[StreamEvent]):
    """The events of a streamed exec: :class:`~airlock.StdoutEvent` and
    :class:`~airlock.StderrEvent` as output arrives, then one
    :class:`~airlock.ResultEvent`. The request is sent when iteration starts; errors the
    service reports (before or during the stream) are raised as exceptions.

    Use it in a ``with`` block (or call :meth:`close`) when you may stop iterating early:
    closing the connection makes the service kill the program. :attr:`result` holds the
    ExecResult once the result event has arrived; :meth:`wait` consumes the rest."""

    def __init__(
        self,
        opener: Callable[[], httpx.Response],
        describe: str,
        watcher: _ApprovalWatcher | None = None,
    ) -> None:
        self._opener = opener
        self._describe = describe
        self._watcher = watcher
        self._resp: httpx.Response | None = None
        self._events: Generator[StreamEvent, None, None] | None = None
        self._done = False
        self.result: ExecResult | None = None

    def _open(self) -> Generator[StreamEvent, None, None]:
        if self._events is None:
            if self._watcher is not None:
                self._watcher.start()
            self._resp = self._opener()
            self._events = _core.iter_events(self._resp.iter_lines())
        return self._events

    def __iter__(self) -> ExecStream:
        return self

    def __next__(self) -> StreamEvent:
        if self._done:
            raise StopIteration
        try:
            ev = next(self._open())
        except StopIteration:
            self.close()
            if self.result is None:
                raise errors.AirlockConnectionError(
                    f"{self._describe}: the stream ended without a result event"
                ) from None
            raise
        except httpx.TransportError as e:
            self.close()
            raise _core.wrap_transport_error(e, "POST", self._describe) from e
        except BaseException:
            self.close()
            raise
        if isinstance(ev, ResultEvent):
            self.result = ev.result
            if self._watcher is not None:  # the program has ended: nothing more to answer
                self._watcher.stop()
        return ev

    def wait(self) -> ExecResult:
        """Consumes the remaining events and returns the result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def close(self) -> None:
        self._done = True
        if self._watcher is not None:
            self._watcher.stop()
        if self._events is not None:
            self._events.close()
        if self._resp is not None:
            self._resp.close()

    def __enter__(self) -> ExecStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Airlock:
    """A client of ``airlock serve``.

    ``base_url`` defaults to ``$AIRLOCK_URL`` or ``http://127.0.0.1:8710``; ``api_key`` to
    ``$AIRLOCK_API_KEY`` (sent as ``Authorization: Bearer``).

    Timeouts: ``timeout`` for plain requests; an exec waits its ``limits.timeout_ms`` (or
    the sandbox's, or the server's default of 10 s) plus ``timeout_margin`` for the
    admission queue and provisioning. Retries (at most ``max_retries``): connection
    failures before the request was sent; 429 (and 503, except for an exec), waiting as
    ``Retry-After`` says (giving up when it asks for more than ``max_retry_wait``);
    idempotent requests (GET, PUT) also after a broken connection. An exec is never
    repeated once it may have reached the service.

    ``http_client`` lets you bring your own :class:`httpx.Client` (proxies, event hooks,
    transports); it is not closed by :meth:`close`."""

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
        http_client: httpx.Client | None = None,
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
        self._http = http_client if http_client is not None else httpx.Client()

    @property
    def base_url(self) -> str:
        return self._config.base_url

    def __repr__(self) -> str:
        return f"Airlock({self._config.base_url!r})"

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Airlock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transport -------------------------------------------------------------------

    def _send(
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
                resp = self._http.send(request, stream=stream)
            except httpx.TransportError as e:
                if attempt < cfg.max_retries and _core.retry_on_error(method, e):
                    delay = _core.retry_delay(cfg, attempt, None)
                    assert delay is not None
                    _core.logger.info("%s %s: %s; retrying in %.2fs", method, path, e, delay)
                    time.sleep(delay)
                    attempt += 1
                    continue
                raise _core.wrap_transport_error(e, method, url) from e
            if resp.status_code < 400 or resp.status_code in accept_status:
                return resp
            try:
                if stream:
                    resp.read()
                err = errors.from_response(
                    resp.status_code, resp.content, resp.headers, not_found=not_found
                )
            except httpx.TransportError as e:
                raise _core.wrap_transport_error(e, method, url) from e
            finally:
                resp.close()
            if attempt < cfg.max_retries and _core.retry_on_status(
                method, path, resp.status_code, err.code
            ):
                delay = _core.retry_delay(cfg, attempt, err.retry_after)
                if delay is not None:
                    _core.logger.info(
                        "%s %s: %s; retrying in %.2fs", method, path, err, delay
                    )
                    time.sleep(delay)
                    attempt += 1
                    continue
            raise err

    def _exec(self, path: str, body: dict[str, Any], default_ms: int | None) -> ExecResult:
        resp = self._send(
            "POST", path, json=body, timeout=_core.exec_timeout(self._config, body, default_ms)
        )
        return ExecResult.from_dict(_core.parse_json(resp))

    def _stream(
        self,
        path: str,
        body: dict[str, Any],
        default_ms: int | None,
        watcher: _ApprovalWatcher | None = None,
    ) -> ExecStream:
        timeout = _core.exec_timeout(self._config, body, default_ms)
        return ExecStream(
            lambda: self._send("POST", path, json=body, timeout=timeout, stream=True),
            self._config.base_url + path,
            watcher,
        )

    # --- one-shot execs --------------------------------------------------------------

    def run(
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
        ``Env`` come first; the request's ``env`` wins). ``files_changed_in``: where
        :attr:`ExecResult.files_changed <airlock.ExecResult.files_changed>` looks
        (``"/workspace"``, ``"/tmp"``; default ``["/workspace"]``, ``[]`` for none)."""
        body = _core.exec_body(
            language=language, code=code, stdin=stdin, files=files, env=env, limits=limits,
            network=network, isolation=isolation, image=image, files_changed_in=files_changed_in,
        )
        return self._exec("/v1/exec", body, None)

    def exec(
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
        """Runs the argv ``cmd`` in a fresh sandbox (``cmd[0]`` is looked up in PATH)."""
        body = _core.exec_body(
            cmd=cmd, stdin=stdin, files=files, env=env, limits=limits, network=network,
            isolation=isolation, image=image, files_changed_in=files_changed_in,
        )
        return self._exec("/v1/exec", body, None)

    def shell(
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
        """Runs a shell command line (``bash -c command``) in a fresh sandbox."""
        return self.exec(
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
    ) -> ExecStream:
        """Like :meth:`run` (or :meth:`exec` with ``cmd=``), streaming output events as
        they arrive and then the result::

            for ev in al.stream("for i in range(3): print(i)"):
                if isinstance(ev, StdoutEvent): print(ev.data, end="")
        """
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
    ) -> Sandbox:
        """Creates a session sandbox (files in /workspace and /tmp persist between its
        execs). Use it in a ``with`` block to delete it on exit, or call
        :meth:`Sandbox.delete`; otherwise it lives ``ttl_s`` seconds (server default 600).
        ``isolation="gvisor"`` gives the session a gVisor sandbox of its own,
        ``isolation="microvm"`` a micro-VM of its own.

        ``from_snapshot`` (a :class:`~airlock.Snapshot` or its id) starts it from that
        snapshot: its files, and its image and isolation (giving either raises
        :class:`~airlock.InvalidRequest`); its limits and network unless given;
        :class:`~airlock.SnapshotNotFound` if there is no such snapshot.
        ``on_idle="pause"``: the session pauses itself after ``idle_timeout_s`` seconds
        without a request, and the next request that needs it resumes it."""
        body = _core.create_body(
            ttl_s, limits, network, isolation, image, from_snapshot, on_idle, idle_timeout_s
        )
        resp = self._send(
            "POST",
            "/v1/sandboxes",
            json=body,
            timeout=_core.state_timeout(self._config) if from_snapshot is not None else None,
            not_found=errors.SnapshotNotFound,
        )
        data = _core.parse_json(resp)
        lim = Limits.coerce(limits)
        return Sandbox(self, data["id"], data.get("expires_at"), lim.timeout_ms if lim else None)

    def get_sandbox(self, sandbox_id: str) -> Sandbox:
        """A handle on an existing session sandbox (checked with the service)."""
        info = SandboxInfo.from_dict(_core.parse_json(self._send("GET", _core.sandbox_path(sandbox_id))))
        return Sandbox(self, info.id, info.expires_at, None)

    def list_sandboxes(self) -> builtins.list[SandboxInfo]:
        """The caller's live session sandboxes, oldest first."""
        data = _core.parse_json(self._send("GET", "/v1/sandboxes"))
        return [SandboxInfo.from_dict(d) for d in data]

    # --- snapshots -------------------------------------------------------------------

    def list_snapshots(self) -> SnapshotList:
        """The caller's snapshots (a list of :class:`~airlock.Snapshot`, oldest first),
        with the store's ``used_bytes`` and ``budget_bytes``."""
        return SnapshotList.from_dict(_core.parse_json(self._send("GET", "/v1/snapshots")))

    def get_snapshot(self, snapshot: Snapshot | str) -> Snapshot:
        """A snapshot by id; :class:`~airlock.SnapshotNotFound` if there is none (or it is
        another API key's)."""
        resp = self._send("GET", _core.snapshot_path(snapshot), not_found=errors.SnapshotNotFound)
        return Snapshot.from_dict(_core.parse_json(resp))

    def delete_snapshot(self, snapshot: Snapshot | str) -> None:
        """Deletes a snapshot and frees what only it held on the server's disk; sessions
        started from it are not affected. :class:`~airlock.SnapshotNotFound` if there is
        none."""
        self._send("DELETE", _core.snapshot_path(snapshot), not_found=errors.SnapshotNotFound)

    # --- operations ------------------------------------------------------------------

    def health(self) -> bool:
        """``GET /healthz``: whether the process answers."""
        try:
            resp = self._send("GET", "/healthz")
        except errors.AirlockConnectionError:
            return False
        return bool(_core.parse_json(resp).get("status") == "ok")

    def ready(self) -> Readiness:
        """``GET /readyz``: the warm pool's state (``ready`` is False while it warms up or
        the service stops)."""
        resp = self._send("GET", "/readyz", accept_status=(503,))
        return Readiness.from_dict(_core.parse_json(resp))

    def metrics(self) -> str:
        """``GET /metrics``: Prometheus text."""
        return self._send("GET", "/metrics").text

    def openapi(self) -> dict[str, Any]:
        """``GET /openapi.json``: the API's OpenAPI document."""
        return dict(_core.parse_json(self._send("GET", "/openapi.json")))


def _stream_body(
    code: str | None,
    language: str,
    cmd: Sequence[str] | None,
    stdin: str | bytes | None,
    files: FilesArg,
    env: Mapping[str, str] | None,
    limits: Limits | Mapping[str, Any] | None,
    network: Network | Mapping[str, Any] | str | None,
    files_changed_in: Sequence[str] | None = None,
) -> dict[str, Any]:
    if (code is None) == (cmd is None):
        raise TypeError("give code (with language) or cmd=, not both")
    if cmd is not None:
        return _core.exec_body(
            cmd=cmd, stdin=stdin, files=files, env=env, limits=limits, network=network,
            files_changed_in=files_changed_in,
        )
    return _core.exec_body(
        language=language, code=code, stdin=stdin, files=files, env=env, limits=limits,
        network=network, files_changed_in=files_changed_in,
    )


class Files:
    """The files of a session sandbox's /workspace (paths are relative to it; a leading
    ``/workspace/`` is accepted). Reads and writes happen inside the sandbox without
    following symlinks."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def write(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        """Writes ``data`` (``str`` as UTF-8) to ``path``, creating parent directories and
        replacing an existing file; ``mode`` like ``0o755`` (default 0o644)."""
        content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        params = {"path": path}
        if mode is not None:
            params["mode"] = format(mode, "o")
        self._sb._client._send(
            "PUT", _core.sandbox_path(self._sb.id, "/files"), content=content, params=params
        )

    def read(self, path: str) -> bytes:
        """The bytes of ``path``; :class:`~airlock.FileNotFound` if it does not exist."""
        resp = self._sb._client._send(
            "GET",
            _core.sandbox_path(self._sb.id, "/files"),
            params={"path": path},
            not_found=errors.FileNotFound,
        )
        return resp.content

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    def list(self) -> builtins.list[FileEntry]:
        """Everything under /workspace, recursively."""
        data = _core.parse_json(
            self._sb._client._send("GET", _core.sandbox_path(self._sb.id, "/files"))
        )
        return [FileEntry.from_dict(d) for d in data]


class Sandbox:
    """A session sandbox: its /workspace and /tmp persist between execs; each exec's
    processes end with it. A context manager that deletes the sandbox on exit."""

    def __init__(
        self,
        client: Airlock,
        sandbox_id: str,
        expires_at: float | None,
        default_timeout_ms: int | None,
    ) -> None:
        self._client = client
        self.id = sandbox_id
        self.expires_at = expires_at
        """When its TTL ends, in seconds since the epoch."""
        self._default_ms = default_timeout_ms
        self.files = Files(self)
        self.processes = Processes(self)
        """Programs running in the background of the session (servers, watchers)."""
        self._closed = False

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r})"

    def run(
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
        """Runs ``code`` in the session. ``on_approval`` answers the connections the
        session's policy holds for approval while it runs; ``files_changed_in`` as in
        :meth:`exec`."""
        body = _core.exec_body(
            language=language, code=code, stdin=stdin, files=files, env=env, limits=limits,
            files_changed_in=files_changed_in,
        )
        return self._exec(body, on_approval)

    def exec(
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
        """Runs the argv ``cmd`` in the session (in /workspace). The result's
        :attr:`~airlock.ExecResult.files_changed` lists what it created, modified and
        deleted in ``files_changed_in`` (``"/workspace"``, ``"/tmp"``; default
        ``["/workspace"]``; ``[]`` for none). :class:`~airlock.SandboxPaused` while the
        session is paused.

        ``on_approval``: in a session created with ``Network.proxy(on_denied="ask")``,
        called with an :class:`~airlock.Approval` for each connection the policy holds
        while this exec runs (from a background thread); what it returns is the answer:
        ``"allow_once"`` or ``True``, ``"allow_session"`` (the host and port are added to
        the session's ``allow``), ``"deny"`` or ``False``. ``None``, anything else, or an
        exception denies. It is no longer called once the exec returns. A held connection
        nobody answers is refused after the policy's ``approval_timeout_ms``."""
        body = _core.exec_body(
            cmd=cmd, stdin=stdin, files=files, env=env, limits=limits, files_changed_in=files_changed_in
        )
        return self._exec(body, on_approval)

    def shell(
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
        """Runs ``bash -c command`` (in /workspace); ``on_approval`` and
        ``files_changed_in`` as in :meth:`exec`."""
        return self.exec(
            ["bash", "-c", command], stdin=stdin, files=files, env=env, limits=limits,
            on_approval=on_approval, files_changed_in=files_changed_in,
        )

    def _exec(self, body: dict[str, Any], on_approval: _core.OnApproval | None) -> ExecResult:
        path = _core.sandbox_path(self.id, "/exec")
        if on_approval is None:
            return self._client._exec(path, body, self._default_ms)
        with _ApprovalWatcher(self, on_approval):
            return self._client._exec(path, body, self._default_ms)

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
    ) -> ExecStream:
        """Like :meth:`run` (or :meth:`exec` with ``cmd=``), streaming; ``on_approval``
        answers held connections from when iteration starts until the stream ends or is
        closed."""
        body = _stream_body(code, language, cmd, stdin, files, env, limits, None, files_changed_in)
        watcher = _ApprovalWatcher(self, on_approval) if on_approval is not None else None
        return self._client._stream(_core.sandbox_path(self.id, "/exec"), body, self._default_ms, watcher)

    def info(self) -> SandboxInfo:
        """The session as the service shows it (:attr:`~airlock.SandboxInfo.status`:
        ``"running"`` or ``"paused"``)."""
        return SandboxInfo.from_dict(
            _core.parse_json(self._client._send("GET", _core.sandbox_path(self.id)))
        )

    # --- snapshots, forks, pause -----------------------------------------------------------

    @classmethod
    def from_snapshot(cls, client: Airlock, snapshot: Snapshot | str, **kw: Any) -> Sandbox:
        """``client.sandbox(from_snapshot=snapshot, **kw)``: a new session starting from
        the snapshot's files (``ttl_s``, ``limits``, ``network``, ``on_idle``,
        ``idle_timeout_s`` may be given)."""
        return client.sandbox(from_snapshot=snapshot, **kw)

    def snapshot(self, kind: Literal["auto", "filesystem", "full"] | None = None) -> Snapshot:
        """Saves the session's state now: its writable filesystem (/workspace, /tmp,
        /dev/shm), limits, network policy and image; with a ``"full"`` snapshot (the
        default, ``"auto"``, where the tier can: gVisor, micro-VMs) its memory and running
        processes too. ``kind="full"`` on a tier that cannot raises
        :class:`~airlock.InvalidRequest` (``field == "kind"``);
        :class:`~airlock.SnapshotBudgetExceeded` when the server's snapshot budget is
        full."""
        resp = self._client._send(
            "POST",
            _core.sandbox_path(self.id, "/snapshots"),
            json=_core.snapshot_body(kind),
            timeout=_core.state_timeout(self._client._config),
        )
        return Snapshot.from_dict(_core.parse_json(resp))

    def restore(self, snapshot: Snapshot | str) -> SandboxInfo:
        """Rolls the session back to ``snapshot`` in place: its files become exactly the
        snapshot's (anything written since is gone); its background processes, terminals
        and code kernel are ended first. :class:`~airlock.SnapshotNotFound`,
        :class:`~airlock.IncompatibleSnapshot` (a snapshot of another image)."""
        resp = self._client._send(
            "POST",
            _core.sandbox_path(self.id, "/restore"),
            json={"snapshot_id": snapshot_id(snapshot)},
            timeout=_core.state_timeout(self._client._config),
            not_found=errors.SnapshotNotFound,
        )
        return SandboxInfo.from_dict(_core.parse_json(resp))

    def fork(self, count: int, *, ttl_s: int | None = None) -> builtins.list[Sandbox]:
        """``count`` new sessions, each a copy of this one now (files, limits, network,
        image), independent of it and of each other. Delete them when done (or use each
        in a ``with`` block). A ``count`` above the server's ``--max-fork`` (default 16)
        raises :class:`~airlock.InvalidRequest` (``field == "count"``)."""
        resp = self._client._send(
            "POST",
            _core.sandbox_path(self.id, "/fork"),
            json=_core.fork_body(count, ttl_s),
            timeout=_core.state_timeout(self._client._config),
        )
        return [
            Sandbox(self._client, d["id"], d.get("expires_at"), self._default_ms)
            for d in _core.parse_json(resp)["sandboxes"]
        ]

    def pause(self) -> SandboxInfo:
        """Freezes every process of the session; it accepts no exec, file or process
        request (:class:`~airlock.SandboxPaused`) until :meth:`resume`. Idempotent."""
        resp = self._client._send("POST", _core.sandbox_path(self.id, "/pause"), json={})
        return SandboxInfo.from_dict(_core.parse_json(resp))

    def resume(self) -> SandboxInfo:
        """Thaws a paused session: its processes go on where they were. Idempotent."""
        resp = self._client._send("POST", _core.sandbox_path(self.id, "/resume"), json={})
        return SandboxInfo.from_dict(_core.parse_json(resp))

    # --- code interpreter --------------------------------------------------------------

    def run_code(
        self,
        code: str,
        *,
        timeout: float | None = None,
        on_stdout: Callable[[str], object] | None = None,
        on_stderr: Callable[[str], object] | None = None,
        on_result: Callable[[Result], object] | None = None,
        on_error: Callable[[ExecutionError], object] | None = None,
    ) -> Execution:
        """Runs a Python cell in the session's Jupyter kernel (started on the first call:
        see :attr:`Execution.kernel_start_ms`): variables, imports and open files persist
        between calls. Returns an :class:`~airlock.Execution`: what it printed, its rich
        results (the last expression's value, figures, DataFrames as HTML), and the
        exception it raised as :attr:`~airlock.Execution.error` (not raised here).

        ``timeout`` (seconds; default: the session's ``limits.timeout_ms``, 10 s unless
        set): past it the kernel is interrupted
        (``error.name == "KeyboardInterrupt"``, ``timed_out``) and keeps its state. With
        callbacks, output is streamed: each is called in this thread as its event arrives,
        in order. :class:`~airlock.InvalidRequest` on ``image`` when the session's image
        has no ipykernel."""
        body, timeout_ = _core.code_request(self._client._config, code, timeout, self._default_ms)
        path = _core.sandbox_path(self.id, "/code")
        callbacks = (on_stdout, on_stderr, on_result, on_error)
        if all(c is None for c in callbacks):
            resp = self._client._send("POST", path, json=body, timeout=timeout_)
            return Execution.from_dict(_core.parse_json(resp))
        resp = self._client._send("POST", path, json=body, timeout=timeout_, stream=True)
        parser = _core.SSEParser()
        try:
            lines = resp.iter_lines()
            while True:
                line = next(lines, None)
                ev = _core.code_events(parser, line)
                if ev is not None:
                    kind, value = ev
                    if kind == "done":
                        return value  # type: ignore[no-any-return]
                    cb = {"stdout": on_stdout, "stderr": on_stderr, "result": on_result, "error": on_error}[kind]
                    if cb is not None:
                        cb(value)
                if line is None:
                    raise errors.AirlockConnectionError(
                        f"POST {self._client.base_url}{path}: the stream ended without a done event"
                    )
        except httpx.TransportError as e:
            raise _core.wrap_transport_error(e, "POST", self._client.base_url + path) from e
        finally:
            resp.close()

    def restart_code(self) -> None:
        """Replaces the session's kernel with a new one: every variable and import is
        gone."""
        timeout = httpx.Timeout(
            self._client._config.timeout + _core.KERNEL_START_MARGIN_S,
            connect=self._client._config.connect_timeout,
        )
        self._client._send("POST", _core.sandbox_path(self.id, "/code/restart"), json={}, timeout=timeout)

    # --- terminal ------------------------------------------------------------------------

    def pty(self, rows: int = 24, cols: int = 80, cmd: str | Sequence[str] | None = None) -> Terminal:
        """Starts ``cmd`` on a terminal of ``rows`` x ``cols`` in the session and connects
        to it over a WebSocket (the API key goes in the ``Authorization`` header; the
        client's ``http_client`` is not used). ``cmd`` is a shell command line
        (``"python3 -q"``; the service runs ``sh -c "exec CMD"``) or an argv list (quoted
        into one); default: ``bash``, else ``sh``. Use it in a ``with`` block: leaving it
        hangs the terminal up."""
        return Terminal._open(self._client._config, self.id, rows, cols, cmd)

    # --- ports ---------------------------------------------------------------------------

    def expose(self, port: int) -> Port:
        """Makes the sandbox's ``127.0.0.1:port`` reachable through the service at
        :attr:`Port.url <airlock.Port.url>`, with the API key or the port's token.
        Exposing a port twice gives the same :class:`~airlock.Port`. Nothing has to
        listen yet (requests meanwhile get 502)."""
        resp = self._client._send("POST", _core.sandbox_path(self.id, "/ports"), json=_core.port_body(port))
        return Port.from_dict(_core.parse_json(resp), self._client.base_url)

    def unexpose(self, port: int | Port) -> None:
        """Closes an exposed port (its token stops working);
        :class:`~airlock.PortNotFound` when it is not exposed."""
        n = port.port if isinstance(port, Port) else port
        self._client._send("DELETE", _core.sandbox_path(self.id, f"/ports/{int(n)}"), not_found=errors.PortNotFound)

    def ports(self) -> builtins.list[Port]:
        """The ports exposed now."""
        data = _core.parse_json(self._client._send("GET", _core.sandbox_path(self.id, "/ports")))
        return [Port.from_dict(p, self._client.base_url) for p in data["ports"]]

    # --- network -----------------------------------------------------------------------

    def network(self) -> Network:
        """The session's network policy now (``Network.none()`` without a network);
        secrets are listed with ``value=None``: the service never shows a value back."""
        resp = self._client._send("GET", _core.sandbox_path(self.id, "/network"))
        net = Network.coerce(_core.parse_json(resp))
        assert net is not None
        return net

    def update_network(
        self,
        *,
        allow: Sequence[str] | None = None,
        allow_cidrs: Sequence[str] | None = None,
        deny: Sequence[str] | None = None,
        on_denied: Literal["deny", "ask"] | None = None,
    ) -> Network:
        """Changes the session's policy for its next connections (those already open keep
        their decision): each list given replaces the session's, ``on_denied`` switches
        asking on or off. The change is recorded in the next exec's egress log (kind
        ``policy``). Returns the policy now. A session without a network raises
        :class:`~airlock.InvalidRequest` with ``field == "network"``; a bad entry names
        it (``network.deny[0]``)."""
        body = _core.network_patch(allow, allow_cidrs, deny, on_denied)
        resp = self._client._send("PATCH", _core.sandbox_path(self.id, "/network"), json=body)
        net = Network.coerce(_core.parse_json(resp))
        assert net is not None
        return net

    def approvals(self, wait: float | None = None) -> builtins.list[Approval]:
        """The connections held for approval now, oldest first. With ``wait`` (seconds, at
        most 60), waits that long for one when none is held."""
        params, timeout = _core.approvals_request(self._client._config, wait)
        resp = self._client._send(
            "GET", _core.sandbox_path(self.id, "/approvals"), params=params, timeout=timeout
        )
        return [Approval.from_dict(a) for a in _core.parse_json(resp)["approvals"]]

    def approve(self, approval: Approval | int, decision: _core.ApprovalAnswer | str) -> None:
        """Answers a held connection: ``"allow_once"`` (or ``True``), ``"allow_session"``
        (its host and port are added to the session's ``allow``) or ``"deny"`` (or
        ``False``). :class:`~airlock.ApprovalNotFound` when it no longer waits (answered,
        expired, or its program ended)."""
        aid = _core.approval_id(approval)
        self._client._send(
            "POST",
            _core.sandbox_path(self.id, f"/approvals/{aid}"),
            json={"decision": _core.decision(decision)},
            not_found=errors.ApprovalNotFound,
        )

    def delete(self) -> None:
        """Purges the sandbox now (raises if it is unknown or expired)."""
        self._client._send("DELETE", _core.sandbox_path(self.id))
        self._closed = True

    def close(self) -> None:
        """Deletes the sandbox unless already gone (idempotent)."""
        if self._closed:
            return
        try:
            self.delete()
        except (errors.NotFound, errors.SandboxExpired):
            self._closed = True

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ApprovalWatcher:
    """While one exec of ``sandbox`` runs: a daemon thread that long-polls the session's
    held connections and answers each with what ``callback`` returns. Leaving the ``with``
    block stops it: it answers nothing afterwards (a poll in flight is abandoned, not
    waited for)."""

    def __init__(self, sandbox: Sandbox, callback: _core.OnApproval) -> None:
        self._sb = sandbox
        self._callback = callback
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"airlock-approvals-{sandbox.id}", daemon=True
        )

    def start(self) -> None:
        if self._thread.ident is None:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def __enter__(self) -> _ApprovalWatcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            self._watch()
        except Exception:  # never an unhandled exception in a thread of the caller's
            if not self._stop.is_set():
                _core.logger.exception("answering approvals of sandbox %s", self._sb.id)

    def _watch(self) -> None:
        answered: set[int] = set()
        while not self._stop.is_set():
            try:
                held = self._sb.approvals(wait=_core.APPROVAL_POLL_S)
            except (errors.NotFound, errors.SandboxExpired, errors.InvalidRequest) as e:
                if not self._stop.is_set():
                    _core.logger.warning("on_approval: sandbox %s cannot ask: %s", self._sb.id, e)
                return
            except errors.AirlockError as e:
                if self._stop.is_set():
                    return
                _core.logger.warning("on_approval: listing approvals of %s: %s", self._sb.id, e)
                self._stop.wait(0.5)
                continue
            fresh = [a for a in held if a.id not in answered]
            if not fresh:
                # Only connections answered already (their answer is on its way): do not
                # poll in a tight loop meanwhile.
                self._stop.wait(0.05)
                continue
            for approval in fresh:
                if self._stop.is_set():
                    return
                answered.add(approval.id)
                try:
                    answer = self._callback(approval)
                except Exception:
                    _core.logger.exception(
                        "on_approval raised for %s:%s; denying", approval.host, approval.port
                    )
                    answer = "deny"
                if self._stop.is_set():
                    return
                try:
                    self._sb.approve(approval, _core.callback_decision(answer, approval))
                except errors.ApprovalNotFound:
                    pass  # expired or ended meanwhile: refused already
                except errors.AirlockError as e:
                    _core.logger.warning("on_approval: answering %s: %s", approval.id, e)


class ProcessStream(Iterator[ProcessEvent]):
    """The output of a background process as it comes: :class:`~airlock.StdoutEvent` and
    :class:`~airlock.StderrEvent` (from the start of what is kept), then one
    :class:`~airlock.ExitEvent`. Closing it (``with`` block) does not stop the process.
    :attr:`process` holds the :class:`~airlock.Process` of the last event."""

    def __init__(self, opener: Callable[[], httpx.Response], describe: str) -> None:
        self._opener = opener
        self._describe = describe
        self._resp: httpx.Response | None = None
        self._events: Generator[ProcessEvent, None, None] | None = None
        self._done = False
        self.process: Process | None = None

    def __iter__(self) -> ProcessStream:
        return self

    def __next__(self) -> ProcessEvent:
        if self._done:
            raise StopIteration
        try:
            if self._events is None:
                self._resp = self._opener()
                self._events = _core.iter_process_events(self._resp.iter_lines())
            ev = next(self._events)
        except StopIteration:
            self.close()
            if self.process is None:
                raise errors.AirlockConnectionError(
                    f"{self._describe}: the stream ended without an exit event"
                ) from None
            raise
        except httpx.TransportError as e:
            self.close()
            raise _core.wrap_transport_error(e, "GET", self._describe) from e
        except BaseException:
            self.close()
            raise
        if isinstance(ev, ExitEvent):
            self.process = ev.process
            self._done = True
            self.close()
        return ev

    def close(self) -> None:
        self._done = True
        if self._events is not None:
            self._events.close()
        if self._resp is not None:
            self._resp.close()

    def __enter__(self) -> ProcessStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Processes:
    """Programs running in the background of a session, alongside its execs: servers,
    watchers, long jobs. Each keeps the last ``output_bytes`` (default 1 MiB) of its
    stdout and of its stderr; all die with the session. At most 16 run at once
    (:class:`~airlock.SandboxConflict` beyond). Methods take a process id or a
    :class:`~airlock.Process`; an unknown one raises :class:`~airlock.ProcessNotFound`."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def _send(self, method: str, path: str, **kw: Any) -> Any:
        resp = self._sb._client._send(method, path, not_found=errors.ProcessNotFound, **kw)
        return _core.parse_json(resp)

    def start(
        self,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
    ) -> Process:
        """Starts the argv ``cmd`` and returns at once. ``stdin`` is written to its
        standard input first, which stays open (:meth:`write_stdin`). ``timeout``
        (seconds): SIGKILL after it (``timed_out``); none: it runs until it ends or the
        session does."""
        body = _core.process_body(cmd, env, workdir, stdin, timeout)
        return Process.from_dict(self._send("POST", _core.sandbox_path(self._sb.id, "/exec"), json=body))

    def list(self) -> builtins.list[Process]:
        """The session's processes, running and recently ended."""
        data = self._send("GET", _core.sandbox_path(self._sb.id, "/processes"))
        return [Process.from_dict(p) for p in data["processes"]]

    def get(self, process: Process | str) -> Process:
        return Process.from_dict(self._send("GET", _core.process_path(self._sb.id, process)))

    def output(self, process: Process | str) -> ProcessOutput:
        """What its output keeps now (see :class:`~airlock.ProcessOutput`)."""
        return ProcessOutput.from_dict(self._send("GET", _core.process_path(self._sb.id, process, "/output")))

    def stream(
        self, process: Process | str, *, follow: bool = True, timeout: float | None = None
    ) -> ProcessStream:
        """Its output events from the start of what is kept; with ``follow`` (the
        default), as it comes until the process ends (an ``exit`` event); without, until
        what is kept now is sent (an ``end`` event). ``timeout``: at most that many
        seconds between two events (default: no limit)."""
        path = _core.process_path(self._sb.id, process, "/output")
        params = {"follow": "true" if follow else "false"}
        client = self._sb._client
        t = _core.follow_timeout(client._config, timeout)
        return ProcessStream(
            lambda: client._send(
                "GET", path, params=params, timeout=t, stream=True, not_found=errors.ProcessNotFound
            ),
            client.base_url + path,
        )

    def write_stdin(self, process: Process | str, data: str | bytes, *, eof: bool = False) -> Process:
        """Writes ``data`` (``str`` as UTF-8, ``bytes`` as they are) to its standard
        input; ``eof=True`` closes it afterwards."""
        body = _core.stdin_body(data, eof)
        return Process.from_dict(self._send("POST", _core.process_path(self._sb.id, process, "/stdin"), json=body))

    def close_stdin(self, process: Process | str) -> Process:
        """Closes its standard input (the program reads end of file)."""
        return self.write_stdin(process, "", eof=True)

    def signal(self, process: Process | str, signal: str | int = "SIGTERM") -> Process:
        """Sends a signal: a name (``"SIGTERM"``, ``"SIGINT"``, ``"SIGKILL"``,
        ``"SIGHUP"``, ``"SIGQUIT"``, ``"SIGUSR1"``, ``"SIGUSR2"``, ``"SIGSTOP"``,
        ``"SIGCONT"``; ``signal.SIGTERM`` too) or a number."""
        body = {"signal": _core.signal_name(signal)}
        return Process.from_dict(self._send("POST", _core.process_path(self._sb.id, process, "/signal"), json=body))

    def kill(self, process: Process | str) -> Process:
        """``signal(process, "SIGKILL")``."""
        return self.signal(process, "SIGKILL")

    def wait(self, process: Process | str, timeout: float = 30.0) -> Process:
        """Waits up to ``timeout`` seconds (at most 600) for it to end; returns the
        :class:`~airlock.Process` either way (``running`` says whether it ended)."""
        body, t = _core.wait_request(self._sb._client._config, timeout)
        return Process.from_dict(
            self._send("POST", _core.process_path(self._sb.id, process, "/wait"), json=body, timeout=t)
        )
