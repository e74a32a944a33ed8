"""How many threads llama.cpp runs: the cores this process may really use, and a tuner that
watches the time per step and moves one thread at a time.

llama.cpp's threads meet at a barrier after every operation of every step, so the step waits for
the slowest thread. Where another program keeps a core busy, the thread that shares its core
runs at half speed and the whole step with it: on a 2-core machine with one core busy, SmolLM2
decodes at 37-40 tok/s with 2 threads and 65-77 with 1 (llama-bench). llama.cpp, Ollama and
llama-server all run every physical core whatever the load. llmchat starts from what the machine
has to spare and then trusts measured step times over any reading:

- At load: physical cores, within the affinity mask and a cgroup CPU quota (`cpu.max`, what a
  container gets), less the cores other processes kept busy while the model loaded (`/proc/stat`
  over the load, minus this process's own CPU time; a vCPU's stolen time counts as busy).
- While decoding: a step taking well above its settled time, or other processes busy again,
  tries one thread fewer for a few steps and keeps it when it is faster. With fewer threads than
  cores, one more is tried now and then (the load comes and goes); each try that loses doubles
  the wait before the next, so a quiet machine pays almost nothing.

`--threads N` fixes the count: nothing is read or tried.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

# A step counts as decode (one token, or a few drafted ones verified) up to this many tokens;
# above it, a prefill chunk, compared per token.
_DECODE_STEP_MAX_TOKENS = 16
# A settled count's steps that set its baseline, after one step to warm up.
_BASELINE_STEPS = 4
# A step this much slower than the baseline (median of the last few) means the machine changed.
# Not less: a small model's step also grows with the cache (SmolLM2: 13 to 17-18 ms over 220
# tokens), and a core taken by another process makes it 2-3 times as long.
_SLOWDOWN = 1.5
# Other processes' CPU use, in cores, that counts as a busy core.
_BUSY_CORE = 0.6
# A tried count must be at least this much faster to be kept (noise between steps is ~3%).
_BETTER = 0.95
# Steps at a tried count: one to warm up, then these are measured.
_TRIAL_STEPS = 3
# A step at a tried count this much slower than the settled count's ends the try at once.
_PLAINLY_SLOWER = 2.0
# Steps before one more thread is tried, doubling after each try that loses.
_FIRST_RETRY = 32
_LAST_RETRY = 1024
# How often other processes' CPU use is read while decoding.
_READ_EVERY_S = 0.5


def _median(values: Sequence[float]) -> float:
    """The median of a few step times (`statistics` would import `fractions` and `decimal`, about
    half a MiB, into every one-shot)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """Cores a cgroup CPU quota allows (cgroup v2 `cpu.max`, else v1's cfs files); None: no quota."""
    try:
        quota, period = (root / "cpu.max").read_text(encoding="ascii").split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text(encoding="ascii"))
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text(encoding="ascii"))
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def usable_cores(physical: int, quota: float | None) -> tuple[int, str]:
    """(cores this process may use, why): physical cores within the affinity mask and a cgroup
    CPU `quota` (cores; None: none)."""
    cores, why = physical, f"{physical} physical cores"
    if hasattr(os, "sched_getaffinity"):
        allowed = len(os.sched_getaffinity(0))
        if allowed < cores:
            cores, why = allowed, f"{allowed} CPUs in this process's affinity mask"
    if quota is not None and math.ceil(quota) < cores:
        cores, why = max(1, math.ceil(quota)), f"a cgroup CPU quota of {quota:g} cores"
    return cores, why


@dataclass(frozen=True)
class CpuReading:
    """The machine's busy CPU time (all CPUs, stolen time included) and this process's own."""

    wall: float
    busy_s: float  # 0.0 where /proc/stat cannot be read (`readable` False)
    own_s: float
    readable: bool

    @classmethod
    def now(cls) -> "CpuReading":
        wall, own = time.monotonic(), time.process_time()
        try:
            with open("/proc/stat", encoding="ascii") as stat:
                fields = stat.readline().split()
        except OSError:
            return cls(wall, 0.0, own, False)
        # cpu user nice system idle iowait irq softirq steal ...: all but idle and iowait are busy.
        ticks = [int(value) for value in fields[1:9]]
        busy = sum(ticks) - ticks[3] - ticks[4]
        return cls(wall, busy / _TICKS_PER_S, own, fields[0] == "cpu")

    def others_since(self, earlier: "CpuReading") -> float | None:
        """Cores other processes kept busy between `earlier` and this reading; None where the
        window is too short for /proc/stat's 10 ms ticks to say, or it cannot be read."""
        window = self.wall - earlier.wall
        if not (self.readable and earlier.readable) or window < 0.08:
            return None
        return max(0.0, (self.busy_s - earlier.busy_s) - (self.own_s - earlier.own_s)) / window


_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def threads_at_load(physical: int, since: CpuReading) -> tuple[int, str]:
    """(threads, why) for a context created now: the usable cores less those other processes
    kept busy `since` then (the reading taken as the load began: engine.load_ahead's `begin`, or
    `Engine.load` when nothing was begun ahead)."""
    cores, why = usable_cores(physical, cgroup_quota())
    others = CpuReading.now().others_since(since)
    if others is None or others < _BUSY_CORE or cores == 1:
        return cores, why
    busy = min(cores - 1, max(1, round(others)))
    return cores - busy, f"{why}, {others:.1f} busy with other processes at load"


