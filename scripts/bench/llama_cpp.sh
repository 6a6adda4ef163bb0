# Sourced by scripts/bench.sh and scripts/bench/*.sh: llama.cpp built once from the
# llama-cpp-python 0.3.36 sdist on PyPI (its vendored llama.cpp) into $KVLAB_CACHE/llama.cpp,
# never committed. The build is native (ggml's default) and so belongs to one CPU: it lives
# in a folder named by the CPU's flags, so a cache carried to another machine builds anew
# instead of dying of an illegal instruction. AMX is compiled out: a CPU may list the AMX
# flags while its kernel (a VM's, say) never grants the tile state, and ggml's AMX kernels
# then die on their first `tilezero` (seen on this project's CI machines).
LLAMA_DIR="$KVLAB_CACHE/llama.cpp"
SDIST_VERSION=0.3.36
LLAMA_SRC="$LLAMA_DIR/llama_cpp_python-$SDIST_VERSION"
LLAMA_BUILD="$LLAMA_DIR/build-noamx-$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | md5sum | cut -c1-8)"
LLAMA_BIN="$LLAMA_BUILD/bin"
LLAMA_TARGETS=(llama-bench llama-quantize llama-perplexity llama-server)

build_llama_cpp() {
  local t missing=0
  for t in "${LLAMA_TARGETS[@]}"; do [ -x "$LLAMA_BIN/$t" ] || missing=1; done
  [ "$missing" = 0 ] && return 0
  command -v cmake >/dev/null || as_root apt-get install -y -qq --no-install-recommends cmake >/dev/null
  mkdir -p "$LLAMA_DIR"
  if [ ! -d "$LLAMA_SRC" ]; then
    say "downloading the llama-cpp-python $SDIST_VERSION sdist (llama.cpp's sources)"
    # --no-binary for this package only: `:all:` would build cmake itself from source.
    python3 -m pip download --quiet --no-binary llama-cpp-python --no-deps \
      "llama-cpp-python==$SDIST_VERSION" -d "$LLAMA_DIR"
    tar -xzf "$LLAMA_DIR/llama_cpp_python-$SDIST_VERSION.tar.gz" -C "$LLAMA_DIR"
  fi
  say "building ${LLAMA_TARGETS[*]} (once per CPU, -j2)"
  local flags=""
  [ "$(uname -m)" = x86_64 ] && flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  cmake -S "$LLAMA_SRC/vendor/llama.cpp" -B "$LLAMA_BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
    >"$LLAMA_DIR/build.log"
  cmake --build "$LLAMA_BUILD" --target "${LLAMA_TARGETS[@]}" -j2 >>"$LLAMA_DIR/build.log"
}
