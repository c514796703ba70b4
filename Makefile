# coder-k8s — build, test and local stack.
#
#   make dev     the local stack (kube-apiserver, etcd, a node, PostgreSQL, coderd) plus the operator, installed with helm
#   make test    every test suite, against the real components built by `make tools`
#   make set-version V=x.y.z   the release version (the chart's) everywhere at once

SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

GO      ?= go
BIN     := $(CURDIR)/bin
# The release version has one source: the chart's `version` in
# charts/coder-k8s/Chart.yaml. Its appVersion (the image tag the chart
# deploys by default), the tag `make image` gives the image, the binary's
# version and the install commands in the READMEs follow it;
# `make set-version V=x.y.z` changes them all at once and `make
# check-version` (part of `make lint`) fails when one disagrees. A release
# is the tag v$(VERSION) (.github/workflows/release.yaml checks it).
CHART_DIR := charts/coder-k8s
VERSION   := $(shell awk '$$1 == "version:" {gsub(/["\047]/, "", $$2); print $$2; exit}' $(CHART_DIR)/Chart.yaml)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X github.com/coder/coder-k8s/internal/version.version=$(VERSION) \
           -X github.com/coder/coder-k8s/internal/version.commit=$(COMMIT)

# Tests find the pinned binaries here (envtest reads KUBEBUILDER_ASSETS).
export KUBEBUILDER_ASSETS := $(BIN)
export CODER_K8S_BIN_DIR := $(BIN)

# The project's own module is compiled with the shipped binary's settings (no
# cgo, -trimpath) by every command: they are part of each compiled package's
# key in the Go build cache, so go test, go vet and go run reuse what `make
# build` and `make image` compiled instead of compiling every dependency a
# second time. (The tools and the GitOps modules are other modules.) Test
# binaries are linked without DWARF (-w), as the shipped binary is: that
# halves each of some thirty links. GOFLAGS keeps what `go env` has (the
# environment's or `go env -w`'s); `make build`'s own -ldflags replace -w.
GOENVFLAGS := $(shell $(GO) env GOFLAGS)
GOPROJ := CGO_ENABLED=0 GOFLAGS='-trimpath -ldflags=-w $(GOENVFLAGS)' $(GO)

# go test flags; CI and people can add -run, -v, -count.
TEST_FLAGS ?=
# Per test binary; test/e2e takes about 15 minutes on two quiet cores.
TEST_TIMEOUT ?= 40m

##@ Build

.PHONY: build
build: ## Build bin/coder-k8s.
	$(GOPROJ) build -ldflags "$(LDFLAGS)" -o $(BIN)/coder-k8s ./cmd/coder-k8s

.PHONY: build-dev
build-dev: ## Build bin/dev, the local stack program (make dev, the GitOps suites).
	$(GOPROJ) build -o $(BIN)/dev ./hack/dev

# The container image, built without a container engine by hack/image: one
# image per IMAGE_PLATFORMS entry (os/arch), in an OCI image layout in
# bin/image. The base is assembled offline unless IMAGE_BASE names a
# registry image (the release's: gcr.io/distroless/static-debian12:nonroot).
IMAGE_PLATFORMS ?= linux/$(shell $(GO) env GOARCH)
IMAGE_BASE      ?=
IMAGE_REPO      ?= ghcr.io/coder/coder-k8s
IMAGE_TAG       ?= $(VERSION)
IMAGE_CREATED   ?= $(shell git log -1 --format=%cI 2>/dev/null || echo 1970-01-01T00:00:00Z)

.PHONY: image
image: ## Build the container image without Docker: an OCI image layout in bin/image (IMAGE_PLATFORMS, IMAGE_BASE, IMAGE_REPO, IMAGE_TAG).
	@bins=(); for p in $(IMAGE_PLATFORMS); do \
	  os=$${p%%/*}; arch=$${p#*/}; out=$(BIN)/image-build/$$os-$$arch/coder-k8s; \
	  GOOS=$$os GOARCH=$$arch $(GOPROJ) build -ldflags "$(LDFLAGS)" -o $$out ./cmd/coder-k8s; \
	  bins+=(--binary "$$p=$$out"); \
	done; \
	$(GOPROJ) run ./hack/image --out $(BIN)/image --ref "$(IMAGE_REPO):$(IMAGE_TAG)" --version "$(VERSION)" --revision "$(COMMIT)" \
	  --created "$(IMAGE_CREATED)" $(if $(IMAGE_BASE),--base "$(IMAGE_BASE)") "$${bins[@]}"

##@ Run

