"""Tests of airlock's code-interpreter driver (crates/airlock-server/src/kernel/driver.py).

Run with Debian's python, which has pytest, ipykernel, jupyter_client, matplotlib and pandas:

    /usr/bin/python3 -m pytest -q tests/kernel/test_driver.py

The driver processes are always started with /usr/bin/python3 (override: AIRLOCK_KERNEL_PYTHON),
exactly as the server starts it: `python3 -u -c "<driver.py>"`, JSON lines on stdin/stdout. The
tests marked `sandbox` run it inside a real airlock sandbox through `airlock run` (the binary:
AIRLOCK_BIN, else target/{debug,release}/airlock of this checkout or of /work/main); they are
skipped, saying why, when no binary is there.
"""

import base64
import json
import os
import queue
import shutil
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "crates" / "airlock-server" / "src" / "kernel" / "driver.py"
PYTHON = os.environ.get("AIRLOCK_KERNEL_PYTHON", "/usr/bin/python3")
SOURCE = DRIVER.read_text()


def airlock_binary():
    candidates = [os.environ.get("AIRLOCK_BIN")]
    for root in (ROOT, Path("/work/main")):
        candidates += [root / "target" / "debug" / "airlock", root / "target" / "release" / "airlock"]
    for candidate in candidates:
        if candidate and os.access(str(candidate), os.X_OK):
            return str(candidate)
    return None


AIRLOCK = airlock_binary()
needs_airlock = pytest.mark.skipif(
    AIRLOCK is None or os.geteuid() != 0,
    reason="needs the airlock binary (AIRLOCK_BIN or target/*/airlock; build it with cargo build "
    "-p airlock) and root to make sandboxes",
)


class Driver:
    """One driver process; every line it prints must be a JSON object (else the test fails)."""

    def __init__(self, argv=None, env=None):
        argv = argv or [PYTHON, "-u", "-c", SOURCE]
        if env is None:
            # ipykernel stops capturing fd 1/2 when it sees pytest's variable.
            env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd="/tmp",
        )
        self.events = queue.Queue()
        self.stderr = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            text = line.decode("utf-8")
            try:
                event = json.loads(text)
            except ValueError:
                event = {"event": "NOT_JSON", "line": text}
            event["_at"] = time.monotonic()
            self.events.put(event)
        self.events.put(None)

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.stderr.append(line.decode("utf-8", "replace"))

    def next(self, timeout=60):
        try:
            event = self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no event within %s s; stderr: %s" % (timeout, "".join(self.stderr)))
        if event is None:
            raise AssertionError("the driver closed stdout; stderr: %s" % "".join(self.stderr))
        assert event["event"] != "NOT_JSON", event
        return event

    def ready(self, timeout=120):
        event = self.next(timeout)
        assert event["event"] == "ready", (event, "".join(self.stderr))
        return event

    def send(self, request):
        line = request if isinstance(request, str) else json.dumps(request)
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def run(self, code, rid="r", timeout_ms=30000, wait=90):
        """The events of one run, through its done (which must be the last, exactly once)."""
        self.send({"op": "run", "id": rid, "code": code, "timeout_ms": timeout_ms})
        events = []
        while True:
            event = self.next(wait)
            assert event.get("id") == rid, event
            events.append(event)
            if event["event"] == "done":
                return events

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send({"op": "shutdown"})
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def of(events, kind):
    return [e for e in events if e["event"] == kind]


def stdout(events):
    return "".join(e["text"] for e in of(events, "stdout"))


def done(events):
    assert of(events, "done") == [events[-1]], events
    return events[-1]


def png_size(b64):
    data = base64.b64decode(b64, validate=True)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", data[:16]
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def driver():
    d = Driver()
    d.ready()
    yield d
    d.close()


# -- on the host ------------------------------------------------------------------------------


def test_ready_names_versions():
    d = Driver()
    try:
        ready = d.ready()
        out = subprocess.run(
            [PYTHON, "-c", "import platform, importlib.metadata as m; "
             "print(platform.python_version(), m.version('ipykernel'))"],
            capture_output=True, text=True, check=True,
        ).stdout.split()
        assert [ready["python"], ready["ipykernel"]] == out
        assert ready["kernel_start_ms"] > 0
    finally:
        d.close()


def test_state_persists_and_print_streams(driver):
    first = driver.run("x = 41", "a")
    assert [e["event"] for e in first] == ["done"]
    assert first[-1]["execution_count"] == 1 and first[-1]["timed_out"] is False
    second = driver.run("print(x + 1)\nx", "b")
    assert stdout(second) == "42\n"
    [result] = of(second, "result")
    assert result["kind"] == "execute_result" and result["data"] == {"text/plain": "41"}
    assert done(second)["execution_count"] == 2
    third = driver.run("import sys; print('oops', file=sys.stderr)", "c")
    assert "".join(e["text"] for e in of(third, "stderr")) == "oops\n"


