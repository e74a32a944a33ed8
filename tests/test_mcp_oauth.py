"""OAuth for an MCP server over HTTP, end to end: `llmchat mcp login` against a real authorization
server and a real resource server (tests/oauth_servers.py: the MCP SDK's own server-side auth, on
free loopback ports), with the test as the browser: it GETs the URL llmchat prints and follows the
redirects to llmchat's loopback listener. Then the stored token serves `tools list` and a call, an
expired one is refreshed, a refused one is one line, `logout` forgets it, and no token ever shows.
A server that wants more scope for a call (a 403, step-up) is logged in to again for the union of
what was granted and what it asked for; a client registered beforehand logs in with its secret and
refreshes with it in later runs, and the secret never shows.
"""

from __future__ import annotations

import json
import os
import queue
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from oauth_servers import OAuthServers, oauth_servers, preregistered_client

pytestmark = pytest.mark.process  # every test runs llmchat as a user does (`llmchat mcp login`, `tools list`)
WAIT_S = 120  # the most any step waits for its event, so a broken run cannot hang the suite


@pytest.fixture(scope="module")
def servers() -> Iterator[OAuthServers]:
    with oauth_servers() as running:
        yield running


@pytest.fixture
def guarded(servers: OAuthServers, isolated_home: Path) -> OAuthServers:
    """The resource server as `[mcp.guarded]` of this test's config."""
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text(f'[mcp.guarded]\nurl = "{servers.mcp_url}"\n', encoding="utf-8")
    return servers


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


