# ddp.h — build, test, benchmark. `make` needs only a C compiler.
CC       ?= cc
CXX      ?= c++
OPT      ?= -O3 -march=native -g
CFLAGS   ?= $(OPT)
WARN     := -Wall -Wextra
LDLIBS   := -lpthread -lm
B        := build

PROGRAMS := $(B)/ddprun $(B)/minimal $(B)/bench_allreduce $(B)/bench_overlap \
            $(B)/test_unit $(B)/test_collectives $(B)/test_equivalence $(B)/test_fault \
            $(B)/test_overlap
CHECKS   := $(B)/cxx_check.o

.PHONY: all run test bench clean
all: $(PROGRAMS) $(CHECKS)

$(B):
	@mkdir -p $(B)

$(B)/ddprun: tools/ddprun.c | $(B)
	$(CC) -std=c99 -D_GNU_SOURCE $(CFLAGS) $(WARN) -o $@ $<

# Everything that includes the header rebuilds when it changes.
$(B)/%: examples/%.c ddp.h | $(B)
	$(CC) -std=c99 $(CFLAGS) $(WARN) -o $@ $< $(LDLIBS)
$(B)/%: tests/%.c tests/testlib.h ddp.h | $(B)
	$(CC) -std=c99 $(CFLAGS) $(WARN) -o $@ $< $(LDLIBS)
$(B)/%: bench/%.c ddp.h | $(B)
	$(CC) -std=c99 $(CFLAGS) $(WARN) -o $@ $< $(LDLIBS)

# The header, implementation included, must also compile as C++.
$(B)/cxx_check.o: tests/cxx_check.cpp ddp.h | $(B)
	$(CXX) -std=c++11 $(CFLAGS) $(WARN) -c -o $@ $<

# The main job: train on 2 local ranks.
run: $(B)/ddprun $(B)/minimal
	$(B)/ddprun -n 2 $(B)/minimal

test: all
	@tests/run.sh $(B)

bench: $(B)/ddprun $(B)/bench_allreduce $(B)/bench_overlap
	@bench/compare_allreduce.sh
	@bench/overlap.sh

clean:
	rm -rf $(B)
