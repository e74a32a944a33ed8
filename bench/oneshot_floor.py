"""The least a Python program does for a one-shot reply: the floor under `llmchat ask`.

It does the work `llama-completion` does in bench/oneshot_vs_completion.py, through the same
llama.cpp bindings llmchat uses and nothing else: the interpreter starts, the bindings load, the
model and a context load with the same settings, the rendered prompt is tokenized and prefilled,
and `--tokens` tokens are decoded greedily and printed. What `ask` takes beyond this is llmchat's
own (its imports, the CLI, the template, the reply rules); what this takes beyond
`llama-completion` is Python's (the interpreter and the ctypes bindings).

    python bench/oneshot_floor.py MODEL PROMPT --tokens 64 --ctx 2048 --batch 512 --threads 2 --flash-attn off
"""

from __future__ import annotations

import argparse
import sys

from llmchat.engine import logs
from llmchat.engine.bindings import llama_cpp
from llmchat.engine.devices import cpu_has_amx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("model")
    parser.add_argument("prompt", help="the rendered prompt; special tokens are parsed")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--flash-attn", choices=("on", "off"), required=True)
    args = parser.parse_args()

    logs.install(False)
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    params.use_extra_bufts = not cpu_has_amx()  # as the engine loads (llmchat/engine/devices.py)
    model = llama_cpp.llama_model_load_from_file(args.model.encode(), params)
    context = llama_cpp.llama_context_default_params()
    context.n_ctx, context.n_batch, context.n_ubatch = args.ctx, args.batch, args.batch
    context.n_threads = context.n_threads_batch = args.threads
    context.flash_attn_type = (
        llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if args.flash_attn == "on" else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    ctx = llama_cpp.llama_init_from_model(model, context)
    vocab = llama_cpp.llama_model_get_vocab(model)
    text = args.prompt.encode()
    ids = (llama_cpp.llama_token * (len(text) + 2))()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), ids, len(text) + 2, True, True)
    if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(ids, n)) != 0:
        sys.exit("prefill failed")
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    one = (llama_cpp.llama_token * 1)()
    piece = llama_cpp.ctypes.create_string_buffer(256)
    out = sys.stdout.buffer
    for _ in range(args.tokens):
        token = llama_cpp.llama_sampler_sample(chain, ctx, -1)
        if llama_cpp.llama_vocab_is_eog(vocab, token):
            break
        size = llama_cpp.llama_token_to_piece(vocab, token, piece, 256, 0, False)
        out.write(piece.raw[:size])
        out.flush()
        one[0] = token
        if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(one, 1)) != 0:
            sys.exit("decode failed")
    out.write(b"\n")
    llama_cpp.llama_sampler_free(chain)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)


if __name__ == "__main__":
    main()
