"""Exceptions: one per API status, each carrying the API's ``code``, ``message`` and
``field`` (``{"error": {"code", "message", "field"}}``).

A program that fails, times out or is OOM-killed is *not* an exception: the API answers
an :class:`~airlock.ExecResult` for it. Exceptions are for requests the service refused
or could not serve.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

__all__ = [
    "AirlockConnectionError",
    "AirlockError",
    "AirlockTimeout",
    "ApprovalNotFound",
    "DiskFull",
    "FileNotFound",
    "IncompatibleSnapshot",
    "InvalidRequest",
    "NotFound",
    "PayloadTooLarge",
    "PortNotFound",
    "ProcessNotFound",
    "RateLimited",
    "SandboxConflict",
    "SandboxExpired",
    "SandboxNotFound",
    "SandboxPaused",
    "ServerError",
    "SessionQuotaExceeded",
    "ServiceUnavailable",
    "SnapshotBudgetExceeded",
    "SnapshotNotFound",
    "SnapshotsUnavailable",
    "Unauthorized",
    "UnsupportedMediaType",
]


class AirlockError(Exception):
    """Base of every error this SDK raises.

    Attributes: ``status`` (HTTP status, ``None`` for transport errors), ``code`` (the
    API's stable machine-readable code, e.g. ``invalid_request``), ``message`` (for a
    person), ``field`` (the request field at fault, in the API's spelling, e.g.
    ``limits.memory_bytes``), ``retry_after`` (seconds, from ``Retry-After``)."""

    status: int | None = None

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        field: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.field = field
        if status is not None:
            self.status = status
        self.retry_after = retry_after
        self.body = body

    def __str__(self) -> str:
        parts = []
        if self.status is not None:
            parts.append(str(self.status))
        if self.code:
            parts.append(self.code)
        head = " ".join(parts)
        text = f"{head}: {self.message}" if head else self.message
        if self.field:
            text += f" (field: {self.field})"
        return text

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, "
            f"message={self.message!r}, field={self.field!r})"
        )


class InvalidRequest(AirlockError):
    """400: the request is invalid (``code`` ``invalid_request`` with ``field``, or
    ``malformed_json``)."""

    status = 400


class Unauthorized(AirlockError):
    """401: API keys are configured and the request has no valid one."""

    status = 401


class NotFound(AirlockError):
    """404: something does not exist (see the subclasses)."""

    status = 404


class SandboxNotFound(NotFound):
    """404: no such sandbox (or it belongs to another API key)."""


class FileNotFound(NotFound):
    """404: the sandbox exists but the file does not."""


class ApprovalNotFound(NotFound):
    """404: the sandbox exists but no such connection waits for approval (it was answered,
    it expired, or its program ended)."""


class ProcessNotFound(NotFound):
    """404: the sandbox exists but has no process with that id (it never had one, or the
    process ended long enough ago to be forgotten)."""


class PortNotFound(NotFound):
    """404: the sandbox exists but that port is not exposed (:meth:`Sandbox.expose
    <airlock.Sandbox.expose>` exposes it)."""


class SnapshotNotFound(NotFound):
    """404: no such snapshot (it was deleted, or it belongs to another API key)."""


class SandboxConflict(AirlockError):
    """409: the sandbox's init is gone (e.g. killed by the OOM killer; create a new one),
    the session already runs as many background processes as it may (16), or a
    process's stdin is closed (it was sent eof, or it is a terminal's). Subclasses:
    :class:`SandboxPaused`, :class:`IncompatibleSnapshot`."""

    status = 409


class SandboxPaused(SandboxConflict):
    """409 ``paused``: the session was paused with :meth:`Sandbox.pause
    <airlock.Sandbox.pause>`; it runs nothing (execs, files, processes) until
    :meth:`Sandbox.resume <airlock.Sandbox.resume>`. (A session paused by its own
    ``on_idle="pause"`` resumes by itself on the next request instead.)"""


class IncompatibleSnapshot(SandboxConflict):
    """409 ``incompatible_snapshot``: the snapshot was taken of a session of another image
    (or isolation) than the one it would be restored into; nothing was changed."""


class SandboxExpired(AirlockError):
    """410: the session sandbox's TTL passed (or it was deleted while the request waited)."""

    status = 410


class PayloadTooLarge(AirlockError):
    """413: the request body exceeds the server's ``--max-body``."""

    status = 413


class UnsupportedMediaType(AirlockError):
    """415: the body was not JSON."""

    status = 415


class RateLimited(AirlockError):
    """429: the service is at capacity (``queue_full``, ``queue_timeout`` or
    ``key_concurrency``); ``retry_after`` says when to try again. The client already
    retried ``max_retries`` times before raising this. The subclass
    :class:`SessionQuotaExceeded` (``session_quota``) is raised without retries."""

    status = 429


class SessionQuotaExceeded(RateLimited):
    """429 ``session_quota``: this API key (or, on a service without keys, the anonymous
    caller) already holds as many sessions as the server's ``--max-sessions-per-key``
    allows. Waiting does not help unless one of them expires (``retry_after`` says when
    the first does), so the client does not retry it: delete a session you no longer
    need (:meth:`Airlock.list_sandboxes` lists yours) and create the new one then."""


class ServerError(AirlockError):
    """500: the sandbox could not be built (a host problem the daemon logged)."""

    status = 500


class ServiceUnavailable(AirlockError):
    """503: the service is shutting down."""

    status = 503


class IsolationUnavailable(ServiceUnavailable):
    """503 ``<tier>_unavailable``: this host (or this server) cannot run the isolation
    tier the request asked for (``airlock doctor`` says why). A condition of the host,
    not of the request, and not retried: ask for another isolation or another host."""


