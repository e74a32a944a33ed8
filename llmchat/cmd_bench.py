"""`llmchat bench` (placeholder, being written)."""

from llmchat.options import RunOptions, model_command


@model_command()
def bench(*, opts: RunOptions) -> None:
    """bench (not written yet)."""
    raise NotImplementedError
