"""Sampling parameters, presets and validation.

The knobs change which token is chosen, not what the model knows (see the seed texts): presets
follow the usual table — precise work wants a low temperature and a tight top-k, creative work a
higher temperature and a wide top-p, code sits low.

Each value remembers where it came from (default, model, preset, config, flag, /set), because
`/show` reports it and because the layering rule is easy to get wrong: an explicit flag beats a
preset, a chosen preset beats the model's own `general.sampling.*` defaults, and those beat ours.
"""

from __future__ import annotations

import math
import struct
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Mapping, Sequence

from llmchat.errors import UsageError

PRESETS: dict[str, dict[str, Any]] = {
    "precise": {"temperature": 0.2, "top_k": 10, "top_p": 0.9, "min_p": 0.05, "repeat_penalty": 1.1, "max_tokens": 512},
    "balanced": {"temperature": 0.7, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.1},
    "creative": {"temperature": 1.0, "top_k": 0, "top_p": 0.98, "min_p": 0.02, "repeat_penalty": 1.05},
    "code": {"temperature": 0.2, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0},
}
DEFAULT_PRESET = "balanced"

# GGUF keys written by recent converters (llama.cpp's LLM_KV_GENERAL_SAMPLING_*).
MODEL_SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repeat_penalty",
}

SETTABLE = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "max_tokens", "seed")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    max_tokens: int | None = None  # None: the default reply cap (llmchat.turn.policy), or where the context ends
    seed: int | None = None  # None: a fresh random seed per reply
    stop: tuple[str, ...] = ()
    stop_loops: bool = True  # end a reply that repeats itself (llmchat.engine.stopping.LoopDetector)
    preset: str = DEFAULT_PRESET
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def source_of(self, name: str) -> str:
        return self.sources.get(name, "default")

    def to_record(self) -> dict[str, Any]:
        """The values as stored in history and printed in JSON (without provenance)."""
        record = asdict(self)
        record.pop("sources")
        record["stop"] = list(self.stop)
        return record


def _check(name: str, value: Any) -> Any:
    """Validate one value; the message says what is allowed, since it ends up as the only line the user sees."""
    if name == "temperature":
        value = float(value)
        if not math.isfinite(value) or value < 0:
            raise UsageError(f"temperature must be 0 or more (0 = greedy), got {value:g}")
    elif name == "top_p":
        value = float(value)
        if not (0 < value <= 1):
            raise UsageError(f"top-p must be in (0, 1], got {value:g}")
    elif name == "min_p":
        value = float(value)
        if not (0 <= value <= 1):
            raise UsageError(f"min-p must be in [0, 1], got {value:g}")
    elif name == "top_k":
        value = int(value)
        if value < 0:
            raise UsageError(f"top-k must be 0 (off) or more, got {value}")
    elif name == "repeat_penalty":
        value = float(value)
        if not math.isfinite(value) or value <= 0:
            raise UsageError(f"repeat-penalty must be above 0 (1 = off), got {value:g}")
    elif name == "max_tokens":
        if value is not None:
            value = int(value)
            if value <= 0:
                raise UsageError(f"max-tokens must be at least 1, got {value}")
    elif name == "seed":
        if value is not None:
            value = int(value)
            if value < 0 or value >= 2**32:
                raise UsageError(f"seed must be in 0..{2**32 - 1}, got {value}")
    return value


def parse_value(name: str, text: str) -> Any:
    """Parse a `/set KEY VALUE` or config string into a validated value."""
    if name not in SETTABLE:
        raise UsageError(f"unknown setting {name!r}; one of: {', '.join(SETTABLE)}, preset")
    if name in ("max_tokens", "seed") and text.lower() in ("none", "auto", "random"):
        return None
    try:
        return _check(name, text)
    except ValueError:
        kind = "a whole number" if name in ("top_k", "max_tokens", "seed") else "a number"
        raise UsageError(f"{name} must be {kind}, got {text!r}") from None


def preset_values(name: str) -> dict[str, Any]:
    if name not in PRESETS:
        raise UsageError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return dict(PRESETS[name])