def test_output_streams_before_the_run_ends(driver):
    events = driver.run("import time\nprint('first', flush=True)\ntime.sleep(2)\nprint('second')")
    first = next(e for e in events if e["event"] == "stdout" and "first" in e["text"])
    assert done(events)["_at"] - first["_at"] > 1.5, events
    assert stdout(events) == "first\nsecond\n"


def test_matplotlib_figure_is_a_png_of_the_right_size(driver):
    code = (
        "%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}\n"
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(figsize=(5, 2), dpi=80)\n"
        "ax.plot([1, 3, 2]);\n"
    )
    events = driver.run(code)
    assert not of(events, "error"), events
    [result] = of(events, "result")
    assert result["kind"] == "display_data"
    png = result["data"]["image/png"]
    assert "\n" not in png
    assert png_size(png) == (400, 160)
    assert result["data"]["text/plain"] == "<Figure size 400x160 with 1 Axes>"


def test_dataframe_has_html_and_plain(driver):
    events = driver.run("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    [result] = of(events, "result")
    assert result["kind"] == "execute_result"
    assert "<table" in result["data"]["text/html"]
    assert result["data"]["text/plain"].split() == ["a", "b", "0", "1", "x", "1", "2", "y"]


def test_kept_mime_types_only(driver):
    code = (
        "class R:\n"
        "    def _repr_mimebundle_(self, include=None, exclude=None):\n"
        "        return {'text/plain': 'r', 'text/markdown': '**r**', 'text/latex': '$r$',\n"
        "                'application/json': {'k': [1, 2]}, 'image/svg+xml': '<svg/>',\n"
        "                'application/x-secret': 'dropped', 'text/x-other': 'dropped'}\n"
        "display(R())"
    )
    [result] = of(driver.run(code), "result")
    assert result["kind"] == "display_data"
    assert result["data"] == {
        "text/plain": "r",
        "text/markdown": "**r**",
        "text/latex": "$r$",
        "application/json": {"k": [1, 2]},
        "image/svg+xml": "<svg/>",
    }


def test_exception_has_name_value_and_plain_traceback(driver):
    events = driver.run("def f():\n    return 1 / 0\nf()")
    [error] = of(events, "error")
    assert error["name"] == "ZeroDivisionError" and error["value"] == "division by zero"
    assert any("return 1 / 0" in line for line in error["traceback"]), error
    assert error["traceback"][-1] == "ZeroDivisionError: division by zero"
    assert not any("\x1b" in line or "\n" in line for line in error["traceback"])
    assert done(events)["timed_out"] is False
    assert stdout(driver.run("print('still here')")) == "still here\n"


def test_timeout_interrupts_and_keeps_state(driver):
    driver.run("y = 7")
    started = time.monotonic()
    events = driver.run("import time\ntime.sleep(30)", timeout_ms=1000)
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 6.0, elapsed
    [error] = of(events, "error")
    assert error["name"] == "KeyboardInterrupt", error
    end = done(events)
    assert end["timed_out"] is True and "restarted" not in end
    assert stdout(driver.run("print(y)")) == "7\n"


def test_kernel_ignoring_the_interrupt_is_restarted(driver):
    driver.run("z = 1")
    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)"
    started = time.monotonic()
    events = driver.run(code, timeout_ms=500)
    assert time.monotonic() - started < 30
    [error] = of(events, "error")
    assert error["name"] == "KernelRestarted", error
    end = done(events)
    assert end["timed_out"] is True and end["restarted"] is True
    after = driver.run("print('z' in globals())")
    assert stdout(after) == "False\n"


def test_restart_clears_state(driver):
    driver.run("w = 3")
    driver.send({"op": "restart", "id": "rs"})
    event = driver.next()
    assert event["event"] == "restarted" and event["id"] == "rs", event
    events = driver.run("w")
    assert of(events, "error")[0]["name"] == "NameError"
    assert done(events)["execution_count"] == 1


def test_os_exit_reports_kernel_died_and_the_next_run_works(driver):
    driver.run("v = 1")
    events = driver.run("print('before', flush=True)\nimport os\nos._exit(1)")
    [error] = of(events, "error")
    assert error["name"] == "KernelDied" and "exit code 1" in error["value"], error
    assert "state is lost" in error["value"]
    assert done(events)["restarted"] is True
    assert stdout(driver.run("print('v' in globals(), 2 + 2)")) == "False 4\n"


