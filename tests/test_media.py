"""Images in the conversation through libmtmd, on llmchat's own engine (llmchat.media,
llmchat.engine.media.local), with a projector the tests write (tests/media_fixtures.py).

The puppet projector makes a pure red, green or blue patch encode to exactly the embedding of
" red", " green" or " blue", so the greedy reply to an image must equal the reply to its words.
No real vision model's answers are checked here: none installs from a package registry.
"""

from __future__ import annotations

import json
import shutil

import pytest
from prompt_toolkit.application import create_app_session
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from llmchat.errors import ModelError, UsageError
from llmchat.media.kinds import sniff
from llmchat.turn.attachments import collect, compose
from tests.media_fixtures import quadrants, word_embeddings, write_puppet_projector

# The image's four patches, row by row, and the words they encode to.
PATCHES = ("red", "green", "blue", "red")
WORDS = " red green blue red"
GREEDY = ("--temperature", "0", "-n", "24", "--no-history", "--json")
# The repeat penalty's window holds the text version's words but no image positions (they are no
# tokens, as on llama-server): without a penalty the two prompts are the same to the model.
NO_PENALTY = ("--repeat-penalty", "1")


@pytest.fixture
def rgb_png(tmp_path):
    path = tmp_path / "rgb.png"
    path.write_bytes(quadrants(*PATCHES))
    return path


# --------------------------------------------------------------------------- by the bytes


def test_media_are_recognised_by_their_bytes_not_their_names(tmp_path):
    png = quadrants(*PATCHES)
    (tmp_path / "photo.txt").write_bytes(png)  # an image with a text file's name
    (tmp_path / "notes.png").write_text("apples are red\n")  # text with an image's name
    wav = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(16)
    attached = collect(["photo.txt", "notes.png"], base=tmp_path)
    assert [(a.path, a.media) for a in attached] == [("photo.txt", "image"), ("notes.png", "")]
    assert attached[0].block == f"<__media__ {attached[0].sha256}>" and attached[0].data == png
    assert compose(attached[:1], "describe") == f"<__media__ {attached[0].sha256}>\n\ndescribe"
    assert attached[0].describe()["media"] == "image"
    assert [sniff(data).format for data in (png, b"\xff\xd8\xff\xe0JFIF", b"GIF89a" + bytes(8), wav, b"fLaC" + bytes(8))] == [
        "PNG", "JPEG", "GIF", "WAV", "FLAC"
    ]  # fmt: skip


@pytest.mark.parametrize(
    "data, words",
    [
        (b"RIFF\x10\x00\x00\x00WEBPVP8 " + bytes(8), "is a WebP image, which llmchat cannot read"),
        (b"\x00\x01\x02\x03binary", "is a binary file"),
    ],
)
def test_an_unknown_format_is_one_line_naming_what_works(tmp_path, data, words):
    (tmp_path / "x.bin").write_bytes(data)
    with pytest.raises(UsageError) as raised:
        collect(["x.bin"], base=tmp_path)
    message = str(raised.value)
    assert words in message and "PNG, JPEG, BMP or GIF images, or WAV, MP3 or FLAC audio" in message


# --------------------------------------------------------------------------- the projector


def test_the_projector_header_is_checked_before_libmtmd_sees_it(smollm2_path, puppet_projector, tmp_path):
    from llmchat.gguf.reader import read_metadata
    from llmchat.media.projector import check_projector, find_projector

    model = read_metadata(smollm2_path)
    found = check_projector(puppet_projector, model)
    assert (found.type, found.vision, found.audio) == ("mlp", True, False)
    wide = write_puppet_projector(tmp_path / "wide.gguf", word_embeddings(smollm2_path), width=640)
    with pytest.raises(
        ModelError, match="makes embeddings 640 wide, but .* takes 576: it is another model's projector"
    ):
        check_projector(wide, model)
    headless = write_puppet_projector(tmp_path / "headless.gguf", word_embeddings(smollm2_path), heads=0)
    with pytest.raises(ModelError, match="lacks a valid clip.vision.attention.head_count"):
        check_projector(headless, model)
    with pytest.raises(ModelError, match="is a model of architecture llama, not a multimodal projector"):
        check_projector(smollm2_path, model)
    with pytest.raises(UsageError, match="--mmproj .*: no such file"):
        find_projector(tmp_path / "missing.gguf", smollm2_path, model)
    # Beside the model, as llama.cpp and LM Studio keep it; another model's projector is passed over.
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "smol.gguf").symlink_to(smollm2_path)
    assert find_projector(None, folder / "smol.gguf", model) is None
    shutil.copy(wide, folder / "mmproj-other.gguf")
    assert find_projector(None, folder / "smol.gguf", model) is None
    shutil.copy(puppet_projector, folder / "mmproj-smol-f32.gguf")
    assert find_projector(None, folder / "smol.gguf", model).path == folder / "mmproj-smol-f32.gguf"


