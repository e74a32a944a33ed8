#!/usr/bin/env bash
# Build llama-server and the ggml RPC server from the llama.cpp sources vendored in the
# llama-cpp-python sdist that matches the installed binding, so the server speaks the same
# llama.cpp as the in-process engine. Debian 12 has no llama.cpp package.
#
#   bash tests/servers/build.sh                 build (or reuse) and print the bin folder
#   bash tests/servers/build.sh --bin-dir       print the bin folder for this machine, build nothing
#   bash tests/servers/build.sh --rpc-target D  print the RPC server's target name in build folder D
#
# The result lands in a cache folder keyed by everything the binaries depend on: the
# llama-cpp-python version, this CPU's feature flags, the compiler, and the build options. A cache copied from another machine therefore never matches, and is never run:
#   ${LLMCHAT_SERVER_CACHE:-$HOME/.cache/llmchat/servers}/<version>/<key>/bin/{llama-server,rpc-server}
# A full build takes about 10 minutes on 2 cores (llama-server also builds the multimodal library).
#
# CPU flags: the build is native (-march=native), so it uses what this CPU has and nothing it
# lacks (no AVX-512 on a Zen 3, say). Only AMX is turned off: ggml's AMX kernels die with SIGILL on
# some virtual machines that advertise AMX. Explicit -mno-amx-* flags win over -march=native in GCC
# and Clang whatever their order on the command line.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python_bin="${PYTHON:-python}"
cache_root="${LLMCHAT_SERVER_CACHE:-$HOME/.cache/llmchat/servers}"
jobs="${BUILD_JOBS:-$(nproc)}"

# The RPC server target was renamed upstream (rpc-server -> ggml-rpc-server); pick whichever the
# configured build folder has. The whole target list is read before it is searched: `ninja ... |
# grep -q` under pipefail fails at random, because grep exits at its first match and ninja then
# dies of SIGPIPE.
rpc_target() {
    local targets
    targets="$(ninja -C "$1" -t targets all)"
    if grep -q '^ggml-rpc-server:' <<<"$targets"; then
        echo "ggml-rpc-server"
    elif grep -q '^rpc-server:' <<<"$targets"; then
        echo "rpc-server"
    else
        echo "build.sh: no RPC server target in $1 (was GGML_RPC turned off?)" >&2
        return 1
    fi
}

cpu_flags() {
    # The first "flags" line (Linux); elsewhere the compiler's view of the native target.
    # LLMCHAT_BUILD_CPU_FLAGS stands in for them (tests check that another CPU gets another folder).
    local flags="${LLMCHAT_BUILD_CPU_FLAGS:-}"
    if [[ -n "$flags" ]]; then
        echo "$flags"
        return
    fi
    if [[ -r /proc/cpuinfo ]]; then
        flags="$(awk -F: '/^flags[[:space:]]*:/ { print $2; exit }' /proc/cpuinfo)"
    fi
    if [[ -z "$flags" ]]; then
        flags="$(uname -m) $(cc -march=native -dM -E - </dev/null 2>/dev/null | sort | tr '\n' ' ' || true)"
    fi
    echo "$flags"
}

no_amx=""
if [[ "$(uname -m)" == "x86_64" ]]; then
    no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
# Everything the build is configured with; part of the cache key.
cmake_options=(
    -DCMAKE_BUILD_TYPE=Release
    -DGGML_RPC=ON -DLLAMA_CURL=OFF
    -DGGML_NATIVE=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
    "-DCMAKE_C_FLAGS=$no_amx" "-DCMAKE_CXX_FLAGS=$no_amx"
    -DCMAKE_EXPORT_COMPILE_COMMANDS=ON
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON
    -DBUILD_SHARED_LIBS=OFF
)

cache_key() {
    {
        echo "llama-cpp-python $version"
        echo "cpu $(cpu_flags)"
        echo "cc $(cc --version 2>/dev/null | awk 'NR == 1')"
        echo "cxx $(c++ --version 2>/dev/null | awk 'NR == 1')"
        printf '%s\n' "${cmake_options[@]}"
    } | sha256sum | cut -c1-16
}

if [[ "${1:-}" == "--rpc-target" ]]; then
    rpc_target "${2:?usage: build.sh --rpc-target BUILD_DIR}"
    exit 0
fi

version="$("$python_bin" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))')"
dest="$cache_root/$version/$(cache_key)"

if [[ "${1:-}" == "--bin-dir" ]]; then
    echo "$dest/bin"
    exit 0
fi

if [[ -x "$dest/bin/llama-server" && -x "$dest/bin/rpc-server" ]]; then
    echo "llama.cpp servers for llama-cpp-python $version already built in $dest/bin" >&2
    echo "$dest/bin"
    exit 0
fi

work="$dest/work"
mkdir -p "$work" "$dest/bin"

sdist="$(find "$work" -maxdepth 1 -name "llama_cpp_python-$version.tar.gz" -print)"
if [[ -z "$sdist" ]]; then
    echo "fetching the llama-cpp-python $version sdist (pip) ..." >&2
    "$python_bin" -m pip download --quiet --no-binary :all: --no-deps --dest "$work" "llama-cpp-python==$version" >&2
    sdist="$work/llama_cpp_python-$version.tar.gz"
fi

src="$work/llama_cpp_python-$version"
if [[ ! -d "$src/vendor/llama.cpp" ]]; then
    tar -xzf "$sdist" -C "$work"
fi

build="$work/build"
cmake -S "$src/vendor/llama.cpp" -B "$build" -G Ninja "${cmake_options[@]}" >&2

target="$(rpc_target "$build")"
ninja -C "$build" -j "$jobs" llama-server "$target" >&2

cp "$build/bin/llama-server" "$dest/bin/llama-server.tmp" && mv "$dest/bin/llama-server.tmp" "$dest/bin/llama-server"
cp "$build/bin/$target" "$dest/bin/rpc-server.tmp" && mv "$dest/bin/rpc-server.tmp" "$dest/bin/rpc-server"
echo "built llama-server and rpc-server for llama-cpp-python $version in $dest/bin" >&2
echo "$dest/bin"
