#!/usr/bin/env bash
# Build llama-server and the ggml RPC server from the llama.cpp sources vendored in the
# llama-cpp-python sdist that matches the installed binding, so the server speaks the same
# llama.cpp as the in-process engine. Debian 12 has no llama.cpp package.
#
# The result lands in a cache folder keyed by the version and is reused when present:
#   ${LLMCHAT_SERVER_CACHE:-$HOME/.cache/llmchat/servers}/<version>/bin/{llama-server,rpc-server}
# A full build takes about 10 minutes on 2 cores (llama-server also builds the multimodal library).
#
# CPU flags: ggml's AMX kernels die with SIGILL on some CPUs that advertise AMX, so the build is
# not native; it names the vector extensions it uses (AVX-512 without AMX).
set -euo pipefail

python_bin="${PYTHON:-python}"
version="$("$python_bin" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))')"
cache_root="${LLMCHAT_SERVER_CACHE:-$HOME/.cache/llmchat/servers}"
dest="$cache_root/$version"
jobs="${BUILD_JOBS:-$(nproc)}"

if [[ -x "$dest/bin/llama-server" && -x "$dest/bin/rpc-server" ]]; then
    echo "llama.cpp servers for llama-cpp-python $version already built in $dest/bin" >&2
    echo "$dest/bin"
    exit 0
fi

work="$dest/work"
mkdir -p "$work" "$dest/bin"

sdist="$(ls "$work"/llama_cpp_python-"$version".tar.gz 2>/dev/null || true)"
if [[ -z "$sdist" ]]; then
    echo "fetching the llama-cpp-python $version sdist (pip) ..." >&2
    "$python_bin" -m pip download --quiet --no-binary :all: --no-deps --dest "$work" "llama-cpp-python==$version" >&2
    sdist="$(ls "$work"/llama_cpp_python-"$version".tar.gz)"
fi

src="$work/llama_cpp_python-$version"
if [[ ! -d "$src/vendor/llama.cpp" ]]; then
    tar -xzf "$sdist" -C "$work"
fi

build="$work/build"
cmake -S "$src/vendor/llama.cpp" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_RPC=ON -DLLAMA_CURL=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
    -DBUILD_SHARED_LIBS=OFF >&2

# The RPC server target was renamed upstream (rpc-server -> ggml-rpc-server); build whichever exists.
rpc_target="ggml-rpc-server"
if ! ninja -C "$build" -t targets all 2>/dev/null | grep -q "^ggml-rpc-server:"; then
    rpc_target="rpc-server"
fi
ninja -C "$build" -j "$jobs" llama-server "$rpc_target" >&2

cp "$build/bin/llama-server" "$dest/bin/llama-server.tmp" && mv "$dest/bin/llama-server.tmp" "$dest/bin/llama-server"
cp "$build/bin/$rpc_target" "$dest/bin/rpc-server.tmp" && mv "$dest/bin/rpc-server.tmp" "$dest/bin/rpc-server"
echo "built llama-server and rpc-server for llama-cpp-python $version in $dest/bin" >&2
echo "$dest/bin"
