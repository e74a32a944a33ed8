"""`llmchat batch`: --parallel 4 against --parallel 1, and batch against a shell loop of `llmchat ask`.

In one run, on the same 64 prompts (128 generated tokens each, greedy):
1. `llmchat batch --parallel 1` and `--parallel 4`: aggregate tokens/s (generated tokens over the
   generation time from the summary line, so the one model load is left out; the wall time is
   reported too). Decode = generated tokens / time; overall = (prompt tokens evaluated + generated)
   / time, the two numbers llama-batched-bench reports (S_TG and S).
2. Determinism: every item's greedy reply at --parallel 4 against --parallel 1; the items that
   differ, and the token where they part.
3. `llmchat batch` against a shell loop of `llmchat ask` on the first 8 items: seconds per item,
   each measured as the wall time of the whole command (model loads included: that is what a user
   waits for). The ask replies are also compared with the batch replies (same code path).
4. llama.cpp's own `llama-batched-bench` (if built: LLAMA_BATCHED_BENCH or
   /tmp/llama.cpp-build/bin/llama-batched-bench) at 64 prompt / 64 generated tokens, 1 and 4
   sequences, for the gain llama.cpp itself gets on this machine.

    python bench/batch_bench.py [--items 64] [--tokens 128] [--ask-items 8] [-m MODEL] [--out bench/results/batch.md]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

TOPICS = [
    "the history of the bicycle",
    "how bees make honey",
    "a lighthouse keeper",
    "the water cycle",
    "volcanoes",
    "a robot learning to paint",
    "the first winter on Mars",
    "how bread rises",
    "an old library",
    "the moon landing",
    "a city under the sea",
    "the life of a tree",
    "a lost dog finding home",
    "the invention of paper",
    "thunderstorms",
    "a chess tournament",
    "how trains changed travel",
    "the Amazon rainforest",
    "a friendly dragon",
    "the printing press",
    "a day in ancient Rome",
    "coral reefs",
    "a time traveller",
    "the northern lights",
    "a mountain village",
    "how computers work",
    "the Silk Road",
    "a detective in Paris",
    "the deep ocean",
    "a festival of lights",
    "migrating birds",
    "a small bakery",
]
TASKS = [
    "Write a long, detailed story about {topic}. Describe the places, the people and what happens, step by step.",
    "Write a detailed essay about {topic}. Explain the background, the important details and why it matters today.",
]


def make_items(count: int) -> list[dict]:
    items = []
    for i in range(count):
        topic = TOPICS[i % len(TOPICS)]
        task = TASKS[(i // len(TOPICS)) % len(TASKS)]
        items.append({"id": i + 1, "prompt": task.format(topic=topic)})
    return items


LAST_SHARE = {"value": 0.0}


def run(cmd: list[str], stdin: str | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """Run a command; LAST_SHARE is the CPU time it got per second of wall time (cores it had).

    On a machine shared with other jobs this tells a clean run (about `threads` cores) from a run
    that was starved, whatever the load average says."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # Never inherit stdin: `llmchat ask` reads a piped stdin as part of the prompt.
    proc = subprocess.run(cmd, input=stdin if stdin is not None else "", capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    LAST_SHARE["value"] = cpu / elapsed if elapsed > 0 else 0.0
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {shlex.join(cmd)}\n{proc.stderr[-2000:]}")
    return elapsed, proc


def wait_quiet(max_load: float, max_wait_s: float) -> float:
    """Wait (up to max_wait_s) until the 1-minute load average is below max_load; returns it."""
    deadline = time.monotonic() + max_wait_s
    while True:
        load = os.getloadavg()[0]
        if load < max_load or time.monotonic() >= deadline:
            return load
        time.sleep(10)


def timed_step(label: str, fn, clean_share: float, key: str) -> dict | None:
    print(f"  {label} ...", file=sys.stderr, end=" ", flush=True)
    result = fn()
    if result is None:
        print("failed", file=sys.stderr)
        return None
    result["share"] = LAST_SHARE["value"]
    result["clean"] = result["share"] >= clean_share
    print(f"{result[key]:.2f} ({key}), CPU share {result['share']:.2f}", file=sys.stderr)
    return result


SUMMARY = re.compile(r"in ([0-9.]+) s, ([0-9.]+) items/s, ([0-9.]+) tok/s")


def batch_run(items_path: Path, parallel: int, tokens: int, model_args: list[str], threads: int) -> dict:
    out = items_path.with_name(f"out-p{parallel}.jsonl")
    cmd = [
        sys.executable,
        "-m",
        "llmchat",
        "batch",
        str(items_path),
        "-o",
        str(out),
        "--parallel",
        str(parallel),
        "--max-tokens",
        str(tokens),
        "--temperature",
        "0",
        "--seed",
        "1",
        "--threads",
        str(threads),
        "--ctx",
        "2048",
        "--progress",
        "lines",
        *model_args,
    ]
    wall, proc = run(cmd)
    match = SUMMARY.search(proc.stderr.strip().splitlines()[-1])
    gen_time = float(match.group(1)) if match else wall
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["error"] is None for r in records), [r for r in records if r["error"]][:1]
    generated = sum(r["stats"]["generated_tokens"] for r in records)
    prompt = sum(r["stats"]["prompt_tokens"] for r in records)
    evaluated = sum(r["stats"]["prefill_tokens"] for r in records)
    return {
        "parallel": parallel,
        "wall_s": wall,
        "gen_s": gen_time,
        "items": len(records),
        "generated": generated,
        "prompt_tokens": prompt,
        "prompt_evaluated": evaluated,
        "decode_tok_s": generated / gen_time,
        "overall_tok_s": (evaluated + generated) / gen_time,
        "per_item_s": wall / len(records),
        "items_s": len(records) / wall,
        "records": records,
    }


