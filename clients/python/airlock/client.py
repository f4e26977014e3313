"""The synchronous client: :class:`Airlock`, :class:`Sandbox`, :class:`Files`,
:class:`ExecStream`."""

from __future__ import annotations

import builtins
import json as _json
import threading
import time
from typing import Any, Callable, Generator, Iterator, Literal, Mapping, Sequence

import httpx

from . import _core, errors
from .types import (
    Approval,
    ExecResult,
    FileEntry,
    FilesArg,
    Limits,
    Network,
    Readiness,
    ResultEvent,
    SandboxInfo,
    StreamEvent,
)

__all__ = ["Airlock", "ExecStream", "Files", "Sandbox"]


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
    ) -> ExecResult:
        """Runs ``code`` (``python``, ``javascript`` or ``bash``) in a fresh sandbox;
        ``isolation="gvisor"`` runs it under gVisor's user-space kernel,
        ``isolation="microvm"`` inside a micro-VM of its own. ``image="python:3.12-slim"``
        runs it in that image from the service's image store (its ``PATH`` and other
        ``Env`` come first; the request's ``env`` wins)."""
        body = _core.exec_body(
            language=language, code=code, stdin=stdin, files=files, env=env, limits=limits,
            network=network, isolation=isolation, image=image,
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
    ) -> ExecResult:
        """Runs the argv ``cmd`` in a fresh sandbox (``cmd[0]`` is looked up in PATH)."""
        body = _core.exec_body(
            cmd=cmd, stdin=stdin, files=files, env=env, limits=limits, network=network,
            isolation=isolation, image=image,
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
    ) -> ExecResult:
        """Runs a shell command line (``bash -c command``) in a fresh sandbox."""
        return self.exec(
            ["bash", "-c", command], stdin=stdin, files=files, env=env, limits=limits,
            network=network, isolation=isolation, image=image,
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
    ) -> ExecStream:
        """Like :meth:`run` (or :meth:`exec` with ``cmd=``), streaming output events as
        they arrive and then the result::

            for ev in al.stream("for i in range(3): print(i)"):
                if isinstance(ev, StdoutEvent): print(ev.data, end="")
        """
        body = _stream_body(code, language, cmd, stdin, files, env, limits, network)
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
    ) -> Sandbox:
        """Creates a session sandbox (files in /workspace and /tmp persist between its
        execs). Use it in a ``with`` block to delete it on exit, or call
        :meth:`Sandbox.delete`; otherwise it lives ``ttl_s`` seconds (server default 600).
        ``isolation="gvisor"`` gives the session a gVisor sandbox of its own,
        ``isolation="microvm"`` a micro-VM of its own."""
        body = _core.create_body(ttl_s, limits, network, isolation, image)
        resp = self._send("POST", "/v1/sandboxes", json=body)
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
) -> dict[str, Any]:
    if (code is None) == (cmd is None):
        raise TypeError("give code (with language) or cmd=, not both")
    if cmd is not None:
        return _core.exec_body(cmd=cmd, stdin=stdin, files=files, env=env, limits=limits, network=network)
    return _core.exec_body(
        language=language, code=code, stdin=stdin, files=files, env=env, limits=limits,
        network=network,
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
    ) -> ExecResult:
        """Runs ``code`` in the session. ``on_approval`` answers the connections the
        session's policy holds for approval while it runs (see :meth:`exec`)."""
        body = _core.exec_body(language=language, code=code, stdin=stdin, files=files, env=env, limits=limits)
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
    ) -> ExecResult:
        """Runs the argv ``cmd`` in the session (in /workspace).

        ``on_approval``: in a session created with ``Network.proxy(on_denied="ask")``,
        called with an :class:`~airlock.Approval` for each connection the policy holds
        while this exec runs (from a background thread); what it returns is the answer:
        ``"allow_once"`` or ``True``, ``"allow_session"`` (the host and port are added to
        the session's ``allow``), ``"deny"`` or ``False``. ``None``, anything else, or an
        exception denies. It is no longer called once the exec returns. A held connection
        nobody answers is refused after the policy's ``approval_timeout_ms``."""
        body = _core.exec_body(cmd=cmd, stdin=stdin, files=files, env=env, limits=limits)
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
    ) -> ExecResult:
        """Runs ``bash -c command`` (in /workspace); ``on_approval`` as in :meth:`exec`."""
        return self.exec(
            ["bash", "-c", command], stdin=stdin, files=files, env=env, limits=limits,
            on_approval=on_approval,
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
    ) -> ExecStream:
        """Like :meth:`run` (or :meth:`exec` with ``cmd=``), streaming; ``on_approval``
        answers held connections from when iteration starts until the stream ends or is
        closed."""
        body = _stream_body(code, language, cmd, stdin, files, env, limits, None)
        watcher = _ApprovalWatcher(self, on_approval) if on_approval is not None else None
        return self._client._stream(_core.sandbox_path(self.id, "/exec"), body, self._default_ms, watcher)

    def info(self) -> SandboxInfo:
        return SandboxInfo.from_dict(
            _core.parse_json(self._client._send("GET", _core.sandbox_path(self.id)))
        )

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