.PHONY: dev
# DEV_RUN=helm (default): coder-k8s installed with helm from the local OCI
# registry onto the stack's real node; DEV_RUN=binary: the binary out of the
# cluster, for fast iteration (no image to build).
DEV_RUN ?= helm
dev: test-tools build build-dev $(if $(filter helm,$(DEV_RUN)),image) ## Run the local stack (kube-apiserver, etcd, a node, PostgreSQL, coderd) plus coder-k8s installed with helm (DEV_RUN=binary: out of the cluster); Ctrl-C stops it.
	$(BIN)/dev --state-dir .dev --operator $(BIN)/coder-k8s --run $(DEV_RUN)

##@ Test

# go test starts the packages' runs in the order it is given them, two at
# a time: test/e2e, by far the longest (about 15 of its minutes, its suites
# two at a time), comes first so the other packages run beside it instead
# of before it.
.PHONY: test
test: test-tools build image chart-lint test-gitops-modules ## Build the binary and the image, then run every test suite against the real components (the chart's Go tests in test/chart, the GitOps engine suites and the fuzz targets' seeds included).
	$(GOPROJ) test -timeout $(TEST_TIMEOUT) $(TEST_FLAGS) ./test/e2e/ ./...

# The GitOps engine suites run hack/dev for the stack (test/gitops/stack).
# Argo CD's gitops-engine builds with older Kubernetes libraries than the
# project's, so its suite is a Go module of its own; Flux's ssa builds with
# the project's, so its suite (test/gitops/flux) is in the main module and
# `go test ./...` runs it.
GITOPS_MODULES := test/gitops/argocd

.PHONY: test-gitops test-gitops-modules
test-gitops: test-gitops-modules ## Argo CD's gitops-engine and Flux's ssa managing templates and workspaces on the real stack.
	$(GOPROJ) test -count=1 -timeout $(TEST_TIMEOUT) $(TEST_FLAGS) ./test/gitops/flux/

test-gitops-modules: test-tools build build-dev
	@for m in $(GITOPS_MODULES); do echo "go test ./$$m"; \
	  (cd $$m && $(TOOLGO) test -count=1 -timeout $(TEST_TIMEOUT) $(TEST_FLAGS) ./...) || exit 1; done

.PHONY: test-unit
test-unit: ## Run only the tests that need no external binary.
	$(GOPROJ) test -short $(TEST_FLAGS) ./...

##@ Benchmark (figures printed as ratios against a reference measured in the same run)

# Every package with a benchmark (test/e2e's share one 300-workspace stack in
# BenchmarkWorkspaces); evaluated only when a bench target runs. `make bench`
# leaves out BenchmarkScale (10,000 workspaces): `make bench-scale`.
BENCH_PKGS = $(shell grep -rlE --include='*_test.go' '^func Benchmark' . | grep -vE '^\./(hack/tools|bin|\.dev)/' | xargs -r -n1 dirname | sort -u)
BENCH_TIMEOUT ?= 90m

.PHONY: bench
bench: tools build ## Every benchmark in one go test run (output in bin/bench/bench.txt), then the summary table (bin/bench/table.md).
	@mkdir -p $(BIN)/bench
	@status=0; \
	  $(GOPROJ) test $(BENCH_PKGS) -run '^$$' -bench . -skip '^BenchmarkScale$$' -benchtime 1x -timeout $(BENCH_TIMEOUT) 2>&1 | tee $(BIN)/bench/bench.txt || status=$$?; \
	  echo; $(GOPROJ) run ./hack/benchtable $(BIN)/bench/bench.txt | tee $(BIN)/bench/table.md || { [ $$status -ne 0 ] || status=1; }; \
	  exit $$status

.PHONY: bench-controller
bench-controller: tools build ## 100 CoderControlPlanes: time to converge vs writing the objects directly; steady-state writes.
	$(GOPROJ) test ./test/e2e/ -run '^$$' -bench '^BenchmarkController$$' -benchtime 1x -timeout 20m

.PHONY: bench-aggregated
bench-aggregated: tools build ## 300 real workspaces: aggregated LIST vs coderd, kubectl get cws -A vs coder list --all (tables, then -o json), watch latency at the default poll interval (30 changes at seeded random offsets, BENCH_SEED; about 7 minutes) and coderd load, RSS.
	$(GOPROJ) test ./test/e2e/ -run '^$$' -bench '^BenchmarkWorkspaces$$/^Aggregated$$' -benchtime 1x -timeout 40m

.PHONY: bench-versions
bench-versions: tools build ## 300 template versions (3 echo templates): LIST of codertemplateversions through kube-apiserver vs coderd's versions lists of the same templates (target ≤ 1.2), with a breakdown.
	$(GOPROJ) test ./test/e2e/ -run '^$$' -bench '^BenchmarkTemplateVersions$$' -benchtime 1x -timeout 20m

.PHONY: bench-users
bench-users: tools build ## 1,000 Coder users (login type none): LIST of coderusers through kube-apiserver vs coderd's GET /api/v2/users of the same users (target ≤ 1.2), with a breakdown.
	$(GOPROJ) test ./test/e2e/ -run '^$$' -bench '^BenchmarkUsers$$' -benchtime 1x -timeout 20m

