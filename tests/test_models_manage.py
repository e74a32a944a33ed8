"""`models show`, `models rm` and `models alias` over the real store layouts of test_models_layout.py.

rm deletes only from llmchat's models folder and the HF cache (after asking, or with --yes); it
refuses Ollama's, LM Studio's and the user's own folders and says which tool owns the file.
"""

from __future__ import annotations

import json
import os

from test_models_layout import link_or_copy, model_hashes, stores  # noqa: F401  (fixtures)

GEMMA_HF = "hf:unsloth/gemma-3-270m-GGUF:Q4_K_M"
SMOL_HF = "hf:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1"


def test_show_prints_what_info_prints_plus_where_and_what_kind(stores, cli):  # noqa: F811
    shown = cli("models", "show", "ollama:gemma3:270m", "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert (data["source"], data["owner"], data["kind"]) == ("ollama", "Ollama", "base")
    assert data["path"].startswith(str(stores.ollama / "blobs" / "sha256-"))
    assert data["architecture"] == "gemma3" and data["contexts"] and data["runtime"]  # info's own fields
    text = cli("models", "show", SMOL_HF, env={"COLUMNS": "200"})
    assert text.returncode == 0, text.stderr
    for expected in ("source", "hf", "the Hugging Face cache", "kind", "instruct", "KV cache per token"):
        assert expected in text.stdout


def test_rm_deletes_one_file_of_an_hf_repo_and_keeps_the_rest(stores, cli):  # noqa: F811
    repo = stores.hf_cache / "models--unsloth--gemma-3-270m-GGUF"
    pointer = next((repo / "snapshots").rglob("gemma-3-270m-Q4_K_M.gguf"))
    blob = os.path.realpath(pointer)
    result = cli("models", "rm", GEMMA_HF, "--yes")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Deleted {GEMMA_HF} (241.4 MiB freed)")
    assert not os.path.lexists(pointer) and not os.path.exists(blob)
    assert next((repo / "snapshots").rglob("mmproj-F16.gguf")).exists()  # the repo's other file stays
    # The last file of a repo takes the repo folder with it.
    smol_repo = stores.hf_cache / "models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF"
    assert cli("models", "rm", SMOL_HF, "--yes").returncode == 0
    assert not smol_repo.exists()
    refs = [e["ref"] for e in json.loads(cli("models", "list", "--json").stdout)]
    assert GEMMA_HF not in refs and SMOL_HF not in refs and "ollama:gemma3:270m" in refs


def test_rm_never_deletes_from_ollama_lm_studio_or_the_users_folders(stores, cli):  # noqa: F811
    ollama = cli("models", "rm", "ollama:gemma3:270m", "--yes")
    assert ollama.returncode == 1
    assert "belongs to Ollama" in ollama.stderr and "ollama rm gemma3:270m" in ollama.stderr
    lmstudio = cli("models", "rm", "lmstudio:lmstudio-community/SmolLM2-135M-Instruct-GGUF", "--yes")
    assert lmstudio.returncode == 1 and "belongs to LM Studio" in lmstudio.stderr
    own = cli("models", "rm", "tiny-split", "--yes")
    assert own.returncode == 1 and "model_dirs" in own.stderr
    for result in (ollama, lmstudio, own):
        assert result.stderr.count("\n") == 1
    assert len(json.loads(cli("models", "list", "--json").stdout)) == 7  # nothing went


def test_rm_asks_first_and_deletes_from_llmchats_folder(stores, cli, gemma_path):  # noqa: F811
    from llmchat import paths

    mine = link_or_copy(gemma_path, paths.models_dir() / "my-gemma.gguf")
    unasked = cli("models", "rm", "my-gemma")  # stdin is not a terminal: no one can answer
    assert unasked.returncode == 2 and "pass --yes" in unasked.stderr
    assert mine.exists()
    assert cli("models", "rm", "my-gemma", "--yes").returncode == 0
    assert not mine.exists() and gemma_path.exists()


def test_alias_writes_the_config_alias_that_m_reads(stores, cli):  # noqa: F811
    from llmchat import paths

    made = cli("models", "alias", "tiny", "ollama:smollm2:135m")
    assert made.returncode == 0, made.stderr
    assert made.stdout == "tiny -> ollama:smollm2:135m\n"
    assert '[models.tiny]\npath = "ollama:smollm2:135m"\n' in paths.config_file().read_text()
    assert "model_dirs" in paths.config_file().read_text()  # what was there is kept
    info = cli("info", "-m", "tiny", "--json")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["path"].startswith(str(stores.ollama / "blobs"))
    # A path target is stored as an absolute path.
    by_path = cli("models", "alias", "split", str(stores.model_dir / "tiny-split-00001-of-00002.gguf"))
    assert by_path.returncode == 0, by_path.stderr
    assert f'path = "{stores.model_dir}/tiny-split-00001-of-00002.gguf"' in paths.config_file().read_text()


def test_alias_refuses_a_taken_or_bad_name_and_a_missing_target(stores, cli):  # noqa: F811
    from llmchat import paths

    assert cli("models", "alias", "tiny", "ollama:smollm2:135m").returncode == 0
    before = paths.config_file().read_text()
    taken = cli("models", "alias", "tiny", "ollama:gemma3:270m")
    assert taken.returncode == 2 and "already exists" in taken.stderr
    bad = cli("models", "alias", "my model", "ollama:gemma3:270m")
    assert bad.returncode == 2
    missing = cli("models", "alias", "other", "ollama:nothing:here")
    assert missing.returncode == 3
    assert paths.config_file().read_text() == before
