"""`llmchat models`: list every GGUF on the machine, show one, pull from Hugging Face, remove, alias.

`list` and `show` read only (the stores are never written); `pull` is the only network access in
llmchat; `rm` deletes only what llmchat or the HF cache owns, after asking; `alias` appends a
`[models.NAME]` table to the config file. Only typer is imported at the top (fast `--help`).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from llmchat.defaults import DEFAULT_MAX_CTX

if TYPE_CHECKING:
    from rich.text import Text

    from llmchat.config import Config
    from llmchat.env import Environment
    from llmchat.models.candidates import Candidate
    from llmchat.models.catalogue import Entry

ALIAS_NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")
DELETABLE_SOURCES = ("llmchat", "hf")


# ---------------------------------------------------------------------------------------------
# list


def list_command(
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array (one object per file) instead of a table."),
) -> None:
    """List every GGUF model on this machine: llmchat's folder, model_dirs, the HF cache, LM Studio, Ollama."""
    from llmchat.env import current_environment
    from llmchat.models.catalogue import catalogue

    env = current_environment()
    entries = catalogue(env.config)
    if as_json:
        from llmchat.output import write_json

        write_json([e.to_json() for e in entries], env.stdout)
        return
    _print_table(entries, env)


def _print_table(entries: list[Entry], env: Environment) -> None:
    from rich.table import Table

    from llmchat.commands.info import _size
    from llmchat.ui.safe_console import safe_console

    # Names, architectures and problems come from the files' own metadata: no markup, and made
    # terminal-safe on a terminal (llmchat.ui.safe_console).
    console = safe_console(env.stdout, on_terminal=env.stdout_isatty)
    runnable = [e for e in entries if e.runnable]
    broken = [e for e in entries if not e.runnable]
    if not entries:
        _say_none_found(env)
        return
    table = Table(title=f"{len(runnable)} runnable models", title_justify="left")
    for column, justify in (
        ("name (-m)", "left"),
        ("source", "left"),
        ("kind", "left"),
        ("arch", "left"),
        ("params", "right"),
        ("quant", "left"),
        ("size", "right"),
        ("ctx", "right"),
        ("template", "left"),
        ("fits", "left"),
    ):
        table.add_column(column, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for e in runnable:
        s = e.summary
        table.add_row(
            e.shown_name,
            e.candidate.source,
            e.kind.label + _senses(e),
            s.architecture or "?",
            s.size_label or _params(s.parameter_count),
            s.quantization or "?",
            _size(e.file_size),
            f"{s.trained_context:,}" if s.trained_context else "?",
            "yes" if s.has_template else "no",
            _fits(e),
        )
    console.print(table)
    if broken:
        console.print(f"Not loadable ({len(broken)}):", style="bold")
        for e in broken:
            console.print(f"  {e.candidate.ref} ({e.candidate.source}): {e.problem}", soft_wrap=True)
    console.print(
        f"fits: the estimate at each model's default context (at most {DEFAULT_MAX_CTX:,} tokens; see `llmchat info`) "
        "against free VRAM, else available RAM. Runs with: llmchat chat -m NAME",
        style="dim",
    )
    default = _bundled_default()
    if default:
        console.print(default, style="dim")


def _senses(entry: Entry) -> str:
    """` +images`, ` +audio`: what the model's projector lets it take (llmchat.media.projector)."""
    media = entry.media or {}
    return "".join(f" +{what}" for what, key in (("images", "vision"), ("audio", "audio")) if media.get(key))


def _bundled_default() -> str:
    """The model that runs without -m, when its package is installed: newcomers look for it here."""
    from llmchat.models.resolve import DEFAULT_MODEL_NAME, bundled_default_model

    path = bundled_default_model()
    return f"without -m: {DEFAULT_MODEL_NAME}, bundled with llmchat ({path})" if path else ""


def _say_none_found(env: Environment) -> None:
    from llmchat.output import notice

    notice(
        f"no GGUF models found (searched {env.models_dir}, the config's model_dirs, the HF cache, "
        "LM Studio and Ollama); download one with: llmchat models pull hf:ORG/REPO",
        env.stderr,
    )
    default = _bundled_default()
    if default:
        notice(default, env.stderr)


def _params(count: int | None) -> str:
    if not count:
        return "?"
    for unit, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if count >= scale:
            return f"{count / scale:.1f}{unit}"
    return str(count)


def _fits(entry: Entry) -> Text:
    from rich.text import Text

    colour = {"VRAM": "green", "RAM": "green", "no": "red"}.get(entry.fits)
    return Text(entry.fits, style=colour) if colour else Text("?")


# ---------------------------------------------------------------------------------------------
# show


def show_command(
    name: str = typer.Argument(..., help="A name from `llmchat models list`, an alias, or a .gguf path."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (info's, plus source and path)."),
) -> None:
    """Show a model as `llmchat info` does, plus where it is and which tool owns it."""
    from llmchat.commands.info import _print_report, _with_ggml_gpus, runtime_report
    from llmchat.env import current_environment
    from llmchat.gguf.loadable import check_loadable
    from llmchat.gguf.model_report import model_report
    from llmchat.gguf.reader import read_metadata
    from llmchat.models.kind import kind_of
    from llmchat.models.resolve import resolve_model
    from llmchat.models.stores import OWNERS

    env = current_environment()
    config = env.config
    path = resolve_model(name, config).path
    candidate = _candidate_for(path, config)
    source = candidate.source if candidate else "path"
    meta = read_metadata(path)
    check_loadable(meta)
    kind = kind_of(meta, candidate.names if candidate else ())
    runtime = runtime_report(meta, env)
    report = model_report(meta, _with_ggml_gpus(runtime))
    where = {
        "ref": candidate.ref if candidate else str(path),
        "source": source,
        "owner": OWNERS.get(source, "you"),
        "path": str(path),
        "real_path": os.path.realpath(path),
    }
    if as_json:
        from llmchat.output import write_json

        write_json(
            report.to_json() | kind.to_json() | {"reasoning": kind.kind == "reasoning"} | where | {"runtime": runtime},
            env.stdout,
        )
        return
    from rich.table import Table

    from llmchat.ui.safe_console import safe_console

    table = Table(show_header=False, title="Where", title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for label, value in where.items():
        if label != "real_path" or value != where["path"]:
            table.add_row(label.replace("_", " "), value)
    safe_console(env.stdout, on_terminal=env.stdout_isatty).print(table)
    _print_report(report, runtime, kind, env)


def _candidate_for(path: Path, config: "Config") -> Candidate | None:
    """Which store holds this file (by its real path); the most specific store wins."""
    from llmchat.models.stores import all_candidates

    real = os.path.realpath(path)
    matches = [c for c in all_candidates(config) if os.path.realpath(c.path) == real]
    exact = [c for c in matches if Path(c.path) == Path(path)]
    found = exact or matches
    return found[0] if found else None


# ---------------------------------------------------------------------------------------------
# pull


def pull_command(
    spec: str = typer.Argument(..., metavar="hf:ORG/REPO[:QUANT|/FILE.gguf]", help="What to download."),
    revision: str = typer.Option("main", "--revision", help="A branch, tag or commit of the repository."),
    no_mmproj: bool = typer.Option(
        False, "--no-mmproj", help="Leave out the repository's multimodal projector (mmproj), fetched by default."
    ),
) -> None:
    """Download a GGUF from Hugging Face into the HF cache (Q4_K_M unless a QUANT or FILE is given).

    An interrupted pull continues where it stopped when run again. HF_TOKEN is used for gated and
    private repositories; HF_ENDPOINT points at a mirror. The repository's multimodal projector
    (mmproj) for the model comes with it. Prints the files' paths, the model's first."""
    from dataclasses import replace

    from llmchat.env import current_environment
    from llmchat.models.pull import parse_spec, pull
    from llmchat.output import notice

    wanted = replace(parse_spec(spec), revision=revision)
    env = current_environment()
    show = env.stderr_isatty or bool(os.environ.get("LLMCHAT_PROGRESS"))
    pulled = pull(wanted, show_progress=show, projector=not no_mmproj)
    for path in pulled:  # named by the repository's files
        env.write_out(f"{path}\n")
    notice(f"run it with: llmchat chat -m hf:{wanted.repo}/{_inside_repo(pulled[0])}", env.stderr)


def _inside_repo(pointer: Path) -> str:
    """`.../snapshots/<commit>/sub/file.gguf` -> `sub/file.gguf`."""
    parts = pointer.parts
    i = parts.index("snapshots") if "snapshots" in parts else len(parts) - 2
    return "/".join(parts[i + 2 :])


# ---------------------------------------------------------------------------------------------
# rm


def rm_command(
    name: str = typer.Argument(..., help="A name from `llmchat models list`."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Delete without asking."),
) -> None:
    """Delete a model file that llmchat or the HF cache owns. Never touches Ollama's or LM Studio's stores."""
    from llmchat.commands.info import _size
    from llmchat.edges.safe_text import for_stream
    from llmchat.env import current_environment
    from llmchat.errors import LlmchatError, UsageError
    from llmchat.models.resolve import resolve_model
    from llmchat.models.stores import OWNERS

    env = current_environment()
    config = env.config
    path = resolve_model(name, config).path
    candidate = _candidate_for(path, config)
    if candidate is None or candidate.source not in DELETABLE_SOURCES:
        raise LlmchatError(_not_ours(name, path, candidate, OWNERS))
    files = [candidate.path, *[p for p in candidate.parts if p.exists()]]
    size = sum(os.path.getsize(p) for p in files if p.exists())
    where = OWNERS[candidate.source]
    if not yes:
        if not env.stdin_isatty:
            raise UsageError(f"refusing to delete {candidate.ref} without confirmation; pass --yes")
        try:
            question = for_stream(f"Delete {candidate.ref} ({_size(size)}) from {where}?", env.stderr_isatty)
            agreed = typer.confirm(question, default=False, err=True)
        except typer.Abort:
            agreed = False
        if not agreed:
            typer.echo("Not deleted.", file=env.stdout)
            return
    from llmchat.models.remove import remove_from_hf_cache, remove_plain

    removed = remove_from_hf_cache(candidate) if candidate.source == "hf" else remove_plain(candidate)
    env.write_out(f"Deleted {candidate.ref} ({_size(removed)} freed).\n")


def _not_ours(name: str, path: Path, candidate: Candidate | None, owners: dict[str, str]) -> str:
    if candidate is None:
        return (
            f"{path} is not in llmchat's models folder or the HF cache; llmchat deletes only those: delete it yourself"
        )
    if candidate.source == "ollama":
        ollama_name = candidate.ref.partition(":")[2]
        return (
            f"{candidate.ref} belongs to Ollama and llmchat never deletes from its store; run: ollama rm {ollama_name}"
        )
    if candidate.source == "lmstudio":
        return f"{candidate.ref} belongs to LM Studio and llmchat never deletes from its folder; delete it in LM Studio (My Models)"
    return f"{path} belongs to {owners.get(candidate.source, 'another tool')}; llmchat deletes only its own files and the HF cache's: delete it yourself"


# ---------------------------------------------------------------------------------------------
# alias


def alias_command(
    name: str = typer.Argument(..., help="The new name for -m (letters, digits, - and _)."),
    target: str = typer.Argument(
        ..., help="A store name (ollama:..., hf:..., lmstudio:...), a listed name or a .gguf path."
    ),
) -> None:
    """Add `[models.NAME]` to the config file, so `-m NAME` loads TARGET."""
    from llmchat.env import current_environment
    from llmchat.errors import UsageError
    from llmchat.gguf.loadable import check_loadable
    from llmchat.gguf.reader import read_metadata
    from llmchat.models.lookup import is_store_ref
    from llmchat.models.resolve import resolve_model
    from llmchat.output import notice

    if not ALIAS_NAME_RE.match(name):
        raise UsageError(f"alias name {name!r} may hold only letters, digits, '-' and '_'")
    env = current_environment()
    config = env.config
    if name in config.models:
        raise UsageError(
            f"alias {name!r} already exists in {config.path}; remove its [models.{name}] table first, or pick another name"
        )
    resolved = resolve_model(target, config)
    check_loadable(read_metadata(resolved.path), resolved.path)
    # A store name stays a name (an Ollama blob's path changes with every `ollama pull`); else the full path.
    value = target if is_store_ref(target) else str(resolved.path.expanduser().resolve())
    _append_alias(config.path, name, value)
    typer.echo(f"{name} -> {value}", file=env.stdout)
    notice(f"written to {config.path}; use it with: llmchat chat -m {name}", env.stderr)


def _append_alias(config_path: Path, name: str, value: str) -> None:
    """Append the table, check the whole file still parses, then replace it at once (temp + rename)."""
    import json

    from llmchat.errors import ConfigError
    from llmchat.private_files import ensure_private_dir, write_private_atomic

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

    try:
        old = config_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        old = ""
    # A TOML basic string accepts JSON's escapes.
    block = f"\n[models.{name}]\npath = {json.dumps(value, ensure_ascii=False)}\n"
    new = old + ("" if old.endswith("\n") or not old else "\n") + block
    try:
        tomllib.loads(new)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(
            f"config file {config_path} would not parse with the alias added ({err}); fix it first"
        ) from None
    ensure_private_dir(config_path.parent)
    write_private_atomic(config_path, new.encode("utf-8"))
