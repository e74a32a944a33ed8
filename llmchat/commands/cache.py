"""`llmchat cache list|clear`: the KV cache on disk (llmchat.engine.kv_store).

Only the standard library is imported to list or clear: neither loads a model.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer


def _size(n_bytes: int) -> str:
    if n_bytes >= 1024**3:
        return f"{n_bytes / 1024**3:.2f} GiB"
    return f"{n_bytes / 1024**2:.1f} MiB"


def _age(mtime: float) -> str:
    seconds = max(0.0, time.time() - mtime)
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def list_command(
    json_output: Annotated[bool, typer.Option("--json", help="One JSON object: the files and the totals.")] = False,
) -> None:
    """The saved KV caches, most recently used first: tokens, size, model, conversation."""
    from llmchat.engine.kv_store import list_entries
    from llmchat.env import current_environment

    env = current_environment()
    folder = env.kv_cache_dir
    entries, damaged = list_entries(folder)
    bound = env.config.prompt_cache_max_bytes
    total = sum(e.size for e in entries)
    if json_output:
        from llmchat.output import write_json

        write_json(
            {
                "folder": str(folder),
                "total_bytes": total,
                "max_bytes": bound,
                "files": [
                    {
                        "file": e.path.name,
                        "tokens": e.n_tokens,
                        "bytes": e.size,
                        "last_used": e.mtime,
                        "model": e.header["identity"].get("model", {}).get("path"),
                        "n_ctx": e.header["identity"].get("n_ctx"),
                        "flash_attn": e.header["identity"].get("flash_attn"),
                        "conversation_id": e.conversation_id,
                    }
                    for e in entries
                ],
                "damaged": [p.name for p in damaged],
            },
            env.stdout,
        )
        return
    if not entries and not damaged:
        typer.echo(f"no saved KV caches ({folder})", file=env.stdout)
        return
    for e in entries:
        model = Path(str(e.header["identity"].get("model", {}).get("path", "?"))).name
        conversation = e.conversation_id or "(no conversation)"
        env.write_out(  # the model's file name: terminal-safe on a terminal
            f"{e.n_tokens:>7,} tokens  {_size(e.size):>10}  {_age(e.mtime):>8}  {model}  {conversation}  {e.path.name}\n"
        )
    for path in damaged:
        typer.echo(
            f"{'damaged':>14}  {path.name} (skipped and deleted at the next use; or: llmchat cache clear)",
            file=env.stdout,
        )
    typer.echo(f"{len(entries)} files, {_size(total)} of at most {_size(bound)} in {folder}", file=env.stdout)


def clear_command() -> None:
    """Delete every saved KV cache (they are rebuilt by the next turns)."""
    from llmchat.engine.kv_store import clear
    from llmchat.env import current_environment
    from llmchat.output import notice

    env = current_environment()
    count, freed = clear(env.kv_cache_dir)
    notice(f"removed {count} KV cache file{'' if count == 1 else 's'} ({_size(freed)})", env.stderr)
