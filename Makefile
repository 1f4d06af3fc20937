# uvccl: plain Makefile. `make` builds the libraries and tools, `make check`
# builds and runs the tests, `make demo` runs the demo. SANITIZE=1 builds
# everything with AddressSanitizer and UndefinedBehaviorSanitizer into
# build-san/. V=1 prints full commands.

PREFIX     ?= /usr/local
DESTDIR    ?=
CC         ?= cc
PROVE      ?= prove
PROVE_OPTS ?=
PYTHON     ?= /usr/bin/python3

ifeq ($(SANITIZE),1)
BUILD      ?= build-san
SAN_FLAGS   = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OPT        ?= -O1 -g
else
BUILD      ?= build
SAN_FLAGS   =
OPT        ?= -O2 -g
endif

UV_CFLAGS  := $(shell pkg-config --cflags libuv 2>/dev/null)
UV_LIBS    := $(shell pkg-config --libs libuv 2>/dev/null || echo -luv)

CFLAGS_ALL  = -std=gnu11 $(OPT) -Wall -Wextra -Wno-unused-parameter -Wshadow \
	      -fPIC -fvisibility=hidden -pthread -Iinclude -Isrc \
	      $(UV_CFLAGS) $(SAN_FLAGS) $(CFLAGS)
LDFLAGS_ALL = $(SAN_FLAGS) $(LDFLAGS)
LIBS_ALL    = $(UV_LIBS) -lssl -lcrypto -pthread -ldl -lm

ifeq ($(V),1)
Q =
else
Q = @
endif

# CUDA=auto|yes|no. The GPU side loads libcudart and libnccl at run time
# and declares the few CUDA types it needs itself, so it builds without
# any CUDA header or library: auto is the same as yes (a machine without a
# GPU builds it too and reports UVCCL_ENOGPU at run time). no compiles the
# loader out (-DUVCCL_NO_CUDA): every GPU entry point then reports
# UVCCL_ENOGPU "built without CUDA (CUDA=no)".
CUDA       ?= auto
ifeq ($(CUDA),no)
CUDA_MODE  := no
CFLAGS_ALL += -DUVCCL_NO_CUDA
else
CUDA_MODE  := yes
endif
# Records the mode, rewritten only when it changes, so that switching
# CUDA= rebuilds the GPU objects that read it.
CUDA_STAMP := $(BUILD)/cuda-mode
$(shell mkdir -p $(BUILD) && (echo '$(CUDA_MODE)' | cmp -s - $(CUDA_STAMP) || echo '$(CUDA_MODE)' > $(CUDA_STAMP)))

