#!/usr/bin/env python3
"""Peak memory of `llmchat ask` against what the model should need.

    python bench/memory.py [--ctx 4096] [--model PATH] [--extra=--lookup]

Runs `/usr/bin/time -v llmchat ask --ctx CTX ...` (install GNU time with `apt-get install -y time`
if it is missing) and compares "Maximum resident set size" with

    budget = model file size + KV bytes per token x ctx + 150 MB (Python, llama.cpp buffers)

where KV bytes per token = 2 (K and V) x layers x KV heads x head dim x 2 bytes (f16), read from
the GGUF header (SmolLM2-135M: 2 x 30 x 3 x 64 x 2 = 23,040 B). With mmap (the default) the
weights count in RSS once touched, so the file size is the right term.
Each --extra=FLAGS adds one more measured configuration (e.g. --extra=--lookup, --extra="--kv-type q8_0").
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MB = 1024 * 1024
OVERHEAD = 150 * MB
PROMPT = "Write a short paragraph about the sea."


def kv_bytes_per_token(path: Path) -> int:
    from llmchat.gguf.reader import read_metadata

    meta = read_metadata(path).scalars
    arch = meta["general.architecture"]
    layers = int(meta[f"{arch}.block_count"])
    heads = int(meta[f"{arch}.attention.head_count"])
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    embd = int(meta[f"{arch}.embedding_length"])
    key_len = int(meta.get(f"{arch}.attention.key_length", embd // heads))
    value_len = int(meta.get(f"{arch}.attention.value_length", embd // heads))
    return layers * kv_heads * (key_len + value_len) * 2


def long_prompt(words: int) -> str:
    sentence = "The tide came in slowly over the flat grey sand while the gulls circled above the harbour. "
    n = max(1, words // len(sentence.split()))
    return (sentence * n) + "\n\nSummarise the text above in one sentence."


def measure(time_bin: str, model: Path, ctx: int, extra: list[str], max_tokens: int, prompt: str) -> dict:
    cmd = [
        time_bin,
        "-v",
        sys.executable,
        "-m",
        "llmchat",
        "ask",
        "-m",
        str(model),
        "--ctx",
        str(ctx),
        "--no-history",
        "--temperature",
        "0",
        "--seed",
        "1",
        "--max-tokens",
        str(max_tokens),
        *extra,
        prompt,
    ]
    with tempfile.TemporaryDirectory() as home:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=dict(os.environ, LLMCHAT_HOME=home), stdin=subprocess.DEVNULL
        )
    if proc.returncode != 0:
        sys.exit(f"ask failed ({proc.returncode}): {proc.stderr[-2000:]}")
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", proc.stderr).group(1)
    return {"peak_rss": peak_kb * 1024, "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--model", "-m")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--prompt-words", type=int, default=0, help="use a long prompt of about this many words (fills the context)"
    )
    parser.add_argument("--extra", action="append", default=[], help="another configuration: extra ask flags, quoted")
    args = parser.parse_args()

    time_bin = "/usr/bin/time" if os.path.exists("/usr/bin/time") else shutil.which("gtime")
    if not time_bin:
        sys.exit("GNU time is missing: apt-get install -y time")
    from llmchat.models.resolve import bundled_default_model

    model = Path(args.model) if args.model else bundled_default_model()
    file_size = model.stat().st_size
    per_token = kv_bytes_per_token(model)
    kv = per_token * args.ctx
    budget = file_size + kv + OVERHEAD
    print(
        f"model {model.name}: file {file_size / MB:.1f} MiB; KV {per_token:,} B/token x {args.ctx} = {kv / MB:.1f} MiB; "
        f"budget (file + KV + 150 MiB) = {budget / MB:.1f} MiB\n"
    )
    print("| configuration | peak RSS MiB | budget MiB | RSS / budget | wall |")
    print("| --- | ---: | ---: | ---: | --- |")
    for extra in [""] + args.extra:
        flags = shlex.split(extra)
        prompt = long_prompt(args.prompt_words) if args.prompt_words else PROMPT
        result = measure(time_bin, model, args.ctx, flags, args.max_tokens, prompt)
        label = f"ask --ctx {args.ctx} {extra}".strip() + (
            f" (prompt ~{args.prompt_words} words)" if args.prompt_words else ""
        )
        print(
            f"| {label} | {result['peak_rss'] / MB:.1f} | {budget / MB:.1f} | {result['peak_rss'] / budget:.2f} | {result['wall']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
