# graft: a lazy-tensor graph compiler and runtime.
#   make demo    run the main demo        make test   sanitized tests + valgrind + TSan
#   make lib     build/libgraft.{a,so}    make bench  benchmarks
#   make install PREFIX=/usr/local (with a pkg-config file and the Python package)  make uninstall
CC      ?= gcc
PREFIX  ?= /usr/local
CFLAGS  ?= -O2 -g
WARN    := -Wall -Wextra -Werror=implicit-function-declaration
# -fvisibility=hidden: libgraft.so exports only what include/graft.h declares (its declarations
# are in a visibility push(default) block); tests link the static archives and still see internals.
BASE    := -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc/core -fPIC -pthread -fvisibility=hidden \
           -fopenmp-simd # loops marked omp simd vectorize at -O2 (host kernels' rows, dot products)
LIBS     = -lm -lpthread -ldl -lz $(LIBS_MPI)

SRC     := $(sort $(wildcard src/core/*.c src/graph/*.c src/passes/*.c src/backends/ref/*.c \
             src/backends/cpu/*.c src/backends/opencl/*.c src/backends/cuda/*.c src/backends/gpu/*.c src/backends/render/*.c src/backends/*.c src/api/*.c src/dist/*.c))

# Open MPI (collectives, src/dist): pkg-config ompi, else mpicc's flags. Only src/dist compiles
# against mpi.h; without Open MPI graft builds and graft_dist_available() is false. MPI=0 forces
# a build without it.
ifneq ($(MPI),0)
MPI_CFLAGS := $(shell pkg-config --cflags ompi 2>/dev/null || mpicc -showme:compile 2>/dev/null)
MPI_LIBS   := $(shell pkg-config --libs ompi 2>/dev/null || mpicc -showme:link 2>/dev/null)
endif
ifneq ($(strip $(MPI_LIBS)),)
MPI_DEFS   := -DGRAFT_HAVE_MPI $(MPI_CFLAGS)
LIBS_MPI   := $(MPI_LIBS)
endif
# The Python of the PyTorch bridge, its tests and the demos: the checkout's virtual environment
# (scripts/install-deps.sh makes it, with PyTorch 2).
PY      ?= $(CURDIR)/.venv/bin/python
NPROC   := $(shell nproc 2>/dev/null || echo 2)
MPIRUN  := OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe
HDR     := $(wildcard include/*.h src/*/*.h src/backends/*/*.h src/core/ops.def)
# The tests' own headers: a change there rebuilds the test programs, not the library.
TEST_HDR := $(wildcard tests/*.h)
TESTS   := $(sort $(wildcard tests/test_*.c))

# One build tree per flavour: release (build/), sanitizers (build/asan), threads (build/tsan).
# GRAFT_DEBUG: buffer.c fills blocks handed out uninitialized, and released ones, with NaN.
SAN     := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -DGRAFT_DEBUG
TSAN    := -fsanitize=thread -DGRAFT_DEBUG

.PHONY: all lib torch demo demo-c test bench fuzz fuzz-asan install deps clean check-asan check-compiled check-opencl \
        check-valgrind check-tsan check-torch check-abi check-layers check-install install-lib check-dist demo-ddp \
        install-python uninstall print-pythondir

all: lib

deps:
	@sh scripts/install-deps.sh

lib: build/libgraft.a build/libgraft.so

build/%.o: %.c $(HDR)
	@mkdir -p $(dir $@)
	$(CC) $(BASE) $(WARN) $(CFLAGS) -c $< -o $@

build/asan/%.o: %.c $(HDR)
	@mkdir -p $(dir $@)
	$(CC) $(BASE) $(WARN) -O1 -g $(SAN) -c $< -o $@

build/tsan/%.o: %.c $(HDR)
	@mkdir -p $(dir $@)
	$(CC) $(BASE) $(WARN) -O1 -g $(TSAN) -c $< -o $@

# Only the dist module sees mpi.h.
build/src/dist/%.o build/asan/src/dist/%.o build/tsan/src/dist/%.o: BASE += $(MPI_DEFS)

OBJ      := $(SRC:%.c=build/%.o)
ASAN_OBJ := $(SRC:%.c=build/asan/%.o)
TSAN_OBJ := $(SRC:%.c=build/tsan/%.o)

build/libgraft.a: $(OBJ)
	@rm -f $@
	ar rcs $@ $^

build/libgraft.so: $(OBJ)
	$(CC) -shared -o $@ $^ $(LIBS)

build/asan/libgraft.a: $(ASAN_OBJ)
	@rm -f $@
	ar rcs $@ $^

build/tsan/libgraft.a: $(TSAN_OBJ)
	@rm -f $@
	ar rcs $@ $^

# Tests link against the sanitized library; every tests/test_*.c is one program.
build/asan/tests/%: tests/%.c build/asan/libgraft.a $(TEST_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(BASE) $(WARN) -O1 -g $(SAN) $< build/asan/libgraft.a -o $@ $(LIBS)

# A stand-in for NVIDIA's driver (tests/fake_cuda.c: host memory, kernels refused) that
# test_device loads through GRAFT_CUDA_DRIVER: the CUDA runtime's paths without a GPU.
build/asan/tests/libfakecuda.so: tests/fake_cuda.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 $(WARN) -O1 -g -shared -fPIC $< -o $@
build/asan/tests/test_device: build/asan/tests/libfakecuda.so

# Unsanitized test programs, for scripts/gpu-check.sh (a GPU driver and ASan do not mix).
build/tests/%: tests/%.c build/libgraft.a $(TEST_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(BASE) $(WARN) $(CFLAGS) $< build/libgraft.a -o $@ $(LIBS)

build/examples/%: examples/%.c build/libgraft.a
	@mkdir -p $(dir $@)
	$(CC) $(BASE) $(WARN) $(CFLAGS) $< build/libgraft.a -o $@ $(LIBS)

build/tsan/tests/%: tests/%.c build/tsan/libgraft.a $(TEST_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(BASE) $(WARN) -O1 -g $(TSAN) $< build/tsan/libgraft.a -o $@ $(LIBS)

# Every test on the reference backend alone (deterministic), then the op and composite tests
# again with each graph compiled to native code before it runs (GRAFT_COMPILE=sync); each pass
# runs the op, composite and gradient suites on cpu:0 and again on cpu:1 (DEVICE_TESTS).
COMPILED_TESTS := test_async test_function test_function_file test_composite test_grad test_autodiff test_optim test_rnn test_passes test_ops_elementwise test_ops_shape test_ops_nn test_dist

# The device-parametrized suites (inputs on GRAFT_TEST_DEVICE) run again on cpu:1.
DEVICE_TESTS := test_ops_elementwise test_ops_shape test_ops_nn test_composite test_grad test_autodiff test_optim test_rnn

# Leak checking leaves thread-local storage out of its roots (use_tls=0: stricter, not looser).
# A suite that asks for an OpenCL device loads pocl, which dlcloses driver modules that have
# thread-locals; LeakSanitizer (gcc 12) then walks their stale dynamic-TLS ranges and its
# tracer crashes at exit ("Tracer caught signal 11"), depending on memory layout.
LEAK_ENV := ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=use_tls=0:suppressions=$(CURDIR)/tests/lsan.supp

# NVRTC (CUDA's run-time compiler) from the PyTorch wheel's nvidia packages, where present:
# test_op_coverage compiles every op's CUDA C with it (skipped, saying so, without it). Its
# builtins library is found through the loader's path. Looked up when the recipe runs: the
# venv may be made by this very `make test` (deps).
NVRTC_FIND := d=$$(ls -d $(CURDIR)/.venv/lib/python3*/site-packages/nvidia/cu13/lib 2>/dev/null | head -n1); \
  if [ -n "$$d" ]; then export GRAFT_NVRTC=$$d/libnvrtc.so.13 LD_LIBRARY_PATH=$$d$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}; fi

