"""Images on a model that places them by M-RoPE (Qwen2-VL and its successors), on llmchat's engine.

Such an image takes one KV cell per embedding but advances the position by its larger side only
(libmtmd's n_pos): `LoadedModel` keeps the gap (llmchat.engine.native). The model and projector
are tiny random ones written at test time (tests/media_fixtures.py: `qwen2vl` with SmolLM2's
tokenizer, a `qwen2vl_merger` projector). Their replies are noise, so the engine is compared with
libmtmd's own whole-prompt evaluation (`mtmd_helper_eval_chunks`, as llama-mtmd-cli runs it) and
with itself, never with fixed text; logits within 1e-3 of their spread, since llama.cpp's CPU
arithmetic rounds differently for different batch splits on different CPUs.
"""

from __future__ import annotations

import ctypes
import json

import pytest

from tests.media_fixtures import png_bytes, write_qwen2vl, write_qwen2vl_projector

TEXT_WIDTH = 64  # tests/hybrid_models.py's N_EMBD
BEFORE, AFTER = "<|im_start|>user\nLook at this:\n", "\nWhat is in it?<|im_end|>\n<|im_start|>assistant\n"
IMAGE_TOKENS, IMAGE_POSITIONS = 8, 4  # 56×112 pixels: 2×4 tokens of 28×28, max(2, 4) positions


@pytest.fixture(scope="module")
def qwen2vl(smollm2_path, tmp_path_factory):
    """(model, projector, image bytes)."""
    folder = tmp_path_factory.mktemp("qwen2vl")
    model = write_qwen2vl(folder / "tiny-qwen2vl.gguf", smollm2_path)
    projector = write_qwen2vl_projector(folder / "mmproj-tiny-qwen2vl.gguf", TEXT_WIDTH)
    picture = png_bytes([[((x * 9) % 256, (y * 5) % 256, (x * y) % 256) for x in range(56)] for y in range(112)])
    return model, projector, picture


class Opened:
    """A LoadedModel on the fixture model with a MediaContext on its projector."""

    def __init__(self, model_path, projector):
        from llmchat.engine import logs
        from llmchat.engine.media.local import MediaContext
        from llmchat.engine.native import LoadedModel

        logs.install(False)  # llama.cpp's log through llmchat's filter, as the engine has it
        # One thread: on a busy 2-core machine ggml's threads wait for each other at every graph
        # node, and a 40-token prompt of this tiny model took 2 s instead of 2 ms.
        settings = dict(n_ctx=512, max_ctx=512, n_batch=64, gpu_layers=0, mmap=True, mlock=False, flash_attn=False)
        self.model = LoadedModel(model_path, threads=1, **settings)
        self.media = self.model.media = MediaContext(self.model, projector, threads=1)

    def close(self):
        self.media.close()
        self.model.close()

    def logits(self) -> list[float]:
        from llmchat.engine.bindings import llama_cpp

        row = llama_cpp.llama_get_logits_ith(self.model.ctx, -1)
        return [row[i] for i in range(self.model.n_vocab)]

    def text(self, text: str) -> list[int]:
        return self.model.tokenize(text.encode(), add_bos=False, special=True)

    def prompt(self, picture: bytes, before: str = BEFORE, after: str = AFTER) -> list[int]:
        """The engine's ids for [before, image, after], as MediaTokenizer makes them."""
        return self.text(before) + self.media.add(picture, "picture.png", "image").tokens + self.text(after)

    def logits_after(self, prompt: list[int]) -> list[float]:
        """The logits after `prompt`, evaluating only what the cache does not hold of it (its last
        id at least)."""
        from llmchat.engine.driver import common_prefix

        keep = min(common_prefix(self.model.tokens, prompt), len(prompt) - 1)
        self.model.eval(prompt[self.model.rewind(keep) :])
        return self.logits()

    def reply(self, prompt: list[int], n: int = 4) -> list[int]:
        """`n` greedy tokens after `prompt`, through LoadedModel.generate."""
        from llmchat.engine.bindings import llama_cpp

        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        try:
            tokens = self.model.generate(prompt, chain)
            return [next(tokens) for _ in range(n)]
        finally:
            llama_cpp.llama_sampler_free(chain)


@pytest.fixture
def opened(qwen2vl):
    model, projector, picture = qwen2vl
    found = Opened(model, projector)
    found.media.add(picture, "picture.png", "image")  # as the engine is given an attached image
    yield found
    found.close()


