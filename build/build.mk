# build/build.mk: release packaging, size budget, reproducibility and qemu
# checks. Included by the Makefile (include build/build.mk), which defines
# GO, VERSION, COMMIT, DATE, LDFLAGS, BUILD, BUILD_GW and the targets arm,
# arm64, amd64 (the gateway, dist/edgegw-{armv7,arm64,amd64}) and lab-arm,
# lab-arm64, lab-amd64 (the lab, dist/edgegw-lab-{armv7,arm64,amd64}).

RELEASE_ARCHS     := armv7 arm64 amd64
# Every time stamp in a release comes from the commit, never the clock.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
export SOURCE_DATE_EPOCH
# The armv7 gateway binary must not be above SIZE_BUDGET_ARMV7 (make size
# and TestSizeBudgetARMv7 fail); SIZE_GOAL_ARMV7 is the house issue's goal
# (make size says how far the binary is from it).
SIZE_BUDGET_ARMV7 ?= 8100000
SIZE_GOAL_ARMV7   ?= 7900000
REPRO_DIR         ?= dist/repro
QEMU_AARCH64      ?= qemu-aarch64
QEMU_ARM          ?= qemu-arm
SMOKE_CONFIG      ?= build/edgegw.example.toml
SMOKE_DEVICES     ?= 48

goenv_armv7 := GOOS=linux GOARCH=arm GOARM=7
goenv_arm64 := GOOS=linux GOARCH=arm64
goenv_amd64 := GOOS=linux GOARCH=amd64
# The same build with symbols, for build/symsize (the shipped one is -s -w).
BUILD_SYMS  := $(subst -ldflags "-s -w ,-ldflags ",$(BUILD_GW_armv7))

.PHONY: release size repro qemu-smoke test-qemu notices

release: arm arm64 amd64 lab-arm lab-arm64 lab-amd64 receiver-arm64 receiver-amd64 ## dist/edgegw-VERSION-linux-{armv7,arm64,amd64}.tar.gz (gateway + lab; + receiver on arm64, amd64) + dist/SHA256SUMS (reproducible)
	GO="$(GO)" build/package.sh dist dist "$(VERSION)" $(RELEASE_ARCHS)

notices: ## THIRD_PARTY_NOTICES of this machine's build to stdout
	@GO="$(GO)" build/notices.sh .

size: arm arm64 amd64 ## size per target and the 15 largest packages (build/symsize); fails if armv7 > SIZE_BUDGET_ARMV7, says how far it is from SIZE_GOAL_ARMV7
	$(goenv_armv7) $(BUILD_SYMS) -o dist/size/edgegw-armv7.syms .
	GO="$(GO)" build/size.sh dist dist/size/edgegw-armv7.syms $(SIZE_BUDGET_ARMV7) $(SIZE_GOAL_ARMV7)

# Two builds of this commit per target from two copies of the working tree
# at different paths (the tree may change under a running check; the copies
# do not): a with the usual build cache, b with an empty one (everything
# recompiled); then the release tarballs of each. Every file must be
# byte-identical.
REPRO_ABS := $(abspath $(REPRO_DIR))
repro: ## build and package twice (other path, cold cache) and cmp everything
	rm -rf $(REPRO_DIR) && mkdir -p $(REPRO_DIR)/src-a $(REPRO_DIR)/other/src-b
	tar -cf - --exclude=./dist --exclude=./.git --exclude=./edgegw . | tar -xf - -C $(REPRO_DIR)/src-a
	cp -a $(REPRO_DIR)/src-a/. $(REPRO_DIR)/other/src-b/
	$(foreach a,$(RELEASE_ARCHS),(cd $(REPRO_DIR)/src-a && $(goenv_$(a)) $(BUILD_GW_$(a)) -o $(REPRO_ABS)/a/edgegw-$(a) .) && (cd $(REPRO_DIR)/other/src-b && GOCACHE=$(REPRO_ABS)/gocache $(goenv_$(a)) $(BUILD_GW_$(a)) -o $(REPRO_ABS)/b/edgegw-$(a) .) && ) true
	cd $(REPRO_DIR)/src-a && GO="$(GO)" build/package.sh $(REPRO_ABS)/a $(REPRO_ABS)/a/pkg "$(VERSION)" $(RELEASE_ARCHS)
	cd $(REPRO_DIR)/other/src-b && GO="$(GO)" build/package.sh $(REPRO_ABS)/b $(REPRO_ABS)/b/pkg "$(VERSION)" $(RELEASE_ARCHS)
	$(foreach a,$(RELEASE_ARCHS),cmp $(REPRO_DIR)/a/edgegw-$(a) $(REPRO_DIR)/b/edgegw-$(a) && cmp $(REPRO_DIR)/a/pkg/edgegw-$(VERSION)-linux-$(a).tar.gz $(REPRO_DIR)/b/pkg/edgegw-$(VERSION)-linux-$(a).tar.gz && ) cmp $(REPRO_DIR)/a/pkg/SHA256SUMS $(REPRO_DIR)/b/pkg/SHA256SUMS
	@chmod -R u+w $(REPRO_DIR)/gocache 2>/dev/null; rm -rf $(REPRO_DIR)
	@echo "repro: $(RELEASE_ARCHS) binaries and tarballs are byte-identical"

qemu-smoke: arm arm64 lab-arm lab-arm64 ## version and check of the arm64 and armv7 gateway binaries, a short demo of the lab ones, under qemu-user
	build/qemu-smoke.sh $(QEMU_AARCH64) dist/edgegw-arm64 $(SMOKE_CONFIG) $(SMOKE_DEVICES) dist/edgegw-lab-arm64
	build/qemu-smoke.sh $(QEMU_ARM) dist/edgegw-armv7 $(SMOKE_CONFIG) $(SMOKE_DEVICES) dist/edgegw-lab-armv7

# The pure tests (no sockets, no child processes) of the packages that
# matter most on ARM: 64-bit atomics on armv7, byte order, float decoding.
QEMU_TESTS := ./ringstore/@-skip=SIGKILL|HelperProcess ./stats/@-run=. ./history/@-run=. ./edge/@-run=^Test(Decode|Encode|BitAt|ParseNames) ./edge/modbus/@-run=^Test(UDPRoundClean|ZeroAllocsPerPoll) ./sparkplug/@-run=^Test(PayloadRoundTrip|ValueMapping|ParseState|BdSeq|Aliases|CheckID) ./wire/@-run=.
test-qemu: ## go test -exec qemu-aarch64 / qemu-arm on the pure tests of ringstore, stats, history, edge (decode), edge/modbus (UDP rounds, allocations), sparkplug (payload, stores), wire (every frame byte for byte)
	$(foreach t,$(QEMU_TESTS),CGO_ENABLED=0 $(goenv_arm64) $(GO) test -count=1 -exec $(QEMU_AARCH64) '$(word 2,$(subst @, ,$(t)))' $(word 1,$(subst @, ,$(t))) && ) true
	$(foreach t,$(QEMU_TESTS),CGO_ENABLED=0 $(goenv_armv7) $(GO) test -count=1 -exec $(QEMU_ARM) '$(word 2,$(subst @, ,$(t)))' $(word 1,$(subst @, ,$(t))) && ) true
