"""`llmchat batch`: the command (command.py), items in (items.py), the schedule of the run (runner.py), records out (sink.py), progress (progress.py)."""
