"""A branch's first turn in a new process: TTFT with the KV cache on disk and without it.

1. A 10-turn scripted chat is saved (its KV cache too: one file, the latest turn).
2. `history fork ID --at N` makes a branch sharing turns 1..N.
3. `ask -c --cid BRANCH` in a new process, with the disk cache and with `--no-prompt-cache`,
   alternating, each on a fresh branch (a run saves a turn to the branch it continues).
The restore finds the parent's file by the longest common token prefix: the branch's shared turns
render to the same tokens. TTFT and token counts come from the `--json` stats.

    python bench/branch_kv.py [--at 8] [--runs 3] [--reply-tokens 64] [-m MODEL] [--out FILE]
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
from dataclasses import replace
from datetime import datetime, timezone


def llmchat(args: list[str], env: dict, stdin: str = "") -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "llmchat", *args], input=stdin, capture_output=True, text=True, env=env, check=True
    )
    return proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--at", type=int, default=8, help="the branch point N (turns shared)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--reply-tokens", type=int, default=64)
    parser.add_argument("-m", "--model")
    parser.add_argument("--out")
    args = parser.parse_args()

    env = dict(os.environ, LLMCHAT_HOME=tempfile.mkdtemp(prefix="llmchat-branchbench-"))
    model = ["-m", args.model] if args.model else []
    questions = [f"Tell me one fact about the number {n}, in two sentences." for n in range(1, 11)]
    made = llmchat(
        ["chat", *model, "--temperature", "0", "-n", str(args.reply_tokens), "--json"], env, "\n".join(questions) + "\n"
    )
    last = json.loads(made.splitlines()[-1])
    parent = last["conversation_id"]
    rows: dict[str, list[dict]] = {"disk cache": [], "--no-prompt-cache": []}
    for _ in range(args.runs):
        for label, extra in (("disk cache", []), ("--no-prompt-cache", ["--no-prompt-cache"])):
            branch = llmchat(["history", "fork", parent, "--at", str(args.at)], env).strip()
            out = llmchat(
                ["ask", *model, *extra, "-c", "--cid", branch, "--json", "-n", "8", "--temperature", "0", "And 11?"],
                env,
            )
            rows[label].append(json.loads(out)["stats"])

    lines = [
        f"# A branch's first turn in a new process: the KV cache on disk ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs (shared with other jobs while measured); "
        f"model: {last['model']}; a 10-turn conversation ({last['stats']['context_used']} tokens) branched at "
        f"turn {args.at}; median of {args.runs} runs each, alternating.",
        "",
        "| run | prompt tokens | cached | from disk | restore ms | prefilled | TTFT ms (median) | TTFT ms (each) |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    medians = {}
    for label, runs in rows.items():
        first = runs[0]
        ttfts = [r["ttft_s"] * 1000 for r in runs]
        medians[label] = statistics.median(ttfts)
        lines.append(
            f"| ask -c --cid BRANCH, {label} | {first['prompt_tokens']} | {first['cached_tokens']} | "
            f"{first['disk_cached_tokens']} | {first['restore_s'] * 1000:.0f} | "
            f"{first['prompt_tokens'] - first['cached_tokens']} | {medians[label]:.0f} | "
            + ", ".join(f"{t:.0f}" for t in ttfts)
            + " |"
        )
    memory = in_memory(args, questions)
    lines += [
        "",
        f"- TTFT without / with the disk cache: **{medians['--no-prompt-cache'] / medians['disk cache']:.1f}×**.",
        "",
        "In one process (`/branch N` in the chat: the shared turns are still in the KV cache in memory), "
        "against the same branch turn after another conversation took the cache:",
        "",
        "| run | prompt tokens | cached | prefilled | TTFT ms |",
        "|---|---:|---:|---:|---:|",
        *[
            f"| {label} | {st.prompt_tokens} | {st.cached_tokens} | {st.prompt_tokens - st.cached_tokens} | "
            f"{st.ttft_s * 1000:.0f} |"
            for label, st in memory
        ],
        "",
        "Command: `python bench/branch_kv.py" + (f" --at {args.at}" if args.at != 8 else "") + "`",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)


def in_memory(args: argparse.Namespace, questions: list[str]) -> list[tuple[str, object]]:
    """/branch N in a running chat, then the same branch turn with the cache taken by another conversation."""
    from llmchat.config import load_config
    from llmchat.engine.interface import GenerateRequest
    from llmchat.options import RunOptions
    from llmchat.startup.loading import start_session

    opts = RunOptions(model=args.model, temperature=0.0, max_tokens=args.reply_tokens, seed=1)
    session = start_session(opts, config=load_config(), overflow="drop", with_history=False)
    try:
        for question in questions:
            session.turn(question)
        session.keep_turns(args.at)
        session.set_sampling(replace(session.sampling, max_tokens=8))
        warm = session.turn("And 11?").stats
        session.drop_last_exchange()  # back to the shared turns
        # Another conversation takes the KV cache (decoded straight through the engine, so the
        # chat's own conversation is left as it is).
        other = session.tokenize_messages([{"role": "user", "content": "Something else entirely."}])
        for _ in session.engine.generate(GenerateRequest(other, session.sampling, max_tokens=8)):
            pass
        cold = session.turn("And 11?").stats
    finally:
        session.close()
    return [("/branch, the shared turns in memory", warm), ("the same turn, cache taken by another chat", cold)]


if __name__ == "__main__":
    main()
