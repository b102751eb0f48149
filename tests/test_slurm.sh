#!/usr/bin/env bash
# test_slurm.sh — ddp.h under a real Slurm (tools/slurm_hosts.sh: munged, slurmctld on h1, slurmd
# on h1 and h2, namespace hosts of tools/hosts.sh). No MASTER_ADDR or MASTER_PORT is exported
# anywhere here: ddp.h takes them from srun's variables. One PASS/FAIL line per check; one SKIP
# line, exit 0, where the namespaces or the Slurm and munge packages are missing.
# Usage: tests/test_slurm.sh [BUILD_DIR]
#   srun -N 1 -n 2 of the CPU build: the equivalence test passes
#   srun -N 2 -n 4 of the CPU build: every rank refuses at once, naming the span; srun fails
#   srun --mpi=pmix -N 2 --ntasks-per-node=2 of the MPI build: 2 hosts x 2 ranks = 1 rank at 4x
#   batch, the same bits on every rank, each rank on its host; the tiny GPT the same way
#   two steps of one job at once on the same node: each its own world, both complete; a program
#   started by the batch script itself refused by name
#   the sbatch example (examples/train_gpt.sbatch) runs the GPT trainer; scancel ends it with no
#   process and nothing in any host's /dev/shm left
#   a node killed mid-step (every process of h2, slurmd included): the survivors on h1 name it
#   within the timeout, srun exits non-zero, nothing left running
# The MPI parts run in the plain build only (as tests/test_mpi_hosts.sh: Open MPI under the
# sanitizers takes minutes a job); there the sbatch example runs the CPU build on one node.
set -u
B=${1:-build}
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
fails=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }
case $B in *asan*|*tsan*) SLOW=3 MPI=0 ;; *) SLOW=1 MPI=1 ;; esac
for p in test_equivalence minimal test_fault train_gpt; do
    [ -x "$B/$p" ] || { echo "SKIP slurm: no $B/$p (make first)"; exit 0; }
done
if [ $MPI = 1 ]; then
    for p in test_equivalence test_gpt mpi_steps train_gpt; do
        [ -x "$B/mpi/$p" ] || { MPI=0; echo "SKIP slurm_mpi: no $B/mpi/$p (built by make where mpicc is)"; break; }
    done
fi
S=$PWD/tools/slurm_hosts.sh
H=$PWD/tools/hosts.sh
export DDP_HOSTS_PREFIX=sl$(($$ % 100000))   # a cluster of our own: parallel runs never meet
why=$("$S" check)
if [ $? -eq 77 ]; then echo "SKIP slurm: $why"; exit 0; fi
tmp=$(mktemp -d)
trap '"$S" down; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
if ! "$S" up 2 >"$tmp/up.log" 2>&1; then echo "FAIL slurm_cluster_up: $(tail -n 5 "$tmp/up.log")"; exit 1; fi
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE DDP_JOB_TOKEN DDP_JOB_ID
export LSAN_OPTIONS=${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$PWD/tests/lsan_mpi.supp:print_suppressions=0
export OMPI_MCA_btl=tcp,self   # Open MPI's shared-memory files would outlive a killed host (test_mpi_hosts.sh)
export OMPI_MCA_btl_tcp_if_include=eth0
on1() { "$S" exec h1 "$@"; }
# Anything of a job left: processes in the hosts other than the daemons, files in their /dev/shm.
leftovers() {
    local h p c
    for h in h1 h2; do
        for p in $(ip netns pids "$DDP_HOSTS_PREFIX-$h" 2>/dev/null); do
            c=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)
            case $c in slurmd*|slurmctld*|*/slurmd*|*/slurmctld*|*slurmscriptd*|"") ;; *) echo -n "$h: pid $p ($c); " ;; esac
        done
        "$H" exec $h sh -c 'ls /dev/shm' 2>/dev/null | sed "s|^|$h: /dev/shm/|" | tr '\n' ' '
    done
}
ok_lines() { grep -c "^PASS $1" "$2"; }

