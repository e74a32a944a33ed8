"""Late turns of a chat: llmchat's prefill tok/s against llama-bench's at the same depth.

A 30-turn scripted chat (`llmchat chat --json`, a fresh LLMCHAT_HOME: no calibration, flash
attention `auto` as a newcomer gets it) at `--ctx 1024`. For each of the last turns that did not
trim the conversation, the turn's own prefill is `prefill_tokens` new tokens over `cached_tokens`
already in the KV cache, in `prefill_s` (llama.cpp's prefill and the first sample). llama.cpp's
`llama-bench` then measures the same work: `-p NEW -n 0 -d DEPTH`, flash attention on and off,
same threads and batch size. The turn's ratio is llmchat's tok/s over the better of the two.

Rounds alternate the order of the two sides (chat first, then llama-bench; then the other way);
the summary is the median of every late turn's ratio over all rounds, with the min-max spread.

    python bench/late_turn_prefill.py LLAMA_BENCH [--rounds 3] [--turns 30] [--late 5] [--ctx 1024]
           [--out bench/results/late_turn_prefill.md]
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
from pathlib import Path

from report import write_report

TOPICS = ["rivers", "mountains", "deserts", "forests", "oceans", "islands", "glaciers", "volcanoes", "lakes", "caves"]
BATCH = 512


def message(turn: int) -> str:
    topic = TOPICS[turn % len(TOPICS)]
    return f"Turn {turn:02d}: please tell me three interesting facts about {topic}, each in one full sentence, and keep it short."


def chat_run(model: str, turns: int, ctx: int, threads: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as home:
        command = [
            sys.executable, "-m", "llmchat", "chat", "--json", "--no-history", "-m", model, "--ctx", str(ctx),
            "--max-tokens", "48", "--temperature", "0", "--seed", "7", "--threads", str(threads),
            "--batch-size", str(BATCH),
        ]  # fmt: skip
        stdin = "\n".join(message(i) for i in range(1, turns + 1)) + "\n"
        env = dict(os.environ, LLMCHAT_HOME=home)
        proc = subprocess.run(command, input=stdin, capture_output=True, text=True, check=True, env=env)
    return [json.loads(line) for line in proc.stdout.splitlines()]


def llama_bench(binary: Path, model: str, new: int, depth: int, threads: int) -> dict[str, float]:
    """llama-bench's prefill tok/s of `new` tokens over `depth` cached ones, flash attention off and on."""
    out = subprocess.run(
        [str(binary), "-m", model, "-p", str(new), "-n", "0", "-d", str(depth), "-fa", "off,on", "-t", str(threads),
         "-b", str(BATCH), "-ub", str(BATCH), "-r", "5", "-o", "json"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return {("on" if row["flash_attn"] else "off"): float(row["avg_ts"]) for row in json.loads(out)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("llama_bench", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--late", type=int, default=5, help="how many of the last turns are compared")
    parser.add_argument("--ctx", type=int, default=1024)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "results" / "late_turn_prefill.md"
    )
    args = parser.parse_args()

    from llmchat.engine import physical_cores
    from llmchat.models.resolve import bundled_default_model

    model = str(bundled_default_model())
    threads = physical_cores()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    raw: list[str] = []
    ratios: list[float] = []
    auto_choice = "?"
    previous_shapes: list[tuple[int, int]] = []
    for number in range(1, args.rounds + 1):
        order = ("chat", "bench") if number % 2 else ("bench", "chat")
        measured: dict[tuple[int, int], dict[str, float]] = {}
        if order[0] == "bench":
            # llama-bench first needs the shapes: they are the same every round (greedy, same seed),
            # and the first round (chat first) has given them.
            for shape in previous_shapes:
                measured[shape] = llama_bench(args.llama_bench, model, *shape, threads)
        turns = chat_run(model, args.turns, args.ctx, threads)
        late = [t for t in turns[-args.late :] if not t["stats"]["messages_dropped"]]
        shapes_now = [(t["stats"]["prefill_tokens"], t["stats"]["cached_tokens"]) for t in late]
        if order[0] == "chat":
            for shape in shapes_now:
                measured[shape] = llama_bench(args.llama_bench, model, *shape, threads)
        previous_shapes = shapes_now
        for turn in late:
            s = turn["stats"]
            shape = (s["prefill_tokens"], s["cached_tokens"])
            if shape not in measured:  # a round whose chat took another course than the first
                measured[shape] = llama_bench(args.llama_bench, model, *shape, threads)
            ours = s["prefill_tokens"] / s["prefill_s"]
            theirs = measured[shape]
            best = max(theirs.values())
            auto_choice = "on" if s["flash_attn"] else "off"
            ratios.append(ours / best)
            line = (
                f"round {number} ({' first, '.join(order)} second), turn {turn['id']}: {shape[0]} new tokens over "
                f"{shape[1]} cached: llmchat {ours:.1f} tok/s (flash attention {auto_choice}), llama-bench "
                f"off {theirs['off']:.1f} / on {theirs['on']:.1f} tok/s, ratio to the better {ours / best:.3f}"
            )
            raw.append(line)
            print(line, file=sys.stderr, flush=True)

    summary = [
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {threads} threads, batch {BATCH}; chat --ctx {args.ctx}, "
        f"fresh LLMCHAT_HOME (no calibration): flash attention auto picked {auto_choice}",
        f"late-turn prefill, llmchat / llama-bench's better setting at the same depth: median "
        f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) over {len(ratios)} turns in "
        f"{args.rounds} alternating rounds (target >= 0.95)",
    ]
    print("\n".join(summary))
    write_report(
        args.out,
        "Late-turn prefill vs llama-bench at the same depth (bench/late_turn_prefill.py)",
        started,
        load_before,
        f"Model: {model}. llama-bench: {args.llama_bench}.",
        summary,
        raw,
    )


if __name__ == "__main__":
    main()
