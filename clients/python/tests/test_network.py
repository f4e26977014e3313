"""Proxy mode's second round through the SDK, against a real daemon: secrets the sandbox
uses but never reads, deny rules, a session's live policy (``network()``,
``update_network()``), and approvals (``approvals()``, ``approve()``, ``on_approval=``).

Loopback only: each test's "remote" host is an HTTP server this module starts on
127.0.0.1. The program in the sandbox asks the proxy for ``http://localhost:PORT/``;
``localhost`` is not in the allowlist (so the connection is held for approval in a
session that asks), and the proxy resolves it on the host to 127.0.0.1, which the
session's ``allow_cidrs`` lets through once allowed.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from airlock import (
    Airlock,
    Approval,
    ApprovalNotFound,
    AsyncAirlock,
    EgressEntry,
    InvalidRequest,
    Network,
    Sandbox,
    Secret,
    StdoutEvent,
)

from conftest import Daemon

BODY = "hello from the test server"

# The program: one GET through the proxy named in HTTP_PROXY (http.client, so no
# NO_PROXY rule can send it around the proxy), printing the status and the body.
FETCH = """\
import http.client, os, sys, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
c = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=60)
headers = {{}}
if len(sys.argv) > 1:
    headers["Authorization"] = "Bearer " + os.environ[sys.argv[1]]