.PHONY: bench-logs
bench-logs: tools build ## A finished build's log of 3,000 lines through the log subresource (via kube-apiserver) vs coderd's GET /api/v2/workspacebuilds/{id}/logs of the same build (target ≤ 1.2).
	$(GOPROJ) test ./test/e2e/ -run '^$$' -bench '^BenchmarkBuildLog$$' -benchtime 1x -timeout 20m

.PHONY: bench-ready
bench-ready: tools build ## A workspace of the real Kubernetes template on the test node: kubectl create to kubectl wait --for=condition=Ready vs coder create to every agent connected and ready (same user, template, parameters; BENCH_READY_PAIRS alternating pairs, default 5; target ≤ 1.1).
	$(GOPROJ) test ./test/e2e/ -run '^$$' -bench '^BenchmarkWorkspaceReady$$' -benchtime 1x -timeout 30m

.PHONY: bench-mcp
bench-mcp: tools build ## list_workspaces over MCP vs a LIST ?resourceVersion=0 through the aggregated API with a watch open (both from the watch cache), and cold (cache stale) vs a plain LIST (300 workspaces); tool calls/s with 10 clients.
	$(GOPROJ) test ./test/e2e/ -run '^$$' -bench '^BenchmarkWorkspaces$$/^MCP$$' -benchtime 1x -timeout 40m

.PHONY: bench-metadata
bench-metadata: tools build ## kubectl apply --server-side of a template vs a ConfigMap of the same data (files changed; settings and variables changed); a label change to an open watch (p50/p99); list ratio with stored metadata vs without (300 workspaces).
	$(GOPROJ) test ./test/e2e/ -run '^$$' -bench '^BenchmarkWorkspaces$$/^Metadata$$' -benchtime 1x -timeout 40m

.PHONY: bench-admission
bench-admission: tools build ## 300 workspaces, the operator restarted with admission on (one ValidatingAdmissionPolicy bound) and off in alternating pairs: aggregated LIST, kubectl apply --server-side of a template and RSS, on ÷ off (targets ≤ 1.05, ≤ 1.05, ≤ 1.10 beyond the run's noise).
	$(GOPROJ) test ./test/e2e/ -run '^$$' -bench '^BenchmarkWorkspaces$$/^Admission$$' -benchtime 1x -timeout 40m

.PHONY: bench-identity
bench-identity: tools build ## Mapped mode, 300 workspaces: a member's LIST of their 10 vs coderd's list with the member's token; coderd list requests per poll with 1 vs 50 different users watching.
	$(GOPROJ) test ./test/e2e/ -run '^$$' -bench '^BenchmarkWorkspaces$$/^Identity$$' -benchtime 1x -timeout 40m

.PHONY: bench-shared
bench-shared: tools build ## Two control planes, each with its own coderd (150 workspaces each): all-namespaces LIST with one coderd hung vs both up (target ≤ 1.2); authorization checks for a member's new watch of 300 templates (target ≤ 31).
	$(GOPROJ) test ./test/e2e/ -run '^$$' -bench '^BenchmarkSharedCluster$$' -benchtime 1x -timeout 40m

.PHONY: bench-scale
bench-scale: tools build ## 10,000 workspaces (BENCH_SCALE_WORKSPACES; output in bin/bench/scale.txt, table in bin/bench/scale-table.md) seeded with coderd's echo provisioner: seeding time, list ratio, RSS, coderd requests and CPU per poll with 1 and 50 watchers, watch latency after the poll.
	@mkdir -p $(BIN)/bench
	@status=0; \
	  $(GOPROJ) test ./test/e2e/ -run '^$$' -bench '^BenchmarkScale$$' -benchtime 1x -timeout 120m 2>&1 | tee $(BIN)/bench/scale.txt || status=$$?; \
	  echo; $(GOPROJ) run ./hack/benchtable $(BIN)/bench/scale.txt | tee $(BIN)/bench/scale-table.md || { [ $$status -ne 0 ] || status=1; }; \
	  exit $$status

.PHONY: bench-startup
bench-startup: tools build ## all mode against kube-apiserver, no control plane: process start to every /readyz OK vs kubectl get --raw /readyz; idle RSS.
	$(GOPROJ) test ./test/e2e/ -run '^$$' -bench '^BenchmarkStartup$$' -benchtime 1x -timeout 10m

.PHONY: bench-memory
bench-memory: tools build ## all mode against kube-apiserver, empty and with 5,000 unrelated Secrets, Deployments and ConfigMaps: idle RSS of each and their ratio (target ≤ 1.10).
	$(GOPROJ) test ./test/e2e/ -run '^$$' -bench '^BenchmarkMemory$$' -benchtime 1x -timeout 15m