def ask_loop(items: list[dict], tokens: int, model_args: list[str], threads: int) -> dict:
    """A plain shell loop, as a user would write it."""
    script = "\n".join(
        shlex.join(
            [
                sys.executable,
                "-m",
                "llmchat",
                "ask",
                "--json",
                "--no-history",
                "--max-tokens",
                str(tokens),
                "--temperature",
                "0",
                "--seed",
                "1",
                "--threads",
                str(threads),
                "--ctx",
                "2048",
                *model_args,
                item["prompt"],
            ]
        )
        for item in items
    )
    wall, proc = run(["bash", "-c", script])
    replies = [json.loads(line)["reply"] for line in proc.stdout.splitlines() if line.strip()]
    return {
        "wall_s": wall,
        "items": len(items),
        "per_item_s": wall / len(items),
        "items_s": len(items) / wall,
        "replies": replies,
    }


def batched_bench(binary: Path, model: str, threads: int, unified: bool) -> dict | None:
    cmd = [
        str(binary),
        "-m",
        model,
        "-c",
        "2048",
        "-b",
        "512",
        "-ub",
        "512",
        "-npp",
        "64",
        "-ntg",
        "64",
        "-npl",
        "1,4",
        "-t",
        str(threads),
        "-kvu" if unified else "-no-kvu",
    ]
    try:
        _, proc = run(cmd)
    except (OSError, SystemExit):
        return None
    rows = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and cells[0].isdigit():
            # PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s
            rows[int(cells[2])] = {"S_PP": float(cells[5]), "S_TG": float(cells[7]), "S": float(cells[9])}
    if 1 not in rows or 4 not in rows:
        return None
    return {
        "rows": rows,
        "cmd": shlex.join(cmd),
        "tg_gain": rows[4]["S_TG"] / rows[1]["S_TG"],
        "s_gain": rows[4]["S"] / rows[1]["S"],
        "score": rows[4]["S_TG"] + rows[1]["S_TG"],
    }


def share(result: dict) -> str:
    return f"{result.get('share', 0):.2f}" + ("" if result.get("clean", True) else " *starved*")


