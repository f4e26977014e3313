"""airlock's code-interpreter driver: the in-sandbox half of POST /v1/sandboxes/{id}/code.

Started by the server inside a session's sandbox as `python3 -u -c "<this file>"`, with its
stdin and stdout as pipes to the server. It starts an IPython kernel (ipykernel, through
jupyter_client's KernelManager, on the ipc transport: unix sockets in a private directory, never
TCP) and speaks JSON lines: requests on stdin, events on stdout. The protocol is described in
README.md next to this file. Standard library + jupyter_client + pyzmq + ipykernel only; Python
3.9 syntax; one self-contained file (it is passed as one argument, so it must stay under 128 KiB).
"""

import sys

# `python3 -c` puts the working directory (/workspace, the user's files) first on sys.path: a
# user's json.py or zmq.py there must not replace the modules the driver imports.
if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]

import collections  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

# The protocol channel is a private duplicate of fd 1; fd 1 itself then points at stderr, so a
# stray print (ours, a library's, a child's) can never corrupt the JSON lines.
_PROTOCOL_FD = os.dup(1)
os.dup2(2, 1)

EXIT_FATAL = 3
DEFAULT_TIMEOUT_MS = 30000
# How long a run may take to finish after the interrupt before the kernel is declared hung.
INTERRUPT_GRACE_S = 5.0
# How long a kernel may take to start and answer kernel_info (a loaded sandbox with half a core
# needs a few seconds to import IPython).
START_TIMEOUT_S = 120.0
# How long to wait for the final iopub "idle" after the execute_reply arrived.
IDLE_GRACE_S = 2.0
# How often a waiting driver checks that the kernel process still lives.
POLL_S = 0.25
KEPT_MIMES = (
    "text/plain",
    "text/html",
    "text/markdown",
    "text/latex",
    "image/png",
    "image/jpeg",
    "image/svg+xml",
    "application/json",
)
BASE64_MIMES = ("image/png", "image/jpeg")
ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
KERNEL_NAME = "airlock-python"