# --------------------------------------------------------------------------- end to end


def test_the_reply_to_an_image_equals_the_reply_to_its_words(cli, smollm2_path, puppet_projector, rgb_png):
    model = ("-m", str(smollm2_path))
    seen = cli(
        "ask",
        *model,
        "--mmproj",
        str(puppet_projector),
        *GREEDY,
        *NO_PENALTY,
        "-f",
        str(rgb_png),
        "What colours are these?",
    )
    read = cli("ask", *model, *GREEDY, *NO_PENALTY, f"{WORDS}\n\nWhat colours are these?")  # fmt: skip
    assert seen.returncode == 0 and read.returncode == 0, seen.stderr + read.stderr
    image, text = json.loads(seen.stdout), json.loads(read.stdout)
    assert image["reply"] == text["reply"] and image["reply"]
    assert image["stats"]["prompt_tokens"] == text["stats"]["prompt_tokens"]
    assert image["stats"]["media_tokens"] == 4 and "media_tokens" not in text["stats"]


def test_an_image_found_beside_the_model_and_piped_on_stdin(cli, smollm2_path, puppet_projector, rgb_png, tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "smol.gguf").symlink_to(smollm2_path)
    (folder / "mmproj-smol.gguf").symlink_to(puppet_projector)
    piped = cli("ask", "-m", str(folder / "smol.gguf"), *GREEDY, "-f", "-", "What colours?", input=rgb_png.read_bytes())
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["stats"]["media_tokens"] == 4


def _session(smollm2_path, projector):
    from llmchat.config import load_config
    from llmchat.options import RunOptions
    from llmchat.startup.loading import start_session

    opts = RunOptions(
        model=str(smollm2_path), mmproj=projector, ctx=1024, temperature=0.0, seed=1, max_tokens=8, repeat_penalty=1.0
    )
    return start_session(opts, config=load_config(), overflow="drop", with_history=True)


def _type_into_chat(session, keys: list[str]) -> None:
    """The chat as a person uses it: each line typed and sent, then Ctrl-D."""
    from llmchat.ui.chat import run_interactive

    with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
        pipe.send_text("\r".join(keys) + "\r\x04")
        run_interactive(session, show_stats=False, markdown=False, verbose=False)


def test_chat_slash_image_and_the_next_turn_reuses_the_image_from_the_kv_cache(
    smollm2_path, puppet_projector, rgb_png, monkeypatch, capsys
):
    monkeypatch.chdir(rgb_png.parent)
    session = _session(smollm2_path, puppet_projector)
    try:
        keys = ["/image rgb.png", "What colours are these?", "And the first one?"]
        _type_into_chat(session, keys)
        out, err = capsys.readouterr()
        assert "rgb.png: 4 tokens" in err, err
        first, second = session.conversation.messages[0], session.conversation.messages[2]
        assert first["content"].startswith("<__media__ ") and first["content"].endswith("What colours are these?")
        assert second["content"] == "And the first one?"
        # The image was encoded once: the second turn found it, with the first exchange, in the cache.
        media = session.engine.media
        assert media is not None and media.encoded == 1
        stats = session.last_result.stats
        assert stats.media_tokens == 4 and stats.prompt_tokens - stats.cached_tokens < 20
        stored = session.history.get(session.conversation_id).messages[0]
        assert stored.attachments[0]["path"] == "rgb.png" and stored.typed == "What colours are these?"
    finally:
        session.close()


# --------------------------------------------------------------------------- drafting