# One folder a layer, lowest first (README, "Layout").
LIB_DIRS  := loop reduce tls store boot diag cuda cpu/xport cpu/live cpu/algo cpu nccl pg
LIB_SRCS  := $(sort $(wildcard $(LIB_DIRS:%=src/%/*.c)))
LIB_OBJS  := $(LIB_SRCS:%.c=$(BUILD)/%.o)
TOOL_SRCS := $(sort $(wildcard tools/*.c))
TOOLS     := $(TOOL_SRCS:tools/%.c=$(BUILD)/bin/%)
TEST_SRCS := $(sort $(wildcard t/[0-9]*.c))
TESTS     := $(TEST_SRCS:%.c=%.t)

STATIC    := $(BUILD)/libuvccl.a
SHARED    := $(BUILD)/libuvccl.so

# The PyTorch backend (python/uvccl_torch): its extension, against Debian's
# libtorch-dev and Debian's python3 (not PATH's), where both are there.
# Not in sanitizer builds: a Python process cannot load ASan late.
TORCH_PY   := /usr/bin/python3
TORCH_HDR  := /usr/include/torch/csrc/distributed/c10d/ProcessGroup.hpp
ifneq ($(SANITIZE),1)
ifneq ($(wildcard $(TORCH_HDR)),)
TORCH_SUFFIX := $(shell $(TORCH_PY) -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))" 2>/dev/null)
TORCH_PYINC  := $(shell $(TORCH_PY) -c "import sysconfig; print(sysconfig.get_paths()['include'])" 2>/dev/null)
TORCH_EXT    := $(if $(TORCH_SUFFIX),python/uvccl_torch/_C$(TORCH_SUFFIX))
# make install puts the package under PREFIX's site directory for python3
TORCH_PYVER  := $(shell $(TORCH_PY) -c "import sys; print('%d.%d' % sys.version_info[:2])" 2>/dev/null)
TORCH_SITE   := $(PREFIX)/lib/python$(TORCH_PYVER)/dist-packages
endif
endif

# The asyncio binding (python/uvccl): a CPython extension against the
# python3 the tests run (Debian's), libuvccl linked in statically. Not in
# sanitizer builds, as the PyTorch backend.
ifneq ($(SANITIZE),1)
PY_SUFFIX := $(shell $(PYTHON) -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))" 2>/dev/null)
PY_INC    := $(shell $(PYTHON) -c "import sysconfig; print(sysconfig.get_paths()['include'])" 2>/dev/null)
PY_EXT    := $(if $(PY_SUFFIX),python/uvccl/_core$(PY_SUFFIX))
endif

# The Node.js addon (node/): node-gyp compiles it and the library's sources
# against the headers of the Node that runs it (its own libuv and OpenSSL,
# which the addon links instead of Debian's), with node-addon-api and
# node-gyp from npm at the versions node/package-lock.json pins. Where node
# and npm are there; not in sanitizer builds, as the Python extensions.
ifneq ($(SANITIZE),1)
NODE_BIN   := $(shell command -v node 2>/dev/null)
NODE_ADDON := $(if $(NODE_BIN),node/build/Release/uvccl.node)
endif

# The HTTP service example (examples/vsearch), on H2O (Debian's libh2o-dev,
# built on libuv), where its headers are.
VSEARCH_SRCS := $(sort $(wildcard examples/vsearch/*.c))
VSEARCH_OBJS := $(VSEARCH_SRCS:%.c=$(BUILD)/%.o)
VSEARCH      := $(if $(wildcard /usr/include/h2o.h),$(BUILD)/bin/uvccl-vsearch)

.PHONY: all deps check demo install clean fuzz tests valgrind bench-store torch torch-ext torch-suite examples examples-build py py-ext nodejs nodejs-addon
# The GPU benchmarks (bench/gpu/) are built with everything, so they never
# rot on machines without a GPU; they run on one (bench/gpu/README.md).
GPU_BENCHES := $(BUILD)/bench/nccl_bench $(BUILD)/bench/stage_bench
# The chaos benchmark's uvccl rank (bench/chaos/run.sh), the store's
# load generator (bench/store/run.sh) and the authentication cost at
# connect (bench/auth/run.sh), and the loop lag under large collectives
# (bench/coll/loop_lag.sh), and the state transfer's rate and the
# kill-and-grow-back cycles (bench/elastic/).
OTHER_BENCHES := $(BUILD)/bench/uvccl_chaos $(BUILD)/bench/uvccl-store-bench \
		 $(BUILD)/bench/uvccl-auth-bench $(BUILD)/bench/uvccl-create-bench \
		 $(BUILD)/bench/uvccl-tls-store-bench $(BUILD)/bench/uvccl-loop-lag \
		 $(BUILD)/bench/uvccl-transfer-bench $(BUILD)/bench/uvccl-elastic-cycles \
		 $(BUILD)/bench/uvccl-bindings-chain
# The system calls' times, preloaded into the ranks of a loop-lag run
# (bench/coll/call_times.c, CALL_TIMES=1 bench/coll/loop_lag.sh).
CALL_TIMES  := $(BUILD)/bench/call_times.so
all: deps $(STATIC) $(SHARED) $(TOOLS) $(GPU_BENCHES) $(OTHER_BENCHES) $(CALL_TIMES) torch examples py nodejs

# The asyncio binding, from a make of its own (Python's headers arrive with
# deps on a fresh machine).
py: deps $(STATIC)
	$(Q)$(MAKE) --no-print-directory py-ext
py-ext: $(PY_EXT)

ifneq ($(PY_EXT),)
PY_SRCS   := $(sort $(wildcard python/uvccl/*.c))
$(PY_EXT): $(PY_SRCS) python/uvccl/core.h include/uvccl.h $(STATIC)
	@$(if $(Q),echo "  PYEXT   $@")
	$(Q)$(CC) -std=gnu11 -O2 -g -fPIC -shared -Wall -Wextra \
	  -Wno-unused-parameter -Wno-missing-field-initializers -fvisibility=hidden \
	  -Iinclude -I$(PY_INC) $(UV_CFLAGS) -o $@ $(PY_SRCS) $(STATIC) $(LIBS_ALL)
endif

# The Node.js addon, from a make of its own (node and npm may arrive with
# deps on a fresh machine).
nodejs: deps
	$(Q)$(MAKE) --no-print-directory nodejs-addon
nodejs-addon: $(NODE_ADDON)

ifneq ($(NODE_ADDON),)
node/node_modules/.package-lock.json: node/package.json node/package-lock.json
	@$(if $(Q),echo "  NPM     node/node_modules")
	$(Q)cd node && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error $(if $(Q),>/dev/null)
$(NODE_ADDON): $(LIB_SRCS) $(wildcard src/*/*.h src/*/*/*.h) include/uvccl.h \
	       $(wildcard node/src/*) node/binding.gyp node/scripts/build.js \
	       node/node_modules/.package-lock.json
	@$(if $(Q),echo "  NODE    $@")
	$(Q)cd node && node scripts/build.js $(if $(Q),> ../$(BUILD)/node-gyp.log 2>&1 || \
	  { cat ../$(BUILD)/node-gyp.log; false; })
endif

# The examples, from a make of their own (as torch: H2O's headers arrive
# with deps on a fresh machine).
examples: deps $(STATIC)
	$(Q)$(MAKE) --no-print-directory examples-build
examples-build: $(VSEARCH)

ifneq ($(VSEARCH),)
$(VSEARCH): $(VSEARCH_OBJS) $(STATIC)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  TOOL    $@")
	$(Q)$(CC) $(LDFLAGS_ALL) -o $@ $(VSEARCH_OBJS) $(STATIC) -lh2o $(LIBS_ALL)
endif

# The extension, from a make of its own: on a fresh machine the headers it
# looks for arrive with deps, after this makefile was read.
torch: deps $(STATIC)
	$(Q)$(MAKE) --no-print-directory torch-ext
torch-ext: $(TORCH_EXT)

# Installs what building and testing need, where it is missing (Debian).
deps:
	$(Q)./tools/deps.sh

ifneq ($(TORCH_EXT),)
# One object a concern (python/uvccl_torch/csrc/): they build in parallel.
TORCH_SRCS  := $(sort $(wildcard python/uvccl_torch/csrc/*.cpp))
TORCH_OBJS  := $(TORCH_SRCS:python/uvccl_torch/csrc/%.cpp=$(BUILD)/torch/%.o)
# The C++ standard PyTorch's headers ask for (torch/all.h says: C++17 up
# to 2.x, C++20 since).
TORCH_ALL_H := /usr/include/torch/csrc/api/include/torch/all.h
TORCH_STD   := $(if $(shell grep -s '__cplusplus < 202002L' $(TORCH_ALL_H)),c++20,c++17)
TORCH_FLAGS  = -std=$(TORCH_STD) -O2 -g -fPIC -Wall -Wno-unused-parameter \
	  -Iinclude -I$(TORCH_PYINC) -I/usr/include/torch/csrc/api/include \
	  $(UV_CFLAGS)
$(BUILD)/torch/%.o: python/uvccl_torch/csrc/%.cpp include/uvccl.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  TORCH   $<")
	$(Q)$(CXX) $(TORCH_FLAGS) -MMD -MP -c $< -o $@
$(TORCH_EXT): $(TORCH_OBJS) $(STATIC)
	@$(if $(Q),echo "  TORCH   $@")
	$(Q)$(CXX) -shared -o $@ $(TORCH_OBJS) $(STATIC) $(UV_LIBS) -ltorch \
	  -ltorch_cpu -lc10 -ltorch_python -lssl -lcrypto -pthread -ldl -lm
-include $(TORCH_OBJS:.o=.d)
endif

# deps is order-only: with make -j on a fresh machine nothing compiles
# before the headers it needs are installed.
$(BUILD)/%.o: %.c | deps
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(filter $(BUILD)/src/cuda/% $(BUILD)/src/nccl/%,$(LIB_OBJS)): $(CUDA_STAMP)

# Test doubles of libcudart and libnccl (t/fake/), loaded by the GPU tests
# through UVCCL_CUDART / UVCCL_NCCL. Built without sanitizers: they are
# dlopen'ed by sanitized tests, and the ASan runtime of the test binary
# covers their malloc calls.
FAKE_DIR    := $(BUILD)/fake
FAKE_CUDART := $(FAKE_DIR)/libcudart.so.13
FAKE_NCCL   := $(if $(wildcard t/fake/nccl.c),$(FAKE_DIR)/libnccl.so.2)
# The same fake as an older NCCL (2.26: no ncclCommRevoke, no
# ncclCommShrink), for the UVCCL_ENOTSUP paths.
FAKE_NCCL_OLD := $(if $(wildcard t/fake/nccl.c),$(FAKE_DIR)/old/libnccl.so.2)
FAKES       := $(FAKE_CUDART) $(FAKE_NCCL) $(FAKE_NCCL_OLD)
FAKE_CFLAGS  = -std=gnu11 -O2 -g -Wall -Wextra -Wno-unused-parameter -fPIC \
	       -fvisibility=hidden -pthread -It/fake -Iinclude -Isrc $(UV_CFLAGS) $(CFLAGS)

$(FAKE_CUDART): t/fake/cudart.c t/fake/fake.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  FAKE    $@")
	$(Q)$(CC) $(FAKE_CFLAGS) -shared -Wl,-soname,libcudart.so.13 $(LDFLAGS) \
	  -o $@ $< -pthread

# The fake NCCL calls the fake cudart (fake_cuda_enqueue); it finds it next
# to itself, and the dynamic loader reuses the copy uvccl already opened
# (same soname).
$(FAKE_DIR)/libnccl.so.2: t/fake/nccl.c t/fake/fake.h $(FAKE_CUDART)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  FAKE    $@")
	$(Q)$(CC) $(FAKE_CFLAGS) -shared -Wl,-soname,libnccl.so.2 $(LDFLAGS) \
	  -o $@ $< -L$(FAKE_DIR) -l:libcudart.so.13 -Wl,-rpath,'$$ORIGIN' -pthread

$(FAKE_DIR)/old/libnccl.so.2: t/fake/nccl.c t/fake/fake.h $(FAKE_CUDART)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  FAKE    $@")
	$(Q)$(CC) $(FAKE_CFLAGS) -DFAKE_NCCL_NO_SHRINK -shared \
	  -Wl,-soname,libnccl.so.2 $(LDFLAGS) -o $@ $< -L$(FAKE_DIR) \
	  -l:libcudart.so.13 -Wl,-rpath,'$$ORIGIN/..' -pthread

$(STATIC): $(LIB_OBJS)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

$(SHARED): $(LIB_OBJS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -shared -Wl,-soname,libuvccl.so.0 $(LDFLAGS_ALL) -o $@ $^ $(LIBS_ALL)

# A program of one source file, linked against the static library; the
# compiler writes the headers it read into $(BUILD)/dep/ (-MMD).
LINK_ONE = $(CC) $(CFLAGS_ALL) -MMD -MP -MT $@ \
	   -MF $(BUILD)/dep/$(subst /,_,$@).d $(LDFLAGS_ALL) -o $@ $< $(STATIC) $(LIBS_ALL)

$(BUILD)/bin/%: tools/%.c $(STATIC)
	@mkdir -p $(dir $@) $(BUILD)/dep
	@$(if $(Q),echo "  TOOL    $@")
	$(Q)$(LINK_ONE)

# Without sanitizers, like the fakes: it is preloaded into programs that
# may have them or not.
$(CALL_TIMES): bench/coll/call_times.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  BENCH   $@")
	$(Q)$(CC) -std=gnu11 -O2 -g -Wall -Wextra -fPIC -shared $(CFLAGS) $(LDFLAGS) \
	  -o $@ $< -ldl

# The benchmarks built with everything: program, then its source.
BENCH_TABLE := \
	uvccl-store-bench:bench/store/store_bench.c \
	uvccl-auth-bench:bench/auth/connect_bench.c \
	uvccl-tls-store-bench:bench/tls/store_ops.c \
	uvccl-create-bench:bench/auth/create_bench.c \
	uvccl-loop-lag:bench/coll/loop_lag.c \
	uvccl-bindings-chain:bench/bindings/c_chain.c \
	uvccl-transfer-bench:bench/elastic/transfer_bench.c \
	uvccl-elastic-cycles:bench/elastic/cycles.c \
	uvccl_chaos:bench/chaos/uvccl_chaos.c \
	nccl_bench:bench/gpu/nccl_bench.c \
	stage_bench:bench/gpu/stage_bench.c

define BENCH_RULE
$(BUILD)/bench/$(1): $(2) $(STATIC)
	@mkdir -p $$(dir $$@) $(BUILD)/dep
	@$$(if $$(Q),echo "  BENCH   $$@")
	$$(Q)$$(LINK_ONE)
endef
$(foreach b,$(BENCH_TABLE),$(eval $(call BENCH_RULE,$(word 1,$(subst :, ,$(b))),$(word 2,$(subst :, ,$(b))))))

# t/3004 holds uvccl's hand-declared CUDA/NCCL ABI against the toolkit's
# headers where they are installed.
CUDA_INC ?= /usr/local/cuda/include
t/3004-gpu-abi.t: CFLAGS_ALL += $(if $(wildcard $(CUDA_INC)/nccl.h),-I$(CUDA_INC) -DUVCCL_HAVE_CUDA_HEADERS)

# Tests are built in place (t/NNNN-area-what.t) so `prove t/` finds them;
# they link the static library of the current build flavour.
t/%.t: t/%.c $(STATIC) $(TOOLS) $(FAKES) $(OTHER_BENCHES) $(VSEARCH)
	@mkdir -p $(BUILD)/dep
	@$(if $(Q),echo "  TEST    $@")
	$(Q)$(LINK_ONE) -DUVCCL_BUILD_DIR='"$(abspath $(BUILD))"' \
	  -DUVCCL_SRC_DIR='"$(CURDIR)"'

tests: all $(TESTS)

# Test binaries depend on the flavour, so always relink them for check.
check: all
	$(Q)rm -f $(TESTS)
	$(Q)$(MAKE) --no-print-directory tests
	UVCCL_BUILD_DIR=$(abspath $(BUILD)) $(PROVE) $(PROVE_OPTS) t/

demo: all
	$(Q)./tools/demo.sh $(BUILD)

# The tests under valgrind's memcheck, every process they start followed
# (tools/valgrind.sh: the tests that finish in minutes there; CI runs it).
valgrind: tests
	$(Q)./tools/valgrind.sh

# PyTorch's distributed_test.py against the backend (minutes: not in check)
torch-suite: all
	$(Q)./t/dist_suite.sh

bench-store: all
	$(Q)./bench/store/run.sh

# libFuzzer targets: the store protocol parser, the trace reader, the
# transport's and the monitor's frames, and the HTTP example's request
# parser (clang). FUZZ_SECONDS bounds each.
FUZZ_SECONDS ?= 30
fuzz:
	$(Q)mkdir -p build-fuzz
	$(Q)clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc \
	  $(UV_CFLAGS) -o build-fuzz/store_proto_fuzz fuzz/store_proto_fuzz.c \
	  src/store/proto.c src/store/auth.c src/loop/error.c src/loop/alloc.c \
	  src/loop/config.c src/loop/log.c \
	  $(UV_LIBS) -lcrypto
	$(Q)mkdir -p build-fuzz/corpus
	./build-fuzz/store_proto_fuzz -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	  build-fuzz/corpus fuzz/corpus
	$(Q)clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc \
	  $(UV_CFLAGS) -o build-fuzz/trace_fuzz fuzz/trace_fuzz.c \
	  src/diag/json.c src/diag/analyze.c src/diag/fingerprint.c \
	  src/loop/error.c src/loop/alloc.c $(UV_LIBS)
	$(Q)mkdir -p build-fuzz/corpus-trace
	./build-fuzz/trace_fuzz -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	  build-fuzz/corpus-trace fuzz/corpus-trace
	$(Q)clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc \
	  $(UV_CFLAGS) -o build-fuzz/frame_fuzz fuzz/frame_fuzz.c \
	  src/cpu/xport/frame.c src/cpu/live/link_frame.c
	$(Q)mkdir -p build-fuzz/corpus-frame
	./build-fuzz/frame_fuzz -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	  build-fuzz/corpus-frame fuzz/corpus-frame
	$(Q)clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined \
	  -Iexamples/vsearch -o build-fuzz/vsearch_query_fuzz \
	  fuzz/vsearch_query_fuzz.c examples/vsearch/query.c examples/vsearch/table.c -lm
	$(Q)mkdir -p build-fuzz/corpus-vsearch
	./build-fuzz/vsearch_query_fuzz -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	  build-fuzz/corpus-vsearch fuzz/corpus-vsearch

install: all
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 include/uvccl.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(STATIC) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(SHARED) $(DESTDIR)$(PREFIX)/lib/libuvccl.so.0
	ln -sf libuvccl.so.0 $(DESTDIR)$(PREFIX)/lib/libuvccl.so
	install -m 755 $(TOOLS) $(VSEARCH) $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|0.1.0|g' uvccl.pc.in \
	  > $(DESTDIR)$(PREFIX)/lib/pkgconfig/uvccl.pc
ifneq ($(TORCH_EXT),)
	# the PyTorch backend, where Debian's python3 finds it
	install -d $(DESTDIR)$(TORCH_SITE)/uvccl_torch
	install -m 644 python/uvccl_torch/__init__.py $(DESTDIR)$(TORCH_SITE)/uvccl_torch/
	install -m 755 $(TORCH_EXT) $(DESTDIR)$(TORCH_SITE)/uvccl_torch/
endif

clean:
	rm -rf build build-san build-fuzz t/*.t python/uvccl_torch/_C*.so python/uvccl/_core*.so \
	  python/uvccl/build python/uvccl/*.egg-info node/build

# The headers each object and program read, as the compiler wrote them.
-include $(LIB_OBJS:.o=.d) $(VSEARCH_OBJS:.o=.d) $(wildcard $(BUILD)/dep/*.d)
