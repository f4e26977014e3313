"""What the sync and async clients share: configuration, request bodies, the retry
policy, timeouts and the Server-Sent Events parser. No I/O here."""

from __future__ import annotations

import json
import logging
import os
import random
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generator, Iterator, Mapping, Sequence, Union
from urllib.parse import quote

import httpx

from . import errors
from ._version import __version__
from .types import (
    Approval,
    Execution,
    ExecutionError,
    ExecResult,
    ExitEvent,
    FilesArg,
    Limits,
    Network,
    Process,
    ProcessEvent,
    Result,
    ResultEvent,
    Snapshot,
    StderrEvent,
    StdoutEvent,
    StreamEvent,
    files_to_api,
    snapshot_id,
)

logger = logging.getLogger("airlock")

DEFAULT_URL = "http://127.0.0.1:8710"
DEFAULT_EXEC_TIMEOUT_MS = 10_000
"""The server's default ``limits.timeout_ms`` (used to size the client timeout when a
request gives none)."""

LANGUAGES = ("python", "javascript", "bash")


@dataclass(frozen=True)
class Config:
    base_url: str
    api_key: str | None
    timeout: float
    connect_timeout: float
    timeout_margin: float
    max_retries: int
    max_retry_wait: float
    backoff: float
    headers: Mapping[str, str]


def make_config(
    base_url: str | None,
    api_key: str | None,
    *,
    timeout: float,
    connect_timeout: float,
    timeout_margin: float,
    max_retries: int,
    max_retry_wait: float,
    backoff: float,
    headers: Mapping[str, str] | None,
) -> Config:
    url = base_url or os.environ.get("AIRLOCK_URL") or DEFAULT_URL
    if api_key is None:
        api_key = os.environ.get("AIRLOCK_API_KEY") or None
    if max_retries < 0:
        raise ValueError("max_retries must be >= 0")
    h = {"user-agent": f"airlock-sandbox-python/{__version__}"}
    if headers:
        h.update({k.lower(): v for k, v in headers.items()})
    if api_key:
        h["authorization"] = f"Bearer {api_key}"
    return Config(
        base_url=url.rstrip("/"),
        api_key=api_key,
        timeout=timeout,
        connect_timeout=connect_timeout,
        timeout_margin=timeout_margin,
        max_retries=max_retries,
        max_retry_wait=max_retry_wait,
        backoff=backoff,
        headers=h,
    )


def sandbox_path(sandbox_id: str, rest: str = "") -> str:
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}{rest}"


