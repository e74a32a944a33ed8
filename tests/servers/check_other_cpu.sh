#!/usr/bin/env bash
# Check that build.sh's servers run on a CPU without AVX-512, on a machine that has it.
#
# build.sh compiles with -march=native. On an AMD Zen 3 (AVX2, no AVX-512) that means
# -march=znver3, so this script configures the same build as build.sh with a compiler launcher that
# turns -march=native into -march=znver3, builds the RPC server (ggml and its CPU backend), and runs
# it under QEMU's user-mode emulation of an EPYC-Milan (Zen 3) CPU, which has no AVX-512 and
# faults on any AVX-512 instruction. A llama-server on the real CPU then offloads every layer of
# the bundled model to that emulated server and answers a prompt, so the emulated CPU runs the
# model's matrix work. As a control, this machine's own native build must die there with SIGILL
# when the host has AVX-512 (the fate of the old fixed -DGGML_AVX512=ON build on a Zen 3).
#
# Needs qemu-user (Debian: apt-get install qemu-user) and the servers built by build.sh.
# Usage: bash tests/servers/check_other_cpu.sh   (about 5 minutes on 2 cores)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python_bin="${PYTHON:-python}"
cpu_model="${QEMU_CPU:-EPYC-Milan}"
march="${EMULATED_MARCH:-znver3}"
bin="$(bash "$here/build.sh" --bin-dir)"
src="$(find "$(dirname "$bin")/work" -maxdepth 1 -type d -name 'llama_cpp_python-*' -print)"
out="${CHECK_DIR:-$(mktemp -d)}"
mkdir -p "$out"
model="$("$python_bin" -c 'from llmchat.models.resolve import bundled_default_model; print(bundled_default_model())')"

command -v qemu-x86_64 >/dev/null || { echo "check_other_cpu.sh: needs qemu-x86_64 (apt-get install qemu-user)" >&2; exit 2; }
[[ -x "$bin/llama-server" && -d "$src" ]] || { echo "check_other_cpu.sh: run tests/servers/build.sh first" >&2; exit 2; }

free_port() { "$python_bin" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# The launcher: the compiler command line with -march=native replaced, nothing else changed.
cat >"$out/launcher" <<LAUNCH
#!/usr/bin/env bash
args=()
for a in "\$@"; do [[ "\$a" == "-march=native" ]] && a="-march=$march"; args+=("\$a"); done
exec "\${args[@]}"
LAUNCH
chmod +x "$out/launcher"

no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -S "$src/vendor/llama.cpp" -B "$out/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_RPC=ON -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
    "-DCMAKE_C_FLAGS=$no_amx" "-DCMAKE_CXX_FLAGS=$no_amx" \
    -DCMAKE_C_COMPILER_LAUNCHER="$out/launcher" -DCMAKE_CXX_COMPILER_LAUNCHER="$out/launcher" \
    -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON \
    -DBUILD_SHARED_LIBS=OFF >"$out/cmake.log" 2>&1
target="$(bash "$here/build.sh" --rpc-target "$out/build")"
ninja -C "$out/build" "$target" >"$out/ninja.log" 2>&1
emulated="$out/build/bin/$target"

wait_port() {  # up to 120 s for something to listen on 127.0.0.1:$1
    for _ in $(seq 1 240); do
        if "$python_bin" -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1).close()' "$1" 2>/dev/null; then
            return 0
        fi
        sleep 0.5
    done
    return 1
}

# Serve the bundled model with every layer on an rpc-server running under the emulated CPU; print
# the reply to a greedy prompt, or fail.
answer_through() {
    local rpc_binary="$1" name="$2" port server_port rpc_pid server_pid reply=""
    port="$(free_port)"
    qemu-x86_64 -cpu "$cpu_model" "$rpc_binary" -H 127.0.0.1 -p "$port" >"$out/$name-rpc.log" 2>&1 &
    rpc_pid=$!
    if ! wait_port "$port"; then
        echo "$name: the emulated rpc-server never listened: $(grep -v warning "$out/$name-rpc.log" | tail -2)" >&2
        kill "$rpc_pid" 2>/dev/null || true
        return 1
    fi
    server_port="$(free_port)"
    "$bin/llama-server" -m "$model" --rpc "127.0.0.1:$port" -ngl 99 -c 256 -t 2 --host 127.0.0.1 --port "$server_port" \
        >"$out/$name-server.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 1 600); do
        if ! kill -0 "$rpc_pid" 2>/dev/null || ! kill -0 "$server_pid" 2>/dev/null; then
            break
        fi
        if reply="$(curl -sf --max-time 600 "http://127.0.0.1:$server_port/completion" \
            -d '{"prompt": "The capital of France is", "n_predict": 8, "temperature": 0}' 2>/dev/null)"; then
            break
        fi
        sleep 1
    done
    set +e
    wait_status=0
    if ! kill -0 "$rpc_pid" 2>/dev/null; then
        wait "$rpc_pid"
        wait_status=$?
    fi
    set -e
    # SIGKILL: a process under qemu-user may not act on SIGTERM while it waits for a client.
    kill -KILL "$server_pid" "$rpc_pid" 2>/dev/null || true
    wait "$server_pid" "$rpc_pid" 2>/dev/null || true
    if [[ -z "$reply" ]]; then
        echo "$name: no reply; the emulated rpc-server exited with status $wait_status (132 = SIGILL)" >&2
        return 1
    fi
    echo "$name: answered $(echo "$reply" | "$python_bin" -c 'import json,sys; print(repr(json.load(sys.stdin)["content"]))')" >&2
    grep -m1 -i "offloaded" "$out/$name-server.log" >&2 || true
}

echo "built for -march=$march with build.sh's options; AVX-512 flags on its compile lines: $(grep -c -- "-mavx512" "$out/build/compile_commands.json" || true)" >&2
answer_through "$emulated" "emulated-build"
if grep -qw avx512f /proc/cpuinfo; then
    echo "control: this machine's own native build (it has AVX-512) under the same emulated CPU" >&2
    if answer_through "$bin/rpc-server" "native-build"; then
        echo "control failed: the native AVX-512 build ran on the emulated CPU, so the check proves nothing" >&2
        exit 1
    fi
fi
echo "ok: build.sh's build runs on a $cpu_model CPU (no AVX-512)" >&2
