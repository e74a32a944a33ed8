"""`llmchat prompts list|show`: the saved prompts of the config's [prompts.NAME] tables."""

from __future__ import annotations

import typer


def list_command(
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array instead of a table."),
) -> None:
    """List the saved prompts (-p NAME on ask, chat and batch; /prompt NAME in chat)."""
    import json

    from llmchat.env import current_environment
    from llmchat.startup.saved_prompts import all_prompts

    env = current_environment()
    config = env.config
    prompts = all_prompts(config)
    if as_json:
        typer.echo(json.dumps([p.as_table() for p in prompts], indent=2, ensure_ascii=False), file=env.stdout)
        return
    if not prompts:
        typer.echo(
            f"No saved prompts yet: add a [prompts.NAME] table to {config.path} (see docs/configuration.md).",
            file=env.stdout,
        )
        return
    width = max(len(p.name) for p in prompts)
    for prompt in prompts:
        about = prompt.description or " ".join((prompt.system or "(no system prompt)").split())
        if len(about) > 60:
            about = about[:59] + "…"
        extra = prompt.summary()
        # A saved prompt's text may come from a file: terminal-safe on a terminal (llmchat.edges.safe_text).
        env.write_out(f"{prompt.name.ljust(width)}  {about}" + (f"  [{extra}]" if extra else "") + "\n")


def show_command(
    name: str = typer.Argument(..., metavar="NAME", help="The saved prompt's name."),
    as_json: bool = typer.Option(False, "--json", help="Print it as JSON."),
) -> None:
    """Show one saved prompt: its system prompt and every value it sets."""
    import json

    from llmchat.env import current_environment
    from llmchat.startup.saved_prompts import lookup

    env = current_environment()
    prompt = lookup(name, env.config)
    if as_json:
        typer.echo(json.dumps(prompt.as_table(), indent=2, ensure_ascii=False), file=env.stdout)
        return
    for key, value in prompt.as_table().items():
        if key != "system":
            env.write_out(f"{key}: {value}\n")
    env.write_out("system:\n")
    env.write_out((prompt.system if prompt.system is not None else "(none)") + "\n")
