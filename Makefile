# liken's build. `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
CONTROLLER_GEN := $(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0
export LIKEN_TEST_REPORT := $(CURDIR)/.test-report

.PHONY: help deps build generate tools test test-quick bench clean-report examples lab lab-down

bench: ## Run the benchmarks (figures, never pass/fail on time).
	set -o pipefail; $(GO) test -count=1 -run '^$$' -bench 'LiveChange' -benchtime 100x ./internal/agent/ 2>&1 | grep -E '^(ok|FAIL|---)|p50-ms'
	set -o pipefail; $(GO) test -count=1 -run '^$$' -bench 'AgentIdle' -benchtime 1x ./internal/agent/ 2>&1 | grep -E '^(ok|FAIL|---)|rss-MiB'
	set -o pipefail; $(GO) test -count=1 -run '^$$' -bench 'VerifiedDownload' -benchtime 1x ./internal/release/ 2>&1 | grep -E '^(ok|FAIL|---)|throughput-ratio'
	set -o pipefail; $(GO) test -count=1 -run '^$$' -bench 'Rollout|Idle' -benchtime 1x ./internal/coordinator/ 2>&1 | grep -E '^(ok|FAIL|---)|ideal-ratio|heap-MiB'
	set -o pipefail; $(GO) test -count=1 -run '^$$' -bench 'Diff1000' -benchtime 3x ./internal/cli/ 2>&1 | grep -E '^(ok|FAIL|---)|diff-s'
	set -o pipefail; $(GO) test -count=1 -run '^$$' -bench 'Channel100' -benchtime 20x ./internal/tuf/ 2>&1 | grep -E '^(ok|FAIL|---)|verify-ms'

clean-report:
	@rm -f $(LIKEN_TEST_REPORT)

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/'

deps: ## Install the Debian packages liken's build and tests need (idempotent).
	@hack/deps.sh

build: ## Build bin/liken.
	CGO_ENABLED=0 $(GO) build -buildvcs=auto -o bin/ ./cmd/...

generate: ## Regenerate deepcopy, CRDs, the API reference and the CLI reference.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd
	$(GO) run ./hack/apidoc > docs/reference/api.md
	$(GO) run ./hack/clidoc > docs/reference/cli.md

tools: ## Build the upstream test binaries (kube-apiserver, etcd, ...) into test/tools/bin.
	test/tools/build.sh

lab: deps build ## Stand up a lab: a liken cluster of QEMU machines on this host, until every machine is Ready (out/lab).
	bin/liken lab up

lab-down: build ## Stop the lab and remove its files.
	bin/liken lab down

examples: deps build ## Validate the example manifests with the API's own rules and build their deployment layers.
	bin/liken validate docs/examples
	bin/liken layer --cluster docs/examples/cluster.yaml --machines docs/examples --out out/example-layer

# When make started: hack/test.sh bounds the tests by what is left of CI's 90 minutes from
# here, the tools' build included (LIKEN_TEST_BUDGET, seconds).
export LIKEN_TEST_START := $(shell date +%s)
test: clean-report deps tools ## Run every test tier (unit, API, VM) with go vet and the benchmarks beside them; print the figures and the time ledger.
	@GO=$(GO) hack/test.sh

test-quick: clean-report deps tools ## Run the unit and API tiers only (no VM), for iteration; make test runs everything.
	@set -o pipefail; $(GO) build -o bin/ledger ./hack/ledger && \
	$(GO) test -count=1 -timeout 30m -json $$($(GO) list ./... | grep -v '/test/vm$$') | bin/ledger
