# atoll — the two commands a newcomer types:
#   make run    set up (if needed) only what the run needs, build only the `atoll` binary, run
#               atoll's main job on its embedded default; each stage says what it is doing
#   make test   set up (if needed) everything, build everything, run the whole test suite
# Other targets: build, setup (everything: scripts/setup test), setup-run (scripts/setup run),
# test-asan (ASan+UBSan build of the torch-free modules), test-tsan (ThreadSanitizer build of the
# threaded runtime: clocks, syncer loop, exchange, learner agent, shaper, the learner-syncer seam),
# fuzz (libFuzzer targets of the decoders, FUZZ_SECONDS each, clang + ASan + UBSan), bench, clean.
# Variables: BUILD (build folder), JOBS (parallel compile jobs; 2 on this machine), CMAKE_ARGS
# (extra configure flags), RUN_ARGS (extra flags for `make run`).
BUILD ?= build
JOBS ?= 2
CMAKE_ARGS ?=
RUN_ARGS ?=
FUZZ_SECONDS ?= 20
# The embedded default job: a local Decoupled DiLoCo cluster from the commented run file.
RUN_CMD ?= run --config configs/run.toml
# Ninja when present (scripts/setup installs it), decided when a recipe runs, after setup.
GENERATOR = $$(command -v ninja >/dev/null 2>&1 && echo Ninja || echo 'Unix Makefiles')

.PHONY: all setup setup-run configure build run test test-asan test-tsan fuzz bench clean

all: build

setup:
	@scripts/setup test

setup-run:
	@scripts/setup run

$(BUILD)/CMakeCache.txt:
	@echo "build: configuring $(BUILD) (CMake; finding libtorch takes a while) ..."
	cmake -S . -B $(BUILD) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

configure: setup $(BUILD)/CMakeCache.txt

# Everything, tests included (a folder `make run` configured first is configured again for them).
build: configure
	@grep -q '^ATOLL_BUILD_TESTS:STRING=ON$$' $(BUILD)/CMakeCache.txt || cmake -S . -B $(BUILD) -DATOLL_BUILD_TESTS=ON
	cmake --build $(BUILD) -j $(JOBS)

# Only the run's packages and the `atoll` binary with the libraries it links; the tests' packages
# and targets come with `make test`.
run: setup-run $(BUILD)/CMakeCache.txt
	@echo "build: compiling the atoll binary and the libraries it links, not the tests ([done/total] steps) ..."
	cmake --build $(BUILD) -j $(JOBS) --target atoll
	@echo "run: $(BUILD)/atoll $(RUN_CMD) $(RUN_ARGS)"
	$(BUILD)/atoll $(RUN_CMD) $(RUN_ARGS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

# Sanitizer build of everything that does not need libtorch or gRPC (math, simulator, core).
test-asan: setup
	cmake -S . -B $(BUILD)-asan -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Debug \
	  -DATOLL_SANITIZE=address,undefined -DATOLL_WITH_TORCH=OFF -DATOLL_WITH_GRPC=OFF \
	  -DATOLL_WERROR=ON $(CMAKE_ARGS)
	cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) -L "unit|integration" --timeout 600

# ThreadSanitizer build of the threaded code that needs neither libtorch nor gRPC: the clocks
# (real, manual, simulated), the syncer core and loop, the exchange, the learner agent, the WAN
# shaper, and the learner <-> syncer seam over its in-process links.
TSAN_TESTS := core_test syncer_test exchange_test learner_agent_test staged_agent_test wan_shaper_test syncer_api_test
test-tsan: setup
	cmake -S . -B $(BUILD)-tsan -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DATOLL_SANITIZE=thread -DATOLL_WITH_TORCH=OFF -DATOLL_WITH_GRPC=OFF -DATOLL_WERROR=ON $(CMAKE_ARGS)
	cmake --build $(BUILD)-tsan -j $(JOBS) --target $(TSAN_TESTS)
	cd $(BUILD)-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --output-on-failure -j $(JOBS) -R "Clock|SyncerCore|SyncerLoop|Hostile|LearnerAgent|StagedAgent|AgentGroup|WanShaper|DurableState|RoundPass|ShardedCore|RobustMerge|CommitHold|Lattice|FragmentExchange|SyncerApiSeam" \
	  --timeout 600

# libFuzzer targets (fuzz/) for the codecs, push parsing, durable state, safetensors and
# checksummed JSON, each run FUZZ_SECONDS on its seed corpus (scripts/fuzz).
fuzz: setup
	cmake -S . -B $(BUILD)-fuzz -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_COMPILER=clang++ -DATOLL_FUZZ=ON -DATOLL_WITH_TORCH=OFF -DATOLL_WERROR=ON $(CMAKE_ARGS)
	cmake --build $(BUILD)-fuzz -j $(JOBS) --target atoll_fuzzers
	scripts/fuzz $(BUILD)-fuzz $(FUZZ_SECONDS)

bench: build
	@for b in $(BUILD)/bench/bench_*; do echo "== $$b"; $$b || exit 1; done

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan $(BUILD)-fuzz
