"""`llmchat config path|show`: where the config file lives, and what is in effect."""

import typer


def config_path() -> None:
    """Print where the config file lives."""
    from llmchat import paths

    typer.echo(str(paths.config_file()))


def config_show() -> None:
    """Print the config in effect (after checking it)."""
    import json

    from llmchat.config import load_config

    config = load_config()
    shown = {k: v for k, v in vars(config).items() if k not in ("path", "exists")}
    typer.echo(f"# {config.path}" + ("" if config.exists else " (not created yet: defaults)"))
    typer.echo(json.dumps(shown, indent=2, ensure_ascii=False))
