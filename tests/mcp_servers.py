"""The reference MCP servers for the tests: npm's, installed once into a cache folder, and started
over stdio or Streamable HTTP on a free loopback port.

`@modelcontextprotocol/server-everything` and `server-filesystem` are pinned (NPM_VERSION): npm
installs them under `~/.cache/llmchat/test-npm/NPM_VERSION` the first time (about 15 s), and every
later run reuses that folder. A file lock keeps parallel workers from installing twice. Without
npm on the machine the tests that need them are skipped, naming .ci/run, which installs Node.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NPM_VERSION = "2026.8.31"  # `npm view @modelcontextprotocol/server-everything version` (and filesystem's)
PACKAGES = ("@modelcontextprotocol/server-everything", "@modelcontextprotocol/server-filesystem")
BINARIES = ("mcp-server-everything", "mcp-server-filesystem")
INSTALL_TIMEOUT_S = 600
READY_TIMEOUT_S = 60  # an upper bound on waiting for the port, so a broken server cannot hang the run


def npm_cache_root(real_home: Path) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(real_home / ".cache")
    return Path(base) / "llmchat" / "test-npm" / NPM_VERSION


def install_npm_servers(root: Path) -> tuple[Path | None, str]:
    """The folder holding the servers' binaries, installing them the first time; (None, why) when
    npm is missing or the install failed."""
    bin_dir = root / "node_modules" / ".bin"
    if all((bin_dir / name).exists() for name in BINARIES):
        return bin_dir, ""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        return None, "node and npm are not installed (.ci/run installs them: apt-get install -y nodejs npm)"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all((bin_dir / name).exists() for name in BINARIES):  # another worker installed them meanwhile
            return bin_dir, ""
        env = dict(os.environ, npm_config_cache=str(root / "npm-cache"), npm_config_update_notifier="false")
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(root)]
            + [f"{package}@{NPM_VERSION}" for package in PACKAGES],
            capture_output=True,
            text=True,
            env=env,
            timeout=INSTALL_TIMEOUT_S,
        )
        if done.returncode != 0 or not all((bin_dir / name).exists() for name in BINARIES):
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return None, f"npm install failed: {tail[0]}"
    return bin_dir, ""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def http_server(command: list[str], port: int, log: Path) -> Iterator[subprocess.Popen]:
    """A server listening on 127.0.0.1:port (PORT in its environment), until the block ends."""
    env = dict(os.environ, PORT=str(port), HOST="127.0.0.1")
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _accepts(port):  # the event: the port accepts a connection
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{command[0]} did not listen on {port}: {log.read_text(errors='replace')[-300:]}")
            time.sleep(0.1)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
