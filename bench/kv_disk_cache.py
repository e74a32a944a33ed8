"""The KV cache on disk: TTFT of the first turn in a new process, with and without it.

1. `ask` a ~3,000-token prompt: the conversation is saved, and so is its KV cache (one file).
2. `ask -c` in a new process, with the disk cache, then with `--no-prompt-cache`.
3. `chat --resume ID` (scripted, one message) in a new process, with and without.
Each run is a real `python -m llmchat` process; TTFT, cached tokens, tokens from disk and the
restore time come from the `--json` stats. Restore cost per token (restore_s / disk_cached_tokens)
is set against prefill cost per token (prefill_s / prefill_tokens of the run without the cache).
Target (issue 17): `ask -c` TTFT at least 5× lower with the cache.

    python bench/kv_disk_cache.py [--tokens 3000] [-m MODEL] [--out bench/results/kv_disk_cache.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone

SENTENCE = "Entry {i}: the survey team logged the river depth, the water temperature and the bird count at dawn."


def llmchat(args: list[str], env: dict, stdin: str = "") -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "llmchat", *args], input=stdin, capture_output=True, text=True, env=env, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=3000, help="about this many prompt tokens")
    parser.add_argument("-m", "--model")
    parser.add_argument("--out")
    args = parser.parse_args()

    home = tempfile.mkdtemp(prefix="llmchat-kvbench-")
    env = dict(os.environ, LLMCHAT_HOME=home)
    common = ["--temperature", "0", "--max-tokens", "16", "--ctx", "8192", "--json"]
    if args.model:
        common += ["-m", args.model]
    document = " ".join(SENTENCE.format(i=i) for i in range(args.tokens // 24))
    first = llmchat(["ask", *common, document + "\n\nSummarise the survey in one sentence."], env)
    cid = first["conversation_id"]

    rows = []
    with_cache = llmchat(["ask", "--cid", cid, *common, "Which entry came last?"], env)
    rows.append(("ask -c, disk cache", with_cache["stats"]))
    without = llmchat(["ask", "--cid", cid, "--no-prompt-cache", *common, "Which entry came first?"], env)
    rows.append(("ask -c, --no-prompt-cache", without["stats"]))
    chat = ["chat", "--resume", cid, *common]
    resumed = llmchat(chat, env, stdin="How deep was the river?\n")
    rows.append(("chat --resume, disk cache", resumed["stats"]))
    resumed_off = llmchat([*chat, "--no-prompt-cache"], env, stdin="How warm was the water?\n")
    rows.append(("chat --resume, --no-prompt-cache", resumed_off["stats"]))

    lines = [
        f"# KV cache on disk: first-turn TTFT in a new process ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs (shared with other jobs while measured); "
        f"model: {first['model']}; first prompt {first['stats']['prompt_tokens']} tokens; "
        f"flash attention {'on' if first['stats'].get('flash_attn') else 'off'} ({first['stats'].get('flash_attn_why')}).",
        "",
        "| run | prompt tokens | cached | from disk | restore ms | prefilled | TTFT ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, stats in rows:
        lines.append(
            f"| {name} | {stats['prompt_tokens']} | {stats['cached_tokens']} | {stats['disk_cached_tokens']} | "
            f"{stats['restore_s'] * 1000:.0f} | {stats['prefill_tokens']} | {stats['ttft_s'] * 1000:.0f} |"
        )
    ask_ratio = without["stats"]["ttft_s"] / with_cache["stats"]["ttft_s"]
    chat_ratio = resumed_off["stats"]["ttft_s"] / resumed["stats"]["ttft_s"]
    restore_per_token = with_cache["stats"]["restore_s"] / max(with_cache["stats"]["disk_cached_tokens"], 1)
    prefill_per_token = without["stats"]["prefill_s"] / max(without["stats"]["prefill_tokens"], 1)
    lines += [
        "",
        f"- `ask -c` TTFT without / with the disk cache: **{ask_ratio:.1f}×** (target ≥ 5×).",
        f"- `chat --resume` TTFT without / with: **{chat_ratio:.1f}×**.",
        f"- Restore: {restore_per_token * 1e6:.0f} µs per token; prefill: {prefill_per_token * 1e6:.0f} µs per token "
        f"({prefill_per_token / max(restore_per_token, 1e-9):.0f}× dearer). A restore reads the whole file, so it "
        "pays once it brings more than about 1/30 of the file's tokens (kv_store.RESTORE_COST_RATIO = 32).",
        "",
        "Command: `python bench/kv_disk_cache.py`" + (f" -m {args.model}" if args.model else ""),
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as out:
            out.write(report)


if __name__ == "__main__":
    main()