# Each fuzz target in turn (go test -fuzz takes one); their seeds run with
# every `go test`, the coverage-instrumented runs only here (CI's own fuzz
# job): instrumenting each package again cost a cold `make test` about
# 18 minutes on two cores. A count, not a duration: Go 1.26's fuzz
# coordinator can fail a duration run with a spurious "context deadline
# exceeded" when a worker is busy at the deadline (golang/go#75804).
FUZZTIME ?= 3000x
FUZZ_TARGETS := ./internal/aggregated/storage:FuzzParseWorkspaceName ./internal/aggregated/storage:FuzzParseTemplateName \
                ./internal/aggregated/storage:FuzzSelector ./internal/jsonskim:FuzzScanner \
                ./internal/config:FuzzLoad ./internal/aggregated/templatesource:FuzzExtract

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME (default 10s) each.
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; name=$${t##*:}; \
	  echo "go test $$pkg -fuzz ^$$name\$$ -fuzztime $(FUZZTIME)"; \
	  $(GOPROJ) test $$pkg -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) || exit 1; done

.PHONY: lint
lint: $(BIN)/staticcheck $(BIN)/actionlint check-version ## gofmt check, go vet, staticcheck, actionlint on .github/workflows and check-version.
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^hack/tools/')); \
	  if [ -n "$$out" ]; then echo "gofmt needs to run on:"; echo "$$out"; exit 1; fi
	$(GOPROJ) vet ./...
	$(BIN)/staticcheck ./...
	$(BIN)/actionlint .github/workflows/*.yaml
	@for m in $(GITOPS_MODULES) test/gitops/stack; do echo "go vet ./$$m/..."; (cd $$m && $(GO) vet ./...) || exit 1; done

.PHONY: chart-lint
chart-lint: $(BIN)/helm $(BIN)/ct yamllint ## Lint the Helm chart: helm lint with every ci values file, then ct lint (offline).
	@for f in charts/coder-k8s/ci/*-values.yaml; do \
	  echo "helm lint --strict charts/coder-k8s -f $$f"; \
	  $(BIN)/helm lint --strict charts/coder-k8s -f $$f >/dev/null || { $(BIN)/helm lint --strict charts/coder-k8s -f $$f; exit 1; }; done
	PATH="$(BIN):$$PATH" $(BIN)/ct lint --config ct.yaml --all

.PHONY: chart-test
chart-test: chart-lint $(BIN)/kube-apiserver $(BIN)/etcd $(BIN)/kubectl $(BIN)/helm ## Test the Helm chart: chart-lint, then its Go tests (render every ci values file; install, upgrade and GitOps-apply on kube-apiserver).
	$(GOPROJ) test -timeout $(TEST_TIMEOUT) $(TEST_FLAGS) ./test/chart/...

##@ Generate

.PHONY: generate
generate: $(BIN)/controller-gen $(BIN)/openapi-gen ## Regenerate deepcopy, OpenAPI, CRDs, RBAC, the defaults golden file and the config reference.
	$(BIN)/controller-gen object paths=./api/...
	$(BIN)/openapi-gen --output-dir api/aggregation/v1alpha1 --output-pkg github.com/coder/coder-k8s/api/aggregation/v1alpha1 \
	  --output-file zz_generated.openapi.go --output-model-name-file zz_generated.model_name.go \
	  --go-header-file hack/boilerplate.go.txt --report-filename $(BIN)/openapi-rule-violations.txt \
	  $(foreach p,$(OPENAPI_META),--readonly-pkg $(p)) $(OPENAPI_META) ./api/aggregation/v1alpha1
	@if grep coder-k8s $(BIN)/openapi-rule-violations.txt; then echo "fix the API rule violations above"; exit 1; fi
	$(BIN)/controller-gen crd paths=./api/v1alpha1/... output:crd:artifacts:config=config/crd/bases
	@# One ClusterRole per component, from that component's RBAC markers:
	@# the chart gives each mode exactly the components it runs.
	rm -rf config/rbac && mkdir -p config/rbac
	$(BIN)/controller-gen rbac:roleName=coder-k8s-controller paths=./internal/controller/... output:rbac:artifacts:config=config/rbac/controller
	$(BIN)/controller-gen rbac:roleName=coder-k8s-aggregated paths=./internal/aggregated/backend/... paths=./internal/aggregated/records/... paths=./internal/aggregated/storage/... output:rbac:artifacts:config=config/rbac/aggregated
	$(BIN)/controller-gen rbac:roleName=coder-k8s-admission paths=./internal/aggregated/admission/... output:rbac:artifacts:config=config/rbac/admission
	$(BIN)/controller-gen rbac:roleName=coder-k8s-autotls paths=./internal/aggregated/autotls/... output:rbac:artifacts:config=config/rbac/autotls
	$(BIN)/controller-gen rbac:roleName=coder-k8s-mcp paths=./internal/mcpserver/... output:rbac:artifacts:config=config/rbac/mcp
	$(GOPROJ) test ./internal/config/ -run TestDefaultsGolden -update >/dev/null
	$(GOPROJ) run ./hack/configdoc --types internal/config/types.go --out docs/config-reference.md
	@# The Helm chart renders its CRDs and the components' ClusterRoles from byte-identical copies.
	mkdir -p charts/coder-k8s/files/crds charts/coder-k8s/files/rbac
	rm -f charts/coder-k8s/files/crds/*.yaml
	cp config/crd/bases/*.yaml charts/coder-k8s/files/crds/
	rm -f charts/coder-k8s/files/rbac/*.yaml
	for c in controller aggregated admission autotls mcp; do cp config/rbac/$$c/role.yaml charts/coder-k8s/files/rbac/$$c-role.yaml; done

# The apimachinery packages whose OpenAPI definitions the aggregated API
# server serves next to its own.
OPENAPI_META := k8s.io/apimachinery/pkg/apis/meta/v1 k8s.io/apimachinery/pkg/runtime k8s.io/apimachinery/pkg/version

.PHONY: verify-generate
verify-generate: generate ## Fail when generated files differ from what is committed, or a tool module lags the main module's dependencies.
	$(GOPROJ) run ./hack/toolalign -check $(TOOL_KEEP) $(TOOL_MODULES)
	@if [ -n "$$(git status --porcelain -- . )" ]; then \
	  echo "generated files are out of date; run 'make generate' and commit:"; \
	  git status --porcelain -- .; git diff --stat; exit 1; fi

##@ Release (.github/workflows/release.yaml runs on a tag v<version>)

# The places that name the release version besides Chart.yaml's `version`:
# appVersion, the chart README's summary line, and README.md's
# `helm install oci://...` command and ghcr.io references.
SEMVER_RE      := ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$$
README_OCI_RE  := (oci://ghcr\.io/coder/charts/coder-k8s --version )[0-9][0-9A-Za-z.-]*
README_REF_RE  := (ghcr\.io/coder/(charts/)?coder-k8s:)[0-9][0-9A-Za-z.-]*

.PHONY: version
version: ## Print the release version: the chart's version in charts/coder-k8s/Chart.yaml, the one source of it.
	@echo $(VERSION)

.PHONY: set-version
set-version: ## Move the release version everywhere at once, V=x.y.z: Chart.yaml's version and appVersion, the chart README, README.md's install command.
	@if ! [[ "$(V)" =~ $(SEMVER_RE) ]]; then echo "usage: make set-version V=x.y.z (SemVer, no leading v)"; exit 1; fi
	sed -i -E -e 's/^version:.*/version: $(V)/' -e 's/^appVersion:.*/appVersion: "$(V)"/' $(CHART_DIR)/Chart.yaml
	sed -i -E -e 's/^- Chart version [^,]+, app version [^ ]+ /- Chart version $(V), app version $(V) /' $(CHART_DIR)/README.md
	sed -i -E -e 's#$(README_OCI_RE)#\1$(V)#g' -e 's#$(README_REF_RE)#\1$(V)#g' README.md
	@$(MAKE) --no-print-directory check-version

