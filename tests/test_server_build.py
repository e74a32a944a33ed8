"""tests/servers/build.sh picks the RPC server's target without a race.

It used to pipe `ninja -t targets all` (about 58 KB) into `grep -q` under `pipefail`: grep exits at
its first match, ninja dies of SIGPIPE, and about one run in four took the fallback name, which
does not exist. The choice is run 20 times against the real configured build folder that the
build left behind, and must name the target that the folder's whole target list holds every time.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.servers.harness import BUILD_SCRIPT, binaries_dir, build_script_env

pytestmark = pytest.mark.server

RUNS = 20


def configured_build_folder() -> Path:
    build = binaries_dir().parent / "work" / "build"
    if not (build / "build.ninja").exists():
        pytest.fail(f"no configured build folder at {build}: run `bash tests/servers/build.sh` first", pytrace=False)
    return build


def test_rpc_target_choice_is_right_every_time():
    build = configured_build_folder()
    listing = subprocess.run(
        ["ninja", "-C", str(build), "-t", "targets", "all"], capture_output=True, text=True, check=True
    ).stdout
    names = {line.split(":", 1)[0] for line in listing.splitlines()}
    expected = "ggml-rpc-server" if "ggml-rpc-server" in names else "rpc-server"
    assert expected in names
    env = build_script_env()
    choices = [
        subprocess.run(["bash", str(BUILD_SCRIPT), "--rpc-target", str(build)], capture_output=True, text=True, env=env)
        for _ in range(RUNS)
    ]
    assert [(run.returncode, run.stdout.strip()) for run in choices] == [(0, expected)] * RUNS, [
        run.stderr for run in choices if run.returncode
    ]


def test_build_is_native_without_amx():
    """The servers are built for the CPU they run on (never a fixed vector extension that a CPU may
    lack, which killed them with SIGILL on CPUs without AVX-512), with AMX turned off."""
    build = configured_build_folder()
    cache = (build / "CMakeCache.txt").read_text()
    assert "GGML_NATIVE:BOOL=ON" in cache
    assert "GGML_AVX512:BOOL=ON" not in cache
    commands = (build / "compile_commands.json").read_text()
    cpu_sources = [line for line in commands.splitlines() if '"command"' in line and "ggml-cpu" in line]
    assert cpu_sources
    for line in cpu_sources:
        assert "-march=native" in line
        if os.uname().machine == "x86_64":
            assert "-mno-amx-tile" in line and "-mno-amx-int8" in line and "-mno-amx-bf16" in line
            assert "-mavx512" not in line


def bin_dir_for(cpu_flags: str | None) -> str:
    env = build_script_env()
    if cpu_flags is not None:
        env["LLMCHAT_BUILD_CPU_FLAGS"] = cpu_flags
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "--bin-dir"], capture_output=True, text=True, env=env, check=True)
    return done.stdout.strip()


def test_cache_folder_is_keyed_by_the_cpu():
    """A cache folder copied from a machine with another CPU is never used: the key holds the CPU's
    feature flags (and the compiler and build options), so another CPU gets another folder."""
    here = bin_dir_for(None)
    assert here == str(binaries_dir())
    zen3 = bin_dir_for("fpu sse sse2 avx avx2 fma f16c bmi2")
    with_avx512 = bin_dir_for("fpu sse sse2 avx avx2 fma f16c bmi2 avx512f avx512bw avx512vl")
    assert len({here, zen3, with_avx512}) == 3
    assert bin_dir_for("fpu sse sse2 avx avx2 fma f16c bmi2") == zen3  # stable for one CPU
