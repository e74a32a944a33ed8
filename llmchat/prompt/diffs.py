"""Diffs of two renders, cut only where a marker begins or ends: a diff that split
`<|im_end|>` after its `<` would name half a marker."""

from __future__ import annotations

import re

from llmchat.prompt.layout import INDEX_SLOT

MARKER = re.compile(r"<[^<>]*>|\[/?[A-Z_]+\]")
# A marker as some templates spell one: two tokens around a word (Kimi K3's `<|open|>think<|sep|>`).
MARKER_RUN = re.compile(r"<[^<>]*>(?:[a-z]+<[^<>]*>)?|\[/?[A-Z_]+\]")


def _safe_prefix(text: str, n: int) -> int:
    """n, moved back so that text[:n] does not end inside a marker (`<...>`, `[UPPER]`)."""
    open_at = text.rfind("<", 0, n)
    if open_at >= 0 and text.find(">", open_at, n) < 0:
        n = open_at
    open_at = text.rfind("[", 0, n)
    if open_at >= 0 and re.fullmatch(r"[A-Z_]+", text[open_at + 1 : n]):
        n = open_at
    return n


def _safe_suffix(text: str, m: int) -> int:
    """m, made smaller so that the last m characters of text do not start inside a marker."""
    start = len(text) - m
    close_at = text.find(">", start)
    if close_at >= 0 and text.find("<", start, close_at) < 0:
        m = len(text) - close_at - 1
        start = len(text) - m
    close_at = text.find("]", start)
    if close_at >= 0 and re.fullmatch(r"[A-Z_]+", text[start:close_at]):
        m = len(text) - close_at - 1
    return m


def diff(before: str, after: str) -> str:
    """The part of `after` that is not in `before`'s common prefix and suffix, cut at marker
    boundaries (a diff that splits `<|im_end|>` after its `<` would name half a marker)."""
    prefix = 0
    limit = min(len(before), len(after))
    while prefix < limit and before[prefix] == after[prefix]:
        prefix += 1
    prefix = _safe_prefix(after, prefix)
    suffix = 0
    while suffix < limit - prefix and before[-1 - suffix] == after[-1 - suffix]:
        suffix += 1
    suffix = _safe_suffix(after, suffix)
    return after[prefix : len(after) - suffix]


def common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[: _safe_prefix(a, n)]


def common_suffix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return a[len(a) - _safe_suffix(a, n) :]


def prefix_with_index(a: str, b: str) -> tuple[str, int]:
    """The common prefix of two call bodies, where a digit that counts up from `a` to `b` is the
    call's index (INDEX_SLOT in the result); also the length matched in b."""
    out: list[str] = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            out.append(a[i])
            i += 1
            j += 1
            continue
        if a[i].isdigit() and b[j].isdigit() and int(b[j]) == int(a[i]) + 1 and a[i] in "01":
            out.append(INDEX_SLOT)
            i += 1
            j += 1
            continue
        break
    kept = _safe_prefix(a, i)
    while i > kept:  # back off to a marker boundary, in both strings
        i -= 1
        j -= 1
        if out.pop() == INDEX_SLOT:
            continue
    return "".join(out), j