def llmchat(*args: str) -> Run:
    done = subprocess.run(
        [sys.executable, "-m", "llmchat", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=WAIT_S,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def start_login() -> subprocess.Popen[str]:
    """`llmchat mcp login guarded --no-browser`, started: it prints the URL to open and waits."""
    return subprocess.Popen(
        [sys.executable, "-m", "llmchat", "mcp", "login", "guarded", "--no-browser"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def log_in(browse: bool = True) -> tuple[Run, str]:
    """`llmchat mcp login guarded --no-browser`, with the test as the browser: it reads the URL from
    stderr and GETs it, following the redirects to llmchat's loopback listener (browse=False: it
    goes straight to the listener with the user's refusal instead). The run, and the browser's page."""
    process = start_login()
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        first = lines.get(timeout=WAIT_S)  # the event: llmchat printed the URL to open
        assert first is not None and "in your browser: " in first, first
        seen.append(first)
        url = first.split("in your browser: ", 1)[1].strip()
        with httpx.Client(timeout=WAIT_S, follow_redirects=True, max_redirects=3, trust_env=False) as browser:
            if browse:
                page = browser.get(url).text
            else:
                redirect_uri = httpx.URL(url).params["redirect_uri"]
                state = httpx.URL(url).params["state"]
                page = browser.get(redirect_uri, params={"error": "access_denied", "state": state}).text
        process.wait(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    reader.join(WAIT_S)
    while (line := lines.get(timeout=WAIT_S)) is not None:
        seen.append(line)
    assert process.stdout is not None
    return Run(process.returncode, process.stdout.read(), "".join(seen)), page


def login_file(home: Path) -> Path:
    return home / "mcp-auth" / "guarded.json"


def secrets_of(servers: OAuthServers, home: Path) -> set[str]:
    """Every token the authorization server issued, and those in the login file."""
    issued = set(servers.authority.access) | set(servers.authority.refresh)
    if login_file(home).exists():
        tokens = json.loads(login_file(home).read_text(encoding="utf-8"))["tokens"]
        issued |= {tokens["access_token"], tokens.get("refresh_token", "")} - {""}
    return issued


def assert_no_token_in(servers: OAuthServers, home: Path, *runs: Run) -> None:
    tokens = secrets_of(servers, home)
    assert tokens
    for run in runs:
        for token in tokens:
            assert token not in run.stdout and token not in run.stderr


def test_login_stores_the_token_privately_and_the_tools_work_with_it(guarded, isolated_home):
    refused = llmchat("mcp", "tools", "guarded")
    assert refused.returncode == 2 and refused.stdout == "" and "Traceback" not in refused.stderr
    assert refused.stderr.count("\n") == 1
    assert "(HTTP 401: log in with `llmchat mcp login guarded`)" in refused.stderr
    clients_before = set(guarded.authority.clients)

    login, page = log_in()
    assert login.returncode == 0, login.stderr
    assert login.stdout == "" and "Traceback" not in login.stderr
    assert page == "llmchat: logged in. You can close this tab."
    assert f"logged in to MCP server guarded ({guarded.mcp_url}); kept in {login_file(isolated_home)}" in login.stderr
    # Discovery and dynamic registration happened: llmchat registered itself, a public client with PKCE.
    [client_id] = set(guarded.authority.clients) - clients_before
    assert guarded.authority.clients[client_id].token_endpoint_auth_method == "none"
    assert "code_challenge_method=S256" in login.stderr and "code_challenge=" in login.stderr

    path = login_file(isolated_home)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    record = json.loads(path.read_text(encoding="utf-8"))
    assert record["url"] == guarded.mcp_url and record["client"]["client_id"] == client_id
    assert record["tokens"]["access_token"] in guarded.authority.access

    listed = llmchat("tools", "list")
    assert listed.returncode == 0, listed.stderr
    assert "guarded_add" in listed.stdout and "guarded_whoami" in listed.stdout
    called = llmchat("mcp", "call", "guarded", "add", "--args", '{"a": 2, "b": 3}')
    assert (called.returncode, called.stdout) == (0, "2 + 3 = 5\n"), called.stderr
    assert_no_token_in(guarded, isolated_home, refused, login, listed, called)


def test_an_expired_token_is_refreshed_before_it_is_sent(guarded, isolated_home):
    assert log_in()[0].returncode == 0
    path = login_file(isolated_home)
    before = json.loads(path.read_text(encoding="utf-8"))
    # As if the token's lifetime had passed: the server refuses it, and the login says it expired.
    guarded.authority.expire_access_tokens()
    path.write_text(json.dumps({**before, "expires_at": before["expires_at"] - 7200}), encoding="utf-8")
    refreshes = guarded.authority.grants.count("refresh_token")

    called = llmchat("mcp", "call", "guarded", "whoami")
    assert (called.returncode, called.stdout) == (0, "a logged-in llmchat\n"), called.stderr
    assert guarded.authority.grants.count("refresh_token") == refreshes + 1
    after = json.loads(path.read_text(encoding="utf-8"))
    assert after["tokens"]["access_token"] != before["tokens"]["access_token"]
    assert (
        after["tokens"]["access_token"] in guarded.authority.access
        and after["expires_at"] > before["expires_at"] - 7200
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert_no_token_in(guarded, isolated_home, called)


def test_a_refused_login_is_one_line_and_logout_forgets_it(guarded, isolated_home):
    assert log_in()[0].returncode == 0
    stored = json.loads(login_file(isolated_home).read_text(encoding="utf-8"))["tokens"]
    tokens = {stored["access_token"], stored["refresh_token"]}
    guarded.authority.access.pop(stored["access_token"])  # revoked at the server
    clients = set(guarded.authority.clients)

    refused = llmchat("mcp", "call", "guarded", "add", "--args", '{"a": 1, "b": 1}')
    assert refused.returncode == 2 and refused.stdout == "" and "Traceback" not in refused.stderr
    assert refused.stderr == (
        f"llmchat: error: MCP server guarded ({guarded.mcp_url}) could not be reached: its stored login was refused "
        "(HTTP 401: log in with `llmchat mcp login guarded`)\n"
    )
    assert set(guarded.authority.clients) == clients  # a run never registers, nor opens a browser
    assert not any(token in refused.stderr for token in tokens)

    out = llmchat("mcp", "logout", "guarded")
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "llmchat: logged out of MCP server guarded\n")
    assert not login_file(isolated_home).exists()
    again = llmchat("mcp", "logout", "guarded")
    assert (again.returncode, again.stderr) == (0, "llmchat: no login was kept for MCP server guarded\n")
    after = llmchat("mcp", "tools", "guarded")
    assert after.returncode == 2 and "(HTTP 401: log in with `llmchat mcp login guarded`)" in after.stderr


def test_a_login_the_user_refuses_stores_nothing(guarded, isolated_home):
    login, page = log_in(browse=False)
    assert login.returncode == 1 and login.stdout == "" and "Traceback" not in login.stderr
    assert page == "llmchat: the login was refused. You can close this tab."
    assert login.stderr.splitlines()[-1] == (
        f"llmchat: error: MCP server guarded ({guarded.mcp_url}): the login failed: "
        "the authorization server refused the login: access_denied"
    )
    assert not login_file(isolated_home).exists()


def test_an_sse_server_logs_in_the_same_way(isolated_home):
    with oauth_servers("sse") as sse:
        isolated_home.mkdir(parents=True, exist_ok=True)
        (isolated_home / "config.toml").write_text(f'[mcp.guarded]\nurl = "{sse.mcp_url}"\n', encoding="utf-8")
        refused = llmchat("mcp", "call", "guarded", "add", "--args", '{"a": 2, "b": 3}')
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1
        assert refused.stderr.endswith("(HTTP 401: log in with `llmchat mcp login guarded`)\n")
        login, _page = log_in()
        assert login.returncode == 0, login.stderr
        called = llmchat("mcp", "call", "guarded", "add", "--args", '{"a": 2, "b": 3}')
        assert (called.returncode, called.stdout) == (0, "2 + 3 = 5\n"), called.stderr
        assert_no_token_in(sse, isolated_home, refused, login, called)


def test_login_is_for_servers_reached_by_url(isolated_home):
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text(
        '[mcp.time]\ncommand = "mcp-server-time"\n\n[mcp.keyed]\nurl = "http://127.0.0.1:9/mcp"\n'
        'bearer_token_env = "KEYED_TOKEN"\n',
        encoding="utf-8",
    )
    stdio = llmchat("mcp", "login", "time", "--no-browser")
    assert stdio.returncode == 2 and stdio.stderr.count("\n") == 1 and "only servers reached by url" in stdio.stderr
    keyed = llmchat("mcp", "login", "keyed", "--no-browser")
    assert keyed.returncode == 2 and "sends a token of its own (bearer_token_env" in keyed.stderr
    bad = llmchat("mcp", "logout", "../x")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not an MCP server name" in bad.stderr
    assert not (isolated_home / "mcp-auth").exists()
    assert os.environ.get("LLMCHAT_HOME") == str(isolated_home)


@pytest.mark.slow
def test_ask_goes_on_without_a_login_and_keeps_no_token_in_the_history(guarded, isolated_home, smollm2_path):
    model = ("-m", str(smollm2_path), "--temperature", "0", "--seed", "1", "--max-tokens", "48", "--chain-limit", "1")
    model += ("-T", "mcp:guarded")
    clients = set(guarded.authority.clients)
    plain = llmchat("ask", *model, "--no-history", "Say hi.")
    assert plain.returncode == 0, plain.stderr
    [line] = [line for line in plain.stderr.splitlines() if "MCP server guarded" in line]
    assert line.endswith("(HTTP 401: log in with `llmchat mcp login guarded`); going on without its tools")
    assert set(guarded.authority.clients) == clients  # nothing registered, no browser: a login is asked for

    assert log_in()[0].returncode == 0
    forced = llmchat("ask", *model, "--tool-choice", "guarded_whoami", "--approve-tools", "--json", "Who am I?")
    assert forced.returncode == 0, forced.stderr
    [call] = json.loads(forced.stdout)["tool_calls"]
    assert call["result"] == "a logged-in llmchat"
    saved = b"".join(path.read_bytes() for path in isolated_home.rglob("history.db*"))
    assert b"a logged-in llmchat" in saved  # the history holds the call, and none of the tokens
    assert not any(token.encode() in saved for token in secrets_of(guarded, isolated_home))
    assert_no_token_in(guarded, isolated_home, plain, forced)


def test_ctrl_c_while_the_login_waits_for_the_browser_ends_in_one_line(guarded, isolated_home):
    """The login waits up to minutes for the browser's redirect: Ctrl-C there is exit 130 and one
    line, nothing kept, and the loopback listener gone with the process."""
    import signal

    process = start_login()
    try:
        assert process.stderr is not None
        first = process.stderr.readline()  # the event: llmchat waits for the browser from here on
        assert "in your browser: " in first, first
        redirect_uri = httpx.URL(first.split("in your browser: ", 1)[1].strip()).params["redirect_uri"]
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert (process.returncode, out) == (130, "")
    assert err == "llmchat: interrupted\n"
    assert not login_file(isolated_home).exists()
    with pytest.raises(httpx.TransportError):  # nothing listens there any more
        httpx.get(redirect_uri, timeout=WAIT_S, trust_env=False)


def configure(home: Path, url: str, *lines: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text("\n".join(["[mcp.guarded]", f'url = "{url}"', *lines]) + "\n", encoding="utf-8")


def test_a_server_wanting_more_scope_gets_it_at_the_next_login(isolated_home):
    """The server's tools/call needs `mcp:write` besides `mcp`: the run is refused with a 403 naming
    only `mcp:write`, says to log in again, and keeps what it was asked for; the next login asks for
    both (SEP-2350's union: what was granted stays), and the call goes through."""
    with oauth_servers(step_up_scope="mcp:write") as stepping:
        configure(isolated_home, stepping.mcp_url)
        assert log_in()[0].returncode == 0
        first = json.loads(login_file(isolated_home).read_text(encoding="utf-8"))
        assert first["tokens"]["scope"] == "mcp"

        refused = llmchat("mcp", "call", "guarded", "add", "--args", '{"a": 2, "b": 3}')
        assert refused.returncode == 1 and refused.stdout == "" and "Traceback" not in refused.stderr
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert "(HTTP 403: for more access, log in again with `llmchat mcp login guarded`)" in refused.stderr
        kept = json.loads(login_file(isolated_home).read_text(encoding="utf-8"))
        assert kept["scope_wanted"] == "mcp mcp:write" and kept["tokens"] == first["tokens"]

        again, _page = log_in()
        assert again.returncode == 0, again.stderr
        assert "scope=mcp+mcp%3Awrite" in again.stderr  # the authorization asked for both
        second = json.loads(login_file(isolated_home).read_text(encoding="utf-8"))
        assert set(second["tokens"]["scope"].split()) == {"mcp", "mcp:write"} and "scope_wanted" not in second
        called = llmchat("mcp", "call", "guarded", "add", "--args", '{"a": 2, "b": 3}')
        assert (called.returncode, called.stdout) == (0, "2 + 3 = 5\n"), called.stderr
        assert_no_token_in(stepping, isolated_home, refused, again, called)


def test_a_client_registered_beforehand_logs_in_and_refreshes_with_its_secret(isolated_home, monkeypatch):
    secret = "s3cret-" + "x" * 24
    client = preregistered_client("llmchat-at-guarded", secret)
    with oauth_servers(preregistered=client) as fixed:
        configure(
            isolated_home, fixed.mcp_url, 'client_id = "llmchat-at-guarded"', 'client_secret_env = "GUARDED_SECRET"'
        )
        unset = llmchat("mcp", "login", "guarded", "--no-browser")
        assert unset.returncode == 2 and unset.stderr.count("\n") == 1 and "Traceback" not in unset.stderr
        assert "client_secret_env = 'GUARDED_SECRET', but that environment variable is not set" in unset.stderr

        monkeypatch.setenv("GUARDED_SECRET", secret)
        login, _page = log_in()
        assert login.returncode == 0, login.stderr
        assert "client_id=llmchat-at-guarded" in login.stderr
        assert list(fixed.authority.clients) == ["llmchat-at-guarded"]  # nothing registered
        path = login_file(isolated_home)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        record = json.loads(path.read_text(encoding="utf-8"))
        assert record["client"]["client_id"] == "llmchat-at-guarded" and record["client"]["client_secret"] == secret
        assert record["client"]["token_endpoint_auth_method"] == "client_secret_basic"

        # A later run refreshes with the stored secret, its variable gone: the token endpoint
        # authenticates the client with it (a wrong or missing secret is refused there).
        monkeypatch.delenv("GUARDED_SECRET")
        fixed.authority.expire_access_tokens()
        path.write_text(json.dumps({**record, "expires_at": record["expires_at"] - 7200}), encoding="utf-8")
        called = llmchat("mcp", "call", "guarded", "whoami")
        assert (called.returncode, called.stdout) == (0, "a logged-in llmchat\n"), called.stderr
        assert fixed.authority.grants == ["authorization_code", "refresh_token"]
        for run in (unset, login, called):
            assert secret not in run.stdout and secret not in run.stderr
        assert_no_token_in(fixed, isolated_home, login, called)


@pytest.mark.parametrize(
    ("lines", "says"),
    [
        (['client_secret = "abc"'], "the client secret never goes in the config"),
        (['client_secret_env = "SECRET"'], "client_secret_env is the secret of a client_id"),
        (['client_metadata_url = "http://example.com/c.json"'], "client_metadata_url must be an https:// address"),
        (['client_metadata_url = "https://example.com/"'], "client_metadata_url must be an https:// address"),
        (['client_id = "a"', 'client_metadata_url = "https://example.com/c.json"'], "not both"),
        (['client_id = "a"', 'client_secret_env = "not a name"'], "client_secret_env names an environment variable"),
        (['client_id = "a"', 'bearer_token_env = "TOKEN"'], "sends a token of its own"),
    ],
)
def test_a_wrong_client_setting_is_one_line(isolated_home, lines, says):
    configure(isolated_home, "http://127.0.0.1:9/mcp", *lines)
    done = llmchat("mcp", "login", "guarded", "--no-browser")
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    assert "abc" not in done.stderr


def test_client_settings_are_for_url_servers(isolated_home):
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text(
        '[mcp.time]\ncommand = "mcp-server-time"\nclient_id = "a"\n', encoding="utf-8"
    )
    done = llmchat("mcp", "tools", "time")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert 'client_id is for servers reached by url = "http://..."' in done.stderr


def test_closing_the_listener_wakes_a_wait_left_by_a_cancelled_login():
    """A Ctrl-C cancels the login while anyio's worker thread waits for the browser's answer: the
    thread is abandoned, not stopped. Closing the listener wakes it, so it cannot hold the
    process's exit for the rest of the login's timeout (the exit waited 120 s and more)."""
    from llmchat.tools.mcp.oauth_login import LoopbackListener

    listener = LoopbackListener()
    started = threading.Event()
    answers: list[object] = []

    def wait_for_the_browser() -> None:
        started.set()
        answers.append(listener.wait(3600))

    waiter = threading.Thread(target=wait_for_the_browser, daemon=True)
    waiter.start()
    started.wait()
    listener.close()
    waiter.join(60)  # a bound on a hang, not a measure of speed: the wake is immediate
    assert not waiter.is_alive() and answers == [{}]