def _as_written(value: Any) -> Any:
    """A float32 from a GGUF file as its author wrote it: 0.9, not 0.8999999761581421 (the
    shortest decimal that is the same float32), for /show and the history."""
    if not isinstance(value, float) or not math.isfinite(value):
        return value
    try:
        single = struct.pack("<f", value)
    except OverflowError:
        return value
    if struct.unpack("<f", single)[0] != value:
        return value  # not a float32: keep it as it is
    for digits in range(1, 10):
        shortest = float(f"{value:.{digits}g}")
        if struct.pack("<f", shortest) == single:
            return shortest
    return value


def model_defaults(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The model author's recommended sampling, from `general.sampling.*` GGUF keys."""
    found = {}
    for key, name in MODEL_SAMPLING_KEYS.items():
        if key in metadata:
            try:
                found[name] = _check(name, _as_written(metadata[key]))
            except (UsageError, ValueError, TypeError):
                continue  # a bad value in a model file is ignored, not fatal
    return found


def with_model_defaults(params: SamplingParams, recommended: Mapping[str, Any]) -> SamplingParams:
    """`/model NAME`: the new model's recommended sampling (`model_defaults` of its metadata) in
    place of the old model's. Only values that came from the old model or from our defaults move;
    whatever the user chose (a flag, the config, a preset, `-p NAME`, `/prompt NAME`, `/set`) beats
    a model's recommendation in `build_sampling`, and so it stays."""
    ours = {name: getattr(SamplingParams(), name) for name in SETTABLE} | preset_values(DEFAULT_PRESET)
    values: dict[str, Any] = {}
    sources = dict(params.sources)
    for name in SETTABLE:
        if params.source_of(name) not in ("default", "model"):
            continue
        if name in recommended:
            values[name], sources[name] = _check(name, recommended[name]), "model"
        else:
            values[name], sources[name] = ours[name], "default"
    return replace(params, **values, sources=sources)


def build_sampling(
    *,
    model_metadata: Mapping[str, Any] | None = None,
    config_values: Mapping[str, Any] | None = None,
    config_preset: str | None = None,
    flag_preset: str | None = None,
    flags: Mapping[str, Any] | None = None,
    stop: tuple[str, ...] = (),
    stop_loops: bool = True,
    prompt_layers: Sequence[tuple[str, Mapping[str, Any], str | None]] = (),
) -> SamplingParams:
    """Layer the sources, lowest first: ours < model < config preset < config values < a saved
    prompt's preset and values (`-p NAME`: `prompt_layers`, as (source, values, preset name)) <
    --preset < flags."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def apply(layer: Mapping[str, Any], source: str) -> None:
        for name, value in layer.items():
            if value is None and name not in ("seed", "max_tokens"):
                continue
            values[name] = _check(name, value)
            sources[name] = source

    preset_name = DEFAULT_PRESET
    apply(preset_values(DEFAULT_PRESET), "default")
    apply(model_defaults(model_metadata or {}), "model")
    if config_preset:
        preset_name = config_preset
        apply(preset_values(config_preset), f"config preset {config_preset}")
    apply({k: v for k, v in (config_values or {}).items() if k in SETTABLE}, "config")
    for source, layer, layer_preset in prompt_layers:
        preset_name = layer_preset or preset_name
        apply(layer, source)
    if flag_preset:
        preset_name = flag_preset
        apply(preset_values(flag_preset), f"preset {flag_preset}")
    apply({k: v for k, v in (flags or {}).items() if v is not None}, "flag")
    return SamplingParams(**values, stop=tuple(stop), stop_loops=stop_loops, preset=preset_name, sources=sources)


def with_setting(params: SamplingParams, name: str, text: str) -> SamplingParams:
    """`/set KEY VALUE` in chat."""
    if name == "preset":
        layer = preset_values(text)
        sources = dict(params.sources) | {k: f"preset {text}" for k in layer}
        return replace(params, **layer, preset=text, sources=sources)
    value = parse_value(name, text)
    return replace(params, **{name: value}, sources=dict(params.sources) | {name: "/set"})


SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams) if f.name != "sources")