c.request("GET", "http://{host}:{port}/{path}", headers=headers)
r = c.getresponse()
print(r.status, r.read().decode().strip())
"""

# A session's own policy (secrets, live changes, approvals) is the proxy's per tier;
# the SDK's calls are the same on each.
TIERS = ["namespaces", "gvisor"]
# A micro-VM takes seconds to boot under emulation here: the two central checks only.
ALL_TIERS = TIERS + ["microvm"]


# --- the "remote" host -------------------------------------------------------------------


@dataclass
class Seen:
    path: str
    headers: dict[str, str]


@dataclass
class Server:
    port: int
    requests: list[Seen] = field(default_factory=list)

    def fetch(self, host: str = "localhost", path: str = "", secret_env: str | None = None) -> list[str]:
        """The argv of a program that fetches ``http://HOST:PORT/PATH`` through the proxy
        (with ``Authorization: Bearer $SECRET_ENV``)."""
        argv = ["python3", "-c", FETCH.format(host=host, port=self.port, path=path)]
        return argv + ([secret_env] if secret_env else [])


@pytest.fixture
def server() -> Iterator[Server]:
    """An HTTP server on 127.0.0.1 (a thread) that answers every GET with :data:`BODY`
    and records what it was sent."""
    srv: Server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            srv.requests.append(Seen(self.path, {k.lower(): v for k, v in self.headers.items()}))
            body = BODY.encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv = Server(port=httpd.server_address[1])
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield srv
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def asking(timeout_ms: int = 20_000, **kw: Any) -> Network:
    """A proxy policy that asks about what it denies; 127.0.0.1 reachable once allowed."""
    return Network.proxy(allow_cidrs=["127.0.0.1/32"], on_denied="ask", approval_timeout_ms=timeout_ms, **kw)


def last(r: Any, kind: str = "proxy") -> EgressEntry:
    entries = [e for e in r.egress if e.kind == kind]
    assert entries, r.egress
    return entries[-1]


# --- types (no daemon) ---------------------------------------------------------------------


def test_secret_never_shows_its_value() -> None:
    s = Secret("GITHUB_TOKEN", "ghp_sup3r-s3cret", ["api.github.com"])
    assert s.hosts == ("api.github.com",) and s.query is False
    for text in (repr(s), str(s), repr(Network.proxy(secrets=[s])), str(Network.proxy(secrets=[s]))):
        assert "ghp_sup3r-s3cret" not in text and "GITHUB_TOKEN" in text, text
    assert s.to_dict() == {"name": "GITHUB_TOKEN", "value": "ghp_sup3r-s3cret", "hosts": ["api.github.com"], "query": False}
    with pytest.raises(TypeError, match="hosts is a list"):
        Secret("T", "v", "api.github.com")  # type: ignore[arg-type]


def test_network_proxy_round_trips() -> None:
    net = Network.proxy(
        allow=["*"],
        allow_cidrs=["10.0.0.0/8"],
        deny=["*.internal.example"],
        secrets=[Secret("A", "a-value", ["api.example.com"], query=True), {"name": "B", "value": "b", "hosts": ["b.example"]}],
        on_denied="ask",
        approval_timeout_ms=5_000,
    )
    d = net.to_dict()
    assert d == {
        "mode": "proxy",
        "allow": ["*"],
        "allow_cidrs": ["10.0.0.0/8"],
        "deny": ["*.internal.example"],
        "secrets": [
            {"name": "A", "value": "a-value", "hosts": ["api.example.com"], "query": True},
            {"name": "B", "value": "b", "hosts": ["b.example"], "query": False},
        ],
        "on_denied": "ask",
        "approval_timeout_ms": 5_000,
    }
    assert Network.coerce(d) == net and Network.coerce(json.loads(json.dumps(d))) == net
    # What the first round sent is unchanged: older servers take it.
    assert Network.proxy(allow=["pypi.org"]).to_dict() == {"mode": "proxy", "allow": ["pypi.org"], "allow_cidrs": []}
    # A policy the service shows (no secret values) round-trips too.
    shown = {"mode": "proxy", "allow": [], "allow_cidrs": [], "deny": [], "on_denied": "deny", "approval_timeout_ms": 30000,
             "secrets": [{"name": "A", "hosts": ["api.example.com"], "query": False}]}
    n = Network.coerce(shown)
    assert n is not None and n.secrets == (Secret("A", None, ("api.example.com",)),)
    assert Network.coerce(n.to_dict()) == n and "value" not in n.to_dict()["secrets"][0]
    with pytest.raises(TypeError):
        Network.proxy(deny="evil.example")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Network.proxy(secrets=Secret("A", "a", ["x.example"]))  # type: ignore[arg-type]


def test_egress_entry_kind() -> None:
    raw = {"kind": "dns", "host": "x.example", "port": 53, "addr": None, "allowed": False,
           "reason": "not in allowlist", "bytes_up": 0, "bytes_down": 0, "ms": 0.1}
    assert EgressEntry.from_dict(raw).kind == "dns"
    # A server of the first round sent no kind: every entry was the proxy's.
    assert EgressEntry.from_dict({k: v for k, v in raw.items() if k != "kind"}).kind == "proxy"


def test_approve_rejects_a_decision_that_is_not_one(al: Airlock) -> None:
    sb = Sandbox(al, "never-sent", None, None)
    for bad in ("yes", "allow", 1, None):
        with pytest.raises(ValueError, match="allow_once"):
            sb.approve(1, bad)  # type: ignore[arg-type]


# --- approvals ---------------------------------------------------------------------------


@pytest.mark.parametrize("tier", ALL_TIERS)
def test_on_approval_allow_once_lets_the_held_connection_through(al: Airlock, server: Server, tier: str) -> None:
    asked: list[Approval] = []

    def on_approval(a: Approval) -> str:
        asked.append(a)
        return "allow_once"

    with al.sandbox(network=asking(), isolation=tier) as sb:
        r = sb.exec(server.fetch(), on_approval=on_approval)
        assert r.stdout == f"200 {BODY}\n", r
        assert len(asked) == 1, asked
        a = asked[0]
        assert isinstance(a, Approval) and a.host == "localhost" and a.port == server.port, a
        assert a.reason == "not in allowlist" and 0 <= a.expires_in_ms <= 20_000, a
        e = last(r)
        assert e.allowed and e.host == "localhost" and e.addr == "127.0.0.1" and "allowed once by approval" in e.reason, e
        assert [s.path for s in server.requests] == ["/"]
        # Once only: the policy is unchanged.
        assert sb.network().allow == ()


@pytest.mark.parametrize("tier", TIERS)
def test_on_approval_deny_false_none_or_an_exception_refuses(al: Airlock, server: Server, tier: str) -> None:
    def boom(a: Approval) -> str:
        raise RuntimeError("the user closed the dialog")

    answers = [lambda a: "deny", lambda a: False, lambda a: None, boom, lambda a: "maybe"]
    with al.sandbox(network=asking(), isolation=tier) as sb:
        for answer in answers:
            r = sb.run(FETCH.format(host="localhost", port=server.port, path=""), on_approval=answer)
            assert r.stdout.startswith("403 ") and "denied by approval" in r.stdout, r
            e = last(r)
            assert not e.allowed and e.reason == "not in allowlist; denied by approval", e
    assert server.requests == []


@pytest.mark.parametrize("tier", TIERS)
def test_on_approval_allow_session_adds_the_host_for_the_next_exec(al: Airlock, server: Server, tier: str) -> None:
    with al.sandbox(network=asking(), isolation=tier) as sb:
        r = sb.shell(" ".join(f"'{a}'" for a in server.fetch()), on_approval=lambda a: "allow_session")
        assert r.stdout == f"200 {BODY}\n", r
        assert f"allow localhost:{server.port}" in last(r).reason, r.egress
        assert f"localhost:{server.port}" in sb.network().allow
        asked: list[Approval] = []
        r = sb.exec(server.fetch(), on_approval=asked.append)
        assert r.stdout == f"200 {BODY}\n" and asked == [], (r, asked)
        assert last(r).allowed
    assert len(server.requests) == 2


@pytest.mark.parametrize("tier", TIERS)
def test_on_approval_while_streaming(al: Airlock, server: Server, tier: str) -> None:
    with al.sandbox(network=asking(), isolation=tier) as sb:
        with sb.stream(cmd=server.fetch(), on_approval=lambda a: a.host == "localhost") as s:
            out = "".join(ev.data for ev in s if isinstance(ev, StdoutEvent))
        assert out == f"200 {BODY}\n" and s.result is not None and last(s.result).allowed, out
        r = sb.stream(cmd=server.fetch(), on_approval=lambda a: "deny").wait()
        assert "denied by approval" in r.stdout, r
    assert len(server.requests) == 1


def test_on_approval_stops_when_the_exec_returns(al: Airlock, server: Server) -> None:
    """A callback answers only while its exec runs: the next exec's held connection is
    not answered by it, though its watcher's last poll may still be waiting."""
    asked: list[Approval] = []
    with al.sandbox(network=asking(timeout_ms=1_000)) as sb:
        assert sb.exec(["true"], on_approval=lambda a: asked.append(a) or "allow_once").ok
        r = sb.exec(server.fetch())
        assert "no approval within 1000 ms" in r.stdout, r
    assert asked == [] and server.requests == []


