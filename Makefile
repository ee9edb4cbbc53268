# gpuscaler — build, test and generate. `make help` lists the targets.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO       ?= go
BIN      := $(CURDIR)/.bin
VERSION  ?= $(shell git describe --tags --match 'v[0-9]*' --always --dirty 2>/dev/null || echo dev)
COMMIT   ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS  := -s -w -X github.com/gpuscaler/gpuscaler/internal/version.Version=$(VERSION) \
            -X github.com/gpuscaler/gpuscaler/internal/version.Commit=$(COMMIT)
# go-nvml's header marks NVML calls deprecated that it still wraps: thousands of warnings
# that would bury a real error in the build log.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
# The same flags build the release image (Dockerfile) and the local binary.
BUILDFLAGS := -trimpath -ldflags '$(LDFLAGS)'

# Code generators, pinned: generated code is committed and CI checks it is current.
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
# Reflection-free (un)marshalling of the events: 3.5x faster decoding of a NodeReport.
# The same version gRPC already requires, so generator and runtime agree.
PROTOC_GEN_GO_VTPROTO_VERSION := v0.6.1-0.20240319094008-0393e58bdf10
PROTO_FILES := proto/externalscaler/externalscaler.proto proto/gpuscaler/v1/events.proto proto/gpuscaler/v1/explain.proto

.PHONY: help
help: ## list the targets
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z0-9_.-]+:.*## /{printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build bin/gpuscaler (cgo: needs a C compiler, for the collector's DCGM and NVML sources)
	$(GO) build $(BUILDFLAGS) -o bin/gpuscaler ./cmd/gpuscaler

.PHONY: build-static
build-static: ## build bin/gpuscaler-static with CGO_ENABLED=0: scaler, auth callout and CLI, no C compiler needed (its collector has no DCGM or NVML source)
	CGO_ENABLED=0 $(GO) build $(BUILDFLAGS) -o bin/gpuscaler-static ./cmd/gpuscaler

# The images `make image` builds: IMAGE_REPOSITORY:IMAGE_TAG (the static binary: scaler,
# auth callout, CLI) and IMAGE_REPOSITORY-collector:IMAGE_TAG (cgo, with glibc). Files
# are dated at the last commit, so the same binaries make the same digests.
IMAGE_REPOSITORY ?= gpuscaler
IMAGE_TAG        ?= $(VERSION)
IMAGE_FLAGS = --scaler-bin $(CURDIR)/bin/gpuscaler-static --collector-bin $(CURDIR)/bin/gpuscaler \
              --repository $(IMAGE_REPOSITORY) --tag $(IMAGE_TAG) --out $(CURDIR)/bin/image
IMAGE_EPOCH = SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || echo 0)

.PHONY: image
image: build build-static ## build the images without a container engine: bin/image/gpuscaler.tar and gpuscaler-collector.tar (docker load, podman load, kind load image-archive)
	cd deploy/image && $(IMAGE_EPOCH) $(GO) run . $(IMAGE_FLAGS)

.PHONY: image-push
image-push: build build-static ## build the images and push them: IMAGE_REPOSITORY=registry.example.com/team/gpuscaler (docker or podman login first)
	cd deploy/image && $(IMAGE_EPOCH) $(GO) run . $(IMAGE_FLAGS) --push

.PHONY: test-image
test-image: build build-static ## build the images in a test, check their config and files, run them in a chroot, push them to a registry on loopback (deploy/image)
	cd deploy/image && $(GO) vet ./... && GPUSCALER_BIN=$(CURDIR)/bin/gpuscaler GPUSCALER_STATIC_BIN=$(CURDIR)/bin/gpuscaler-static $(GO) test -count=1 ./...

.PHONY: run
run: build ## the demo: embedded NATS, simulated GPU nodes, the scaler, a bursty load and a live timeline (about a minute)
	./bin/gpuscaler demo --chart demo.svg

.PHONY: scaler
scaler: build ## run the scaler alone, with an embedded NATS server
	./bin/gpuscaler scaler

.PHONY: test
test: lint ## lint, then the main module's and test/testkit's tests with the race detector (not fuzz, test-manifests, test-keda or e2e)
	$(GO) test -race -count=1 ./...
	cd test/testkit && $(GO) test -race -count=1 ./...
	CGO_ENABLED=0 $(GO) test -count=1 -run NoCgo ./collector/

.PHONY: lint
lint: ## gofmt and go vet, with cgo and without (every package must build with CGO_ENABLED=0)
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); test -z "$$out" || { echo "gofmt needed:"; echo "$$out"; exit 1; }
	$(GO) vet ./...
	CGO_ENABLED=0 $(GO) vet ./...
	$(GO) vet -tags hardware ./collector/...
	cd test/testkit && $(GO) vet ./...