# Runs inside the kernel process (as its `python3 <file>`): keeps ipykernel from binding TCP and
# from loading its debugger, then starts the kernel as `python -m ipykernel_launcher` would.
LAUNCHER = r'''
import os
import sys

# sys.path[0] is this launcher's private directory; the kernel's users want their own.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

# ipykernel's debugger (debugpy) costs start time and wants TCP; the driver never debugs.
_had_debugpy = "debugpy" in sys.modules
if not _had_debugpy:
    sys.modules["debugpy"] = None
try:
    import ipykernel.ipkernel  # noqa: F401  (decides now, once, that debugpy is unavailable)
except Exception:
    pass
finally:
    if not _had_debugpy:
        sys.modules.pop("debugpy", None)


def _pipe_over_ipc():
    """ipykernel binds its IOPub pipe (output of forked children) to tcp://127.0.0.1 whatever the
    kernel's transport. Inside airlock that aborts libzmq (its bind first looks the host up as
    an interface name with getifaddrs(), whose netlink socket the sandbox refuses) and landlock
    forbids TCP bind anyway. Bind a unix socket instead; children connect to it."""
    import zmq
    from ipykernel import iostream

    thread_class = getattr(iostream, "IOPubThread", None)
    original_in = getattr(thread_class, "_setup_pipe_in", None)
    original_out = getattr(thread_class, "_setup_pipe_out", None)
    if original_in is None or original_out is None:
        return
    directory = os.environ["AIRLOCK_KERNEL_DIR"]
    marker = 1  # the "port" ipykernel remembers; never a real TCP port here

    def setup_pipe_in(self):
        address = "ipc://" + os.path.join(directory, "iopub-pipe-%d" % os.getpid())
        original_bind = zmq.Socket.bind_to_random_port

        def bind_to_random_port(sock, addr, *args, **kwargs):
            if addr == "tcp://127.0.0.1":
                sock.bind(address)
                return marker
            return original_bind(sock, addr, *args, **kwargs)

        self._airlock_pipe_address = address
        zmq.Socket.bind_to_random_port = bind_to_random_port
        try:
            return original_in(self)
        finally:
            zmq.Socket.bind_to_random_port = original_bind

    def setup_pipe_out(self):
        address = getattr(self, "_airlock_pipe_address", None)
        original_connect = zmq.Socket.connect

        def connect(sock, addr, *args, **kwargs):
            if address and addr == "tcp://127.0.0.1:%d" % marker:
                addr = address
            return original_connect(sock, addr, *args, **kwargs)

        zmq.Socket.connect = connect
        try:
            return original_out(self)
        finally:
            zmq.Socket.connect = original_connect

    thread_class._setup_pipe_in = setup_pipe_in
    thread_class._setup_pipe_out = setup_pipe_out


def _sync_fd_output(shell):
    """Output written to fd 1/2 (subprocess.run, os.system, C extensions) reaches ipykernel
    through a pipe that a thread reads; at the end of a cell that thread may not have caught up,
    and the text would arrive after the run's "idle" (lost to the driver, or shown under the next
    run). After each cell, write a token into each pipe and wait until the thread has handed it
    over: everything written before it has then been handed over too. The token is removed."""
    import re
    import threading

    streams = []
    for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
        watcher = getattr(stream, "watch_fd_thread", None)
        if getattr(stream, "_fid", None) is None or watcher is None:
            continue
        state = {"token": None, "carry": "", "event": None}
        original_write = stream.write

        def write(text, _state=state, _watcher=watcher, _write=original_write):
            token = _state["token"]
            if threading.current_thread() is not _watcher:
                return _write(text)
            if token is None:
                text, _state["carry"] = _state["carry"] + text, ""
                if "\x1b]airlock-sync-" in text:  # a token whose wait gave up
                    text = re.sub("\x1b\\]airlock-sync-[0-9]+\x07", "", text)
                return _write(text) if text else 0
            text = _state["carry"] + text
            _state["carry"] = ""
            if token in text:
                before, _, after = text.partition(token)
                text = before + after
                _state["token"] = None
                _state["event"].set()
            else:
                for keep in range(min(len(token) - 1, len(text)), 0, -1):
                    if token.startswith(text[-keep:]):
                        _state["carry"] = text[-keep:]
                        text = text[:-keep]
                        break
            return _write(text) if text else 0

        stream.write = write
        streams.append((fd, watcher, state))

    counter = [0]
    stream_fid = {1: getattr(sys.stdout, "_fid", None), 2: getattr(sys.stderr, "_fid", None)}

    def same_pipe(fd, read_fd):
        try:
            a, b = os.fstat(fd), os.fstat(read_fd)
        except (OSError, TypeError):
            return False
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)

    def after_cell(*_args):
        for fd, watcher, state in streams:
            if not watcher.is_alive() or not same_pipe(fd, stream_fid[fd]):
                continue  # the thread is gone, or the cell pointed fd 1/2 elsewhere
            counter[0] += 1
            event = threading.Event()
            state["event"] = event
            state["token"] = "\x1b]airlock-sync-%d\x07" % counter[0]
            try:
                os.write(fd, state["token"].encode())
            except OSError:
                state["token"] = None
                continue
            if not event.wait(2.0):
                state["token"] = None

    if streams:
        shell.events.register("post_run_cell", after_cell)


_pipe_over_ipc()

from ipykernel.kernelapp import IPKernelApp  # noqa: E402

_app = IPKernelApp.instance()
_app.initialize()
try:
    _sync_fd_output(_app.shell)
except Exception as _error:
    print("airlock: no fd-output sync: %r" % (_error,), file=sys.__stderr__)
_app.start()
'''


def emit(event):
    """Writes one event as one JSON line on the protocol channel."""
    line = json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n"
    # "replace" turns lone surrogates (which no JSON parser accepts) into "?".
    data = line.encode("utf-8", "replace")
    while data:
        written = os.write(_PROTOCOL_FD, data)
        data = data[written:]


def log(message):
    """A diagnostic line on stderr (never the protocol channel)."""
    try:
        sys.stderr.write("airlock kernel driver: %s\n" % message)
        sys.stderr.flush()
    except Exception:
        pass


def one_line(text):
    return " ".join(str(text).split())


def fatal(reason, message):
    emit({"event": "fatal", "reason": reason, "message": one_line(message)})
    sys.exit(EXIT_FATAL)


class KernelStartError(Exception):
    """The kernel could not be started or did not answer."""


class KernelGone(Exception):
    """The kernel process exited while the driver waited on it."""


