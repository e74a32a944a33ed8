"""Batch progress on stderr: a rich bar on a terminal, plain or JSON lines elsewhere."""

from __future__ import annotations

import json
import sys
import time
from typing import IO, Any

from llmchat.output import is_tty


# --- progress ---------------------------------------------------------------------------------------
class Progress:
    """Items done / total, items/s, aggregate tok/s and ETA on stderr; a summary line at the end.

    On a terminal a rich progress bar; otherwise a plain line every 10 s or every 10% of the items."""

    LINE_EVERY_S = 10.0

    def __init__(self, total: int, mode: str = "auto", stream: IO[str] | None = None, *, label: str = ""):
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if is_tty(self.stream) else "lines"
        self.mode = mode
        self.total = total
        self.label = label
        self.done = self.ok = self.failed = 0
        self.tokens = 0
        self.t_start = time.perf_counter()
        self._last_line_t = self.t_start
        self._last_line_done = 0
        self._bar: Any = None  # a rich Progress, imported only when a bar is shown
        self._task: Any = None

    def start(self) -> None:
        self.t_start = self._last_line_t = time.perf_counter()
        if self.mode == "bar" and self.total:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("batch"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rates]}"),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                refresh_per_second=4,
            )
            self._bar.start()
            self._task = self._bar.add_task("batch", total=self.total, rates="")

    def rates(self) -> tuple[float, float, float]:
        elapsed = max(time.perf_counter() - self.t_start, 1e-9)
        return elapsed, self.done / elapsed, self.tokens / elapsed

    def set_tokens(self, tokens: int) -> None:
        """Live token count (parallel decoding reports it every step)."""
        self.tokens = tokens
        if self._bar is not None:
            _, items_s, tok_s = self.rates()
            self._bar.update(self._task, rates=f"{items_s:.2f} items/s · {tok_s:.0f} tok/s")

    def item_done(self, ok: bool, generated: int = 0, *, count_tokens: bool = True) -> None:
        self.done += 1
        if ok:
            self.ok += 1
        else:
            self.failed += 1
        if count_tokens:
            self.tokens += generated
        elapsed, items_s, tok_s = self.rates()
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, rates=f"{items_s:.2f} items/s · {tok_s:.0f} tok/s")
            return
        now = time.perf_counter()
        due = now - self._last_line_t >= self.LINE_EVERY_S or (self.done - self._last_line_done) >= max(
            1, self.total / 10
        )
        if self.done < self.total and due and self.mode in ("lines", "json"):
            self._last_line_t, self._last_line_done = now, self.done
            self._line(elapsed, items_s, tok_s)

    def _state(self, elapsed: float, items_s: float, tok_s: float) -> dict:
        return {
            "done": self.done,
            "total": self.total,
            "ok": self.ok,
            "failed": self.failed,
            "elapsed_s": round(elapsed, 2),
            "items_s": round(items_s, 3),
            "tok_s": round(tok_s, 1),
        }

    def final_json(self, skipped: int = 0, interrupted: bool = False) -> None:
        state = self._state(*self.rates()) | {"skipped": skipped, "final": True, "interrupted": interrupted}
        self.stream.write(json.dumps(state) + "\n")
        self.stream.flush()

    def _line(self, elapsed: float, items_s: float, tok_s: float) -> None:
        if self.mode == "json":
            self.stream.write(json.dumps(self._state(elapsed, items_s, tok_s)) + "\n")
        else:
            remaining = (self.total - self.done) / items_s if items_s > 0 else 0.0
            self.stream.write(
                f"batch: {self.done}/{self.total} items, {items_s:.2f} items/s, {tok_s:.0f} tok/s, ETA {remaining:.0f} s\n"
            )
        self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def summary(self, skipped: int = 0, interrupted: bool = False) -> str:
        elapsed, items_s, tok_s = self.rates()
        head = "interrupted after" if interrupted else "done:"
        text = (
            f"batch: {head} {self.done}/{self.total} items ({self.ok} ok, {self.failed} failed"
            + (f", {skipped} already in the output" if skipped else "")
            + f") in {elapsed:.1f} s, {items_s:.2f} items/s, {tok_s:.0f} tok/s{self.label}"
        )
        return text
