"""The interactive chat: the prompt loop (chat), the slash commands (slash, one table, with their
handlers grouped by what they act on), the completer and the terminal's details.

The UI sits above the session: it drives `ChatSession` through its methods and reads its state,
and never writes the session's fields itself.
"""
