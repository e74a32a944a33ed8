"""`llmchat batch` (placeholder, being written)."""

from llmchat.options import RunOptions, model_command


@model_command()
def batch(*, opts: RunOptions) -> None:
    """batch (not written yet)."""
    raise NotImplementedError
