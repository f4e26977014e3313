"""Typed values of the airlock API: what you send (limits, network, files) and what you get
back (ExecResult, stream events, sandbox info, file entries).

Field names are the API's own (see ``GET /openapi.json``). Results keep any field a newer
server adds in ``extra``; the API promises fields may be added, never renamed.
"""

from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal, Mapping, Sequence, Union

__all__ = [
    "Approval",
    "Decision",
    "EgressEntry",
    "ExecResult",
    "Execution",
    "ExecutionError",
    "ExitEvent",
    "File",
    "FileChange",
    "FileEntry",
    "FilesArg",
    "Limits",
    "Logs",
    "Network",
    "Outcome",
    "Port",
    "Process",
    "ProcessEvent",
    "ProcessOutput",
    "Readiness",
    "Result",
    "ResultEvent",
    "SandboxInfo",
    "SandboxUsage",
    "Secret",
    "Snapshot",
    "SnapshotList",
    "StderrEvent",
    "StdoutEvent",
    "StreamEvent",
    "TerminalExit",
]


class Outcome(str, Enum):
    """How the program ended."""

    EXITED = "exited"
    """It exited by itself; ``exit_code`` says how."""
    SIGNALED = "signaled"
    """A signal ended it (not the deadline, not the memory cap)."""
    TIMEOUT = "timeout"
    """The wall-clock deadline passed and the sandbox was killed."""
    OOM = "oom"
    """The kernel's OOM killer acted in the sandbox's cgroup."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Limits:
    """Per-request resource limits; ``None`` takes the server's default.

    A value above the server's maximum is answered with :class:`~airlock.InvalidRequest`
    whose ``field`` is e.g. ``limits.memory_bytes``.
    """

    memory_bytes: int | None = None
    """Memory cap for everything in the sandbox, tmpfs included (server default 256 MiB)."""
    cpus: float | None = None
    """CPU quota in cores (default 0.5)."""
    pids: int | None = None
    """Processes plus threads (default 64)."""
    timeout_ms: int | None = None
    """Wall-clock deadline in milliseconds (default 10 000)."""
    disk_bytes: int | None = None
    """Size of the tmpfs shared by /tmp, /workspace and /dev/shm (default 64 MiB)."""
    output_bytes: int | None = None
    """Bytes of stdout and of stderr kept, each (default 1 MiB)."""

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def coerce(cls, value: Limits | Mapping[str, Any] | None) -> Limits | None:
        if value is None or isinstance(value, Limits):
            return value
        return cls(**dict(value))


def _strings(name: str, value: Sequence[str]) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} is a list of strings, e.g. [{value!r}]")
    return tuple(value)


@dataclass(frozen=True)
class Secret:
    """A value the sandboxed program may use but never read (a value of
    ``Network.proxy(secrets=[...])``).

    The program finds a random placeholder (``airlock-ph-…``) in the environment variable
    ``name``; the egress proxy puts ``value`` in place of the placeholder in request
    headers (and the URL query with ``query=True``) only in requests to ``hosts``. A
    placeholder sent anywhere else is refused. ``repr()`` and ``str()`` never show the
    value; the service never shows it back (:meth:`Sandbox.network` gives secrets with
    ``value=None``)."""

    name: str
    """The environment variable (not one airlock sets: ``HTTP_PROXY``, ``PATH``, ...)."""
    value: str | None
    """The secret (printable ASCII); ``None`` in a policy the service showed."""
    hosts: tuple[str, ...]
    """Host patterns as in ``allow`` (not ``*``): where the value may go. Plain HTTP only
    with an explicit ``:80``."""
    query: bool = False
    """Replace the placeholder in the URL's query string too."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "hosts", _strings("hosts", self.hosts))

    def __repr__(self) -> str:
        value = "<hidden>" if self.value is not None else "None"
        return f"Secret(name={self.name!r}, value={value}, hosts={self.hosts!r}, query={self.query!r})"

    __str__ = __repr__

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name}
        if self.value is not None:
            d["value"] = self.value
        d["hosts"] = list(self.hosts)
        d["query"] = self.query
        return d

    @classmethod
    def coerce(cls, value: Secret | Mapping[str, Any]) -> Secret:
        if isinstance(value, Secret):
            return value
        d = dict(value)
        return cls(d["name"], d.get("value"), tuple(d.get("hosts") or ()), bool(d.get("query", False)))