def test_prompt_lookup_never_drafts_an_image_position():
    from llmchat.engine.drafting import PromptLookupDrafter
    from llmchat.engine.media.marks import sentinels

    image = sentinels("ab" * 32, 3)
    drafter = PromptLookupDrafter(8)
    # The match's follower runs into the image: the draft stops before it, or falls to a shorter match.
    assert drafter([1, 2, 3, 4, *image, 9, 1, 2, 3]) == [4]
    drafter = PromptLookupDrafter(8)
    assert drafter([7, 1, 2, 3, *image, 9, 1, 2, 3]) == []


def test_an_image_turn_with_lookup_gives_the_reply_without_it(cli, smollm2_path, puppet_projector, rgb_png):
    """Prompt lookup drafts from the token ids around the image; the reply stays the model's own.
    Flash attention on for both: drafting turns it on (engine.calibrate)."""
    copy = "Repeat exactly: the red fox and the green frog met the blue bird by the red barn."
    args = ("ask", "-m", str(smollm2_path), "--mmproj", str(puppet_projector), *GREEDY, "--flash-attn", "on")
    plain = cli(*args, "-f", str(rgb_png), copy)
    drafted = cli(*args, "--lookup", "-f", str(rgb_png), copy)
    assert plain.returncode == 0 and drafted.returncode == 0, plain.stderr + drafted.stderr
    alone, helped = json.loads(plain.stdout), json.loads(drafted.stdout)
    assert helped["reply"] == alone["reply"] and alone["reply"]
    assert helped["stats"]["media_tokens"] == 4 and helped["stats"]["draft_proposed"] > 0
    refused = cli(*args, "--draft-model", str(smollm2_path), "-f", str(rgb_png), copy)
    assert refused.returncode == 2 and "do not combine with --draft-model" in refused.stderr, refused.stderr


# --------------------------------------------------------------------------- bad input


def _one_line(result, code: int, *words: str) -> None:
    assert result.returncode == code, result.stderr
    assert result.stdout == "" and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


def test_an_image_for_a_model_without_a_projector_exits_2_before_the_load(cli, smollm2_path, rgb_png, tmp_path):
    folder = tmp_path / "alone"
    folder.mkdir()
    (folder / "smol.gguf").symlink_to(smollm2_path)
    result = cli("ask", "-m", str(folder / "smol.gguf"), "-f", str(rgb_png), "What is this?")
    _one_line(result, 2, "rgb.png is an image, but smol.gguf has no multimodal projector", "--mmproj")


def test_a_truncated_image_exits_2(cli, smollm2_path, puppet_projector, tmp_path):
    cut = tmp_path / "cut.png"
    cut.write_bytes(quadrants(*PATCHES)[:60])
    result = cli("ask", "-m", str(smollm2_path), "--mmproj", str(puppet_projector), "-f", str(cut), "What is this?")
    _one_line(result, 2, "cut.png cannot be decoded (corrupt or truncated?)")


def test_a_projector_of_another_width_or_not_a_projector_exits_3(cli, smollm2_path, rgb_png, tmp_path):
    wide = write_puppet_projector(tmp_path / "wide.gguf", word_embeddings(smollm2_path), width=640)
    model = ("-m", str(smollm2_path))
    _one_line(cli("ask", *model, "--mmproj", str(wide), "-f", str(rgb_png), "x"), 3, "another model's projector")
    _one_line(
        cli("ask", *model, "--mmproj", str(smollm2_path), "-f", str(rgb_png), "x"), 3, "not a multimodal projector"
    )


def test_the_libmtmd_names_the_engine_uses_are_checked_and_there():
    import re
    from pathlib import Path

    from llmchat.engine.bindings import library_module
    from llmchat.engine.media import local as media_eval

    source = Path(media_eval.__file__).read_text(encoding="utf-8")
    used = set(re.findall(r"\b(?:mtmd|self\._mtmd)\.([A-Za-z_]\w*)", source))
    assert used and used <= set(media_eval.MTMD_NAMES)
    mtmd = library_module("mtmd_cpp")
    assert [name for name in media_eval.MTMD_NAMES if not hasattr(mtmd, name)] == []


