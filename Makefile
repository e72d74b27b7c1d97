# Switchyard: make help lists the targets.
GO      ?= go
PKGS    ?= ./...
BIN     ?= bin/switchyard
BENCH   ?= .
BENCHTIME ?= 1s

.PHONY: help build test test-short bench lint fmt check demo clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build bin/switchyard
	$(GO) build -o $(BIN) ./cmd/switchyard

test: ## run every test with the race detector
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

test-short: ## run the tests without the race detector
	$(GO) test -count=1 $(PKGS)

bench: ## run the Go benchmarks (BENCH=regexp, BENCHTIME=1s)
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -benchtime $(BENCHTIME) $(PKGS)

lint: ## go vet, gofmt and the import-direction rule
	$(GO) vet $(PKGS)
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) test -count=1 -run TestImportDirection ./cmd/switchyard

fmt: ## format the code
	gofmt -w $$(find . -name '*.go' -not -path './.cache/*')

check: fmt lint test ## fmt, vet, lint and the tests with -race

demo: build ## run the router on its example configuration and show its picks
	./$(BIN) demo

clean: ## remove build output
	rm -rf bin