class StderrTail(threading.Thread):
    """Reads the kernel's own stderr (ipykernel's log; user output goes over iopub) and keeps the
    last few KiB, written to the driver's stderr when the kernel fails. Never blocks the kernel."""

    LIMIT = 16384

    def __init__(self, fd):
        super().__init__(name="kernel-stderr", daemon=True)
        self.fd = fd
        self.chunks = collections.deque()
        self.size = 0
        self.lock = threading.Lock()

    def run(self):
        try:
            while True:
                data = os.read(self.fd, 4096)
                if not data:
                    break
                with self.lock:
                    self.chunks.append(data)
                    self.size += len(data)
                    while self.size > self.LIMIT and len(self.chunks) > 1:
                        self.size -= len(self.chunks.popleft())
        except OSError:
            pass
        finally:
            os.close(self.fd)

    def text(self):
        with self.lock:
            data = b"".join(self.chunks)[-self.LIMIT :]
        return data.decode("utf-8", "replace")

    def last_line(self):
        lines = [line for line in self.text().splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""


class Kernel:
    """One ipykernel process and the driver's sockets to it."""

    def __init__(self, home, generation, modules):
        self.home = home
        self.generation = generation
        self.zmq = modules["zmq"]
        self.KernelManager = modules["KernelManager"]
        self.KernelSpecManager = modules["KernelSpecManager"]
        self.km = None
        self.context = None
        self.shell = None
        self.iopub = None
        self.poller = None
        self.stderr = None
        self.info = {}
        self.start_ms = 0.0

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self):
        zmq = self.zmq
        started = time.monotonic()
        ksm = self.KernelSpecManager(kernel_dirs=[os.path.join(self.home, "kernels")])
        prefix = os.path.join(self.home, "k%d" % self.generation)
        self.km = self.KernelManager(
            kernel_name=KERNEL_NAME,
            kernel_spec_manager=ksm,
            transport="ipc",
            ip=prefix,
            connection_file=prefix + ".json",
        )
        read_fd, write_fd = os.pipe()
        self.stderr = StderrTail(read_fd)
        self.stderr.start()
        try:
            self.km.start_kernel(
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=write_fd,
                env=dict(os.environ),
            )
        except Exception as error:
            raise KernelStartError("could not run the kernel: %s" % error) from None
        finally:
            os.close(write_fd)
        info = self.km.get_connection_info()
        self.context = zmq.Context()
        self.shell = self.context.socket(zmq.DEALER)
        self.shell.linger = 0
        self.shell.connect(self._url(info, "shell_port"))
        self.iopub = self.context.socket(zmq.SUB)
        self.iopub.linger = 0
        # The driver drains iopub as fast as the server reads it; never let the kernel's PUB drop
        # output (or the final "idle") because our side of the pipe is full.
        self.iopub.rcvhwm = 0
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.iopub.connect(self._url(info, "iopub_port"))
        self.poller = zmq.Poller()
        self.poller.register(self.shell, zmq.POLLIN)
        self.poller.register(self.iopub, zmq.POLLIN)
        self._wait_ready(started + START_TIMEOUT_S)
        self.start_ms = (time.monotonic() - started) * 1000.0

    @staticmethod
    def _url(info, port_key):
        return "ipc://%s-%d" % (info["ip"], info[port_key])

    def _wait_ready(self, deadline):
        """kernel_info until both its reply (shell) and its "idle" (iopub) arrive: the second
        proves that our iopub subscription is in place, so no output of the first run is lost."""
        while True:
            msg = self.km.session.msg("kernel_info_request", {})
            self.km.session.send(self.shell, msg)
            msg_id = msg["header"]["msg_id"]
            reply = None
            idle = False
            resend = time.monotonic() + 1.0
            while not (reply and idle):
                now = time.monotonic()
                if now >= deadline:
                    raise KernelStartError(
                        "the kernel did not answer within %d s" % START_TIMEOUT_S
                    )
                if reply and now >= resend:
                    break  # the reply came but not the idle: subscribe race, ask again
                events = dict(self.poller.poll(int(POLL_S * 1000)))
                if not events and not self.alive():
                    raise KernelStartError("the kernel exited while starting (%s)" % self.exit_text())
                for msg_in in self._drain(self.shell):
                    if msg_in["parent_header"].get("msg_id") == msg_id:
                        reply = msg_in
                for msg_in in self._drain(self.iopub):
                    if (
                        msg_in["parent_header"].get("msg_id") == msg_id
                        and msg_in["msg_type"] == "status"
                        and msg_in["content"].get("execution_state") == "idle"
                    ):
                        idle = True
            if reply and idle:
                self.info = reply["content"]
                return

    def alive(self):
        try:
            return bool(self.km is not None and self.km.is_alive())
        except Exception:
            return False

    def exit_text(self):
        code = None
        provisioner = getattr(self.km, "provisioner", None)
        process = getattr(provisioner, "process", None)
        if process is not None:
            code = process.poll()
        if code is None:
            return "it exited"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = "signal %d" % -code
            hint = "; out of memory?" if -code == signal.SIGKILL else ""
            return "killed by %s%s" % (name, hint)
        return "exit code %d" % code

    def interrupt(self):
        try:
            self.km.interrupt_kernel()
        except Exception as error:
            log("interrupt failed: %s" % error)

    def stop(self, graceful=False):
        """Ends the kernel process and closes the driver's sockets; safe to call twice."""
        if self.km is not None:
            try:
                if self.km.has_kernel:
                    self.km.shutdown_kernel(now=not graceful)
            except Exception as error:
                log("kernel shutdown: %s" % error)
                try:
                    self.km.kill_kernel()
                except Exception:
                    pass
            try:
                self.km.cleanup_resources()
            except Exception:
                pass
        for sock in (self.shell, self.iopub):
            if sock is not None:
                sock.close(0)
        if self.context is not None:
            self.context.term()
        self.km = self.shell = self.iopub = self.context = self.poller = None

    # -- messages ------------------------------------------------------------------------------

    def _drain(self, sock):
        """Every message waiting on `sock`, deserialized (bad signatures are dropped)."""
        zmq = self.zmq
        messages = []
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return messages
            try:
                _idents, parts = self.km.session.feed_identities(frames)
                messages.append(self.km.session.deserialize(parts))
            except Exception as error:
                log("dropped a message from the kernel: %s" % error)

    def execute(self, code):
        msg = self.km.session.msg(
            "execute_request",
            {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": False,
                # One cell at a time: with True, ipykernel aborts requests that arrive in the
                # moment after a failed cell, so the next call would be answered unrun.
                "stop_on_error": False,
            },
        )
        self.km.session.send(self.shell, msg)
        return msg["header"]["msg_id"]

    def wait(self, msg_id, until):
        """Batches of messages for `msg_id` until the monotonic time `until[0]` (a list: the
        caller may move it while iterating): yields
        ("iopub"|"shell", [msg, ...]) as they arrive; raises KernelGone when the process exits."""
        while True:
            remaining = until[0] - time.monotonic()
            if remaining <= 0:
                return
            events = dict(self.poller.poll(int(min(remaining, POLL_S) * 1000) + 1))
            for channel, sock in (("iopub", self.iopub), ("shell", self.shell)):
                if sock in events:
                    batch = [
                        msg
                        for msg in self._drain(sock)
                        if msg["parent_header"].get("msg_id") == msg_id
                    ]
                    if batch:
                        yield channel, batch
            if not events and not self.alive():
                # Whatever the kernel sent before dying is still queued on iopub.
                batch = [
                    msg
                    for msg in self._drain(self.iopub)
                    if msg["parent_header"].get("msg_id") == msg_id
                ]
                if batch:
                    yield "iopub", batch
                raise KernelGone(self.exit_text())


