"""Prompts: the format a template implies (call layout, reasoning markers), derived by rendering probes."""
