"""`llmchat bench`: prompt-processing and generation throughput, measured like llama.cpp's llama-bench.

pp = tokens/s evaluating a `-p`-token prompt from an empty KV cache; tg = tokens/s decoding `-n`
tokens one at a time (greedy, EOS ignored). Each is repeated `-r` times after a warm-up and
reported as mean ± sd. TTFT for the pp prompt (prefill + the first sample) is reported too.
The model is loaded with the same options as `ask` and `chat` (--threads, --flash-attn, --kv-type,
--batch-size, --device ...), so the numbers describe the engine you chat with.
"""

from typing import TYPE_CHECKING, Annotated, Callable, cast

import typer

from llmchat.commands.model_options import model_command
from llmchat.env import Environment
from llmchat.errors import UsageError
from llmchat.options import RunOptions

if TYPE_CHECKING:
    from llmchat.engine import Engine

MAX_TOKENS = 1 << 20


def check_counts(n_prompt: int, n_gen: int, reps: int, ctx: "int | None") -> None:
    if not 1 <= n_prompt <= MAX_TOKENS:
        raise UsageError(f"-p/--n-prompt must be between 1 and {MAX_TOKENS}, got {n_prompt}")
    if not 1 <= n_gen <= MAX_TOKENS:
        raise UsageError(f"-n/--n-gen must be between 1 and {MAX_TOKENS}, got {n_gen}")
    if not 1 <= reps <= 1000:
        raise UsageError(f"-r/--reps must be between 1 and 1000, got {reps}")
    if ctx is not None and ctx < max(n_prompt, n_gen):
        raise UsageError(
            f"--ctx {ctx} is smaller than the test ({max(n_prompt, n_gen)} tokens); raise --ctx or drop it"
        )


@model_command(sampling=False)
def bench(
    n_prompt: Annotated[int, typer.Option("--n-prompt", "-p", help="Prompt tokens for the pp test.")] = 512,
    n_gen: Annotated[int, typer.Option("--n-gen", "-n", help="Tokens generated for the tg test.")] = 128,
    reps: Annotated[int, typer.Option("--reps", "-r", help="Repetitions of each test (after one warm-up).")] = 3,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the table.")] = False,
    calibrate: Annotated[
        bool,
        typer.Option(
            "--calibrate",
            help="Measure flash attention on vs off for this model on this machine (pp36 from an empty and a deep cache, decode at depth) and store the faster for --flash-attn auto.",
        ),
    ] = False,
    depth: Annotated[
        int, typer.Option("--depth", help="With --calibrate: the cached tokens of the deep probe.")
    ] = 1024,
    *,
    opts: RunOptions,
    env: Environment,
) -> None:
    """Prompt (pp) and generation (tg) tokens/s, mean ± sd over repetitions, like llama-bench."""
    if calibrate:
        run_calibration(opts, env, depth=depth, json_output=json_output)
        return
    check_counts(n_prompt, n_gen, reps, opts.ctx)
    if opts.lookup or opts.draft_model is not None:
        # Drafting changes generation, not single-token decode; it is measured by bench/speculative_bench.py.
        raise UsageError(
            "bench measures plain prompt and decode speed; --lookup and --draft-model do not apply (drop them)"
        )
    # Like llama-bench, the context holds exactly the test unless --ctx says otherwise.
    from llmchat.startup.loading import load_model

    loaded = load_model(opts, config=env.config, n_ctx_override=opts.ctx or max(n_prompt + n_gen, 64))
    engine = loaded.engine
    assert not engine.caps.remote  # bench --server is refused before loading
    engine = cast("Engine", engine)
    try:
        from llmchat.engine import bench as engine_bench

        progress = _progress_line(env) if env.stderr_isatty else None
        try:
            result = engine_bench.run(engine, n_prompt=n_prompt, n_gen=n_gen, reps=reps, progress=progress)
        except ValueError as err:
            raise UsageError(str(err)) from None
        finally:
            if progress:
                env.stderr.write("\r\x1b[2K")
                env.stderr.flush()
    finally:
        engine.close()

    if json_output:
        from llmchat.output import write_json

        write_json(to_json(result, loaded.model.name, str(loaded.model.path), engine, opts), env.stdout)
    else:
        # The table names the model's file: terminal-safe on a terminal (llmchat.edges.safe_text).
        env.write_out(format_table(result, loaded.model.name, flash_attn=engine.settings.flash_attn) + "\n")