def clean_data(data):
    """The kept MIME types of a display message's data, as the protocol sends them."""
    kept = {}
    for mime in KEPT_MIMES:
        if mime not in data:
            continue
        value = data[mime]
        if mime == "application/json":
            kept[mime] = value
            continue
        if isinstance(value, list):
            value = "".join(str(part) for part in value)
        elif isinstance(value, bytes):
            value = value.decode("ascii", "replace")
        elif not isinstance(value, str):
            value = str(value)
        if mime in BASE64_MIMES:
            value = "".join(value.split())
        kept[mime] = value
    return kept


def clean_traceback(frames):
    lines = []
    for frame in frames or []:
        lines.extend(ANSI_RE.sub("", str(frame)).splitlines())
    return lines


class Driver:
    def __init__(self, home, modules):
        self.home = home
        self.modules = modules
        self.generation = 0
        self.kernel = None

    def start_kernel(self):
        self.generation += 1
        kernel = Kernel(self.home, self.generation, self.modules)
        try:
            kernel.start()
        except KernelStartError as error:
            tail = kernel.stderr.text() if kernel.stderr else ""
            if tail:
                log("the kernel's stderr:\n" + tail)
            last = kernel.stderr.last_line() if kernel.stderr else ""
            kernel.stop()
            message = "the Jupyter kernel did not start: %s" % error
            if last:
                message += " (last line of its stderr: %s)" % last
            fatal("start_failed", message)
        self.kernel = kernel
        return kernel

    def replace_kernel(self):
        """A fresh kernel instead of the current (dead, hung or to be cleared) one."""
        old = self.kernel
        self.kernel = None
        if old is not None:
            tail = old.stderr.text() if old.stderr else ""
            old.stop()
            return tail
        return ""

    # -- requests ------------------------------------------------------------------------------

    def handle(self, line):
        try:
            request = json.loads(line)
        except ValueError as error:
            emit({"event": "protocol_error", "message": "not a JSON line: %s" % error})
            return True
        if not isinstance(request, dict):
            emit({"event": "protocol_error", "message": "a request is a JSON object"})
            return True
        op = request.get("op")
        rid = request.get("id")
        if op == "shutdown":
            return False
        if op not in ("run", "restart"):
            self.protocol_error(rid, "unknown op %s (expected run, restart or shutdown)" % json.dumps(op))
            return True
        if not isinstance(rid, str) or not rid:
            self.protocol_error(rid, "%s needs an \"id\" string" % op)
            return True
        if op == "restart":
            self.replace_kernel()
            kernel = self.start_kernel()
            emit({"id": rid, "event": "restarted", "kernel_start_ms": round(kernel.start_ms, 1)})
            return True
        code = request.get("code")
        if not isinstance(code, str):
            self.protocol_error(rid, "run needs a \"code\" string")
            return True
        timeout_ms = request.get("timeout_ms", DEFAULT_TIMEOUT_MS)
        if timeout_ms is None:
            timeout_ms = DEFAULT_TIMEOUT_MS
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or timeout_ms <= 0:
            self.protocol_error(rid, "timeout_ms must be a positive number of milliseconds")
            return True
        self.run(rid, code, timeout_ms / 1000.0)
        return True

    @staticmethod
    def protocol_error(rid, message):
        event = {"event": "protocol_error", "message": message}
        if isinstance(rid, str):
            event["id"] = rid
        emit(event)

    def renew(self, rid, name, value, execution_count, timed_out, why):
        """Ends a run whose kernel is dead or hung: the old kernel goes, the run gets its error
        and its done at once, then a new kernel starts (before the next request is read)."""
        tail = self.replace_kernel()
        if tail:
            log("%s; the kernel's stderr:\n%s" % (why, tail))
        emit({"id": rid, "event": "error", "name": name, "value": value, "traceback": []})
        emit(
            {
                "id": rid,
                "event": "done",
                "execution_count": execution_count or 0,
                "timed_out": timed_out,
                "restarted": True,
            }
        )
        self.start_kernel()

    def run(self, rid, code, timeout_s):
        kernel = self.kernel
        if not kernel.alive():
            # Died between runs (a background thread's os._exit, the OOM killer...).
            self.renew(
                rid,
                "KernelDied",
                "the kernel died since the last run (%s); its state is lost; a new kernel was "
                "started and this code was not run" % kernel.exit_text(),
                0,
                False,
                "the kernel died between runs",
            )
            return

        msg_id = kernel.execute(code)
        started = time.monotonic()
        deadline = started + timeout_s
        execution_count = None
        reply = None
        idle = False
        timed_out = False
        saw_error = False
        until = [deadline]
        try:
            while not (reply is not None and idle):
                for channel, batch in kernel.wait(msg_id, until):
                    if channel == "shell":
                        for msg in batch:
                            if msg["msg_type"] == "execute_reply":
                                reply = msg["content"]
                        if reply is not None and not idle:
                            until[0] = min(until[0], time.monotonic() + IDLE_GRACE_S)
                    else:
                        state = self.forward(rid, batch)
                        idle = idle or state["idle"]
                        saw_error = saw_error or state["error"]
                        if state["execution_count"] is not None:
                            execution_count = state["execution_count"]
                    if reply is not None and idle:
                        break
                if reply is not None:
                    break  # with its idle, or without it after IDLE_GRACE_S
                if not timed_out:
                    # The deadline passed: interrupt (SIGINT to the kernel's process group) and
                    # give the code a moment to unwind.
                    timed_out = True
                    kernel.interrupt()
                    until[0] = time.monotonic() + INTERRUPT_GRACE_S
                    continue
                # Interrupted, and still running: the kernel is hung (or ignores SIGINT).
                self.renew(
                    rid,
                    "KernelRestarted",
                    "the code ran past its timeout and the kernel did not stop within %d s of an "
                    "interrupt; its state is lost; a new kernel was started" % INTERRUPT_GRACE_S,
                    execution_count,
                    True,
                    "the kernel did not stop after an interrupt",
                )
                return
        except KernelGone as gone:
            self.renew(
                rid,
                "KernelDied",
                "the kernel died while running this code (%s); its state is lost; a new kernel "
                "was started" % gone,
                execution_count,
                timed_out,
                "the kernel died during a run",
            )
            return

        if reply.get("status") == "error" and not saw_error:
            emit(self.error_event(rid, reply))
        if reply.get("execution_count") is not None:
            execution_count = reply["execution_count"]
        emit(
            {
                "id": rid,
                "event": "done",
                "execution_count": execution_count or 0,
                "timed_out": timed_out,
            }
        )

    def forward(self, rid, batch):
        """Emits the events of a batch of iopub messages; adjacent chunks of one stream become
        one event. Returns what the run loop tracks: idle, error seen, execution_count."""
        state = {"idle": False, "error": False, "execution_count": None}
        pending_name = None
        pending = []

        def flush():
            if pending:
                emit({"id": rid, "event": pending_name, "text": "".join(pending)})
                del pending[:]

        for msg in batch:
            kind = msg["msg_type"]
            content = msg["content"]
            if kind == "stream":
                name = "stderr" if content.get("name") == "stderr" else "stdout"
                if name != pending_name:
                    flush()
                    pending_name = name
                pending.append(str(content.get("text", "")))
                continue
            flush()
            if kind == "status" and content.get("execution_state") == "idle":
                state["idle"] = True
            elif kind == "execute_input":
                state["execution_count"] = content.get("execution_count")
            elif kind in ("execute_result", "display_data", "update_display_data"):
                emit(
                    {
                        "id": rid,
                        "event": "result",
                        "kind": "execute_result" if kind == "execute_result" else "display_data",
                        "data": clean_data(content.get("data", {})),
                    }
                )
            elif kind == "error":
                state["error"] = True
                emit(self.error_event(rid, content))
        flush()
        return state

    @staticmethod
    def error_event(rid, content):
        return {
            "id": rid,
            "event": "error",
            "name": str(content.get("ename", "Error")),
            "value": ANSI_RE.sub("", str(content.get("evalue", ""))),
            "traceback": clean_traceback(content.get("traceback")),
        }