# 1. One node, two tasks, the CPU build: the equivalence test (N ranks = 1 rank at N x batch,
#    bit-identical on every rank), its rendezvous found from srun's variables alone.
DDP_LOG=info on1 timeout $((120 * SLOW)) srun -N 1 -n 2 "$B/test_equivalence" >"$tmp/eq1.log" 2>&1
rc=$?
why=""
for c in ranks2_accum1_vs_1rank_batch32 ranks2_accum1_bitwise_identical_across_ranks ranks2_accum2_vs_1rank_batch32 \
         ranks2_accum2_bitwise_identical_across_ranks; do
    [ "$(ok_lines equivalence_$c "$tmp/eq1.log")" -ge 1 ] || why="$why; no PASS equivalence_$c"
done
for r in 0 1; do grep -q "rank $r info: rank $r of 2 up (cpu backend" "$tmp/eq1.log" || why="$why; rank $r not up"; done
grep -q "^FAIL" "$tmp/eq1.log" && why="$why; $(grep -m 2 '^FAIL' "$tmp/eq1.log")"
[ $rc -eq 0 ] || why="$why; srun exit $rc"
[ -z "$why" ] && pass slurm_srun_N1_n2_cpu_equivalence ||
    fail slurm_srun_N1_n2_cpu_equivalence "${why#; }: $(grep -v '^  (\|^PASS' "$tmp/eq1.log" | tail -n 4)"

# 2. Two nodes, the CPU build (srun -N 2 -n 4: nodes of 8 CPUs get 3 tasks and 1): every rank
#    refuses at once, saying the job spans hosts and how many of its ranks are on its own host
#    (from SLURM_STEP_TASKS_PER_NODE); srun fails.
t0=$(now)
on1 timeout $((60 * SLOW)) srun -N 2 -n 4 "$B/minimal" >"$tmp/span.log" 2>&1
rc=$?
t=$(secs "$t0" "$(now)")
why=""
for r in 0 1 2 3; do
    l=$(grep "^rank $r: the CPU backend needs every rank on one host, but WORLD_SIZE=4 and LOCAL_WORLD_SIZE=[0-9]: the job spans hosts (this rank on 'h[12]', rank 0's store on MASTER_ADDR h1)" "$tmp/span.log")
    [ -n "$l" ] || { why="$why; rank $r did not say so"; continue; }
    h=$(echo "$l" | sed -n "s/.*this rank on '\(h[12]\)'.*/\1/p")
    n=$(echo "$l" | sed -n 's/.*LOCAL_WORLD_SIZE=\([0-9]\).*/\1/p')
    on_h=$(grep -c "this rank on '$h'" "$tmp/span.log")
    [ "$n" = "$on_h" ] || why="$why; rank $r on $h says $n ranks there, $on_h are"
done
[ "$(grep -c "this rank on 'h1'" "$tmp/span.log")" -ge 1 ] && [ "$(grep -c "this rank on 'h2'" "$tmp/span.log")" -ge 1 ] ||
    why="$why; not on both hosts"
[ $rc -ne 0 ] || why="$why; srun exit 0"
lt "$t" $((15 * SLOW)) || why="$why; took ${t}s"
[ -z "$why" ] && pass "slurm_srun_N2_cpu_build_refused_by_name_on_every_rank (${t}s)" ||
    fail slurm_srun_N2_cpu_build_refused_by_name_on_every_rank "${why#; }: $(head -c 600 "$tmp/span.log")"