@dataclass(frozen=True)
class Network:
    """The sandbox's network: ``Network.none()`` (the default: loopback only) or
    ``Network.proxy(allow=[...])`` (out only through airlock's filtering proxy; what it saw
    is reported in :attr:`ExecResult.egress`)."""

    mode: Literal["none", "proxy"] = "none"
    allow: tuple[str, ...] = ()
    """Host patterns: ``pypi.org``, ``*.pythonhosted.org``, ``api.example.com:8443``;
    ``*`` alone: any public host."""
    allow_cidrs: tuple[str, ...] = ()
    """Private or special ranges reachable on purpose: ``10.1.2.3/32``."""
    deny: tuple[str, ...] = ()
    """Hosts, ``*.DOMAIN`` and ranges never reached, on any port: deny wins over allow."""
    secrets: tuple[Secret, ...] = ()
    """Values the proxy puts into requests to their hosts (see :class:`Secret`)."""
    on_denied: Literal["deny", "ask"] = "deny"
    """``"ask"`` (sessions only): a connection the policy denies is held while airlock asks
    (:meth:`Sandbox.approvals`, or ``on_approval=`` of a session's exec); unanswered
    means denied."""
    approval_timeout_ms: int | None = None
    """How long a held connection waits for an answer (server default 30 000)."""

    @classmethod
    def none(cls) -> Network:
        return cls("none")

    @classmethod
    def proxy(
        cls,
        allow: Sequence[str] = (),
        allow_cidrs: Sequence[str] = (),
        *,
        deny: Sequence[str] = (),
        secrets: Sequence[Secret | Mapping[str, Any]] = (),
        on_denied: Literal["deny", "ask"] = "deny",
        approval_timeout_ms: int | None = None,
    ) -> Network:
        if isinstance(allow, str) or isinstance(allow_cidrs, str):
            raise TypeError("allow and allow_cidrs are lists of strings")
        if isinstance(secrets, (Secret, Mapping)):
            raise TypeError("secrets is a list of Secret")
        return cls(
            "proxy",
            tuple(allow),
            tuple(allow_cidrs),
            _strings("deny", deny),
            tuple(Secret.coerce(s) for s in secrets),
            on_denied,
            approval_timeout_ms,
        )

    def to_dict(self) -> dict[str, Any]:
        if self.mode == "none":
            return {"mode": "none"}
        d: dict[str, Any] = {"mode": "proxy", "allow": list(self.allow), "allow_cidrs": list(self.allow_cidrs)}
        if self.deny:
            d["deny"] = list(self.deny)
        if self.secrets:
            d["secrets"] = [s.to_dict() for s in self.secrets]
        if self.on_denied != "deny":
            d["on_denied"] = self.on_denied
        if self.approval_timeout_ms is not None:
            d["approval_timeout_ms"] = self.approval_timeout_ms
        return d

    @classmethod
    def coerce(cls, value: Network | Mapping[str, Any] | str | None) -> Network | None:
        if value is None or isinstance(value, Network):
            return value
        if isinstance(value, str):
            return cls(value)  # type: ignore[arg-type]
        d = dict(value)
        return cls(
            d.get("mode", "none"),
            tuple(d.get("allow") or ()),
            tuple(d.get("allow_cidrs") or ()),
            tuple(d.get("deny") or ()),
            tuple(Secret.coerce(s) for s in d.get("secrets") or ()),
            d.get("on_denied") or "deny",
            d.get("approval_timeout_ms"),
        )


@dataclass(frozen=True)
class File:
    """A file to write into /workspace before the program starts (a value of ``files=``).

    ``str`` content is sent as UTF-8 text, ``bytes`` as base64, byte for byte."""

    content: str | bytes
    mode: int | None = None
    """Permission bits, e.g. ``0o755``; default 0o644."""


