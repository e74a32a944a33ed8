#!/usr/bin/env python3
"""What rendering Markdown while a reply streams costs in decode tokens/s, on SmolLM2.

    python bench/render_cost.py [--rounds 7] [--max-tokens 256] [--threads 1] [--note TEXT]
                                [--out bench/results/render_cost.md]

One engine load; then rounds of two replies to the same prompt (greedy, so both modes decode the
same tokens), in alternating order (plain first in odd rounds, markdown first in even ones) so
that drift in the machine's load hits both alike:
- plain:    `StreamPrinter` writing the text as it comes (`--render plain`, and every pipe);
- markdown: `llmchat.ui.markdown.MarkdownPrinter` (`--render markdown`, the default on a terminal).
Both write to a real pseudo-terminal of 24x80 (a thread drains its other end, as a terminal would),
with the live readout on its bottom row, as `llmchat chat` on a terminal does. Decode tok/s is
the turn's own (TurnStats.decode_tok_s: (generated - 1) / (last token - first token)).

The table gives the median tok/s of each mode over the rounds and the median of the per-round
ratios (markdown / plain). It also gives the time the renderer itself took (the Markdown printer's
`text` calls, timed inside the decode loop), as a share of the reply's decode time: a direct
figure that the machine's noise moves less than the ratio. Everything measured is in the results
file, with the machine (lscpu's model name), the date, and the load average around the run.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import platform
import statistics
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

PROMPT = (
    "Write a short Markdown tutorial about Python lists: a heading, a paragraph, a bulleted list, "
    "a ```python code block with an example, and a table comparing list, tuple and set."
)
ROWS, COLUMNS = 24, 80


def machine_name() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or platform.machine()


class Terminal:
    """A pseudo-terminal of ROWS x COLUMNS; what is written to it is read and dropped by a thread."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        self.stream = open(self.slave, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 (closed in close)
        self.bytes_read = 0
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.bytes_read += len(chunk)

    def close(self) -> None:
        self.stream.close()
        os.close(self.slave)
        os.close(self.master)


