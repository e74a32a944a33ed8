"""A call-format family by its id, for tests that need one by name (llmchat itself detects them)."""

from __future__ import annotations

from llmchat.tools.families import FAMILIES, GENERIC, Family


def family_named(family_id: str) -> Family:
    return next(family for family in (*FAMILIES, GENERIC) if family.id == family_id)
