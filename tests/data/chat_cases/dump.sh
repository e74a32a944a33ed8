#!/usr/bin/env bash
# Re-create cases.jsonl (and templates/) from llama.cpp's tests/test-chat.cpp.
#
# usage: dump.sh /path/to/llama_cpp_python-0.3.36 [workdir]
#   $1: an unpacked llama-cpp-python sdist (containing vendor/llama.cpp), or a llama.cpp tree itself
#   $2: scratch directory for the patched copy and its build (default: a fresh mktemp -d)
#
# The source tree is never modified: it is copied, dump.patch is applied to the copy,
# only the test-chat target is built, and the binary is run with LLAMA_TEST_CHAT_DUMP set,
# which makes peg_test_builder::run() append one JSON line per case instead of running it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="${1:?usage: dump.sh /path/to/unpacked/sdist [workdir]}"
if [ -d "$src/vendor/llama.cpp" ]; then
    src="$src/vendor/llama.cpp"
fi
[ -f "$src/tests/test-chat.cpp" ] || { echo "no tests/test-chat.cpp under $src" >&2; exit 1; }

work="${2:-$(mktemp -d)}"
tree="$work/llama.cpp"
rm -rf "$tree"
mkdir -p "$work"
cp -r "$src" "$tree"

patch -d "$tree" -p1 < "$here/dump.patch"

jobs="${JOBS:-2}"
cmake -S "$tree" -B "$tree/build" -DLLAMA_BUILD_TESTS=ON -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF \
      -DCMAKE_BUILD_TYPE=Release
cmake --build "$tree/build" --target test-chat -j "$jobs"

bin="$(find "$tree/build" -type f -name test-chat -perm -u+x | head -n 1)"
[ -n "$bin" ] || { echo "test-chat binary not found" >&2; exit 1; }

# run from the llama.cpp root so models/templates/... paths resolve
(cd "$tree" && LLAMA_TEST_CHAT_DUMP="$work/cases.jsonl" "$bin")

# copy every template the cases use, plus the DeepSeek-R1 ones, byte for byte
mkdir -p "$here/templates"
python3 - "$work/cases.jsonl" "$tree" "$here/templates" <<'EOF'
import glob, json, os, shutil, sys
cases, tree, dest = sys.argv[1:4]
paths = set()
with open(cases, encoding="utf-8") as f:
    for line in f:
        paths.add(json.loads(line)["template_path"])
tdir = os.path.join(tree, "models", "templates")
extra = [os.path.join(tdir, "llama-cpp-deepseek-r1.jinja")]
extra += glob.glob(os.path.join(tdir, "*DeepSeek-R1-Distill*.jinja"))
for p in sorted(paths) + sorted(extra):
    src = p if os.path.isabs(p) else os.path.join(tree, p)
    shutil.copyfile(src, os.path.join(dest, os.path.basename(src)))
EOF

cp "$work/cases.jsonl" "$here/cases.jsonl"
echo "wrote $(wc -l < "$here/cases.jsonl") cases to $here/cases.jsonl"
