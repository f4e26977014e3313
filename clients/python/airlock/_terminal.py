"""Terminals: a program on a pseudo-terminal in a session, spoken to over a WebSocket
(``GET /v1/sandboxes/{id}/pty``). :class:`Terminal` on the ``websockets`` package's
threaded client, :class:`AsyncTerminal` on its asyncio client.

The wire: binary frames both ways are raw terminal bytes; the client sends
``{"type": "resize", "rows", "cols"}`` as text; the server sends
``{"type": "started", "process_id", "pid"}`` first and ``{"type": "exit", "exit_code",
"signal"}`` last, then closes."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Generator, Iterator, Mapping, Sequence

from . import _core, errors
from .types import TerminalExit

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection as AsyncConnection
    from websockets.sync.client import ClientConnection

__all__ = ["AsyncTerminal", "Terminal"]


def _connect_error(exc: BaseException, url: str) -> errors.AirlockError:
    """The SDK's exception for a failed WebSocket opening: the API's error when the
    service answered with a status instead of upgrading."""
    from websockets.exceptions import InvalidStatus

    if isinstance(exc, InvalidStatus):
        resp = exc.response
        return errors.from_response(resp.status_code, bytes(resp.body or b""), resp.headers)
    if isinstance(exc, TimeoutError):
        return errors.AirlockTimeout(f"GET {url}: timed out opening the terminal ({exc})")
    return errors.AirlockConnectionError(f"GET {url}: {type(exc).__name__}: {exc}")


class _State:
    """What both terminals keep: the process, buffered output, how it ended."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.process_id: str | None = None
        self.pid: int | None = None
        self.pending = bytearray()
        self.exit: TerminalExit | None = None
        self.eof = False

    def control(self, text: str) -> None:
        """A text frame from the service."""
        try:
            msg = json.loads(text)
        except ValueError:
            _core.logger.warning("terminal %s: a text frame that is not JSON: %.200r", self.url, text)
            return
        kind = msg.get("type") if isinstance(msg, Mapping) else None
        if kind == "started":
            self.process_id = msg.get("process_id")
            self.pid = msg.get("pid")
        elif kind == "exit":
            self.exit = TerminalExit(msg.get("exit_code"), msg.get("signal"))
        elif kind == "error" or (isinstance(msg, Mapping) and isinstance(msg.get("error"), Mapping)):
            raise errors.from_event(json.dumps(msg if "error" in msg else {"error": msg}))

    def take(self, upto: int | None = None) -> bytes:
        n = len(self.pending) if upto is None else upto
        out = bytes(self.pending[:n])
        del self.pending[:n]
        return out

    def ended(self) -> TerminalExit:
        return self.exit if self.exit is not None else TerminalExit(None, None)


def _resize(rows: int, cols: int) -> str:
    return json.dumps({"type": "resize", "rows": int(rows), "cols": int(cols)})


def _data(data: bytes | str) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