def run_calibration(opts: RunOptions, env: Environment, *, depth: int, json_output: bool) -> None:
    """`bench --calibrate`: what `--flash-attn auto` will pick on the CPU, measured and stored."""
    from dataclasses import asdict

    from llmchat.models.resolve import resolve_model
    from llmchat.startup.loading import validate_options

    if not 64 <= depth <= MAX_TOKENS:
        raise UsageError(f"--depth must be between 64 and {MAX_TOKENS}, got {depth}")
    validate_options(opts)
    model = resolve_model(opts.model, env.config)
    from llmchat.engine import EngineSettings
    from llmchat.engine.calibrate import calibrate

    settings = EngineSettings(
        threads=opts.threads, batch_size=opts.batch_size, device="cpu", mmap=opts.mmap, mlock=opts.mlock
    )
    progress = _progress_line(env) if env.stderr_isatty else None
    try:
        result = calibrate(model.path, settings, folder=env.flash_attn_dir, depth=depth, progress=progress)
    finally:
        if progress:
            env.stderr.write("\r\x1b[2K")
            env.stderr.flush()
    if json_output:
        from llmchat.output import write_json

        write_json(
            {"model": model.name, "model_path": str(model.path), "why": result.reason()} | asdict(result), env.stdout
        )
        return
    env.write_out(f"flash attention auto on the CPU for {model.name}: {'on' if result.flash_attn else 'off'}\n")
    env.write_out(result.reason() + "\n")


def _progress_line(env: Environment) -> Callable[[str], None]:
    """The stage being measured, rewritten in place on the terminal."""

    def show(stage: str) -> None:
        env.stderr.write(f"\r\x1b[2Kbench: {stage}…")
        env.stderr.flush()

    return show


def to_json(result, model_name: str, model_path: str, engine, opts: RunOptions) -> dict:
    model = result.model
    return {
        "model": model_name,
        "model_path": model_path,
        "model_desc": model.desc,
        "size_bytes": model.size_bytes,
        "n_params": model.n_params,
        "backend": model.backend,
        "threads": model.threads,
        "n_ctx": engine.n_ctx,
        "batch_size": opts.batch_size,
        "flash_attn": engine.settings.flash_attn,
        "kv_type": opts.kv_type,
        "n_prompt": result.n_prompt,
        "n_gen": result.n_gen,
        "reps": result.reps,
        "pp": result.pp.to_dict(),
        "tg": result.tg.to_dict(),
        "ttft_s": result.ttft.to_dict(digits=4),
    }


def _size(n_bytes: int) -> str:
    gib = n_bytes / 1024**3
    return f"{gib:.2f} GiB" if gib >= 1 else f"{n_bytes / 1024**2:.2f} MiB"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def format_table(result, model_name: str, *, flash_attn: bool) -> str:
    model = result.model
    header = ("model", "size", "params", "backend", "threads", "fa", "test", "t/s")
    right = (False, True, True, False, True, True, True, True)
    common = (
        f"{model_name} ({model.desc})",
        _size(model.size_bytes),
        _params(model.n_params),
        model.backend,
        str(model.threads),
        "1" if flash_attn else "0",
    )
    rows = [
        common + (f"pp{result.n_prompt}", f"{result.pp.mean:.2f} ± {result.pp.sd:.2f}"),
        common + (f"tg{result.n_gen}", f"{result.tg.mean:.2f} ± {result.tg.sd:.2f}"),
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells) -> str:
        return "| " + " | ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)) + " |"

    rule = "| " + " | ".join(("-" * (w - 1) + ":") if r else "-" * w for w, r in zip(widths, right)) + " |"
    ttft = result.ttft
    footer = (
        f"TTFT pp{result.n_prompt} (prefill + first token): {ttft.mean * 1000:.1f} ± {ttft.sd * 1000:.1f} ms; "
        f"{result.reps} rep{'' if result.reps == 1 else 's'} after a warm-up, KV cache cleared before each"
    )
    return "\n".join([line(header), rule, *(line(r) for r in rows), "", footer])
