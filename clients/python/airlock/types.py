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
    "EgressEntry",
    "ExecResult",
    "File",
    "FileEntry",
    "FilesArg",
    "Limits",
    "Network",
    "Outcome",
    "Readiness",
    "ResultEvent",
    "SandboxInfo",
    "SandboxUsage",
    "StderrEvent",
    "StdoutEvent",
    "StreamEvent",
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


@dataclass(frozen=True)
class Network:
    """The sandbox's network: ``Network.none()`` (the default: loopback only) or
    ``Network.proxy(allow=[...])`` (out only through airlock's filtering proxy; what it saw
    is reported in :attr:`ExecResult.egress`)."""

    mode: Literal["none", "proxy"] = "none"
    allow: tuple[str, ...] = ()
    """Host patterns: ``pypi.org``, ``*.pythonhosted.org``, ``api.example.com:8443``."""
    allow_cidrs: tuple[str, ...] = ()
    """Private or special ranges reachable on purpose: ``10.1.2.3/32``."""

    @classmethod
    def none(cls) -> Network:
        return cls("none")

    @classmethod
    def proxy(cls, allow: Sequence[str] = (), allow_cidrs: Sequence[str] = ()) -> Network:
        if isinstance(allow, str) or isinstance(allow_cidrs, str):
            raise TypeError("allow and allow_cidrs are lists of strings")
        return cls("proxy", tuple(allow), tuple(allow_cidrs))

    def to_dict(self) -> dict[str, Any]:
        if self.mode == "none":
            return {"mode": "none"}
        return {"mode": "proxy", "allow": list(self.allow), "allow_cidrs": list(self.allow_cidrs)}

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
    """One connection or request through the egress proxy."""

    host: str
    port: int
    addr: str | None
    allowed: bool
    reason: str
    bytes_up: int
    bytes_down: int
    ms: float

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EgressEntry:
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
            usage=SandboxUsage(
                execs=u.get("execs", 0),
                cpu_ms=u.get("cpu_ms", 0.0),
                memory_peak_bytes=u.get("memory_peak_bytes", 0),
            ),
        )


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