def test_kernel_killed_between_runs_is_reported(driver):
    # A background thread kills the kernel after the run ended.
    driver.run("import os, threading, time\n"
               "threading.Thread(target=lambda: (time.sleep(0.3), os._exit(9))).start()")
    time.sleep(1.5)
    events = driver.run("print('never runs')")
    [error] = of(events, "error")
    assert error["name"] == "KernelDied" and "exit code 9" in error["value"], error
    assert not of(events, "stdout")
    assert stdout(driver.run("print('works')")) == "works\n"


def test_forked_child_output_comes_back(driver):
    code = (
        "import os, sys\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    print('from the child')\n"
        "    sys.stdout.flush()\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print('from the parent')"
    )
    out = stdout(driver.run(code))
    assert "from the child\n" in out and "from the parent\n" in out


def test_fd_level_output_is_an_event_not_protocol_noise(driver):
    events = driver.run("import os, subprocess\nos.write(1, b'raw\\n')\n"
                        "subprocess.run(['echo', 'child'])\nos.write(2, b'err\\n')\nNone")
    assert "raw\n" in stdout(events) and "child\n" in stdout(events)
    assert "err" in "".join(e["text"] for e in of(events, "stderr"))
    # Output a child writes just before the cell ends belongs to that cell, every time.
    for n in range(25):
        events = driver.run("import subprocess; subprocess.run(['echo', 'n%d']); None" % n, "e%d" % n)
        assert stdout(events) == "n%d\n" % n, events


def test_fd_redirected_by_the_user_gets_nothing_of_ours(driver, tmp_path):
    target = tmp_path / "captured"
    driver.run("import os\nf = open(%r, 'wb')\nsaved = os.dup(1)\nos.dup2(f.fileno(), 1)" % str(target))
    driver.run("os.write(1, b'hello')")
    driver.run("os.dup2(saved, 1)\nf.close()")
    assert target.read_bytes() == b"hello"
    assert stdout(driver.run("import subprocess; subprocess.run(['echo', 'back']); None")) == "back\n"


def test_protocol_errors_do_not_stop_the_driver(driver):
    for bad in ["{not json", "[1, 2]", json.dumps({"op": "dance", "id": "q"}),
                json.dumps({"op": "run", "id": "q"}), json.dumps({"op": "run", "code": "1"}),
                json.dumps({"op": "run", "id": "q", "code": "1", "timeout_ms": -5})]:
        driver.send(bad)
        event = driver.next()
        assert event["event"] == "protocol_error" and event["message"], (bad, event)
    assert stdout(driver.run("print('fine')")) == "fine\n"


