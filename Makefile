# sbx build. `make help` lists the targets.

GO            ?= go
BIN           := bin
RUNSC_VERSION := release-20260905.0
SBX_VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
GO_SOURCES    := $(shell find . -name '*.go' -not -name '*_test.go' -not -path './tools/*' -not -path './bin/*') go.mod go.sum

.DEFAULT_GOAL := build
.PHONY: help build deps demo test test-unit test-integration bench lint clean containerd-tools shim

help: ## list the targets
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z_-]+:.*## /{printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: $(BIN)/sbx $(BIN)/sbx-init $(BIN)/runsc $(BIN)/images/busybox.tar ## build sbx, sbx-init, the pinned runsc and the default image

deps: ## install the host packages sbx and its tests need (Debian)
	@scripts/install-deps.sh

$(BIN)/sbx: $(GO_SOURCES)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-X sbx.dev/sbx/cmd/sbx/commands/system.version=$(SBX_VERSION)" -o $@ ./cmd/sbx

# sbx-init runs inside gVisor: static, no cgo.
$(BIN)/sbx-init: $(GO_SOURCES)
	CGO_ENABLED=0 $(GO) build -trimpath -o $@ ./cmd/sbx-init

# runsc is built from its own module (tools/runsc) so that gVisor's pins
# never meet the main module's. It must be static: a cgo runsc cannot
# re-exec itself inside its chroot.
$(BIN)/runsc: tools/runsc/go.mod tools/runsc/go.sum
	cd tools/runsc && CGO_ENABLED=0 $(GO) build -trimpath \
		-ldflags "-X gvisor.dev/gvisor/runsc/version.version=$(RUNSC_VERSION)" \
		-o $(CURDIR)/$@ gvisor.dev/gvisor/runsc

$(BIN)/sbx-mkimage: $(GO_SOURCES)
	$(GO) build -o $@ ./cmd/sbx-mkimage

# The default image: Debian's busybox-static, no network needed.
$(BIN)/images/busybox.tar: $(BIN)/sbx-mkimage /bin/busybox
	@mkdir -p $(dir $@)
	$(BIN)/sbx-mkimage -busybox /bin/busybox -o $@.tmp && mv $@.tmp $@

/bin/busybox:
	@scripts/install-deps.sh

# --- containerd shim -------------------------------------------------------
# The containerd runtime v2 shim (io.containerd.sbx.v1), and the pinned
# containerd, ctr and crictl its integration tests run against. The tools
# are built once and kept in bin/ (about 3 minutes the first time).
CONTAINERD_VERSION := v2.4.2
CRITOOLS_VERSION   := v1.37.0
CONTAINERD_TOOLS   := $(BIN)/containerd $(BIN)/ctr $(BIN)/crictl

shim: $(BIN)/containerd-shim-sbx-v1 $(BIN)/images/pause.tar ## build the containerd shim and the CRI pause image

$(BIN)/containerd-shim-sbx-v1: $(GO_SOURCES)
	CGO_ENABLED=0 $(GO) build -trimpath -o $@ ./cmd/containerd-shim-sbx-v1

# The CRI pause image: busybox plus sbx-init as /pause (it waits for SIGTERM).
$(BIN)/images/pause.tar: $(BIN)/sbx-mkimage $(BIN)/sbx-init /bin/busybox
	@mkdir -p $(dir $@)
	$(BIN)/sbx-mkimage -busybox /bin/busybox -pause $(BIN)/sbx-init -name pause:sbx -o $@.tmp && mv $@.tmp $@

containerd-tools: $(CONTAINERD_TOOLS) ## build the pinned containerd, ctr and crictl for the shim's tests

$(BIN)/containerd $(BIN)/ctr:
	GOBIN=$(CURDIR)/$(BIN) CGO_ENABLED=0 $(GO) install github.com/containerd/containerd/v2/cmd/$(notdir $@)@$(CONTAINERD_VERSION)

$(BIN)/crictl:
	GOBIN=$(CURDIR)/$(BIN) CGO_ENABLED=0 $(GO) install sigs.k8s.io/cri-tools/cmd/crictl@$(CRITOOLS_VERSION)
# ---------------------------------------------------------------------------

demo: deps build ## build, then run a command in a gVisor sandbox on the default image
	$(BIN)/sbx run --rm -- sh -c 'uname -a; echo "hello from $$(hostname) in gVisor"'

test: deps build shim containerd-tools ## run every test: unit, then integration with real runsc (root and rootless)
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	SBX_BIN=$(CURDIR)/$(BIN) SBX_INTEGRATION=1 $(GO) test -count=1 -timeout 25m ./...

test-unit: ## run the unit tests only
	$(GO) test -count=1 $$(go list ./... | grep -v /integration)

test-integration: build shim containerd-tools ## run the integration tests only
	SBX_BIN=$(CURDIR)/$(BIN) SBX_INTEGRATION=1 $(GO) test -count=1 -timeout 25m -v ./integration/

bench: deps build ## measure sbx against raw runsc; writes docs/benchmarks.md
	$(GO) run ./integration/bench -bin $(CURDIR)/$(BIN) -out docs/benchmarks.md

lint: ## go vet and gofmt
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }

clean: ## remove build outputs
	rm -rf $(BIN)
