"""TTFT over a 30-turn scripted conversation: does the pause before each reply stay flat?

With KV-cache reuse across turns only the new user message is prefilled, so TTFT should not grow
with the length of the chat; trims drop old exchanges in one chunk, so the turns after a trim
extend a stable prefix again. Target: mean TTFT of turns 26-30 <= 1.3 x the mean of turns 2-6.

    python bench/conversation_ttft.py [--turns 30] [--ctx 4096] [-m MODEL] [--flag=--no-flash-attn ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from datetime import datetime, timezone

# Equal-length user messages (same word count), so every turn adds about the same prefill work.
TOPICS = ["rivers", "mountains", "deserts", "forests", "oceans", "islands", "glaciers", "volcanoes", "lakes", "caves"]


def message(turn: int) -> str:
    topic = TOPICS[turn % len(TOPICS)]
    return f"Turn {turn:02d}: please tell me three interesting facts about {topic}, each in one full sentence, and keep it short."


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("-m", "--model")
    parser.add_argument("--flag", action="append", default=[], help="an extra chat flag, e.g. --flag=--no-flash-attn")
    args = parser.parse_args()

    command = [
        sys.executable,
        "-m",
        "llmchat",
        "chat",
        "--json",
        "--no-history",
        "--ctx",
        str(args.ctx),
        "--max-tokens",
        str(args.max_tokens),
        "--temperature",
        "0.7",
        "--seed",
        "7",
    ]
    if args.model:
        command += ["-m", args.model]
    command += args.flag
    stdin = "\n".join(message(i) for i in range(1, args.turns + 1)) + "\n"
    proc = subprocess.run(command, input=stdin, capture_output=True, text=True, check=True)
    turns = [json.loads(line) for line in proc.stdout.splitlines()]

    print(f"date {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {platform.machine()}, {os.cpu_count()} CPUs")
    # TTFT = llmchat's own work before llama.cpp starts (render, tokenize, fit) + llama.cpp's prefill
    # and first sample (engine ms).
    print("| turn | TTFT ms | engine ms | prompt | cached | prefilled | generated | dropped |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for turn in turns:
        s = turn["stats"]
        print(
            f"| {turn['id']} | {s['ttft_s'] * 1000:.0f} | {s['prefill_s'] * 1000:.0f} | {s['prompt_tokens']} | {s['cached_tokens']} | "
            f"{s['prefill_tokens']} | {s['generated_tokens']} | {s['messages_dropped']} |"
        )
    early = statistics.mean(t["stats"]["ttft_s"] for t in turns[1:6])
    late = statistics.mean(t["stats"]["ttft_s"] for t in turns[25:30])
    trims = sum(1 for t in turns if t["stats"]["messages_dropped"])
    print(
        f"\nmean TTFT turns 2-6: {early * 1000:.0f} ms; turns 26-30: {late * 1000:.0f} ms; "
        f"ratio {late / early:.2f} (target <= 1.3); turns with a trim: {trims}"
    )


if __name__ == "__main__":
    main()
