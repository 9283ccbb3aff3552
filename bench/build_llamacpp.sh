#!/usr/bin/env bash
# llama.cpp's tools for bench/llamacpp.py, built once from the llama.cpp that the llama-cpp-python sdist vendors
# (PyPI is the one registry reachable here; the sdist is pinned by hash). About 6 minutes on 2 cores (AMD EPYC,
# 2026-12-07: the sdist's download takes seconds; ninja's last 154 of 220 steps took 4.2 min on a quiet machine);
# the build lives in the cache, outside the repository, and CI never runs it.
#
#   bash bench/build_llamacpp.sh            # -> ~/.cache/llamacpp/.../build/bin/llama-{bench,perplexity,server,cli}
set -euo pipefail

VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
CACHE="${TFORMER_LLAMACPP_CACHE:-$HOME/.cache/llamacpp}"
SRC="$CACHE/llama_cpp_python-$VERSION/vendor/llama.cpp"
TARGETS=(llama-bench llama-perplexity llama-server llama-cli)

mkdir -p "$CACHE"
archive="$CACHE/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$archive" ]; then
  # --no-binary for this package alone: its sdist, without building every build dependency from source first
  pip download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$CACHE" >/dev/null
fi
echo "$SHA256  $archive" | sha256sum --check --quiet || { echo "sdist hash mismatch: $archive" >&2; exit 2; }
[ -d "$SRC" ] || tar -xzf "$archive" -C "$CACHE"

# Native ISA (AVX2 / AVX-512 / AMX as this CPU has them), no network code, static tools.
cmake -S "$SRC" -B "$SRC/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
ninja -C "$SRC/build" -j"$(nproc)" "${TARGETS[@]}"
echo "$SRC/build/bin"
