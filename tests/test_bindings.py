"""The check of llama-cpp-python's bindings at import (llmchat.engine.bindings): every function,
constant and structure field llmchat uses is there, or one line names what is missing.

No model is loaded: the check runs on the bindings alone.
"""

from __future__ import annotations

import ctypes
import re
import time
from pathlib import Path

import pytest

from llmchat.engine import bindings
from llmchat.engine.bindings import FIELDS, FUNCTIONS, TYPES_AND_CONSTANTS, check_bindings, llama_cpp
from llmchat.errors import ExitCode, ModelError
from tests.shims import sitecustomize_env

ENGINE = Path(bindings.__file__).parent
ROOT = ENGINE.parent.parent


def test_the_installed_bindings_have_everything():
    assert bindings.missing_names(llama_cpp) == []


def test_a_structure_without_a_field_llmchat_sets_is_one_line_naming_it(monkeypatch):
    declared = llama_cpp.llama_context_params
    fields = [field for field in declared._fields_ if field[0] != "kv_unified"]
    older = type("llama_context_params", (ctypes.Structure,), {"_fields_": fields})
    monkeypatch.setattr(llama_cpp, "llama_context_params", older)
    with pytest.raises(ModelError) as raised:
        check_bindings(llama_cpp)
    message = str(raised.value)
    assert "\n" not in message
    assert "lacks llama_context_params.kv_unified, which llmchat uses" in message
    assert f"pip install 'llama-cpp-python{bindings.SUPPORTED}'" in message
    assert raised.value.exit_code == ExitCode.MODEL


def test_a_token_data_row_laid_out_otherwise_is_named(monkeypatch):
    """The grammar gate reads the candidates' rows in bulk as {int32 id, float logit, float p}."""
    wider = type(
        "llama_token_data",
        (ctypes.Structure,),
        {"_fields_": [("id", ctypes.c_int32), ("logit", ctypes.c_double), ("p", ctypes.c_float)]},
    )
    monkeypatch.setattr(llama_cpp, "llama_token_data", wider)
    with pytest.raises(ModelError, match=r"lacks llama_token_data as \{int32 id, float logit, float p\} \(12 bytes\)"):
        check_bindings(llama_cpp)


def test_every_missing_name_is_listed_on_the_one_line(monkeypatch):
    monkeypatch.delattr(llama_cpp, "llama_memory_can_shift")
    monkeypatch.delattr(llama_cpp, "llama_sampler_i")
    with pytest.raises(ModelError) as raised:
        check_bindings(llama_cpp)
    message = str(raised.value)
    assert "\n" not in message
    assert "lacks llama_memory_can_shift, llama_sampler_i, which llmchat uses" in message


def test_the_check_lists_everything_the_engine_names():
    """Every `llama_cpp.NAME` (and grammar's `llama.NAME`, `self._llama.NAME`) in the engine's code
    is in the lists the check goes through, and every field the engine sets on a structure."""
    checked = set(FUNCTIONS) | set(TYPES_AND_CONSTANTS) | set(FIELDS)
    used: set[str] = set()
    fields_set: set[str] = set()
    for path in ENGINE.glob("*.py"):  # engine/remote/ never imports llama_cpp
        if path.name == "bindings.py":
            continue
        source = path.read_text(encoding="utf-8")
        used |= set(re.findall(r"\b(?:llama_cpp|llama|self\._llama)\.([A-Za-z_]\w*)", source))
        fields_set |= set(re.findall(r"^\s*(?:params|context)\.([a-z_]+) = ", source, re.MULTILINE))
    used -= {"llama_cpp", "cpp", "h", "server", "llama_grammar"}  # the module itself; "llama.cpp" and such in prose
    assert used - checked == set()
    declared = set(FIELDS["llama_model_params"]) | set(FIELDS["llama_context_params"])
    assert fields_set and fields_set - declared == set()


def test_the_supported_versions_are_pyproject_s():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'"llama-cpp-python{bindings.SUPPORTED}"' in pyproject


def test_the_check_is_cheap():
    """It runs on every start that loads the engine. Measured, not asserted (tests never assert
    speed): about 25 microseconds; printed with `pytest -s`."""
    runs = 1000
    began = time.perf_counter()
    for _ in range(runs):
        check_bindings(llama_cpp)
    print(f"check_bindings: {(time.perf_counter() - began) / runs * 1e6:.1f} µs per call")


def test_the_command_line_says_it_in_one_line(cli, tmp_path):
    """A llama-cpp-python without a function llmchat calls: `llmchat --version` (which reads the
    library's versions) ends with one line and exit 3, no traceback."""
    shim = "import llama_cpp.llama_cpp as bindings\n\ndel bindings.llama_memory_seq_add\n"
    run = cli("--version", env=sitecustomize_env(tmp_path / "shim", shim))
    assert run.returncode == int(ExitCode.MODEL), run.stderr
    assert "Traceback" not in run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("llmchat: error: llama-cpp-python "), run.stderr
    assert "lacks llama_memory_seq_add, which llmchat uses" in lines[0]
