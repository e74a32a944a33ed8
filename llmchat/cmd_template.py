"""`llmchat template` commands. (placeholder, being written)"""

import typer

app = typer.Typer(no_args_is_help=True, help="template")
