"""`--flash-attn auto`: flash attention on where it is known to help, off where it is known to cost.

Rules, first match wins:
1. a quantized KV cache (`--kv-type q8_0|q4_0`): on. llama.cpp cannot build a quantized V cache
   without it.
2. a GPU build with layers offloaded: on, as llama.cpp's own `-fa auto` decides there: its GPU
   kernels are the fast path at every depth.
3. drafting (`--lookup`, `--draft-model`): on. Its CPU kernel computes each query row the same
   way whatever the batch holds, so verifying drafted tokens in one pass gives the greedy reply of
   decoding them one by one (up to 256 cached tokens; see docs/speed-and-memory.md, determinism). Without
   it a drafted run's greedy reply drifted from plain decoding's (tests/test_speculative.py).
   The same for `batch --parallel N` (N > 1): with it off, 3 of 12 greedy items differed from
   `--parallel 1` (tests/test_batch.py), with it on none do.
4. the CPU, measured: `llmchat bench --calibrate -m MODEL` times a 36-token prefill from an empty
   cache and at a deep cache (1,024 tokens), and single-token decode at that depth, with flash
   attention on and off, and stores the faster setting for this model file and machine. Both
   settings are loaded together and measured in alternating rounds, keeping each one's fastest.
5. the CPU, not measured: off. llama.cpp's own tools measured it slower for chat-sized prefills
   at every cache depth a chat reaches, on both CPU kinds this project runs on (llama-bench,
   SmolLM2 Q4_1, 2 threads): on an AMD Zen 3, pp26 at depth 100 ran 266 tok/s off vs 235 on and
   at depth 775 172 vs 131; on an Intel Xeon, pp40 at depth 217 263 vs 239, at depth 719 256 vs
   156, and pp36 at depth 3,500 127 vs 55. Only from an empty cache was on a few percent faster
   (pp36 275 vs 257), which a chat's first turn alone sees. So a newcomer gets the faster setting
   without calibrating, and a calibration, when present, still wins (rule 4).
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from llmchat.private_files import ensure_private_dir, write_private_atomic

if TYPE_CHECKING:
    from llmchat.engine.core import Engine
    from llmchat.engine.model_load import EngineSettings

PROBE_TOKENS = 36  # llama-bench's pp36, the size of a typical chat message
PROBE_DEPTH = 1024  # deep enough that the attention cost shows (it grows with the cached tokens)
PROBE_DECODE = 8
PROBE_REPS = 3  # the fastest of three rounds: other processes share the CPU
UNMEASURED_CPU = (
    "auto: off on the CPU, where llama-bench measured chat-sized prefills faster without it at every "
    "cache depth (llmchat bench --calibrate -m MODEL measures this machine)"
)


@dataclass(frozen=True)
class Choice:
    flash_attn: bool
    why: str


@dataclass(frozen=True)
class Measurement:
    """Seconds for each probe with one setting (the fastest repetition)."""

    pp_shallow_s: float
    pp_deep_s: float
    tg_deep_s: float

    @property
    def turn_s(self) -> float:
        """A chat turn's cost model: a message's prefill, early and late, plus decode late."""
        return self.pp_shallow_s + self.pp_deep_s + self.tg_deep_s


@dataclass(frozen=True)
class Calibration:
    flash_attn: bool
    on: Measurement
    off: Measurement
    depth: int
    threads: int
    measured_at: float

    def reason(self) -> str:
        def rate(seconds: float, tokens: int) -> str:
            return f"{tokens / seconds:.0f}" if seconds > 0 else "?"

        return (
            f"measured on this machine: pp{PROBE_TOKENS} at depth {self.depth} "
            f"{rate(self.on.pp_deep_s, PROBE_TOKENS)} tok/s on vs {rate(self.off.pp_deep_s, PROBE_TOKENS)} off, "
            f"decode {rate(self.on.tg_deep_s, PROBE_DECODE)} vs {rate(self.off.tg_deep_s, PROBE_DECODE)}"
        )


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def calibration_file(folder: Path, model_path: Path, threads: int) -> Path:
    """Where in `folder` the measurement for this model file, machine and thread count is kept."""
    from llmchat.engine.bindings import LIBRARY_VERSION

    path = Path(model_path).resolve()
    stat = path.stat()
    key = {
        "model": [str(path), stat.st_size, stat.st_mtime_ns],
        "cpu": _cpu_name(),
        "host": platform.node(),
        "threads": threads,
        "llama_cpp": LIBRARY_VERSION,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return folder / f"{digest}.json"


def load_calibration(folder: Path, model_path: Path, threads: int) -> Calibration | None:
    try:
        data = json.loads(calibration_file(folder, model_path, threads).read_text())
        return Calibration(
            flash_attn=bool(data["flash_attn"]),
            on=Measurement(**data["on"]),
            off=Measurement(**data["off"]),
            depth=int(data["depth"]),
            threads=int(data["threads"]),
            measured_at=float(data["measured_at"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none yet, or unreadable: measured again by the next --calibrate


def choose(
    model_path: Path,
    *,
    kv_type: str,
    device: str,
    gpu_layers: int | None,
    drafting: bool,
    threads: int | None,
    batched: bool = False,
    folder: Path,
) -> Choice:
    """What `--flash-attn auto` picks, and why (shown by --verbose, /show, info and --json stats).
    `folder`: where `calibrate` keeps its measurements."""
    from llmchat.engine.bindings import llama_cpp
    from llmchat.engine.model_load import physical_cores

    if kv_type != "f16":
        return Choice(True, f"auto: the {kv_type} KV cache needs it")
    if llama_cpp.llama_supports_gpu_offload() and device != "cpu" and gpu_layers != 0:
        return Choice(True, "auto: layers offloaded to the GPU (llama.cpp's own auto turns it on there)")
    if drafting:
        return Choice(True, "auto: drafting needs it, to verify drafted tokens exactly as one-by-one decoding would")
    if batched:
        return Choice(True, "auto: --parallel needs it, for each item's greedy reply to be the one it gets alone")
    measured = load_calibration(folder, model_path, threads or physical_cores())
    if measured is not None:
        return Choice(measured.flash_attn, f"auto: {measured.reason()}")
    return Choice(False, UNMEASURED_CPU)


class _Probe:
    """One loaded engine with one flash-attention setting, and its best times so far."""

    def __init__(self, engine: Engine, depth: int):
        from llmchat.engine.bench import _Runner

        self.engine = engine
        self.depth = depth
        self.runner = _Runner(engine)
        self.label = "on" if engine.settings.flash_attn else "off"
        self.best = {"shallow": float("inf"), "deep": float("inf"), "decode": float("inf")}
        self.message = self.runner.prompt(PROBE_TOKENS)[1:] + [0]
        self.filled = False

    def _timed(self, tokens: list[int]) -> float:
        from llmchat.engine.bindings import llama_cpp

        start = time.perf_counter()
        self.runner.model.eval(tokens)
        llama_cpp.llama_synchronize(self.runner.ctx)
        return time.perf_counter() - start

    def _back_to_depth(self) -> None:
        self.runner.model.keep(self.depth)

    def warm_up(self) -> None:
        self.runner.clear()
        self._timed(self.runner.prompt(PROBE_TOKENS))

    def shallow_round(self) -> None:
        self.runner.clear()
        self.best["shallow"] = min(self.best["shallow"], self._timed(self.runner.prompt(PROBE_TOKENS)))

    def fill(self) -> None:
        """Fill the cache to `depth` once; each deep round is cut back to it afterwards."""
        self.runner.clear()
        self._timed(self.runner.prompt(self.depth))

    def deep_round(self) -> None:
        self.best["deep"] = min(self.best["deep"], self._timed(self.message))
        self._back_to_depth()
        decode = sum(self._timed([token]) for token in self.message[:PROBE_DECODE])
        self.best["decode"] = min(self.best["decode"], decode)
        self._back_to_depth()

    def measurement(self) -> Measurement:
        return Measurement(self.best["shallow"], self.best["deep"], self.best["decode"])


def calibrate(
    model_path: Path,
    settings: EngineSettings,
    *,
    folder: Path,
    depth: int = PROBE_DEPTH,
    progress: Optional[Callable[[str], None]] = None,
) -> Calibration:
    """Measure flash attention on and off for this model and machine, and store the faster in `folder`."""
    from dataclasses import replace

    from llmchat.engine.model_load import physical_cores

    threads = settings.threads or physical_cores()
    n_ctx = depth + 2 * PROBE_TOKENS + 64
    common = replace(settings, n_ctx=n_ctx, threads=threads, lookup=False, draft_model=None, verbose=False)
    # Both settings are loaded at once and measured in alternation, so a burst of load from other
    # processes falls on both rather than on whichever ran second; each keeps its fastest run.
    from llmchat.engine.core import Engine

    probes: list[_Probe] = []
    try:
        for flash_attn in (True, False):
            probes.append(_Probe(Engine.load(model_path, replace(common, flash_attn=flash_attn)), depth))
        for probe in probes:
            probe.warm_up()
        for _ in range(PROBE_REPS):
            for probe in probes:
                probe.shallow_round()
        for probe in probes:
            if progress:
                progress(f"flash attention {probe.label}: filling {depth} tokens")
            probe.fill()
        for rep in range(PROBE_REPS):
            for probe in probes:
                if progress:
                    progress(f"flash attention {probe.label}: round {rep + 1}/{PROBE_REPS} at depth {depth}")
                probe.deep_round()
        on, off = probes[0].measurement(), probes[1].measurement()
    finally:
        for probe in probes:
            probe.engine.close()
    result = Calibration(off.turn_s >= on.turn_s, on, off, depth, threads, time.time())
    target = calibration_file(folder, model_path, threads)
    ensure_private_dir(target.parent)
    write_private_atomic(target, json.dumps(asdict(result), indent=1).encode())
    return result
