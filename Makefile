# lltm_ffi: `make` builds the CUDA kernels (when nvcc is found) and the cffi
# module; `make test` runs every check; `make clean` removes what they built.

PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
BUILD := build

# build_ffi.py finds nvcc and CUDA and holds the nvcc flags and architectures
# (for pip too); these variables only pass a choice on to it:
#   make CUDA=0                  a CPU-only module (default: CUDA when nvcc is found)
#   make NVCC=/path/to/nvcc      this nvcc instead of the one on PATH
#   make CUDA_ARCH="-gencode arch=compute_90,code=sm_90"
export LLTM_CUDA := $(CUDA)
export LLTM_CUDA_ARCH := $(CUDA_ARCH)
export NVCC

HEADERS := $(wildcard include/*.h) $(wildcard src/*.h) $(wildcard lltm_ffi/ops/*/*.h) \
           $(wildcard tests/c/*.h)

.PHONY: all test deps demo-deps demo clean

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

# test.py, the CPU passes under ASan/UBSan (asan), the pip install path
# (pip-check, CPU-only), then pytest, last, so that its summary closes the output.
test: deps all
	$(PYTHON) test.py
	$(MAKE) --no-print-directory asan pip-check
	$(PYTHON) -m pytest -q

demo: demo-deps all
	$(PYTHON) -m examples.demo

clean:
	rm -rf $(BUILD) lltm_ffi/_lltm_ffi*.so lltm_ffi/_lltm_ffi*.so.*

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
#                   driven by the C checks of the op folders (test_*.c), which
#                   tests/c/run_checks.c runs, failing for any registered CPU
#                   pass that no check calls; odd sizes and layouts against
#                   double-precision references, every buffer of exact size,
#                   with the BLAS's products too where lltm_ffi/_blas.py finds
#                   one (seconds)
#   make valgrind   the same driver, unsanitised, under valgrind, on the own
#                   products alone (about 20 s)
#   make memcheck   the CUDA tests under compute-sanitizer (needs a GPU); also
#   make racecheck, make synccheck and make initcheck
# compute-sanitizer instruments the lltm kernels only (SANITIZER_KERNELS), not
# torch's or cuBLAS's, and counts memory errors, not CUDA API errors; PyTorch's
# caching allocator is off so that an access past a tensor is past its
# allocation.
SANITIZER_CFLAGS ?= -O3 -g -fno-omit-frame-pointer -Wall -Wextra -fopenmp -fno-trapping-math
ASAN_FLAGS ?= -fsanitize=address,undefined -fno-sanitize-recover=all
# The shim, every op's C sources (its CPU passes and its test_*.c checks),
# and the driver: no CUDA.
CPU_CHECK_SOURCES := tests/c/run_checks.c $(wildcard src/*.c) $(wildcard lltm_ffi/ops/*/*.c)
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
# cublasGemmEx alike): it runs the float32 and float64 ones.
racecheck: SANITIZER_TESTS = -m "gpu and not huge and not slow" -k "not compile and not fault and not graph and not cpu_only and not autocast and not float16"
# Only the lltm kernels are instrumented, so copies of what torch's kernels
# wrote look uninitialised to initcheck's memcpy check: it checks kernels only.
initcheck: SANITIZER_FLAGS += --check-api-memory-access no

.PHONY: asan valgrind memcheck racecheck synccheck initcheck

$(BUILD)/run_checks_asan: $(CPU_CHECK_SOURCES) $(HEADERS) Makefile
	@mkdir -p $(BUILD)
	$(CC) $(SANITIZER_CFLAGS) $(ASAN_FLAGS) -Iinclude -Itests/c $(CPU_CHECK_SOURCES) -lm -o $@

$(BUILD)/run_checks: $(CPU_CHECK_SOURCES) $(HEADERS) Makefile
	@mkdir -p $(BUILD)
	$(CC) $(SANITIZER_CFLAGS) -Iinclude -Itests/c $(CPU_CHECK_SOURCES) -lm -o $@

asan: $(BUILD)/run_checks_asan
	LLTM_BLAS_LIBRARY="$$($(PYTHON) lltm_ffi/_blas.py)" ASAN_OPTIONS=detect_leaks=1 \
	  UBSAN_OPTIONS=print_stacktrace=1 $<

valgrind: $(BUILD)/run_checks
	valgrind -q --error-exitcode=1 $<

memcheck racecheck synccheck initcheck: deps all
	PYTORCH_NO_CUDA_MEMORY_CACHING=1 $(COMPUTE_SANITIZER) --tool $@ $(SANITIZER_FLAGS) \
	  $(PYTHON) -m pytest -q -x -rs $(SANITIZER_TESTS)