class MicroVmUnavailable(IsolationUnavailable):
    """503 ``microvm_unavailable``: this host cannot run micro-VMs."""


class GvisorUnavailable(IsolationUnavailable):
    """503 ``gvisor_unavailable``: this host cannot run gVisor (no ``runsc``, or no
    platform of it works here)."""


class SnapshotsUnavailable(ServiceUnavailable):
    """503 ``snapshots_unavailable``: this server cannot keep snapshots (its
    ``--snapshot-dir`` is in use by another daemon, or not writable). Not retried."""


class DiskFull(AirlockError):
    """507: a file does not fit the sandbox's disk (``limits.disk_bytes``); the message
    names the disk's size, the file and its size, and what is free. Nothing of the file
    was left behind and the sandbox is still usable: free room, or use a sandbox with a
    larger disk."""

    status = 507


class SnapshotBudgetExceeded(DiskFull):
    """507 ``snapshot_budget``: the snapshot does not fit the server's snapshot budget
    (``--snapshot-budget``); nothing was stored. Delete snapshots you no longer need
    (:meth:`Airlock.list_snapshots <airlock.Airlock.list_snapshots>` says what is used)."""


class AirlockConnectionError(AirlockError):
    """The service could not be reached, or the connection broke."""


class AirlockTimeout(AirlockConnectionError):
    """The client-side timeout passed before the service answered."""


_BY_STATUS: dict[int, type[AirlockError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    404: NotFound,
    409: SandboxConflict,
    410: SandboxExpired,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    429: RateLimited,
    500: ServerError,
    503: ServiceUnavailable,
    507: DiskFull,
}

# Codes as they arrive in a stream's `error` event (the status is not sent there).
_BY_CODE: dict[str, type[AirlockError]] = {
    "invalid_request": InvalidRequest,
    "malformed_json": InvalidRequest,
    "unauthorized": Unauthorized,
    "not_found": NotFound,
    "busy": SandboxConflict,
    "paused": SandboxPaused,
    "incompatible_snapshot": IncompatibleSnapshot,
    "expired": SandboxExpired,
    "body_too_large": PayloadTooLarge,
    "unsupported_media_type": UnsupportedMediaType,
    "disk_full": DiskFull,
    "snapshot_budget": SnapshotBudgetExceeded,
    "queue_full": RateLimited,
    "queue_timeout": RateLimited,
    "key_concurrency": RateLimited,
    "session_quota": SessionQuotaExceeded,
    "shutting_down": ServiceUnavailable,
    "microvm_unavailable": MicroVmUnavailable,
    "gvisor_unavailable": GvisorUnavailable,
    "namespaces_unavailable": IsolationUnavailable,
    "snapshots_unavailable": SnapshotsUnavailable,
    "sandbox_error": ServerError,
    "internal": ServerError,
}


# A status and code that name a subclass of the status's class.
_BY_STATUS_AND_CODE: dict[tuple[int, str | None], type[AirlockError]] = {
    (409, "paused"): SandboxPaused,
    (409, "incompatible_snapshot"): IncompatibleSnapshot,
    (503, "snapshots_unavailable"): SnapshotsUnavailable,
    (507, "snapshot_budget"): SnapshotBudgetExceeded,
}


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (delta-seconds form; HTTP dates are not sent by airlock)."""
    if not value:
        return None
    try:
        secs = float(value.strip())
    except ValueError:
        return None
    return secs if secs >= 0 else None


def _error_fields(body: Any) -> tuple[str | None, str | None, str | None]:
    if isinstance(body, Mapping):
        err = body.get("error")
        if isinstance(err, Mapping):
            code = err.get("code")
            message = err.get("message")
            fld = err.get("field")
            return (
                code if isinstance(code, str) else None,
                message if isinstance(message, str) else None,
                fld if isinstance(fld, str) else None,
            )
    return None, None, None


def from_response(
    status: int,
    content: bytes,
    headers: Mapping[str, str],
    *,
    not_found: type[NotFound] = SandboxNotFound,
) -> AirlockError:
    """The exception for an error response. ``not_found`` is the 404 class the route
    implies (a file read may 404 on the file; a 404 naming the sandbox stays
    :class:`SandboxNotFound`)."""
    try:
        body: Any = json.loads(content) if content else None
    except ValueError:
        body = None
    code, message, fld = _error_fields(body)
    if message is None:
        text = content.decode("utf-8", "replace").strip()
        message = text[:500] or f"HTTP {status}"
    cls = _BY_STATUS.get(status)
    if status == 429 and code == "session_quota":
        cls = SessionQuotaExceeded
    if status == 503 and code in ("microvm_unavailable", "gvisor_unavailable", "namespaces_unavailable"):
        cls = _BY_CODE[code]
    if (status, code) in _BY_STATUS_AND_CODE:
        cls = _BY_STATUS_AND_CODE[(status, code)]
    if cls is NotFound:
        cls = not_found
        if not_found is not SandboxNotFound and message.startswith("no sandbox"):
            cls = SandboxNotFound
        if code == "not_found" and message == "no such route":
            cls = NotFound
    if cls is None:
        cls = ServerError if status >= 500 else AirlockError
    return cls(
        message,
        code=code,
        field=fld,
        status=status,
        retry_after=parse_retry_after(headers.get("retry-after")),
        body=body,
    )


def from_event(data: str) -> AirlockError:
    """The exception for a stream's ``error`` event."""
    try:
        body: Any = json.loads(data)
    except ValueError:
        body = None
    code, message, fld = _error_fields(body)
    cls = _BY_CODE.get(code or "", AirlockError)
    if cls is NotFound:
        cls = SandboxNotFound
    return cls(message or data, code=code, field=fld, body=body)
