#!/usr/bin/env python3
"""The prefill that lazily offered tools save: tokens of the first prompt, eager vs lazy.

    python bench/lazy_tools.py [--everything PATH] [--count 200] [--out bench/results/lazy_tools.json]

For each server (`@modelcontextprotocol/server-everything`, from the tests' npm cache unless
--everything names its binary; and bench/many_tools_server.py with --count generated tools) and
each template (SmolLM2's own, whose tools go in the system message, the generic format; and
Qwen 2.5's, Hermes `<tools>` block, from tests/data/templates), with SmolLM2's tokenizer:
- eager: the tokens of the first prompt ("Hello", no system prompt) with every tool offered;
- lazy: the same prompt with the tools offered lazily (load_tool and the names);
- after one load: the prompt once the model loaded the first tool, and how many of its tokens
  must be prefilled again (those after the prefix it shares with the lazy prompt: the one break
  of the KV reuse a load costs).
Token counts, not time: the machine's load does not change them. Everything counted goes to the
results file as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

from llmchat.engine.driver import common_prefix

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = {
    "smollm2 (own, generic)": None,
    "qwen2.5 (hermes)": ROOT / "tests/data/templates/Qwen-Qwen2.5-7B-Instruct.jinja",
}
MESSAGES = [{"role": "user", "content": "Hello"}]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure(session, specs, label: str, template: str) -> dict:
    from llmchat.tools.offer import ToolIO, make_offer

    io = ToolIO(show_call=lambda text: None, notice=lambda line: None)

    def first_prompt(lazy_share: float | None):
        offer = make_offer(session, specs, io, lazy_share=lazy_share)
        session.use_tools(offer)
        return offer, list(session.tokenize_messages(MESSAGES))

    _, eager = first_prompt(None)
    offer, lazy = first_prompt(0.0)  # 0: lazy whatever they cost
    assert offer.lazily
    first = next(iter(offer.catalog))
    offer.load(first)
    loaded = list(session.tokenize_messages(MESSAGES))
    kept = common_prefix(lazy, loaded)
    session.use_tools(None)
    return {
        "server": label,
        "template": template,
        "tools": len(specs),
        "eager_tokens": len(eager),
        "lazy_tokens": len(lazy),
        "saved_tokens": len(eager) - len(lazy),
        "saved_share": round(1 - len(lazy) / len(eager), 4),
        "loaded_tool": first,
        "after_one_load_tokens": len(loaded),
        "kept_after_load": kept,
        "prefilled_again_after_load": len(loaded) - kept,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--everything", default=None, help="the mcp-server-everything binary")
    parser.add_argument("--count", type=int, default=200, help="tools of the generated server")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/lazy_tools.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from mcp_servers import npm_cache_root

    from llmchat.config import load_config
    from llmchat.models.resolve import bundled_default_model
    from llmchat.options import RunOptions
    from llmchat.startup.loading import start_session
    from llmchat.tools.mcp.config import parse_mcp_spec
    from llmchat.tools.mcp.connection import McpConnection

    everything = args.everything or str(npm_cache_root(Path.home()) / "node_modules/.bin/mcp-server-everything")
    servers = {
        "server-everything": everything,
        f"generated ({args.count} tools)": f"{sys.executable} {ROOT / 'bench/many_tools_server.py'} {args.count}",
    }
    model = bundled_default_model()
    rows = []
    for label, spec in servers.items():
        with McpConnection(parse_mcp_spec(spec)) as server:
            specs = list(server.tools)
            for template, path in TEMPLATES.items():
                options = RunOptions(model=str(model), ctx=8192, template=str(path) if path else None, max_tokens=16)
                session = start_session(options, config=load_config(), overflow="error", with_history=False)
                try:
                    rows.append(measure(session, specs, label, template))
                finally:
                    session.close()
                print(json.dumps(rows[-1]), file=sys.stderr)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{cpu_name()}, {platform.system()} {platform.machine()}",
        "tokenizer": model.name,
        "prompt": MESSAGES,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for row in rows:
        print(
            f"{row['server']:<24} {row['template']:<24} eager {row['eager_tokens']:>7,}  lazy {row['lazy_tokens']:>6,}"
            f"  saved {row['saved_tokens']:>7,} ({row['saved_share']:.1%})"
            f"  after a load +{row['prefilled_again_after_load']:,} prefilled again"
        )


if __name__ == "__main__":
    main()