check-asan: $(TESTS:tests/%.c=build/asan/tests/%)
	@set -e; $(NVRTC_FIND); for t in $^; do echo "== $$t"; GRAFT_COMPILE=off $(LEAK_ENV) ./$$t; done
	@set -e; for t in $(DEVICE_TESTS:%=build/asan/tests/%); do echo "== $$t (cpu:1)"; \
	  GRAFT_TEST_DEVICE=1 GRAFT_COMPILE=off $(LEAK_ENV) ./$$t; done

check-compiled: $(COMPILED_TESTS:%=build/asan/tests/%)
	@set -e; for t in $^; do echo "== $$t (compiled)"; GRAFT_COMPILE=sync $(LEAK_ENV) ./$$t; done
	@set -e; for t in $(DEVICE_TESTS:%=build/asan/tests/%); do echo "== $$t (compiled, cpu:1)"; \
	  GRAFT_TEST_DEVICE=1 GRAFT_COMPILE=sync $(LEAK_ENV) ./$$t; done

# The OpenCL device (the first one graft lists: here pocl, OpenCL on the CPU): the op, composite
# and gradient suites with every input on it (GRAFT_TEST_DEVICE=opencl), on its reference
# (GRAFT_COMPILE=off) and compiled (sync), then the fuzzer seeds make test runs in
# test_cpu_backend, with their data there: the device's compiler against its reference (the
# fuzzer calls both itself, and its training seeds force sync, so it runs once), and the op table's
# every op x dtype through the OpenCL compiler against the reference kernels (test_op_coverage,
# once: it calls the backends itself). A machine
# where graft finds no OpenCL device skips it, saying why in one line (test_device --probe exits
# 3 then; any other failure of the probe fails the target).
# pocl's and LLVM's own leaks at exit are suppressed here only (tests/lsan-opencl.supp says why).
OPENCL_TESTS := test_ops_elementwise test_ops_shape test_ops_nn test_composite test_grad test_autodiff test_optim test_device
OPENCL_ENV   := GRAFT_TEST_DEVICE=opencl ASAN_OPTIONS=detect_leaks=1 \
                LSAN_OPTIONS=use_tls=0:suppressions=$(CURDIR)/tests/lsan-opencl.supp