.PHONY: check-version
check-version: ## Fail unless appVersion, the READMEs and values.yaml's image.tag (empty: appVersion) agree with Chart.yaml's version.
	@v='$(VERSION)'; bad=0; \
	  if ! [[ "$$v" =~ $(SEMVER_RE) ]]; then echo "$(CHART_DIR)/Chart.yaml: version '$$v' is not x.y.z"; bad=1; fi; \
	  app=$$(awk '$$1 == "appVersion:" {gsub(/["\047]/, "", $$2); print $$2; exit}' $(CHART_DIR)/Chart.yaml); \
	  if [ "$$app" != "$$v" ]; then echo "$(CHART_DIR)/Chart.yaml: appVersion '$$app', want '$$v' (its version)"; bad=1; fi; \
	  tag=$$(awk '/^[^ #]/ {img = ($$1 == "image:")} img && $$1 == "tag:" {print $$2; exit}' $(CHART_DIR)/values.yaml); \
	  if [ "$$tag" != '""' ]; then echo "$(CHART_DIR)/values.yaml: image.tag $$tag, want \"\" (the chart's appVersion)"; bad=1; fi; \
	  if ! grep -qF -- "- Chart version $$v, app version $$v " $(CHART_DIR)/README.md; then \
	    echo "$(CHART_DIR)/README.md: no '- Chart version $$v, app version $$v' line"; bad=1; fi; \
	  if ! grep -qF -- "oci://ghcr.io/coder/charts/coder-k8s --version $$v" README.md; then \
	    echo "README.md: no 'helm install ... oci://ghcr.io/coder/charts/coder-k8s --version $$v'"; bad=1; fi; \
	  for r in $$(grep -oE -- '$(README_OCI_RE)|$(README_REF_RE)' README.md | grep -oE '[^ :]+$$' | sort -u); do \
	    if [ "$$r" != "$$v" ]; then echo "README.md: names version $$r of the chart or image, want $$v"; bad=1; fi; done; \
	  if [ $$bad != 0 ]; then echo "the release version is Chart.yaml's version: make set-version V=$$v"; exit 1; fi; \
	  echo "version $$v: Chart.yaml, values.yaml and the READMEs agree"