def test_shutdown_and_eof_end_the_driver_and_the_kernel():
    for how in ("shutdown", "eof"):
        d = Driver()
        d.ready()
        pid, home = json.loads(stdout(d.run(
            "import json, os; print(json.dumps([os.getpid(), os.environ['AIRLOCK_KERNEL_DIR']]))")))
        assert os.path.exists("/proc/%d" % pid) and os.path.isdir(home)
        assert (os.stat(home).st_mode & 0o777) == 0o700
        if how == "shutdown":
            d.send({"op": "shutdown"})
        else:
            d.proc.stdin.close()
        assert d.proc.wait(20) == 0
        deadline = time.monotonic() + 10
        while os.path.exists("/proc/%d" % pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.path.exists("/proc/%d" % pid), "the kernel outlived the driver"
        assert not os.path.exists(home), "the private directory outlived the driver"


def test_no_ipykernel_is_fatal_no_kernel():
    # -S: no site-packages, so no ipykernel and no jupyter_client; the same for a python that
    # lacks them (pyenv's, when it is in PATH).
    pythons = [[PYTHON, "-S"]]
    other = shutil.which("python3")
    if other and os.path.realpath(other) != os.path.realpath(PYTHON):
        probe = subprocess.run([other, "-c", "import ipykernel"], capture_output=True)
        if probe.returncode != 0:
            pythons.append([other])
    for python in pythons:
        proc = subprocess.run(python + ["-u", "-c", SOURCE], input=b"", capture_output=True, timeout=60)
        assert proc.returncode == 3, (python, proc)
        lines = proc.stdout.decode().splitlines()
        assert len(lines) == 1, lines
        event = json.loads(lines[0])
        assert event["event"] == "fatal" and event["reason"] == "no_kernel", event
        assert "ipykernel" in event["message"] and "install" in event["message"]
        assert "\n" not in event["message"]


def test_kernel_that_cannot_start_is_fatal_start_failed(tmp_path):
    # A broken ipykernel that shadows the real one only for the kernel process.
    (tmp_path / "ipykernel").mkdir()
    (tmp_path / "ipykernel" / "__init__.py").write_text("raise RuntimeError('broken on purpose')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.run([PYTHON, "-u", "-c", SOURCE], input=b"", capture_output=True,
                          timeout=120, env=env)
    assert proc.returncode == 3, proc
    event = json.loads(proc.stdout.decode().splitlines()[-1])
    assert event["event"] == "fatal" and event["reason"] == "start_failed", event
    assert "broken on purpose" in event["message"], event


# -- inside an airlock sandbox ----------------------------------------------------------------


def run_in_sandbox(requests, timeout=240):
    """Runs the driver in a fresh sandbox with `requests` as its whole stdin (`airlock run`
    hands the program its stdin only once airlock's own stdin ends; the server's sessions use
    pipes instead) and returns ({id: [events]}, other events, the exit code)."""
    proc = subprocess.run(
        [AIRLOCK, "run", "--timeout", "%ds" % (timeout - 10), "--memory", "1g", "--cpus", "1",
         "--stdin", "-", "--", "python3", "-u", "-c", SOURCE],
        input="".join(json.dumps(r) + "\n" for r in requests).encode(),
        capture_output=True,
        timeout=timeout,
    )
    by_id, other = {}, []
    for line in proc.stdout.decode().splitlines():
        event = json.loads(line)  # every line of the protocol channel is JSON
        if "id" in event:
            by_id.setdefault(event["id"], []).append(event)
        else:
            other.append(event)
    return by_id, other, proc


@needs_airlock
def test_in_sandbox_kernel_runs_without_tcp():
    run = lambda rid, code, timeout_ms=30000: {  # noqa: E731
        "op": "run", "id": rid, "code": code, "timeout_ms": timeout_ms}
    requests = [
        run("set", "x = 41"),
        run("get", "print(x + 1)"),
        # No TCP (nor netlink): every socket of every process in the sandbox is a unix socket.
        run("tcp", "import glob, os\n"
                   "inodes = set()\n"
                   "for fd in glob.glob('/proc/[0-9]*/fd/*'):\n"
                   "    try:\n"
                   "        target = os.readlink(fd)\n"
                   "    except OSError:\n"
                   "        continue\n"
                   "    if target.startswith('socket:['):\n"
                   "        inodes.add(target[8:-1])\n"
                   "unix = {l.split()[6] for l in open('/proc/net/unix').readlines()[1:]}\n"
                   "print(len(inodes) > 5, sorted(inodes - unix))"),
        run("png", "%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}\n"
                   "import matplotlib.pyplot as plt\n"
                   "fig = plt.figure(figsize=(3, 2), dpi=100); plt.plot([1, 2]);"),
        run("df", "import pandas as pd; pd.DataFrame({'a': [1]})"),
        run("fork", "import os\nif os.fork() == 0:\n    print('child'); os._exit(0)\nos.wait(); None"),
        run("sub", "import subprocess; subprocess.run(['echo', 'from echo']); None"),
        run("slow", "import time; time.sleep(30)", 1000),
        run("kept", "print(x)"),
        run("die", "import os; os._exit(3)"),
        run("again", "print('again', 'x' in globals())"),
        {"op": "restart", "id": "rs"},
        {"op": "shutdown"},
    ]
    by_id, other, proc = run_in_sandbox(requests)
    assert proc.returncode == 0, (proc.returncode, proc.stderr.decode()[-3000:])
    assert [e["event"] for e in other] == ["ready"], other
    for rid in ("set", "get", "tcp", "png", "df", "fork", "sub", "slow", "kept", "die", "again"):
        assert rid in by_id and by_id[rid][-1]["event"] == "done", (rid, by_id.get(rid))
    assert stdout(by_id["get"]) == "42\n"
    assert stdout(by_id["tcp"]) == "True []\n", by_id["tcp"]
    [png] = of(by_id["png"], "result")
    assert png_size(png["data"]["image/png"]) == (300, 200)
    assert not of(by_id["png"], "stderr"), by_id["png"]  # no matplotlibrc/fontconfig complaints
    assert "<table" in of(by_id["df"], "result")[0]["data"]["text/html"]
    assert stdout(by_id["fork"]) == "child\n"
    assert stdout(by_id["sub"]) == "from echo\n"
    assert of(by_id["slow"], "error")[0]["name"] == "KeyboardInterrupt"
    assert by_id["slow"][-1]["timed_out"] is True
    assert stdout(by_id["kept"]) == "41\n"
    assert of(by_id["die"], "error")[0]["name"] == "KernelDied"
    assert stdout(by_id["again"]) == "again False\n"
    assert by_id["rs"][-1]["event"] == "restarted"
