"""Start and stop real servers on free 127.0.0.1 ports for the tests: llama-server, rpc-server and
llama-cpp-python's `llama_cpp.server`.

The llama.cpp binaries come from `tests/servers/build.sh` (built from the sources in the
llama-cpp-python sdist of the installed version, into a cache keyed by that version). When they are
missing, the tests that need them FAIL with the command that builds them: they are never skipped,
so CI cannot pass without having run them.

Waiting for a server is a bounded loop (a fixed number of polls of `/health`, each with a short
timeout), and it stops at once if the process exits; its log is then part of the failure message.

Every server runs in a process group of its own, tied to the test session (tests/servers/tether.py):
`stop()` ends the whole group, and when the session ends without stopping it (a Ctrl-C that skips
the fixtures' teardown, a killed pytest) the tether's watchdog ends it.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
HEALTH_POLLS = 1200  # x 0.25 s between polls at most: a server that is not up by then has failed
POLL_PAUSE = 0.25


# Read at import: tests point HOME at a temporary folder, but build.sh used the real one.
_REAL_HOME = os.environ.get("HOME", str(Path.home()))


def build_script_env() -> dict[str, str]:
    """The environment build.sh ran in: the real HOME (its cache folder) and this Python."""
    env = {**os.environ, "PYTHON": sys.executable, "HOME": _REAL_HOME}
    env.pop("LLMCHAT_BUILD_CPU_FLAGS", None)
    return env


@functools.lru_cache(maxsize=1)
def binaries_dir() -> Path:
    """The folder build.sh builds into on this machine. build.sh owns the cache key (version, CPU
    flags, compiler, build options), so it is asked rather than copied."""
    env = build_script_env()
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--bin-dir"], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"{BUILD_SCRIPT.name} --bin-dir failed: {done.stderr.strip()}", pytrace=False)
    return Path(done.stdout.strip())


def binary(name: str) -> Path:
    path = binaries_dir() / name
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"{name} is not built at {path}: run `bash {BUILD_SCRIPT.relative_to(HERE.parent.parent)}` first "
            "(about 10 minutes on 2 cores; .ci/run does it before the tests)",
            pytrace=False,
        )
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    name: str
    process: subprocess.Popen
    port: int
    log: Path
    extra: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM to the server's whole group, SIGKILL after STOP_GRACE_S; then the tether lets go."""
        stop_group(self.process)


STOP_GRACE_S = 30


def stop_group(process: subprocess.Popen) -> None:
    """End a tethered process's group: SIGTERM, up to STOP_GRACE_S for the server, then SIGKILL to
    the group (also to what the server started, which its own exit would leave behind)."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    if process.stdin is not None:
        process.stdin.close()  # the tether's end: its watchdog (killed above, or about to be) lets go


def start_tethered(argv: list[str], **popen: Any) -> subprocess.Popen:
    """Popen(argv) in a process group of its own, tied to this process by tests/servers/tether.py:
    the group ends when this process does, even killed. Its stdin is the tether (not for the program)."""
    return subprocess.Popen(
        [sys.executable, str(HERE / "tether.py"), *argv], stdin=subprocess.PIPE, start_new_session=True, **popen
    )


def _start(name: str, argv: list[str], port: int, log_dir: Path, env: dict | None = None) -> ServerProcess:
    log = log_dir / f"{name}-{port}.log"
    with open(log, "wb") as handle:
        process = start_tethered(argv, stdout=handle, stderr=subprocess.STDOUT, env=dict(os.environ) | (env or {}))
    return ServerProcess(name, process, port, log)


def wait_http_ready(server: ServerProcess, path: str = "/health") -> None:
    """Poll `path` until it answers 200; fail with the server's log if it exits or never does."""
    import httpx

    for _ in range(HEALTH_POLLS):
        if server.process.poll() is not None:
            server.stop()
            pytest.fail(
                f"{server.name} exited ({server.process.returncode}) before it was ready:\n{server.log_text()[-3000:]}"
            )
        try:
            if httpx.get(server.url + path, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(POLL_PAUSE)
    server.stop()
    pytest.fail(f"{server.name} never answered {path}:\n{server.log_text()[-3000:]}")


def wait_tcp_ready(server: ServerProcess) -> None:
    for _ in range(HEALTH_POLLS):
        if server.process.poll() is not None:
            pytest.fail(f"{server.name} exited ({server.process.returncode}):\n{server.log_text()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=1.0):
                return
        except OSError:
            time.sleep(POLL_PAUSE)
    server.stop()
    pytest.fail(f"{server.name} never listened on {server.port}:\n{server.log_text()[-3000:]}")


def start_llama_server(
    model: Path, log_dir: Path, *, slots: int = 1, ctx: int = 2048, threads: int = 2, extra: list[str] | None = None
) -> ServerProcess:
    port = free_port()
    argv = [
        str(binary("llama-server")),
        "-m", str(model),
        "--host", "127.0.0.1",
        "--port", str(port),
        "-c", str(ctx * slots),
        "-np", str(slots),
        "-t", str(threads),
        "--no-webui",
        "-fa", "off",  # as llmchat's local engine loads models on the CPU (the same numerics, the same greedy replies)
        *(extra or []),
    ]  # fmt: skip
    server = _start("llama-server", argv, port, log_dir)
    wait_http_ready(server)
    return server


def start_rpc_server(log_dir: Path, *, threads: int = 1) -> ServerProcess:
    port = free_port()
    argv = [str(binary("rpc-server")), "-H", "127.0.0.1", "-p", str(port), "-t", str(threads)]
    server = _start("rpc-server", argv, port, log_dir)
    wait_tcp_ready(server)
    return server


def start_llama_cpp_server(model: Path, log_dir: Path, *, ctx: int = 2048) -> ServerProcess:
    """llama-cpp-python's OpenAI-compatible server. It serves one request at a time; with
    interrupt_requests on (its default) a second request would cancel the first, so it is off."""
    port = free_port()
    argv = [
        sys.executable, str(HERE / "llama_cpp_server.py"),
        "--model", str(model),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_ctx", str(ctx),
        "--interrupt_requests", "False",
    ]  # fmt: skip
    server = _start("llama_cpp.server", argv, port, log_dir)
    wait_http_ready(server, "/v1/models")
    return server