def exec_body(
    *,
    cmd: Sequence[str] | None = None,
    language: str | None = None,
    code: str | None = None,
    stdin: str | bytes | None = None,
    files: FilesArg = None,
    env: Mapping[str, str] | None = None,
    limits: Limits | Mapping[str, Any] | None = None,
    network: Network | Mapping[str, Any] | str | None = None,
    isolation: str | None = None,
    image: str | None = None,
    files_changed_in: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The JSON of an exec request. Shape errors the server would name are left to it,
    except those Python makes easy to get wrong (a string where argv is wanted)."""
    body: dict[str, Any] = {}
    if cmd is not None:
        if isinstance(cmd, (str, bytes)):
            raise TypeError(
                "cmd is an argv list, e.g. ['ls', '-l']; for a shell command line use "
                "shell('ls -l') or cmd=['bash', '-c', 'ls -l']"
            )
        body["cmd"] = [str(a) for a in cmd]
    if language is not None:
        body["language"] = language
    if code is not None:
        body["code"] = code
    if stdin is not None:
        body["stdin"] = stdin.decode("utf-8") if isinstance(stdin, (bytes, bytearray)) else stdin
    f = files_to_api(files)
    if f:
        body["files"] = f
    if env:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    lim = Limits.coerce(limits)
    if lim is not None and lim.to_dict():
        body["limits"] = lim.to_dict()
    net = Network.coerce(network)
    if net is not None:
        body["network"] = net.to_dict()
    if isolation is not None:
        body["isolation"] = isolation
    if image is not None:
        body["image"] = image
    if files_changed_in is not None:
        # [] is meaningful: no changeset at all.
        body["files_changed_in"] = _strings("files_changed_in", files_changed_in)
    return body


def _strings(name: str, value: Sequence[str]) -> list[str]:
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} is a list of strings, e.g. [{value!r}]")
    return [str(v) for v in value]


def create_body(
    ttl_s: int | None,
    limits: Limits | Mapping[str, Any] | None,
    network: Network | Mapping[str, Any] | str | None,
    isolation: str | None = None,
    image: str | None = None,
    from_snapshot: Snapshot | str | None = None,
    on_idle: str | None = None,
    idle_timeout_s: int | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if from_snapshot is not None:
        body["from_snapshot"] = snapshot_id(from_snapshot)
    if isolation is not None:
        body["isolation"] = isolation
    if image is not None:
        body["image"] = image
    if ttl_s is not None:
        body["ttl_s"] = int(ttl_s)
    if on_idle is not None:
        body["on_idle"] = on_idle
    if idle_timeout_s is not None:
        body["idle_timeout_s"] = int(idle_timeout_s)
    lim = Limits.coerce(limits)
    if lim is not None and lim.to_dict():
        body["limits"] = lim.to_dict()
    net = Network.coerce(network)
    if net is not None:
        body["network"] = net.to_dict()
    return body


def exec_timeout(config: Config, body: Mapping[str, Any], default_ms: int | None) -> httpx.Timeout:
    """The client timeout of an exec: its ``limits.timeout_ms`` (else the sandbox's or the
    server's default) plus ``timeout_margin`` (admission queue, provisioning, transfer)."""
    ms = (body.get("limits") or {}).get("timeout_ms") or default_ms or DEFAULT_EXEC_TIMEOUT_MS
    read = ms / 1000.0 + config.timeout_margin
    return httpx.Timeout(read, connect=config.connect_timeout)


def plain_timeout(config: Config) -> httpx.Timeout:
    return httpx.Timeout(config.timeout, connect=config.connect_timeout)


def state_timeout(config: Config) -> httpx.Timeout:
    """The client timeout of a request that copies a session's state (a snapshot, a
    restore, a fork, a creation from a snapshot): ``timeout`` plus ``timeout_margin``
    (a full micro-VM snapshot writes its memory out)."""
    return httpx.Timeout(config.timeout + config.timeout_margin, connect=config.connect_timeout)


# --- snapshots ---------------------------------------------------------------------------

def snapshot_body(kind: str | None) -> dict[str, Any]:
    """The body of ``POST …/snapshots``: ``kind`` ``"auto"`` (the server's default: full
    where the tier can), ``"filesystem"`` or ``"full"``."""
    return {} if kind is None else {"kind": kind}


def fork_body(count: int, ttl_s: int | None) -> dict[str, Any]:
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"count is an integer, not {count!r}")
    body: dict[str, Any] = {"count": count}
    if ttl_s is not None:
        body["ttl_s"] = int(ttl_s)
    return body


def snapshot_path(snapshot: Snapshot | str) -> str:
    return f"/v1/snapshots/{quote(snapshot_id(snapshot), safe='')}"


# --- network: live policy and approvals ------------------------------------------------

DECISIONS = ("allow_once", "allow_session", "deny")

APPROVAL_POLL_S = 5.0
"""How long one poll of ``on_approval``'s watcher waits for a held connection."""

ApprovalAnswer = Union[str, bool, None]
"""What an ``on_approval`` callback returns: a decision, ``True`` (allow once), ``False``
or ``None`` (deny)."""

OnApproval = Callable[[Approval], Union[ApprovalAnswer, Awaitable[ApprovalAnswer]]]


def decision(value: Any) -> str:
    """The API's decision for ``value``: ``"allow_once"``, ``"allow_session"`` or
    ``"deny"``; ``True`` is ``"allow_once"``, ``False`` ``"deny"``."""
    if value is True:
        return "allow_once"
    if value is False:
        return "deny"
    if isinstance(value, str) and value in DECISIONS:
        return value
    raise ValueError(
        f"a decision is 'allow_once', 'allow_session' or 'deny' (or True / False), not {value!r}"
    )


def callback_decision(answer: Any, approval: Approval) -> str:
    """The decision to post for what an ``on_approval`` callback returned: ``None`` and
    anything that is not a decision deny (logged)."""
    if answer is None:
        return "deny"
    try:
        return decision(answer)
    except ValueError as e:
        logger.warning("on_approval for %s:%s: %s; denying", approval.host, approval.port, e)
        return "deny"


def network_patch(
    allow: Sequence[str] | None,
    allow_cidrs: Sequence[str] | None,
    deny: Sequence[str] | None,
    on_denied: str | None,
) -> dict[str, Any]:
    """The body of ``PATCH …/network``: each list given replaces the session's."""
    body: dict[str, Any] = {}
    for name, value in (("allow", allow), ("allow_cidrs", allow_cidrs), ("deny", deny)):
        if value is None:
            continue
        if isinstance(value, (str, bytes)):
            raise TypeError(f"{name} is a list of strings, e.g. [{value!r}]")
        body[name] = [str(v) for v in value]
    if on_denied is not None:
        body["on_denied"] = on_denied
    return body


def approvals_request(config: Config, wait: float | None) -> tuple[dict[str, str], httpx.Timeout]:
    """The query and client timeout of ``GET …/approvals``: ``wait`` seconds become
    ``wait_ms`` (the service waits at most 60 s), and the client waits that much longer."""
    if wait is None:
        return {}, plain_timeout(config)
    ms = int(round(wait * 1000))
    read = max(ms, 0) / 1000.0 + config.timeout
    return {"wait_ms": str(ms)}, httpx.Timeout(read, connect=config.connect_timeout)


def approval_id(approval: Approval | int) -> int:
    return approval.id if isinstance(approval, Approval) else int(approval)


# --- retries -----------------------------------------------------------------------------

# Transport errors raised before any byte of the request left: always safe to retry.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Methods whose repetition is harmless (PUT writes the same whole file again).
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT"})


# POSTs whose effect may have happened when the service answers 503 (its shutdown grace
# ended while they ran): code ran, input was written, a signal was sent.
_RUNS = ("/exec", "/code", "/stdin", "/signal")


def is_exec(method: str, path: str) -> bool:
    """Whether the request runs something (an exec, a code cell) or acts on a running
    program (stdin, signal): not to be repeated after a 503."""
    return method == "POST" and path.endswith(_RUNS)


def retry_on_status(method: str, path: str, status: int, code: str | None = None) -> bool:
    """Whether a response status allows a retry.

    429 is answered at admission, before anything runs: retryable, except the session
    quota (``session_quota``), which only the caller can free by deleting a session. 503
    is retryable except for an exec: the service also answers 503 when its shutdown grace
    ended *while the program ran*, so an exec that got a 503 may have had effects; and
    except ``<tier>_unavailable`` (``microvm_unavailable``, ``gvisor_unavailable``), a
    condition of the host that no wait changes."""
    if status == 429:
        return code != "session_quota"
    if status == 503:
        return not (code or "").endswith("_unavailable") and not is_exec(method, path)
    return False


def retry_on_error(method: str, exc: Exception) -> bool:
    """Whether a transport error allows a retry: one raised before the request was sent,
    or any connection failure of an idempotent request. Never a read timeout."""
    if isinstance(exc, _NOT_SENT):
        return True
    if method in _IDEMPOTENT and isinstance(
        exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
    ):
        return True
    return False


def retry_delay(config: Config, attempt: int, retry_after: float | None) -> float | None:
    """Seconds to wait before retry number ``attempt`` (0-based), or ``None`` to give up
    (the server asks for a longer wait than ``max_retry_wait``)."""
    if retry_after is not None:
        if retry_after > config.max_retry_wait:
            return None
        return retry_after
    base = config.backoff * float(2**attempt)
    return min(config.max_retry_wait, base * (0.5 + random.random()))


def wrap_transport_error(exc: Exception, method: str, url: str) -> errors.AirlockError:
    if isinstance(exc, httpx.TimeoutException):
        return errors.AirlockTimeout(f"{method} {url}: timed out ({type(exc).__name__}: {exc})")
    return errors.AirlockConnectionError(f"{method} {url}: {type(exc).__name__}: {exc}")


# --- responses ---------------------------------------------------------------------------


def parse_json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError as e:
        raise errors.AirlockError(
            f"the service answered {resp.status_code} with a body that is not JSON: {e}",
            status=resp.status_code,
        ) from e


# --- Server-Sent Events ------------------------------------------------------------------


class SSEParser:
    """Feeds lines (without their line ending) and yields ``(event, data)`` pairs, as the
    SSE spec dispatches them: at a blank line, ``data`` lines joined by newlines, comment
    lines (``:``) ignored."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []

    def feed(self, line: str) -> tuple[str, str] | None:
        line = line.rstrip("\r\n")
        if line == "":
            if not self._data and not self._event:
                return None
            out = (self._event or "message", "\n".join(self._data))
            self._event = ""
            self._data = []
            return out
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None

    def flush(self) -> tuple[str, str] | None:
        return self.feed("")


def to_event(name: str, data: str) -> StreamEvent | None:
    """A stream event from an SSE pair; raises the API error of an ``error`` event;
    ``None`` for events this SDK does not know."""
    if name == "stdout":
        return StdoutEvent(json.loads(data)["data"])
    if name == "stderr":
        return StderrEvent(json.loads(data)["data"])
    if name == "result":
        return ResultEvent(ExecResult.from_dict(json.loads(data)))
    if name == "error":
        raise errors.from_event(data)
    return None


def iter_events(lines: Iterator[str]) -> Generator[StreamEvent, None, None]:
    parser = SSEParser()
    for line in lines:
        pair = parser.feed(line)
        if pair is not None:
            ev = to_event(*pair)
            if ev is not None:
                yield ev
    pair = parser.flush()
    if pair is not None:
        ev = to_event(*pair)
        if ev is not None:
            yield ev



# --- interactive sessions: processes, code, ports, terminals -----------------------------


def ms(name: str, seconds: float | None) -> int | None:
    """``seconds`` as the API's integral milliseconds (``None`` stays ``None``)."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{name} is a number of seconds, not {seconds!r}")
    return int(round(seconds * 1000))


def process_body(
    cmd: Sequence[str] | str,
    env: Mapping[str, str] | None,
    workdir: str | None,
    stdin: str | bytes | None,
    timeout: float | None,
) -> dict[str, Any]:
    """The body of ``POST …/exec`` with ``background: true``."""
    if isinstance(cmd, (str, bytes)):
        raise TypeError(
            "cmd is an argv list, e.g. ['python3', '-m', 'http.server', '8000']; for a shell "
            "command line use ['bash', '-c', 'LINE']"
        )
    body: dict[str, Any] = {"cmd": [str(a) for a in cmd], "background": True}
    if env:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    if workdir is not None:
        body["workdir"] = workdir
    if stdin is not None:
        body["stdin"] = stdin.decode("utf-8") if isinstance(stdin, (bytes, bytearray)) else stdin
    t = ms("timeout", timeout)
    if t is not None:
        # The exec's own deadline: a background process without one runs until it ends or
        # the session does (the session's default timeout does not apply to it).
        body["limits"] = {"timeout_ms": t}
    return body


def process_id(process: Process | str) -> str:
    return process.process_id if isinstance(process, Process) else str(process)


def process_path(sandbox_id: str, process: Process | str, rest: str = "") -> str:
    return sandbox_path(sandbox_id, f"/processes/{quote(process_id(process), safe='')}{rest}")


def signal_name(sig: str | int) -> str | int:
    """A signal as the API takes it: a name (``"SIGTERM"``, ``"TERM"``,
    ``signal.SIGTERM``) or a number."""
    name = getattr(sig, "name", None)  # signal.Signals
    if isinstance(name, str):
        return name
    if isinstance(sig, bool):
        raise TypeError(f"a signal is a name or a number, not {sig!r}")
    if isinstance(sig, int):
        return sig
    s = str(sig).upper()
    return s if s.startswith("SIG") else "SIG" + s


def stdin_body(data: str | bytes, eof: bool) -> dict[str, Any]:
    if isinstance(data, (bytes, bytearray, memoryview)):
        import base64

        return {"data": base64.b64encode(bytes(data)).decode("ascii"), "encoding": "base64", "eof": eof}
    return {"data": data, "eof": eof}


def wait_request(config: Config, timeout: float) -> tuple[dict[str, Any], httpx.Timeout]:
    """The body and client timeout of ``POST …/wait``: the service waits ``timeout``
    seconds at most, the client that much longer than a plain request."""
    t = ms("timeout", timeout)
    assert t is not None
    read = max(t, 0) / 1000.0 + config.timeout
    return {"timeout_ms": t}, httpx.Timeout(read, connect=config.connect_timeout)


def follow_timeout(config: Config, timeout: float | None) -> httpx.Timeout:
    """A followed stream may be silent as long as its program is: no read timeout unless
    the caller gives one."""
    return httpx.Timeout(timeout, connect=config.connect_timeout)



KERNEL_START_MARGIN_S = 60.0
"""Added to a code call's client timeout: the session's first call starts the kernel."""


def code_request(
    config: Config, code: str, timeout: float | None, default_ms: int | None
) -> tuple[dict[str, Any], httpx.Timeout]:
    """The body and client timeout of ``POST …/code``: a cell without ``timeout`` gets the
    session's ``limits.timeout_ms`` (``default_ms`` when the SDK knows it; else the
    server's default of 10 s)."""
    body: dict[str, Any] = {"code": code, "language": "python"}
    t = ms("timeout", timeout)
    if t is not None:
        body["timeout_ms"] = t
    read = (t or default_ms or DEFAULT_EXEC_TIMEOUT_MS) / 1000.0 + config.timeout_margin + KERNEL_START_MARGIN_S
    return body, httpx.Timeout(read, connect=config.connect_timeout)


def to_process_event(name: str, data: str) -> ProcessEvent | None:
    """An event of a process's output stream; raises the API error of an ``error``
    event."""
    if name in ("stdout", "stderr", "error"):
        return to_event(name, data)  # type: ignore[return-value]
    if name in ("exit", "end"):
        return ExitEvent(Process.from_dict(json.loads(data)), name)  # type: ignore[arg-type]
    return None


def iter_process_events(lines: Iterator[str]) -> Generator[ProcessEvent, None, None]:
    parser = SSEParser()
    for line in lines:
        pair = parser.feed(line)
        if pair is not None:
            ev = to_process_event(*pair)
            if ev is not None:
                yield ev
    pair = parser.flush()
    if pair is not None:
        ev = to_process_event(*pair)
        if ev is not None:
            yield ev


CodeEvent = tuple[str, Any]
"""``("stdout", str)``, ``("stderr", str)``, ``("result", Result)``,
``("error", ExecutionError)`` or ``("done", Execution)``."""


def to_code_event(name: str, data: str) -> CodeEvent | None:
    """An event of a streamed code cell. An ``error`` event is the cell's exception
    (``{"name", "value", "traceback"}``); a ``failed`` event (or an ``error`` one in the
    API's envelope, ``{"error": {"code", …}}``) is a failure of the request, raised."""
    if name in ("stdout", "stderr"):
        d = json.loads(data)
        return name, d.get("text", d.get("data", ""))
    if name == "result":
        return name, Result.from_dict(json.loads(data))
    if name == "error":
        d = json.loads(data)
        if isinstance(d, Mapping) and isinstance(d.get("error"), Mapping):
            raise errors.from_event(data)
        return name, ExecutionError.from_dict(d)
    if name == "failed":  # the request failed after the stream began (the envelope)
        raise errors.from_event(data)
    if name == "done":
        return name, Execution.from_dict(json.loads(data))
    return None


def code_events(parser: SSEParser, line: str | None) -> CodeEvent | None:
    pair = parser.feed(line) if line is not None else parser.flush()
    return to_code_event(*pair) if pair is not None else None


def port_body(port: int) -> dict[str, Any]:
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"port is an integer, not {port!r}")
    return {"port": port}


