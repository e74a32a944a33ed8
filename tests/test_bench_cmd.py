"""`llmchat bench` (shape of its output and flag checks) and the engine flags it shares with `ask`:
--kv-type (quantized KV turns flash attention on) and --device gpu on a CPU-only build.

No wall-clock assertions: only that the numbers exist and are positive.
"""

from __future__ import annotations

import json

import pytest

GREEDY = ("--temperature", "0", "--seed", "1", "--no-history")


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("llmchat: error:")]


def test_bench_json_shape(cli):
    result = cli("bench", "-p", "32", "-n", "8", "-r", "2", "--json", "-t", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, "one JSON object, nothing else on stdout"
    data = json.loads(lines[0])
    for key in ("model", "backend", "threads", "n_prompt", "n_gen", "reps", "pp", "tg", "ttft_s"):
        assert key in data, key
    from llmchat.engine.devices import devices

    gpus = [d for d in devices() if d.is_gpu]
    assert data["model"] and (data["backend"] != "CPU" if gpus else data["backend"] == "CPU")
    assert data["threads"] == 2
    assert (data["n_prompt"], data["n_gen"], data["reps"]) == (32, 8, 2)
    for test in ("pp", "tg"):
        series = data[test]
        assert series["mean"] > 0 and series["sd"] >= 0
        assert len(series["samples"]) == 2
        assert all(sample > 0 for sample in series["samples"])
    assert data["ttft_s"]["mean"] > 0 and data["ttft_s"]["sd"] >= 0
    assert data["size_bytes"] > 0 and data["n_params"] > 0


def test_bench_table(cli):
    result = cli("bench", "-p", "16", "-n", "4", "-r", "1")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "| model" in out and "t/s" in out
    rows = [line for line in out.splitlines() if line.startswith("|") and ("pp16" in line or "tg4" in line)]
    assert len(rows) == 2, out
    assert "TTFT pp16" in out


@pytest.mark.parametrize(
    "args, names",
    [
        (("-r", "0"), "--reps"),
        (("-p", "0"), "--n-prompt"),
        (("-n", "0"), "--n-gen"),
        (("-p", "-5"), "--n-prompt"),
        (("--ctx", "128", "-p", "512"), "--ctx"),
        (("--lookup",), "--lookup"),
        (("--threads", "0"), "--threads"),
        (("-p", "many"), "--n-prompt"),
    ],
)
def test_bench_bad_flags_exit_2_with_one_line(cli, args, names):
    result = cli("bench", *args)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stdout == ""
    errors = error_lines(result.stderr)
    assert len(errors) == 1, result.stderr
    assert names in errors[0]
    assert "Traceback" not in result.stderr


def test_kv_type_q8_0_runs_with_flash_attention(cli):
    result = cli("ask", *GREEDY, "--kv-type", "q8_0", "--max-tokens", "12", "--verbose", "--json", "Name a colour.")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["reply"] and data["stats"]["generated_tokens"] > 0
    assert "flash attention on, KV cache q8_0" in result.stderr


def test_quantized_kv_without_flash_attention_is_a_usage_error(cli):
    # llama.cpp cannot build a quantized V cache without flash attention; say so before loading.
    result = cli("ask", *GREEDY, "--kv-type", "q4_0", "--no-flash-attn", "hi")
    assert result.returncode == 2
    assert result.stdout == ""
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and "--kv-type q4_0" in errors[0] and "--no-flash-attn" in errors[0]


def test_no_flash_attn_still_answers(cli):
    result = cli("ask", *GREEDY, "--no-flash-attn", "--max-tokens", "8", "--verbose", "--json", "Name a colour.")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["stats"]["generated_tokens"] > 0
    assert "flash attention off, KV cache f16" in result.stderr


def test_kv_type_bogus_is_a_usage_error(cli):
    result = cli("ask", *GREEDY, "--kv-type", "bogus", "hi")
    assert result.returncode == 2
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and "--kv-type" in errors[0] and "bogus" in errors[0]


@pytest.mark.parametrize("command", ["ask", "bench"])
def test_device_gpu_on_a_cpu_only_build(cli, command):
    import llama_cpp

    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("this llama-cpp-python build can offload to a GPU")
    args = (
        ("ask", *GREEDY, "--device", "gpu", "hi")
        if command == "ask"
        else ("bench", "-p", "8", "-n", "2", "-r", "1", "--device", "gpu")
    )
    result = cli(*args)
    assert result.returncode == 2, result.stderr
    errors = error_lines(result.stderr)
    assert len(errors) == 1, result.stderr
    assert "CMAKE_ARGS" in errors[0] and "--device" in errors[0]
    assert "Traceback" not in result.stderr
