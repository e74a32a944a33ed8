"""llama.cpp's C API, and the one place llmchat imports llama-cpp-python.

llama-cpp-python ships two layers: ctypes bindings of llama.cpp's C API (`llama_cpp.llama_cpp`)
and the `Llama` class on top of them. Importing the package runs its `__init__`, which imports
`Llama` and with it numpy, jinja2 and the library's chat formats: about 110 ms and 22 MiB before
any model loads, a tenth of a one-shot `ask` on a small model (bench/results/oneshot_vs_completion.md).
llmchat drives llama.cpp itself (llmchat.engine.native) and needs only the bindings.

So the package is registered without running its `__init__`, and the bindings are imported alone.
Nothing is lost for other code in the process: the first time anyone asks the package for another
name (`llama_cpp.Llama`, in a test or a script), its `__init__` runs then, on the same module
object, and the name is found as usual. Where the package was imported whole before, it is used
as it is.
"""

from __future__ import annotations

import ctypes
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType


def _register_package_lazily() -> None:
    if "llama_cpp" in sys.modules:
        return
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.loader is None:
        raise ImportError("llama-cpp-python is not installed: pip install llama-cpp-python")
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def complete(name: str) -> object:
        # Special names (probes such as `__wrapped__`) do not complete the package: only real ones.
        if name.startswith("__") and name.endswith("__") and name not in ("__version__", "__all__"):
            raise AttributeError(name)
        del package.__dict__["__getattr__"]
        loader.exec_module(package)  # the package's own __init__, once
        return getattr(package, name)

    package.__dict__["__getattr__"] = complete
    sys.modules["llama_cpp"] = package


_register_package_lazily()

try:
    import llama_cpp.llama_cpp as llama_cpp  # noqa: E402  (after the registration above)
except AttributeError as err:  # the bindings declare a function that the shared library lacks
    from llmchat.errors import ModelError

    raise ModelError(
        f"llama-cpp-python's bindings do not match its llama.cpp library ({' '.join(str(err).split())}); "
        "reinstall llama-cpp-python: pip install --force-reinstall --no-cache-dir llama-cpp-python"
    ) from None


def _library_version() -> str:
    """llama-cpp-python's version, read from its `__init__` without running it (cache keys)."""
    package: ModuleType = sys.modules["llama_cpp"]
    version = package.__dict__.get("__version__")
    if isinstance(version, str):
        return version
    try:
        source = Path(package.__file__ or "").read_text(encoding="utf-8")
    except OSError:
        return "unknown"
    found = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', source, re.MULTILINE)
    return found.group(1) if found else "unknown"


LIBRARY_VERSION = _library_version()
SUPPORTED = ">=0.3.30,<0.4"  # as pyproject.toml requires it (tests/test_bindings.py keeps them equal)


