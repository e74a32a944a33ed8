"""Models: which file `-m` means (resolve.py)."""