##@ Tools (pinned, built from the Go modules under hack/tools into bin/)

# Each binary depends on its helper module's go.mod and go.sum, so a second
# run does nothing and a version bump rebuilds only that binary.
# The version a helper module requires of module $(2), read from its go.mod.
modversion = $(shell awk -v m=$(2) '$$1=="require" && $$2==m {print $$3; exit} $$1==m && $$2 ~ /^v/ {print $$2; exit}' hack/tools/$(1)/go.mod)
KUBE_VERSION  := $(call modversion,kube,k8s.io/kubernetes)
CODER_VERSION := $(call modversion,coder,github.com/coder/coder/v2)
KUBE_MINOR    := $(word 2,$(subst ., ,$(KUBE_VERSION)))
KUBE_LDFLAGS  := -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
                 -X k8s.io/component-base/version.gitMajor=1 \
                 -X k8s.io/component-base/version.gitMinor=$(KUBE_MINOR) \
                 -X k8s.io/client-go/pkg/version.gitVersion=$(KUBE_VERSION) \
                 -X k8s.io/client-go/pkg/version.gitMajor=1 \
                 -X k8s.io/client-go/pkg/version.gitMinor=$(KUBE_MINOR)

CNI_PLUGINS := bridge host-local loopback portmap
CODER_PROVIDER_VERSION := $(call modversion,coderprovider,github.com/coder/terraform-provider-coder/v2)
CODER_PROVIDER := $(BIN)/tfproviders/registry.opentofu.org/coder/coder/$(CODER_PROVIDER_VERSION:v%=%)/linux_amd64/terraform-provider-coder_$(CODER_PROVIDER_VERSION)
# What the suites start; the code generators and linters are built by the
# targets that run them (make generate, make lint), not by make test.
TEST_TOOLS := $(BIN)/kube-apiserver $(BIN)/kube-controller-manager $(BIN)/kubectl $(BIN)/kubectl-1.32 $(BIN)/etcd $(BIN)/coder $(BIN)/terraform $(CODER_PROVIDER) \
              $(BIN)/helm $(BIN)/ct $(BIN)/kubelet $(BIN)/kube-scheduler $(BIN)/kube-proxy $(BIN)/coredns $(BIN)/pause $(BIN)/gosh $(CNI_PLUGINS:%=$(BIN)/cni/%)
TOOLS := $(TEST_TOOLS) $(BIN)/staticcheck $(BIN)/controller-gen $(BIN)/openapi-gen $(BIN)/actionlint

.PHONY: tools test-tools
tools: $(TOOLS) postgresql yamllint node-packages ## Build every pinned binary into bin/ (cached): the test stack's, the generators and the linters.
test-tools: $(TEST_TOOLS) postgresql yamllint node-packages ## Build the pinned binaries the test suites start (cached).

# Built one after the other: each is a large link and the machines have two cores.
.NOTPARALLEL:

# The tools the suites start are built as their projects' release builds
# are: no symbol table or DWARF (a panic's stack trace keeps its files and
# lines). That halves each link: kube-apiserver's from 23 to 13 CPU-seconds.
TOOL_LDFLAGS := -s -w

# Every tool is compiled as the project's own module is (no cgo, -trimpath),
# and each tool module requires at least the main module's version of every
# module both build (hack/toolalign; `make align-tools` after a dependency
# bump, checked by `make verify-generate`). A compiled package's key in the
# Go build cache covers these settings and the versions of everything below
# it, so client-go, grpc, x/net and the rest compile once for the tools and
# the project together (docs/development.md has what that saves cold).
TOOLGO := CGO_ENABLED=0 GOFLAGS='-trimpath $(GOENVFLAGS)' $(GO)

