# edgegw — build, test, cross-compile. `make help` lists the targets.
GO        ?= go
PKG       := edgegw
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT    ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# Build date from the commit, not the clock: two builds of one commit are identical.
DATE      ?= $(shell git log -1 --format=%cI 2>/dev/null || echo unknown)
LDFLAGS   := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.date=$(DATE)
BUILD     := CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags "$(LDFLAGS)"
# The gateway binary that ships (dist/edgegw-ARCH): its flags are in
# build/gateway.flags (read by internal/buildtest too): without the lab and
# HTTP/2, inlining off only in named cold packages.
GWFLAGS   := $(shell grep -v '^\#' build/gateway.flags)
BUILD_GW  := CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false $(GWFLAGS) -ldflags "$(LDFLAGS)"
# armv7: ELF segments aligned to 4 KiB, the one page size of 32-bit ARM
# Linux (the linker's default on arm is 64 KiB: up to 64 KiB of padding a
# segment in the file, 64 KiB less on today's tree). arm64 keeps 64 KiB
# (its kernels may use 16 or 64 KiB pages); amd64's default is 4 KiB.
LDFLAGS_armv7 := -R 0x1000
BUILD_GW_armv7 := CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false $(GWFLAGS) -ldflags "$(LDFLAGS) $(LDFLAGS_armv7)"
BUILD_GW_arm64 := $(BUILD_GW)
BUILD_GW_amd64 := $(BUILD_GW)
STATICCHECK ?= $(shell command -v staticcheck 2>/dev/null || echo $(shell $(GO) env GOPATH)/bin/staticcheck)
# -p 1: one test binary at a time in each of make test's lanes
# (build/testlanes.sh): lane A runs the packages whose tests check
# scheduling on real sockets (SCHED_PKGS), one at a time; QUEUE_LANES more
# lanes (2) every other package, the fuzz targets and the qemu tests.
TESTFLAGS ?= -race -p 1 -timeout 15m
SCHED_PKGS ?= edgegw/e2e edgegw/edge/... edgegw/web/... edgegw/mbserver/...
TESTLOG   ?= dist/testlog

.PHONY: help build test test-loaded test-full gotest lint vet fmtcheck arm arm64 amd64 lab-arm lab-arm64 lab-amd64 receiver receiver-arm64 receiver-amd64 bench soak bench-go benchcmp fuzz fuzz-brief npm-deps clean

help:
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

build: ## build ./edgegw for this machine (static, with the lab: demo, sim, receive, bench)
	$(BUILD) -o edgegw .

arm: ## armv7 gateway binary: dist/edgegw-armv7 (no lab)
	GOOS=linux GOARCH=arm GOARM=7 $(BUILD_GW_armv7) -o dist/edgegw-armv7 .

arm64: ## arm64 gateway binary: dist/edgegw-arm64 (no lab)
	GOOS=linux GOARCH=arm64 $(BUILD_GW) -o dist/edgegw-arm64 .

amd64: ## amd64 gateway binary: dist/edgegw-amd64 (no lab)
	GOOS=linux GOARCH=amd64 $(BUILD_GW) -o dist/edgegw-amd64 .

lab-arm: ## armv7 lab binary (gateway + demo, sim, receive, bench): dist/edgegw-lab-armv7
	GOOS=linux GOARCH=arm GOARM=7 $(BUILD) -o dist/edgegw-lab-armv7 .

lab-arm64: ## arm64 lab binary: dist/edgegw-lab-arm64
	GOOS=linux GOARCH=arm64 $(BUILD) -o dist/edgegw-lab-arm64 .

lab-amd64: ## amd64 lab binary: dist/edgegw-lab-amd64
	GOOS=linux GOARCH=amd64 $(BUILD) -o dist/edgegw-lab-amd64 .

receiver: ## the receiving side's server for this machine: dist/edgegw-receiver (static; PostgreSQL, never in the gateway)
	$(BUILD) -o dist/edgegw-receiver ./cmd/edgegw-receiver

receiver-arm64: ## arm64 receiver: dist/edgegw-receiver-arm64
	GOOS=linux GOARCH=arm64 $(BUILD) -o dist/edgegw-receiver-arm64 ./cmd/edgegw-receiver

receiver-amd64: ## amd64 receiver: dist/edgegw-receiver-amd64
	GOOS=linux GOARCH=amd64 $(BUILD) -o dist/edgegw-receiver-amd64 ./cmd/edgegw-receiver

fmtcheck:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^vendor/')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

lint: fmtcheck vet ## gofmt check, go vet, staticcheck
	$(STATICCHECK) ./...

test: lint gotest ## the whole suite: lint, go test -race on every package, 2000 inputs of each fuzz target, pure tests under qemu (arm64, armv7); ends with each package's time

gotest: ## go test -race ./..., fuzz-brief and test-qemu in lanes side by side (build/testlanes.sh), then each package's time
	GO=$(GO) MAKE=$(MAKE) TESTFLAGS="$(TESTFLAGS)" SCHED_PKGS="$(SCHED_PKGS)" build/testlanes.sh $(TESTLOG)

test-loaded: ## make test with one CPU-bound process beside it for the whole run (started and stopped here); no cached test result counts
	build/loaded.sh $(MAKE) --no-print-directory test TESTFLAGS="$(TESTFLAGS) -count=1"

test-full: ## the long versions make test shortens: the 2-minute soak, the 3-minute receiver kills behind HAProxy, every row of the report-by-exception bytes (EDGEGW_FULL=1)
	EDGEGW_FULL=1 $(GO) test $(TESTFLAGS) -run 'TestSoak$$' ./lab/bench/
	EDGEGW_FULL=1 $(GO) test $(TESTFLAGS) -run 'TestE2EReceiversKilledBehindHAProxy$$' ./receiver/
	EDGEGW_FULL=1 $(GO) test $(TESTFLAGS) -run 'TestWireBytesReportByException$$' .

bench: ## regenerate docs/BENCHMARKS.md: edgegw bench acquire + deliver (~15 min; QUICK=1 ~2 min)
	lab/bench/regen.sh

soak: ## edgegw bench soak for DURATION (default 30m) into docs/BENCHMARKS.md and lab/bench/results/soak.*
	DURATION=$(or $(DURATION),30m) lab/bench/soak.sh

bench-go: ## Go benchmarks of the hot paths
	$(GO) test -run '^$$' -bench . -benchmem ./...

benchcmp: ## Go benchmarks, -count 6, compared with benchstat against lab/bench/baseline.txt
	lab/bench/benchcmp.sh

# Every fuzz target, FUZZTIME each (their seed corpora already run in make test).
FUZZTIME ?= 30s
fuzz: ## run every Go fuzz target for FUZZTIME (default 30s) each
	@set -e; for pkg in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
		for f in $$(grep -h '^func Fuzz' $$pkg/*_test.go | sed 's/func \(Fuzz[A-Za-z0-9_]*\).*/\1/'); do \
			echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5s $$pkg; \
		done; \
	done

# A count, not a duration: a -fuzztime deadline that expires while a worker is
# busy makes go test fail with "context deadline exceeded" now and then.
fuzz-brief: ## every fuzz target for 2000 inputs (part of make test)
	@$(MAKE) --no-print-directory fuzz FUZZTIME=2000x

npm-deps: ## npm test peers (Eclipse Tahu's sparkplug-payload, mqtt) into test/sparkplug/node_modules, from the committed lock file
	cd test/sparkplug && npm ci --no-audit --no-fund

clean:
	rm -rf edgegw dist

include build/build.mk
