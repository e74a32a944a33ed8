"""`--flash-attn auto|on|off`: what auto picks, why, and that the choice shows in the --json stats."""

from __future__ import annotations

import json

import pytest

ASK = ("ask", "--temperature", "0", "--max-tokens", "2", "--ctx", "512", "--json", "Name a colour.")


def stats_of(result) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["stats"]


def test_auto_rules_before_any_measurement(smollm2_path, tmp_path):
    from llmchat.engine.calibrate import choose

    def pick(**changes):
        args = dict(kv_type="f16", device="cpu", gpu_layers=None, drafting=False, threads=2) | changes
        return choose(smollm2_path, folder=tmp_path, **args)

    quantized = pick(kv_type="q8_0")
    assert quantized.flash_attn and "q8_0 KV cache needs it" in quantized.why
    drafting = pick(drafting=True)
    assert drafting.flash_attn and "drafting" in drafting.why
    # Without a calibration: off on the CPU, where llama-bench measured it slower at chat depths.
    unmeasured = pick()
    assert not unmeasured.flash_attn and "off on the CPU" in unmeasured.why and "bench --calibrate" in unmeasured.why
    import llama_cpp

    # With layers on a GPU: on, as llama.cpp's own auto; a CPU-only build has nothing to offload.
    gpu = bool(llama_cpp.llama_supports_gpu_offload())
    offloaded = pick(device="auto")
    assert offloaded.flash_attn is gpu and (("GPU" in offloaded.why) is gpu)
    assert pick(device="auto", gpu_layers=0) == unmeasured
    assert pick(threads=1) == unmeasured


def test_calibration_measures_both_settings_and_auto_follows_it(smollm2_path, cli):
    from llmchat import paths
    from llmchat.engine import EngineSettings
    from llmchat.engine.calibrate import calibrate, choose, load_calibration

    folder = paths.cache_dir() / "flash_attn"  # where `ask` looks (llmchat.startup.loading), in the test's home
    result = calibrate(smollm2_path, EngineSettings(threads=2, batch_size=512), folder=folder, depth=128)
    for measured in (result.on, result.off):
        assert measured.pp_shallow_s > 0 and measured.pp_deep_s > 0 and measured.tg_deep_s > 0
    assert result.flash_attn == (result.off.turn_s >= result.on.turn_s)
    assert load_calibration(folder, smollm2_path, 2) == result

    picked = choose(
        smollm2_path, kv_type="f16", device="cpu", gpu_layers=None, drafting=False, threads=2, folder=folder
    )
    assert picked.flash_attn == result.flash_attn and picked.why.startswith("auto: measured on this machine")
    # Other thread counts are other measurements.
    assert load_calibration(folder, smollm2_path, 1) is None

    stats = stats_of(cli(*ASK, "--threads", "2"))
    assert stats["flash_attn"] is result.flash_attn
    assert stats["flash_attn_why"].startswith("auto: measured on this machine: pp36 at depth 128")


@pytest.mark.model
def test_auto_choice_and_explicit_settings_in_json_stats(cli, isolated_home):
    stats = stats_of(cli(*ASK))
    assert stats["flash_attn"] is False and stats["flash_attn_why"].startswith("auto: off on the CPU")
    stats = stats_of(cli(*ASK, "--lookup"))
    assert stats["flash_attn"] is True and stats["flash_attn_why"].startswith("auto: drafting needs it")
    stats = stats_of(cli(*ASK, "--flash-attn", "on"))
    assert stats["flash_attn"] is True and stats["flash_attn_why"] == "set by --flash-attn on"

    stats = stats_of(cli(*ASK, "--flash-attn", "off"))
    assert stats["flash_attn"] is False and stats["flash_attn_why"] == "set by --flash-attn off"
    stats = stats_of(cli(*ASK, "--no-flash-attn"))
    assert stats["flash_attn"] is False and stats["flash_attn_why"] == "set by --no-flash-attn"

    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text("flash_attn = false\n")
    stats = stats_of(cli(*ASK))
    assert stats["flash_attn"] is False and "config" in stats["flash_attn_why"]
    stats = stats_of(cli(*ASK, "--flash-attn", "auto"))
    assert stats["flash_attn"] is False and stats["flash_attn_why"].startswith("auto: off on the CPU")


def test_bad_values_are_usage_errors(cli, isolated_home):
    result = cli("ask", "--flash-attn", "sometimes", "hi")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "--flash-attn must be auto, on or off" in result.stderr

    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text('flash_attn = "sometimes"\n')
    result = cli("ask", "hi")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "flash_attn" in result.stderr


def test_config_accepts_auto(isolated_home):
    from llmchat.config import load_config

    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text('flash_attn = "auto"\nprompt_cache = false\n')
    config = load_config()
    assert config.flash_attn == "auto" and config.prompt_cache is False