# Fuzz budgets count executions, not seconds: a duration-based -fuzztime can fail with a
# bare "context deadline exceeded" and no crasher (a race in Go's fuzz coordinator,
# golang/go#75804, fixed in Go 1.27). A target's corpus grows in the Go cache from run to
# run, and with it the inputs it mutates, so the same budget takes longer as it learns:
# 100000 executions took 5 to 15 s per target when it was set, 17 to 35 s by 2026-11-24,
# six minutes of CI in all. 50000 keeps CI within its time while each run still goes on
# from the corpus the last one left.
FUZZTIME ?= 50000x
# Each input that finds new coverage is minimised for up to 60 s by default, which took
# most of some targets' time: FuzzParseTrigger from an empty corpus ran 73 s, 13 s with
# 2000 executions of minimising. A crasher found is still written, a little larger.
FUZZMINIMIZE ?= 2000x

.PHONY: test-hardware
test-hardware: ## on a machine with an NVIDIA GPU: the NVML source against nvidia-smi, the DCGM fallback, MIG profile names (hack/hardware-check.sh adds a CUDA load and the CLI)
	$(GO) test -tags hardware -count=1 -v -run Hardware ./collector/ ./collector/nvml/

.PHONY: hardware-binaries
hardware-binaries: ## build .hw/collector.test.gz, .hw/nvml.test.gz and .hw/gpuscaler.gz, to run hack/hardware-check.sh on a GPU machine without Go
	mkdir -p .hw
	$(GO) test -c -tags hardware -ldflags '-s -w' -o .hw/collector.test ./collector/
	$(GO) test -c -tags hardware -ldflags '-s -w' -o .hw/nvml.test ./collector/nvml/
	$(GO) build $(BUILDFLAGS) -o .hw/gpuscaler ./cmd/gpuscaler
	gzip -9f .hw/collector.test .hw/nvml.test .hw/gpuscaler

# Fuzz workers per target: Go's default (GOMAXPROCS) unless set. CI fuzzes beside the e2e
# suite, mostly idle on KEDA's polls, with FUZZPARALLEL=1 at the lowest CPU priority (.ci/run).
FUZZPARALLEL ?=

# The targets are read from each package's test files, as go list names them for this
# build (build constraints count as for go test), not with `go test -list`, which links
# every package's test binary: about two minutes of CI for ~40 packages, most without one.
.PHONY: fuzz
fuzz: ## run every fuzz target for FUZZTIME each (default 50000x: executions), minimising new inputs for FUZZMINIMIZE (2000x); FUZZPARALLEL workers
	@$(GO) list -f '{{.ImportPath}}{{range .TestGoFiles}} {{$$.Dir}}/{{.}}{{end}}{{range .XTestGoFiles}} {{$$.Dir}}/{{.}}{{end}}' ./... | \
	while read -r pkg files; do \
	  test -n "$$files" || continue; \
	  for f in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*\*testing\.F).*/\1/p' $$files); do \
	    echo "== fuzz $$pkg $$f"; SECONDS=0; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZE) \
	      $(if $(FUZZPARALLEL),-parallel $(FUZZPARALLEL)) $$pkg </dev/null || exit 1; \
	    echo "== fuzz $$f: $$SECONDS s"; \
	  done; \
	done

# The real traces replay reads (shared/testdata/traces, beside the clone) and where
# `make replay` writes its tables' JSON and charts.
TRACES ?= ../shared/testdata/traces
REPLAY_OUT ?= replay-out

