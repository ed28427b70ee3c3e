# The whole setup on a fresh Debian 12 machine:
#   make demo   installs what is missing, builds, runs the main example
#   make test   installs what is missing, builds, runs every test
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps deps-bench build demo test test-asan bench install-test clean format

all: build

deps:
	@scripts/install-deps.sh

deps-bench:
	@scripts/install-deps.sh --bench

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/examples/demo

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# Tests again under AddressSanitizer and UndefinedBehaviorSanitizer.
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON -DKILN_BUILD_BENCH=OFF
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

# cmake --install into a prefix, then build a separate project against it with find_package.
install-test: build
	rm -rf $(BUILD)/install $(BUILD)/consumer
	cmake --install $(BUILD) --prefix $(CURDIR)/$(BUILD)/install
	cmake -S tests/consumer -B $(BUILD)/consumer -G Ninja -DCMAKE_PREFIX_PATH=$(CURDIR)/$(BUILD)/install
	cmake --build $(BUILD)/consumer
	$(BUILD)/consumer/consumer

bench: deps-bench build
	bench/run.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp')
