"""The Python example of docs/sdks.md, run as written against the session's daemon.

Its block is claimed by ``<!-- test: clients/python/tests/test_docs.py
test_sdks_python_block_runs -->`` in docs/sdks.md (crates/airlock/tests/docs.rs checks that
every shell block of the docs names the test that runs it; this one is Python).
"""

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[3] / "docs" / "sdks.md"


def python_block(heading: str) -> str:
    """The first ```python block after the heading line ``heading`` of docs/sdks.md."""
    text = DOC.read_text()
    start = text.index("\n" + heading + "\n")
    m = re.compile(r"^```python\n(.*?)^```$", re.S | re.M).search(text, start)
    assert m, f"docs/sdks.md: no python block under {heading!r}"
    return m.group(1)


def test_sdks_python_block_runs(url: str) -> None:
    code = python_block("## Python SDK and agent-framework adapters")
    assert '"http://127.0.0.1:8710"' in code, code
    code = code.replace('"http://127.0.0.1:8710"', repr(url))
    out = io.StringIO()
    scope: dict = {"__name__": "docs_sdks_example"}
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOC), "exec"), scope)  # noqa: S102 (our own docs)
    r = scope["r"]
    assert (r.exit_code, r.stdout) == (0, "2 data.csv\n"), r
    printed = out.getvalue()
    # The stream's events: 0, 1 and 2 on stdout, then the result.
    assert all(str(i) in printed for i in range(3)), printed
    assert "exited" in printed, printed