class ThreadTuner:
    """Owns one context's thread count while it decodes: `observe` each decode call's time, and
    it calls `apply(n)` when another count is to be tried or kept. Fixed (`--threads`): never."""

    def __init__(
        self,
        threads: int,
        why: str,
        most: int,
        apply: Callable[[int], None],
        *,
        fixed: bool,
        read_cpu: Callable[[], CpuReading] = CpuReading.now,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.threads = threads  # the count kept: what the stats report (a try may run another)
        self.why = why
        self._most = most
        self._apply = apply
        self._fixed = fixed
        self._trial: int | None = None  # the count being tried
        self._trial_costs: list[float] = []
        self._skip = 1  # steps not measured: the first after any change of count
        self._recent: deque[float] = deque(maxlen=_BASELINE_STEPS)
        self._baseline: float | None = None
        self._since_settled = 0
        self._retry_after = _FIRST_RETRY  # steps before one thread more is tried
        self._fewer_after = 0  # steps before one thread fewer may be tried again
        self._read_cpu = read_cpu  # /proc/stat costs ~50 us: read at most every _READ_EVERY_S of `clock`
        self._clock = clock
        self._reading = read_cpu()
        self._others_quiet = False  # the last reading found the cores this count leaves quiet
        self.changes = 0

    def observe(self, n_tokens: int, seconds: float) -> None:
        """One decode call of `n_tokens` took `seconds`."""
        if self._fixed or n_tokens <= 0:
            return
        if n_tokens > _DECODE_STEP_MAX_TOKENS:
            # A prefill chunk: its time per token grows with depth and is not comparable with a
            # decode step's, so only other processes' load is read here. A count tried from here
            # is judged by the decode steps that follow.
            if self._trial is None and self.threads > 1 and self._others_busier():
                self._start_trial(self.threads - 1)
            return
        if self._trial is not None and len(self._recent) >= _BASELINE_STEPS:
            # Threads that spin on a busy core can take a step 100 times as long: a tried count
            # that is plainly slower loses at once, warm-up step or not.
            if seconds > _median(self._recent) * _PLAINLY_SLOWER:
                self._trial_costs = [seconds]
                self._skip = 0
                self._end_trial()
                return
        if self._skip:
            self._skip -= 1
            return
        if self._trial is not None:
            self._trial_costs.append(seconds)
            if len(self._trial_costs) >= _TRIAL_STEPS:
                self._end_trial()
            return
        self._recent.append(seconds)
        self._since_settled += 1
        if len(self._recent) < _BASELINE_STEPS:
            return
        current = _median(self._recent)
        if self._baseline is None:
            self._baseline = current
        if (
            self.threads > 1
            and self._since_settled >= self._fewer_after
            and (current > self._baseline * _SLOWDOWN or self._others_busier())
        ):
            self._start_trial(self.threads - 1)
        elif self.threads < self._most and (self._others_left() or self._since_settled >= self._retry_after):
            self._start_trial(self.threads + 1)

    def _others_busier(self) -> bool:
        """Other processes busy on more cores than this count leaves them."""
        others = self._others()
        return others is not None and others >= (self._most - self.threads) + _BUSY_CORE

    def _others_left(self) -> bool:
        """Other processes, busy on the cores this count leaves them at the last reading, no
        longer are (true once per such change, so a count that loses anyway is not tried again)."""
        others = self._others()
        if others is None:
            return False
        quiet = others <= (self._most - self.threads) - _BUSY_CORE
        left, self._others_quiet = quiet and not self._others_quiet, quiet
        return left

    def _others(self) -> float | None:
        """Cores other processes kept busy since the last reading; None: read too recently."""
        if self._clock() - self._reading.wall < _READ_EVERY_S:
            return None
        now = self._read_cpu()
        others = now.others_since(self._reading)
        self._reading = now
        return others

    def _start_trial(self, threads: int) -> None:
        self._trial, self._trial_costs, self._skip = threads, [], 1
        self._apply(threads)

    def _end_trial(self) -> None:
        tried, settled = self._trial, self.threads
        assert tried is not None
        trial_cost = _median(self._trial_costs)
        current = _median(self._recent) if len(self._recent) >= _BASELINE_STEPS else None
        self._trial = None
        self._recent.clear()
        self._skip = 1
        self._since_settled = 0
        if current is None or trial_cost < current * _BETTER:
            # Without decode steps at the settled count to compare with, a count tried because
            # other processes got busy is kept: one more is tried again later.
            self.threads, self._baseline = tried, None
            self._retry_after, self._fewer_after = _FIRST_RETRY, 0
            self.why = f"{tried} of {self._most} cores: " + (
                "other processes got busy"
                if current is None
                else f"a step took {trial_cost * 1000:.1f} ms with {tried} threads against {current * 1000:.1f} ms with {settled}"
            )
            self.changes += 1
        else:
            self._apply(settled)
            if tried > settled:
                self._retry_after = min(_LAST_RETRY, self._retry_after * 2)
            else:  # the slowdown was the machine's, not the threads': settle on it, and wait longer
                self._baseline = None
                self._fewer_after = min(_LAST_RETRY, max(_FIRST_RETRY, self._fewer_after * 2))


class _Context(Protocol):
    def set_threads(self, threads: int, /) -> None: ...


def thread_tuner(
    fixed: int | None, most: int, all_on_gpu: bool, contexts: Sequence[_Context], since: CpuReading
) -> ThreadTuner:
    """The owner of the contexts' thread count (the model's and a draft model's): fixed by
    --threads (`fixed`) or where every layer runs on a GPU; else from the cores the machine had
    to spare `since` the load began (up to `most`), then tuned while decoding."""

    def apply(threads: int) -> None:
        for context in contexts:
            context.set_threads(threads)

    if fixed:
        return ThreadTuner(fixed, "--threads", fixed, apply, fixed=True)
    if all_on_gpu:
        return ThreadTuner(most, f"{most} physical cores; every layer on the GPU", most, apply, fixed=True)
    threads, why = threads_at_load(most, since)
    if threads != most:
        apply(threads)
    return ThreadTuner(threads, why, most, apply, fixed=False)
