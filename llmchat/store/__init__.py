"""What llmchat keeps on disk: the conversation history (records, migrations, the SQLite store,
export) and the files a message carries.

Nothing is imported here, so a module that needs one piece (a record, an export) does not load
the SQLite store with it. The package sits below the turn and the session and imports neither:
the store keeps what a turn produced, it does not run one.
"""