def _libmtmd_prompt(opened: Opened, picture: bytes, before: str, after: str):
    """libmtmd's chunks of [before, image, after], as llama-mtmd-cli makes them, and the engine's
    ids of the same prompt: the chunks' text ids, and the image's sentinels in its place."""
    from llmchat.engine.media.marks import is_media

    mtmd, ctx = opened.media._mtmd, opened.media.ctx
    sentinels = [token for token in opened.media.add(picture, "picture.png", "image").tokens if is_media(token)]
    data = (ctypes.c_uint8 * len(picture)).from_buffer_copy(picture)
    bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(ctx, data, len(picture), False)
    text = mtmd.mtmd_input_text()
    prompt = before.encode() + mtmd.mtmd_default_marker() + after.encode()
    text.text, text.text_len, text.add_special, text.parse_special = prompt, len(prompt), False, True
    chunks = mtmd.mtmd_input_chunks_init()
    assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
    mtmd.mtmd_bitmap_free(bitmap)
    ids: list[int] = []
    for index in range(mtmd.mtmd_input_chunks_size(chunks)):
        chunk = mtmd.mtmd_input_chunks_get(chunks, index)
        if mtmd.mtmd_input_chunk_get_type(chunk) == 0:  # MTMD_INPUT_CHUNK_TYPE_TEXT
            count = ctypes.c_size_t(0)
            found = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
            ids += [found[i] for i in range(count.value)]
        else:
            assert mtmd.mtmd_input_chunk_get_n_tokens(chunk) == len(sentinels)
            ids += sentinels
    return chunks, ids


def _reference(qwen2vl, after: str = AFTER) -> tuple[list[int], list[float], int]:
    """libmtmd's own evaluation of [BEFORE, image, after] on a fresh context
    (`mtmd_helper_eval_chunks`, as llama-mtmd-cli): the engine's ids of that prompt, the logits
    after it, and the position after it."""
    from llmchat.engine.bindings import llama_cpp

    model, projector, picture = qwen2vl
    fresh = Opened(model, projector)
    try:
        chunks, ids = _libmtmd_prompt(fresh, picture, BEFORE, after)
        mtmd = fresh.media._mtmd
        new_past = llama_cpp.llama_pos(0)
        code = mtmd.mtmd_helper_eval_chunks(
            fresh.media.ctx, fresh.model.ctx, chunks, 0, 0, fresh.model.n_batch, True, ctypes.byref(new_past)
        )
        mtmd.mtmd_input_chunks_free(chunks)
        assert code == 0
        return ids, fresh.logits(), new_past.value
    finally:
        fresh.close()


def _assert_close(got: list[float], wanted: list[float]) -> None:
    spread = max(wanted) - min(wanted)
    worst = max(abs(a - b) for a, b in zip(got, wanted))
    assert spread > 1.0 and worst <= 1e-3 * spread, (worst, spread)


# --------------------------------------------------------------------------- the premise


def test_the_projector_places_images_by_mrope_in_fewer_positions_than_cells(opened, qwen2vl):
    from llmchat.engine.media.marks import is_media

    media, mtmd = opened.media, opened.media._mtmd
    assert mtmd.mtmd_decode_use_mrope(media.ctx)
    item = media.add(qwen2vl[2], "picture.png", "image")
    chunks = [mtmd.mtmd_input_chunks_get(item.chunks, i) for i in range(mtmd.mtmd_input_chunks_size(item.chunks))]
    # <|vision_start|> as text, the image, <|vision_end|> as text (SmolLM2's vocabulary lacks both)
    assert [mtmd.mtmd_input_chunk_get_type(chunk) for chunk in chunks] == [0, 1, 0]
    image = chunks[1]
    assert (mtmd.mtmd_input_chunk_get_n_tokens(image), mtmd.mtmd_input_chunk_get_n_pos(image)) == (
        IMAGE_TOKENS,
        IMAGE_POSITIONS,
    )
    assert item.media_tokens == sum(map(is_media, item.tokens)) == IMAGE_TOKENS


# --------------------------------------------------------------------------- against libmtmd


def test_text_image_text_gives_libmtmd_s_own_logits_and_position(opened, qwen2vl):
    ids, wanted, end = _reference(qwen2vl)
    opened.model.eval(ids)
    _assert_close(opened.logits(), wanted)
    model = opened.model
    assert (
        len(model.tokens) == len(ids) and model.position(len(ids)) == end == len(ids) - IMAGE_TOKENS + IMAGE_POSITIONS
    )
    # Before the image, positions are the indices still.
    first = next(i for i, token in enumerate(ids) if token < 0)
    assert model.position(first) == first and model.position(first + IMAGE_TOKENS) == first + IMAGE_POSITIONS


def test_a_second_turn_reuses_the_image_and_equals_a_fresh_evaluation(opened, qwen2vl):
    ids, _, _ = _reference(qwen2vl)
    first = opened.reply(ids)
    follow_up = opened.text("<|im_end|>\n<|im_start|>user\nAnd now?<|im_end|>\n<|im_start|>assistant\n")
    prompt = ids + first + follow_up
    second = opened.reply(prompt)
    assert opened.media.encoded == 1  # the second turn found the image in the cache
    reused = opened.logits_after(prompt)
    assert opened.media.encoded == 1
    fresh = Opened(*qwen2vl[:2])
    fresh.media.add(qwen2vl[2], "picture.png", "image")
    try:
        _assert_close(reused, fresh.logits_after(prompt))
        assert fresh.reply(prompt) == second
    finally:
        fresh.close()