def terminal_request(
    config: Config,
    sandbox_id: str,
    rows: int,
    cols: int,
    cmd: str | Sequence[str] | None,
) -> tuple[str, dict[str, str]]:
    """The WebSocket URL of ``GET …/pty`` and the headers to send with it (the API key,
    the client's extra headers)."""
    from urllib.parse import urlencode

    import shlex

    q: list[tuple[str, str]] = []
    # The service's defaults are 24x80: sent only when they differ.
    if (int(rows), int(cols)) != (24, 80):
        q += [("rows", str(int(rows))), ("cols", str(int(cols)))]
    if isinstance(cmd, str):
        q.append(("cmd", cmd))  # a shell command line (the service runs `sh -c "exec CMD"`)
    elif cmd is not None:
        if not cmd:
            raise ValueError("cmd is an empty argv")
        q.append(("cmd", shlex.join(str(a) for a in cmd)))
    base = config.base_url
    if base.startswith("https://"):
        base = "wss://" + base[len("https://"):]
    elif base.startswith("http://"):
        base = "ws://" + base[len("http://"):]
    url = base + sandbox_path(sandbox_id, "/pty") + ("?" + urlencode(q) if q else "")
    headers = {k: v for k, v in config.headers.items() if k not in ("user-agent", "accept", "content-type")}
    return url, headers
