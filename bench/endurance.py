"""Endurance: does a long session keep its memory flat?

Two runs, each a single llmchat process watched from outside (VmRSS from /proc/PID/status; no
psutil needed):

- chat: `llmchat chat --json --ctx 1024 --max-tokens 16` fed 200 lines, one turn at a time. RSS is
  read after every reply. The context fills up and is trimmed many times over the 200 turns.
- batch: `llmchat batch` over 1,000 items with `--max-tokens 4`, RSS sampled every 0.2 s.

What "flat" means: llama.cpp allocates the KV cache for the whole context when the model loads,
but the pages are only touched (and so counted in RSS) as the context first fills. Growth up to
the KV-cache size early on is expected; after that, RSS should not keep climbing. The report gives
the KV-cache size, RSS at start / middle / end, and the growth over the second half of each run.

Slow (minutes on 2 cores), so it is a script, not a test:

    python bench/endurance.py                 # both runs, writes bench/results/endurance.md
    python bench/endurance.py --only chat     # or --only batch
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "endurance.md"
TOPICS = ["rivers", "owls", "copper", "tides", "bread", "comets", "maple trees", "glass", "bees", "granite"]


def rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def mib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.1f}"


def kv_cache_mib(model: str | None, n_ctx: int) -> float:
    """KV-cache bytes for n_ctx tokens at f16, from the model's header (llmchat's own math)."""
    from llmchat.gguf.footprint import attention_layout, kv_bytes_per_token
    from llmchat.gguf.reader import read_metadata
    from llmchat.models.resolve import bundled_default_model

    path = model or bundled_default_model()
    return kv_bytes_per_token(attention_layout(read_metadata(path))) * n_ctx / 2**20


def llmchat(*args: str) -> list[str]:
    return [sys.executable, "-m", "llmchat", *args]


def run_chat(turns: int, model: str | None, home: Path) -> dict:
    args = ["chat", "--json", "--ctx", "1024", "--max-tokens", "16"] + (["-m", model] if model else [])
    env = dict(os.environ, LLMCHAT_HOME=str(home))
    proc = subprocess.Popen(
        llmchat(*args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    samples = []  # (turn, rss KiB, prompt tokens, context used, messages dropped)
    t0 = time.perf_counter()
    try:
        for turn in range(1, turns + 1):
            message = f"Turn {turn}: tell me one short fact about {TOPICS[turn % len(TOPICS)]}."
            proc.stdin.write(message.encode() + b"\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"llmchat chat ended at turn {turn}: {proc.stderr.read().decode()[-2000:]}")
            record = json.loads(line)
            stats = record.get("stats") or {}
            samples.append(
                (
                    turn,
                    rss_kib(proc.pid),
                    stats.get("prompt_tokens"),
                    stats.get("context_used"),
                    stats.get("messages_dropped"),
                )
            )
        proc.stdin.close()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return {"samples": samples, "seconds": time.perf_counter() - t0, "returncode": proc.returncode}


def run_batch(items: int, model: str | None, work: Path) -> dict:
    source = work / "endurance-in.jsonl"
    with source.open("w") as f:
        for i in range(items):
            f.write(
                json.dumps({"id": i, "prompt": f"Item {i}: name one thing about {TOPICS[i % len(TOPICS)]}."}) + "\n"
            )
    out = work / "endurance-out.jsonl"
    args = ["batch", str(source), "-o", str(out), "--max-tokens", "4", "--ctx", "512", "--progress", "off"] + (
        ["-m", model] if model else []
    )
    env = dict(os.environ, LLMCHAT_HOME=str(work / "home"))
    proc = subprocess.Popen(
        llmchat(*args), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    samples = []  # (items done, rss KiB)
    t0 = time.perf_counter()
    while proc.poll() is None:
        rss = rss_kib(proc.pid)
        done = out.read_bytes().count(b"\n") if out.exists() else 0
        if rss is not None:
            samples.append((done, rss))
        time.sleep(0.2)
    stderr = proc.stderr.read().decode()
    done = out.read_bytes().count(b"\n") if out.exists() else 0
    return {
        "samples": samples,
        "seconds": time.perf_counter() - t0,
        "returncode": proc.returncode,
        "done": done,
        "stderr": stderr[-2000:],
    }


def batch_ready() -> bool:
    probe = subprocess.run(llmchat("batch", "--help"), capture_output=True, timeout=60)
    return probe.returncode == 0 and b"--output" in probe.stdout


def machine() -> str:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines()[:10]
    except (OSError, subprocess.SubprocessError):
        lscpu = [platform.processor() or platform.machine()]
    return "\n".join(lscpu)


def chat_section(result: dict, kv: float) -> list[str]:
    samples = result["samples"]
    if not samples:
        return ["No turns completed."]
    n = len(samples)
    start, middle, end = samples[min(9, n - 1)], samples[n // 2 - 1], samples[-1]
    first = samples[0]
    lines = [
        f"{n} turns in {result['seconds']:.0f} s, exit {result['returncode']}. "
        f"KV cache for 1,024 tokens: {kv:.1f} MiB (f16).",
        "",
        "| point | turn | RSS MiB | prompt tokens | context used |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, s in (("first reply", first), ("start (turn 10)", start), ("middle", middle), ("end", end)):
        lines.append(f"| {label} | {s[0]} | {mib(s[1])} | {s[2]} | {s[3]} |")
    rss = [s[1] for s in samples if s[1] is not None]
    trims = sum(1 for s in samples if s[4])
    lines += [
        "",
        f"- growth from the first reply to the end: {mib(end[1] - first[1])} MiB (the KV cache is {kv:.1f} MiB)",
        f"- growth over the second half (turn {middle[0]} to {end[0]}): {mib(end[1] - middle[1])} MiB",
        f"- RSS range after turn 10: {mib(min(rss[9:] or rss))} to {mib(max(rss[9:] or rss))} MiB",
        f"- turns where the context was trimmed: {trims}",
        "",
        "<details><summary>RSS per turn (every 10th)</summary>",
        "",
        "| turn | RSS MiB | prompt tokens | context used | dropped |",
        "|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {s[0]} | {mib(s[1])} | {s[2]} | {s[3]} | {s[4]} |" for s in samples if s[0] == 1 or s[0] % 10 == 0]
    lines += ["", "</details>"]
    return lines


def batch_section(result: dict, kv: float, items: int) -> list[str]:
    samples = [s for s in result["samples"] if s[0] > 0]
    if not samples:
        return [f"No item completed (exit {result['returncode']}): {result['stderr']}"]
    first, end = samples[0], samples[-1]
    middle = min(samples, key=lambda s: abs(s[0] - items // 2))
    lines = [
        f"{result['done']} of {items} items in {result['seconds']:.0f} s, exit {result['returncode']}. "
        f"KV cache for 512 tokens: {kv:.1f} MiB (f16).",
        "",
        "| point | items done | RSS MiB |",
        "|---|---:|---:|",
    ]
    for label, s in (("first item", first), ("middle", middle), ("end", end)):
        lines.append(f"| {label} | {s[0]} | {mib(s[1])} |")
    lines += [
        "",
        f"- growth from the first item to the end: {mib(end[1] - first[1])} MiB",
        f"- growth over the second half: {mib(end[1] - middle[1])} MiB",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--only", choices=["chat", "batch"])
    parser.add_argument("-m", "--model", help="a .gguf path (default: the bundled SmolLM2)")
    parser.add_argument("--write", type=Path, default=RESULTS)
    args = parser.parse_args()

    sections = [
        "# Endurance: memory over a long session",
        "",
        f"Date: {dt.datetime.now().astimezone().isoformat(timespec='seconds')}  ",
        f"Python {platform.python_version()}, {platform.platform()}  ",
        f"Model: {args.model or 'bundled SmolLM2-135M-Instruct Q4_1'}",
        "",
        "```",
        machine(),
        "```",
        "",
        "Produced by `python bench/endurance.py`. RSS is VmRSS of the llmchat process from /proc.",
        "",
        "How to read it: the KV cache and llama.cpp's compute buffers are allocated at load but only",
        "counted in RSS as they are first touched (the context filling up, the first full-size prefill",
        "after a trim), and the token-piece cache fills up to the vocabulary's size. So RSS rises early",
        "in a run; a leak would show as growth over the second half, after the context has filled.",
    ]
    with tempfile.TemporaryDirectory(prefix="llmchat-endurance-") as tmp:
        work = Path(tmp)
        if args.only in (None, "chat"):
            print(f"chat: {args.turns} turns…", file=sys.stderr)
            chat = run_chat(args.turns, args.model, work / "chat-home")
            sections += ["", f"## Scripted chat: {args.turns} turns, --ctx 1024, --max-tokens 16", ""]
            sections += chat_section(chat, kv_cache_mib(args.model, 1024))
        if args.only in (None, "batch"):
            sections += ["", f"## Batch: {args.items} items, --max-tokens 4, --ctx 512", ""]
            if batch_ready():
                print(f"batch: {args.items} items…", file=sys.stderr)
                batch = run_batch(args.items, args.model, work)
                sections += batch_section(batch, kv_cache_mib(args.model, 512), args.items)
            else:
                sections += [
                    "`llmchat batch` is not available in this checkout yet; rerun with `--only batch` when it is."
                ]
    text = "\n".join(sections) + "\n"
    args.write.parent.mkdir(parents=True, exist_ok=True)
    args.write.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