# 3. Two nodes x two tasks, the MPI build through PMIx: equivalence and the tiny GPT.
if [ $MPI = 1 ]; then
    DDP_LOG=info on1 timeout 120 srun --mpi=pmix -N 2 --ntasks-per-node=2 "$B/mpi/test_equivalence" >"$tmp/eq4.log" 2>&1
    rc=$?
    why=""
    for c in ranks4_accum1_vs_1rank_batch32 ranks4_accum1_bitwise_identical_across_ranks \
             ranks4_accum2_vs_1rank_batch32 ranks4_accum2_bitwise_identical_across_ranks; do
        [ "$(ok_lines equivalence_$c "$tmp/eq4.log")" -ge 1 ] || why="$why; no PASS equivalence_$c"
    done
    for r in 0 1 2 3; do
        grep -q "rank $r info: rank $r of 4 up (mpi backend, host h$((r / 2 + 1))," "$tmp/eq4.log" || why="$why; rank $r not up on h$((r / 2 + 1))"
    done
    grep -q "^FAIL" "$tmp/eq4.log" && why="$why; $(grep -m 2 '^FAIL' "$tmp/eq4.log")"
    [ $rc -eq 0 ] || why="$why; srun exit $rc"
    [ -z "$why" ] && pass slurm_srun_2nodes_x2_mpi_equivalence_bit_identical_on_every_rank ||
        fail slurm_srun_2nodes_x2_mpi_equivalence_bit_identical_on_every_rank "${why#; }: $(grep -v '^  (\|^PASS\| info: ' "$tmp/eq4.log" | tail -n 4)"

    on1 timeout 180 srun --mpi=pmix -N 2 --ntasks-per-node=2 "$B/mpi/test_gpt" >"$tmp/gpt.log" 2>&1
    rc=$?
    n=$(grep -c "^PASS " "$tmp/gpt.log")
    if [ $rc -eq 0 ] && [ "$n" -gt 0 ] && ! grep -q "^FAIL " "$tmp/gpt.log" &&
       grep -q "^PASS gpt_ranks4_batch2_accum1_equals_1rank_batch8" "$tmp/gpt.log"; then
        pass "slurm_srun_2nodes_x2_mpi_tiny_gpt ($n checks passed)"
    else fail slurm_srun_2nodes_x2_mpi_tiny_gpt "srun exit $rc: $(grep '^FAIL' "$tmp/gpt.log" | head -n 3; tail -n 3 "$tmp/gpt.log")"; fi
fi

# 4. Two steps of one job at once on one node (one MASTER_ADDR): each step its own job id and
#    port, so neither joins the other; both train to the end, and they did overlap in time.
steps=$((150 * SLOW))
on1 timeout $((120 * SLOW)) salloc -N 1 -n 4 sh -c "srun -n 2 --exact $B/test_fault $steps >$tmp/stepA.log 2>&1 & a=\$!
    srun -n 2 --exact $B/test_fault $steps >$tmp/stepB.log 2>&1 & b=\$!
    wait \$a; ra=\$?; wait \$b; echo \"rc \$ra \$?\" >$tmp/steps.rc" >"$tmp/salloc.log" 2>&1 &
job=$!
overlap=0
for _ in $(seq $((300 * SLOW))); do
    if grep -q "step 2$" "$tmp/stepA.log" 2>/dev/null && grep -q "step 2$" "$tmp/stepB.log" 2>/dev/null &&
       ! grep -q "step $((steps - 1))$" "$tmp/stepA.log" "$tmp/stepB.log" 2>/dev/null; then overlap=1; break; fi
    kill -0 $job 2>/dev/null || break
    sleep 0.1
done
wait $job
why=""
[ "$(cat "$tmp/steps.rc" 2>/dev/null)" = "rc 0 0" ] || why="$why; srun exits: $(cat "$tmp/steps.rc" 2>/dev/null)"
for s in A B; do
    [ "$(grep -c "step [0-9]*$" "$tmp/step$s.log")" = $((2 * steps)) ] || why="$why; step $s: $(grep -c "step [0-9]*$" "$tmp/step$s.log") step lines of $((2 * steps)): $(grep -v 'step [0-9]*$' "$tmp/step$s.log" | head -c 300)"
done
[ $overlap = 1 ] || why="$why; the steps did not run at the same time"
[ -z "$why" ] && pass slurm_two_steps_of_one_job_at_once_do_not_merge ||
    fail slurm_two_steps_of_one_job_at_once_do_not_merge "${why#; } $(tail -n 2 "$tmp/salloc.log")"