def run_once(loaded, mode: str, terminal: Terminal) -> dict:
    from llmchat.output import StreamPrinter
    from llmchat.turn.session import ChatSession
    from llmchat.ui.markdown import MarkdownPrinter

    session = ChatSession.start(loaded.engine, sampling=loaded.sampling, model_label=loaded.model.name, history=None)
    out = terminal.stream
    render_s = 0.0
    frames = 0
    if mode == "markdown":

        class TimedPrinter(MarkdownPrinter):
            def text(self, fragment: str) -> None:
                nonlocal render_s
                start = time.perf_counter()
                super().text(fragment)
                render_s += time.perf_counter() - start

            def write_reply(self, text: str) -> None:
                nonlocal frames
                frames += 1
                super().write_reply(text)

        printer: StreamPrinter = TimedPrinter(out, out, show_live=True, show_summary=False)
    else:
        printer = StreamPrinter(out, out, show_live=True, show_summary=False)
    result = session.turn(PROMPT, printer)
    stats = result.stats
    return dict(
        mode=mode,
        tok_s=stats.decode_tok_s,
        tokens=stats.generated_tokens,
        decode_s=stats.decode_s,
        render_s=render_s,
        frames=frames,
        reply=result.reply,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)  # 2 spin against other jobs on a 2-core VM
    parser.add_argument("--out", type=Path, default=Path("bench/results/render_cost.md"))
    parser.add_argument("--note", default="", help="A line about the conditions (e.g. other jobs on the machine).")
    args = parser.parse_args()

    from llmchat.config import Config
    from llmchat.options import RunOptions
    from llmchat.startup.loading import load_model

    os.environ.setdefault("LLMCHAT_HOME", str(Path("/tmp/llmchat-render-cost-home")))
    options = RunOptions(ctx=2048, temperature=0.0, seed=1, max_tokens=args.max_tokens, threads=args.threads)
    loaded = load_model(options, config=Config(path=Path("/nonexistent")), announce=False)
    terminal = Terminal()
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runs: list[dict] = []
    try:
        for mode in ("plain", "markdown"):  # warm-up: caches, and the first imports of rich and pygments
            run_once(loaded, mode, terminal)
        for round_index in range(args.rounds):
            order = ("plain", "markdown") if round_index % 2 == 0 else ("markdown", "plain")
            pair = {}
            for mode in order:
                pair[mode] = run_once(loaded, mode, terminal)
                print(
                    f"round {round_index + 1} {mode:8}: {pair[mode]['tok_s']:.1f} tok/s, "
                    f"{pair[mode]['tokens']} tokens, render {pair[mode]['render_s'] * 1000:.1f} ms, "
                    f"{pair[mode]['frames']} frames",
                    file=sys.stderr,
                )
            runs.extend(pair[mode] for mode in order)
    finally:
        terminal.close()
        loaded.engine.close()
    load_after = os.getloadavg()

    plain = [r["tok_s"] for r in runs if r["mode"] == "plain"]
    markdown = [r for r in runs if r["mode"] == "markdown"]
    ratios = [m["tok_s"] / p for m, p in zip(markdown, plain)]
    shares = [m["render_s"] / m["decode_s"] for m in markdown if m["decode_s"] > 0]
    same_text = len({r["reply"] for r in runs}) == 1
    median_ratio = statistics.median(ratios)
    lines = [
        "# Markdown rendering cost (bench/render_cost.py)",
        "",
        f"Run {started} on {machine_name()} ({os.cpu_count()} CPUs), SmolLM2-135M Q4_1, "
        f"{args.threads} threads, greedy, max {args.max_tokens} tokens, {args.rounds} alternating rounds, "
        f"output to a {ROWS}x{COLUMNS} pseudo-terminal with the live readout.",
        f"Load average before {load_before[0]:.2f}, after {load_after[0]:.2f}. {args.note}".rstrip(),
        "",
        "| mode | median decode tok/s | min-max |",
        "|---|---|---|",
        f"| plain | {statistics.median(plain):.1f} | {min(plain):.1f}-{max(plain):.1f} |",
        f"| markdown | {statistics.median([m['tok_s'] for m in markdown]):.1f} | "
        f"{min(m['tok_s'] for m in markdown):.1f}-{max(m['tok_s'] for m in markdown):.1f} |",
        "",
        f"- Median of the per-round ratios markdown / plain: **{median_ratio:.3f}** "
        f"(cost {100 * (1 - median_ratio):.1f} %; spread {min(ratios):.3f}-{max(ratios):.3f}).",
        f"- Renderer time inside the decode loop, as a share of the decode time: median "
        f"**{100 * statistics.median(shares):.2f} %** (spread {100 * min(shares):.2f}-{100 * max(shares):.2f} %), "
        f"{statistics.median([m['frames'] for m in markdown]):.0f} frames per reply.",
        f"- Same reply in every run: {same_text} ({runs[0]['tokens']} tokens; "
        f"{sum(1 for line in runs[0]['reply'].splitlines() if line.startswith('```'))} fence line(s), "
        f"{sum(1 for line in runs[0]['reply'].splitlines() if line.startswith('|'))} table line(s), "
        f"{len(runs[0]['reply'].splitlines())} lines: an open fence is redrawn whole at each frame, the costliest case).",
        "",
        "The reply:",
        "",
        "````",
        runs[0]["reply"],
        "````",
        "",
        "Raw runs:",
        "",
        "```",
        *(
            f"round {i // 2 + 1} {r['mode']:8}: {r['tok_s']:.2f} tok/s, {r['tokens']} tokens, "
            f"decode {r['decode_s'] * 1000:.0f} ms, render {r['render_s'] * 1000:.1f} ms, {r['frames']} frames"
            for i, r in enumerate(runs)
        ),
        "```",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines[:16]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