# Each tool module and the packages it builds; what some keep at their own
# release: kubectl 1.32 and the Argo CD suite their older Kubernetes
# libraries (kube-openapi with its gnostic-models), etcd its API packages.
comma := ,
space := $(subst ,, )
TOOL_MODULES = hack/tools/kube=$(subst $(space),$(comma),$(KUBE_CMDS:%=k8s.io/kubernetes/cmd/%)) \
                hack/tools/coredns=. hack/tools/etcd=. hack/tools/coder=. hack/tools/tofu=github.com/opentofu/opentofu/cmd/tofu \
                hack/tools/coderprovider=github.com/coder/terraform-provider-coder/v2 hack/tools/gosh=mvdan.cc/sh/v3/cmd/gosh \
                hack/tools/helm=helm.sh/helm/v3/cmd/helm hack/tools/ct=github.com/helm/chart-testing/v3/ct \
                hack/tools/kubectl-old=. $(GITOPS_MODULES:%=%=./...)
KUBE_LIBS := k8s.io/,sigs.k8s.io/,github.com/google/gnostic-models
TOOL_KEEP = -keep hack/tools/etcd=go.etcd.io/ -keep hack/tools/kubectl-old=$(KUBE_LIBS) $(GITOPS_MODULES:%=-keep %=$(KUBE_LIBS))

.PHONY: align-tools
align-tools: ## Raise the tool modules' dependencies to the main module's versions, so that shared packages compile once.
	$(GOPROJ) run ./hack/toolalign $(TOOL_KEEP) $(TOOL_MODULES)

# kube-apiserver and kubectl; kube-controller-manager for tests that need
# real built-in controllers (the namespace controller); and the test node
# (internal/testenv.StartNode): kubelet, kube-scheduler and kube-proxy at
# kube-apiserver's version. One go build links them while it still
# compiles (one after the other, the links left a core idle).
KUBE_CMDS := kube-apiserver kube-controller-manager kubectl kubelet kube-scheduler kube-proxy
$(KUBE_CMDS:%=$(BIN)/%) &: hack/tools/kube/go.mod hack/tools/kube/go.sum
	cd hack/tools/kube && $(TOOLGO) build -ldflags "$(TOOL_LDFLAGS) $(KUBE_LDFLAGS)" -o $(BIN)/ $(KUBE_CMDS:%=k8s.io/kubernetes/cmd/%)

# The node's cluster DNS: CoreDNS with only the plugins it uses.
$(BIN)/coredns: hack/tools/coredns/go.mod hack/tools/coredns/go.sum hack/tools/coredns/main.go
	cd hack/tools/coredns && $(TOOLGO) build -ldflags "$(TOOL_LDFLAGS)" -o $@ .

# The pod sandbox's pause.
$(BIN)/pause: hack/pause/main.go
	$(TOOLGO) build -ldflags "$(TOOL_LDFLAGS)" -o $@ ./hack/pause

# The CNI plugins the node's network configuration uses.
CNI_PKG_bridge     := plugins/main/bridge
CNI_PKG_host-local := plugins/ipam/host-local
CNI_PKG_loopback   := plugins/main/loopback
CNI_PKG_portmap    := plugins/meta/portmap
$(CNI_PLUGINS:%=$(BIN)/cni/%) &: hack/tools/cni/go.mod hack/tools/cni/go.sum
	cd hack/tools/cni && $(TOOLGO) build -ldflags "$(TOOL_LDFLAGS)" -o $(BIN)/cni/ \
	  $(foreach p,$(CNI_PLUGINS),github.com/containernetworking/plugins/$(CNI_PKG_$(p)))

# The oldest kubectl the aggregated API supports, built from k8s.io/kubectl
# alone (no monorepo), for the compatibility tests.
KUBECTL_OLD_VERSION := $(call modversion,kubectl-old,k8s.io/kubectl)
KUBECTL_OLD_LDFLAGS := $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version,\
                         -X $(p).gitVersion=$(KUBECTL_OLD_VERSION:v0.%=v1.%) -X $(p).gitMajor=1 \
                         -X $(p).gitMinor=$(word 2,$(subst ., ,$(KUBECTL_OLD_VERSION))))
$(BIN)/kubectl-1.32: hack/tools/kubectl-old/go.mod hack/tools/kubectl-old/go.sum hack/tools/kubectl-old/main.go
	cd hack/tools/kubectl-old && $(TOOLGO) build -ldflags "$(TOOL_LDFLAGS) $(KUBECTL_OLD_LDFLAGS)" -o $@ .

$(BIN)/etcd: hack/tools/etcd/go.mod hack/tools/etcd/go.sum hack/tools/etcd/main.go
	cd hack/tools/etcd && $(TOOLGO) build -ldflags "$(TOOL_LDFLAGS)" -o $@ .

# Static, like Coder's and OpenTofu's releases: the test node runs them in
# an image without a C library (testenv.CoderImage).
$(BIN)/coder: hack/tools/coder/go.mod hack/tools/coder/go.sum hack/tools/coder/main.go
	cd hack/tools/coder && $(TOOLGO) build -ldflags "$(TOOL_LDFLAGS) -X github.com/coder/coder/v2/buildinfo.tag=$(CODER_VERSION:v%=%)" -o $@ .