# Everything llmchat uses of the bindings (tests/test_bindings.py checks that the engine's code
# names nothing else): a llama-cpp-python that renamed or dropped one of them fails at import with
# one line naming it, not with an AttributeError in the middle of a load or a reply. The check
# costs about 25 microseconds (tests/test_bindings.py::test_the_check_is_cheap measures it).
FUNCTIONS = (
    "llama_backend_init", "llama_supports_gpu_offload", "llama_print_system_info", "llama_log_set",
    "llama_model_default_params", "llama_model_load_from_file", "llama_model_free", "llama_model_get_vocab",
    "llama_model_n_ctx_train", "llama_model_is_recurrent", "llama_model_is_hybrid", "llama_model_meta_count",
    "llama_model_meta_key_by_index", "llama_model_meta_val_str_by_index", "llama_model_desc", "llama_model_size",
    "llama_model_n_params",
    "llama_context_default_params", "llama_init_from_model", "llama_free", "llama_n_ctx", "llama_synchronize",
    "llama_batch_init", "llama_batch_free", "llama_decode", "llama_get_logits_ith", "llama_set_n_threads",
    "llama_vocab_n_tokens", "llama_vocab_type", "llama_vocab_get_text", "llama_vocab_get_attr", "llama_detokenize",
    "llama_vocab_eot", "llama_vocab_fim_pad", "llama_vocab_fim_rep", "llama_vocab_fim_sep",
    "llama_vocab_get_add_bos", "llama_vocab_bos", "llama_vocab_eos", "llama_vocab_is_eog", "llama_tokenize",
    "llama_token_to_piece",
    "llama_get_memory", "llama_memory_clear", "llama_memory_seq_rm", "llama_memory_seq_cp", "llama_memory_seq_add",
    "llama_memory_can_shift",
    "llama_state_seq_get_size", "llama_state_seq_get_data", "llama_state_seq_set_data",
    "llama_state_seq_get_size_ext", "llama_state_seq_get_data_ext", "llama_state_seq_set_data_ext",
    "llama_sampler_chain_default_params", "llama_sampler_chain_init", "llama_sampler_chain_add",
    "llama_sampler_chain_get", "llama_sampler_init", "llama_sampler_init_penalties", "llama_sampler_init_grammar",
    "llama_sampler_init_greedy", "llama_sampler_init_dist", "llama_sampler_init_top_k", "llama_sampler_init_typical",
    "llama_sampler_init_top_p", "llama_sampler_init_min_p", "llama_sampler_init_temp", "llama_sampler_sample",
    "llama_sampler_accept", "llama_sampler_apply", "llama_sampler_reset", "llama_sampler_clone",
    "llama_sampler_free",
)  # fmt: skip
TYPES_AND_CONSTANTS = (
    "llama_token", "llama_pos", "llama_log_callback", "llama_progress_callback", "llama_context_params",
    "llama_sampler_i_name", "llama_sampler_i_accept", "llama_sampler_i_apply", "llama_sampler_i_reset",
    "llama_sampler_i_free", "llama_sampler_i_clone",
    "GGML_TYPE_F16", "GGML_TYPE_Q8_0", "GGML_TYPE_Q4_0",
    "LLAMA_LOAD_MODE_NONE", "LLAMA_LOAD_MODE_MMAP", "LLAMA_LOAD_MODE_MLOCK", "LLAMA_LOAD_MODE_MMAP_MLOCK",
    "LLAMA_FLASH_ATTN_TYPE_ENABLED", "LLAMA_FLASH_ATTN_TYPE_DISABLED",
    "LLAMA_TOKEN_ATTR_CONTROL", "LLAMA_TOKEN_ATTR_USER_DEFINED", "LLAMA_VOCAB_TYPE_SPM", "LLAMA_VOCAB_TYPE_BPE",
    "LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY",
    "_lib",
)  # fmt: skip
# The fields of llama.cpp's structures that llmchat reads or sets, by structure.
FIELDS = {
    "llama_model_params": ("n_gpu_layers", "vocab_only", "load_mode", "progress_callback", "use_extra_bufts"),
    "llama_context_params": (
        "n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_threads", "n_threads_batch", "flash_attn_type",
        "type_k", "type_v", "kv_unified", "swa_full",
    ),
    "llama_batch": ("n_tokens", "token", "pos", "n_seq_id", "seq_id", "logits"),
    "llama_token_data": ("id", "logit", "p"),
    "llama_token_data_array": ("data", "size", "selected", "sorted"),
    "llama_sampler_i": ("name", "accept", "apply", "reset", "free", "clone"),
}  # fmt: skip


# The candidate array's rows as the grammar gate reads them in bulk (numpy over the raw rows):
# int32 id, float logit, float p, 12 bytes a row.
TOKEN_DATA_LAYOUT = {"id": 0, "logit": 4, "p": 8}
TOKEN_DATA_SIZE = 12


def missing_names(module: ModuleType) -> list[str]:
    """What llmchat uses that `module` (the bindings) lacks: `name` or `structure.field`, and the
    token data's layout when it differs."""
    missing = [name for name in (*FUNCTIONS, *TYPES_AND_CONSTANTS) if not hasattr(module, name)]
    for structure, fields in FIELDS.items():
        declared = getattr(module, structure, None)
        if declared is None:
            missing.append(structure)
            continue
        names = {field[0] for field in getattr(declared, "_fields_", ())}
        missing += [f"{structure}.{field}" for field in fields if field not in names]
    token_data = getattr(module, "llama_token_data", None)
    if token_data is not None and not any(name.startswith("llama_token_data") for name in missing):
        offsets = {name: getattr(token_data, name, None) for name in TOKEN_DATA_LAYOUT}
        if ctypes.sizeof(token_data) != TOKEN_DATA_SIZE or any(
            field is None or field.offset != TOKEN_DATA_LAYOUT[name] for name, field in offsets.items()
        ):
            missing.append("llama_token_data as {int32 id, float logit, float p} (12 bytes)")
    return missing


def check_bindings(module: ModuleType) -> None:
    """ModelError, one line, when the bindings lack anything llmchat uses."""
    missing = missing_names(module)
    if missing:
        from llmchat.errors import ModelError

        raise ModelError(
            f"llama-cpp-python {LIBRARY_VERSION} lacks {', '.join(missing)}, which llmchat uses; "
            f"install a version llmchat supports: pip install 'llama-cpp-python{SUPPORTED}'"
        )


check_bindings(llama_cpp)


def library_module(name: str) -> ModuleType:
    """Another module of llama-cpp-python (`llama_grammar`'s schema converter), imported after the
    registration above so that it too comes without the package's `__init__`."""
    return importlib.import_module(f"llama_cpp.{name}")


__all__ = ["LIBRARY_VERSION", "check_bindings", "library_module", "llama_cpp", "missing_names"]