def private_home():
    """A 0700 directory under /tmp for the connection file, the ipc sockets and the kernel's
    IPython/Jupyter state."""
    base = "/tmp" if os.access("/tmp", os.W_OK | os.X_OK) else tempfile.gettempdir()
    home = tempfile.mkdtemp(prefix="airlock-kernel-", dir=base)
    os.chmod(home, 0o700)
    for sub in ("ipython", "runtime", "data", "kernels/" + KERNEL_NAME):
        os.makedirs(os.path.join(home, sub), mode=0o700, exist_ok=True)
    launcher = os.path.join(home, "launch.py")
    with open(launcher, "w") as f:
        f.write(LAUNCHER)
    spec = {
        "argv": [
            sys.executable,
            launcher,
            "-f",
            "{connection_file}",
            # No history file (and no history-saving thread): the sandbox is disposable.
            "--HistoryManager.hist_file=:memory:",
        ],
        "display_name": "airlock Python",
        "language": "python",
        "interrupt_mode": "signal",
    }
    with open(os.path.join(home, "kernels", KERNEL_NAME, "kernel.json"), "w") as f:
        json.dump(spec, f)
    return home


def kernel_environment(home):
    os.environ["AIRLOCK_KERNEL_DIR"] = home
    os.environ["IPYTHONDIR"] = os.path.join(home, "ipython")
    os.environ["JUPYTER_RUNTIME_DIR"] = os.path.join(home, "runtime")
    os.environ["JUPYTER_DATA_DIR"] = os.path.join(home, "data")
    os.environ.setdefault("JUPYTER_PLATFORM_DIRS", "1")
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    if "MPLBACKEND" not in os.environ and importlib.util.find_spec("matplotlib_inline") is not None:
        os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    # Matplotlib's config and font cache in the private directory, not in HOME (/workspace, the
    # user's files).
    os.environ.setdefault("MPLCONFIGDIR", os.path.join(home, "matplotlib"))
    # Debian's matplotlib reads its defaults only from /etc/matplotlibrc, which a sandbox's
    # synthesized /etc lacks ("Could not find matplotlibrc file; your Matplotlib install is
    # broken"); Debian ships the same file in its data directory.
    debian_rc = "/usr/share/matplotlib/mpl-data/matplotlibrc"
    if (
        "MATPLOTLIBRC" not in os.environ
        and not os.path.exists("/etc/matplotlibrc")
        and os.path.isfile(debian_rc)
    ):
        os.environ["MATPLOTLIBRC"] = debian_rc
    # Likewise fontconfig (which matplotlib asks for fonts through fc-list) without
    # /etc/fonts/fonts.conf prints "Fontconfig error: Cannot load default config file" into the
    # user's first plot's stderr: give it a minimal config of the system's font directories.
    if (
        "FONTCONFIG_FILE" not in os.environ
        and "FONTCONFIG_PATH" not in os.environ
        and not os.path.exists("/etc/fonts/fonts.conf")
    ):
        conf = os.path.join(home, "fonts.conf")
        with open(conf, "w") as f:
            f.write(
                '<?xml version="1.0"?>\n<fontconfig>\n'
                "<dir>/usr/share/fonts</dir>\n<dir>/usr/local/share/fonts</dir>\n"
                "<cachedir>%s</cachedir>\n</fontconfig>\n" % os.path.join(home, "fontconfig")
            )
        os.environ["FONTCONFIG_FILE"] = conf


