"""The results file every side-by-side script writes: a title, when and where it ran, the summary
lines and every raw run, so a figure in BENCHMARKS.md can be traced to the runs behind it."""

from __future__ import annotations

import os
from pathlib import Path


def write_report(
    out: Path, title: str, started: str, load_before: float, setting: str, summary: list[str], raw: list[str]
) -> None:
    """Write `out` (Markdown): `setting` says what ran (model, binaries); `load_before` is the
    1-minute load average when the script started (the one after is read now)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        f"# {title}",
        "",
        f"Run {started}, one process; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after. {setting}",
        "",
        *(f"- {line}" for line in summary),
        "",
        "```",
        *raw,
        "```",
        "",
    ]
    out.write_text("\n".join(lines))
