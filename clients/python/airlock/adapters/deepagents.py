"""A LangChain Deep Agents backend backed by an airlock session sandbox.

    from airlock import Airlock
    from airlock.adapters.deepagents import AirlockBackend
    from deepagents import create_deep_agent

    with AirlockBackend.create(Airlock()) as backend:      # deletes the sandbox on exit
        agent = create_deep_agent(model=..., backend=backend)

Deep Agents' file tools (``ls``, ``read_file``, ``write_file``, ``edit_file``, ``glob``,
``grep``) and its ``execute`` tool then all run inside the sandbox: ``BaseSandbox``
derives the file operations from :meth:`AirlockBackend.execute` and
:meth:`AirlockBackend.upload_files`.

Paths are the sandbox's real paths. Writable places are ``/workspace`` (the working
directory; files there go through airlock's files API) and ``/tmp``; the rest of the
sandbox's filesystem is read-only, so a write elsewhere answers ``permission_denied``.

Tested with ``deepagents==0.7.32``.
"""

from __future__ import annotations

import base64
import posixpath
import shlex
from typing import Any, Mapping

from deepagents.backends.protocol import (
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
)
from deepagents.backends.sandbox import BaseSandbox

from .. import errors
from ..client import Airlock, Sandbox
from ..types import Limits, Network, Outcome

__all__ = ["AirlockBackend"]

WORKSPACE = "/workspace"