# 4b. A program started by the batch script itself, not srun (SLURM_NTASKS=2, no step): refused at
#     once by name, not a rank 0 waiting for a task that never comes.
t0=$(now)
on1 timeout $((60 * SLOW)) sbatch --wait -N 1 -n 2 -o "$tmp/batch_itself.out" -D "$PWD" --wrap "$B/minimal" >/dev/null 2>&1
rc=$?
t=$(secs "$t0" "$(now)")
if [ $rc -ne 0 ] && grep -q "SLURM_NTASKS=2, but this process of Slurm job [0-9]* was not started by srun" "$tmp/batch_itself.out" &&
   lt "$t" $((15 * SLOW)); then pass "slurm_program_in_the_batch_script_itself_refused_by_name (${t}s)"
else fail slurm_program_in_the_batch_script_itself_refused_by_name "sbatch exit $rc after ${t}s: $(head -c 300 "$tmp/batch_itself.out")"; fi

# 5. The sbatch example as a user runs it: the tiny GPT trainer, no MASTER_* anywhere; then a
#    long one cancelled with scancel: the job ends, nothing of it left on any host.
gpt=(--layers 1 --heads 2 --dim 32 --seq 16 --batch 2 --eval-batches 2 --sample 0)
data=$PWD/tests/README.md
if [ $MPI = 1 ]; then sb=(-N 2 --ntasks-per-node=2); train=$B/mpi/train_gpt; world=4
else sb=(-N 1 --ntasks-per-node=2); train=$B/train_gpt; world=2; fi
on1 env TRAIN="$PWD/$train" sbatch --wait "${sb[@]}" -o "$tmp/sbatch.out" -D "$PWD" examples/train_gpt.sbatch \
    --data "$data" "${gpt[@]}" --steps 4 --eval-every 4 >"$tmp/sbatch.log" 2>&1
rc=$?
# The same model as 1 rank at world x the batch (its validation loss, to float32 rounding across
# the different sums); the CPU build on one node: the same bits as ddprun's 2 ranks.
"$B/train_gpt" --data "$data" "${gpt[@]}" --batch $((2 * world)) --steps 4 --eval-every 4 >"$tmp/one.log" 2>&1
vl() { sed -n 's/.*done: step 4 | val loss \([0-9.]*\).*/\1/p' "$1"; }
why=""
[ $rc -eq 0 ] && grep -q "step     4/4 | loss" "$tmp/sbatch.out" && grep -q "train_gpt: $world rank(s)" "$tmp/sbatch.out" ||
    why="sbatch exit $rc: $(tail -n 4 "$tmp/sbatch.out" "$tmp/sbatch.log" 2>/dev/null)"
awk -v a="$(vl "$tmp/sbatch.out")" -v b="$(vl "$tmp/one.log")" 'BEGIN { exit !(a != "" && b != "" && a - b < 2e-4 && b - a < 2e-4) }' ||
    why="$why; val loss '$(vl "$tmp/sbatch.out")', 1 rank at ${world}x batch '$(vl "$tmp/one.log")'"
if [ $MPI = 0 ]; then
    "$B/ddprun" -n 2 "$B/train_gpt" --data "$data" "${gpt[@]}" --steps 4 --eval-every 4 >"$tmp/ddprun.log" 2>&1
    h1=$(grep -o 'params fnv1a [0-9a-f]*' "$tmp/sbatch.out"); h2=$(grep -o 'params fnv1a [0-9a-f]*' "$tmp/ddprun.log")
    [ -n "$h1" ] && [ "$h1" = "$h2" ] || why="$why; sbatch's '$h1', ddprun's '$h2'"
fi
[ -z "$why" ] && pass "slurm_sbatch_example_trains_the_gpt_on_${world}_ranks_as_1_rank_at_${world}x_batch" ||
    fail slurm_sbatch_example_trains_the_gpt "${why#; }"

