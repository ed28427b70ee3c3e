# The whole setup on a fresh Debian 12 machine:
#   make demo   installs what is missing, builds, runs the main example
#   make test   installs what is missing, builds, runs every test
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# ccache keys on paths relative to the clone, so another clone of Kiln hits the same entries.
export CCACHE_BASEDIR ?= $(CURDIR)
# The tests' precompiled header is cached only with these (ccache's manual, "Precompiled headers").
export CCACHE_SLOPPINESS ?= pch_defines,time_macros
# The sanitizer and fuzz builds compile with line tables (-g1), for which ccache would also hash
# the working directory: without this, another clone never hits their entries.
export CCACHE_NOHASHDIR ?= true

TSAN_BUILD ?= build-tsan
PYTHON_ASAN_BUILD ?= build-python-asan
# make fuzz runs each fuzz/fuzz_<name>.cpp listed here for FUZZ_TIME seconds.
FUZZ_TARGETS ?= safetensors idx csv png jpeg ir bpe sharded
FUZZ_TIME ?= 30

# The Python package: make python builds kiln._kiln into python/kiln/ (then PYTHONPATH=python).
.PHONY: all deps deps-demo deps-bench configure build python demo-configure demo demo-gpt test sanitize-configure test-asan test-python-asan test-tsan test-static fuzz bench bench-jit install-test clean format format-check check-structure

all: build

deps:
	@scripts/install-deps.sh

deps-demo:
	@scripts/install-deps.sh --demo

deps-bench:
	@scripts/install-deps.sh --bench

# The whole build (tests, benchmarks, the Python module). make demo may have configured
# $(BUILD) without them, so a folder whose cache lacks the tests is configured again.
FULL_CONFIG = cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_TESTS=ON \
  -DKILN_BUILD_BENCH=ON -DKILN_BUILD_PYTHON=ON $(CMAKE_FLAGS)
configure: deps
	@grep -qs '^KILN_BUILD_TESTS:BOOL=ON' $(BUILD)/CMakeCache.txt || $(FULL_CONFIG)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

python: configure
	cmake --build $(BUILD) -j $(JOBS) --target _kiln
	@echo "kiln is built in place: export PYTHONPATH=$(CURDIR)/python"

# The demos build only the library and their example, from only their packages.
demo-configure: deps-demo
	@test -f $(BUILD)/build.ninja || cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_BENCH=OFF -DKILN_BUILD_PYTHON=OFF $(CMAKE_FLAGS)

# The main job: a CNN on Fashion-MNIST (examples/demo.cpp).
demo: demo-configure
	cmake --build $(BUILD) -j $(JOBS) --target demo
	$(BUILD)/examples/demo

# The second main job: a GPT trained on text (examples/gpt.cpp).
demo-gpt: demo-configure
	cmake --build $(BUILD) -j $(JOBS) --target gpt
	$(BUILD)/examples/gpt

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# One sanitizer build, clang 16 with AddressSanitizer and UndefinedBehaviorSanitizer, shared by
# the tests (make test-asan) and the libFuzzer targets (make fuzz): Kiln's sources are compiled
# once with coverage for the fuzzers (-fsanitize=fuzzer-no-link), which the tests ignore. -g1:
# line tables, all that reports need; full debug information would cost CI minutes of compiling.
# OpenMP is gcc's libgomp, the runtime OpenBLAS and oneDNN are built against: under clang's
# libomp, which also answers their GOMP_* calls, OpenBLAS's threaded dgemm was given a team of
# one thread and waited forever for the second. clang compiles no parallel regions for libgomp,
# so Kiln's own loops run their chunks one after another here (the libraries' threads still run).
SANITIZE_GOMP = /usr/lib/gcc/$(shell gcc -dumpmachine)/$(shell gcc -dumpversion)/libgomp.so
SANITIZE_CONFIG = cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 \
  -DCMAKE_C_COMPILER=clang-16 -DCMAKE_CXX_COMPILER=clang++-16 -DKILN_SANITIZE=ON -DKILN_BUILD_FUZZ=ON \
  -DKILN_BUILD_BENCH=OFF -DKILN_OPT_FLAGS="-O1;-g1;-Wno-source-uses-openmp" -DKILN_BUILD_PYTHON=OFF \
  -DOpenMP_C_FLAGS=-fopenmp=libgomp -DOpenMP_CXX_FLAGS=-fopenmp=libgomp -DOpenMP_C_LIB_NAMES=gomp \
  -DOpenMP_CXX_LIB_NAMES=gomp -DOpenMP_gomp_LIBRARY=$(SANITIZE_GOMP)
sanitize-configure: deps
	@scripts/install-deps.sh --clang
	@{ grep -qs '^KILN_BUILD_FUZZ:BOOL=ON' $(ASAN_BUILD)/CMakeCache.txt && \
	   grep -qs '^OpenMP_CXX_FLAGS:.*=-fopenmp=libgomp' $(ASAN_BUILD)/CMakeCache.txt; } || \
	  { rm -rf $(ASAN_BUILD); $(SANITIZE_CONFIG); }

# The tests again under the sanitizers.
test-asan: sanitize-configure
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