check-opencl: $(OPENCL_TESTS:%=build/asan/tests/%) build/asan/fuzz_graphs build/asan/tests/test_device build/asan/tests/test_op_coverage
	@why=$$(./build/asan/tests/test_device --probe opencl 2>&1); rc=$$?; \
	if [ $$rc = 3 ]; then echo "check-opencl: skipped: $$why"; exit 0; fi; \
	if [ $$rc != 0 ]; then echo "$$why"; echo "check-opencl: the probe failed ($$rc)"; exit 1; fi; \
	set -e; for c in off sync; do for t in $(OPENCL_TESTS:%=build/asan/tests/%); do \
	  echo "== $$t (opencl, GRAFT_COMPILE=$$c)"; $(OPENCL_ENV) GRAFT_COMPILE=$$c ./$$t; done; done; \
	echo "== fuzz_graphs --test-seeds (opencl)"; $(OPENCL_ENV) ./build/asan/fuzz_graphs --test-seeds; \
	echo "== test_op_coverage (opencl)"; $(OPENCL_ENV) ./build/asan/tests/test_op_coverage

build/fuzz_graphs: tests/fuzz_graphs.c tests/test_cpu_backend.c build/libgraft.a $(TEST_HDR)
	$(CC) $(BASE) $(WARN) -O2 -g $< build/libgraft.a -o $@ $(LIBS)

build/asan/fuzz_graphs: tests/fuzz_graphs.c tests/test_cpu_backend.c build/asan/libgraft.a $(TEST_HDR)
	$(CC) $(BASE) $(WARN) -O1 -g $(SAN) $< build/asan/libgraft.a -o $@ $(LIBS)

# make fuzz N=10000 NT=1000: N random graphs, then NT training-shaped graphs (a small CNN's
# forward, backward and optimizer update, each trained three steps with donated inputs and a
# warm pool), compiled vs reference. fuzz-asan: the same on the sanitized library, whose pool
# hands out NaN-filled blocks (GRAFT_DEBUG), so a kernel reading memory it did not write shows.
N ?= 1000
NT ?= 100
fuzz: build/fuzz_graphs
	./build/fuzz_graphs $(N)
	./build/fuzz_graphs $(NT) 1 --train

fuzz-asan: build/asan/fuzz_graphs
	ASAN_OPTIONS=detect_leaks=0 ./build/asan/fuzz_graphs $(N)
	ASAN_OPTIONS=detect_leaks=0 ./build/asan/fuzz_graphs $(NT) 1 --train