def import_jupyter():
    """jupyter_client and pyzmq in this process; ipykernel must exist for the kernel process."""
    missing = None
    try:
        if importlib.util.find_spec("ipykernel") is None:
            missing = "No module named 'ipykernel'"
    except Exception as error:
        missing = "%s: %s" % (type(error).__name__, error)
    if missing is None:
        try:
            import zmq
            from jupyter_client import KernelManager
            from jupyter_client.kernelspec import KernelSpecManager
        except Exception as error:
            missing = "%s: %s" % (type(error).__name__, error)
    if missing is not None:
        fatal(
            "no_kernel",
            "this image has no Jupyter kernel (%s cannot import ipykernel/jupyter_client: %s); "
            "install python3-ipykernel or pip install ipykernel" % (sys.executable, missing),
        )
    return {"zmq": zmq, "KernelManager": KernelManager, "KernelSpecManager": KernelSpecManager}


def ipykernel_version():
    try:
        import importlib.metadata

        return importlib.metadata.version("ipykernel")
    except Exception:
        return ""


def main():
    def terminate(signum, _frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)

    home = private_home()
    driver = None
    try:
        kernel_environment(home)
        modules = import_jupyter()
        driver = Driver(home, modules)
        kernel = driver.start_kernel()
        info = kernel.info
        language = info.get("language_info") or {}
        emit(
            {
                "event": "ready",
                "python": str(language.get("version", "")),
                "ipykernel": ipykernel_version(),
                "kernel_start_ms": round(kernel.start_ms, 1),
            }
        )
        stdin = sys.stdin.buffer
        while True:
            line = stdin.readline()
            if not line:
                break  # EOF: the server is gone or done
            if not line.strip():
                continue
            if not driver.handle(line.decode("utf-8", "replace")):
                break
        if driver.kernel is not None:
            driver.kernel.stop(graceful=True)
            driver.kernel = None
    finally:
        if driver is not None and driver.kernel is not None:
            driver.kernel.stop()
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
