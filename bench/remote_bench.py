"""Remote engines against local: one script, runs alternating so machine noise hits both alike.

1. ask: local engine vs llama-server on 127.0.0.1, same model (SmolLM2), same threads, greedy,
   same prompt: decode tok/s ratio (goal >= 0.95), and client TTFT minus the server's own
   prompt_ms (goal <= 15 ms: the network and HTTP cost of a turn on loopback).
2. a 30-turn chat through the server: cached tokens per turn as a share of the prompt (goal >= 90%).
3. batch against `llama-server -np 4`: 8 items at --parallel 4 vs --parallel 1, generated tok/s.
4. the RPC split: ask through llama-server --rpc over two local rpc-servers vs the plain server.

Both engines are driven through `llmchat.startup.loading.start_session` and `ChatSession.turn`, the road
every command takes; the server's own timings come from `engine.last_outcome.server`.

    python bench/remote_bench.py [--reps 3] [--tokens 96] [--turns 30] [--threads 2] [--skip-rpc]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from servers import harness  # noqa: E402

from llmchat.options import RunOptions  # noqa: E402

PROMPT = "Write a detailed essay about the history of the bicycle, from its invention to today."
CHAT_TURNS = [
    "Tell me one fact about the moon.",
    "And one about the sun?",
    "Which of the two is older?",
    "Summarise our conversation in one line.",
    "Give it a title.",
]


def turn_stats(opts: RunOptions, prompt: str) -> tuple[dict, dict | None]:
    from llmchat.config import load_config
    from llmchat.startup.loading import start_session

    session = start_session(opts, config=load_config(), overflow="error", with_history=False)
    try:
        result = session.turn(prompt, record=False)
        server = getattr(getattr(session.engine, "last_outcome", None), "server", None)
        return result.stats.to_dict(), server
    finally:
        session.close()


def bench_ask(model: Path, url: str, reps: int, tokens: int, threads: int) -> dict:
    common = dict(temperature=0.0, seed=1, max_tokens=tokens)
    local_opts = RunOptions(model=str(model), threads=threads, **common)
    remote_opts = RunOptions(server=(url,), **common)
    local, remote, network = [], [], []
    turn_stats(local_opts, "warm up")
    turn_stats(remote_opts, "warm up")
    for _ in range(reps):
        stats, _ = turn_stats(local_opts, PROMPT)
        local.append(stats["decode_tok_s"])
        stats, server = turn_stats(remote_opts, PROMPT)
        remote.append(stats["decode_tok_s"])
        if server:
            network.append(stats["ttft_s"] * 1000 - server["prompt_ms"])
    return {
        "local_decode_tok_s": statistics.median(local),
        "remote_decode_tok_s": statistics.median(remote),
        "ratio": statistics.median(remote) / statistics.median(local),
        "ttft_minus_server_prompt_ms": statistics.median(network) if network else None,
        "runs": reps,
    }


def bench_chat(url: str, turns: int, tokens: int) -> dict:
    from llmchat.config import load_config
    from llmchat.startup.loading import start_session

    session = start_session(
        RunOptions(server=(url,), temperature=0.0, seed=1, max_tokens=tokens),
        config=load_config(),
        overflow="drop",
        with_history=False,
    )
    shares = []
    try:
        for number in range(turns):
            result = session.turn(CHAT_TURNS[number % len(CHAT_TURNS)], record=False)
            stats = result.stats
            if number:
                shares.append(stats.cached_tokens / stats.prompt_tokens)
    finally:
        session.close()
    return {"turns": turns, "min_cached_share": min(shares), "median_cached_share": statistics.median(shares)}


def bench_batch(url: str, tokens: int) -> dict:
    items = "".join(
        json.dumps({"id": i, "prompt": f"Write two sentences about the number {i}."}) + "\n" for i in range(8)
    )
    rates = {}
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "items.jsonl"
        source.write_text(items)
        for parallel in (1, 4, 1, 4):
            out = Path(folder) / f"out{parallel}.jsonl"
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "llmchat", "batch", str(source), "-o", str(out), "--server", url,
                 "--parallel", str(parallel), "--temp", "0", "-n", str(tokens), "--progress", "off"],
                check=True,
            )  # fmt: skip
            elapsed = time.perf_counter() - start
            generated = sum(json.loads(line)["stats"]["generated_tokens"] for line in out.read_text().splitlines())
            rates.setdefault(parallel, []).append(generated / elapsed)
    return {
        "parallel1_tok_s": statistics.median(rates[1]),
        "parallel4_tok_s": statistics.median(rates[4]),
        "gain": statistics.median(rates[4]) / statistics.median(rates[1]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-rpc", action="store_true")
    args = parser.parse_args()
    from llmchat.models.resolve import bundled_default_model

    model = bundled_default_model()
    assert model is not None
    logs = Path(tempfile.mkdtemp(prefix="remote-bench-"))
    report: dict = {"date": str(date.today()), "machine": platform.processor() or platform.machine()}

    server = harness.start_llama_server(model, logs, slots=1, ctx=4096, threads=args.threads)
    try:
        report["ask"] = bench_ask(model, server.url, args.reps, args.tokens, args.threads)
        report["chat"] = bench_chat(server.url, args.turns, args.tokens)
    finally:
        server.stop()

    server = harness.start_llama_server(model, logs, slots=4, ctx=1024, threads=args.threads)
    try:
        report["batch"] = bench_batch(server.url, 48)
    finally:
        server.stop()

    if not args.skip_rpc:
        rpc = [harness.start_rpc_server(logs), harness.start_rpc_server(logs)]
        plain = split = None
        try:
            endpoints = ",".join(f"127.0.0.1:{r.port}" for r in rpc)
            split = harness.start_llama_server(
                model,
                logs,
                threads=args.threads,
                extra=["--rpc", endpoints, "-ngl", "99", "--tensor-split", "1,1", "-lv", "4"],
            )
            split_stats, _ = turn_stats(
                RunOptions(server=(split.url,), temperature=0.0, seed=1, max_tokens=args.tokens), PROMPT
            )
            split.stop()
            plain = harness.start_llama_server(model, logs, threads=args.threads)
            plain_stats, _ = turn_stats(
                RunOptions(server=(plain.url,), temperature=0.0, seed=1, max_tokens=args.tokens), PROMPT
            )
            report["rpc"] = {
                "split_decode_tok_s": split_stats["decode_tok_s"],
                "plain_decode_tok_s": plain_stats["decode_tok_s"],
            }
        finally:
            for process in [plain, split, *rpc]:
                if process is not None:
                    process.stop()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