# valgrind has no AVX-512: generated code for it targets x86-64-v3, compiled before it runs.
VALGRIND := valgrind --leak-check=full --errors-for-leak-kinds=definite,indirect --error-exitcode=1 -q
# The example uses CPU devices only, and device discovery is lazy, so it never opens the OpenCL
# loader (pocl and its LLVM would bring their own leaks and uninitialized reads into valgrind's
# report): checked with the dynamic loader's own trace (oneDNN's library links the OpenCL
# loader, so the loader's presence alone says nothing: graft must not open it, and no OpenCL
# driver, pocl, may be loaded).
check-valgrind: build/examples/mlp build/examples/train_mlp
	GRAFT_COMPILE=off $(VALGRIND) ./build/examples/mlp > /dev/null
	GRAFT_COMPILE=sync GRAFT_MARCH=x86-64-v3 $(VALGRIND) ./build/examples/mlp > /dev/null
	@d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	GRAFT_COMPILE=off $(VALGRIND) ./build/examples/train_mlp --epochs 2 --save $$d/w.graft > /dev/null && \
	GRAFT_COMPILE=sync GRAFT_MARCH=x86-64-v3 $(VALGRIND) ./build/examples/train_mlp --epochs 2 --sgd > /dev/null && \
	GRAFT_MARCH=x86-64-v3 $(VALGRIND) ./build/examples/train_mlp --eval $$d/w.graft > /dev/null
	@if LD_DEBUG=files ./build/examples/mlp 2>&1 >/dev/null | \
	  grep -Eq 'file=libOpenCL[^ ]* \[0\];  dynamically loaded|file=libpocl'; then \
	  echo "check-valgrind: examples/mlp opened libOpenCL (device discovery must stay lazy)"; exit 1; fi

# Layers point down only: includes and the symbols each layer's objects use (tests/check_layers.sh).
check-layers: build/asan/libgraft.a
	sh tests/check_layers.sh build/asan/src

# Collectives across 2 processes under mpirun: parity, mismatch, stall and kill (tests/check_dist.sh);
# then across two hosts made of network namespaces: parity, a cut link, a killed remote rank
# (tests/check_dist_hosts.sh; skipped, saying why, where namespaces cannot be made).
check-dist: build/asan/tests/test_dist
	$(if $(LIBS_MPI),sh tests/check_dist.sh build/asan/tests/test_dist,@echo "check-dist: graft built without Open MPI (MPI=0): skipped")
	$(if $(LIBS_MPI),sh tests/check_dist_hosts.sh build/asan/tests/test_dist)

# test_tiers: the compile thread, the executor's late switch to native code and its wait for a
# build (die_after_fork=0: one test forks a child that starts threads).
check-tsan: build/tsan/tests/test_threads build/tsan/tests/test_async build/tsan/tests/test_tiers
	TSAN_OPTIONS=halt_on_error=1 ./build/tsan/tests/test_threads
	TSAN_OPTIONS="halt_on_error=1 die_after_fork=0" ./build/tsan/tests/test_tiers
	TSAN_OPTIONS=halt_on_error=1 ./build/tsan/tests/test_async
	TSAN_OPTIONS=halt_on_error=1 GRAFT_COMPILE=sync ./build/tsan/tests/test_async

# The PyTorch device: torch/build/_graft_C.so, imported as `graft` (the venv's graft.pth puts torch/ on its path).
torch: lib
	$(MAKE) -C torch PY=$(PY) -j$(NPROC)

check-torch: torch
	$(PY) -m pytest -q tests/torch

# The ABI: libgraft.so exports exactly the functions include/graft.h declares.
check-abi: build/libgraft.so
	sh tests/check_exports.sh build/libgraft.so include/graft.h

# The three library flavours are built side by side first (independent objects; about 5 of a
# fresh run's minutes otherwise), then the suites run one after another.
test: deps
	@$(MAKE) --no-print-directory -j$(NPROC) lib build/asan/libgraft.a build/tsan/libgraft.a
	@$(MAKE) --no-print-directory check-abi check-layers check-asan check-compiled check-opencl \
	  check-dist check-tsan check-valgrind check-torch check-install
	@echo "all test suites passed"

