"""The official MCP conformance suite's client half against llmchat, for each specification revision
llmchat speaks: `conformance client --requirements REVISION` runs exactly the client scenarios
that revision requires, each against a loopback mock server of its own, with llmchat's real
commands as the client (tests/mcp_conformance_client.py). It checks every JSON-RPC message llmchat
sends against the revision's schema, the lifecycle, tool calls, SSE resumption, the HTTP headers,
request metadata, JSON Schema handling and the OAuth flows (discovery, registration, pre-registered
and metadata-document clients, scope selection and step-up, token endpoint authentication,
issuer checks, a changed authorization server).

The suite's verdict is the test's: a failure not in tests/mcp_conformance_baseline.yml fails it,
and so does an entry there that passes (the baseline is kept honest). A scenario that fails
unexpectedly is run again alone, up to SOLO_ATTEMPTS times, before it counts: on a loaded
machine a scenario that measures time can fail for want of a CPU (the MCP Python SDK's own CI
does the same). The suite starts every scenario's client at once; the clients take turns through
a lock (LLMCHAT_CONFORMANCE_LOCK), so each step's time limit is about llmchat, not the load.

Slow (about 5 minutes a revision on 2 cores), so it is kept out of the fast loop by its marker.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.conformance, pytest.mark.slow]

TESTS = Path(__file__).resolve().parent
CLIENT = TESTS / "mcp_conformance_client.py"
BASELINE = TESTS / "mcp_conformance_baseline.yml"
REVISIONS = ("2025-11-25", "2026-07-28")
STEP_TIMEOUT_S = 90  # one llmchat command of a scenario (tests/mcp_conformance_client.py)
SCENARIO_TIMEOUT_S = 1800  # the suite's --timeout: a scenario's client may wait its turn for all the others
RUN_TIMEOUT_S = 2400  # the whole suite run of one revision, so a broken run cannot hang CI
SOLO_ATTEMPTS = 2
ANSI = re.compile(r"\x1b\[[0-9;]*m")
REAL_HOME = Path.home()  # read at collection, before a test's isolated HOME (conftest)


@pytest.fixture(scope="session")
def suite_bin() -> Path:
    """The folder of `conformance` and the Node 22 it runs on (npm, pinned, installed once into a
    cache folder). Where that cannot be, the test fails saying why: a skip would let the lane pass
    unrun."""
    from conformance_suite import install_suite, suite_root

    bin_dir, why = install_suite(suite_root(REAL_HOME))
    if bin_dir is None:
        pytest.fail(why)
    return bin_dir


def _suite(suite_bin: Path, arguments: list[str], workdir: Path) -> tuple[int, str]:
    """`conformance client` with llmchat as the client: its exit status and its report (colours out)."""
    from conformance_suite import suite_environment

    if " " in f"{sys.executable}{CLIENT}":
        pytest.fail(
            f"the suite splits its client command at spaces: move {sys.executable} or {CLIENT} to a path without one"
        )
    env = suite_environment(suite_bin)
    env["LLMCHAT_CONFORMANCE_LOCK"] = str(workdir / "turns.lock")
    env["LLMCHAT_CONFORMANCE_STEP_TIMEOUT_S"] = str(STEP_TIMEOUT_S)
    env["PYTHONPATH"] = str(TESTS.parent)
    done = subprocess.run(
        [str(suite_bin / "conformance"), "client", "--command", f"{sys.executable} {CLIENT}"]
        + ["--timeout", str(SCENARIO_TIMEOUT_S * 1000), "--expected-failures", str(BASELINE)]
        + arguments,
        capture_output=True,
        text=True,
        env=env,
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        timeout=RUN_TIMEOUT_S,
    )
    return done.returncode, ANSI.sub("", done.stdout + done.stderr)


def _listed(report: str, heading: str) -> list[str]:
    """The names the suite lists under a heading of its summary (`  ✗ NAME` lines)."""
    names: list[str] = []
    lines = iter(report.splitlines())
    for line in lines:
        if line.startswith(heading):
            for entry in lines:
                if not entry.startswith("  "):
                    break
                names.append(entry.strip()[1:].strip())
    return names


def _scored(report: str) -> str:
    """The suite's summary, for the failure message."""
    return report[report.find("=== SUITE SUMMARY ===") :] if "=== SUITE SUMMARY ===" in report else report[-4000:]


@pytest.mark.parametrize("revision", REVISIONS)
def test_llmchat_meets_what_the_revision_requires_of_a_client(revision, suite_bin, tmp_path):
    returncode, report = _suite(suite_bin, ["--requirements", revision, "-o", str(tmp_path / "results")], tmp_path)
    if returncode == 0:
        assert "Baseline check passed" in report, _scored(report)
        return
    stale = _listed(report, "Stale baseline entries")
    assert not stale, f"passing now, so remove from {BASELINE.name}: {stale}\n{_scored(report)}"
    unexpected = _listed(report, "Unexpected failures")
    assert unexpected, f"the suite failed (exit {returncode}) without naming a scenario:\n{_scored(report)}"
    still_failing = []
    for scenario in sorted({name.split(":", 1)[0] for name in unexpected}):
        for attempt in range(SOLO_ATTEMPTS):
            solo_dir = tmp_path / f"solo-{attempt}"
            solo_code, solo_report = _suite(
                suite_bin, ["--scenario", scenario, "--spec-version", revision, "-o", str(solo_dir)], tmp_path
            )
            if solo_code == 0:
                break
        else:
            still_failing.append(f"{scenario}:\n{solo_report[-3000:]}")
    assert not still_failing, "failing alone too (results under " + str(tmp_path) + "):\n" + "\n".join(still_failing)
