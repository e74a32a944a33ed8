"""`llmchat batch`: items in (items.py), records out (sink.py), progress (progress.py), the run (runner.py)."""
