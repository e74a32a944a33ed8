"""Images through `--server`: a real llama-server started with the puppet projector
(tests/media_fixtures.py) beside SmolLM2, on a free 127.0.0.1 port (tests/servers/harness.py).

The OpenAI-compatible engine sends an attached image as an `image_url` part (a data: URL) where
the message's marker stands; the default engine (token ids) sends a prompt with media as its text
with the server's media marker and the files (llmchat.engine.media.server). The puppet makes
the image's four patches encode to exactly the embeddings of " red green blue red", so on the same
server the reply to the image equals the reply to those words, and the server counts the same
prompt tokens for both: CPU-independent, since both run on one server.
"""

from __future__ import annotations

import base64
import hashlib
import json
from types import SimpleNamespace

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


def test_an_image_through_llama_servers_token_path_is_seen_as_its_words(cli, seeing_server, tmp_path):
    picture = tmp_path / "rgb.png"
    picture.write_bytes(quadrants("red", "green", "blue", "red"))
    seen = cli("ask", "--server", seeing_server.url, *GREEDY, "-f", str(picture), "What colours are these?")
    read = cli("ask", "--server", seeing_server.url, *GREEDY, " red green blue red\n\nWhat colours are these?")
    assert seen.returncode == 0 and read.returncode == 0, seen.stderr + read.stderr
    image, text = json.loads(seen.stdout), json.loads(read.stdout)
    assert image["reply"] == text["reply"] and image["reply"]
    # The server's own count: the image's 4 positions where the 4 words stand in the other prompt.
    assert image["stats"]["prompt_tokens"] == text["stats"]["prompt_tokens"]
    assert image["stats"]["media_tokens"] == 4 and "media_tokens" not in text["stats"]


def test_a_chat_turn_after_an_image_turn_sends_the_image_again_and_the_server_reuses_its_cache(
    cli, seeing_server, tmp_path
):
    picture = tmp_path / "rgb.png"
    picture.write_bytes(quadrants("red", "green", "blue", "red"))
    turns = "What colours are these?\nAnd the first one?\n"
    result = cli("chat", "--server", seeing_server.url, *GREEDY[:-2], "--json", "-f", str(picture), input=turns)
    assert result.returncode == 0, result.stderr
    first, second = (json.loads(line)["stats"] for line in result.stdout.splitlines())
    # The prompt is rendered again each turn: the first message's image is in the second prompt too.
    assert first["media_tokens"] == second["media_tokens"] == 4
    assert second["prompt_tokens"] > first["prompt_tokens"] + first["generated_tokens"]
    # The server's own count of what its pinned slot reused: at least the first prompt, image included.
    assert second["cached_tokens"] == second["server"]["cache_n"] >= first["prompt_tokens"]


def test_llama_server_without_a_projector_refuses_media_in_one_line(cli, smollm2_path, tmp_path):
    picture = tmp_path / "rgb.png"
    picture.write_bytes(quadrants("red", "green", "blue", "red"))
    server = harness.start_llama_server(smollm2_path, tmp_path)
    try:
        result = cli("ask", "--server", server.url, "--no-history", "-f", str(picture), "What is it?")
    finally:
        server.stop()
    assert result.returncode == 2 and result.stdout == ""
    line = one_error_line(result.stderr)
    assert "rgb.png is an image" in line and "no multimodal projector" in line and "--mmproj" in line


def test_audio_for_a_server_that_sees_only_is_refused_in_one_line(cli, seeing_server, tmp_path):
    from tests.media_fixtures import wav_bytes

    clip = tmp_path / "clip.wav"
    clip.write_bytes(wav_bytes(seconds=0.1))
    result = cli("ask", "--server", seeing_server.url, "--no-history", "-f", str(clip), "What is it?")
    assert result.returncode == 2 and result.stdout == ""
    line = one_error_line(result.stderr)
    assert "audio for" in line and "takes images only" in line


def test_the_parts_follow_the_markers_of_given_media_only():
    from llmchat.engine.media.marks import marker
    from llmchat.engine.media.parts import RemoteMedia, estimated_media, text_of

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
        # The token-id path sends it with the prompt's text; the server's count of its positions comes back.
        ids = cli("ask", "--server", server.url, "-n", "1", "--no-history", "--json", "-f", str(clip), "What is it?")
        assert ids.returncode == 0, ids.stderr
        stats = json.loads(ids.stdout)["stats"]
        assert stats["prompt_tokens"] == json.loads(heard.stdout)["stats"]["prompt_tokens"]
        assert stats["media_tokens"] >= 750
    finally:
        server.stop()


# --- the media prompt's text, against a stand-in tokenizer (no server) ------------------------------

_SPECIALS = {"<s>": 1, "<|end|>": 2}  # control tokens when special tokens are parsed


