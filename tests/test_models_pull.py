"""`llmchat models pull` against a hub stand-in on 127.0.0.1 (tests/hub_server.py) that serves the
SmolLM2 test model the way the hub's file endpoint does: a full download, a download cut mid-way
and resumed (in the same run, and by a second run), a 404, a missing quantization, a gated repo,
and offline. Nothing here leaves 127.0.0.1: HF_ENDPOINT points at the stand-in.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from hub_server import HubServer, sha256_of
from test_models_layout import STORE_VARIABLES

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
FILE = "smollm2-135m-instruct-q4_1.gguf"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub(tmp_path, monkeypatch, smollm2_path, puppet_projector):
    for name in STORE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    with HubServer() as server:  # the repo's projector: the puppet (tests/media_fixtures.py)
        server.state.add_repo(REPO, COMMIT, {FILE: smollm2_path, "mmproj-SmolLM2-F16.gguf": puppet_projector})
        server.state.add_repo("gated/SmolLM2-GGUF", COMMIT, {FILE: smollm2_path}, gated=True)
        server.state.token = "hf_test_token"
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        yield server


def cache_repo(tmp_path: Path, repo: str = REPO) -> Path:
    return tmp_path / "hf-home" / "hub" / ("models--" + repo.replace("/", "--"))


def test_a_pull_writes_the_hf_cache_layout_and_prints_the_path(hub, cli, tmp_path, smollm2_path):
    # No quantization given: Q4_K_M, Q8_0, else the first model file. The bar is forced on (stderr is a pipe).
    result = cli("models", "pull", f"hf:{REPO}", "--no-mmproj", env={"LLMCHAT_PROGRESS": "1"})
    assert result.returncode == 0, result.stderr
    megabytes = f"{smollm2_path.stat().st_size / 1e6:.1f}"
    assert f"{FILE} " in result.stderr and f"{megabytes}/{megabytes} MB" in result.stderr  # the bar's last state
    sha = sha256_of(smollm2_path)
    folder = cache_repo(tmp_path)
    pointer = folder / "snapshots" / COMMIT / FILE
    assert result.stdout == f"{pointer}\n"
    assert pointer.is_symlink() and os.path.realpath(pointer) == str(folder / "blobs" / sha)
    assert (folder / "blobs" / sha).read_bytes() == smollm2_path.read_bytes()
    assert (folder / "refs" / "main").read_text() == COMMIT
    assert not list((folder / "blobs").glob("*.incomplete"))
    assert f"llmchat chat -m hf:{REPO}/{FILE}" in result.stderr
    # Other tools and llmchat see it: it is in the list, and `-m hf:REPO` names it.
    listed = json.loads(cli("models", "list", "--json").stdout)
    assert [e["ref"] for e in listed] == [f"hf:{REPO}:Q4_1"]
    # --no-mmproj: the projector was not downloaded, and the CDN got exactly one GET.
    cdn_gets = [r for r in hub.state.log if r.server == "cdn" and r.method == "GET"]
    assert len(cdn_gets) == 1 and cdn_gets[0].range is None


def test_a_pull_fetches_the_repos_projector_and_the_model_then_sees(hub, cli, tmp_path, puppet_projector):
    result = cli("models", "pull", f"hf:{REPO}")
    assert result.returncode == 0, result.stderr
    snapshot = cache_repo(tmp_path) / "snapshots" / COMMIT
    assert result.stdout.splitlines() == [str(snapshot / FILE), str(snapshot / "mmproj-SmolLM2-F16.gguf")]
    assert (snapshot / "mmproj-SmolLM2-F16.gguf").read_bytes() == puppet_projector.read_bytes()
    listed = json.loads(cli("models", "list", "--json").stdout)
    assert [(e["ref"], e["media"]["vision"], e["media"]["audio"]) for e in listed] == [(f"hf:{REPO}:Q4_1", True, False)]
    assert "instruct +images" in cli("models", "list", env={"COLUMNS": "200"}).stdout
    info = json.loads(cli("info", "-m", f"hf:{REPO}", "--json").stdout)
    assert info["media"]["vision"] is True and info["media"]["projector"].endswith("mmproj-SmolLM2-F16.gguf")


def test_a_second_pull_downloads_nothing(hub, cli):
    assert cli("models", "pull", f"hf:{REPO}:Q4_1").returncode == 0
    hub.state.log.clear()
    again = cli("models", "pull", f"hf:{REPO}/{FILE}")
    assert again.returncode == 0, again.stderr
    assert not [r for r in hub.state.log if r.server == "cdn"]


def test_a_connection_dropped_mid_file_is_resumed_with_range(hub, cli, tmp_path, smollm2_path):
    hub.state.cut_next = 30_000_000
    result = cli("models", "pull", f"hf:{REPO}:Q4_1", "--no-mmproj")
    assert result.returncode == 0, result.stderr
    ranges = [r.range for r in hub.state.log if r.server == "cdn" and r.method == "GET"]
    # huggingface_hub writes whole 10 MiB chunks, so it resumes from the last one it wrote.
    assert len(ranges) == 2 and ranges[0] is None
    assert 0 < int(ranges[1].removeprefix("bytes=").rstrip("-")) <= 30_000_000
    pointer = cache_repo(tmp_path) / "snapshots" / COMMIT / FILE
    assert pointer.read_bytes() == smollm2_path.read_bytes()


def test_an_interrupted_pull_continues_where_it_stopped_on_the_next_run(hub, cli, tmp_path, smollm2_path):
    # The first GET gets 30 MB, then the network stays down: the retry is refused too.
    hub.state.cut_next = 30_000_000
    hub.state.refuse_after_cut = 503
    first = cli("models", "pull", f"hf:{REPO}:Q4_1", "--no-mmproj")
    assert first.returncode == 1, first.stderr
    assert first.stderr.startswith("llmchat: error: ") and first.stderr.count("\n") == 1
    assert "answered HTTP 503" in first.stderr
    sha = sha256_of(smollm2_path)
    partial = cache_repo(tmp_path) / "blobs" / f"{sha}.incomplete"
    kept = partial.stat().st_size
    assert 0 < kept <= 30_000_000
    assert partial.read_bytes() == smollm2_path.read_bytes()[:kept]
    assert not (cache_repo(tmp_path) / "blobs" / sha).exists()

    # The network is back: the next run asks only for the rest.
    hub.state.refuse_cdn = hub.state.refuse_after_cut = None
    hub.state.log.clear()
    second = cli("models", "pull", f"hf:{REPO}:Q4_1", "--no-mmproj")
    assert second.returncode == 0, second.stderr
    ranges = [r.range for r in hub.state.log if r.server == "cdn" and r.method == "GET"]
    assert ranges == [f"bytes={kept}-"]
    assert (cache_repo(tmp_path) / "blobs" / sha).read_bytes() == smollm2_path.read_bytes()
    assert not partial.exists()


def test_a_missing_quantization_lists_the_choices(hub, cli):
    result = cli("models", "pull", f"hf:{REPO}:Q8_0")
    assert result.returncode == 2
    assert "choose one of: Q4_1" in result.stderr and result.stderr.count("\n") == 1
    assert not [r for r in hub.state.log if r.server == "cdn"]


def test_an_unknown_repository_is_a_clear_error(hub, cli):
    result = cli("models", "pull", "hf:nobody/no-such-model-GGUF")
    assert result.returncode == 3
    assert result.stderr == (
        f"llmchat: error: no repository nobody/no-such-model-GGUF on {hub.endpoint}; "
        "check the name, or set HF_TOKEN for a private repo\n"
    )


def test_a_file_the_hub_does_not_have_is_a_404_error(hub, cli):
    hub.state.repos[REPO].listed_only = ("ghost-Q8_0.gguf",)
    result = cli("models", "pull", f"hf:{REPO}:Q8_0")
    assert result.returncode == 3
    assert result.stderr == (
        f"llmchat: error: {REPO} lists ghost-Q8_0.gguf but {hub.endpoint} has no such file (HTTP 404); try again later\n"
    )
    assert [r.path for r in hub.state.log if r.server == "hub" and r.method == "HEAD"] == [
        f"/{REPO}/resolve/{COMMIT}/ghost-Q8_0.gguf"
    ]


def test_a_gated_repository_needs_hf_token_and_the_token_stays_on_the_hub(hub, cli):
    refused = cli("models", "pull", "hf:gated/SmolLM2-GGUF")
    assert refused.returncode == 3
    assert "is gated" in refused.stderr and "HF_TOKEN" in refused.stderr
    hub.state.log.clear()
    allowed = cli("models", "pull", "hf:gated/SmolLM2-GGUF", env={"HF_TOKEN": "hf_test_token"})
    assert allowed.returncode == 0, allowed.stderr
    assert all(r.authorization == "Bearer hf_test_token" for r in hub.state.log if r.server == "hub")
    assert all(r.authorization is None for r in hub.state.log if r.server == "cdn")  # never sent to the CDN


def test_offline_is_a_clear_error(hub, cli):
    offline = cli("models", "pull", f"hf:{REPO}", env={"HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 1
    assert offline.stderr == "llmchat: error: HF_HUB_OFFLINE is set, so nothing can be downloaded; unset it to pull\n"
    assert hub.state.log == []
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    unreachable = cli("models", "pull", f"hf:{REPO}", env={"HF_ENDPOINT": closed})
    assert unreachable.returncode == 1
    assert unreachable.stderr.startswith(f"llmchat: error: cannot reach {closed} (ConnectError")
    assert unreachable.stderr.count("\n") == 1


def test_bad_specs_are_usage_errors(hub, cli):
    for spec in ("hf:just-a-name", "ollama:qwen3:4b", f"hf:{REPO}/README.md"):
        result = cli("models", "pull", spec)
        assert result.returncode == 2, spec
        assert result.stderr.count("\n") == 1
    assert hub.state.log == []


def test_nothing_is_downloaded_unless_pull_is_typed(hub, cli):
    for args in (("ask", "-m", f"hf:{REPO}", "hi"), ("info", "-m", f"hf:{REPO}:Q4_1"), ("models", "list")):
        result = cli(*args)
        assert result.returncode in (0, 3), result.stderr
    assert hub.state.log == []
    missing = cli("ask", "-m", f"hf:{REPO}", "hi")
    assert f"llmchat models pull hf:{REPO}" in missing.stderr
