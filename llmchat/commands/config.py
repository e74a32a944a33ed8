"""`llmchat config path|show`: where the config file lives, and what is in effect.

`config show` masks every value whose key name says key, token or secret (`api_key`,
`auth-token`, `client_secret`): its output gets pasted into bug reports. The match is on whole
words of the name, so `max_tokens` stays visible. A password inside a URL
(`http://user:PASSWORD@host`) is masked too.
"""

import re
from typing import Any

import typer

MASK = "********"
SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password"})
_URL_PASSWORD = re.compile(r"^([a-z][a-z0-9+.-]*://[^/@:]*:)([^/@]*)(@)", re.IGNORECASE)


def config_path() -> None:
    """Print where the config file lives."""
    from llmchat.env import current_environment

    env = current_environment()
    typer.echo(str(env.config_path), file=env.stdout)


def config_show() -> None:
    """Print the config in effect (after checking it)."""
    import json

    from llmchat.env import current_environment

    env = current_environment()
    config = env.config
    shown = mask_secrets({k: v for k, v in vars(config).items() if k not in ("path", "exists")})
    typer.echo(f"# {config.path}" + ("" if config.exists else " (not created yet: defaults)"), file=env.stdout)
    typer.echo(json.dumps(shown, indent=2, ensure_ascii=False), file=env.stdout)


def names_a_secret(key: str) -> bool:
    """`api_key`, `hf-token`, `clientSecret`: yes; `max_tokens`, `keyboard`: no."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", key)  # camelCase -> camel Case
    return any(word.lower() in SECRET_WORDS for word in re.split(r"[^A-Za-z0-9]+|\s", spaced))


def mask_secrets(value: Any) -> Any:
    """`value` with every entry whose key names a secret replaced by a mask, at any depth."""
    if isinstance(value, dict):
        return {k: MASK if names_a_secret(str(k)) else mask_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_secrets(item) for item in value]
    if isinstance(value, str):
        return _URL_PASSWORD.sub(rf"\g<1>{MASK}\g<3>", value)
    return value