class Terminal(Iterator[bytes]):
    """A program on a terminal in the session (:meth:`Sandbox.pty <airlock.Sandbox.pty>`);
    a context manager that hangs it up on exit.

    :meth:`write` sends keystrokes, :meth:`read` returns output as it comes (iterating
    does too, until the program ends), :meth:`resize` changes the window,
    :meth:`wait` waits for the end. Output is raw terminal bytes: echo, ``\\r\\n`` line
    ends, escape sequences. Reading and writing from two threads at once is safe.

    Attributes: ``process_id`` and ``pid`` (the terminal is also a
    :class:`~airlock.Process` with ``tty=True``), ``exit`` (a
    :class:`~airlock.TerminalExit` once it ended)."""

    def __init__(self, ws: ClientConnection, state: _State) -> None:
        self._ws = ws
        self._st = state

    @classmethod
    def _open(
        cls,
        config: _core.Config,
        sandbox_id: str,
        rows: int,
        cols: int,
        cmd: str | Sequence[str] | None,
    ) -> Terminal:
        from websockets.sync.client import connect

        url, headers = _core.terminal_request(config, sandbox_id, rows, cols, cmd)
        try:
            ws = connect(
                url,
                additional_headers=headers,
                user_agent_header=config.headers.get("user-agent"),
                open_timeout=config.timeout,
                max_size=None,  # output frames are bounded by the service's buffer
            )
        except Exception as e:
            raise _connect_error(e, url) from e
        term = cls(ws, _State(url))
        try:
            term._started(config.timeout)
        except BaseException:
            term.close()
            raise
        return term

    def _started(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._st.process_id is None and not self._st.eof:
            chunk = self._next(_remaining(deadline))
            if chunk:
                self._st.pending += chunk

    @property
    def process_id(self) -> str | None:
        return self._st.process_id

    @property
    def pid(self) -> int | None:
        return self._st.pid

    @property
    def exit(self) -> TerminalExit | None:
        return self._st.exit

    def __repr__(self) -> str:
        return f"Terminal({self._st.process_id!r})"

    def _next(self, timeout: float | None) -> bytes | None:
        """One frame: its bytes, or ``None`` for a control frame or the end (then
        ``eof`` is set). Raises :class:`TimeoutError` when none came in ``timeout``."""
        from websockets.exceptions import ConnectionClosed

        try:
            msg = self._ws.recv(timeout)
        except ConnectionClosed:
            self._st.eof = True
            return None
        if isinstance(msg, str):
            self._st.control(msg)
            if self._st.exit is not None:
                self._st.eof = True  # exit is the last frame
            return None
        return bytes(msg)

    def read(self, timeout: float | None = None) -> bytes:
        """The output that came since the last read, waiting up to ``timeout`` seconds
        (``None``: as long as it takes) for some; ``b""`` once the program has ended and
        everything was read. :class:`TimeoutError` when nothing came in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._st.pending and not self._st.eof:
            chunk = self._next(_remaining(deadline))
            if chunk:
                return chunk
        return self._st.take()

    def read_until(self, expected: bytes | str, timeout: float | None = 10.0) -> bytes:
        """Reads until ``expected`` appears in the output; returns the output up to and
        including it (what came after stays for the next read). :class:`TimeoutError`
        (or :class:`EOFError` when the program ended) with what was read in its
        message otherwise."""
        want = _data(expected)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            i = self._st.pending.find(want)
            if i >= 0:
                return self._st.take(i + len(want))
            if self._st.eof:
                raise EOFError(f"the terminal ended before {want!r}; output: {bytes(self._st.pending)!r}")
            try:
                chunk = self._next(_remaining(deadline))
            except TimeoutError:
                raise TimeoutError(
                    f"{want!r} did not come in {timeout}s; output: {bytes(self._st.pending)!r}"
                ) from None
            if chunk:
                self._st.pending += chunk

    def __iter__(self) -> Terminal:
        return self

    def __next__(self) -> bytes:
        chunk = self.read()
        if not chunk:
            raise StopIteration
        return chunk

    def write(self, data: bytes | str) -> None:
        """Sends keystrokes (``str`` as UTF-8): ``b"ls\\n"``, ``b"\\x03"`` for Ctrl-C."""
        from websockets.exceptions import ConnectionClosed

        try:
            self._ws.send(_data(data))
        except ConnectionClosed as e:
            raise errors.AirlockConnectionError(f"the terminal {self._st.process_id} is closed: {e}") from e

    def resize(self, rows: int, cols: int) -> None:
        """Changes the window size (the program gets SIGWINCH)."""
        from websockets.exceptions import ConnectionClosed

        try:
            self._ws.send(_resize(rows, cols))
        except ConnectionClosed as e:
            raise errors.AirlockConnectionError(f"the terminal {self._st.process_id} is closed: {e}") from e

    def wait(self, timeout: float | None = None) -> TerminalExit:
        """Waits for the program to end (:class:`TimeoutError` after ``timeout``
        seconds); the output that comes meanwhile is kept for :meth:`read`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._st.eof:
            chunk = self._next(_remaining(deadline))
            if chunk:
                self._st.pending += chunk
        return self._st.ended()

    def close(self) -> None:
        """Hangs up: the service sends the program SIGHUP (SIGKILL 2 s later)."""
        self._ws.close()

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncTerminal(AsyncIterator[bytes]):
    """:class:`Terminal` for asyncio: the same methods, awaited (``async for chunk in
    term``, ``async with``)."""

    def __init__(self, ws: AsyncConnection, state: _State) -> None:
        self._ws = ws
        self._st = state

    @classmethod
    async def _open(
        cls,
        config: _core.Config,
        sandbox_id: str,
        rows: int,
        cols: int,
        cmd: str | Sequence[str] | None,
    ) -> AsyncTerminal:
        from websockets.asyncio.client import connect

        url, headers = _core.terminal_request(config, sandbox_id, rows, cols, cmd)
        try:
            ws = await connect(
                url,
                additional_headers=headers,
                user_agent_header=config.headers.get("user-agent"),
                open_timeout=config.timeout,
                max_size=None,
            )
        except Exception as e:
            raise _connect_error(e, url) from e
        term = cls(ws, _State(url))
        try:
            deadline = time.monotonic() + config.timeout
            while term._st.process_id is None and not term._st.eof:
                chunk = await term._next(_remaining(deadline))
                if chunk:
                    term._st.pending += chunk
        except BaseException:
            await term.aclose()
            raise
        return term

    @property
    def process_id(self) -> str | None:
        return self._st.process_id

    @property
    def pid(self) -> int | None:
        return self._st.pid

    @property
    def exit(self) -> TerminalExit | None:
        return self._st.exit

    def __repr__(self) -> str:
        return f"AsyncTerminal({self._st.process_id!r})"

    async def _next(self, timeout: float | None) -> bytes | None:
        from websockets.exceptions import ConnectionClosed

        try:
            # recv() may be cancelled without losing a frame (websockets' asyncio client).
            msg = await asyncio.wait_for(self._ws.recv(), timeout)
        except ConnectionClosed:
            self._st.eof = True
            return None
        except asyncio.TimeoutError:
            raise TimeoutError(f"nothing from the terminal in {timeout}s") from None
        if isinstance(msg, str):
            self._st.control(msg)
            if self._st.exit is not None:
                self._st.eof = True
            return None
        return bytes(msg)

    async def read(self, timeout: float | None = None) -> bytes:
        """See :meth:`Terminal.read`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._st.pending and not self._st.eof:
            chunk = await self._next(_remaining(deadline))
            if chunk:
                return chunk
        return self._st.take()

    async def read_until(self, expected: bytes | str, timeout: float | None = 10.0) -> bytes:
        """See :meth:`Terminal.read_until`."""
        want = _data(expected)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            i = self._st.pending.find(want)
            if i >= 0:
                return self._st.take(i + len(want))
            if self._st.eof:
                raise EOFError(f"the terminal ended before {want!r}; output: {bytes(self._st.pending)!r}")
            try:
                chunk = await self._next(_remaining(deadline))
            except TimeoutError:
                raise TimeoutError(
                    f"{want!r} did not come in {timeout}s; output: {bytes(self._st.pending)!r}"
                ) from None
            if chunk:
                self._st.pending += chunk

    def __aiter__(self) -> AsyncTerminal:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self.read()
        if not chunk:
            raise StopAsyncIteration
        return chunk

    async def write(self, data: bytes | str) -> None:
        """See :meth:`Terminal.write`."""
        from websockets.exceptions import ConnectionClosed

        try:
            await self._ws.send(_data(data))
        except ConnectionClosed as e:
            raise errors.AirlockConnectionError(f"the terminal {self._st.process_id} is closed: {e}") from e

    async def resize(self, rows: int, cols: int) -> None:
        """See :meth:`Terminal.resize`."""
        from websockets.exceptions import ConnectionClosed

        try:
            await self._ws.send(_resize(rows, cols))
        except ConnectionClosed as e:
            raise errors.AirlockConnectionError(f"the terminal {self._st.process_id} is closed: {e}") from e

    async def wait(self, timeout: float | None = None) -> TerminalExit:
        """See :meth:`Terminal.wait`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._st.eof:
            chunk = await self._next(_remaining(deadline))
            if chunk:
                self._st.pending += chunk
        return self._st.ended()

    async def aclose(self) -> None:
        """Hangs up (see :meth:`Terminal.close`)."""
        await self._ws.close()

    async def __aenter__(self) -> AsyncTerminal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class TerminalOpening:
    """What :meth:`AsyncSandbox.pty <airlock.AsyncSandbox.pty>` returns: awaitable (the
    terminal) and an async context manager (the terminal, hung up on exit)."""

    def __init__(self, config: _core.Config, sandbox_id: str, rows: int, cols: int, cmd: Any) -> None:
        self._args = (config, sandbox_id, rows, cols, cmd)
        self._term: AsyncTerminal | None = None

    def __await__(self) -> Generator[Any, None, AsyncTerminal]:
        return AsyncTerminal._open(*self._args).__await__()

    async def __aenter__(self) -> AsyncTerminal:
        self._term = await AsyncTerminal._open(*self._args)
        return self._term

    async def __aexit__(self, *exc: object) -> None:
        if self._term is not None:
            await self._term.aclose()
