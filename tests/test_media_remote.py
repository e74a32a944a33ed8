"""Images through `--server`: a real llama-server started with the puppet projector
(tests/media_fixtures.py) beside SmolLM2, on a free 127.0.0.1 port (tests/servers/harness.py).

The OpenAI-compatible engine sends an attached image as an `image_url` part (a data: URL) where
the message's marker stands. The puppet makes the image's four patches encode to exactly the
embeddings of " red green blue red", so on the same server the reply to the image equals the reply
to those words, and the server counts the same prompt tokens for both: CPU-independent, since both
run on one server.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from servers import harness
from test_remote import one_error_line, write_config

from tests.media_fixtures import quadrants

pytestmark = pytest.mark.server

GREEDY = ("--temperature", "0", "--seed", "1", "-n", "12", "--repeat-penalty", "1", "--no-history", "--json")


@pytest.fixture(scope="module")
def seeing_server(smollm2_path, puppet_projector, tmp_path_factory):
    server = harness.start_llama_server(
        smollm2_path, tmp_path_factory.mktemp("media-server"), extra=["--mmproj", str(puppet_projector)]
    )
    yield server
    server.stop()


def test_an_image_through_an_openai_compatible_server_is_seen_as_its_words(cli, seeing_server, isolated_home, tmp_path):
    write_config(isolated_home, f'[servers.vis]\nurl = "{seeing_server.url}"\nkind = "openai"\n')
    picture = tmp_path / "rgb.png"
    picture.write_bytes(quadrants("red", "green", "blue", "red"))
    seen = cli("ask", "--server", "vis", *GREEDY, "-f", str(picture), "What colours are these?")
    read = cli("ask", "--server", "vis", *GREEDY, " red green blue red\n\nWhat colours are these?")
    assert seen.returncode == 0 and read.returncode == 0, seen.stderr + read.stderr
    image, text = json.loads(seen.stdout), json.loads(read.stdout)
    # The server counted the image's 4 positions where the 4 words stand in the other prompt.
    assert image["stats"]["prompt_tokens"] == text["stats"]["prompt_tokens"]
    assert image["reply"] == text["reply"] and image["reply"]


def test_llama_server_through_token_ids_says_where_images_go(cli, seeing_server, tmp_path):
    picture = tmp_path / "rgb.png"
    picture.write_bytes(quadrants("red", "green", "blue", "red"))
    result = cli("ask", "--server", seeing_server.url, "--no-history", "-f", str(picture), "What is it?")
    assert result.returncode == 2 and result.stdout == ""
    assert 'set kind = "openai"' in one_error_line(result.stderr)


def test_the_parts_follow_the_markers_of_given_media_only():
    from llmchat.engine.media_marks import marker
    from llmchat.engine.remote.media_parts import RemoteMedia, estimated_media, text_of

    media = RemoteMedia()
    png, wav = quadrants("red", "red", "red", "red"), b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(16)
    shas = [hashlib.sha256(data).hexdigest() for data in (png, wav)]
    assert media.add(png, "image", "PNG") > 0 and media.add(wav, "audio", "WAV") > 0
    typed = f"{marker(shas[0])}\n\n{marker(shas[1])}\n\n{marker('0' * 64)} hear and see"
    wired = media.wire({"role": "user", "content": typed})
    kinds = [part["type"] for part in wired["content"]]
    assert kinds == ["image_url", "text", "input_audio", "text"]
    assert wired["content"][0]["image_url"]["url"].startswith("data:image/png;base64,iVBORw0KGgo")
    assert wired["content"][2]["input_audio"]["format"] == "wav"
    # A marker of media the engine was not given stays text, as on the local engine.
    assert text_of(wired["content"]) == f"\n\n\n\n{marker('0' * 64)} hear and see"
    assert estimated_media([wired]) == media.add(png, "image", "PNG") + media.add(wav, "audio", "WAV")
    assert media.wire({"role": "user", "content": "plain"}) == {"role": "user", "content": "plain"}


def test_a_batch_item_with_an_image_goes_to_the_server_as_a_part(cli, seeing_server, isolated_home, tmp_path):
    write_config(isolated_home, f'[servers.vis]\nurl = "{seeing_server.url}"\nkind = "openai"\n')
    (tmp_path / "rgb.png").write_bytes(quadrants("red", "green", "blue", "red"))
    items = tmp_path / "items.jsonl"
    lines = [
        {"id": "seen", "prompt": "What colours are these?", "files": ["rgb.png"]},
        {"id": "read", "prompt": " red green blue red\n\nWhat colours are these?"},
    ]
    items.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    result = cli("batch", str(items), "-o", str(out), "--server", "vis", *GREEDY[:-2], "--progress", "off")
    assert result.returncode == 0, result.stderr
    seen, read = (json.loads(line) for line in out.read_text().splitlines())
    assert seen["stats"]["prompt_tokens"] == read["stats"]["prompt_tokens"]
    assert seen["reply"] == read["reply"] and seen["reply"]


def test_a_wav_clip_goes_to_the_server_as_input_audio(cli, smollm2_path, isolated_home, tmp_path):
    from tests.media_fixtures import wav_bytes, write_qwen2a_projector

    projector = write_qwen2a_projector(tmp_path / "mmproj-audio.gguf", 576)
    server = harness.start_llama_server(smollm2_path, tmp_path, extra=["--mmproj", str(projector)])
    try:
        write_config(isolated_home, f'[servers.ear]\nurl = "{server.url}"\nkind = "openai"\n')
        clip = tmp_path / "clip.wav"
        clip.write_bytes(wav_bytes(seconds=1.0))
        heard = cli("ask", "--server", "ear", "-n", "1", "--no-history", "--json", "-f", str(clip), "What is it?")
        plain = cli("ask", "--server", "ear", "-n", "1", "--no-history", "--json", "\n\nWhat is it?")
        assert heard.returncode == 0 and plain.returncode == 0, heard.stderr + plain.stderr
        # The server's projector made a 30 s chunk's 750 positions of it (and its model's words around them).
        extra = json.loads(heard.stdout)["stats"]["prompt_tokens"] - json.loads(plain.stdout)["stats"]["prompt_tokens"]
        assert extra >= 750
    finally:
        server.stop()