def test_the_history_keeps_each_image_once_privately_and_a_resumed_chat_sees_it(
    cli, smollm2_path, puppet_projector, rgb_png, isolated_home
):
    import stat

    model = ("-m", str(smollm2_path), "--mmproj", str(puppet_projector), "--temperature", "0", "-n", "4", "--json")
    unsaved = cli("ask", *model, "--no-history", "-f", str(rgb_png), "What colours?")
    assert unsaved.returncode == 0, unsaved.stderr
    assert list(isolated_home.rglob("attached-*")) == []  # --no-history writes nothing
    first = cli("ask", *model, "-f", str(rgb_png), "What colours?")
    assert first.returncode == 0, first.stderr
    cid = json.loads(first.stdout)["conversation_id"]
    kept = list(isolated_home.rglob("attached-*"))
    assert [path.read_bytes() for path in kept] == [rgb_png.read_bytes()]
    assert stat.S_IMODE(kept[0].stat().st_mode) == 0o600 and stat.S_IMODE(kept[0].parent.stat().st_mode) == 0o700
    # A second conversation with the same image keeps the one copy.
    other = cli("ask", *model, "-f", str(rgb_png), "Which colour is first?")
    assert other.returncode == 0 and list(isolated_home.rglob("attached-*")) == kept
    # Continued in a new process, the conversation shows the model the image again, from the store.
    resumed = cli("ask", *model, "--cid", cid, "And the last one?")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["stats"]["media_tokens"] == 4
    shown = cli("history", "show", cid).stdout
    assert f"attached **{rgb_png}**" in shown
    # The copy goes with the last conversation that names it.
    assert cli("history", "rm", "--yes", cid).returncode == 0 and kept[0].exists()
    other_id = json.loads(other.stdout)["conversation_id"]
    assert cli("history", "rm", "--yes", other_id).returncode == 0 and not kept[0].exists()


def test_audio_for_a_projector_that_takes_images_only_exits_2_before_the_load(
    cli, smollm2_path, puppet_projector, tmp_path
):
    clip = tmp_path / "meeting.wav"
    clip.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00\x80\x3e\x00\x00" + bytes(12))
    result = cli("ask", "-m", str(smollm2_path), "--mmproj", str(puppet_projector), "-f", str(clip), "summarise")
    _one_line(result, 2, "meeting.wav is audio, but puppet.gguf takes images only")


def test_info_says_which_models_see(cli, smollm2_path, puppet_projector, tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "smol.gguf").symlink_to(smollm2_path)
    alone = json.loads(cli("info", "-m", str(folder / "smol.gguf"), "--json").stdout)
    assert alone["media"] == {"projector": None, "vision": False, "audio": False}
    (folder / "mmproj-smol.gguf").symlink_to(puppet_projector)
    seeing = json.loads(cli("info", "-m", str(folder / "smol.gguf"), "--json").stdout)
    assert seeing["media"] == {"projector": str(folder / "mmproj-smol.gguf"), "vision": True, "audio": False}
    assert "images (mmproj-smol.gguf)" in cli("info", "-m", str(folder / "smol.gguf")).stdout