@pytest.mark.parametrize("cut", ["into the image", "after the image", "after the text"])
def test_a_cut_into_or_after_the_image_then_more_equals_a_fresh_evaluation(opened, qwen2vl, cut):
    """As /retry and /undo cut the sequence back (LoadedModel.rewind, .keep), then the new prompt."""
    ids, _, _ = _reference(qwen2vl)
    other, wanted, end = _reference(qwen2vl, after="\nWhich colours?<|im_end|>\n<|im_start|>assistant\n")
    image = [i for i, token in enumerate(ids) if token < 0]
    at = {"into the image": image[3], "after the image": image[-1] + 1, "after the text": image[-1] + 3}[cut]
    assert other[:at] == ids[:at]
    model = opened.model
    model.eval(ids)
    kept = model.rewind(at) if cut != "after the text" else (at if model.keep(at) else 0)
    assert kept == at and len(model.tokens) == at
    model.eval(other[at:])
    _assert_close(opened.logits(), wanted)
    assert model.position(len(other)) == end
    assert opened.media.encoded == (2 if cut == "into the image" else 1)  # an image cut apart is encoded again


@pytest.mark.parametrize("keep", ["all", "into the image"])
def test_a_state_restored_from_disk_keeps_the_image_s_positions(opened, qwen2vl, keep):
    """The KV cache on disk and MCP sampling put a saved state back (Engine.restore_sequence):
    the text after an image must land where it did, and a cut into the image drops all of it."""
    from llmchat.engine.bindings import llama_cpp

    ids, _, end = _reference(qwen2vl)
    other, wanted, _ = _reference(qwen2vl, after="\nWhich colours?<|im_end|>\n<|im_start|>assistant\n")
    model = opened.model
    model.eval(ids)
    ctx = model.ctx
    size = llama_cpp.llama_state_seq_get_size(ctx, 0)
    saved = (ctypes.c_uint8 * size)()
    assert llama_cpp.llama_state_seq_get_data(ctx, saved, size, 0) == size
    image = [i for i, token in enumerate(ids) if token < 0]
    common = next(i for i, (a, b) in enumerate(zip(ids, other)) if a != b)
    wanted_keep = {"all": common, "into the image": image[3]}[keep]
    model.clear()
    assert llama_cpp.llama_state_seq_set_data(ctx, saved, size, 0) == size
    kept = model.take_restored(ids, wanted_keep)
    assert kept == (common if keep == "all" else image[0])  # an image is held whole or not at all
    assert model.position(kept) == (common - IMAGE_TOKENS + IMAGE_POSITIONS if keep == "all" else image[0])
    model.eval(other[kept:])
    _assert_close(opened.logits(), wanted)


def test_media_another_model_was_not_given_are_not_restored(opened, qwen2vl):
    """A saved state holding an image this engine was not given: kept only up to it."""
    from llmchat.engine.bindings import llama_cpp
    from llmchat.engine.media.local import MediaContext

    ids, _, _ = _reference(qwen2vl)
    model = opened.model
    model.eval(ids)
    size = llama_cpp.llama_state_seq_get_size(model.ctx, 0)
    saved = (ctypes.c_uint8 * size)()
    llama_cpp.llama_state_seq_get_data(model.ctx, saved, size, 0)
    opened.media.close()
    opened.media = model.media = MediaContext(model, qwen2vl[1], threads=1)  # a new run: no image given yet
    model.clear()
    llama_cpp.llama_state_seq_set_data(model.ctx, saved, size, 0)
    first = next(i for i, token in enumerate(ids) if token < 0)
    assert model.take_restored(ids, len(ids)) == first and model.tokens == ids[:first]


def test_another_model_s_qwen_vl_projector_is_refused_by_its_width(qwen2vl, smollm2_path):
    from llmchat.errors import ModelError
    from llmchat.gguf.header_cache import read_metadata_cached
    from llmchat.media.projector import check_projector

    check_projector(qwen2vl[1], read_metadata_cached(qwen2vl[0]))  # its own model: taken
    with pytest.raises(ModelError, match=f"makes embeddings {TEXT_WIDTH} wide, but .* takes 576"):
        check_projector(qwen2vl[1], read_metadata_cached(smollm2_path))


# --------------------------------------------------------------------------- end to end


def test_ask_with_an_image_on_a_qwen2vl_model(cli, qwen2vl, tmp_path):
    model, projector, picture = qwen2vl
    image = tmp_path / "picture.png"
    image.write_bytes(picture)
    args = ("-m", str(model), "--mmproj", str(projector), "--temperature", "0", "-n", "6", "--no-history", "--json")
    result = cli("ask", *args, "-f", str(image), "What is in this picture?")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    stats = record["stats"]
    assert stats["media_tokens"] == IMAGE_TOKENS and stats["prompt_tokens"] > IMAGE_TOKENS
    assert stats["generated_tokens"] > 0 and isinstance(record["reply"], str)
