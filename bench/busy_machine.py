"""Decode speed on a busy machine: `llmchat ask` against llama.cpp's `llama-completion`, each at its
default threads, with one other process keeping a core busy, and on the quiet machine.

Three sides do the same work, a user's one-shot command: the same model, the same rendered prompt
(SmolLM2's ChatML, as ask renders it), context, batch size and flash-attention setting, greedy with
the repeat penalty off, up to `--tokens` tokens:
- `ask`: llmchat at its default threads (engine.threads picks them and tunes them while decoding);
- `ask -t N`: llmchat with the thread count fixed at the physical cores, what it ran before;
- `llama-completion`: llama.cpp's own one-shot tool at its default threads (the physical cores).
The busy process is one unpinned Python loop (`while True: pass`), started before a busy round
and killed after it, as a compile or a browser tab would load one core. Rounds alternate between
quiet and busy and rotate which side goes first. Decode tok/s: ask's `decode_tok_s` ((generated -
1) / first to last token), llama-completion's own "eval time" line (its decode steps). Ratios are
medians over rounds of llmchat / llama-completion in the same round, with the min-max spread.

    python bench/busy_machine.py LLAMA_COMPLETION [--reps 5] [--tokens 256] [--conditions quiet,busy]
           [--out bench/results/busy_machine.md]
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

PROMPT = "Write a detailed essay on the history of Rome."
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CTX = 2048
BATCH = 512
EVAL = re.compile(r"eval time =\s+[\d.]+ ms /\s+(\d+) runs\s+\(\s*[\d.]+ ms per token,\s+([\d.]+) tokens per second\)")


def cpu_kind() -> str:
    for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
        if line.startswith("model name"):
            flags = Path("/proc/cpuinfo").read_text(errors="replace")
            extras = [name for name in ("avx512f", "amx_tile") if f" {name}" in flags]
            return line.split(":", 1)[1].strip() + (f" ({', '.join(extras)})" if extras else " (no AVX-512)")
    return platform.processor() or platform.machine()


def run(argv: list[str], env: dict[str, str]) -> tuple[str, str]:
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"{argv[0]} failed ({proc.returncode}): {proc.stderr[-400:]}")
    return proc.stdout, proc.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("completion", type=Path, help="llama.cpp's llama-completion binary")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--conditions", default="quiet,busy", help="quiet, busy or both (comma-separated)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "busy_machine.md")
    args = parser.parse_args()
    conditions = [c for c in ("quiet", "busy") if c in args.conditions.split(",")]
    if not conditions:
        parser.error("--conditions takes quiet, busy or both")

    from llmchat.engine import physical_cores
    from llmchat.models.resolve import bundled_default_model

    model = str(bundled_default_model())
    cores = physical_cores()
    env = dict(os.environ, LLMCHAT_HOME=os.environ.get("LLMCHAT_HOME", "/tmp/busy-bench-home"))
    common = ["--temperature", "0", "--repeat-penalty", "1", "--no-loop-stop", "--max-tokens", str(args.tokens)]
    ask = [sys.executable, "-m", "llmchat", "ask", "--no-history", "--json", "-m", model, "--ctx", str(CTX)]
    ask += ["--batch-size", str(BATCH), *common]
    flash_attn = "on" if json.loads(run([*ask, PROMPT], env)[0])["stats"]["flash_attn"] else "off"
    rendered = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    completion = [
        str(args.completion), "-m", model, "-p", rendered, "-n", str(args.tokens), "-c", str(CTX), "-b", str(BATCH),
        "-ub", str(BATCH), "-fa", flash_attn, "--temp", "0", "--repeat-penalty", "1", "--no-warmup",
        "--no-display-prompt", "-no-cnv", "--simple-io", "--seed", "1",
    ]  # fmt: skip
    sides = {
        "ask": [*ask, PROMPT],
        "ask -t N": [*ask, "--threads", str(cores), PROMPT],
        "llama-completion": completion,
    }

    def measure(side: str) -> tuple[float, int, str]:
        """(decode tok/s, tokens, threads as the side ran them)."""
        out, err = run(sides[side], env)
        if side == "llama-completion":
            found = EVAL.findall(err)
            if not found:
                sys.exit(f"llama-completion printed no eval time: {err[-400:]}")
            runs, rate = found[-1]
            return float(rate), int(runs) + 1, str(cores)
        stats = json.loads(out)["stats"]
        return (
            float(stats["decode_tok_s"]),
            int(stats["generated_tokens"]),
            f"{stats['threads']} ({stats['threads_why']})",
        )

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    rates: dict[str, dict[str, list[float]]] = {c: {s: [] for s in sides} for c in conditions}
    ratios: dict[str, dict[str, list[float]]] = {
        c: {"ask": [], "ask -t N": [], "ask / ask -t N": []} for c in conditions
    }
    raw: list[str] = []
    order = list(sides)
    for rep in range(args.reps):
        for condition in conditions if rep % 2 == 0 else conditions[::-1]:
            hog = None
            if condition == "busy":
                hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                time.sleep(1.0)  # let it take its core before the first side starts
            try:
                turn = order[rep % 3 :] + order[: rep % 3]
                got = {side: measure(side) for side in turn}
            finally:
                if hog is not None:
                    hog.kill()
                    hog.wait()
            for side, (rate, _, _) in got.items():
                rates[condition][side].append(rate)
            for side in ("ask", "ask -t N"):
                ratios[condition][side].append(got[side][0] / got["llama-completion"][0])
            ratios[condition]["ask / ask -t N"].append(got["ask"][0] / got["ask -t N"][0])
            line = f"round {rep + 1} {condition} ({', '.join(turn)}): " + "; ".join(
                f"{side} {got[side][0]:.1f} tok/s, {got[side][1]} tokens, threads {got[side][2]}" for side in order
            )
            raw.append(line)
            print(line, file=sys.stderr, flush=True)

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"

    summary = [
        f"machine: {cpu_kind()}, {os.cpu_count()} CPUs, {cores} physical cores; flash attention {flash_attn} "
        f"(ask's auto); ctx {CTX}, batch {BATCH}, up to {args.tokens} tokens greedy, repeat penalty off; "
        f"{args.reps} rounds of each condition, alternating; busy: one unpinned `while True: pass` process",
    ]
    for condition in conditions:
        medians = ", ".join(f"{side} {statistics.median(rates[condition][side]):.1f}" for side in order)
        summary.append(f"{condition}: decode tok/s medians: {medians}")
        summary.append(
            f"{condition}: ask / llama-completion {spread(ratios[condition]['ask'])}; "
            f"ask -t N / llama-completion {spread(ratios[condition]['ask -t N'])}; "
            f"ask / ask -t N (what the tuner changes) {spread(ratios[condition]['ask / ask -t N'])}"
        )
    print("\n".join(summary))
    write_report(
        args.out,
        "Decode on a busy machine (bench/busy_machine.py)",
        started,
        load_before,
        f"Model: {model}. llama-completion: {args.completion}.",
        summary,
        raw,
    )


if __name__ == "__main__":
    main()
