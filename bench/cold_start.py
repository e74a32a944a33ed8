#!/usr/bin/env python3
"""Cold start: how long `llmchat --help` takes, and how long `ask` takes before the model load starts.

    python bench/cold_start.py [--reps 7] [--importtime]

1. `llmchat --help` (the console script) and `python -m llmchat --help`: wall time per process,
   median and min over --reps runs (target <= 0.3 s).
2. `ask` up to the model load: a stub child process runs the real CLI (`llmchat.cli.main`) with an
   import hook installed *by this script only* (nothing in llmchat is patched in shipped code).
   The hook timestamps (a) the moment `llmchat.engine` starts importing (everything llmchat does
   before touching llama.cpp: interpreter start-up, CLI imports, option parsing, config, model
   resolution, GGUF header check) and (b) the call to `Engine.load` (a + importing llama_cpp), then
   exits the child at once. Times are from the parent's spawn of the child (target (b) <= 0.2 s).
3. With --importtime: the slowest top-level imports (`python -X importtime`) of `import llmchat.cli`
   and of `ask` up to Engine.load, so a miss can be traced to the module that causes it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

STUB = r"""
import importlib.abc, importlib.machinery, json, os, sys, time

marks = {}

class _Loader(importlib.abc.Loader):
    def __init__(self, real):
        self.real = real
    def create_module(self, spec):
        return self.real.create_module(spec)
    def exec_module(self, module):
        self.real.exec_module(module)
        real_load = module.Engine.load
        def load(*args, **kwargs):
            marks["engine_load_called"] = time.time()
            sys.stdout.write(json.dumps(marks) + "\n")
            sys.stdout.flush()
            os._exit(0)
        module.Engine.load = staticmethod(load)

class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "llmchat.engine":
            return None
        marks.setdefault("engine_import_started", time.time())
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = _Loader(spec.loader)
        return spec

sys.meta_path.insert(0, _Finder())
marks["stub_started"] = time.time()
from llmchat.cli import main
main(sys.argv[1:])
"""


def timed(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    return time.perf_counter() - start


def stats(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:.0f} ms, min {min(values) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--importtime", action="store_true", help="also list the slowest imports of llmchat.cli")
    args = parser.parse_args()

    home = tempfile.mkdtemp(prefix="llmchat-cold-")
    env = dict(os.environ, LLMCHAT_HOME=home)
    env.pop("LLMCHAT_MODEL", None)
    results: dict = {}

    script = shutil.which("llmchat")
    help_cmds = {"python -m llmchat --help": [sys.executable, "-m", "llmchat", "--help"]}
    if script:
        help_cmds = {"llmchat --help": [script, "--help"], **help_cmds}
    help_cmds["python -c pass (interpreter floor)"] = [sys.executable, "-c", "pass"]
    for label, cmd in help_cmds.items():
        timed(cmd, env)  # warm the page cache and .pyc files
        values = [timed(cmd, env) for _ in range(args.reps)]
        results[label] = values
        print(f"{label:40s} {stats(values)}")

    ask_args = ["ask", "--no-history", "--temperature", "0", "--max-tokens", "8", "Hello"]
    engine_import, engine_load, stub_start = [], [], []
    for i in range(args.reps + 1):
        spawn = time.time()
        proc = subprocess.run(
            [sys.executable, "-c", STUB, *ask_args], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL
        )
        line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
        try:
            marks = json.loads(line)
        except ValueError:
            sys.exit(f"the stub did not reach Engine.load (rc {proc.returncode}): {proc.stderr.strip()[-1500:]}")
        if i == 0:
            continue  # warm-up
        stub_start.append(marks["stub_started"] - spawn)
        engine_import.append(marks["engine_import_started"] - spawn)
        engine_load.append(marks["engine_load_called"] - spawn)
    results["ask: interpreter up (stub starts)"] = stub_start
    results["ask: llmchat.engine import starts"] = engine_import
    results["ask: Engine.load called"] = engine_load
    for label in ("ask: interpreter up (stub starts)", "ask: llmchat.engine import starts", "ask: Engine.load called"):
        print(f"{label:40s} {stats(results[label])}")

    if args.importtime:
        runs = {
            "import llmchat.cli": [sys.executable, "-X", "importtime", "-c", "import llmchat.cli"],
            "ask, up to Engine.load": [sys.executable, "-X", "importtime", "-c", STUB, *ask_args],
        }
        for label, cmd in runs.items():
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
            rows = []
            for line in proc.stderr.splitlines():
                if not line.startswith("import time:") or "cumulative" in line:
                    continue
                self_us, cumulative_us, name = line[len("import time:") :].split("|", 2)
                rows.append((int(cumulative_us), int(self_us), name.rstrip()))
            top_level = sorted((r for r in rows if not r[2].startswith("  ")), key=lambda r: -r[0])
            total = sum(r[0] for r in top_level)
            print(
                f"\n{label}: {total / 1000:.0f} ms of imports in all; the slowest top-level imports (what pulls them in is in -X importtime):"
            )
            for cumulative, _self_us, name in top_level[:12]:
                print(f"  {cumulative / 1000:8.1f} ms  {name.strip()}")

    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
