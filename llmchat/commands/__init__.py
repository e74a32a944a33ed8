"""One module per command, as plain functions; `llmchat.cli` registers them with Typer.

Heavy modules (llama_cpp, rich, prompt-toolkit) are imported inside the functions, so that
`llmchat --help` stays fast. (No `from __future__ import annotations` in the command modules:
Typer reads the annotations at run time, including those that `model_options.model_command` adds.)
"""