def first_difference(a: list, b: list) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--ask-items", type=int, default=8)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="run every configuration this many times, interleaved")
    parser.add_argument(
        "--max-load",
        type=float,
        default=1.0,
        help="wait for the 1-minute load average to drop below this before each round",
    )
    parser.add_argument(
        "--max-wait", type=float, default=600, help="wait at most this many seconds for a quiet machine"
    )
    parser.add_argument("-m", "--model")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "batch.md")
    args = parser.parse_args()

    from llmchat.engine import physical_cores
    from llmchat.models.resolve import bundled_default_model

    model = args.model or str(bundled_default_model())
    model_args = ["-m", model]
    threads = physical_cores()
    items = make_items(args.items)
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpu = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), "?")
    load_before = os.getloadavg()

    with tempfile.TemporaryDirectory() as tmp:
        items_path = Path(tmp) / "items.jsonl"
        items_path.write_text("".join(json.dumps(item) + "\n" for item in items))
        env_home = Path(tmp) / "home"
        os.environ["LLMCHAT_HOME"] = str(env_home)
        subset = items[: args.ask_items]
        subset_path = Path(tmp) / "subset.jsonl"
        subset_path.write_text("".join(json.dumps(item) + "\n" for item in subset))
        binary = Path(os.environ.get("LLAMA_BATCHED_BENCH", "/tmp/llama.cpp-build/bin/llama-batched-bench"))
        # This machine's speed drifts by +-20% over minutes (other jobs, the hypervisor), so every
        # configuration runs once per round, back to back, and rounds repeat: ratios are taken within
        # a round, and each configuration's best run stands for it (contention only slows runs down).
        # A run that got less CPU than its threads (CPU share) was starved by other jobs and is marked.
        rounds = []
        for number in range(1, args.rounds + 1):
            load = wait_quiet(args.max_load, args.max_wait)
            print(f"round {number}/{args.rounds} (load {load:.2f})", file=sys.stderr)
            got = {}
            for parallel in (1, args.parallel):
                got[f"p{parallel}"] = timed_step(
                    f"batch --parallel {parallel}, {len(items)} items",
                    lambda parallel=parallel: batch_run(items_path, parallel, args.tokens, model_args, threads),
                    0.9 * threads,
                    "decode_tok_s",
                )
            if binary.is_file():
                for unified in (True, False):
                    got["bb_unified" if unified else "bb_split"] = timed_step(
                        f"llama-batched-bench ({'unified' if unified else 'split'} KV)",
                        lambda unified=unified: batched_bench(binary, model, threads, unified),
                        0.9 * threads,
                        "tg_gain",
                    )
            # Python start-up and the model load run on one core: a clean ask loop gets less than `threads`.
            got["ask"] = timed_step(
                f"shell loop of llmchat ask, {len(subset)} items",
                lambda: ask_loop(subset, args.tokens, model_args, threads),
                0.6 * threads,
                "items_s",
            )
            for parallel in (1, args.parallel):
                got[f"sub_p{parallel}"] = timed_step(
                    f"batch --parallel {parallel}, the same {len(subset)} items",
                    lambda parallel=parallel: batch_run(subset_path, parallel, args.tokens, model_args, threads),
                    0.7 * threads,
                    "items_s",
                )
            rounds.append(got)

    def best(name: str, key: str) -> dict:
        runs = [r[name] for r in rounds if r.get(name)]
        clean = [run for run in runs if run["clean"]] or runs
        return max(clean, key=lambda run: run[key])

    serial, par = best("p1", "decode_tok_s"), best(f"p{args.parallel}", "decode_tok_s")
    asked, sub_serial, sub_par = (
        best("ask", "items_s"),
        best("sub_p1", "items_s"),
        best(f"sub_p{args.parallel}", "items_s"),
    )
    reference = {}
    for unified in (True, False):
        name = "bb_unified" if unified else "bb_split"
        if any(r.get(name) for r in rounds):
            reference[unified] = best(name, "score")
    load_after = os.getloadavg()

    # Determinism.
    diffs = []
    for a, b in zip(serial["records"], par["records"]):
        if a["reply"] != b["reply"]:
            diffs.append((a["id"], first_difference(a["reply"], b["reply"])))
    ask_same = sum(r == rec["reply"] for r, rec in zip(asked["replies"], sub_serial["records"]))

    p = args.parallel
    decode_gain = par["decode_tok_s"] / serial["decode_tok_s"]
    overall_gain = par["overall_tok_s"] / serial["overall_tok_s"]
    paired = [r[f"p{p}"]["decode_tok_s"] / r["p1"]["decode_tok_s"] for r in rounds if r.get("p1") and r.get(f"p{p}")]
    paired_overall = [
        r[f"p{p}"]["overall_tok_s"] / r["p1"]["overall_tok_s"] for r in rounds if r.get("p1") and r.get(f"p{p}")
    ]
    lines = [
        "# `llmchat batch` benchmark",
        "",
        f"- Date: {datetime.now().strftime('%Y-%m-%d %H:%M')}",
        f"- Machine: {cpu}, {os.cpu_count()} CPUs, {threads} threads used (lscpu) "
        f"(load average {load_before[0]:.2f} at the start, {load_after[0]:.2f} at the end)",
        f"- Model: {Path(model).name}",
        f"- Workload: {len(items)} prompts (chat template included: {serial['prompt_tokens'] / len(items):.0f} prompt tokens on average), "
        f"max {args.tokens} generated tokens each, greedy (--temperature 0 --seed 1), --ctx 2048",
        f"- Command: `python bench/batch_bench.py --items {args.items} --tokens {args.tokens} --ask-items {args.ask_items} --rounds {args.rounds}`",
        f"- Method: {args.rounds} rounds; in each round every configuration runs once, back to back. Ratios are taken within a "
        "round (same machine state); the tables show each configuration's best run. CPU share = CPU seconds per wall "
        "second the command got; *starved* = less than its threads (other jobs were running).",
        "",
        f"## --parallel {p} vs --parallel 1",
        "",
        "Times exclude the model load (from the summary line); generated tok/s = generated tokens / time; overall = "
        "(prompt tokens evaluated + generated) / time, as llama-batched-bench's S.",
        "",
        "| run | time s | generated | prompt evaluated (of total) | generated tok/s | overall tok/s | wall s (with load) | CPU share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in (serial, par):
        lines.append(
            f"| --parallel {r['parallel']} | {r['gen_s']:.1f} | {r['generated']} | {r['prompt_evaluated']} ({r['prompt_tokens']}) | "
            f"{r['decode_tok_s']:.1f} | {r['overall_tok_s']:.1f} | {r['wall_s']:.1f} | {share(r)} |"
        )
    lines += [
        "",
        f"Gain at {p} vs 1, best runs: **generated {decode_gain:.2f}x, overall {overall_gain:.2f}x**; "
        f"within each round: {', '.join(f'{g:.2f}x' for g in paired)} (median {statistics.median(paired):.2f}x; "
        f"overall median {statistics.median(paired_overall):.2f}x).",
        "",
    ]
    if reference:
        lines += [
            "llama.cpp's own `llama-batched-bench` on this machine, 64 prompt + 64 generated tokens per sequence, "
            "no shared prompt, 1 and 4 sequences (best run of each KV layout):",
            "",
            "| KV layout | B | S_PP t/s | S_TG t/s | S t/s | S_TG gain 4 vs 1 | S gain 4 vs 1 | CPU share |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for unified, ref in reference.items():
            rows = ref["rows"]
            for b in (1, 4):
                lines.append(
                    f"| {'unified' if unified else 'split'} | {b} | {rows[b]['S_PP']:.1f} | {rows[b]['S_TG']:.1f} | {rows[b]['S']:.1f} | "
                    + (f"{ref['tg_gain']:.2f}x | {ref['s_gain']:.2f}x | {share(ref)} |" if b == 4 else " | | |")
                )
        ref_runs = [r["bb_split"] for r in rounds if r.get("bb_split")]
        if ref_runs:
            tg = statistics.median(run["tg_gain"] for run in ref_runs)
            sg = statistics.median(run["s_gain"] for run in ref_runs)
            ours, ours_overall = statistics.median(paired), statistics.median(paired_overall)
            tg_list = ", ".join(f"{run['tg_gain']:.2f}x" for run in ref_runs)
            s_list = ", ".join(f"{run['s_gain']:.2f}x" for run in ref_runs)
            lines += [
                "",
                f"Round by round, llama-batched-bench (split KV, one stream per sequence: the layout llmchat uses) gained "
                f"{tg_list} in S_TG (median {tg:.2f}x) and "
                f"{s_list} in S (median {sg:.2f}x).",
                "",
                f"**llmchat's gain as a share of llama.cpp's (medians):** generated {ours:.2f}x / {tg:.2f}x = **{ours / tg:.0%}** "
                f"of the ratio ({(ours - 1) / (tg - 1) if tg > 1 else float('nan'):.0%} of the gain above 1x); overall "
                f"{ours_overall:.2f}x / {sg:.2f}x = **{ours_overall / sg:.0%}** "
                f"({(ours_overall - 1) / (sg - 1) if sg > 1 else float('nan'):.0%} of the gain above 1x).",
                "",
            ]
    lines += [
        f"## `llmchat batch` vs a shell loop of `llmchat ask` ({len(subset)} items; wall time of the whole commands, model loads included)",
        "",
        "| run | wall s | s per item | speed-up per item vs the ask loop | CPU share |",
        "|---|---|---|---|---|",
        f"| shell loop of `llmchat ask --json` | {asked['wall_s']:.1f} | {asked['per_item_s']:.2f} | 1.00x | {share(asked)} |",
        f"| `llmchat batch --parallel 1` | {sub_serial['wall_s']:.1f} | {sub_serial['per_item_s']:.2f} | {asked['per_item_s'] / sub_serial['per_item_s']:.2f}x | {share(sub_serial)} |",
        f"| `llmchat batch --parallel {p}` | {sub_par['wall_s']:.1f} | {sub_par['per_item_s']:.2f} | {asked['per_item_s'] / sub_par['per_item_s']:.2f}x | {share(sub_par)} |",
        f"| `llmchat batch --parallel 1`, all {len(items)} items | {serial['wall_s']:.1f} | {serial['per_item_s']:.2f} | {asked['per_item_s'] / serial['per_item_s']:.2f}x | {share(serial)} |",
        f"| `llmchat batch --parallel {p}`, all {len(items)} items | {par['wall_s']:.1f} | {par['per_item_s']:.2f} | {asked['per_item_s'] / par['per_item_s']:.2f}x | {share(par)} |",
        "",
        f"`llmchat ask` and `llmchat batch --parallel 1` gave the same greedy reply for {ask_same} of {len(subset)} items.",
        "",
        f"## Determinism: greedy replies at --parallel {p} vs --parallel 1",
        "",
        f"{len(diffs)} of {len(items)} replies differ"
        + (" (id: first differing character): " + ", ".join(f"{i}: {pos}" for i, pos in diffs) if diffs else "")
        + ".",
        "",
    ]
    lines += [
        "Why they match: with flash attention (llmchat's default) llama.cpp computes a query row the same way whatever "
        "else is in the batch, and `--parallel` gives every sequence its own KV stream, so a sequence's cache cells stay "
        "in position order, as when it runs alone. (In one shared buffer a recycled sequence lands in the holes others "
        "left, out of order, and about half the greedy replies drifted at a near-tie.) The limit: once a sequence holds "
        "more than 256 tokens, a single query row takes llama.cpp's split-KV kernel and several rows do not, so replies "
        "can part at a near-tie after that point (bench/results/engine.md, section 0).",
        "",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
        print(f"written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
