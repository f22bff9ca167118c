# hutch build. `make help` lists the targets.

GO            ?= go
BIN           := bin
RUNSC_VERSION := release-20260905.0
# The version hutch reports and its package carries: a release tag's
# (vX.Y.Z -> X.Y.Z) where the commit has one, else 0.0.0~git DATE.COMMIT,
# which sorts before any release. Give HUTCH_VERSION to stamp another.
HUTCH_COMMIT  := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD 2>/dev/null || echo +dirty)
HUTCH_VERSION ?= $(shell v=$$(git describe --tags --exact-match --match 'v[0-9]*' 2>/dev/null) && echo $${v\#v} || echo 0.0.0~git$$(git log -1 --format=%cd --date=format:%Y%m%d 2>/dev/null).$(HUTCH_COMMIT))
# The build date is the commit's, so that a build of one commit is the
# same build whenever it is made.
BUILD_DATE    := $(shell date -u -d @$$(git log -1 --format=%ct 2>/dev/null || date +%s) +%Y-%m-%dT%H:%M:%SZ)
VERSION_PKG   := hutch.dev/hutch/cmd/hutch/commands/system
HUTCH_LDFLAGS := -X $(VERSION_PKG).version=$(HUTCH_VERSION) -X $(VERSION_PKG).commit=$(HUTCH_COMMIT) -X $(VERSION_PKG).buildDate=$(BUILD_DATE)
GO_SOURCES    := $(shell find . -name '*.go' -not -name '*_test.go' -not -path './tools/*' -not -path './bin/*') go.mod go.sum

.DEFAULT_GOAL := build
.PHONY: help build builder base-rootfs bench-images deps demo test test-unit test-integration test-slow bench lint clean containerd-tools shim

help: ## list the targets
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z0-9_-]+:.*## /{printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: console-assets $(BIN)/hutch $(BIN)/hutch-helper $(BIN)/hutch-init $(BIN)/runsc $(BIN)/images/busybox.tar builder ## build hutch, hutch-helper, hutch-init, the pinned runsc, BuildKit and the test image

# The web console's pages: npm ci from the lockfile, bundled by esbuild
# into console/dist, which bin/hutch embeds (a hutch built without them
# answers 503 on /console naming this target).
console-assets: ## build the web console's pages into console/dist (npm ci; embedded in bin/hutch)
	cd console/web && npm ci --no-audit --no-fund && node build.mjs
.PHONY: console-assets

deps: ## install the host packages hutch and its tests need (Debian)
	@scripts/install-deps.sh

# bin/hutch is built again when its stamp (version, commit, date) changes.
$(BIN)/.hutch-ldflags: FORCE
	@mkdir -p $(BIN) && echo '$(HUTCH_LDFLAGS)' | cmp -s - $@ || echo '$(HUTCH_LDFLAGS)' > $@
.PHONY: FORCE

$(BIN)/hutch: $(GO_SOURCES) $(BIN)/.hutch-ldflags $(wildcard console/dist/*)
	CGO_ENABLED=0 $(GO) build -trimpath -tags urfave_cli_no_docs -ldflags "$(HUTCH_LDFLAGS)" -o $@ ./cmd/hutch

# hutch-helper runs a sandbox's host helpers (DNS resolver, lifetime
# watchdog, port forwarder); hutch finds it beside itself.
$(BIN)/hutch-helper: $(GO_SOURCES)
	CGO_ENABLED=0 $(GO) build -trimpath -o $@ ./cmd/hutch-helper

# hutch-init runs inside gVisor: static, no cgo.
$(BIN)/hutch-init: $(GO_SOURCES)
	CGO_ENABLED=0 $(GO) build -trimpath -o $@ ./cmd/hutch-init

# runsc is built from its own module (tools/runsc) so that gVisor's pins
# never meet the main module's. It must be static: a cgo runsc cannot
# re-exec itself inside its chroot. The pinned gVisor gets the patches in
# tools/runsc: errnoret.patch, an OCI seccomp rule's errnoRet is honoured
# (docs/decisions/0020-runsc-errnoret-patch.md); tarorder.patch, `runsc tar
# rootfs-upper` writes a directory's entries in name order and
# tarstream.patch each file in 1 MiB pieces, not read whole into memory,
# and to the size its header gave, whatever the file became since,
# under a name of the call that says so
# (0030); timewait.patch, a restored connection's TIME-WAIT ends at once
# (0031); portforward.patch, runsc's port forward works with
# --network=none, passes a half close on, writes all it reads, misses no
# wake-up, does not hold the sandbox's other control calls while it
# connects, and ends its connections before a checkpoint and starts none
# during one, under a name of the call that says so (0033), and takes a
# connected host socket (the client's own connection) under another (0034);
# hostfiles.patch, the gofer mount options nosetid and owner_from_parent
# (0042).
# The module is vendored in a scratch copy to apply them; the module cache
# stays untouched.
RUNSC_PATCHES := $(sort $(wildcard tools/runsc/*.patch))
$(BIN)/runsc: tools/runsc/go.mod tools/runsc/go.sum $(RUNSC_PATCHES)
	$(call build-runsc,$(RUNSC_PATCHES))

# runsc-unpatched is the same runsc without the patches, as a runsc from
# elsewhere would be: the tests of what hutch does with one use it.
$(BIN)/runsc-unpatched: tools/runsc/go.mod tools/runsc/go.sum
	$(call build-runsc,)

# build-runsc builds the target from tools/runsc with the patches $(1).
define build-runsc
	rm -rf $@.build && mkdir -p $@.build && cp tools/runsc/go.mod tools/runsc/go.sum tools/runsc/tools.go $@.build/
	cd $@.build && $(GO) mod vendor && for p in $(abspath $(1)); do patch -s -p1 -d vendor/gvisor.dev/gvisor < $$p || exit 1; done
	cd $@.build && CGO_ENABLED=0 $(GO) build -mod=vendor -trimpath \
		-ldflags "-X gvisor.dev/gvisor/runsc/version.version=$(RUNSC_VERSION)" \
		-o $(abspath $@).tmp gvisor.dev/gvisor/runsc
	mv $@.tmp $@ && rm -rf $@.build
endef

# Image builds: buildkitd from the module pinned in go.mod (the same
# version as the client in hutch), the supervisor hutch starts it under, and the
# OCI runtime through which its RUN steps run under gVisor.
builder: $(BIN)/buildkitd $(BIN)/hutch-buildkitd $(BIN)/hutch-buildkit-runtime

$(BIN)/buildkitd: go.mod go.sum
	CGO_ENABLED=0 $(GO) build -trimpath -o $@ github.com/moby/buildkit/cmd/buildkitd

$(BIN)/hutch-buildkitd: $(GO_SOURCES)
	CGO_ENABLED=0 $(GO) build -trimpath -o $@ ./cmd/hutch-buildkitd

$(BIN)/hutch-buildkit-runtime: $(GO_SOURCES)
	CGO_ENABLED=0 $(GO) build -trimpath -o $@ ./cmd/hutch-buildkit-runtime

# The Debian root filesystem of the default image, from Debian's packages
# (mmdebstrap, a few minutes, once). hutch imports it instead of running
# mmdebstrap itself when the default image is first needed; without it hutch
# runs mmdebstrap on demand.
base-rootfs: $(BIN)/images/bookworm-rootfs.tar ## install Debian for the default image once (mmdebstrap), for hutch and the tests

# Rebuilt when the package list changes, not on every change to Go code.
$(BIN)/images/bookworm-rootfs.tar: buildimg/base.go | $(BIN)/hutch-mkimage
	$(BIN)/hutch-mkimage -bootstrap -o $@

$(BIN)/hutch-mkimage: $(GO_SOURCES)
	$(GO) build -o $@ ./cmd/hutch-mkimage

# The default image: Debian's busybox-static, no network needed.
$(BIN)/images/busybox.tar: $(BIN)/hutch-mkimage /bin/busybox
	@mkdir -p $(dir $@)
	$(BIN)/hutch-mkimage -busybox /bin/busybox -o $@.tmp && mv $@.tmp $@

/bin/busybox:
	@scripts/install-deps.sh

# --- containerd shim -------------------------------------------------------
# The containerd runtime v2 shim (io.containerd.hutch.v1), and the pinned
# containerd, ctr and crictl its integration tests run against. The tools
# are built once and kept in bin/ (about 3 minutes the first time).
CONTAINERD_VERSION := v2.4.2
CRITOOLS_VERSION   := v1.37.0
CONTAINERD_TOOLS   := $(BIN)/containerd $(BIN)/ctr $(BIN)/crictl

shim: $(BIN)/containerd-shim-hutch-v1 $(BIN)/hutch-init $(BIN)/images/pause.tar ## build the containerd shim and the CRI pause image

$(BIN)/containerd-shim-hutch-v1: $(GO_SOURCES)
	CGO_ENABLED=0 $(GO) build -trimpath -o $@ ./cmd/containerd-shim-hutch-v1

# The CRI pause image: busybox plus hutch-init as /pause (it waits for SIGTERM).
$(BIN)/images/pause.tar: $(BIN)/hutch-mkimage $(BIN)/hutch-init /bin/busybox
	@mkdir -p $(dir $@)
	$(BIN)/hutch-mkimage -busybox /bin/busybox -pause $(BIN)/hutch-init -name pause:hutch -o $@.tmp && mv $@.tmp $@

containerd-tools: $(CONTAINERD_TOOLS) ## build the pinned containerd, ctr and crictl for the shim's tests

$(BIN)/containerd $(BIN)/ctr:
	GOBIN=$(CURDIR)/$(BIN) CGO_ENABLED=0 $(GO) install github.com/containerd/containerd/v2/cmd/$(notdir $@)@$(CONTAINERD_VERSION)

$(BIN)/crictl:
	GOBIN=$(CURDIR)/$(BIN) CGO_ENABLED=0 $(GO) install sigs.k8s.io/cri-tools/cmd/crictl@$(CRITOOLS_VERSION)
# ---------------------------------------------------------------------------

demo: deps build base-rootfs ## build, then run a command in a gVisor sandbox on the default image (built on first use)
	$(BIN)/hutch run --rm -- sh -c 'uname -a; python3 -c "print(\"hello from python in gVisor\")"'

test: deps build $(BIN)/runsc-unpatched base-rootfs shim containerd-tools e2b-sdk e2b-cli mcp-inspector code-interpreter-image code-interpreter-sdk docker-image desktop-image desktop-sdk ## run every test: unit, then integration with real runsc (root and rootless)
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	HUTCH_BIN=$(CURDIR)/$(BIN) HUTCH_INTEGRATION=1 $(GO) test -count=1 -timeout 70m ./...

test-unit: ## run the unit tests only
	$(GO) test -count=1 $$(go list ./... | grep -v /integration)

test-integration: build $(BIN)/runsc-unpatched base-rootfs shim containerd-tools e2b-sdk e2b-cli mcp-inspector code-interpreter-image code-interpreter-sdk docker-image desktop-image desktop-sdk ## run the integration tests only
	HUTCH_BIN=$(CURDIR)/$(BIN) HUTCH_INTEGRATION=1 $(GO) test -count=1 -timeout 25m -v ./integration/

test-slow: build ## the default image bootstrapped rootless with mmdebstrap's unshare mode (about 5 minutes)
	HUTCH_BIN=$(CURDIR)/$(BIN) HUTCH_INTEGRATION=1 HUTCH_SLOW=1 $(GO) test -count=1 -timeout 30m -run TestRootlessBaseBootstrap -v ./integration/

bench: deps build $(BIN)/runsc-unpatched base-rootfs bench-images containerd-tools code-interpreter-image desktop-image ## measure hutch against raw runsc; writes docs/benchmarks.md
	$(GO) run ./integration/bench/persist -bin $(CURDIR)/$(BIN) -out docs/benchmarks.md
	$(GO) run ./integration/bench/checkpoint -bin $(CURDIR)/$(BIN) -out docs/benchmarks.md
	$(GO) run ./integration/bench -bin $(CURDIR)/$(BIN) -out docs/benchmarks.md
	$(GO) run ./integration/bench/portforward -bin $(CURDIR)/$(BIN) -out docs/benchmarks.md
	$(GO) run ./integration/bench/serve -bin $(CURDIR)/$(BIN) -out docs/benchmarks.md
	$(GO) run ./integration/bench/ssh -bin $(CURDIR)/$(BIN) -out docs/benchmarks.md
	$(GO) run ./integration/bench/neighbours -bin $(CURDIR)/$(BIN) -out docs/benchmarks.md
	$(GO) run ./integration/bench/volume -bin $(CURDIR)/$(BIN) -out docs/benchmarks.md
	$(GO) run ./integration/bench/pool -bin $(CURDIR)/$(BIN) -out docs/benchmarks.md
	$(GO) run ./integration/bench/template -bin $(CURDIR)/$(BIN) -out docs/benchmarks.md
	$(GO) run ./integration/bench/density -bin $(CURDIR)/$(BIN) -out docs/benchmarks.md
	$(GO) run ./integration/bench/pull -bin $(CURDIR)/$(BIN) -out docs/benchmarks.md
	$(GO) run ./integration/bench/desktop -bin $(CURDIR)/$(BIN) -out docs/benchmarks.md
	$(GO) run ./integration/bench/rootless -bin $(CURDIR)/$(BIN) -out docs/benchmarks.md
	$(GO) run ./integration/bench/codeinterp -bin $(CURDIR)/$(BIN) -out docs/benchmarks.md

bench-images: deps build base-rootfs ## measure base image builds (cold, cached) and size; writes docs/benchmarks.md
	$(GO) run ./integration/bench/images -bin $(CURDIR)/$(BIN) -out docs/benchmarks.md

lint: ## go vet and gofmt
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }

.PHONY: fuzz
FUZZTIME ?= 30s
fuzz: ## run every fuzz target for FUZZTIME each (default 30s; `make test` runs their seed corpora)
	@for pkg in $$($(GO) list ./... | grep -v /integration); do \
		for t in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
			echo "fuzz $$pkg $$t"; \
			$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
		done; \
	done

clean: ## remove build outputs
	rm -rf $(BIN)

# --- Kubernetes end to end ----------------------------------------------------
# A single-node Kubernetes built from the Go module proxy (tools/k8s pins the
# release; etcd at the version Kubernetes pins), kept in bin/k8s. The first
# build takes about 14 CPU-minutes. `make k8s-test` runs pods with
# runtimeClassName hutch under a real kubelet and the shim
# (integration/k8s), then removes everything it started on the host.
.PHONY: k8s-tools k8s-test k8s-load k8s-bench
K8S_VERSION := v1.37.2
K8S_BIN     := $(BIN)/k8s
K8S_TOOLS   := $(addprefix $(K8S_BIN)/,kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl etcd)
K8S_LDFLAGS := -s -w $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version,-X $(p).gitVersion=$(K8S_VERSION) -X $(p).gitMajor=1 -X $(p).gitMinor=37 -X $(p).gitTreeState=clean)
# The reference CNI plugins the test node's pod network uses.
CNI_VERSION := v1.9.1
CNI_PLUGINS := $(addprefix $(K8S_BIN)/cni/,ptp host-local loopback)

k8s-tools: $(K8S_TOOLS) $(CNI_PLUGINS) ## build Kubernetes (apiserver, controller-manager, scheduler, kubelet, kubectl), etcd and CNI plugins into bin/k8s once

$(CNI_PLUGINS):
	GOBIN=$(CURDIR)/$(K8S_BIN)/cni CGO_ENABLED=0 $(GO) install github.com/containernetworking/plugins/plugins/$(if $(filter host-local,$(notdir $@)),ipam,main)/$(notdir $@)@$(CNI_VERSION)

$(K8S_TOOLS) &: tools/k8s/go.mod tools/k8s/go.sum tools/k8s/etcd/main.go
	@mkdir -p $(K8S_BIN)
	cd tools/k8s && CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(K8S_LDFLAGS)" -o $(abspath $(K8S_BIN))/ \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
		k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl ./etcd
	@touch $(K8S_TOOLS)

# The node installer image that deploy/kubernetes/daemonset.yaml runs:
# busybox, the shim, runsc, hutch-init, install-node.sh and hutch-node (which
# labels the node), built without a registry. `ctr -n k8s.io images import`
# loads it on a node, or push it to the cluster's registry. The test
# cluster's DaemonSet pod runs under runc, containerd's default runtime:
# containerd-shim-runc-v2 from the pinned containerd, and Debian's runc.
.PHONY: installer-image
INSTALLER_FILES := containerd-shim-hutch-v1 runsc hutch-init hutch-node

installer-image: $(BIN)/images/hutch-installer.tar ## build the hutch node installer image (bin/images/hutch-installer.tar) for deploy/kubernetes/daemonset.yaml

$(BIN)/hutch-node: $(GO_SOURCES)
	CGO_ENABLED=0 $(GO) build -trimpath -o $@ ./cmd/hutch-node

$(BIN)/images/hutch-installer.tar: $(addprefix $(BIN)/,$(INSTALLER_FILES)) $(BIN)/hutch-mkimage /bin/busybox $(wildcard deploy/kubernetes/*.sh deploy/kubernetes/*.toml)
	@mkdir -p $(dir $@)
	$(BIN)/hutch-mkimage -busybox /bin/busybox -name localhost/hutch/installer:latest -o $@.tmp \
		$(foreach f,$(INSTALLER_FILES),-add $(BIN)/$(f):/hutch/bin/$(f)) \
		$(foreach f,install-node.sh installer.sh containerd-shim-hutch-v1.toml,-add deploy/kubernetes/$(f):/hutch/$(f)) \
		-entrypoint "/bin/sh /hutch/installer.sh" -cmd install \
		&& mv $@.tmp $@

$(BIN)/containerd-shim-runc-v2:
	GOBIN=$(CURDIR)/$(BIN) CGO_ENABLED=0 $(GO) install github.com/containerd/containerd/v2/cmd/$(notdir $@)@$(CONTAINERD_VERSION)

k8s-test: build shim containerd-tools k8s-tools installer-image $(BIN)/containerd-shim-runc-v2 e2b-sdk ## run the Kubernetes end-to-end tests (etcd, apiserver, kubelet, containerd with the shim; as root)
	HUTCH_BIN=$(CURDIR)/$(BIN) HUTCH_K8S=1 $(GO) test -count=1 -timeout 30m -v ./integration/k8s/

k8s-load: build shim containerd-tools k8s-tools e2b-sdk ## 20 E2B SDK clients × 50 commands through `hutch serve --backend kubernetes` on the test cluster (as root)
	HUTCH_BIN=$(CURDIR)/$(BIN) HUTCH_K8S=1 HUTCH_K8S_LOAD=1 $(GO) test -count=1 -timeout 30m -run TestServeKubeLoad -v ./integration/k8s/

k8s-bench: build shim containerd-tools k8s-tools ## measure `hutch serve --backend kubernetes` beside local on the test cluster; writes docs/benchmarks.md (as root)
	HUTCH_BIN=$(CURDIR)/$(BIN) HUTCH_K8S=1 HUTCH_K8S_BENCH=1 $(GO) test -count=1 -timeout 30m -run TestBenchServeKube -v ./integration/k8s/ -out docs/benchmarks.md

# --- code interpreter template -------------------------------------------------
# code-interpreter-v1, the default image of E2B's @e2b/code-interpreter
# SDK: base plus Debian's IPython kernel and data tools, TypeScript from
# npm and the server of agent/codeinterp, as a warm template (its labels
# name the server as the start command and its /health as the ready
# check). It is built without network in a state root of its own,
# $(CODEINTERP_ROOT), kept with its BuildKit cache and the downloaded
# packages so that a rebuild after a change to the server takes seconds,
# then exported as an OCI archive that tests and users import:
#   hutch image import code-interpreter-v1 bin/images/code-interpreter-v1.tar
.PHONY: code-interpreter-image
CODEINTERP_IMAGE := $(BIN)/images/code-interpreter-v1.tar
CODEINTERP_ROOT  := $(BIN)/codeinterp/root
CODEINTERP_CTX   := $(BIN)/codeinterp/context
CODEINTERP_DEBS  := $(BIN)/codeinterp/debs
CODEINTERP_FILES := $(wildcard agent/codeinterp/*.py agent/codeinterp/*.mjs)

code-interpreter-image: $(CODEINTERP_IMAGE) ## build the code-interpreter-v1 template once (bin/images/code-interpreter-v1.tar; about 13 minutes the first time, a minute after a change to the server)

$(CODEINTERP_DEBS)/.stamp: buildimg/codeinterp/packages.txt scripts/codeinterp-debs.sh | $(BIN)/images/bookworm-rootfs.tar
	rm -rf $(CODEINTERP_DEBS) && mkdir -p $(CODEINTERP_DEBS)
	scripts/codeinterp-debs.sh $(BIN)/images/bookworm-rootfs.tar $(CODEINTERP_DEBS) $$(grep -v '^#' buildimg/codeinterp/packages.txt)
	@touch $@

$(CODEINTERP_IMAGE): buildimg/codeinterp/Dockerfile buildimg/codeinterp/package.json buildimg/codeinterp/package-lock.json $(CODEINTERP_FILES) $(CODEINTERP_DEBS)/.stamp | $(BIN)/hutch $(BIN)/hutch-init $(BIN)/runsc
	rm -rf $(CODEINTERP_CTX) && mkdir -p $(CODEINTERP_CTX)/server
	cp buildimg/codeinterp/Dockerfile buildimg/codeinterp/package.json buildimg/codeinterp/package-lock.json $(CODEINTERP_CTX)/
	cp $(CODEINTERP_FILES) $(CODEINTERP_CTX)/server/
	cp -al $(CODEINTERP_DEBS) $(CODEINTERP_CTX)/debs && rm -f $(CODEINTERP_CTX)/debs/.stamp
	cd $(CODEINTERP_CTX) && npm ci --no-audit --no-fund --omit=dev
	$(BIN)/hutch --root $(abspath $(CODEINTERP_ROOT)) image build --progress plain -t code-interpreter-v1 $(CODEINTERP_CTX)
	$(BIN)/hutch --root $(abspath $(CODEINTERP_ROOT)) image export code-interpreter-v1 $@.tmp && mv $@.tmp $@
	rm -rf $(CODEINTERP_CTX)

# hutch's docker template: base with Debian's Docker Engine, containerd,
# runc and docker-compose, its daemon running in every sandbox of it
# (docs/docker.md). Built like code-interpreter-v1, in a state root of
# its own, from Debian packages fetched once into bin/docker/debs:
#   hutch image import docker bin/images/docker.tar
.PHONY: docker-image
DOCKER_IMAGE := $(BIN)/images/docker.tar
DOCKER_ROOT  := $(BIN)/docker/root
DOCKER_CTX   := $(BIN)/docker/context
DOCKER_DEBS  := $(BIN)/docker/debs
DOCKER_FILES := buildimg/docker/Dockerfile buildimg/docker/daemon.json buildimg/docker/start-dockerd buildimg/docker/docker-nat

docker-image: $(DOCKER_IMAGE) ## build the docker template once (bin/images/docker.tar; under a minute once its packages are fetched)

$(DOCKER_DEBS)/.stamp: buildimg/docker/packages.txt scripts/codeinterp-debs.sh | $(BIN)/images/bookworm-rootfs.tar
	rm -rf $(DOCKER_DEBS) && mkdir -p $(DOCKER_DEBS)
	scripts/codeinterp-debs.sh $(BIN)/images/bookworm-rootfs.tar $(DOCKER_DEBS) $$(grep -v '^#' buildimg/docker/packages.txt)
	@touch $@

$(DOCKER_IMAGE): $(DOCKER_FILES) $(DOCKER_DEBS)/.stamp | $(BIN)/hutch $(BIN)/hutch-init $(BIN)/runsc
	rm -rf $(DOCKER_CTX) && mkdir -p $(DOCKER_CTX)
	cp $(DOCKER_FILES) $(DOCKER_CTX)/
	cp -al $(DOCKER_DEBS) $(DOCKER_CTX)/debs && rm -f $(DOCKER_CTX)/debs/.stamp
	$(BIN)/hutch --root $(abspath $(DOCKER_ROOT)) image build --progress plain -t docker $(DOCKER_CTX)
	$(BIN)/hutch --root $(abspath $(DOCKER_ROOT)) image export docker $@.tmp && mv $@.tmp $@
	rm -rf $(DOCKER_CTX)

# hutch's desktop template, E2B's name for the image @e2b/desktop
# creates: base with Xvfb, XFCE, Chromium, xdotool, scrot, x11vnc, noVNC
# and ffmpeg, warm with its desktop up (docs/computer-use.md). Built like
# the docker template, in a state root of its own:
#   hutch image import desktop bin/images/desktop.tar
.PHONY: desktop-image
DESKTOP_IMAGE := $(BIN)/images/desktop.tar
DESKTOP_ROOT  := $(BIN)/desktop/root
DESKTOP_CTX   := $(BIN)/desktop/context
DESKTOP_DEBS  := $(BIN)/desktop/debs
DESKTOP_FILES := $(addprefix buildimg/desktop/,Dockerfile Xvfb startxfce4 hutch-browser start-desktop desktop-ready chromium-flags google-chrome.desktop)

desktop-image: $(DESKTOP_IMAGE) ## build the desktop template once (bin/images/desktop.tar)

$(DESKTOP_DEBS)/.stamp: buildimg/desktop/packages.txt scripts/codeinterp-debs.sh | $(BIN)/images/bookworm-rootfs.tar
	rm -rf $(DESKTOP_DEBS) && mkdir -p $(DESKTOP_DEBS)
	scripts/codeinterp-debs.sh $(BIN)/images/bookworm-rootfs.tar $(DESKTOP_DEBS) $$(grep -v '^#' buildimg/desktop/packages.txt)
	@touch $@

$(DESKTOP_IMAGE): $(DESKTOP_FILES) $(DESKTOP_DEBS)/.stamp | $(BIN)/hutch $(BIN)/hutch-init $(BIN)/runsc
	rm -rf $(DESKTOP_CTX) && mkdir -p $(DESKTOP_CTX)
	cp $(DESKTOP_FILES) $(DESKTOP_CTX)/
	cp -al $(DESKTOP_DEBS) $(DESKTOP_CTX)/debs && rm -f $(DESKTOP_CTX)/debs/.stamp
	$(BIN)/hutch --root $(abspath $(DESKTOP_ROOT)) image build --progress plain -t desktop $(DESKTOP_CTX)
	$(BIN)/hutch --root $(abspath $(DESKTOP_ROOT)) image export desktop $@.tmp && mv $@.tmp $@
	rm -rf $(DESKTOP_CTX)

# --- E2B code-interpreter SDK for the code interpreter's tests -------------------
# @e2b/code-interpreter, pinned in integration/code-interpreter/package-lock.json.
.PHONY: code-interpreter-sdk
CODEINTERP_SDK_STAMP := integration/code-interpreter/node_modules/.package-lock.json

code-interpreter-sdk: $(CODEINTERP_SDK_STAMP) ## install the pinned @e2b/code-interpreter SDK the code interpreter's tests drive

$(CODEINTERP_SDK_STAMP): integration/code-interpreter/package.json integration/code-interpreter/package-lock.json
	cd integration/code-interpreter && npm ci --no-audit --no-fund
	@touch $@

# --- desktop SDK, Playwright and Puppeteer for the computer-use tests ----------
# @e2b/desktop, playwright-core and puppeteer-core (no browser download:
# they drive the sandboxes' Chromium), pinned in
# integration/desktop/package-lock.json.
.PHONY: desktop-sdk
DESKTOP_SDK_STAMP := integration/desktop/node_modules/.package-lock.json

desktop-sdk: $(DESKTOP_SDK_STAMP) ## install the pinned @e2b/desktop, playwright-core and puppeteer-core the computer-use tests drive

$(DESKTOP_SDK_STAMP): integration/desktop/package.json integration/desktop/package-lock.json
	cd integration/desktop && PUPPETEER_SKIP_DOWNLOAD=1 npm ci --no-audit --no-fund
	@touch $@

# --- E2B SDK for the serve tests ---------------------------------------------
# The integration tests of `hutch serve` drive it with the real E2B JavaScript
# SDK, pinned in integration/e2b/package-lock.json; npm ci installs exactly
# that, again only when the lock file changes.
.PHONY: e2b-sdk
E2B_SDK_STAMP := integration/e2b/node_modules/.package-lock.json

e2b-sdk: $(E2B_SDK_STAMP) ## install the pinned E2B SDK the serve tests drive (npm ci in integration/e2b)

$(E2B_SDK_STAMP): integration/e2b/package.json integration/e2b/package-lock.json
	cd integration/e2b && npm ci --no-audit --no-fund
	@touch $@

# The newest 2.x of the SDK the registry serves, beside the pinned one:
# installed in integration/e2b-latest (not kept in git) with copies of the
# scripts, which then run the E2B-behaviour test against it.
.PHONY: e2b-latest
e2b-latest: build base-rootfs ## run TestServeE2BExact with the newest e2b 2.x from npm (as root)
	rm -rf integration/e2b-latest && mkdir -p integration/e2b-latest
	cp integration/e2b/package.json integration/e2b/*.mjs integration/e2b-latest/
	cd integration/e2b-latest && npm install --no-audit --no-fund --save-exact 'e2b@2'
	HUTCH_BIN=$(CURDIR)/$(BIN) HUTCH_INTEGRATION=1 HUTCH_E2B_DIR=e2b-latest \
		go test -count=1 -run 'TestServeE2BExact' -v ./integration/

# --- MCP Inspector for the hutch mcp tests --------------------------------------
# The integration tests of `hutch mcp` also drive it with the MCP Inspector's
# CLI, pinned in integration/mcp/package-lock.json.
.PHONY: mcp-inspector
MCP_INSPECTOR_STAMP := integration/mcp/node_modules/.package-lock.json

E2B_CLI_STAMP := integration/e2b-cli/node_modules/.package-lock.json

e2b-cli: $(E2B_CLI_STAMP) ## install the pinned E2B CLI the serve tests drive (npm ci in integration/e2b-cli)

$(E2B_CLI_STAMP): integration/e2b-cli/package.json integration/e2b-cli/package-lock.json
	cd integration/e2b-cli && npm ci --no-audit --no-fund
	@touch $@

mcp-inspector: $(MCP_INSPECTOR_STAMP) ## install the pinned MCP Inspector the hutch mcp tests drive (npm ci in integration/mcp)

$(MCP_INSPECTOR_STAMP): integration/mcp/package.json integration/mcp/package-lock.json
	cd integration/mcp && npm ci --no-audit --no-fund
	@touch $@

# --- envd protocol -----------------------------------------------------------
# Go code for the envd Process and Filesystem services that `hutch serve`
# answers (E2B's data plane). The generated files are committed; this target
# regenerates them with Debian's protoc and the plugins at the versions the
# module pins.
.PHONY: proto
PROTO_PLUGINS := $(CURDIR)/$(BIN)/proto-plugins

proto: ## regenerate serve/envdpb from its .proto files (needs protoc: apt-get install protobuf-compiler)
	GOBIN=$(PROTO_PLUGINS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$$($(GO) list -m -f '{{.Version}}' google.golang.org/protobuf)
	GOBIN=$(PROTO_PLUGINS) $(GO) install connectrpc.com/connect/cmd/protoc-gen-connect-go@$$($(GO) list -m -f '{{.Version}}' connectrpc.com/connect)
	cd serve/envdpb && PATH=$(PROTO_PLUGINS):$$PATH protoc -I. -I/usr/include \
		--go_out=. --go_opt=paths=source_relative \
		--connect-go_out=. --connect-go_opt=paths=source_relative \
		processpb/process.proto filesystempb/filesystem.proto

# --- architecture picture ------------------------------------------------------
.PHONY: architecture
architecture: ## render docs/architecture.svg from docs/architecture.dot (needs graphviz: apt-get install graphviz)
	dot -Tsvg docs/architecture.dot -o docs/architecture.svg

# --- install, uninstall, Debian package ----------------------------------------
# `make install` puts hutch where a system service expects it: the programs
# in $(LIBDIR) (hutch finds runsc, hutch-init and its helpers beside
# itself), hutch and the containerd shim on $(BINDIR) as links to them,
# the systemd units, /etc/hutch/serve.toml (kept if it exists), the man page
# and the completions. `make uninstall` removes exactly those files, the
# config only if it is still the one installed, then the directories it
# leaves empty. `make deb` builds bin/hutch_VERSION_ARCH.deb with dpkg-deb
# from the same install (docs/decisions/0054-debian-package.md).
.PHONY: install uninstall deb deb-test dist
# The units name the installed paths (@BINDIR@, @LIBDIR@).
PREFIX         ?= /usr/local
DESTDIR        ?=
BINDIR         ?= $(PREFIX)/bin
LIBDIR         ?= $(PREFIX)/lib/hutch
SYSCONFDIR     ?= /etc
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
MANDIR         ?= $(PREFIX)/share/man
DATADIR        ?= $(PREFIX)/share
DOCDIR         ?= $(DATADIR)/doc/hutch
INSTALL_PROGRAMS := hutch hutch-helper hutch-init runsc buildkitd hutch-buildkitd hutch-buildkit-runtime containerd-shim-hutch-v1 hutch-node
DIST           := $(BIN)/dist
DIST_FILES     := $(DIST)/hutch.1.gz $(DIST)/hutch.bash $(DIST)/_hutch $(DIST)/hutch.fish
INSTALLED_UNITS := hutch-serve.service hutch-node.service

dist: $(DIST_FILES) ## make the man page and shell completions from bin/hutch's own definitions (bin/dist)

$(DIST)/hutch.1.gz: $(BIN)/hutch
	@mkdir -p $(DIST)
	$(BIN)/hutch man --date $(firstword $(subst T, ,$(BUILD_DATE))) | gzip -9n > $@.tmp && mv $@.tmp $@
$(DIST)/hutch.bash: $(BIN)/hutch
	@mkdir -p $(DIST)
	$(BIN)/hutch completion bash > $@.tmp && mv $@.tmp $@
$(DIST)/_hutch: $(BIN)/hutch
	@mkdir -p $(DIST)
	$(BIN)/hutch completion zsh > $@.tmp && mv $@.tmp $@
$(DIST)/hutch.fish: $(BIN)/hutch
	@mkdir -p $(DIST)
	$(BIN)/hutch completion fish > $@.tmp && mv $@.tmp $@

# The directories install makes; those that did not exist before are
# listed, deepest first, in $(LIBDIR)/installed-dirs for uninstall to
# remove (the package leaves that to dpkg: MANIFEST=).
ZSHCOMPDIR     ?= $(if $(filter /usr,$(PREFIX)),$(DATADIR)/zsh/vendor-completions,$(DATADIR)/zsh/site-functions)
INSTALL_DIRS   := $(LIBDIR)/images $(BINDIR) $(SYSTEMDUNITDIR) $(SYSCONFDIR)/hutch $(MANDIR)/man1 \
	$(DATADIR)/bash-completion/completions $(ZSHCOMPDIR) $(DATADIR)/fish/vendor_completions.d $(DOCDIR)
MANIFEST       ?= $(LIBDIR)/installed-dirs
INSTALLED_FILES := $(addprefix $(LIBDIR)/,$(INSTALL_PROGRAMS)) $(LIBDIR)/images/busybox.tar \
	$(BINDIR)/hutch $(BINDIR)/containerd-shim-hutch-v1 $(addprefix $(SYSTEMDUNITDIR)/,$(INSTALLED_UNITS)) \
	$(MANDIR)/man1/hutch.1.gz $(DATADIR)/bash-completion/completions/hutch $(ZSHCOMPDIR)/_hutch \
	$(DATADIR)/fish/vendor_completions.d/hutch.fish $(DOCDIR)/operations.md

install: $(addprefix $(BIN)/,$(INSTALL_PROGRAMS)) $(BIN)/images/busybox.tar $(DIST_FILES) ## install hutch (PREFIX=/usr/local, DESTDIR): programs, units, /etc/hutch/serve.toml, man page, completions
	@new=""; for d in $(addprefix $(DESTDIR),$(INSTALL_DIRS)); do \
		while [ ! -e "$$d" ]; do case " $$new " in *" $$d "*) ;; *) new="$$new $$d";; esac; d=$$(dirname "$$d"); done; \
	done; \
	install -d $(addprefix $(DESTDIR),$(INSTALL_DIRS)); \
	if [ -n "$(MANIFEST)" ]; then \
		{ cat $(DESTDIR)$(MANIFEST) 2>/dev/null; for d in $$new; do echo "$${d#$(DESTDIR)}"; done; } | sort -ru > $(DESTDIR)$(MANIFEST).tmp && \
		mv $(DESTDIR)$(MANIFEST).tmp $(DESTDIR)$(MANIFEST); \
	fi
	for p in $(INSTALL_PROGRAMS); do install -m 755 $(BIN)/$$p $(DESTDIR)$(LIBDIR)/$$p || exit 1; done
	install -m 644 $(BIN)/images/busybox.tar $(DESTDIR)$(LIBDIR)/images/busybox.tar
	ln -sfn $$(realpath -m --relative-to=$(BINDIR) $(LIBDIR))/hutch $(DESTDIR)$(BINDIR)/hutch
	ln -sfn $$(realpath -m --relative-to=$(BINDIR) $(LIBDIR))/containerd-shim-hutch-v1 $(DESTDIR)$(BINDIR)/containerd-shim-hutch-v1
	for u in $(INSTALLED_UNITS); do \
		sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' deploy/host/systemd/$$u > $(DESTDIR)$(SYSTEMDUNITDIR)/$$u && \
		chmod 644 $(DESTDIR)$(SYSTEMDUNITDIR)/$$u || exit 1; \
	done
	test -e $(DESTDIR)$(SYSCONFDIR)/hutch/serve.toml || install -m 644 deploy/host/serve.toml $(DESTDIR)$(SYSCONFDIR)/hutch/serve.toml
	install -m 644 $(DIST)/hutch.1.gz $(DESTDIR)$(MANDIR)/man1/hutch.1.gz
	install -m 644 $(DIST)/hutch.bash $(DESTDIR)$(DATADIR)/bash-completion/completions/hutch
	install -m 644 $(DIST)/_hutch $(DESTDIR)$(ZSHCOMPDIR)/_hutch
	install -m 644 $(DIST)/hutch.fish $(DESTDIR)$(DATADIR)/fish/vendor_completions.d/hutch.fish
	install -m 644 docs/operations.md $(DESTDIR)$(DOCDIR)/operations.md

uninstall: ## remove what make install installed (same PREFIX, DESTDIR) and the directories it made; a changed serve.toml stays
	rm -f $(addprefix $(DESTDIR),$(INSTALLED_FILES))
	cmp -s deploy/host/serve.toml $(DESTDIR)$(SYSCONFDIR)/hutch/serve.toml && rm -f $(DESTDIR)$(SYSCONFDIR)/hutch/serve.toml || true
	@if [ -f $(DESTDIR)$(MANIFEST) ]; then \
		dirs=$$(cat $(DESTDIR)$(MANIFEST)); rm -f $(DESTDIR)$(MANIFEST); \
		for d in $$dirs; do rmdir "$(DESTDIR)$$d" 2>/dev/null || true; done; \
	fi

# The package: the install of PREFIX=/usr with the units where Debian 12
# keeps them, and the maintainer scripts of deploy/debian. Its version is
# HUTCH_VERSION (build another with HUTCH_VERSION=...).
DEB_ARCH    := $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
DEB         := $(BIN)/hutch_$(HUTCH_VERSION)_$(DEB_ARCH).deb
DEB_ROOT    := $(BIN)/deb/root

deb: $(DEB) ## build the Debian package bin/hutch_VERSION_ARCH.deb (dpkg-deb)

$(DEB): $(addprefix $(BIN)/,$(INSTALL_PROGRAMS)) $(BIN)/images/busybox.tar $(DIST_FILES) deploy/host/serve.toml $(wildcard deploy/host/systemd/* deploy/debian/*) docs/operations.md
	rm -rf $(BIN)/deb && mkdir -p $(DEB_ROOT)/DEBIAN
	$(MAKE) --no-print-directory install DESTDIR=$(CURDIR)/$(DEB_ROOT) PREFIX=/usr SYSTEMDUNITDIR=/lib/systemd/system MANIFEST=
	install -m 644 deploy/debian/copyright $(DEB_ROOT)/usr/share/doc/hutch/copyright
	install -D -m 644 deploy/debian/lintian-overrides $(DEB_ROOT)/usr/share/lintian/overrides/hutch
	for p in $(INSTALL_PROGRAMS); do strip --strip-unneeded --remove-section=.comment $(DEB_ROOT)/usr/lib/hutch/$$p || exit 1; done
	printf 'hutch (%s) unstable; urgency=medium\n\n  * Built from commit %s.\n\n -- The hutch authors <maintainers@hutch.dev>  %s\n' \
		'$(HUTCH_VERSION)' '$(HUTCH_COMMIT)' "$$(date -u -R -d '$(BUILD_DATE)')" | gzip -9n > $(DEB_ROOT)/usr/share/doc/hutch/changelog.gz
	install -m 755 deploy/debian/postinst deploy/debian/prerm deploy/debian/postrm $(DEB_ROOT)/DEBIAN/
	install -m 644 deploy/debian/conffiles $(DEB_ROOT)/DEBIAN/
	sed -e 's|@VERSION@|$(HUTCH_VERSION)|' -e 's|@ARCH@|$(DEB_ARCH)|' \
		-e "s|@SIZE@|$$(du -sk --exclude=DEBIAN $(DEB_ROOT) | cut -f1)|" deploy/debian/control.in > $(DEB_ROOT)/DEBIAN/control
	cd $(DEB_ROOT) && find . -type f ! -path './DEBIAN/*' ! -path './etc/*' -printf '%P\0' | sort -z | xargs -0 md5sum > DEBIAN/md5sums
	SOURCE_DATE_EPOCH=$$(date -u -d '$(BUILD_DATE)' +%s) dpkg-deb --root-owner-group -Zgzip --build $(DEB_ROOT) $@.tmp && mv $@.tmp $@
	@echo "built $@"

# The package's tests (integration/install, about N minutes): make install
# and uninstall into a DESTDIR, systemd-analyze verify of the units,
# lintian, and apt-get install, hutch doctor, a sandbox and purge in a
# clean Debian 12 root made from bin/images/bookworm-rootfs.tar (as root;
# apt reaches Debian's mirror for the dependencies).
deb-test: deb base-rootfs ## test make install/uninstall, the units, lintian, and the package installed, used and purged in a clean Debian 12 root (as root)
	HUTCH_BIN=$(CURDIR)/$(BIN) HUTCH_INSTALL=1 HUTCH_DEB=$(CURDIR)/$(DEB) $(GO) test -count=1 -timeout 30m -v ./integration/install/
