"""`ask --lookup` against llama.cpp's own `llama-lookup`, on a copy task, side by side.

Both decode the same rendered prompt greedily (repeat penalty off), with flash attention on (what
`--lookup` runs with), the same threads, context and draft cap (16); the replies are compared and
the script stops if they differ. Each tool drafts its own way (llmchat: n-grams of the prompt and
reply; llama-lookup: its n-gram cache), which is what is being compared. Decode tok/s counts the
same tokens on both sides: the reply's tokens after the first (which the prompt's pass produces)
without the end token, over the time from the first token to the end. That is ask's
`decode_tok_s` ((generated - 1) / first to last token). llama-lookup's "decoded N tokens in T
seconds" line counts more in N: the first token, and every token its last pass accepted, past
the end token too (here the prompt's "light.<|im_end|>\n" was drafted and accepted, then another
end token sampled: N = 91 where ask counts 87, 4.6% in its favour). So its figure here is
(ask's generated - 1) / T, the same tokens over its own decode time (the replies are compared
first); its own figure is kept in the raw lines. Rounds alternate which goes first; the ratio
(ask / llama-lookup) is a median over the rounds with the min-max spread.

    python bench/lookup_vs_llama_lookup.py LLAMA_LOOKUP [--reps 5] [--tokens 256]
           [--out bench/results/lookup_vs_llama_lookup.md]
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
import time
from pathlib import Path

from report import write_report

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
PROMPT = (
    "Repeat this text exactly: The old lighthouse stood at the end of the rocky point, its white paint "
    "peeling in long strips after a hundred winters of salt and wind. Every evening the keeper climbed the "
    "spiral stairs, one hundred and twelve of them, to light the great lamp, and every morning he climbed "
    "them again to put it out. Ships passed far out on the grey water, and none of them ever knew his name, "
    "but all of them knew his light."
)
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
ACCEPT = re.compile(r"accept\s+=\s+([\d.]+)%")
COUNTS = re.compile(r"n_(predict|drafted|accept)\s+=\s+(\d+)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("lookup", type=Path, help="llama.cpp's llama-lookup binary")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "results" / "lookup_vs_llama_lookup.md"
    )
    args = parser.parse_args()

    from llmchat.engine import physical_cores
    from llmchat.models.resolve import bundled_default_model

    model = str(bundled_default_model())
    threads = physical_cores()
    rendered = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    ask_argv = [
        sys.executable, "-m", "llmchat", "ask", "--json", "--no-history", "-m", model, "--lookup", "--flash-attn", "on",
        "--ctx", "2048", "--threads", str(threads), "--temperature", "0", "--repeat-penalty", "1", "--no-loop-stop",
        "--max-tokens", str(args.tokens), PROMPT,
    ]  # fmt: skip
    lookup_argv = [
        str(args.lookup), "-m", model, "-p", rendered, "-n", str(args.tokens), "-c", "2048", "-t", str(threads),
        "-fa", "on", "--temp", "0", "--repeat-penalty", "1", "--spec-draft-n-max", "16",
    ]  # fmt: skip
    env = dict(os.environ, LLMCHAT_HOME=os.environ.get("LLMCHAT_HOME", "/tmp/lookup-bench-home"))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    raw: list[str] = []
    pairs: list[tuple[float, float]] = []
    for rep in range(args.reps):
        order = ("ask", "llama-lookup") if rep % 2 == 0 else ("llama-lookup", "ask")
        ask_record: dict[str, object] = {}
        lookup_run: subprocess.CompletedProcess[str] | None = None
        for side in order:
            if side == "ask":
                done = subprocess.run(ask_argv, capture_output=True, text=True, env=env, check=True)
                ask_record = json.loads(done.stdout)
            else:
                lookup_run = subprocess.run(lookup_argv, capture_output=True, text=True, check=True)
        assert lookup_run is not None
        stats = ask_record["stats"]
        assert isinstance(stats, dict)
        speed = DECODED.search(lookup_run.stderr)
        accepted = ACCEPT.search(lookup_run.stderr)
        if speed is None:
            sys.exit(f"llama-lookup printed no speed line: {lookup_run.stderr[-400:]}")
        # llama-lookup prints the prompt, then the reply with its end token (and blank lines).
        their_reply = lookup_run.stdout.split("<|im_start|>assistant\n", 1)[-1].split("<|im_end|>", 1)[0]
        if str(ask_record["reply"]).strip() != their_reply.strip():
            sys.exit(f"round {rep + 1}: the replies differ: {ask_record['reply']!r:.100} vs {their_reply!r:.100}")
        ours = float(stats["decode_tok_s"])
        theirs = (int(stats["generated_tokens"]) - 1) / float(speed.group(2))  # the same tokens (docstring)
        pairs.append((ours, theirs))
        # Decode passes after the prompt's, which load does not change: each yields its accepted drafts
        # and one sampled token. ask does not count an end token it stopped at: it came from a pass too.
        ended = 1 if stats["finish_reason"] == "stop" else 0
        ask_passes = int(stats["generated_tokens"]) + ended - 1 - int(stats["draft_accepted"])
        counts = {name: int(value) for name, value in COUNTS.findall(lookup_run.stderr)}
        their_passes = counts.get("predict", 0) - 1 - counts.get("accept", 0)
        line = (
            f"round {rep + 1} ({' first, '.join(order)} second): ask --lookup {ours:.1f} tok/s (acceptance "
            f"{stats['draft_acceptance']:.0%}, {ask_passes} passes), llama-lookup {theirs:.1f} tok/s (acceptance "
            f"{accepted.group(1) if accepted else '?'}%, {their_passes} passes, {counts.get('drafted', 0)} drafted; "
            f"own figure {speed.group(3)} tok/s over {speed.group(1)} tokens), ratio {ours / theirs:.3f}, replies equal"
        )
        raw.append(line)
        print(line, file=sys.stderr, flush=True)

    ratios = [a / b for a, b in pairs]
    summary = [
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {threads} threads; flash attention on, greedy, "
        f"repeat penalty off, at most {args.tokens} tokens, drafts of at most 16",
        f"decode tok/s: ask --lookup median {statistics.median(a for a, _ in pairs):.1f}, llama-lookup "
        f"{statistics.median(b for _, b in pairs):.1f}; ratio median {statistics.median(ratios):.3f} "
        f"({min(ratios):.3f}-{max(ratios):.3f}) over {len(ratios)} alternating rounds (target >= 0.95)",
    ]
    print("\n".join(summary))
    write_report(
        args.out,
        "ask --lookup vs llama-lookup (bench/lookup_vs_llama_lookup.py)",
        started,
        load_before,
        f"Model: {model}. llama-lookup: {args.lookup}.",
        summary,
        raw,
    )


if __name__ == "__main__":
    main()
