"""The projector a model store keeps with a model (llmchat.models.projectors): an Ollama model's
`application/vnd.ollama.image.projector` layer, a Hugging Face cache repo's mmproj file; and
`models list` saying which models see. Stores are laid out in a temporary folder as each tool
writes them (tests/test_models_layout.py), the projector being the puppet (tests/media_fixtures.py).
"""

from __future__ import annotations

import json

import pytest
from test_models_layout import STORE_VARIABLES, add_hf_file, add_ollama_model, ollama_gguf_layer, sha256_of

from tests.media_fixtures import quadrants

OLLAMA_PROJECTOR = "application/vnd.ollama.image.projector"


@pytest.fixture
def store_home(tmp_path, monkeypatch, isolated_home):
    for name in STORE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    return tmp_path


def test_an_ollama_models_projector_layer_lets_it_see(cli, store_home, smollm2_path, puppet_projector):
    root = store_home / "ollama"
    model = ollama_gguf_layer(root, smollm2_path, sha256_of(smollm2_path))
    projector_hex = sha256_of(puppet_projector)
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{projector_hex}").write_bytes(puppet_projector.read_bytes())
    projector = {"mediaType": OLLAMA_PROJECTOR, "digest": f"sha256:{projector_hex}", "size": 1}
    add_ollama_model(root, "smolvis", "latest", [model, projector])
    listed = {entry["ref"]: entry["media"] for entry in json.loads(cli("models", "list", "--json").stdout)}
    assert listed["ollama:smolvis:latest"] == {
        "projector": str(root / "blobs" / f"sha256-{projector_hex}"),
        "vision": True,
        "audio": False,
    }
    picture = store_home / "rgb.png"
    picture.write_bytes(quadrants("red", "green", "blue", "red"))
    seen = cli("ask", "-m", "ollama:smolvis", "-n", "4", "--no-history", "--json", "-f", str(picture), "Colours?")
    assert seen.returncode == 0, seen.stderr
    assert json.loads(seen.stdout)["stats"]["media_tokens"] == 4


def test_a_hf_repos_projector_above_the_models_folder_is_found(cli, store_home, smollm2_path, puppet_projector):
    cache = store_home / "hf"
    repo = "someone/SmolVLM-GGUF"
    add_hf_file(cache, repo, "Q4_1/smol-Q4_1.gguf", smollm2_path, sha256_of(smollm2_path))
    add_hf_file(cache, repo, "mmproj-smol-F16.gguf", puppet_projector, sha256_of(puppet_projector))
    info = json.loads(cli("info", "-m", f"hf:{repo}", "--json").stdout)
    assert info["media"]["vision"] is True and info["media"]["projector"].endswith("mmproj-smol-F16.gguf")
    listed = json.loads(cli("models", "list", "--json").stdout)
    assert [(e["ref"], e["media"]["vision"]) for e in listed] == [(f"hf:{repo}:Q4_1", True)]
