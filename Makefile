# lltm_ffi: `make` builds the CUDA kernels (when nvcc is found) and the cffi
# module; `make test` runs the quick checks, `make check` every check (what CI
# runs); `make clean` removes what they built.

PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
BUILD := build
# How many compilers `make test` runs at once for the C checks.
JOBS ?= $(shell getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)

# build_ffi.py finds nvcc and CUDA and holds the nvcc flags and architectures
# (for pip too); these variables only pass a choice on to it:
#   make CUDA=0                  a CPU-only module (default: CUDA when nvcc is found)
#   make NVCC=/path/to/nvcc      this nvcc instead of the one on PATH
#   make CUDA_ARCH=all           machine code for every GPU generation (default:
#                                for the GPUs here; where there is none, PTX for
#                                compute_75 alone, without the tensor-core and
#                                cluster kernels)
#   make CUDA_ARCH=ptx           PTX alone, for every generation's own kernels
#   make CUDA_ARCH="-gencode arch=compute_90,code=sm_90"
export LLTM_CUDA := $(CUDA)
export LLTM_CUDA_ARCH := $(CUDA_ARCH)
export NVCC

# Every C and CUDA source and header under src/, at any depth (the folders
# of the CPU passes, the CUDA paths and each ported op, src/ops/<op>/).
SOURCES_UNDER_SRC = $(sort $(shell find src -name '$(1)'))
HEADERS := $(wildcard include/*.h) $(call SOURCES_UNDER_SRC,*.h) $(wildcard tests/c/*.h)

.PHONY: all test test-slow check seed-hunt cuda-all deps demo-deps demo clean

# Always asks build_ffi.py, which rebuilds only what is missing, truncated or
# out of date: make's file times cannot see a deleted or damaged module.
all:
	@$(PYTHON) build_ffi.py

# Installs what requirements.txt asks for and this Python lacks (torch as
# torch==$(TORCH_VERSION)), saying what; installs nothing, so needs no network,
# where all is present. docs/BUILDING.md says what and how big.
deps:
	@$(PYTHON) scripts/deps.py --torch $(TORCH_VERSION) requirements.txt

# The demo's picture needs matplotlib too (requirements-demo.txt).
demo-deps:
	@$(PYTHON) scripts/deps.py --torch $(TORCH_VERSION) requirements.txt requirements-demo.txt

# The quick tier: test.py, the CPU passes under ASan/UBSan (asan), then the
# pytest suite without the tests marked slow, last, so that its summary closes
# the output.
test: deps all
	$(PYTHON) test.py
	$(MAKE) --no-print-directory -j$(JOBS) asan
	$(PYTHON) -m pytest -q -m "not slow"

# The slow tier: the pip install path (pip-check, CPU-only), the kernels
# compiled for every architecture (cuda-all), then the tests marked slow
# (builds, installs, process launches, long compiles).
test-slow: deps all
	$(MAKE) --no-print-directory pip-check cuda-all
	$(PYTHON) -m pytest -q -m slow

# Everything: both tiers (CI runs `make test` as the README does, then test-slow).
check: test test-slow

# Every CUDA source compiled for ALL_ARCHS (machine code for every GPU
# generation: ptxas's checks) into build/cuda-all, beside the module, which
# links nothing from it; nothing to do without nvcc.
cuda-all:
	LLTM_CUDA_ARCH=all $(PYTHON) build_ffi.py --cuda $(BUILD)/cuda-all

# The tests on fresh seeds: test.py and the quick tier, SEED_HUNT_ROUNDS times,
# each test drawing a new seed each round (LLTM_TEST_SEED=random); a failure
# names its seed, which LLTM_TEST_SEED=<seed> replays. SEED_HUNT_TESTS picks
# other tests (pytest arguments).
SEED_HUNT_ROUNDS ?= 10
SEED_HUNT_TESTS ?= -m "not slow"
seed-hunt: deps all
	@failed=0; for round in $$(seq $(SEED_HUNT_ROUNDS)); do \
	  echo "seed-hunt: round $$round of $(SEED_HUNT_ROUNDS)"; \
	  LLTM_TEST_SEED=random $(PYTHON) test.py || failed=1; \
	  LLTM_TEST_SEED=random $(PYTHON) -m pytest -q -p no:cacheprovider $(SEED_HUNT_TESTS) \
	    || failed=1; \
	done; exit $$failed

demo: demo-deps all
	$(PYTHON) -m examples.demo

clean:
	rm -rf $(BUILD) lltm_ffi/_lltm_ffi*.so lltm_ffi/_lltm_ffi*.so.* lltm_ffi/._lltm_ffi*

# The pip path, CPU-only (scripts/pip_check.py): `pip install .` into a fresh
# venv, build/pip-venv, that sees this Python's torch, cffi and setuptools
# (also when this Python is a venv; no build isolation, no network), then a
# check from outside the checkout that the installed copy is the one that
# runs and has its compiled module.
.PHONY: pip-check
pip-check:
	$(PYTHON) scripts/pip_check.py

# Sanitizers ------------------------------------------------------------------
# `make test` runs asan; the others are run by hand. Each exits non-zero on
# any report.
#   make asan       every op's CPU passes under AddressSanitizer and UBSan,
#                   driven by the C checks (test_*.c: the LLTM's in tests/c/,
#                   each ported op's in src/ops/<op>/), which
#                   tests/c/run_checks.c runs, failing for any registered CPU
#                   pass that no check calls; odd sizes and layouts against
#                   double-precision references, every buffer of exact size,
#                   with the BLAS's products too where lltm_ffi/_blas.py finds
#                   one (docs/BUILDING.md has the times)
#   make valgrind   the same driver, unsanitised, under valgrind, on the own
#                   products alone
#   make memcheck   the CUDA tests under compute-sanitizer (needs a GPU); also
#   make racecheck (and racecheck-tensor-cores), make synccheck and make initcheck
# compute-sanitizer instruments the lltm kernels only (SANITIZER_KERNELS), not
# torch's or cuBLAS's, and counts memory errors, not CUDA API errors; PyTorch's
# caching allocator is off so that an access past a tensor is past its
# allocation.
# -fno-trapping-math as build_ffi.py's C_FLAGS: the row loops vectorise.
SANITIZER_CFLAGS ?= -g -fno-omit-frame-pointer -Wall -Wextra -fopenmp -fno-trapping-math
# -O1 under the sanitizers, the level AddressSanitizer's documentation
# suggests: at -O3 compiling lltm_cpu.c took 2.5 times as long; valgrind's
# build is the module's -O3.
ASAN_FLAGS ?= -O1 -fsanitize=address,undefined -fno-sanitize-recover=all
VALGRIND_CFLAGS ?= -O3
# Every C source under src/ (the shim, the CPU passes, each ported op's
# passes and its test_*.c check) and the checks and driver of tests/c/: no
# CUDA. src/cpu/ holds the header of the LLTM's AMX products, which its
# check includes. Each source's folder is searched for quoted includes, as
# build_ffi.py does (lltm_each_dtype.h includes a file of the op's), so the
# headers in an op's folder carry the op's name.
CPU_CHECK_SOURCES := $(wildcard tests/c/*.c) $(call SOURCES_UNDER_SRC,*.c)
CPU_CHECK_INCLUDES := -Iinclude -Isrc/cpu -Itests/c \
  $(addprefix -iquote ,$(sort $(dir $(CPU_CHECK_SOURCES))))
COMPUTE_SANITIZER ?= compute-sanitizer
SANITIZER_KERNELS ?= --kernel-name kns=lltm_
SANITIZER_FLAGS ?= $(SANITIZER_KERNELS) --report-api-errors no --error-exitcode 1
# The GPU tests (marker gpu) that run the kernels (every dtype, odd sizes,
# every kernel path, batch 1, strided and misaligned arguments,
# threads and streams), without the 40 GB ones (huge), builds and process
# launches (slow), torch.compile (minutes of compiling), the deliberate CUDA
# faults, and CUDA graphs (capture needs the caching allocator).
SANITIZER_TESTS ?= -m "gpu and not huge and not slow" -k "not compile and not fault and not graph and not cpu_only"
# initcheck sees the writes of instrumented kernels and of copies only, so it
# runs the tests whose kernel inputs are all copies from the host.
initcheck: SANITIZER_TESTS = -m gpu tests/test_agreement.py::test_fused_passes
# racecheck aborts inside cuBLAS's bf16/fp16 Hopper kernels ("failed to
# handle a hardware exception"), kernels it does not even check, which the
# float16 and bfloat16 tests reach (torch's products and lltm_ffi's
# cublasGemmEx alike): it runs the float32 and float64 ones. The path
# table's padded cases run every dtype in one test, on rows of whole 16
# bytes, where cuBLAS takes those kernels: they are left out too (an
# H200, 2026-11-30: torch's own bfloat16 linear and its backward at
# 16x656x1968 aborted so, float32 passed; the persistent row's padded cases
# under LLTM_CUBLAS=0 raced clean).
# The cluster row's tensor-core forward takes 16-bit types only, and its
# table test reaches cuBLAS's 16-bit kernels: racecheck-tensor-cores runs
# the kernel alone, with LLTM_CUBLAS=0 (scripts/race_tensor_cores.py);
# RACE_SHAPES="2 3" races those of its shapes only, RACE_SHAPES="--steps 4 6"
# shape 6 on 4 of its steps.
racecheck: SANITIZER_TESTS = -m "gpu and not huge and not slow" -k "not compile and not fault and not graph and not cpu_only and not autocast and not float16 and not padded-forward and not padded-reverse and not tensor_core"
# Only the lltm kernels are instrumented, so copies of what torch's kernels
# wrote look uninitialised to initcheck's memcpy check: it checks kernels only.
initcheck: SANITIZER_FLAGS += --check-api-memory-access no

.PHONY: asan valgrind memcheck racecheck racecheck-tensor-cores synccheck initcheck

# An object a source, so that `make -j` compiles them at once (`make test` does).
$(BUILD)/asan/%.o: %.c $(HEADERS) Makefile
	@mkdir -p $(@D)
	$(CC) $(SANITIZER_CFLAGS) $(ASAN_FLAGS) $(CPU_CHECK_INCLUDES) -c $< -o $@

$(BUILD)/checks/%.o: %.c $(HEADERS) Makefile
	@mkdir -p $(@D)
	$(CC) $(SANITIZER_CFLAGS) $(VALGRIND_CFLAGS) $(CPU_CHECK_INCLUDES) -c $< -o $@

$(BUILD)/run_checks_asan: $(CPU_CHECK_SOURCES:%.c=$(BUILD)/asan/%.o)
	$(CC) $(SANITIZER_CFLAGS) $(ASAN_FLAGS) $^ -lm -o $@

$(BUILD)/run_checks: $(CPU_CHECK_SOURCES:%.c=$(BUILD)/checks/%.o)
	$(CC) $(SANITIZER_CFLAGS) $(VALGRIND_CFLAGS) $^ -lm -o $@

# No fake stack frames for use-after-return: GCC 13 turns them on by default,
# and its runtime's frames can misalign a local that AVX-512 code keeps
# 64-byte aligned (the AMX packers' vectors), which faults as a SEGV.
asan: $(BUILD)/run_checks_asan
	LLTM_BLAS_LIBRARY="$$($(PYTHON) lltm_ffi/_blas.py)" \
	  ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=0 \
	  UBSAN_OPTIONS=print_stacktrace=1 $<

valgrind: $(BUILD)/run_checks
	valgrind -q --error-exitcode=1 $<

memcheck racecheck synccheck initcheck: deps all
	PYTORCH_NO_CUDA_MEMORY_CACHING=1 $(COMPUTE_SANITIZER) --tool $@ $(SANITIZER_FLAGS) \
	  $(PYTHON) -m pytest -q -x -rs $(PYTEST_ARGS) $(SANITIZER_TESTS)

racecheck-tensor-cores: deps all
	PYTHONPATH=$(CURDIR) PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
	  $(COMPUTE_SANITIZER) --tool racecheck $(SANITIZER_FLAGS) $(PYTHON) scripts/race_tensor_cores.py \
	  $(RACE_SHAPES)