class AirlockBackend(BaseSandbox):
    """``deepagents.backends.sandbox.BaseSandbox`` on an airlock session sandbox.

    ``sandbox``: the session to use (see :meth:`create` to make one). ``default_timeout``:
    seconds a command may run when the caller gives no timeout; ``max_timeout``: what a
    timeout of 0 ("no timeout") becomes. ``env``: variables set for every command."""

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        default_timeout: int = 120,
        max_timeout: int = 600,
        env: Mapping[str, str] | None = None,
        owns_sandbox: bool = False,
    ) -> None:
        self._sandbox = sandbox
        self._default_timeout = default_timeout
        self._max_timeout = max_timeout
        self._env = dict(env or {})
        self._owns = owns_sandbox

    @classmethod
    def create(
        cls,
        client: Airlock,
        *,
        ttl_s: int = 3600,
        limits: Limits | Mapping[str, Any] | None = None,
        network: Network | Mapping[str, Any] | str | None = None,
        **kwargs: Any,
    ) -> AirlockBackend:
        """Creates a session sandbox for the backend; :meth:`close` (or leaving a ``with``
        block) deletes it."""
        sandbox = client.sandbox(ttl_s=ttl_s, limits=limits, network=network)
        return cls(sandbox, owns_sandbox=True, **kwargs)

    @property
    def sandbox(self) -> Sandbox:
        return self._sandbox

    @property
    def id(self) -> str:
        return self._sandbox.id

    def close(self) -> None:
        """Deletes the sandbox if this backend created it."""
        if self._owns:
            self._sandbox.close()

    def __enter__(self) -> AirlockBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the core primitive -------------------------------------------------------

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Runs ``command`` with ``bash -c`` in the sandbox (cwd /workspace). stdout and
        stderr are combined; a timeout answers exit code 124 and an OOM kill 137, each
        with a line saying what happened."""
        if not command or not isinstance(command, str):
            return ExecuteResponse(output="Error: Command must be a non-empty string.", exit_code=1)
        secs = self._default_timeout if timeout is None else timeout
        if secs <= 0:
            secs = self._max_timeout
        try:
            r = self._sandbox.exec(
                ["bash", "-c", command],
                env=self._env or None,
                limits=Limits(timeout_ms=int(secs * 1000)),
            )
        except errors.AirlockError as e:
            return ExecuteResponse(output=f"Error: the sandbox could not run the command: {e}", exit_code=1)
        output = r.stdout
        if r.stderr:
            output = f"{output}\n{r.stderr}" if output and not output.endswith("\n") else output + r.stderr
        truncated = r.stdout_truncated or r.stderr_truncated
        if r.outcome == Outcome.TIMEOUT:
            note = f"Error: Command timed out after {secs} seconds and was killed."
            return ExecuteResponse(output=_append(output, note), exit_code=124, truncated=truncated)
        if r.outcome == Outcome.OOM:
            note = "Error: killed: the command exceeded the sandbox's memory limit."
            return ExecuteResponse(output=_append(output, note), exit_code=137, truncated=truncated)
        return ExecuteResponse(output=output, exit_code=r.shell_status, truncated=truncated)

    # --- file transfer -------------------------------------------------------------

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Writes each file, creating parent directories. Under /workspace through the
        files API (symlink-safe); elsewhere (e.g. /tmp) through a command."""
        out: list[FileUploadResponse] = []
        for path, content in files:
            full = _absolute(path)
            if full is None:
                out.append(FileUploadResponse(path=path, error="invalid_path"))
                continue
            rel = _in_workspace(full)
            try:
                if rel is not None:
                    self._sandbox.files.write(rel, content)
                    out.append(FileUploadResponse(path=path, error=None))
                    continue
                q = shlex.quote(full)
                r = self._sandbox.exec(
                    ["bash", "-c", f"mkdir -p -- \"$(dirname -- {q})\" && base64 -d > {q}"],
                    stdin=base64.b64encode(content).decode("ascii"),
                )
                out.append(FileUploadResponse(path=path, error=None if r.ok else _classify(r.stderr)))
            except errors.InvalidRequest:
                out.append(FileUploadResponse(path=path, error="invalid_path"))
            except errors.AirlockError as e:
                out.append(FileUploadResponse(path=path, error=f"airlock: {e}"))
        return out

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Reads each file: under /workspace through the files API, elsewhere through a
        command."""
        out: list[FileDownloadResponse] = []
        for path in paths:
            full = _absolute(path)
            if full is None:
                out.append(FileDownloadResponse(path=path, error="invalid_path"))
                continue
            rel = _in_workspace(full)
            try:
                if rel is not None:
                    out.append(FileDownloadResponse(path=path, content=self._sandbox.files.read(rel)))
                    continue
                q = shlex.quote(full)
                r = self._sandbox.exec(
                    ["bash", "-c", f"if [ -d {q} ]; then echo 'Is a directory' >&2; exit 21; fi; base64 -w0 -- {q}"],
                    limits=Limits(output_bytes=8 * 1024 * 1024),  # ~6 MiB files; within the default --max-output
                )
                if not r.ok:
                    out.append(FileDownloadResponse(path=path, error=_classify(r.stderr)))
                elif r.stdout_truncated:
                    out.append(FileDownloadResponse(path=path, error="file too large to download"))
                else:
                    out.append(FileDownloadResponse(path=path, content=base64.b64decode(r.stdout)))
            except errors.FileNotFound:
                out.append(FileDownloadResponse(path=path, error="file_not_found"))
            except errors.InvalidRequest as e:
                low = e.message.lower()
                if "directory" in low:
                    error = "is_directory"
                elif "not a regular file" in low:
                    # a directory, or a symlink/fifo the files API refuses to follow
                    error = "is_directory" if self._is_dir(full) else "not a regular file"
                else:
                    error = "invalid_path"
                out.append(FileDownloadResponse(path=path, error=error))
            except errors.AirlockError as e:
                out.append(FileDownloadResponse(path=path, error=f"airlock: {e}"))
        return out


    def _is_dir(self, full: str) -> bool:
        try:
            return self._sandbox.exec(["test", "-d", full]).ok
        except errors.AirlockError:
            return False


def _append(output: str, note: str) -> str:
    return f"{output.rstrip()}\n{note}" if output.strip() else note


def _absolute(path: str) -> str | None:
    """The normalized absolute path (relative paths are relative to /workspace), or
    ``None`` when it is not a usable path (empty, NUL, a ``..`` component)."""
    if not path or "\x00" in path or ".." in path.split("/"):
        return None
    full = path if path.startswith("/") else posixpath.join(WORKSPACE, path)
    norm = posixpath.normpath(full)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    return norm


def _in_workspace(full: str) -> str | None:
    if full.startswith(WORKSPACE + "/") and len(full) > len(WORKSPACE) + 1:
        return full[len(WORKSPACE) + 1 :]
    return None


def _classify(stderr: str) -> str:
    low = stderr.lower()
    if "no such file" in low:
        return "file_not_found"
    if "is a directory" in low:
        return "is_directory"
    if "permission denied" in low or "read-only file system" in low:
        return "permission_denied"
    return stderr.strip()[:200] or "failed"