FilesArg = Union[Mapping[str, Union[str, bytes, File]], None]
"""``{"path/in/workspace": str | bytes | File}``."""


def files_to_api(files: FilesArg) -> list[dict[str, Any]]:
    """``files=`` as the API's ``files`` array."""
    out: list[dict[str, Any]] = []
    if not files:
        return out
    for path, value in files.items():
        f = value if isinstance(value, File) else File(value)
        if isinstance(f.content, (bytes, bytearray, memoryview)):
            entry: dict[str, Any] = {
                "path": path,
                "content": base64.b64encode(bytes(f.content)).decode("ascii"),
                "encoding": "base64",
            }
        elif isinstance(f.content, str):
            entry = {"path": path, "content": f.content}
        else:
            raise TypeError(f"files[{path!r}]: content must be str or bytes, not {type(f.content).__name__}")
        if f.mode is not None:
            entry["mode"] = f.mode
        out.append(entry)
    return out


def _known(cls: type, data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    names = {f.name for f in dataclasses.fields(cls)}
    known = {k: v for k, v in data.items() if k in names}
    extra = {k: v for k, v in data.items() if k not in names}
    return known, extra


@dataclass(frozen=True)
class EgressEntry:
    """One connection or request through the egress proxy, a DNS query to airlock's
    resolver, or a change of the session's policy (see :attr:`kind`)."""

    host: str
    port: int
    addr: str | None
    allowed: bool
    reason: str
    bytes_up: int
    bytes_down: int
    ms: float
    kind: str = "proxy"
    """``"proxy"``: a request the program sent to the proxy; ``"redirected"``: a
    connection it made directly, redirected to the proxy; ``"dns"``: a query to airlock's
    resolver (``host`` is the name); ``"policy"``: a change of the session's policy
    (``reason`` says what)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EgressEntry:
        known, _ = _known(cls, data)
        return cls(**known)


Decision = Literal["allow_once", "allow_session", "deny"]
"""An answer to a held connection: ``"allow_once"`` (this connection), ``"allow_session"``
(its host and port from now on: added to the session's ``allow``) or ``"deny"``."""


@dataclass(frozen=True)
class Approval:
    """A connection the session's policy denied, held while airlock asks (a session with
    ``Network.proxy(on_denied="ask")``); answer it with :meth:`Sandbox.approve`. Unanswered
    within ``approval_timeout_ms`` it is refused."""

    id: int
    host: str
    """The host the program asked for (a name or an address, as it wrote it)."""
    port: int
    reason: str
    """Why the policy denied it, e.g. ``not in allowlist``."""
    expires_in_ms: int
    """Time left before it is refused, when the service listed it."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Approval:
        known, _ = _known(cls, data)
        return cls(**known)


@dataclass(frozen=True)
class FileChange:
    """One entry of :attr:`ExecResult.files_changed`: a file, directory or symlink the
    exec created, modified or deleted. A rename is a ``deleted`` of the old path and a
    ``created`` of the new one; a path whose kind changed is ``modified`` (with the new
    kind)."""

    path: str
    """Absolute: ``/workspace/a/b.txt``, ``/tmp/x``."""
    change: Literal["created", "modified", "deleted"]
    kind: Literal["file", "dir", "symlink"]
    bytes: int
    """Its size after the exec; for ``deleted``, its size before; 0 for directories."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FileChange:
        known, _ = _known(cls, data)
        return cls(**known)


@dataclass(frozen=True)
class ExecResult:
    """The result of an exec: ``airlock run --json``'s ExecResult plus ``queue_ms``.

    The API answers one whatever the program did; look at :attr:`outcome` and
    :attr:`exit_code` (or :attr:`ok`)."""

    id: str
    outcome: Outcome
    exit_code: int | None
    signal: int | None
    timed_out: bool
    oom_killed: bool
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    stdout_bytes: int
    stderr_bytes: int
    wall_ms: float
    setup_ms: float
    cpu_ms: float
    memory_peak_bytes: int
    egress: list[EgressEntry] = field(default_factory=list)
    isolation: str = "namespaces"
    """The tier that ran the program: ``"namespaces"``, ``"gvisor"`` or ``"microvm"``."""
    platform: str | None = None
    """How the tier ran it: gVisor's platform (``"ptrace"``...), a micro-VM's accelerator
    (``"kvm"``, ``"tcg"``); ``None`` for namespaces."""
    queue_ms: float = 0.0
    files_changed: list[FileChange] = field(default_factory=list)
    """What the exec created, modified and deleted under its ``files_changed_in``
    (default ``["/workspace"]``), sorted by path; at most 1000 entries."""
    files_changed_truncated: bool = False
    """More changed than :attr:`files_changed` lists."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Fields this SDK version does not know (added by a newer server)."""

    @property
    def ok(self) -> bool:
        """The program exited by itself with status 0."""
        return self.outcome == Outcome.EXITED and self.exit_code == 0

    @property
    def shell_status(self) -> int:
        """The status ``airlock run`` exits with: the program's code, 128+N for signal N,
        124 on timeout, 137 when the memory cap killed it."""
        if self.outcome == Outcome.EXITED:
            return self.exit_code if self.exit_code is not None else 1
        if self.outcome == Outcome.TIMEOUT:
            return 124
        if self.outcome == Outcome.OOM:
            return 137
        return 128 + (self.signal or 0)

    @property
    def output(self) -> str:
        """stdout followed by stderr."""
        if self.stdout and self.stderr:
            sep = "" if self.stdout.endswith("\n") else "\n"
            return self.stdout + sep + self.stderr
        return self.stdout or self.stderr

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExecResult:
        known, extra = _known(cls, data)
        known.pop("extra", None)
        raw_outcome = known.get("outcome")
        try:
            known["outcome"] = Outcome(raw_outcome)
        except ValueError:  # an outcome added by a newer server: keep its text
            known["outcome"] = raw_outcome
        known["egress"] = [EgressEntry.from_dict(e) for e in known.get("egress") or ()]
        known["files_changed"] = [FileChange.from_dict(c) for c in known.get("files_changed") or ()]
        return cls(**known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        """The API's JSON shape."""
        d = dataclasses.asdict(self)
        extra = d.pop("extra")
        d["outcome"] = str(self.outcome)
        d.update(extra)
        return d


@dataclass(frozen=True)
class SandboxUsage:
    execs: int
    cpu_ms: float
    memory_peak_bytes: int


@dataclass(frozen=True)
class SandboxInfo:
    """A session sandbox as ``GET /v1/sandboxes[/{id}]`` shows it (times in seconds since
    the epoch)."""

    id: str
    created_at: float
    expires_at: float
    usage: SandboxUsage
    isolation: str = "namespaces"
    """``"namespaces"``, ``"gvisor"`` or ``"microvm"``."""
    image: str | None = None
    """The name of the image it runs (``None``: the host's system directories)."""
    image_digest: str | None = None
    """That image's manifest digest."""
    status: str = "running"
    """``"running"`` or ``"paused"``."""
    on_idle: str = "none"
    """``"pause"``: the session pauses itself when idle (and resumes on the next request)."""
    from_snapshot: str | None = None
    """The id of the snapshot it was created from."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SandboxInfo:
        u = data.get("usage") or {}
        image = data.get("image") or {}
        return cls(
            id=data["id"],
            created_at=data["created_at"],
            expires_at=data["expires_at"],
            isolation=data.get("isolation", "namespaces"),
            image=image.get("name"),
            image_digest=image.get("digest"),
            status=data.get("status", "running"),
            on_idle=data.get("on_idle", "none"),
            from_snapshot=data.get("from_snapshot"),
            usage=SandboxUsage(
                execs=u.get("execs", 0),
                cpu_ms=u.get("cpu_ms", 0.0),
                memory_peak_bytes=u.get("memory_peak_bytes", 0),
            ),
        )


@dataclass(frozen=True)
class Snapshot:
    """A snapshot of a session (``POST /v1/sandboxes/{id}/snapshots``): its writable
    filesystem (/workspace, /tmp, /dev/shm), limits, network policy and image; with
    ``kind == "full"`` (gVisor, micro-VMs) its memory and running processes too. Times are seconds
    since the epoch. Snapshots outlive their session and the daemon's restarts."""

    snapshot_id: str
    """``snap-`` and 16 hex digits."""
    kind: str
    """``"filesystem"`` or ``"full"``."""
    sandbox_id: str
    """The session it was taken of."""
    isolation: str
    created_at: float
    bytes: int
    """The files' logical size."""
    stored_bytes: int
    """What it added on the server's disk (files already stored by another snapshot of
    the same API key are shared)."""
    files: int
    image: str | None = None
    """The name of the session's image (``None``: the host's system directories)."""
    image_digest: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Fields this SDK version does not know (added by a newer server)."""

    @property
    def id(self) -> str:
        """The same as :attr:`snapshot_id`."""
        return self.snapshot_id

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Snapshot:
        known, extra = _known(cls, data)
        known.pop("extra", None)
        image = known.pop("image", None) or {}
        known.pop("image_digest", None)
        return cls(**known, image=image.get("name"), image_digest=image.get("digest"), extra=extra)


class SnapshotList(list):  # type: ignore[type-arg]
    """:meth:`Airlock.list_snapshots <airlock.Airlock.list_snapshots>`: the caller's
    snapshots (a ``list`` of :class:`Snapshot`, oldest first) and the store's usage."""

    used_bytes: int
    """Bytes the server's snapshot store holds on disk (every API key's snapshots)."""
    budget_bytes: int
    """The store's budget (``--snapshot-budget``)."""

    def __init__(self, snapshots: Sequence[Snapshot], used_bytes: int, budget_bytes: int) -> None:
        super().__init__(snapshots)
        self.used_bytes = used_bytes
        self.budget_bytes = budget_bytes

    def __repr__(self) -> str:
        return f"SnapshotList({list.__repr__(self)}, used_bytes={self.used_bytes}, budget_bytes={self.budget_bytes})"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SnapshotList:
        return cls(
            [Snapshot.from_dict(s) for s in data.get("snapshots") or ()],
            int(data.get("used_bytes", 0)),
            int(data.get("budget_bytes", 0)),
        )


def snapshot_id(snapshot: Snapshot | str) -> str:
    return snapshot.snapshot_id if isinstance(snapshot, Snapshot) else str(snapshot)


@dataclass(frozen=True)
class FileEntry:
    """One entry of a /workspace listing."""

    path: str
    """Relative to /workspace."""
    size: int
    mode: int
    dir: bool

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FileEntry:
        known, _ = _known(cls, data)
        return cls(**known)


@dataclass(frozen=True)
class Readiness:
    """``GET /readyz``."""

    ready: bool
    pool_ready: int
    pool_target: int
    stopping: bool
    sandboxes_active: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Readiness:
        known, _ = _known(cls, data)
        return cls(**known)


@dataclass(frozen=True)
class StdoutEvent:
    """Output the program wrote to stdout, as it arrived."""

    data: str
    kind: Literal["stdout"] = "stdout"


@dataclass(frozen=True)
class StderrEvent:
    """Output the program wrote to stderr, as it arrived."""

    data: str
    kind: Literal["stderr"] = "stderr"


@dataclass(frozen=True)
class ResultEvent:
    """The last event of a stream: the exec's result."""

    result: ExecResult
    kind: Literal["result"] = "result"


StreamEvent = Union[StdoutEvent, StderrEvent, ResultEvent]


# --- background processes --------------------------------------------------------------


@dataclass(frozen=True)
class Process:
    """A program running alongside a session's execs: started with
    :meth:`Processes.start <airlock.client.Processes.start>`, or a terminal
    (``tty=True``), or the session's code-interpreter kernel. Times are seconds since the
    epoch. When :attr:`state` is ``"exited"``, exactly one of :attr:`exit_code` and
    :attr:`signal` is set."""

    process_id: str
    """``proc-1``, unique within the session."""
    command: list[str]
    pid: int | None
    """Its pid as the sandbox's programs see it (``None`` when the tier cannot tell)."""
    tty: bool
    state: str
    """``"running"`` or ``"exited"``."""
    started_at: float
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    """Killed because its ``timeout`` passed."""
    stdout_bytes: int = 0
    """Every byte it ever wrote to stdout (only the last ``output_bytes`` are kept)."""
    stderr_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    """Fields this SDK version does not know (added by a newer server)."""

    @property
    def id(self) -> str:
        """The same as :attr:`process_id`."""
        return self.process_id

    @property
    def running(self) -> bool:
        return self.state == "running"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Process:
        known, extra = _known(cls, data)
        known.pop("extra", None)
        known["command"] = list(known.get("command") or ())
        return cls(**known, extra=extra)


@dataclass(frozen=True)
class ProcessOutput:
    """What a process's output keeps now: the last ``output_bytes`` of each stream
    (``*_dropped`` counts the bytes that went before them) and the process itself."""

    stdout: str
    stderr: str
    stdout_dropped: int
    stderr_dropped: int
    process: Process

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessOutput:
        return cls(
            stdout=data.get("stdout", ""),
            stderr=data.get("stderr", ""),
            stdout_dropped=int(data.get("stdout_dropped", 0)),
            stderr_dropped=int(data.get("stderr_dropped", 0)),
            process=Process.from_dict(data["process"]),
        )


@dataclass(frozen=True)
class ExitEvent:
    """The last event of a followed process stream: the process ended (``kind ==
    "exit"``); or, with ``follow=False``, the kept output has been sent (``kind ==
    "end"``; the process may still run)."""

    process: Process
    kind: Literal["exit", "end"] = "exit"


ProcessEvent = Union[StdoutEvent, StderrEvent, ExitEvent]
"""An event of :meth:`Processes.stream <airlock.client.Processes.stream>`."""


@dataclass(frozen=True)
class TerminalExit:
    """How a terminal's program ended: exactly one of the two is set (both ``None`` when
    the connection closed without saying)."""

    exit_code: int | None
    signal: int | None


# --- preview ports -----------------------------------------------------------------------


@dataclass(frozen=True)
class Port:
    """A port of the sandbox exposed through the service: requests to :attr:`url` (any
    method, any path below it, WebSocket upgrades too) reach the sandbox's
    ``127.0.0.1:port``, with the API key or the port's :attr:`token`."""

    port: int
    token: str
    """Lets a request through to this port only: header ``X-Airlock-Port-Token`` or query
    ``airlock_token=`` (the service removes it before forwarding)."""
    path: str
    """``/v1/sandboxes/{id}/ports/{port}/``."""
    host: str
    """``{port}-{id}.<the service's host>``: a request with this ``Host`` reaches the port
    at any path (for apps that want to live at ``/``; needs a wildcard DNS name)."""
    url: str
    """The client's base URL + :attr:`path`."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def headers(self) -> dict[str, str]:
        """The header that authorizes a request to this port: ``{"X-Airlock-Port-Token": token}``."""
        return {"X-Airlock-Port-Token": self.token}

    def url_with_token(self, path: str = "") -> str:
        """:attr:`url` + ``path`` with ``?airlock_token=`` added: a link that opens in a
        browser (share it only with whoever may use the port)."""
        from urllib.parse import quote

        sep = "&" if "?" in path else "?"
        return f"{self.url}{path.lstrip('/')}{sep}airlock_token={quote(self.token, safe='')}"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], base_url: str) -> Port:
        known, extra = _known(cls, data)
        known.pop("extra", None)
        known.pop("url", None)
        return cls(**known, url=base_url.rstrip("/") + data["path"], extra=extra)


# --- code interpreter --------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """One rich output of a code cell: the value of its last expression (``kind ==
    "execute_result"``) or something it displayed (``"display_data"``: a figure, an
    ``IPython.display`` call). :attr:`data` maps MIME types to values as the API sends them
    (images as base64 text); the properties decode them."""

    kind: str
    data: dict[str, Any]

    @property
    def is_main(self) -> bool:
        """The value of the cell's last expression."""
        return self.kind == "execute_result"

    @property
    def text(self) -> str | None:
        return self.data.get("text/plain")

    @property
    def html(self) -> str | None:
        return self.data.get("text/html")

    @property
    def markdown(self) -> str | None:
        return self.data.get("text/markdown")

    @property
    def latex(self) -> str | None:
        return self.data.get("text/latex")

    @property
    def svg(self) -> str | None:
        return self.data.get("image/svg+xml")

    @property
    def png(self) -> bytes | None:
        """The PNG image, decoded."""
        v = self.data.get("image/png")
        return base64.b64decode(v) if v is not None else None

    @property
    def jpeg(self) -> bytes | None:
        """The JPEG image, decoded."""
        v = self.data.get("image/jpeg")
        return base64.b64decode(v) if v is not None else None

    @property
    def json(self) -> Any:
        """The ``application/json`` value (``None`` when absent)."""
        return self.data.get("application/json")

    @property
    def formats(self) -> list[str]:
        """The MIME types present."""
        return list(self.data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Result:
        return cls(kind=str(data.get("kind", "")), data=dict(data.get("data") or {}))


@dataclass(frozen=True)
class ExecutionError:
    """The exception a code cell raised (a value, not a Python exception of this SDK):
    ``name`` (``ZeroDivisionError``), ``value`` (``division by zero``), ``traceback``
    (lines, without ANSI colours). A cell interrupted by its timeout has
    ``name == "KeyboardInterrupt"``."""

    name: str
    value: str
    traceback: list[str]

    @property
    def traceback_text(self) -> str:
        return "\n".join(self.traceback)

    def __str__(self) -> str:
        return f"{self.name}: {self.value}"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExecutionError:
        tb = data.get("traceback") or []
        if isinstance(tb, str):
            tb = tb.splitlines()
        return cls(name=str(data.get("name", "")), value=str(data.get("value", "")), traceback=list(tb))


@dataclass(frozen=True)
class Logs:
    """What a code cell printed, as chunks in the order they came."""

    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Execution:
    """The outcome of :meth:`Sandbox.run_code <airlock.Sandbox.run_code>`: an exception in
    the cell is :attr:`error`, not a Python exception of this SDK."""

    execution_count: int | None
    logs: Logs
    results: list[Result]
    error: ExecutionError | None
    timed_out: bool
    """The cell ran past its timeout and was interrupted (the kernel's state is kept)."""
    duration_ms: float
    kernel_start_ms: float
    """Time this call spent starting the kernel (the session's first call; 0 after)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str | None:
        """The ``text/plain`` of the main result (the value of the last expression)."""
        for r in self.results:
            if r.is_main:
                return r.text
        return None

    @property
    def png(self) -> bytes | None:
        """The first PNG among the results, decoded."""
        for r in self.results:
            if "image/png" in r.data:
                return r.png
        return None

    @property
    def stdout(self) -> str:
        return "".join(self.logs.stdout)

    @property
    def stderr(self) -> str:
        return "".join(self.logs.stderr)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Execution:
        known, extra = _known(cls, data)
        logs = data.get("logs") or {}
        err = data.get("error")
        return cls(
            execution_count=data.get("execution_count"),
            logs=Logs(list(logs.get("stdout") or ()), list(logs.get("stderr") or ())),
            results=[Result.from_dict(r) for r in data.get("results") or ()],
            error=ExecutionError.from_dict(err) if err else None,
            timed_out=bool(data.get("timed_out", False)),
            duration_ms=float(data.get("duration_ms") or 0.0),
            kernel_start_ms=float(data.get("kernel_start_ms") or 0.0),
            extra=extra,
        )
