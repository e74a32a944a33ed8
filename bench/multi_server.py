"""`llmchat batch` over two llama-servers against one: throughput, and where the items went.

Two llama-servers on 127.0.0.1 (tests/servers/harness.py), the same model (SmolLM2), one thread
and one slot (`-np 1`) each, started once. Rounds alternate the order of the two runs (one server,
two servers; then two, one; ...) so that machine noise hits both alike. Each run is the whole
`llmchat batch` command as a user runs it (`--server A` vs `--server A --server B`), greedy, the
same items; throughput = generated tokens / wall seconds of the command (its start-up included,
which the two-server run pays the same as the one-server run). Each server's own count of
predicted tokens (`/metrics`, `llamacpp:tokens_predicted_total`) shows how the items were split.
The replies of the two runs are compared too (greedy: they should be equal).

    python bench/multi_server.py [--rounds 5] [--items 16] [--tokens 64] [--out bench/results/multi_server.md]
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
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from servers import harness  # noqa: E402

TOPICS = [
    "bicycles", "honey bees", "lighthouses", "rain", "volcanoes", "glaciers", "owls", "bridges",
    "tea", "comets", "deserts", "violins", "maps", "salmon", "clocks", "forests",
]  # fmt: skip


def predicted_total(server: harness.ServerProcess) -> float:
    import httpx

    for line in httpx.get(server.url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("llamacpp:tokens_predicted_total"):
            return float(line.split()[-1])
    return float("nan")


def run_batch(items: Path, out: Path, urls: list[str], tokens: int) -> dict:
    servers = [arg for url in urls for arg in ("--server", url)]
    argv = [sys.executable, "-m", "llmchat", "batch", str(items), "-o", str(out), *servers,
            "--temp", "0", "--seed", "1", "-n", str(tokens), "--progress", "json"]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ))
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"batch failed ({done.returncode}): {done.stderr[-2000:]}")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    generated = sum(r["stats"]["generated_tokens"] for r in records)
    final = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{") and '"final"' in line]
    batch_s = final[-1]["elapsed_s"] if final else float("nan")
    return {
        "servers": len(urls),
        "wall_s": round(wall, 3),
        "batch_s": batch_s,  # the batch's own time (from its final progress line): start-up and connect left out
        "generated_tokens": generated,
        "tok_s": round(generated / wall, 2),
        "batch_tok_s": round(generated / batch_s, 2),
        "replies": [r["reply"] for r in records],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("bench/results/multi_server.md"))
    args = parser.parse_args()
    from llmchat.models.resolve import bundled_default_model

    model = bundled_default_model()
    assert model is not None
    folder = Path(tempfile.mkdtemp(prefix="multi-server-bench-"))
    items = folder / "items.jsonl"
    items.write_text(
        "".join(
            json.dumps({"id": i, "prompt": f"Write three sentences about {TOPICS[i % len(TOPICS)]}."}) + "\n"
            for i in range(args.items)
        )
    )
    started = datetime.now(timezone.utc)
    load_before = os.getloadavg()
    servers = [
        # No host-memory prompt cache: a later round would find whole prompts cached on one server.
        harness.start_llama_server(model, folder, slots=1, ctx=2048, threads=1, extra=["--metrics", "--cache-ram", "0"])
        for _ in range(2)
    ]
    runs: list[dict] = []
    try:
        urls = [s.url for s in servers]
        run_batch(items, folder / "warm.jsonl", urls, 8)  # warm both servers (model pages, the template prefix)
        for number in range(args.rounds):
            order = [1, 2] if number % 2 == 0 else [2, 1]
            for count in order:
                before = [predicted_total(s) for s in servers]
                result = run_batch(items, folder / f"out-{number}-{count}.jsonl", urls[:count], args.tokens)
                result["predicted_per_server"] = [predicted_total(s) - b for s, b in zip(servers, before)]
                result["round"] = number
                runs.append(result)
                print(json.dumps({k: v for k, v in result.items() if k != "replies"}), flush=True)
    finally:
        for server in servers:
            server.stop()
    one = [r["tok_s"] for r in runs if r["servers"] == 1]
    two = [r["tok_s"] for r in runs if r["servers"] == 2]
    per_round = [
        next(r["tok_s"] for r in runs if r["round"] == n and r["servers"] == 2)
        / next(r["tok_s"] for r in runs if r["round"] == n and r["servers"] == 1)
        for n in range(args.rounds)
    ]
    reference = next(r["replies"] for r in runs if r["servers"] == 1)
    summary = {
        "started_utc": started.isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "items": args.items,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "one_server_tok_s_median": statistics.median(one),
        "two_servers_tok_s_median": statistics.median(two),
        "ratio_of_medians": round(statistics.median(two) / statistics.median(one), 3),
        "ratio_per_round": [round(x, 3) for x in per_round],
        "ratio_per_round_median": round(statistics.median(per_round), 3),
        "ratio_per_round_min_max": [round(min(per_round), 3), round(max(per_round), 3)],
        "batch_time_only_ratio_of_medians": round(
            statistics.median(r["batch_tok_s"] for r in runs if r["servers"] == 2)
            / statistics.median(r["batch_tok_s"] for r in runs if r["servers"] == 1),
            3,
        ),
        "replies_equal_to_first_one_server_run": [r["replies"] == reference for r in runs],
    }
    print(json.dumps(summary, indent=2))
    raw = [{k: v for k, v in r.items() if k != "replies"} for r in runs]
    text = (
        "# batch over two llama-servers vs one (issue 25, item 5)\n\n"
        "Raw output of `python bench/multi_server.py "
        f"--rounds {args.rounds} --items {args.items} --tokens {args.tokens}`: SmolLM2-135M-Instruct Q4_1, "
        "two llama-servers (tests/servers/build.sh) with `-t 1 -np 1 -c 2048` each on 127.0.0.1, greedy. "
        "Throughput = generated tokens / wall time of the whole `llmchat batch` command "
        "(`tok_s`; `batch_tok_s` leaves out start-up and connecting); rounds alternate the order of the two runs.\n\n"
        "## Summary\n\n```json\n" + json.dumps(summary, indent=2) + "\n```\n\n"
        "## Runs\n\n```json\n" + "\n".join(json.dumps(r) for r in raw) + "\n```\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