@pytest.mark.anyio
async def test_async_on_approval_stops_when_the_exec_returns(url: str, server: Server) -> None:
    asked: list[Approval] = []

    async def allow(a: Approval) -> str:
        asked.append(a)
        return "allow_once"

    async with AsyncAirlock(url) as al, al.sandbox(network=asking(timeout_ms=1_000)) as sb:
        assert (await sb.exec(["true"], on_approval=allow)).ok
        r = await sb.exec(server.fetch())
        assert "no approval within 1000 ms" in r.stdout, r
    assert asked == [] and server.requests == []


@pytest.mark.parametrize("tier", TIERS)
def test_unanswered_means_denied(al: Airlock, server: Server, tier: str) -> None:
    with al.sandbox(network=asking(timeout_ms=300), isolation=tier) as sb:
        r = sb.exec(server.fetch())
        assert r.stdout.startswith("403 ") and "no approval within 300 ms" in r.stdout, r
        assert last(r).reason == "not in allowlist; no approval within 300 ms"
        assert sb.approvals() == []
    assert server.requests == []


@pytest.mark.parametrize("tier", TIERS)
def test_approvals_and_approve_by_hand(al: Airlock, server: Server, tier: str) -> None:
    with al.sandbox(network=asking(), isolation=tier) as sb:
        assert sb.approvals(wait=0.1) == []
        results: list[Any] = []
        t = threading.Thread(target=lambda: results.append(sb.exec(server.fetch())))
        t.start()
        try:
            held = sb.approvals(wait=30)
            assert len(held) == 1 and held[0].host == "localhost" and held[0].port == server.port, held
            sb.approve(held[0], True)
            with pytest.raises(ApprovalNotFound):
                sb.approve(held[0].id, "deny")  # answered already
        finally:
            t.join()
        assert results[0].stdout == f"200 {BODY}\n", results
        with pytest.raises(ApprovalNotFound):
            sb.approve(12345, "allow_once")


