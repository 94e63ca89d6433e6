# lltm_ffi: `make` builds the CUDA kernels (when nvcc is found) and the cffi
# module; `make test` runs every check; `make clean` removes what they built.

PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
BUILD := build

NVCC ?= $(shell command -v nvcc 2>/dev/null)
CUDA ?= $(if $(NVCC),1,0)
# Where nvcc itself looks for its headers and libraries (nvcc may be a wrapper script).
CUDA_HOME ?= $(if $(NVCC),$(realpath $(shell $(NVCC) --dryrun -c -x cu /dev/null 2>&1 | sed -n 's/^#\$$ TOP=//p')),/usr/local/cuda)

# Turing to Blackwell as machine code, and PTX of the newest for GPUs after it.
CUDA_ARCH ?= -gencode arch=compute_75,code=sm_75 \
             -gencode arch=compute_80,code=sm_80 \
             -gencode arch=compute_86,code=sm_86 \
             -gencode arch=compute_89,code=sm_89 \
             -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_100,code=sm_100 \
             -gencode arch=compute_120,code=sm_120 \
             -gencode arch=compute_120,code=compute_120
NVCC_FLAGS ?= -O3 -std=c++17 -Xcompiler -fPIC $(CUDA_ARCH)

HEADERS := $(wildcard include/*.h) $(wildcard src/*.h)
C_SOURCES := $(wildcard src/*.c)

ifeq ($(CUDA),1)
KERNEL_OBJECTS := $(patsubst src/%.cu,$(BUILD)/%.o,$(wildcard src/*.cu))
endif

.PHONY: all test deps demo clean

all: $(BUILD)/module.stamp

$(BUILD)/%.o: src/%.cu $(HEADERS) Makefile
	@mkdir -p $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -Iinclude -c $< -o $@

# CUDA=0 and CUDA=1 builds write the same module, so the stamp records which one it is.
$(BUILD)/module.stamp: build_ffi.py lltm_ffi/_build_info.py $(C_SOURCES) $(HEADERS) $(KERNEL_OBJECTS) Makefile $(BUILD)/cuda-$(CUDA)
	LLTM_KERNEL_OBJECTS="$(KERNEL_OBJECTS)" CUDA_HOME="$(CUDA_HOME)" $(PYTHON) build_ffi.py -q
	@touch $@

$(BUILD)/cuda-$(CUDA):
	@mkdir -p $(BUILD)
	@rm -f $(BUILD)/cuda-*
	@touch $@

# Installs only what is missing, so it also works offline where everything is present.
deps:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install "torch==$(TORCH_VERSION)"
	@$(PYTHON) -c "import cffi, pytest" 2>/dev/null || $(PYTHON) -m pip install -r requirements.txt

test: deps all
	$(PYTHON) test.py
	$(PYTHON) -m pytest -q tests

demo: deps all
	$(PYTHON) -m lltm_ffi.demo

clean:
	rm -rf $(BUILD) lltm_ffi/_lltm_ffi*.so
