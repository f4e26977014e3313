"""airlock: a Python SDK for ``airlock serve``, the tool-execution sandbox for AI agents.

    from airlock import Airlock
    al = Airlock("http://127.0.0.1:8710")
    r = al.run("print(6*7)")            # ExecResult: r.stdout == "42\\n", r.exit_code == 0
"""

from ._version import __version__
from .aio import AsyncAirlock, AsyncExecStream, AsyncFiles, AsyncSandbox
from .client import Airlock, ExecStream, Files, Sandbox
from .errors import (
    AirlockConnectionError,
    AirlockError,
    AirlockTimeout,
    DiskFull,
    FileNotFound,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    SandboxConflict,
    SandboxExpired,
    SandboxNotFound,
    ServerError,
    ServiceUnavailable,
    SessionQuotaExceeded,
    Unauthorized,
    UnsupportedMediaType,
)
from .types import (
    EgressEntry,
    ExecResult,
    File,
    FileEntry,
    Limits,
    Network,
    Outcome,
    Readiness,
    ResultEvent,
    SandboxInfo,
    SandboxUsage,
    StderrEvent,
    StdoutEvent,
    StreamEvent,
)

__all__ = [
    "AirlockConnectionError",
    "Airlock",
    "AirlockError",
    "AirlockTimeout",
    "AsyncAirlock",
    "AsyncExecStream",
    "AsyncFiles",
    "AsyncSandbox",
    "DiskFull",
    "EgressEntry",
    "ExecResult",
    "ExecStream",
    "File",
    "FileEntry",
    "FileNotFound",
    "Files",
    "InvalidRequest",
    "Limits",
    "Network",
    "NotFound",
    "Outcome",
    "PayloadTooLarge",
    "RateLimited",
    "Readiness",
    "ResultEvent",
    "Sandbox",
    "SandboxConflict",
    "SandboxExpired",
    "SandboxInfo",
    "SandboxNotFound",
    "SandboxUsage",
    "ServerError",
    "ServiceUnavailable",
    "SessionQuotaExceeded",
    "StderrEvent",
    "StdoutEvent",
    "StreamEvent",
    "Unauthorized",
    "UnsupportedMediaType",
    "__version__",
]
