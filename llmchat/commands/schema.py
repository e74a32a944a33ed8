"""`llmchat schema show SPEC`: the JSON Schema a `--schema` value stands for and the grammar it compiles to.

So a user can see what the model will be held to before running it: the concise syntax expanded,
a config name or file resolved, and the GBNF that llama.cpp will decode under. A schema the
grammar cannot enforce fails here exactly as it would in ask, chat or batch (exit 2).
"""

from typing import Annotated

import typer


def show(
    spec: Annotated[
        str,
        typer.Argument(
            metavar="SPEC",
            help="A --schema value: fields ('title, year int'), inline JSON, a .json file or a config name.",
        ),
    ],
    schema_multi: Annotated[
        bool, typer.Option("--schema-multi", help='Show the {"items": [...]} form --schema-multi asks for.')
    ] = False,
) -> None:
    """Print the JSON Schema, then the GBNF grammar it compiles to, on stdout."""
    import json

    from llmchat.env import current_environment
    from llmchat.turn.structured import structured_output

    env = current_environment()
    structured = structured_output(schema=spec, schema_multi=schema_multi, named=env.config.schemas)
    assert structured is not None and structured.schema is not None
    # The schema is a file's: its text is terminal-safe on a terminal, exact in a pipe.
    env.write_out(f"# JSON Schema ({structured.source})\n")
    env.write_out(json.dumps(structured.schema, indent=2, ensure_ascii=False) + "\n\n")
    env.write_out("# GBNF grammar (llama.cpp), root rule: root\n")
    env.write_out(structured.grammar.text + "\n")
