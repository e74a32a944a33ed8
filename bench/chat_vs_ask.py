"""Does the interactive chat's live display slow decoding? Chat on a terminal vs `ask` into a pipe.

One `llmchat chat` process runs in a pseudo-terminal (pexpect), so its replies stream with the live
readout on the bottom row (StreamPrinter, show_live=True, ticker thread redrawing ~10 times a
second). Between its turns, `llmchat ask` runs with stdout and stderr going to pipes (no readout).
Both decode the same prompt greedily for exactly --tokens tokens, and both report decode tok/s
through the same TurnStats code: (generated - 1) / (last token - first token), which leaves out
model loading and prefill. Runs alternate (and the order flips every pair) so that drift in the
machine's load hits both sides alike.

    python bench/chat_vs_ask.py                 # 7 pairs, 128 tokens
    python bench/chat_vs_ask.py --runs 11 --write bench/results/chat_vs_ask.md

Target: chat / ask >= 0.95 (median of the paired ratios).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pexpect

PROMPT = "Write a long story about a lighthouse keeper and a storm."
SUMMARY = re.compile(r"TTFT (\d+) ms · ([\d.]+) tok/s · (\d+) tokens · prompt (\d+) \((\d+) cached\)")
LIVE_DRAW = re.compile(r"\x1b7\x1b\[\d+;1H\x1b\[2K\x1b\[2m(?:TTFT|prefill)")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[78=>]")


def base_env(home: str) -> dict:
    env = dict(os.environ, LLMCHAT_HOME=home, TERM="xterm-256color", PROMPT_TOOLKIT_NO_CPR="1")
    env.pop("LLMCHAT_MODEL", None)
    return env


def common_flags(tokens: int, threads: int | None) -> list[str]:
    flags = ["--no-history", "--temperature", "0", "--seed", "1", "--max-tokens", str(tokens)]
    return flags + (["--threads", str(threads)] if threads else [])


def parse_summary(text: str) -> dict:
    matches = SUMMARY.findall(ANSI.sub("", text))
    if not matches:
        raise RuntimeError(f"no summary line in output: {text[-500:]!r}")
    ttft, rate, generated, prompt, cached = matches[-1]
    return {
        "ttft_ms": int(ttft),
        "tok_s": float(rate),
        "tokens": int(generated),
        "prompt": int(prompt),
        "cached": int(cached),
    }


class Chat:
    def __init__(self, env: dict, flags: list[str], rows: int = 30, columns: int = 100):
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "llmchat", "chat", "--stats", *flags],
            env=env,
            encoding="utf-8",
            codec_errors="replace",
            dimensions=(rows, columns),
            timeout=600,
        )
        self.child.expect_exact("/help for commands")
        self.child.expect_exact("> ")

    def turn(self, prompt: str) -> dict:
        self.child.send("/clear\r")  # the same prompt every time, from an empty conversation
        self.child.expect_exact("> ")
        self.child.send(prompt + "\r")
        self.child.expect(SUMMARY)
        stats = parse_summary(self.child.before + self.child.after)
        # Proof that the live readout was drawn on the bottom row while decoding.
        stats["live_redraws"] = len(LIVE_DRAW.findall(self.child.before))
        self.child.expect_exact("> ")
        return stats

    def close(self) -> None:
        self.child.send("/exit\r")
        self.child.expect(pexpect.EOF)
        self.child.close()


def ask(env: dict, flags: list[str], prompt: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "llmchat", "ask", "--stats", *flags, prompt],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ask failed ({done.returncode}): {done.stderr[-500:]}")
    return parse_summary(done.stderr)


def machine() -> str:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()[:10]
    except OSError:
        lscpu = ["lscpu not available"]
    return "\n".join(lscpu)


def versions() -> str:
    import importlib.metadata as md

    parts = [f"Python {sys.version.split()[0]}"]
    for package in ("llama-cpp-python", "prompt-toolkit", "rich"):
        try:
            parts.append(f"{package} {md.version(package)}")
        except md.PackageNotFoundError:
            pass
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="measured pairs (one chat turn + one ask each)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="passed to both (default: llmchat's own)")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--write", type=Path, default=None, help="append the result as Markdown to this file")
    args = parser.parse_args()

    load_before = os.getloadavg()
    home = tempfile.mkdtemp(prefix="llmchat-bench-")
    env = base_env(home)
    flags = common_flags(args.tokens, args.threads)
    chat = Chat(env, flags)
    rows = []
    try:
        chat.turn(args.prompt)  # warm-up: page the model in, fill caches
        ask(env, flags, args.prompt)
        for index in range(args.runs):
            order = ("chat", "ask") if index % 2 == 0 else ("ask", "chat")
            pair = {}
            for side in order:
                pair[side] = chat.turn(args.prompt) if side == "chat" else ask(env, flags, args.prompt)
            rows.append(pair)
            print(
                f"run {index + 1}: chat {pair['chat']['tok_s']:.1f} tok/s ({pair['chat']['tokens']} tokens, "
                f"{pair['chat']['live_redraws']} live redraws), "
                f"ask {pair['ask']['tok_s']:.1f} tok/s ({pair['ask']['tokens']} tokens)",
                flush=True,
            )
    finally:
        chat.close()

    chat_rates = [r["chat"]["tok_s"] for r in rows]
    ask_rates = [r["ask"]["tok_s"] for r in rows]
    ratios = [c / a for c, a in zip(chat_rates, ask_rates) if a > 0]
    short = [r for r in rows if r["chat"]["tokens"] != args.tokens or r["ask"]["tokens"] != args.tokens]
    ratio = statistics.median(chat_rates) / statistics.median(ask_rates)
    # The verdict uses the paired ratios: the two runs of a pair are seconds apart and see the same
    # machine load, while the medians of each side can drift apart on a shared, busy machine.
    paired = statistics.median(ratios)
    verdict = "meets" if paired >= 0.95 else "misses"
    summary = (
        f"chat (pty, live readout): median {statistics.median(chat_rates):.1f} tok/s, mean {statistics.mean(chat_rates):.1f}\n"
        f"ask  (stdout to a pipe):  median {statistics.median(ask_rates):.1f} tok/s, mean {statistics.mean(ask_rates):.1f}\n"
        f"live readout redraws per chat turn: median {statistics.median(r['chat']['live_redraws'] for r in rows)}\n"
        f"median of paired ratios chat/ask: {paired:.3f} ({verdict} the 0.95 target); ratio of the medians {ratio:.3f}"
    )
    load_after = os.getloadavg()
    summary += f"\nload average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f} on {os.cpu_count()} CPUs"
    print(summary)
    if short:
        print(f"note: {len(short)} run(s) stopped before {args.tokens} tokens")

    if args.write:
        lines = [
            f"## chat vs ask decode speed — {dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
            "",
            f"`python bench/chat_vs_ask.py --runs {args.runs} --tokens {args.tokens}`"
            + (f" `--threads {args.threads}`" if args.threads else "")
            + f"; bundled SmolLM2-135M-Instruct Q4_1, greedy, prompt {args.prompt!r}.",
            "",
            "| run | chat tok/s | ask tok/s | chat/ask | tokens (chat, ask) | live redraws (chat) |",
            "|---:|---:|---:|---:|---|---:|",
        ]
        for index, row in enumerate(rows, 1):
            c, a = row["chat"], row["ask"]
            lines.append(
                f"| {index} | {c['tok_s']:.1f} | {a['tok_s']:.1f} | {c['tok_s'] / a['tok_s']:.3f} | {c['tokens']}, {a['tokens']} | {c['live_redraws']} |"
            )
        lines += [
            "",
            "```",
            summary,
            "```",
            "",
            "Machine (`lscpu | head`), " + versions() + ":",
            "",
            "```",
            machine(),
            "```",
            "",
        ]
        args.write.parent.mkdir(parents=True, exist_ok=True)
        with args.write.open("a", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")
        print(f"written to {args.write}")


if __name__ == "__main__":
    main()