class _Tokenizer:
    """A stand-in llama-server engine for llmchat.engine.media.server: one id per character
    (1000 + code point), and the two control tokens where special tokens are parsed."""

    def __init__(self, *, add_bos: bool, marker: str = "<__media_x__>", vision: bool = True):
        from llmchat.engine.media.server import ServerMedia

        self.add_bos, self.bos_id, self.bos_text = add_bos, 1, "<s>"
        self.media = ServerMedia()
        self.facts = SimpleNamespace(media_marker=marker, vision=vision, audio=False)
        self.spec = SimpleNamespace(shown_url="http://127.0.0.1:1")

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        ids: list[int] = []
        while text:
            name = next((n for n in _SPECIALS if special and text.startswith(n)), None)
            ids.append(_SPECIALS[name] if name else 1000 + ord(text[0]))
            text = text[len(name) :] if name else text[1:]
        return ids

    def detokenize(self, tokens) -> str:
        names = {v: k for k, v in _SPECIALS.items()}
        return "".join(names.get(t) or chr(t - 1000) for t in tokens)

    def is_control(self, token: int) -> bool:
        return token in _SPECIALS.values()


def _two_media(engine) -> tuple[str, str, bytes, bytes]:
    from llmchat.engine.media.marks import marker

    red, blue = quadrants("red", "red", "red", "red"), quadrants("blue", "blue", "blue", "blue")
    engine.media.add(red, "image", "PNG")
    engine.media.add(blue, "image", "PNG")
    return marker(hashlib.sha256(red).hexdigest()), marker(hashlib.sha256(blue).hexdigest()), red, blue


@pytest.mark.parametrize("written", [True, False])
def test_a_media_prompt_goes_as_its_text_with_one_bos_and_the_files_in_order(written):
    from llmchat.engine.media.marks import count_media
    from llmchat.engine.media.server import completion_prompt, holds_media, media_prompt

    engine = _Tokenizer(add_bos=True)
    red, blue, red_png, blue_png = _two_media(engine)
    pieces = [("<s>user:" if written else "user:", True), (f"{blue}hi {red}", False), ("<|end|>", True)]
    assert holds_media(engine.media, pieces)
    ids = media_prompt(engine, pieces)
    # One BOS, whether the template wrote it or not: the server puts its own in front of the text.
    assert ids[0] == 1 and ids.count(1) == 1 and count_media(ids) == 2 * 256
    sent = completion_prompt(engine, ids)
    assert sent["prompt_string"] == "user:<__media_x__>hi <__media_x__><|end|>"
    assert sent["multimodal_data"] == [base64.b64encode(data).decode() for data in (blue_png, red_png)]
    # A reply continued after it (a thinking budget's close, a tool round) goes as its text.
    reply = engine.tokenize("ok", special=False) + [2]
    assert completion_prompt(engine, ids + reply)["prompt_string"].endswith("<|end|>ok<|end|>")
    assert completion_prompt(engine, [5, 6]) == [5, 6]  # no media: token ids, as before


def test_a_media_prompt_refuses_text_that_the_server_would_read_as_a_control_token():
    from llmchat.engine.media.server import completion_prompt, media_prompt
    from llmchat.errors import UsageError

    engine = _Tokenizer(add_bos=False)
    red, _, _, _ = _two_media(engine)
    with pytest.raises(UsageError, match=r"'<\|end\|>', which http://127.0.0.1:1 would read as a control token"):
        media_prompt(engine, [("user:", True), (f"{red} hi<|end|>", False), ("<|end|>", True)])
    with pytest.raises(UsageError, match="media marker"):
        media_prompt(engine, [("user:", True), (f"{red} hi <__media_x__>", False)])
    ids = media_prompt(engine, [("user:", True), (f"{red} hi", False), ("<|end|>", True)])
    # A tool's output that spells a control token, tokenized as plain text, stays refused as text.
    with pytest.raises(UsageError, match="control token"):
        completion_prompt(engine, ids + engine.tokenize("<|end|>", special=False))


def test_the_servers_count_of_media_positions_replaces_the_estimate():
    from llmchat.engine.media.server import media_prompt, server_counts, takes
    from llmchat.engine.remote.served import RemoteOutcome
    from llmchat.errors import UsageError

    engine = _Tokenizer(add_bos=False)
    red, _, red_png, _ = _two_media(engine)
    pieces = [("user:", True), (f"{red}{red} hi", False)]
    ids = media_prompt(engine, pieces)
    outcome = RemoteOutcome(prompt_tokens=len(ids))
    server_counts(engine, ids, ids, {"prompt_n": 3, "cache_n": 13}, outcome)  # 8 text ids and 2 × 4 positions
    assert outcome.media_tokens == 8 and outcome.prompt_tokens == 16
    assert engine.media.add(red_png, "image", "PNG") == 4 and len(media_prompt(engine, pieces)) == 16
    with pytest.raises(UsageError, match="takes images only; attach an image"):
        takes(engine, "audio")