# The Python tests against the module built under gcc's ASan + UBSan, the interpreter preloading
# their runtimes (python/CMakeLists.txt). Not in CI, whose time budget it would exceed; run it
# after changing how the module holds memory (buffers, DLPack, lifetimes).
test-python-asan: deps
	cmake -S . -B $(PYTHON_ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 \
	  -DKILN_SANITIZE=ON -DKILN_BUILD_BENCH=OFF -DKILN_OPT_FLAGS="-O1;-g1" -DKILN_BUILD_PYTHON=ON
	cmake --build $(PYTHON_ASAN_BUILD) -j $(JOBS) --target kiln_python_package
	cd $(PYTHON_ASAN_BUILD) && ctest -L python --output-on-failure -j $(JOBS)

# The data pipeline's and the allocator's threads, and one compiled function called from four
# threads, under ThreadSanitizer (libgomp is not instrumented, so Kiln's own parallel loops
# stay on one thread there).
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_BUILD_BENCH=OFF \
	  -DKILN_BUILD_EXAMPLES=OFF -DKILN_BUILD_PYTHON=OFF -DKILN_OPT_FLAGS="-O1;-g1" -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
	  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target test_data test_runtime test_compiled_walk
	OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 $(TSAN_BUILD)/tests/test_data
	OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 $(TSAN_BUILD)/tests/test_runtime
	OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 $(TSAN_BUILD)/tests/test_compiled_walk \
	  --gtest_filter='CompiledConcurrency.*'

# kiln as a static library, whose link keeps only the object files something references: the
# tests that walk every registered primitive must still find all of them. Linked from the objects
# `make build` compiled, so nothing is compiled again.
test-static: build
	cmake --build $(BUILD) -j $(JOBS) --target test_dispatch_static test_ad_rules_static
	$(BUILD)/tests/test_dispatch_static
	$(BUILD)/tests/test_ad_rules_static

# Each fuzz target in FUZZ_TARGETS under libFuzzer + ASan + UBSan (the sanitizer build) for
# FUZZ_TIME seconds, JOBS at a time (scripts/fuzz.sh). Runs them all, then fails if any crashed;
# a crashing input is left in $(ASAN_BUILD)/artifacts/<name>/.
fuzz: sanitize-configure
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target $(addprefix fuzz_,$(FUZZ_TARGETS))
	scripts/fuzz.sh $(ASAN_BUILD) $(FUZZ_TIME) $(JOBS) $(FUZZ_TARGETS)

# cmake --install into a prefix, then build a separate project against it with find_package:
# once with g++, once with clang++ 16 and -fopenmp (the public headers must compile with both).
# Then pip installs the Python package into a fresh virtual environment (Debian's pip, no
# network) from this build, and it is imported from outside the source tree.
install-test: build
	@scripts/install-deps.sh --clang
	rm -rf $(BUILD)/install $(BUILD)/consumer $(BUILD)/consumer-clang
	cmake --install $(BUILD) --prefix $(CURDIR)/$(BUILD)/install
	cmake -S tests/consumer -B $(BUILD)/consumer -G Ninja -DCMAKE_PREFIX_PATH=$(CURDIR)/$(BUILD)/install
	cmake --build $(BUILD)/consumer
	$(BUILD)/consumer/consumer
	cmake -S tests/consumer -B $(BUILD)/consumer-clang -G Ninja -DCMAKE_CXX_COMPILER=clang++-16 \
	  -DCMAKE_CXX_FLAGS=-fopenmp -DCMAKE_PREFIX_PATH=$(CURDIR)/$(BUILD)/install
	cmake --build $(BUILD)/consumer-clang
	$(BUILD)/consumer-clang/consumer
	rm -rf $(BUILD)/venv
	/usr/bin/python3 -m venv --system-site-packages $(BUILD)/venv
	KILN_BUILD_DIR=$(CURDIR)/$(BUILD) $(BUILD)/venv/bin/pip install -q --no-build-isolation --no-index .
	cd /tmp && $(CURDIR)/$(BUILD)/venv/bin/python -c 'import kiln, numpy; \
	  assert kiln.__file__.startswith("$(CURDIR)/$(BUILD)/venv/"), kiln.__file__; \
	  print("pip-installed kiln:", kiln.asarray(numpy.ones(3, numpy.float32)).shape)'

bench: deps-bench build
	bench/run.sh $(BUILD)

# jit (compiled and interpreted) and eager against PyTorch, 1 and 2 threads; see
# docs/PERFORMANCE.md. Parts: bench/jit_vs_torch.sh BUILD fusion|train|scan|vmap|compile|demo
bench-jit: deps-bench build
	bench/jit_vs_torch.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(PYTHON_ASAN_BUILD)

# Layout is .clang-format's for C++ (Debian 12's clang-format 14) and black's for Python
# (pyproject.toml), with flake8's lint (setup.cfg); format-check enforces them in CI.
CLANG_FORMAT ?= clang-format-14
PYTHON_FILES = $$(git ls-files '*.py')
format: deps
	$(CLANG_FORMAT) -i $$(git ls-files '*.h' '*.cpp')
	black -q $(PYTHON_FILES)

format-check: deps
	$(CLANG_FORMAT) --dry-run -Werror $$(git ls-files '*.h' '*.cpp')
	black -q --check $(PYTHON_FILES)
	flake8 $(PYTHON_FILES)

# No include points from a lower layer to a higher one (docs/DESIGN.md, "Layers"), and
# DESIGN.md's Layout lists the tree as it is.
check-structure:
	python3 scripts/check_layers.py
	python3 scripts/layout.py --check
