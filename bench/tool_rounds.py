"""What tools cost: the lazy call grammar before its trigger, and the second round's TTFT.

1. The gate before the trigger. With `--tool-choice auto` and a native call format, the call
   grammar waits for the family's start marker (`<tool_call>` for Hermes/Qwen) and constrains
   nothing before it. In one process, the same prepared prompt (the tools rendered by the upstream
   Qwen2.5 template, SmolLM2 as the model) is decoded with that lazy gate and without any grammar,
   alternating, greedy: the replies must be equal (the model never reached the trigger), and the
   ratio of decode tok/s (gated / free) is the gate's cost. Target: >= 0.97 (cost <= 3%).
2. The second round's TTFT. `ask --json` with a forced call (`--tool-choice NAME`,
   `--approve-tools`): the first round prefills the whole prompt, the second only the call and
   its result over the reused KV prefix. Reported per run from the record's `stats.rounds`: both
   TTFTs, their ratio, and the share of the second round's prompt that came from the cache.

Medians over the rounds with the min-max spread; every run is in the results file.

    python bench/tool_rounds.py [--reps 5] [--tokens 96] [--out bench/results/tool_rounds.md]
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
from dataclasses import replace
from pathlib import Path

from report import write_report

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "tests" / "data" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
FUNCTIONS = '''
def get_weather(city: str) -> str:
    """The weather in a city today."""
    return f"Sunny and 21 degrees in {city}."
'''
FREE_PROMPT = "Write a detailed essay on the history of Rome."
CALL_PROMPT = "What is the weather in Paris?"


def decode_rate(outcome) -> float:
    first, last = outcome.t_first_token, outcome.t_last_token
    if first is None or last is None or last <= first or outcome.generated_tokens < 2:
        return 0.0
    return (outcome.generated_tokens - 1) / (last - first)


def gate_cost(functions: Path, model: str, reps: int, tokens: int, raw: list[str]) -> list[float]:
    from llmchat.config import load_config
    from llmchat.options import RunOptions
    from llmchat.startup.loading import start_session
    from llmchat.tools.offer import ToolIO, make_offer
    from llmchat.tools.registry import gather_tools

    opts = RunOptions(model=model, template=str(TEMPLATE), temperature=0.0, seed=1, max_tokens=tokens, loop_stop=False)
    session = start_session(opts, config=load_config(), overflow="error", with_history=False)
    toolset = gather_tools(load_config(), (), (str(functions),), ())
    try:
        io = ToolIO(show_call=lambda _: None, notice=lambda line: print(line, file=sys.stderr))
        offer = make_offer(session, toolset.specs(), io, tool_choice="auto")
        session.use_tools(offer)
        prepared = session.prepare(FREE_PROMPT)
        prepared.tool_grammar = offer.grammar(list(offer.specs), False, lazy=True)
        prepared.tool_trigger = offer.family.triggers[0]
        gated = session.request_for(prepared)
        assert gated.grammar is not None, "the lazy call grammar is not in the request"
        free = replace(gated, grammar=None, grammar_after=None, grammar_from_trigger=False)
        # One run of each first, not counted: the first decode after a load is slower (warm-up).
        for request in (gated, free):
            "".join(event.text for event in session.engine.generate(request))
        ratios = []
        for rep in range(reps):
            order = ("gated", "free") if rep % 2 == 0 else ("free", "gated")
            rate: dict[str, float] = {}
            text: dict[str, str] = {}
            for side in order:
                # bench-only: forget the cached prompt, so every run prefills it in full (a prompt
                # reused from the cache is evaluated differently enough to tip a greedy near-tie)
                session.engine.model.clear()
                generation = session.engine.generate(gated if side == "gated" else free)
                text[side] = "".join(event.text for event in generation)
                rate[side] = decode_rate(generation.outcome)
            if text["gated"] != text["free"]:
                sys.exit(f"rep {rep + 1}: the gated reply differs (the trigger fired?): {text['gated'][:120]!r}")
            ratios.append(rate["gated"] / rate["free"])
            line = (
                f"gate rep {rep + 1} ({' first, '.join(order)} second): gated {rate['gated']:.1f} tok/s, "
                f"free {rate['free']:.1f} tok/s, ratio {ratios[-1]:.3f}, replies equal"
            )
            raw.append(line)
            print(line, file=sys.stderr, flush=True)
        return ratios
    finally:
        toolset.close()
        session.close()


def second_round(functions: Path, model: str, reps: int, raw: list[str]) -> list[dict]:
    argv = [
        sys.executable, "-m", "llmchat", "ask", "--json", "--no-history", "-m", model, "--template", str(TEMPLATE),
        "--functions", str(functions), "--tool-choice", "get_weather", "--approve-tools", "--temperature", "0",
        "--seed", "1", "-n", "48", CALL_PROMPT,
    ]  # fmt: skip
    runs = []
    for rep in range(reps):
        record = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
        rounds = record["stats"]["rounds"]
        if len(rounds) < 2 or not record["tool_calls"]:
            sys.exit(f"run {rep + 1}: no second round: {record['stats']}")
        first, second = rounds[0], rounds[1]
        run = {
            "ttft1": first["ttft_s"],
            "ttft2": second["ttft_s"],
            "prompt1": first["prompt_tokens"],
            "prompt2": second["prompt_tokens"],
            "cached2": second["cached_tokens"],
        }
        runs.append(run)
        line = (
            f"call run {rep + 1}: round 1 TTFT {run['ttft1'] * 1000:.0f} ms over {run['prompt1']} prompt tokens; round 2 "
            f"TTFT {run['ttft2'] * 1000:.0f} ms, {run['cached2']} of {run['prompt2']} prompt tokens from the cache"
        )
        raw.append(line)
        print(line, file=sys.stderr, flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "tool_rounds.md")
    args = parser.parse_args()

    from llmchat.engine import physical_cores
    from llmchat.models.resolve import bundled_default_model

    model = str(bundled_default_model())
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    raw: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["LLMCHAT_HOME"] = str(Path(tmp) / "home")
        functions = Path(tmp) / "weather.py"
        functions.write_text(FUNCTIONS)
        ratios = gate_cost(functions, model, args.reps, args.tokens, raw)
        runs = second_round(functions, model, args.reps, raw)
    ttft_ratios = [r["ttft2"] / r["ttft1"] for r in runs]
    shares = [r["cached2"] / r["prompt2"] for r in runs]
    summary = [
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {physical_cores()} threads; SmolLM2 with the Qwen2.5 "
        f"template (Hermes-style `<tool_call>`), greedy",
        f"lazy call grammar before its trigger, decode tok/s gated / free: median {statistics.median(ratios):.3f} "
        f"({min(ratios):.3f}-{max(ratios):.3f}) over {len(ratios)} alternating reps of {args.tokens} tokens (target >= 0.97)",
        f"second round TTFT / first round TTFT: median {statistics.median(ttft_ratios):.3f} "
        f"({min(ttft_ratios):.3f}-{max(ttft_ratios):.3f}); medians {statistics.median(r['ttft2'] for r in runs) * 1000:.0f} "
        f"vs {statistics.median(r['ttft1'] for r in runs) * 1000:.0f} ms; second round's prompt from the cache: "
        f"{min(shares):.1%}-{max(shares):.1%}",
    ]
    print("\n".join(summary))
    write_report(args.out, "Tool rounds (bench/tool_rounds.py)", started, load_before, f"Model: {model}.", summary, raw)


if __name__ == "__main__":
    main()
