"""What kind of model a GGUF is (base, instruct, reasoning; tools), from its metadata and template.

The two test models are the anchors: SmolLM2-135M-Instruct is an instruct model, Gemma 3 270M a
base model. Small GGUFs written with the `gguf` package cover reasoning and tool templates.
"""

from __future__ import annotations

import json

import pytest
from test_models_layout import write_tiny_gguf

from llmchat.gguf.reader import read_metadata
from llmchat.models.kind import BASE, INSTRUCT, REASONING, classify, kind_of, template_features

QWEN3_LIKE_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n' }}{%- for tool in tools %}{{ tool | tojson }}"
    "{%- endfor %}{%- endif %}{%- for message in messages %}{%- if message.role == 'assistant' and "
    "message.reasoning_content %}{{ '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and "
    "enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


def test_the_test_models_kinds(smollm2_path, gemma_path):
    smol = kind_of(read_metadata(smollm2_path))
    gemma = kind_of(read_metadata(gemma_path))
    assert (smol.kind, smol.tools) == (INSTRUCT, False)
    assert "instruct" in smol.why.lower()  # its file name says Instruct; its finetune field does not
    assert (gemma.kind, gemma.tools) == (BASE, False)
    assert gemma.why == "no chat template and no instruct finetune in its metadata or name"


def test_metadata_words_and_templates_decide_the_kind():
    plain = template_features("{{ messages }}")
    none = template_features(None)
    thinking = template_features(QWEN3_LIKE_TEMPLATE)
    assert (thinking.thinking, thinking.tools) == (True, True)
    assert classify(finetune="Instruct", features=none).kind == INSTRUCT
    assert classify(name="Gemma 3 1b It", features=none).kind == INSTRUCT
    assert classify(name="Qwen2.5 0.5B", basename="qwen2.5", features=plain).kind == INSTRUCT  # a template
    assert classify(name="Qwen2.5 0.5B Base", features=plain).kind == BASE  # "base" beats a stray template
    assert classify(other_names=["gemma-3-1b-pt-q4_0.gguf"], features=none).kind == BASE
    assert classify(tags=["text-generation"], features=none).kind == BASE
    reasoning = classify(name="Qwen3 4B", features=thinking)
    assert (reasoning.kind, reasoning.tools, reasoning.label) == (REASONING, True, "reasoning + tools")
    assert classify(name="DeepSeek R1 Distill Qwen 1.5B", features=plain).kind == REASONING
    assert classify(name="gpt-oss 20b", features=plain).kind == INSTRUCT  # "gpt" is not "pt"
    assert classify(finetune=42, tags="not-a-list", features=none).kind == BASE  # wrong types are ignored


@pytest.fixture
def kinds_folder(tmp_path, monkeypatch):
    from llmchat import paths

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("HF_HOME", "HF_HUB_CACHE", "LLAMA_CACHE", "OLLAMA_MODELS", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    folder = paths.models_dir()
    folder.mkdir(parents=True)
    write_tiny_gguf(folder / "tiny-thinker.gguf", name="Tiny Thinker", template=QWEN3_LIKE_TEMPLATE)
    write_tiny_gguf(folder / "tiny-base.gguf", name="Tiny", template=None)
    write_tiny_gguf(folder / "tiny-chat.gguf", name="Tiny Chat", template="{{ messages }}")
    return folder


def test_models_list_and_info_show_the_kind(kinds_folder, cli):
    result = cli("models", "list", "--json")
    assert result.returncode == 0, result.stderr
    by_name = {e["name"]: e for e in json.loads(result.stdout)}
    assert (by_name["Tiny Thinker"]["kind"], by_name["Tiny Thinker"]["tools"]) == ("reasoning", True)
    assert by_name["Tiny Thinker"]["reasoning"] is True
    assert by_name["Tiny"]["kind"] == "base"
    assert by_name["Tiny Chat"]["kind"] == "instruct"
    info = cli("info", "-m", "tiny-thinker", "--json")
    assert info.returncode == 0, info.stderr
    assert (json.loads(info.stdout)["kind"], json.loads(info.stdout)["tools"]) == ("reasoning", True)


def test_info_names_the_kind_of_both_test_models(cli, smollm2_path, gemma_path):
    for path, kind in ((smollm2_path, "instruct"), (gemma_path, "base")):
        result = cli("info", "-m", str(path), "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["kind"] == kind
    text = cli("info", "-m", str(gemma_path), env={"COLUMNS": "200"})
    assert "base (no chat template" in text.stdout


def test_an_instruct_model_gets_no_base_model_warning(cli, smollm2_path):
    result = cli("ask", "-m", str(smollm2_path), "--max-tokens", "4", "--seed", "1", "--no-history", "hi")
    assert result.returncode == 0, result.stderr
    assert "base model" not in result.stderr