jobid=$(on1 env TRAIN="$PWD/$train" sbatch --parsable "${sb[@]}" -o "$tmp/cancel.out" -D "$PWD" examples/train_gpt.sbatch \
    --data "$data" "${gpt[@]}" --steps 10000000 --eval-every 0 --log-every 50 2>"$tmp/cancel.log")
for _ in $(seq $((600 * SLOW))); do grep -q "step *100/" "$tmp/cancel.out" 2>/dev/null && break; sleep 0.1; done
t0=$(now)
on1 scancel "$jobid"
left="?"
for _ in $(seq $((150 * SLOW))); do   # the job's processes and segments gone
    state=$(on1 scontrol show job "$jobid" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    [ "$state" = CANCELLED ] && { left=$(leftovers); [ -z "$left" ] && break; }
    sleep 0.1
done
t=$(secs "$t0" "$(now)")
why=""
grep -q "step *100/" "$tmp/cancel.out" || why="$why; never trained: $(tail -n 3 "$tmp/cancel.out" "$tmp/cancel.log")"
[ "$state" = CANCELLED ] || why="$why; job $jobid is '$state'"
[ -z "$left" ] || why="$why; left: $left"
[ -z "$why" ] && pass "slurm_scancel_ends_the_job_nothing_left_on_any_host (${t}s)" ||
    fail slurm_scancel_ends_the_job_nothing_left_on_any_host "${why#; }"

# 6. A node killed mid-step: every process of h2 (slurmd, slurmstepd, ranks 2 and 3) SIGKILLed.
#    Ranks 0 and 1 name the lost rank and host within seconds (their store connection closes; a
#    peer's MPI_Abort may end one before it speaks: then the other must have named it), srun
#    exits non-zero, nothing is left running on h1.
if [ $MPI = 1 ]; then
    TMO=20
    mkdir -p "$tmp/kill"
    DDP_TIMEOUT=$TMO on1 timeout $((3 * TMO + 30)) srun --mpi=pmix -N 2 --ntasks-per-node=2 -o "$tmp/kill/rank%t.log" \
        "$B/mpi/mpi_steps" 120 >"$tmp/kill.srun.log" 2>&1 &
    job=$!
    for r in 0 1 2 3; do
        until grep -q "step .* ok" "$tmp/kill/rank$r.log" 2>/dev/null; do sleep 0.2; kill -0 $job 2>/dev/null || break 2; done
    done
    t0=$(now)
    "$H" kill h2
    wait $job
    rc=$?
    t=$(secs "$t0" "$(now)")
    why=""
    named=0
    for r in 0 1; do
        said=$(grep -v 'step\|^pid\|^\s*$' "$tmp/kill/rank$r.log" | head -c 300)
        if grep -q "rank [23] on host h2 died" "$tmp/kill/rank$r.log"; then named=$((named + 1))
        elif [ -n "$said" ]; then why="$why; rank $r said something else: $said"; fi
        tr=$(secs "$t0" "$(date -r "$tmp/kill/rank$r.log" +%s.%N)")
        lt "$tr" 5 || why="$why; rank $r's last word ${tr}s after the kill"
    done
    [ $named -ge 1 ] || why="$why; neither rank 0 nor rank 1 named h2: $(tail -c 300 "$tmp/kill/rank0.log")"
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || why="$why; srun exit $rc"
    lt "$t" $TMO || why="$why; srun took ${t}s"
    left=$(leftovers | tr ';' '\n' | grep '^ *h1' | tr '\n' ';')
    [ -z "$left" ] || why="$why; left on h1: $left"
    [ -z "$why" ] && pass "slurm_node_killed_mid_step_survivors_name_it_srun_fails (srun ${t}s; timeout ${TMO}s)" ||
        fail slurm_node_killed_mid_step_survivors_name_it_srun_fails "${why#; } [srun: $(tail -n 3 "$tmp/kill.srun.log" | tr '\n' ' ')]"
fi
[ -n "${SLURM_TEST_KEEP:-}" ] && cp -r "$tmp" "$SLURM_TEST_KEEP"   # the logs, to look at
[ $fails -eq 0 ]