def test_a_gemma3_projector_puts_its_image_between_begin_and_end_tokens_and_encodes_it_once(gemma_path, tmp_path):
    """Gemma 3's projector: libmtmd writes <start_of_image> and <end_of_image> around the image's
    positions, which attend to each other non-causally; a later turn reuses all of it."""
    from llmchat.config import load_config
    from llmchat.engine.media.marks import is_media
    from llmchat.options import RunOptions
    from llmchat.startup.loading import start_session
    from tests.media_fixtures import png_bytes, write_gemma3_projector

    projector = write_gemma3_projector(tmp_path / "mmproj-gemma3.gguf", 640)
    picture = tmp_path / "gradient.png"
    picture.write_bytes(png_bytes([[(255 * (x // 28), 128, 255 * (y // 28)) for x in range(56)] for y in range(56)]))
    opts = RunOptions(model=str(gemma_path), mmproj=projector, ctx=512, temperature=0.0, seed=1, max_tokens=6)
    session = start_session(opts, config=load_config(), overflow="drop", with_history=False)
    try:
        attached = tuple(collect([str(picture)]))
        first = session.turn(compose(attached, "Describe it."), attachments=attached)
        media = session.engine.media
        item = media.items[attached[0].sha256]
        begin, end = (session.engine.tokenize(mark, special=True) for mark in ("<start_of_image>", "<end_of_image>"))
        assert len(begin) == len(end) == 1 and begin[0] in item.tokens[:2] and item.tokens[-1] == end[0], item.tokens
        assert sum(map(is_media, item.tokens)) == item.media_tokens == 4
        assert first.stats.media_tokens == 4 and media.encoded == 1
        second = session.turn("And again.")
        assert media.encoded == 1 and second.stats.cached_tokens >= first.stats.prompt_tokens
    finally:
        session.close()


# --------------------------------------------------------------------------- batch


@pytest.mark.parametrize("parallel", ["1", "2"])
def test_a_batch_item_with_an_image_is_answered_as_ask_answers_it(
    cli, smollm2_path, puppet_projector, rgb_png, tmp_path, parallel
):
    items = tmp_path / "items.jsonl"
    lines = [
        {"id": "seen", "prompt": "What colours are these?", "files": [rgb_png.name]},
        {"id": "plain", "prompt": "Say yes."},
        {"id": "broken", "prompt": "What is it?", "files": ["cut.png"]},
    ]
    (tmp_path / "cut.png").write_bytes(quadrants(*PATCHES)[:60])
    items.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    model = ("-m", str(smollm2_path), "--mmproj", str(puppet_projector), "--temperature", "0", "-n", "24")
    result = cli("batch", str(items), "-o", str(out), *model, *NO_PENALTY, "--parallel", parallel, "--progress", "off")
    assert result.returncode != 0  # one item failed: the run says so
    records = {record["id"]: record for record in map(json.loads, out.read_text().splitlines())}
    assert list(records) == ["seen", "plain", "broken"]  # input order, whatever ran alone
    # --parallel turns flash attention on (llmchat.engine: each item's reply is the one it gets alone with it).
    attention = ("--flash-attn", "on" if parallel != "1" else "off")
    asked = cli(
        "ask", *model, *NO_PENALTY, *attention, "--no-history", "--json", "-f", str(rgb_png), "What colours are these?"
    )
    assert asked.returncode == 0, asked.stderr
    assert records["seen"]["reply"] == json.loads(asked.stdout)["reply"] and records["seen"]["reply"]
    assert records["seen"]["stats"]["media_tokens"] == 4
    assert records["plain"]["reply"] and records["plain"]["error"] is None
    assert "cut.png cannot be decoded" in records["broken"]["error"]


def test_a_batch_image_for_a_model_without_a_projector_fails_that_item_only(cli, smollm2_path, rgb_png, tmp_path):
    folder = tmp_path / "alone"
    folder.mkdir()
    (folder / "smol.gguf").symlink_to(smollm2_path)
    items = tmp_path / "items.jsonl"
    lines = [{"id": 1, "prompt": "What is it?", "files": [rgb_png.name]}, {"id": 2, "prompt": "Say yes."}]
    items.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    result = cli("batch", str(items), "-o", str(out), "-m", str(folder / "smol.gguf"), "-n", "4", "--progress", "off")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert result.returncode != 0 and [r["id"] for r in records] == [1, 2]
    assert "has no multimodal projector" in records[0]["error"] and records[1]["reply"]


# --------------------------------------------------------------------------- pasted paths


def test_an_image_path_dropped_into_the_chat_prompt_attaches_it(
    smollm2_path, puppet_projector, rgb_png, monkeypatch, capsys
):
    monkeypatch.chdir(rgb_png.parent)
    (rgb_png.parent / "notes.txt").write_text("red\n")
    session = _session(smollm2_path, puppet_projector)
    try:
        # A path alone (an absolute one, as a terminal drops it: not a command) waits for the
        # message; a quoted path inside a message is only named, the message sent as typed (it
        # may only talk about the file); a text file's path stays text.
        keys = [str(rgb_png), "What colours are these?", 'Is "rgb.png" like "notes.txt"?']
        _type_into_chat(session, keys)
        out, err = capsys.readouterr()
        assert "rgb.png: 4 tokens" in err, err
        assert "not attached: rgb.png (/image rgb.png attaches it to your next message)\n" in err
        first, second = session.conversation.messages[0], session.conversation.messages[2]
        assert first["content"].startswith("<__media__ ") and first["content"].endswith("What colours are these?")
        assert second["content"] == 'Is "rgb.png" like "notes.txt"?' and not second.get("attachments")
        assert len(session.conversation.messages) == 4
    finally:
        session.close()


def test_pasted_paths_are_recognised_only_as_existing_media(tmp_path, rgb_png):
    from llmchat.media.pasted_paths import pasted_media

    spaced = tmp_path / "My Photos" / "a b.png"
    spaced.parent.mkdir()
    spaced.write_bytes(rgb_png.read_bytes())
    escaped = str(spaced).replace(" ", "\\ ")
    assert pasted_media(escaped) == ([str(spaced)], True)  # a drop with escaped spaces
    assert pasted_media(f"'{spaced}'") == ([str(spaced)], True)  # or quoted
    assert pasted_media(f"file://{str(spaced).replace(' ', '%20')}") == ([str(spaced)], True)
    assert pasted_media(f"what is {rgb_png}?") == ([str(rgb_png)], False)
    assert pasted_media(f"see {tmp_path}/missing.png and '{tmp_path}'") == ([], False)


# --------------------------------------------------------------------------- audio


def test_a_wav_clip_reaches_the_model_as_whole_30_second_chunks(cli, smollm2_path, rgb_png, tmp_path):
    from tests.media_fixtures import wav_bytes, write_qwen2a_projector

    projector = write_qwen2a_projector(tmp_path / "mmproj-audio.gguf", 576)
    clip = tmp_path / "clip.wav"
    clip.write_bytes(wav_bytes(seconds=1.0))
    model = ("-m", str(smollm2_path), "--mmproj", str(projector), "-n", "2", "--no-history")
    heard = cli("ask", *model, "--json", "-f", str(clip), "What is this?")
    assert heard.returncode == 0, heard.stderr
    # qwen2a: a 30 s chunk's 3,000 mel frames, halved by the convolution and by the pooling.
    assert json.loads(heard.stdout)["stats"]["media_tokens"] == 750
    _one_line(
        cli("ask", *model, "-f", str(rgb_png), "x"), 2, "rgb.png is an image, but mmproj-audio.gguf takes audio only"
    )


def test_audio_projectors_libmtmd_would_abort_on_are_refused_from_their_header(cli, smollm2_path, tmp_path):
    """Each of these ends the process inside libmtmd (a GGML_ASSERT or GGML_ABORT) when it is
    handed over; the header check refuses it with exit 3. An Ultravox stacking 4 positions passes
    and gives the count the check computes, 375 tokens a chunk."""
    from tests.media_fixtures import wav_bytes, write_qwen2a_projector

    clip = tmp_path / "clip.wav"
    clip.write_bytes(wav_bytes(seconds=1.0))
    broken = {
        "positions 1499": (dict(positions=1499), "position embeddings have 1499 rows"),
        "a key bias": (dict(key_bias=True), "key projection has a bias"),
        "stacked by 8": (dict(stack=8), "libmtmd expects 187 tokens of each 30 s chunk, but its layers make 188"),
    }
    for name, (shape, words) in broken.items():
        projector = write_qwen2a_projector(tmp_path / f"{name}.gguf", 576, **shape)
        result = cli("ask", "-m", str(smollm2_path), "--mmproj", str(projector), "-f", str(clip), "x")
        _one_line(result, 3, "malformed audio projector", words)
    fine = write_qwen2a_projector(tmp_path / "stacked-4.gguf", 576, stack=4)
    heard = cli(
        "ask", "-m", str(smollm2_path), "--mmproj", str(fine), "-n", "1", "--no-history", "--json", "-f", str(clip), "x"
    )
    assert heard.returncode == 0, heard.stderr
    assert json.loads(heard.stdout)["stats"]["media_tokens"] == 375


# --------------------------------------------------------------------------- a real vision model


def test_a_real_vision_model_names_the_colour_of_a_plain_image(cli, tmp_path):
    """Runs only where the environment names a real vision model and its projector
    (LLMCHAT_TEST_VISION_MODEL, LLMCHAT_TEST_VISION_MMPROJ: no such model installs from a package
    registry, so CI skips it): a 224×224 image of pure red, and the answer names the colour."""
    import os

    from tests.media_fixtures import png_bytes

    model, projector = os.environ.get("LLMCHAT_TEST_VISION_MODEL"), os.environ.get("LLMCHAT_TEST_VISION_MMPROJ")
    if not (model and projector):
        pytest.skip("set LLMCHAT_TEST_VISION_MODEL and LLMCHAT_TEST_VISION_MMPROJ to run a real vision model")
    image = tmp_path / "red.png"
    image.write_bytes(png_bytes([[(255, 0, 0)] * 224 for _ in range(224)]))
    args = ("ask", "-m", model, "--mmproj", projector, "-f", str(image), *GREEDY)
    result = cli(*args, "What colour is this image? Answer with one word.")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert "red" in record["reply"].lower() and record["stats"]["media_tokens"] > 0


# --------------------------------------------------------------------------- what is held


def test_the_media_held_stay_bounded_over_a_long_chat(smollm2_path, puppet_projector, tmp_path, monkeypatch):
    """A decoded image keeps its pixels until it is freed: over a chat of many images the engine
    holds no more than `HELD_CONTEXTS` contexts' worth, the least recently used freed first, never
    one the KV cache holds, and an image named again is decoded again. The bound is made 16
    positions (4 images) here, so that a chat of 10 images passes it."""
    from itertools import product

    from llmchat.config import load_config
    from llmchat.engine.media import local as media_eval
    from llmchat.options import RunOptions
    from llmchat.startup.loading import start_session

    opts = RunOptions(model=str(smollm2_path), mmproj=puppet_projector, ctx=256, temperature=0.0, max_tokens=1)
    session = start_session(opts, config=load_config(), overflow="drop", with_history=False)
    try:
        monkeypatch.setattr(media_eval, "HELD_CONTEXTS", 16 / session.engine.n_ctx)
        sent = []
        for number, names in enumerate(list(product(("red", "green", "blue"), repeat=4))[:10]):
            path = tmp_path / f"{number}.png"
            path.write_bytes(quadrants(*names))
            (image,) = collect([str(path)])
            session.turn(compose((image,), "?"), attachments=(image,))
            sent.append(image)
        media = session.engine.media
        in_cache = {sha for sha, item in media.items.items() if item.tokens[-1] in session.engine.model.tokens}
        # Beyond the bound only what the KV cache holds (the last exchanges, not yet trimmed) is kept.
        assert sum(item.media_tokens for sha, item in media.items.items() if sha not in in_cache) <= 16
        assert len(media.items) < len(sent) and sent[-1].sha256 in media.items and sent[0].sha256 not in media.items
        encoded = media.encoded
        again = session.turn(compose(sent[:1], "?"), attachments=tuple(sent[:1]))  # freed: decoded again
        assert again.reply and sent[0].sha256 in media.items
        assert media.encoded == encoded + 1  # that image alone: those the cache holds are not encoded again
    finally:
        session.close()


def test_the_media_prompts_kept_for_llama_server_are_bounded_and_found_by_their_ids():
    """llama-server's token-id path keeps each media prompt's text by its ids (server_media): the
    latest few, no more than `_TEXT_KEPT` characters in all, and a prompt continued (a tool round)
    finds the longest kept prompt it starts with."""
    from llmchat.engine.media.server import _PROMPTS_KEPT, _TEXT_KEPT, ServerMedia

    media = ServerMedia()
    for number in range(_PROMPTS_KEPT + 10):
        media.keep([1, 2, number], f"prompt {number}")
    assert media.text_for([1, 2, 9]) is None and media.text_for([1, 2, 10]) == ("prompt 10", [])
    newest = _PROMPTS_KEPT + 9
    assert media.text_of([1, 2, newest]) == f"prompt {newest}"
    assert media.text_for([1, 2, newest, 7, 8]) == (f"prompt {newest}", [7, 8])
    media.keep([1, 2, newest, 7], "continued")  # the longest prefix wins
    assert media.text_for([1, 2, newest, 7, 8]) == ("continued", [8])
    assert media.text_for([1, 3]) is None and media.text_for([]) is None

    # A long context's prompts: the texts together stay within the bound, the oldest going first.
    long = "x" * (_TEXT_KEPT // 8 + 1)
    for number in range(16):
        media.keep([5, number], long)
    assert media.text_for([5, 15]) == (long, []) and media.text_for([5, 8]) is None
    assert media.kept() * len(long) <= _TEXT_KEPT