# The main job: a CNN trained on scikit-learn's bundled digits on graft's PyTorch device.
demo: deps torch
	$(PY) examples/digits_cnn.py

# The digits CNN trained data-parallel on 2 processes (examples/ddp_digits.py). Open MPI
# refuses to run as root unless told: the variables are set here, not left to the user.
demo-ddp: deps torch
	$(MPIRUN) -np 2 $(PY) examples/ddp_digits.py

# The C example a C user starts from.
demo-c: deps build/examples/mlp
	./build/examples/mlp

bench: deps build/bench/bench_core build/bench/bench_compiler build/bench/bench_gemm build/bench/bench_opencl build/examples/train_mlp torch $(if $(LIBS_MPI),build/bench/bench_dist)
	./build/bench/bench_core
	GRAFT_BENCH_PY=$(PY) ./build/bench/bench_compiler
	./build/bench/bench_gemm
	./build/bench/bench_opencl
	$(PY) bench/train_mlp_peer.py
	$(PY) bench/torch_bench.py
	$(PY) bench/zoo.py
	$(if $(LIBS_MPI),sh bench/dist_bench.sh build/bench/bench_dist,@echo "bench: no Open MPI: collective benchmarks skipped")

# The collective benchmarks call MPI directly (a bare MPI_Allreduce to compare with).
build/bench/bench_dist: BASE += $(MPI_DEFS)

build/bench/%: bench/%.c build/libgraft.a
	@mkdir -p $(dir $@)
	$(CC) $(BASE) $(WARN) -O2 -g $< build/libgraft.a -o $@ $(LIBS)

# make install PREFIX=... [DESTDIR=...]: the C library, header and graft.pc (install-lib), and the
# Python package `graft` with its bridge _graft_C.so (install-python, which builds the bridge
# against $(PY)'s PyTorch) into the site-packages $(PY) would use for PREFIX (for a virtual
# environment's own prefix, PREFIX=$$(python -c 'import sys; print(sys.prefix)'), that is on its
# path; other prefixes need PYTHONPATH=$(PYTHONDIR)). PYTHONDIR=... overrides. `make uninstall`
# (same PREFIX/DESTDIR) removes exactly these files.
PYTHONDIR ?= $(shell $(PY) -c 'import sys, sysconfig; print(sysconfig.get_paths(vars={"base": sys.argv[1], "platbase": sys.argv[1]})["purelib"])' '$(PREFIX)' 2>/dev/null)
PYFILES   := $(notdir $(wildcard torch/graft/*.py))

install: install-lib install-python

install-lib: lib
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 build/libgraft.a build/libgraft.so $(DESTDIR)$(PREFIX)/lib/
	install -m 644 include/graft.h $(DESTDIR)$(PREFIX)/include/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|0.1.0|' -e 's|@MPI_LIBS@|$(LIBS_MPI)|' graft.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/graft.pc

# graft/__init__.py loads _graft_C.so from its own folder first.
install-python: torch
	install -d $(DESTDIR)$(PYTHONDIR)/graft
	install -m 644 $(addprefix torch/graft/,$(PYFILES)) $(DESTDIR)$(PYTHONDIR)/graft/
	install -m 644 torch/build/_graft_C.so $(DESTDIR)$(PYTHONDIR)/graft/

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/lib/libgraft.a $(DESTDIR)$(PREFIX)/lib/libgraft.so
	rm -f $(DESTDIR)$(PREFIX)/include/graft.h $(DESTDIR)$(PREFIX)/lib/pkgconfig/graft.pc
	rm -f $(addprefix $(DESTDIR)$(PYTHONDIR)/graft/,$(PYFILES) _graft_C.so)
	rm -rf $(DESTDIR)$(PYTHONDIR)/graft/__pycache__
	rmdir $(DESTDIR)$(PYTHONDIR)/graft 2>/dev/null || true

print-pythondir:
	@echo $(PYTHONDIR)

# make install/uninstall into a temporary prefix: the Python package imports and runs an op
# from another folder, examples/mlp.c builds with pkg-config and runs, nothing is left behind.
check-install: lib torch
	sh tests/check_install.sh

clean:
	rm -rf build