# --- live policy -------------------------------------------------------------------------


@pytest.mark.parametrize("tier", TIERS)
def test_update_network_applies_to_the_next_connection(al: Airlock, server: Server, tier: str) -> None:
    allowed = f"localhost:{server.port}"
    with al.sandbox(network=Network.proxy(allow=[allowed], allow_cidrs=["127.0.0.1/32"]), isolation=tier) as sb:
        r = sb.exec(server.fetch())
        assert r.stdout == f"200 {BODY}\n", r
        assert last(r).allowed and not [e for e in r.egress if e.kind == "policy"]
        net = sb.update_network(allow=[])
        assert net.allow == () and net.allow_cidrs == ("127.0.0.1/32",) and net.mode == "proxy", net
        assert sb.network() == net
        r = sb.exec(server.fetch())
        assert r.stdout.startswith("403 ") and "not in allowlist" in r.stdout, r
        e = last(r)
        assert not e.allowed and e.reason == "not in allowlist", e
        policy = last(r, "policy")
        assert policy.reason, policy
        # deny wins over allow, and on_denied switches asking on.
        net = sb.update_network(allow=[allowed], deny=["localhost"], on_denied="ask")
        assert net.deny == ("localhost",) and net.on_denied == "ask" and net.allow == (allowed,), net
        r = sb.exec(server.fetch(), on_approval=lambda a: "allow_once")
        assert r.stdout.startswith("403 "), r
        assert not last(r).allowed
    assert len(server.requests) == 1


def test_network_validation_names_the_field(al: Airlock) -> None:
    with pytest.raises(InvalidRequest) as e:
        al.sandbox(network=Network.proxy(deny=["not a host"]))
    assert e.value.field == "network.deny[0]", e.value
    with al.sandbox(network=Network.proxy(allow=["example.com"])) as sb:
        with pytest.raises(InvalidRequest) as e:
            sb.update_network(deny=["ok.example", "not a host"])
        assert e.value.field == "network.deny[1]", e.value
        with pytest.raises(InvalidRequest) as e:
            sb.update_network(allow=["exa mple.com"])
        assert e.value.field == "network.allow[0]", e.value
        # Nothing of a refused change was applied.
        assert sb.network().allow == ("example.com",) and sb.network().deny == ()


def test_a_session_without_network(al: Airlock) -> None:
    with al.sandbox() as sb:
        assert sb.network() == Network.none()
        with pytest.raises(InvalidRequest) as e:
            sb.update_network(allow=["example.com"])
        assert e.value.field == "network", e.value
        with pytest.raises(InvalidRequest) as e:
            sb.approvals()
        assert e.value.field == "network", e.value
        # on_approval in such a session: nothing to ask; the exec runs as usual.
        r = sb.shell("echo ran", on_approval=lambda a: "allow_once")
        assert r.stdout == "ran\n"


# --- secrets -----------------------------------------------------------------------------

SECRET = "sdk-test-s3cret-Value_0123456789"


@pytest.mark.parametrize("tier", ALL_TIERS)
def test_a_secret_reaches_its_host_and_never_the_sandbox(al: Airlock, server: Server, tier: str, daemon: Daemon) -> None:
    host = f"localhost:{server.port}"
    net = Network.proxy(
        allow=[host, f"127.0.0.1:{server.port}"],
        allow_cidrs=["127.0.0.1/32"],
        secrets=[Secret("AIRLOCK_SDK_TOKEN", SECRET, [host], query=True)],
    )
    with al.sandbox(network=net, isolation=tier) as sb:
        shown = sb.network()
        assert shown.secrets == (Secret("AIRLOCK_SDK_TOKEN", None, (host,), query=True),), shown
        assert SECRET not in repr(shown) and SECRET not in json.dumps(shown.to_dict())
        r = sb.shell("echo $AIRLOCK_SDK_TOKEN")
        placeholder = r.stdout.strip()
        assert re.fullmatch(r"airlock-ph-[0-9a-f]{32}", placeholder), r
        # The placeholder, in a header and the query, to the host the secret names: the
        # value arrives there.
        r = sb.exec(server.fetch(path=f"q?token={placeholder}", secret_env="AIRLOCK_SDK_TOKEN"))
        assert r.stdout == f"200 {BODY}\n", r
        seen = server.requests[-1]
        assert seen.headers["authorization"] == f"Bearer {SECRET}", seen
        assert seen.path == f"/q?token={SECRET}", seen
        # To a host it does not name (the same server by address): refused, never sent.
        r = sb.exec(server.fetch(host="127.0.0.1", secret_env="AIRLOCK_SDK_TOKEN"))
        assert r.stdout.startswith("403 "), r
        assert not last(r).allowed, r.egress
        assert len(server.requests) == 1
        for text in (json.dumps(r.to_dict()), r.stdout, r.stderr):
            assert SECRET not in text
    assert SECRET not in daemon.log_text()


