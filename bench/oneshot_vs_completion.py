"""One-shot `llmchat ask` against llama.cpp's own `llama-completion`, exec to exit, side by side.

Both sides do the same work: the same model, the same rendered prompt (ask's ChatML render of
SmolLM2's template, passed to llama-completion as text with its special tokens parsed), the same
context size, threads, batch size and flash-attention setting (the one ask's `auto` picks, read
from a first --json run), greedy with the repeat penalty off, the same number of generated tokens
(the replies are compared; the script stops if they differ). llama-completion runs without its
warm-up pass (ask has none) and prints neither the prompt nor a conversation prompt.

A third side, `bench/oneshot_floor.py`, does the same work in the least Python there is: the
interpreter, the llama.cpp bindings llmchat uses, load, prefill, greedy decode, print. It splits
ask's gap into what is Python's (floor / llama-completion) and what is llmchat's (ask / floor).

Measured per run: wall time from exec to exit, and peak RSS (the child's own ru_maxrss, from
wait4). Rounds rotate which side goes first; the ratios are reported as medians over the rounds
with the min-max spread, and peak RSS also as a difference in MiB: its target is at most 24 MiB
over llama-completion (issue 45; issue 31's 16 MiB was met only by hiding OpenSSL from `hashlib`,
which broke every `ask` on a CPython whose own hashes are blake2 alone), since Python and the
bindings alone (the floor) take 7-9 MiB, which no ratio on a 135M model can hide. Every run is in the results file.

    python bench/oneshot_vs_completion.py LLAMA_COMPLETION [--reps 9] [--tokens 64]
           [--out bench/results/oneshot_vs_completion.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
MIN_REPS = 5


def run_measured(argv: list[str], env: dict[str, str]) -> tuple[float, float, str, str]:
    """(wall seconds, peak RSS MiB, stdout, stderr) of one child, reaped with wait4 for its own
    peak RSS (RUSAGE_CHILDREN would give the largest child so far)."""
    out_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"oneshot-{os.getpid()}.out"
    err_path = out_path.with_suffix(".err")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        began = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - began
    proc.returncode = os.waitstatus_to_exitcode(status)
    stdout, stderr = out_path.read_text(errors="replace"), err_path.read_text(errors="replace")
    out_path.unlink()
    err_path.unlink()
    if proc.returncode != 0:
        sys.exit(f"{argv[0]} failed ({proc.returncode}): {stderr[-400:]}")
    return wall, usage.ru_maxrss / 1024, stdout, stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("completion", type=Path, help="llama.cpp's llama-completion binary")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "results" / "oneshot_vs_completion.md"
    )
    args = parser.parse_args()
    if args.reps < MIN_REPS:
        parser.error(f"--reps must be at least {MIN_REPS}")

    import compileall

    import llmchat
    from llmchat.engine import physical_cores

    # As a user's `pip install` leaves it: llmchat's modules compiled to bytecode. An editable
    # checkout run with PYTHONDONTWRITEBYTECODE (as here) would compile every module from source
    # at each start, a cost no installed copy pays.
    compileall.compile_dir(Path(llmchat.__file__).parent, quiet=1)
    from llmchat.models.resolve import bundled_default_model

    model = str(bundled_default_model())
    threads = physical_cores()
    env = dict(os.environ, LLMCHAT_HOME=os.environ.get("LLMCHAT_HOME", "/tmp/oneshot-bench-home"))
    common = ["--temperature", "0", "--repeat-penalty", "1", "--no-loop-stop", "--max-tokens", str(args.tokens)]
    ask_argv = [
        sys.executable, "-m", "llmchat", "ask", "--no-history", "-m", model, "--ctx", str(CTX), "--threads",
        str(threads), "--batch-size", str(BATCH), *common,
    ]  # fmt: skip
    probe = json.loads(
        subprocess.run([*ask_argv, "--json", PROMPT], capture_output=True, text=True, env=env, check=True).stdout
    )
    flash_attn = "on" if probe["stats"]["flash_attn"] else "off"
    rendered = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    completion_argv = [
        str(args.completion), "-m", model, "-p", rendered, "-n", str(args.tokens), "-c", str(CTX), "-b", str(BATCH),
        "-ub", str(BATCH), "-t", str(threads), "-fa", flash_attn, "--temp", "0", "--repeat-penalty", "1",
        "--no-warmup", "--no-display-prompt", "-no-cnv", "--simple-io", "--seed", "1",
    ]  # fmt: skip
    floor_argv = [
        sys.executable, str(Path(__file__).resolve().parent / "oneshot_floor.py"), model, rendered,
        "--tokens", str(args.tokens), "--ctx", str(CTX), "--batch", str(BATCH), "--threads", str(threads),
        "--flash-attn", flash_attn,
    ]  # fmt: skip
    argvs = {"ask": [*ask_argv, PROMPT], "floor": floor_argv, "completion": completion_argv}
    names = {"ask": "ask", "floor": "floor", "completion": "llama-completion"}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    raw: list[str] = []
    runs: list[dict[str, tuple[float, float]]] = []
    order = list(argvs)
    for rep in range(args.reps):
        sides = order[rep % 3 :] + order[: rep % 3]  # each side goes first in turn
        result: dict[str, tuple[float, float, str]] = {}
        for side in sides:
            wall, peak, out, _ = run_measured(argvs[side], env)
            result[side] = (wall, peak, out)
        replies = {side: result[side][2].strip() for side in sides}
        if len(set(replies.values())) != 1:
            sys.exit(f"round {rep + 1}: the replies differ: {replies!r}")
        runs.append({side: result[side][:2] for side in sides})
        line = f"round {rep + 1} ({', '.join(names[s] for s in sides)}): " + ", ".join(
            f"{names[s]} {result[s][0]:.3f} s {result[s][1]:.1f} MiB" for s in order
        )
        raw.append(line + ", replies equal")
        print(line, file=sys.stderr, flush=True)

    def ratio(top: str, bottom: str, index: int, target: str = "") -> str:
        values = [run[top][index] / run[bottom][index] for run in runs]
        return (
            f"{names[top]} / {names[bottom]} median {statistics.median(values):.3f} "
            f"({min(values):.3f}-{max(values):.3f}){f' (target <= {target})' if target else ''}"
        )

    def medians(index: int, unit: str) -> str:
        return ", ".join(f"{names[s]} {statistics.median(run[s][index] for run in runs):.3f} {unit}" for s in order)

    def over(top: str, bottom: str, target: str = "") -> str:
        values = [run[top][1] - run[bottom][1] for run in runs]
        return (
            f"{names[top]} - {names[bottom]} median {statistics.median(values):+.1f} MiB "
            f"({min(values):+.1f} to {max(values):+.1f}){f' (target <= {target} MiB)' if target else ''}"
        )

    summary = [
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {threads} threads; flash attention {flash_attn} "
        f"(ask's auto); ctx {CTX}, batch {BATCH}, {args.tokens} tokens greedy, repeat penalty off on all sides; "
        f"{len(runs)} rounds, each side first in turn",
        f"wall medians: {medians(0, 's')}",
        f"wall: {ratio('ask', 'completion', 0, '1.10')}; {ratio('floor', 'completion', 0)}; {ratio('ask', 'floor', 0)}",
        f"peak RSS medians: {medians(1, 'MiB')}",
        f"peak RSS: {over('ask', 'completion', '+24')}; {over('floor', 'completion')}; {over('ask', 'floor')}",
        f"peak RSS ratios: {ratio('ask', 'completion', 1)}; {ratio('floor', 'completion', 1)}; "
        f"{ratio('ask', 'floor', 1)}",
    ]
    print("\n".join(summary))
    write_report(
        args.out,
        "One-shot ask vs llama-completion (bench/oneshot_vs_completion.py)",
        started,
        load_before,
        f"Model: {model}. llama-completion: {args.completion}.",
        summary,
        raw,
    )


if __name__ == "__main__":
    main()
