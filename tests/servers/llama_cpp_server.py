"""Run `python -m llama_cpp.server` (llama-cpp-python's OpenAI-compatible server) for the tests.

One change to the library's server: models load without llama.cpp's "extra buffer types", as
llmchat's own engine does on CPUs that advertise Intel AMX (llmchat.engine.devices.cpu_has_amx):
ggml's AMX kernels die with SIGILL there at the first prefill. The server has no flag for it.
"""

from __future__ import annotations

import sys

import llama_cpp.llama_cpp as bindings


def _main() -> None:
    from llmchat.engine.devices import cpu_has_amx

    if cpu_has_amx():
        original = bindings.llama_model_default_params

        def params() -> bindings.llama_model_params:
            value = original()
            value.use_extra_bufts = False
            return value

        bindings.llama_model_default_params = params
    from llama_cpp.server.__main__ import main

    sys.argv[0] = "llama_cpp.server"
    main()


if __name__ == "__main__":
    _main()