# --- async -------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("tier", TIERS)
async def test_async_session_network(url: str, server: Server, tier: str) -> None:
    asked: list[Approval] = []

    async def allow(a: Approval) -> str:
        asked.append(a)
        await asyncio.sleep(0)
        return "allow_once"

    async with AsyncAirlock(url) as al:
        async with al.sandbox(network=asking(), isolation=tier) as sb:
            r = await sb.exec(server.fetch(), on_approval=allow)
            assert r.stdout == f"200 {BODY}\n" and len(asked) == 1 and asked[0].port == server.port, (r, asked)
            r = await sb.run(FETCH.format(host="localhost", port=server.port, path=""), on_approval=lambda a: False)
            assert "denied by approval" in r.stdout, r
            r = await sb.shell(" ".join(f"'{a}'" for a in server.fetch()), on_approval=lambda a: "allow_session")
            assert r.stdout == f"200 {BODY}\n", r
            net = await sb.network()
            assert f"localhost:{server.port}" in net.allow
            net = await sb.update_network(allow=[])
            assert net.allow == ()
            assert await sb.approvals(wait=0.1) == []
            with pytest.raises(ApprovalNotFound):
                await sb.approve(999, "deny")
            async with sb.stream(cmd=server.fetch(), on_approval=allow) as s:
                r = await s.wait()
            assert r.stdout == f"200 {BODY}\n" and len(asked) == 2, (r, asked)
    assert len(server.requests) == 3


# --- the README's example ----------------------------------------------------------------

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_block(heading: str) -> str:
    text = README.read_text()
    section = text[text.index(heading):]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, f"no python block under {heading!r}"
    return m.group(1)


@pytest.mark.parametrize("tier", TIERS)
def test_readme_network_example(server: Server, daemon: Daemon, tier: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's example of secrets and approvals runs as written, its service on port
    8080 being this test's server."""
    code = readme_block("### Secrets, live policy and approvals").replace("8080", str(server.port))
    if tier != "namespaces":
        code = code.replace("al.sandbox(network=net)", f"al.sandbox(network=net, isolation={tier!r})")
        assert f"isolation={tier!r}" in code
    monkeypatch.setenv("AIRLOCK_URL", daemon.url)
    monkeypatch.setenv("GITHUB_TOKEN", SECRET)
    exec(compile(code, str(README), "exec"), {"__name__": "readme_example"})
    out = capsys.readouterr().out
    assert re.search(r"^airlock-ph-[0-9a-f]{32}$", out, re.M), out
    assert f"allow localhost:{server.port}? (not in allowlist)" in out, out
    assert BODY in out, out
    assert SECRET not in out
    assert len(server.requests) == 1


def test_readme_network_policy_fragment_is_a_valid_policy(al: Airlock) -> None:
    """The README's ``Network.proxy(...)`` fragment builds a policy the service accepts
    as written (no traffic: the session is only created and shown)."""
    code = readme_block("## Network: egress by policy, secrets, approvals")
    net = eval(code, {"Network": Network, "Secret": Secret, "token": SECRET})  # noqa: S307 (our README)
    assert isinstance(net, Network) and net.on_denied == "ask" and net.deny
    with al.sandbox(network=net) as sb:
        shown = sb.network()
        assert (shown.allow, shown.allow_cidrs, shown.deny) == (net.allow, net.allow_cidrs, net.deny), shown
        assert shown.secrets == (Secret("GITHUB_TOKEN", None, ("api.github.com",)),)
        assert (shown.on_denied, shown.approval_timeout_ms) == ("ask", 30_000)
