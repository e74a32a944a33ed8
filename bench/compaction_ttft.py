"""What compaction costs in prefill: the TTFT of the first turn after a compaction against the TTFT
of a trimmed turn at the same depth.

Two scripted chats (`llmchat chat --json`, greedy, the same messages) at `--ctx 2048` with
`compact_threshold = 1.0` in a fresh LLMCHAT_HOME's config, so that `--compact auto` compacts at
exactly the turn where `--compact off` trims (the prompt plus the reply's reserve passes the
context). Up to that turn the two chats are the same; at it:
- trimmed: the oldest exchanges are dropped and the kept KV cache is shifted (`--kv-shift`, the
  default): only the new message is prefilled;
- compacted: the model first writes the summary (its own generation, not in the turn's TTFT: its
  time is read from the summary's stats in the history), then the turn's prompt is a new prefix,
  the summary and the kept exchanges, all prefilled.
Reported per round: that turn's TTFT, its prefilled and cached tokens, and the summary's time;
then the turn after it on both sides. Rounds alternate which chat runs first; the summary is the
median over rounds.

    python bench/compaction_ttft.py [--rounds 5] [--turns 28] [--out bench/results/compaction_ttft.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import write_report

CTX = 2048
MAX_TOKENS = 32
FILLER = (
    "The harbour town keeps its old lighthouse, a stone tower painted white and red, and every evening the keeper "
    "climbs ninety steps to light the lamp for the fishing boats that come home late. In winter the storms break "
    "over the pier, the market moves indoors, and the bakery sells bread to the sailors before dawn."
)


def message(turn: int) -> str:
    return f"Note {turn}: {FILLER} What does note {turn} say, in one sentence?"


def chat_run(model: str, turns: int, mode: str, threads: int) -> tuple[list[dict], str, list[dict]]:
    """One scripted chat: its records, its stderr, and the stats of the summaries it stored."""
    with tempfile.TemporaryDirectory() as home:
        Path(home, "config.toml").write_text("compact_threshold = 1.0\n")
        command = [
            sys.executable, "-m", "llmchat", "chat", "--json", "-m", model, "--ctx", str(CTX), "--compact", mode,
            "--max-tokens", str(MAX_TOKENS), "--temperature", "0", "--seed", "7", "--threads", str(threads),
            "--no-prompt-cache",
        ]  # fmt: skip
        stdin = "\n".join(message(i) for i in range(1, turns + 1)) + "\n"
        env = dict(os.environ, LLMCHAT_HOME=home)
        proc = subprocess.run(command, input=stdin, capture_output=True, text=True, check=True, env=env)
        with sqlite3.connect(Path(home, "history.db")) as db:
            rows = db.execute("SELECT stats_json FROM messages WHERE role = 'summary' ORDER BY seq").fetchall()
    return [json.loads(line) for line in proc.stdout.splitlines()], proc.stderr, [json.loads(r[0]) for r in rows]


def event_turn(records: list[dict]) -> int | None:
    """The index of the first turn whose prompt shrank: where the chat compacted or trimmed."""
    for index in range(1, len(records)):
        if records[index]["stats"]["prompt_tokens"] < records[index - 1]["stats"]["prompt_tokens"]:
            return index
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--turns", type=int, default=28)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "compaction_ttft.md")
    args = parser.parse_args()

    from llmchat.engine import physical_cores
    from llmchat.models.resolve import bundled_default_model

    model = str(bundled_default_model())
    threads = physical_cores()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    raw: list[str] = []
    ttft: dict[str, list[float]] = {"auto": [], "off": []}
    after: dict[str, list[float]] = {"auto": [], "off": []}
    prefilled: dict[str, list[int]] = {"auto": [], "off": []}
    summary_s: list[float] = []
    for number in range(1, args.rounds + 1):
        order = ("auto", "off") if number % 2 else ("off", "auto")
        for mode in order:
            records, stderr, summaries = chat_run(model, args.turns, mode, threads)
            index = event_turn(records)
            notices = [line for line in stderr.splitlines() if line.startswith("context:")]
            if index is None:
                last = records[-1]["stats"]["prompt_tokens"] if records else 0
                raw.append(f"round {number}, --compact {mode}: no compaction or trim in {args.turns} turns ({last})")
                print(raw[-1], file=sys.stderr, flush=True)
                continue
            turn, next_turn = records[index]["stats"], records[index + 1]["stats"] if index + 1 < len(records) else None
            ttft[mode].append(turn["ttft_s"])
            prefilled[mode].append(turn["prefill_tokens"])
            if next_turn is not None:
                after[mode].append(next_turn["ttft_s"])
            took = ""
            if mode == "auto" and summaries:
                summary_s.append(summaries[0]["total_s"])
                s = summaries[0]
                took = (
                    f"; the summary: {s['generated_tokens']} tokens in {s['total_s'] * 1000:.0f} ms, its prompt "
                    f"{s['prompt_tokens']} tokens ({s['cached_tokens']} cached)"
                )
            line = (
                f"round {number} ({' first, '.join(order)} second), --compact {mode}, turn {index + 1}: TTFT "
                f"{turn['ttft_s'] * 1000:.0f} ms, prompt {turn['prompt_tokens']} ({turn['cached_tokens']} cached, "
                f"{turn['prefill_tokens']} prefilled); next turn TTFT "
                f"{(next_turn or {}).get('ttft_s', 0) * 1000:.0f} ms{took}; notices: {notices}"
            )
            raw.append(line)
            print(line, file=sys.stderr, flush=True)

        # Written after every round: a run stopped early (a timeout on a busy machine) keeps its rounds.
        report(args.out, started, load_before, model, threads, number, ttft, prefilled, summary_s, after, raw)


def report(
    out: Path,
    started: str,
    load_before: float,
    model: str,
    threads: int,
    rounds: int,
    ttft: dict[str, list[float]],
    prefilled: dict[str, list[int]],
    summary_s: list[float],
    after: dict[str, list[float]],
    raw: list[str],
) -> None:
    def median_ms(values: list[float]) -> str:
        if not values:
            return "none"
        return f"{statistics.median(values) * 1000:.0f} ms ({min(values) * 1000:.0f}-{max(values) * 1000:.0f})"

    def median(values: list[int]) -> str:
        return f"{statistics.median(values):.0f}" if values else "none"

    summary = [
        f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} CPUs, {threads} threads; "
        f"SmolLM2-135M Q4_1, chat --ctx {CTX} --max-tokens {MAX_TOKENS}, compact_threshold 1.0 (compaction at the "
        "turn that trims otherwise)",
        f"first turn after compaction: TTFT median {median_ms(ttft['auto'])}, {median(prefilled['auto'])} tokens "
        f"prefilled; trimmed turn at the same depth: {median_ms(ttft['off'])}, {median(prefilled['off'])} tokens "
        f"prefilled ({rounds} alternating rounds)",
        f"the summary itself (before that turn, not in its TTFT): median {median_ms(summary_s)}",
        f"the turn after: compacted {median_ms(after['auto'])}, trimmed {median_ms(after['off'])}",
    ]
    print("\n".join(summary))
    write_report(
        out,
        "TTFT after compaction vs after trimming, same depth (bench/compaction_ttft.py)",
        started,
        load_before,
        f"Model: {model}.",
        summary,
        raw,
    )


if __name__ == "__main__":
    main()