# OpenTofu, installed under the name coderd's provisioner looks for.
$(BIN)/terraform: hack/tools/tofu/go.mod hack/tools/tofu/go.sum
	cd hack/tools/tofu && $(TOOLGO) build -ldflags "$(TOOL_LDFLAGS)" -o $@ github.com/opentofu/opentofu/cmd/tofu

# Coder's Terraform provider (coder_agent, coder_parameter, coder_app, ...),
# laid out as an unpacked filesystem mirror: testenv.Coder's CLI config
# points OpenTofu's provider installation at bin/tfproviders, so templates
# with `source = "coder/coder"` initialise offline.
$(CODER_PROVIDER): hack/tools/coderprovider/go.mod hack/tools/coderprovider/go.sum
	cd hack/tools/coderprovider && $(TOOLGO) build -ldflags "$(TOOL_LDFLAGS)" -o $@ github.com/coder/terraform-provider-coder/v2

# A POSIX shell without a C library (mvdan.cc/sh's interpreter): /bin/sh of
# the test node's Coder image (testenv.CoderImage), which runs the agent's
# startup script and `coder ssh` sessions.
$(BIN)/gosh: hack/tools/gosh/go.mod hack/tools/gosh/go.sum
	cd hack/tools/gosh && $(TOOLGO) build -ldflags "$(TOOL_LDFLAGS)" -o $@ mvdan.cc/sh/v3/cmd/gosh

# Like helm's own release build: the Kubernetes version it assumes without a
# cluster (helm template, lint) is the one of the client-go it is built with.
HELM_K8S_MINOR := $(word 2,$(subst ., ,$(call modversion,helm,k8s.io/client-go)))
HELM_LDFLAGS   := $(foreach p,helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules,\
                    -X $(p).k8sVersionMajor=1 -X $(p).k8sVersionMinor=$(HELM_K8S_MINOR))
$(BIN)/helm: hack/tools/helm/go.mod hack/tools/helm/go.sum
	cd hack/tools/helm && $(TOOLGO) build -ldflags "$(TOOL_LDFLAGS) $(HELM_LDFLAGS)" -o $@ helm.sh/helm/v3/cmd/helm

$(BIN)/ct: hack/tools/ct/go.mod hack/tools/ct/go.sum
	cd hack/tools/ct && $(TOOLGO) build -ldflags "$(TOOL_LDFLAGS)" -o $@ github.com/helm/chart-testing/v3/ct

$(BIN)/staticcheck: hack/tools/lint/go.mod hack/tools/lint/go.sum
	cd hack/tools/lint && $(TOOLGO) build -o $@ honnef.co/go/tools/cmd/staticcheck

$(BIN)/controller-gen: hack/tools/lint/go.mod hack/tools/lint/go.sum
	cd hack/tools/lint && $(TOOLGO) build -o $@ sigs.k8s.io/controller-tools/cmd/controller-gen

$(BIN)/openapi-gen: hack/tools/lint/go.mod hack/tools/lint/go.sum
	cd hack/tools/lint && $(TOOLGO) build -o $@ k8s.io/kube-openapi/cmd/openapi-gen

# Its own module: actionlint's dependencies must not move the other tools'.
# It runs shellcheck on every `run:` script when shellcheck is on PATH.
$(BIN)/actionlint: hack/tools/actionlint/go.mod hack/tools/actionlint/go.sum
	cd hack/tools/actionlint && $(TOOLGO) build -o $@ github.com/rhysd/actionlint/cmd/actionlint

# Pushes bin/image in the release workflow (not a test tool, so not in
# TOOLS); hack/image's go-containerregistry, in a module of its own.
$(BIN)/crane: hack/tools/crane/go.mod hack/tools/crane/go.sum
	cd hack/tools/crane && $(TOOLGO) build -o $@ github.com/google/go-containerregistry/cmd/crane

# PostgreSQL and yamllint come from Debian; install them only when missing.
.PHONY: postgresql
postgresql:
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null; then \
	  echo "installing PostgreSQL from Debian"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; fi

# The test node's container runtime and kube-proxy's iptables, from Debian.
.PHONY: node-packages
node-packages:
	@if ! command -v containerd >/dev/null || ! command -v runc >/dev/null || ! command -v iptables >/dev/null; then \
	  echo "installing containerd, runc and iptables from Debian"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq containerd runc iptables >/dev/null; fi

.PHONY: yamllint
yamllint:
	@if ! command -v yamllint >/dev/null; then \
	  echo "installing yamllint from Debian"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq yamllint >/dev/null; fi

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

##@ Help

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*##/ {printf "  %-16s %s\n", $$1, $$2} /^##@/ {printf "\n%s\n", substr($$0, 5)}' $(MAKEFILE_LIST)