.PHONY: replay
replay: build ## replay GenTD26, the dense LLM hours (Azure, Mooncake; service model ×0.5, ×1, ×2) and openb through every policy: tables here, JSON and charts in REPLAY_OUT; then the dense hours' targets over seeds 1-3, forwards and played backwards (about two minutes)
	@mkdir -p $(REPLAY_OUT)
	./bin/gpuscaler replay --format gentd26 --trace $(TRACES)/gentd26-lora-requests-2024-11-15_27.csv \
	  --json $(REPLAY_OUT)/gentd26.json --chart $(REPLAY_OUT)/gentd26.svg
	@for t in azure-llm:azure-llm-2023-conv.csv mooncake:mooncake-conversation.jsonl; do \
	  for s in 0.5 1 2; do \
	    echo; echo "== $${t%%:*}, service model x$$s"; \
	    ./bin/gpuscaler replay --format $${t%%:*} --service-speed $$s --trace $(TRACES)/$${t#*:} \
	      --json $(REPLAY_OUT)/$${t%%:*}-x$$s.json --chart $(REPLAY_OUT)/$${t%%:*}-x$$s.svg || exit 1; \
	  done; \
	done
	./bin/gpuscaler replay --format openb --trace $(TRACES)/openb-pods-default.csv \
	  --json $(REPLAY_OUT)/openb.json --chart $(REPLAY_OUT)/openb.svg
	@echo; echo "== the dense hours' targets (issue 26), seeds 1-3"
	python3 hack/replay-matrix.py --out $(REPLAY_OUT)/matrix ./bin/gpuscaler $(TRACES)
	@echo; echo "== the same, the hours played backwards (held out: nothing was tuned on them)"
	python3 hack/replay-matrix.py --reverse --out $(REPLAY_OUT)/matrix-reverse ./bin/gpuscaler $(TRACES)

.PHONY: replay-smoke
replay-smoke: build ## replay a short slice of each trace, as CI does: the command, its JSON and charts work on real data (seconds)
	@out=$$(mktemp -d) && trap 'rm -rf $$out' EXIT && \
	./bin/gpuscaler replay --quiet --format gentd26 --limit 1500 --trace $(TRACES)/gentd26-lora-requests-2024-11-15_27.csv --json $$out/g.json --chart $$out/g.svg && \
	./bin/gpuscaler replay --quiet --format azure-llm --limit 3000 --trace $(TRACES)/azure-llm-2023-conv.csv --json $$out/a.json --chart $$out/a.svg && \
	./bin/gpuscaler replay --quiet --format mooncake --limit 1500 --trace $(TRACES)/mooncake-conversation.jsonl --json $$out/m.json --chart $$out/m.svg && \
	./bin/gpuscaler replay --quiet --format openb --limit 500 --trace $(TRACES)/openb-pods-default.csv --json $$out/o.json --chart $$out/o.svg

.PHONY: bench
bench: build ## run gpuscaler bench (about a minute) and the go test benchmarks
	./bin/gpuscaler bench --log-level warn --out bench.json
	$(GO) test -run '^$$' -bench . -benchmem ./...

.PHONY: bench-large
bench-large: build ## run gpuscaler bench at the sizes its targets are set at: 10,000 nodes and triggers, a namespace of 7,000 GPUs (a few minutes)
	./bin/gpuscaler bench --scale large --log-level warn --out bench-large.json

.PHONY: bench-smoke
bench-smoke: build ## small gpuscaler bench runs, on an open bus and through the auth callout, to check the command works
	for auth in open callout; do \
	  ./bin/gpuscaler bench --log-level warn --nodes 100 --activations 100 --triggers 100 --calls 1000 \
	    --big-namespace-gpus 200 --rates 5000 --step 250ms --memory-nodes 500 --out "" --nats-auth $$auth || exit 1; \
	done

.PHONY: bench-collector
bench-collector: build ## measure a running collector's CPU and RSS (sim source, 8 GPUs, 1 Hz, one minute), with the binary cached and cold
	./test/collector-footprint.sh 60
	./test/collector-footprint.sh --cold 60

.PHONY: manifests
manifests: ## render deploy/manifests, the inference example's gateway.yaml (and test/manifests' golden files) from the Helm charts
	deploy/render.sh

.PHONY: manifests-check
manifests-check: ## vet the renderer (deploy/render), then fail when deploy/manifests is not what the chart renders
	cd deploy/render && $(GO) vet ./...
	deploy/render.sh --check

.PHONY: test-manifests
test-manifests: build ## check the chart, manifests, examples and Dockerfile (strict Kubernetes/KEDA types, the binary's flags)
	cd test/manifests && $(GO) vet ./... && GPUSCALER_BIN=$(CURDIR)/bin/gpuscaler $(GO) test -count=1 ./...

.PHONY: test-keda
test-keda: build ## KEDA v2.21.0's own client (external, external-push) against bin/gpuscaler (test/keda; a cold first run compiles KEDA, ~13 min)
	GPUSCALER_BIN=$(CURDIR)/bin/gpuscaler ./test/keda/run.sh

.PHONY: e2e attacks
attacks: ## the e2e suite's attack tests alone (TestAttack*): what a tenant, a node or the network tries, refused
	./test/e2e/run.sh -run TestAttack

e2e: ## end-to-end on loopback: etcd, kube-apiserver, controller manager, scheduler, KEDA and its adapter, kwok GPU nodes, a NATS cluster (builds and caches them: ~21 min cold, ~6 warm)
	./test/e2e/run.sh

.PHONY: tools
tools: $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/protoc-gen-go-vtproto ## install pinned code generators into .bin

$(BIN)/protoc-gen-go:
	GOBIN=$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(BIN)/protoc-gen-go-grpc:
	GOBIN=$(BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

$(BIN)/protoc-gen-go-vtproto:
	GOBIN=$(BIN) $(GO) install github.com/planetscale/vtprotobuf/cmd/protoc-gen-go-vtproto@$(PROTOC_GEN_GO_VTPROTO_VERSION)

.PHONY: proto
proto: tools ## regenerate Go code from proto/ (needs protoc: apt-get install protobuf-compiler libprotobuf-dev)
	PATH=$(BIN):$$PATH protoc -I proto -I /usr/include \
	  --go_out=proto --go_opt=paths=source_relative \
	  --go-grpc_out=proto --go-grpc_opt=paths=source_relative \
	  $(PROTO_FILES:proto/%=%)
	PATH=$(BIN):$$PATH protoc -I proto -I /usr/include \
	  --go-vtproto_out=proto --go-vtproto_opt=paths=source_relative,features=marshal+unmarshal+size \
	  gpuscaler/v1/events.proto

.PHONY: proto-check
proto-check: proto ## fail when committed generated code differs from a fresh generation
	@git diff --exit-code -- 'proto/*.pb.go' || { echo 'generated code is stale: run make proto and commit' >&2; exit 1; }
	@test -z "$$(git status --porcelain -- proto | grep '^??')" || { echo 'untracked generated files under proto/' >&2; git status --porcelain -- proto >&2; exit 1; }
