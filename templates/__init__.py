"""Built-in chat templates, one Jinja file per model family (shipped as package data `llmchat.templates`).

Each file starts with a header comment that `llmchat.prompt.builtins` parses; see that module's
docstring for the format.
"""
