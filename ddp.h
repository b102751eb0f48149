/* ddp.h — data-parallel training for C, in one header.

   Replicate the model on every rank, give each rank its own slice of the batch, average the
   gradients with an allreduce that runs while the backward pass is still computing, and take
   the same AdamW step everywhere. N ranks at batch B train the model one rank trains at batch
   N*B (the same arithmetic summed in another order: equal to float rounding, the ranks bit-
   identical) — only faster.

   CONTENTS
     QUICK START · ONE STEP, AS DATA FLOWS · OWN AUTOGRAD · MEMORY LAYOUT AND OVERLAP ·
     STRAGGLERS · FAST MATH · STRUCTS ACROSS VERSIONS · OPTIONS · ADAMW · SHARDED OPTIMIZER (ZeRO-1) ·
     SHARDED GRADIENTS (ZeRO-2) · SHARDED PARAMETERS (ZeRO-3, FSDP) · HYBRID SHARDING ·
     PARAMETER DTYPE (bf16 parameters, fp32 master weights) · OUTER SYNC (replica groups,
     DiLoCo, streaming DiLoCo) · CHECKPOINTS · BACKENDS ·
     ENVIRONMENT · JOB IDENTITY · ERRORS · NULL, LIFETIME AND THREADS · EMBEDDING: CANCEL,
     PROGRESS, UNEVEN INPUTS · SAMPLER · PLATFORMS (Linux, Windows, macOS) · COMPILE-TIME
     OPTIONS · THE IMPLEMENTATION, SECTION BY SECTION
   This manual is the reference. The guide: README.md; the reasons behind the design:
   docs/design.md; measurements: bench/RESULTS.md.

   QUICK START
       #define DDP_IMPLEMENTATION          // in exactly one .c file, before any other #include
       #include "ddp.h"

       ddp_context *ddp;
       if (ddp_init(&ddp, NULL) != DDP_OK) { fprintf(stderr, "%s\n", ddp_last_error(ddp)); ... }
       int w = -1;
       ddp_register_param(ddp, "w", 1024, 0, w_init, &w);  // name, floats, flags, initial values
       ddp_commit(ddp);                     // flat buffers, buckets, rank 0's values everywhere
       for (int step = 0; step < steps; step++) {
           ddp_zero_grad(ddp);
           forward(...);                    // ops read ddp_param(ddp, w), record their backward
                                            // with ddp_tape_record(..., &w, 1)
           ddp_backward(ddp);               // replay the tape; buckets reduce while it runs
           ddp_adamw_step(ddp, &opt, NULL); // identical step on every rank
       }
       ddp_shutdown(ddp);                   // frees the context

   Launch with the bundled `ddprun -n 4 ./train`, or torchrun, mpirun, srun (see README.md).
   With no launcher environment at all the program is a single rank that needs no network.

   ONE STEP, AS DATA FLOWS
     ddp_commit lays every parameter out in ONE flat parameter buffer and ONE flat gradient
     buffer. Buckets are contiguous ranges of the gradient buffer in reverse registration order
     (a small first bucket, then up to bucket_cap_mb each, never splitting a parameter), so a
     gradient *is* a view into its bucket and nothing is ever copied into a bucket.
     During backward, when the op that finalizes a parameter's gradient has run, the parameter
     is marked ready; when a bucket's last parameter is ready the bucket is handed to the
     backend, which averages it across ranks while backward goes on. Buckets are launched in
     bucket order on every rank. ddp_finish (called by ddp_backward) launches what is left and
     waits for the rest. A program with its own autograd calls ddp_grad_ready and ddp_finish
     (OWN AUTOGRAD below).
     Gradient accumulation: ddp_set_sync(ddp, 0) for micro-steps 0..k-2 (nothing is sent), 1
     for the last. ddp_adamw_step takes averaged gradients only: with no ddp_finish (sync on)
     since the last step, or after a backward with sync off, it fails (DDP_ERR_INVALID_STATE)
     and changes nothing, at every world size, so that one rank finds the mistake too.

   OWN AUTOGRAD (no tape; examples/own_autograd.c, README.md "Your own autograd")
     ddp_zero_grad (a memset of ddp_flat_grads is the same only on host backends with fp32
     parameters; ddp_zero_grad also resets find_unused's and ddp_join's marks), the program's
     backward adding into the ddp_grad views, ddp_grad_ready(id) once for EVERY parameter in
     EVERY backward (micro-steps too) as soon as its gradient is final, in any order (buckets
     launch in bucket order on every rank, so the order changes the overlap, never the result),
     then ddp_finish. Never marked: DDP_ERR_UNUSED_PARAMETER "never marked ready (ddp_grad_ready)"
     (find_unused zero-fills instead); twice: DDP_ERR_DOUBLE_READY. The messages say ops only
     when the backward is the tape's (ctx->tape.replaying). The program's own optimizer on
     ddp_flat_params / ddp_flat_grads calls ddp_consume_grads first: the guard ddp_adamw_step
     has (DDP_ERR_INVALID_STATE unless a synchronizing ddp_finish averaged the gradients since the
     last step; each average is used once, by either). It loses the NaN check and the fixed-order
     norm; refused (at every world size) with shard_optimizer and with bf16 parameters (the
     master and its working copies move together only in ddp_adamw_step). backward_ms starts at
     the first ready call. An fp32 view (ddp_param, ddp_grad, ddp_flat_grads) of bf16 parameters
     is NULL with an error; when DDP_PARAM_DTYPE made them bf16 the log says so too (once, as an
     error), so a program that does not check the NULL still tells why it stopped.

   MEMORY LAYOUT AND OVERLAP
     Parameter i (registration order) starts at sum_{j<i} round_up(count_j, DDP_PARAM_ALIGN_FLOATS)
     floats of ddp_flat_params (16: 64 bytes; the buffer is 64-byte aligned); padding is zero;
     ddp_flat_grads and the bf16 buffers have the same offsets; nothing moves until ddp_shutdown.
     Buckets are contiguous, in reverse registration order, sent when their last parameter is
     ready: a tensor stacking every layer is ready only when the backward ends (no overlap;
     README.md "Memory layout and overlap"). DDP_LOG=info prints the bucket plan
     at ddp_commit (rank 0); the first synchronizing backward (2+ ranks, 2+ buckets) whose first
     bucket was complete only at its last moment (the last tape op, or the last ddp_grad_ready
     call: ddp.h counts those, it cannot see compute) warns once (>>step, ddp__overlap_check);
     without a tape, ready calls back to back count as several moments, so a first bucket
     complete under 2% of the step (since the previous ddp_finish, >= 1 ms) before ddp_finish is
     warned too, with the measured times.

   STRAGGLERS (ddp_step_stats; tests/test_straggler.c; README.md "Stragglers")
     A synchronizing step waits for its slowest rank: at each exchange (every gradient bucket,
     and with uneven_inputs the count of the ranks with data that begins the step) every rank
     waits until the last one's gradients are final. ddp_last_step_stats says, per step:
       slowest_rank             the rank that arrived last at the exchange whose arrivals spread
                                most (the same on every rank; this rank itself when it kept the
                                others waiting); -1: not known (below)
       straggler_wait_ms        this rank's waits for the last arrival, summed over the step's
                                exchanges (part of it may hide under this rank's own backward:
                                exposed_ms says what reached the step)
       straggler_first_wait_ms  the first exchange's part: what a slower forward, backward or data
                                loading on another rank cost this rank
       straggler_spread_ms      last arrival minus first, summed over the exchanges: what the
                                straggler cost the rank that waited most (an upper bound where
                                different ranks came first at different buckets)
     So rank 0 alone, with no collective, can say "rank 3 costs the others 30% of the step"
     (examples/gpt/train_gpt.c --straggler-pct). With timeline_path the waits of 0.1 ms or more
     are events "wait for rank N" (category "straggler", args bucket and rank; bucket -1: the
     uneven-inputs count) on the comm lane.
     How each backend knows (no collective, no system call added to a step):
       cpu     each rank writes its arrival (one clock: the ranks share a host) into its block of
               the segment before it posts the exchange (the clock value it had read; the
               block's cache line is one the signature check reads anyway); once every rank has
               posted, all arrivals are there: exact, the same numbers on every rank.
       mpi     within a host as cpu. Across hosts the exchange's signature check (an
               MPI_Allgather of a few words each bucket already; 3 words more, 2 clock reads)
               carries each member's arrival counted from the end of the previous signature
               check on that communicator (all members left it together, within one network
               latency: a common zero without a common clock), its host's last arrival and
               spread; the host leaders relay the result to their host's ranks through the
               segment. Error: about one latency of the network. The job's first exchange has
               no zero yet: its hosts' parts only.
       nccl    not known (-1, zeros): the wait is inside NCCL's kernels on the GPU, which tell no
               arrival; it shows as a longer first bucket in comm_ms and on the timeline's comm
               lane. Naming the rank would need a host exchange of step times each step (a host
               wait the NCCL path avoids): a program can allgather its own times if it wants that.
       single  no peers: -1. A step with sync off exchanges nothing: -1 and zeros.

   FAST MATH (-Ofast, -ffast-math, nvcc --use_fast_math; tests/test_fastmath.c)
     Non-finite values are found by their bits (exponent all ones: ddp__finite_f/_d/_bf16 in
     >>util, ddp_k__finite_d in ddp_kernels.cuh), never by isfinite(); so NaN/Inf gradients still
     give DDP_ERR_NONFINITE with the parameters unchanged everywhere, and NaN options are still
     refused. Still true under fast math: the same bits on every rank (one binary on every rank),
     N ranks = 1 rank at N x batch to float rounding. Not: PyTorch's rounding, the documented
     summation order of the norm (reassociation), bits equal to a build without fast math or
     between CPU and GPU, subnormals (flushed to zero: in ddp_kernels.cuh the only change).

   STRUCTS ACROSS VERSIONS
     Public structs only grow (fields appended); a new field's zero is the old behaviour: zero-
     initialize (= {0}, memset, designated initializers), set what you use. Every flag field
     must be 0 or 1, every enum in range, no number NaN, else DDP_ERR_INVALID_ARGUMENT naming the
     field and saying "zero-initialize the struct" (ddp_desc: ddp__desc_check_given before the
     environment and defaults; ddp_adamw.as_given; ddp_sampler's shuffle and drop_last; the
     cancel token's state).

   OPTIONS (ddp_desc; zero means default; the resolved values: ddp_config(); ($DDP_X): a variable
   that, when set, wins over the field: ENVIRONMENT)
     backend          DDP_BACKEND_AUTO     which backend runs (BACKENDS below); ddp_config()->
                                           backend says which one did. AUTO = NCCL when built
                                           with CUDA and a GPU is visible, else SINGLE for one
                                           rank, MPI when built with DDP_MPI and the ranks span
                                           hosts (LOCAL_WORLD_SIZE < WORLD_SIZE), CPU for several
     timeout_s        300 ($DDP_TIMEOUT)   longest wait for a peer before DDP_ERR_TIMEOUT (a
                                           dead peer is noticed much sooner: ERRORS); at most
                                           1e6 s: no wait is infinite (nor MASTER_ADDR's name
                                           lookup: a silent nameserver ends there, by name)
     bucket_cap_mb    25                   bucket size cap in MiB
     first_bucket_mb  1                    the first bucket (last parameters) is kept small so
                                           communication starts early
     find_unused      0                    1: parameters without a gradient are zero-filled and
                                           reduced; 0: they are an error that names them
     skip_nonfinite   0                    what ddp_adamw_step does with NaN/Inf gradients: 0 =
                                           DDP_ERR_NONFINITE naming the step and parameter, 1 =
                                           skip the step (a warning); either way nothing changes,
                                           on every rank alike (the averaged gradients are equal)
     check_ready      0 ($DDP_CHECK_READY) 1: a debugging run on one rank (host memory) checks
                                           that no gradient changes after it is marked ready
                                           (a tape op listing a parameter too late); the error
                                           names it. Costs a copy of the gradients
     world_size, rank, local_rank, local_world_size, master_addr, master_port, job_token
                                           set world_size > 0 to give the process group by hand
                                           instead of through the environment (ranks as threads
                                           of one process: one context per thread)
     job_id           the launcher's       which job this rank belongs to; a rank of another job
                      ($DDP_JOB_ID)        is refused at the rendezvous (see JOB IDENTITY)
     shutdown_timeout_s  1                 after a failure, the longest ddp_shutdown lingers so
                                           peers still reading rank 0's store get the verdict;
                                           it stops as soon as every peer has hung up (a hung
                                           peer costs at most this)
     log, log_user, log_level              logger callback (default: stderr), threshold
                                           (default DDP_LOG_WARN; $DDP_LOG=debug|info|warn|
                                           error|off)
     timeline_path    $DDP_TIMELINE        record every step (forward, each backward op, bucket
                                           ready, each allreduce, the wait, AdamW) and write ONE
                                           Chrome/Perfetto trace of all ranks at ddp_shutdown
                                           (tools/trace_svg.py draws it); costs nothing when off.
                                           NCCL: the comm lane from CUDA events, plus per step
                                           "backward (gpu)" and "exposed comm (gpu)" (README.md,
                                           "Seeing the overlap"); cpu and mpi: the waits for a
                                           straggler, "wait for rank N" (STRAGGLERS)
     inject_comm_latency_ms, inject_comm_gbps
                                           benchmarks/tests only: allreduces also take as long as
                                           a network of that latency and bandwidth would (NCCL: a
                                           spin kernel on the comm stream before each bucket)
     reduce_dtype     param_dtype          DDP_DTYPE_BF16: gradient buckets travel as bf16 (half
                                           the bytes; inputs and average rounded to nearest even,
                                           result written back into the gradients, the same
                                           bits on every rank); every backend; ranks must agree.
                                           FP32 with bf16 parameters: PARAMETER DTYPE
     param_dtype      DDP_DTYPE_FP32       DDP_DTYPE_BF16: bf16 working copies and gradients, fp32
                      ($DDP_PARAM_DTYPE    master weights and moments (PARAMETER DTYPE below);
                      = fp32|bf16)         ranks must agree
     cuda_stream      NULL                 NCCL: the program's compute stream (a cudaStream_t),
                                           created on this rank's GPU (LOCAL_RANK % device
                                           count: cudaSetDevice first); NULL = the legacy
                                           default stream
     cancel_token     NULL                 a ddp_cancel_token the host program owns; setting it
                                           cancels every context that holds it (EMBEDDING)
     uneven_inputs    DDP_JOIN_OFF         DDP_JOIN_DIVIDE_BY_WORLD or _BY_ACTIVE: ranks may run
                                           out of data and ddp_join (EMBEDDING); ranks must agree
     shard_optimizer  0 ($DDP_SHARD_       1: ZeRO stage 1, AdamW's m and v split across the ranks
                      OPTIMIZER)           (with outer: a group's ranks; SHARDED OPTIMIZER below);
                                           the same bits as 0; ranks
                                           must agree
     shard            DDP_SHARD_DEFAULT    the sharding level: NONE, OPTIMIZER (= shard_optimizer
                      ($DDP_SHARD)         1), GRADIENTS (ZeRO-2), PARAMETERS (ZeRO-3); DEFAULT:
                                           as shard_optimizer says; ranks must agree
     shard_group      0 ($DDP_SHARD_GROUP) the ranks a shard spans: 0 every rank (with outer:
                                           the replica group); N: hybrid, within N consecutive
                                           ranks, replicated across (HYBRID SHARDING); N
                                           divides the world; 1: DDP
     shard_accumulate 0 ($DDP_SHARD_      shard GRADIENTS only: 1 reduce-scatters every micro-
                      ACCUMULATE)          step (sync off too) into an fp32 accumulator of this
                                           rank's parts (SHARDED GRADIENTS); ranks must agree
     shard_prefetch_off 0 ($DDP_SHARD_    shard PARAMETERS: 1 turns the next unit's prefetch
                      PREFETCH=on|off)     off (one unit gathered at a time: less memory, no
                                           overlap; SHARDED PARAMETERS); the same bits either way
     outer            mode DDP_OUTER_OFF   replica groups and their outer sync: DiLoCo,
                                           streaming DiLoCo, periodic averaging (OUTER SYNC);
                                           ranks must agree

   ADAMW (ddp_adamw; ddp_adamw_step(ddp, &opt, &norm or NULL))
     lr as given (0 is valid); beta1, beta2, eps: 0 means 0.9, 0.999, 1e-8 unless as_given = 1,
     which uses all three exactly as given (beta1 = 0 included); weight_decay: decoupled,
     skipped for parameters registered with DDP_NO_DECAY; max_grad_norm > 0: clip by the global
     L2 norm first (computed in double, in a fixed order: the same bits on every rank, on every
     backend, sharded or not: the sum of squares of each block of 1024 floats of each bucket,
     eight running sums in element order; then the blocks, numbered in bucket order then block
     order, added as 256 running sums (block i into sum i mod 256) and those in order).
     What matches torch.optim.AdamW: the formula (m, v, bias corrections 1 - beta^t, eps added
     to sqrt(v_hat), the decoupled decay lr * wd * p, applied before the Adam update), and the
     clipping of torch.nn.utils.clip_grad_norm_ (scale max / (norm + 1e-6) when norm > max).
     What does not: rounding. ddp.h computes p -= lr*wd*p where torch computes p *= 1 - lr*wd,
     and divides by sqrt(v)/sqrt(1 - beta2^t) + eps in float (docs/design.md: how far apart).
     ddp_adamw_state gives m, v and the step count (for checkpoints);
     ddp_copy_to_host / ddp_copy_from_host copy any flat buffer to and from host memory on
     every backend; ddp_gather_to_host / ddp_scatter_from_host (collective) move a range between
     the ranks that hold it and one rank's host memory.

   SHARDED OPTIMIZER (ZeRO-1; ddp_desc.shard_optimizer = 1 or DDP_SHARD_OPTIMIZER=1)
     What: every rank keeps the parameters and the gradients whole, but AdamW's m and v only for
     its own part of each bucket. A synchronizing step reduce-scatters each bucket instead of
     averaging all of it (only this rank's part of ddp_flat_grads holds the average afterwards;
     the rest keeps this rank's own gradients); ddp_adamw_step updates this rank's parts and
     all-gathers the parameters bucket by bucket, so every rank ends the step with the same
     parameters, bit for bit those of an unsharded run (tests/test_shard.c, 1-4 ranks).
     Layout (per bucket: docs/design.md says why): rank s owns floats [s*P, (s+1)*P) of a
     bucket, P = its 1/world share rounded down to 1024 floats, and the last rank also the tail
     up to the bucket's end; a bucket under world*1024 floats belongs to the last rank whole. No
     padding: the flat layout, and so every offset, is the same sharded or not at any world size.
     NCCL: the equal parts through ncclReduceScatter / ncclAllGather in place, the tail through
     one ncclReduce to, and one ncclBroadcast from, the last rank.
     Replica groups (desc.outer, OUTER SYNC): the state is sharded within each group, across its
     S ranks, by the same rule with world -> S (member s of every group holds the same parts);
     every sharded exchange stays in the group, as its buckets do (the reduce-scatter, the
     norm's blocks, skip_nonfinite's verdict, which is the group's, and the all-gather; a group
     that skips a step still gathers, unchanged values, so the groups keep in step). Groups of
     one rank: shard_optimizer is a no-op there (nothing to shard across; as on one rank), m
     and v stay whole. ddp_gather_to_host takes each part from the root's group;
     ddp_scatter_from_host gives each part to its holder in every group.
     The norm: blocks of 1024 floats never straddle two owners; each rank sums the squares of its
     own blocks, the block sums reach every rank unchanged, and every rank adds all blocks in
     order: the norm is bit-identical to the unsharded one (ADAMW above).
     m and v: ddp_adamw_state's m and v point to this rank's parts, packed in flat order
     (the shard's count of floats: ddp_flat_params' count_out when parameters are fp32; unsharded
     m[i] is flat element i). ddp_copy_to_host /
     _from_host of DDP_ADAM_M / _V take flat offsets and accept a range that lies in one of this
     rank's parts; any other is refused by name ("not all held by rank R"). ddp_gather_to_host /
     ddp_scatter_from_host (collective) reach any range: each part travels from or to its owner
     (m, v and, gathered, the averaged gradients; fp32 parameters are everywhere; with bf16
     parameters the fp32 master is in parts too: PARAMETER DTYPE).
     Memory per parameter and rank: 4 (parameters) + 4 (gradients) + 8/world (m, v) bytes,
     against 16 unsharded (plus the CPU backend's shared segment: its parameters and gradients
     ARE the flat buffers, nothing more). reduce_dtype BF16, find_unused, skip_nonfinite,
     accumulation, clipping, the outer sync: supported, same bits. uneven_inputs (ddp_join):
     supported, same bits (a joined rank steps its parts with the others' options: EMBEDDING).
     CPU: the parameters live in the shared segment beside the gradients, and each peer's part
     is copied from the peer's parameters; without the segment (DDP_STAGED_GRADS, no room in
     /dev/shm) the buckets are averaged whole and the parts travel by broadcast: the same bits,
     slower. NCCL: no host wait, as unsharded. MPI: fp32 buckets are averaged whole by the
     hierarchical path (no hosts' reduce-scatter in its order), bf16 ones reduce-scattered among
     all ranks; the norm's blocks by one MPI_Allreduce (each non-zero on its owner only), each
     bucket's parts by MPI_Allgatherv after its update (BACKENDS). The gather does not overlap
     the next forward. How each backend runs the step: docs/design.md.

   SHARDED GRADIENTS (ZeRO-2; ddp_desc.shard = DDP_SHARD_GRADIENTS, or DDP_SHARD=gradients)
     What: ZeRO-1 (above: the parts, the reduce-scatter, m, v and the master in parts, the norm's
     blocks, the all-gather), and the gradients: once a bucket's reduce-scatter is settled (every
     member of the team has read this rank's values of it), this rank's gradients outside its
     part of the bucket are RELEASED: their pages given back to the system (ddp__pages_punch in
     >>platform), so they read as zeros and cost nothing until the next backward writes them.
     The views never move: ddp_grad(id), ddp_flat_grads and the bf16 accessors return the same
     addresses for the whole run; released pages come back, zeroed, as the backward writes them.
     Only whole pages strictly inside a released range go (a part is 1024 floats, 4 KiB, aligned
     but at a bucket's ends): the bytes of a page shared with a neighbour are zeroed instead, at
     most 3 pages a bucket stay resident. Same bits as unsharded training (tests/test_zero2.c,
     1-4 ranks: fp32, accumulation, find_unused, skip_nonfinite, a bf16 wire, the staged path,
     bf16 parameters, clipping; the released pages not resident by mincore).
     Memory per parameter and rank: fp32 parameters 4 + 4/world (gradients) + 8/world (m, v) =
     4 + 12/world bytes (10 on 2 ranks, 7 on 4, against 12 and 10 for ZeRO-1 and 16 unsharded);
     bf16 parameters 2 + 2/world + 12/world (master, m, v) = 2 + 14/world (9, 5.5). Plus, during a
     backward, the gradients of the buckets not settled yet: the one the backward writes and the
     one being reduced (about 2 * bucket_cap_mb, the pages across part and bucket ends).
     When: after a synchronizing bucket's reduce-scatter, on the backend's communication thread
     (the reduce-scatter is each part's owner reading every member's values: released once all
     have read); ddp_zero_grad releases every bucket whole instead of a memset (which would fault
     every page back in). find_unused's zero-fill and a backward write released pages like any
     other; skip_nonfinite's search for the culprit reads this rank's parts only.
     Reading them: after a step only this rank's parts hold gradients (the averages), the rest
     reads zeros; ddp_copy_to_host of DDP_GRADS takes a range inside one of this rank's parts and
     refuses any other by name ("not all held by rank R"; ddp_copy_from_host writes anywhere);
     ddp_gather_to_host reaches any range through its owners.
     Accumulation (sync off) costs memory by default: each rank adds its micro-steps into its
     whole gradients, kept until the synchronizing micro-step reduce-scatters them (PyTorch's
     no_sync does the same; the bits of unsharded accumulation): 4 (bf16: 2) bytes a parameter
     more while accumulating. The cheaper choice, desc.shard_accumulate = 1
     (DDP_SHARD_ACCUMULATE=1): every micro-step's buckets are reduce-scattered, sync off too
     (find_unused and the ready rules then hold at every micro-step), this rank's part is added
     in float into an accumulator of its parts (4/world bytes a parameter, allocated at commit)
     and the whole bucket released at once; the synchronizing micro-step leaves accumulator +
     its own average in the part, where AdamW, the norm and ddp_gather_to_host read it. Costs a
     reduce-scatter per micro-step (k times the traffic for k micro-steps) and saves the
     gradients' memory between micro-steps (only the buckets in flight). Its sum, over micro-
     steps of the ranks' averages, is another order than unsharded accumulation's (the average of
     each rank's sum): within float rounding of it, not its bits (tests/test_zero2.c: within
     u (1 + (k-1)/world) sum |g| of a float64 reference, u = 2^-24), the same bits on every rank;
     bf16 gradients are widened into it and rounded once at the end. Without sync off (one
     micro-step) it is plain ZeRO-2. Every backend that runs ZeRO-2 runs it (CPU, MPI, NCCL:
     the same bits on each, below); not with hybrid sharding (shard_group) nor under
     PARAMETERS, refused by name.
     Checkpoints: as ZeRO-1 (the gradients are not in them): saved at any level and world size,
     loaded at any other, the same continuation (tests/test_zero2.c save / load).
     Backends: CPU: the gradients live in the shared gradient segment (>>cpu-grads), released by
     MADV_REMOVE (the hole punched in the segment: the pages leave /dev/shm for every rank that
     maps it; writing them again takes pages of /dev/shm again: a /dev/shm filled by something
     else meanwhile is SIGBUS, as for any shared memory that grows); without the segment
     (DDP_STAGED_GRADS) private memory, MADV_DONTNEED. MPI: the gradients are the rank's private
     memory (MADV_DONTNEED), released once the bucket's MPI calls have returned
     (tests/test_zero2_mpi.sh, hierarchical and flat). NCCL: the gradients (fp32, or bf16 with
     bf16 parameters) are one device address range reserved at commit and backed granule by
     granule (CUDA's virtual memory management: cuMemAddressReserve / cuMemCreate / cuMemMap /
     cuMemUnmap, taken from the driver through cudaGetDriverEntryPointByVersion: no -lcuda; a
     driver without them is named at ddp_commit). This rank's parts stay mapped for the whole run;
     ddp_zero_grad maps the rest again and zeroes the buffer (cudaMemsetAsync on the compute
     stream); the end of ddp_adamw_step, its kernels and all-gathers enqueued, unmaps what lies
     outside this rank's parts of every bucket reduce-scattered that step. That waits (polled, with
     timeout_s) for an event recorded on the compute stream when the step began: the backward, the
     reduce-scatters and the program's own kernels before the step are done with the gradients,
     while the device still has the step's norm, AdamW and all-gathers queued (not at ddp_finish:
     a host wait there would hold the host back while the network works, and until the step every
     gradient address stays valid for the program's kernels). So between ddp_adamw_step and the
     next ddp_zero_grad the gradients outside this rank's parts are not mapped: a kernel of the
     program that touches them there faults (ddp_copy_to_host refuses them by name, as on the
     CPU); a backward that begins without ddp_zero_grad maps them again, zeroed, when ddp.h first
     sees it (the tape: before its first op; by hand: call ddp_zero_grad before the backward's
     kernels, the usual loop). The granularity (2 MiB on current GPUs) is the cost: a granule
     that a part shares with the rest stays mapped, up to 2 granules a bucket part (2 * granule *
     buckets bytes above the formula; the buckets' spans tile the buffer, so a granule two
     buckets share goes when both are released). Micro-steps with sync off keep whole gradients
     (as on the CPU). With shard_accumulate each micro-step's buckets are reduce-scattered on the
     comm stream as a synchronizing step's, and this rank's part goes into a device accumulator
     (4/world bytes a parameter, cudaMalloc'd at commit) by ddp_k_accumulate on the same stream:
     the CPU's adds in the CPU's order (the first micro-step copies, the next add, the
     synchronizing one leaves accumulator + its average in the part; bf16 gradients widened,
     rounded once), so the same bits as the CPU backend's shard_accumulate (and the bf16 wire,
     bf16 parameters, find_unused, clipping and skip_nonfinite as in plain ZeRO-2: they read the
     parts at the step). A micro-step with sync off ends (ddp_finish) by zeroing the granules
     touching this rank's parts on the compute stream and unmapping the rest, after a host wait
     for the compute stream (the backward, every reduce-scatter and accumulation): between
     micro-steps only the parts' granules hold device memory, and the gradients read zeros, as
     on the CPU. The price: a reduce-scatter per micro-step and that host wait at its end (the
     host cannot enqueue the next forward while the last bucket is on the wire). They are mapped
     again, zeroed: with the tape by ddp_backward before its first op (so the next forward runs
     without them); by hand by ddp_set_sync (the call every accumulation loop makes before a
     micro-step: make it after the forward and before the backward's kernels, and the forward
     runs without them), unless the last micro-step's backward was the tape's. A program's own
     backward that writes gradients before either faults on the unmapped range. Out of device
     memory there: named in ddp_last_error (and logged: ddp_set_sync returns nothing), nothing
     changes; the backward's start (ddp_backward, the first ddp_grad_ready) tries again, and a
     failure there fails the context (as for a backward begun without ddp_zero_grad after a step). Replica groups of several ranks:
     refused with any shard level on NCCL (as ZeRO-1); one group of every rank, hybrid sharding
     (shard_group): the same release of the team's parts. Tests: tests/test_fake_nccl.c on the
     fake GPU (tests/fakegpu: its VMM is mmap'd, a granularity knob), ZeRO-2 = unsharded bit for
     bit on 1-4 ranks with the device bytes after each step by formula; shard_accumulate = the
     CPU backend's bit for bit on 1-4 ranks (bf16 wire, bf16 parameters, an unused parameter),
     the device bytes between micro-steps by formula, a full device at ddp_set_sync named;
     ddp_k_accumulate against the CPU's loop in tests/gpu (host math; on a GPU). Not yet
     measured on a GPU. Windows: released gradients are zeroed and
     stay resident (a mapped view cannot give its pages back and keep zeros: >>platform); a
     POSIX system without MADV_REMOVE (macOS) likewise for the segment. uneven_inputs: as ZeRO-1
     (every backend; with shard_accumulate refused by name: each micro-step's reduce-scatter
     would need the joined ranks, which answer synchronizing steps only). With replica groups (desc.outer) the parts and their release are the team's;
     with hybrid sharding (HYBRID SHARDING) the shard group's (a rank's buffer outside its part is
     free once the bucket's function returns); shard_accumulate with shard_group: refused by name.

   SHARDED PARAMETERS (ZeRO-3, FSDP; ddp_desc.shard = DDP_SHARD_PARAMETERS or DDP_SHARD=parameters)
     What: ZeRO-1 (above: m, v and the bf16 master in parts; each bucket reduce-scattered; the
     norm's blocks) and the parameters in parts too. Each rank keeps its parts of the parameters
     (its owner storage; the bf16 working copies with bf16 parameters, the fp32 master packed as
     under ZeRO-1), and AdamW updates them in place: no all-gather after the step. The program
     groups parameters into units and gathers a unit before its forward and releases it after;
     the tape's backward gathers them again itself. Same bits as unsharded training on 1-4 ranks
     with the tape or without, accumulation, bf16, clipping, find_unused, skip_nonfinite, and
     checkpoints saved at one level and world size, loaded at another (tests/test_zero3.c).
       int u;
       ddp_register_param(ddp, "l0.W", ...); ddp_register_param(ddp, "l0.b", ...);
       ddp_register_unit(ddp, "layer0", first_id, 2, &u);   // ids first_id, first_id + 1
       ...
       ddp_commit(ddp);
       forward: ddp_unit_gather(ddp, u); ddp_unit_prefetch(ddp, u + 1);  // the next copy overlaps
                ... read ddp_param(ddp, id), ddp_tape_record(...) ...;  ddp_unit_release(ddp, u);
       ddp_backward(ddp);                                     // gathers, prefetches, releases
       ddp_adamw_step(ddp, &opt, NULL);
     Units: ddp_register_unit(ctx, name, first_id, num_params, &unit) before ddp_commit, a run of
     consecutive registration ids (so one contiguous range of the flat buffer); declared at any
     level (gather, prefetch and release do nothing below PARAMETERS, so a program declares them
     once and runs at every level). Declared units cut the buckets at their boundaries, at every
     level (a unit is cut into several buckets at the cap; no bucket spans two units), so every
     level has the same buckets and the same bits. Refused by name: a unit that overlaps another
     (naming the parameter in both), an empty unit, ids not registered yet, a unit after
     ddp_commit, a duplicate name; at ddp_commit under PARAMETERS, a parameter in no unit.
     Pointers never move: ddp_param / ddp_param_bf16 / ddp_flat_params (fp32; with bf16 it is the
     master, as below PARAMETERS) / ddp_flat_params_bf16 return the same address for the whole
     run. The flat parameter buffer is an address range reserved once (>>platform's address
     space: mmap PROT_NONE + MAP_NORESERVE; Windows VirtualAlloc MEM_RESERVE); a unit's pages
     are committed when it is gathered and its parameters copied there from every owner's
     parts, and decommitted when it is released: the contents are gone and a touch faults
     (SIGSEGV; Windows an access violation). Neighbouring units share at most the page at their
     boundary (no padding is added: the layout is the same at every level), which stays while
     either is gathered; its bytes of a released neighbour read as stale values, not a fault.
     Gather, prefetch, release: ddp_unit_gather returns once the unit is whole (waiting for its
     prefetch if one is in flight); ddp_unit_prefetch starts the copy on the prefetch thread;
     ddp_unit_release decommits (after waiting for a prefetch in flight). A gather of a gathered
     unit does nothing; a release of a released one is an error. ddp_unit_gathered says.
     Prefetch off (desc.shard_prefetch_off = 1, DDP_SHARD_PREFETCH=off; a rank's own choice):
     ddp_unit_prefetch does nothing (no prefetch thread is started) and the tape's backward
     gathers each unit only when its first op replays, so at most one unit (plus any the
     program keeps) is gathered at a time instead of two, and no copy overlaps compute. The
     same bits. Turn it off when memory is what limits (the gathered share below halves for a
     layer-by-layer program); keep it on for speed (bench/RESULTS.md measures both).
     On the CPU backend a gather is local copies: every rank's parts live in the shared segment
     beside the gradients (each rank keeps pages only for its own parts), so a rank reads its
     peers' parts directly, with no exchange and no wait; the prefetch runs on this level's own
     thread (the communication thread keeps the buckets). The parts change only inside
     ddp_adamw_step, which ends with a barrier; ddp_commit and a load of parameters
     (ddp_scatter_from_host, ddp_load) end with one too, so a gather never reads a part mid-update.
     The tape: ddp_backward replays ops last to first; before op i it gathers the units of the
     parameter ids op i lists (so an op must list every parameter whose values its backward
     reads), prefetches the units of the next op that lists any, and after op i releases each
     unit that no earlier op lists. A unit kept gathered from the end of the forward (FSDP keeps
     the last one) is used as it is and released after its last op. Every unit the tape's ops
     list is released when ddp_backward returns.
     Own autograd (no tape): the forward as above; the backward gathers each unit before its
     gradients are computed (prefetching the next), calls ddp_grad_ready for its parameters,
     releases it, and ends with ddp_finish; every unit is released before ddp_adamw_step.
     Misuse, named (INVALID_STATE): ddp_tape_record listing a parameter of a unit that is not
     gathered (released, or prefetched and not waited for), naming the parameter and unit;
     ddp_adamw_step (or ddp_scatter_from_host / ddp_load of parameters) with a unit still
     gathered ("a gather without a release"), changing nothing; ddp_unit_release during the
     backward of a unit that an op not yet replayed lists, naming the op and parameter;
     ddp_consume_grads (a program's own optimizer would write the gathered views, not the
     parts). With check_ready (DDP_CHECK_READY=1, one rank), a touch of a released page is
     named on stderr (parameter and unit) before the process dies of the fault; otherwise the
     program sees the plain SIGSEGV. A step misused on one rank only leaves its peers waiting in
     the step until timeout_s.
     Gradients: as under ZeRO-2 (SHARDED GRADIENTS): each bucket (a unit's, or a piece of one)
     is reduce-scattered in place, and once it is settled this rank's gradients outside its part
     are released, so between backwards only this rank's parts hold memory. Accumulation (sync
     off) keeps a rank's gradients whole until the synchronizing micro-step, as unsharded
     (shard_accumulate is ZeRO-2's only).
     Memory per parameter and rank, CPU backend, fp32: 4/world (parts) + 4/world (gradients) +
     8/world (m, v) = 16/world, + 4 x (the units gathered at once) / (all units), + the
     gradients of the buckets in flight during a backward; bf16 parameters: 2/world (working
     copies' parts) + 2/world (gradients) + 12/world (master, m, v) = 16/world, + 2 x gathered
     share. The gathered share is the largest unit (or two, with a prefetch; one with
     shard_prefetch_off) in a layer-by-layer program.
     The commit holds no whole copy of the model (CPU backend, several ranks): no whole private
     flat buffers are made; the parameters (bf16: the working copies) and gradients go straight
     into the shared segment, and a bucket at a time rank 0 writes the bucket's initial values
     there, every peer copies its own part, and rank 0 gives the bucket's pages outside its parts
     back (bf16: the fp32 values pass through rank 0's gradient buffer, a chunk at a time, and
     each rank keeps its parts of the master packed and of the working copies rounded). So a
     rank holds its parts and rank 0 one bucket more, never the model; every rank's parts hold
     rank 0's initial values, as the broadcast gives at the other levels (the same bits). The
     program's initial values (ddp_register_param's init) are read until ddp_commit returns.
     On the MPI backend (several ranks) neither: the whole-size private flat buffers (fp32
     parameters or bf16 working copies, gradients) are made without touching a page, the fp32
     master of bf16 parameters as this rank's packed parts only, and rank 0's initial values
     reach every rank a 4 MB chunk at a time (DDP__Z3_SEED_FLOATS; a broadcast over the world,
     since in shard groups or replica groups several ranks hold each part), each rank copying
     its parts of the chunk (bf16: the master's and, rounded, the working copies'). So a rank's
     commit peaks at its parts plus the chunk (tests/test_zero3.c measures VmHWM: a 64 MB
     model, 2 to 4 ranks, fp32 and bf16, within 16 MB of the parts; the whole model or more
     before), with the same bits as the broadcast of rank 0's whole buffer.
     On the NCCL backend (>>nccl: ddp__gpu_z3_*) the view is device address space reserved once
     with CUDA's virtual memory management (cuMemAddressReserve; physical memory by granules of
     the allocation granularity, cuMemCreate + cuMemMap), and the rank's own parts of every
     bucket stay mapped for the whole run: they are its owner storage, flat-indexed, updated in
     place by AdamW (bf16: the working copies there, the fp32 master packed as under ZeRO-1),
     with no all-gather after the step. A gather maps the unit's other granules and enqueues,
     on the comm stream after the compute stream's work so far, the in-place all-gather of each
     of the unit's buckets (the equal parts and the last rank's tail, as ZeRO-1's after AdamW),
     then records the unit's event; ddp_unit_gather makes the compute stream wait on it
     (cudaStreamWaitEvent): the host never waits, and the program's kernels on desc.cuda_stream
     see the unit whole. ddp_unit_prefetch is that enqueue alone (no thread: the comm stream
     overlaps it with the compute stream's work). A release records an event on the compute
     stream (the unit's last use); its granules are unmapped once that event has completed,
     checked at each later gather, release and step; the host waits for it only when a map
     finds no memory, and at ddp_adamw_step (every released unit's memory back each step).
     Neighbouring units share at most a granule, counted like the host's pages. Collectives are
     enqueued from the program's thread in the order it calls gather, prefetch and the buckets'
     hooks, alike on every rank: nothing depends on timing. Gradients on NCCL: ZeRO-2's device
     release (SHARDED GRADIENTS: mapped by ddp_zero_grad, the rest of each bucket unmapped at the
     end of ddp_adamw_step; tests/test_fake_nccl.c runs ZeRO-3 with it). A
     touch of a released unit by a kernel or copy is a fault on the device (tests/fakegpu counts
     it as misuse); check_ready's naming is the host backends'.
     Hybrid sharding (shard_group = S, HYBRID SHARDING): the parts are the shard group's (member
     s of every group holds part s), a gather reads the group's members' parts only (CPU: their
     parts in the segment; NCCL: the in-place all-gathers on the group's communicator), the
     gradients go the hybrid way (reduce-scatter in the group, the part allreduced across the
     groups) and are released as ZeRO-2's: the same bits as hybrid ZeRO-1 with the same groups
     (CPU: unsharded's; tests/test_hybrid.c, tests/test_fake_nccl.c; MPI below). Replica groups (desc.outer,
     OUTER SYNC): the parts are the replica group's; the outer step gathers the parameters among
     the group (fp32: from the members' owner storage; bf16: the master, as under ZeRO-1) and
     writes back this rank's parts only, then a barrier (no member gathers a part mid-write): the
     same bits as unsharded (tests/test_groups_shard.c). CPU and MPI backends (MPI: the gathers
     on a duplicate of the replica group's communicator, the outer step's through the group's
     broadcast; tests/test_groups.sh); NCCL in groups of one rank, where nothing is sharded (each
     rank's part is everything: a gather moves nothing).
     On the MPI backend (>>mpi: ddp__mpi_z3_*) the view is the reserved range as on the CPU
     backend, and each rank's owner storage is its private flat buffers, only its parts' pages
     ever touched (the commit seeds the parts a chunk at a time, above). A gather commits the
     unit's pages and runs, per bucket of the unit, MPI_Iallgatherv of the parts (the equal
     parts and the last rank's tail, ZeRO-1's layout) from every owner's storage into the view, on a duplicate of the world's communicator
     (hybrid: the shard group's; replica groups: the group's), after a small signature exchange that names ranks gathering
     different units; a release decommits; AdamW updates the parts in place, no all-gather.
     Prefetch: ddp_unit_prefetch starts those nonblocking exchanges on the program's thread and
     ddp_unit_gather waits for them (polling MPI_Test, with the failure, cancel and timeout_s
     checks of any wait), so the transfer overlaps compute as far as MPI progresses it (Open MPI:
     while another thread of the rank is inside MPI, as the communication thread is during a
     backward). Not a prefetch thread: MPI matches a communicator's collectives by the order they
     start, and only the program's calls have the same order on every rank. The gradients:
     ZeRO-2's on MPI (the bucket's exchange, then the release outside this rank's parts); with
     hybrid sharding the hybrid path (the host's sum, each part across the hosts among its
     holders), whose bits ZeRO-1 in the same groups gives too (tests/test_zero3_mpi.sh).
     Backends: single, cpu, NCCL and MPI. Refused at ddp_init, by name: replica groups (desc.outer)
     in groups of several ranks on NCCL (no broadcast within a group there),
     uneven_inputs on NCCL and MPI (there a unit's gather is a collective every rank makes, and a
     rank inside ddp_join runs no forward; the CPU backend's gathers are local reads of the owners'
     parts, so it runs uneven inputs as ZeRO-1, the joined rank stepping its parts and keeping
     them: EMBEDDING); with replica groups, a lone ddp_copy_from_host of parameters (the outer
     copy must follow on every rank: ddp_scatter_from_host); the CPU
     backend without its shared segment (DDP_STAGED_GRADS, or no room in /dev/shm) at
     ddp_commit; NCCL on a driver without virtual memory management (named at ddp_commit). The timeline: each
     gather (prefetched or not) and release is an event on the comm lane ("gather unit N",
     "release unit N": the unit's name and bytes; on NCCL the host's enqueue times, on MPI from
     the exchange's start to the wait's end; a gather's "prefetched" says whether
     ddp_unit_prefetch started it).

   HYBRID SHARDING (ddp_desc.shard_group = S, or DDP_SHARD_GROUP=S; with shard >= OPTIMIZER)
     What: the sharded state is split within each group of S consecutive ranks (ranks [g*S,
     (g+1)*S): with a launcher that numbers a host's ranks together, S = LOCAL_WORLD_SIZE is a
     group a host) and replicated across the G = world / S groups; every synchronizing step still
     averages the gradients over the whole world (it is DDP across the groups, not the outer
     sync). Member s of every group holds the same parts (SHARDED OPTIMIZER's layout with world
     -> S), and every sharded exchange stays in the group: the norm's blocks, skip_nonfinite's
     verdict (every group's is the same: their averages are equal), the all-gather of the
     parameters after the update. A bucket: reduce-scattered within the group, then each part
     allreduced across the groups among the ranks that hold it (member s of every group), then
     the norm, AdamW on the part, the all-gather within the group. Every rank ends every step
     with the same parameters, bit for bit.
     When: the state does not fit when held whole (DDP) but fits split S ways (a host's ranks),
     and the link between hosts is slow: flat sharding (S = world) puts the all-gather of the
     parameters (and, on the MPI backend, bf16 buckets' reduce-scatter among all ranks) on the
     slow link; hybrid keeps them on the host's fast one.
     Memory per parameter and rank (fp32 parameters): 4 (parameters) + 4 (gradients) + 8/S (m,
     v); bf16 parameters: 2 + 2 + 12/S (the master in parts too). S = world is flat sharding,
     S = 1 is DDP (16 bytes). (Levels above OPTIMIZER divide their parts by S alike: ZeRO-3
     within groups of S is 16/S bytes, plus the gathered units, as SHARDED PARAMETERS says with
     world -> S; every level from OPTIMIZER to PARAMETERS, on the CPU, NCCL and MPI backends.)
     The slow link, per step: each rank sends, and receives, 2 (G-1)/G of its part of the
     gradients (an allreduce of 1/S of them; fp32: 8 (G-1)/(G S) bytes a parameter), so a host
     (S ranks) sends 8 (G-1)/G bytes a parameter, what the MPI backend's unsharded hierarchical
     allreduce sends (there by the host's leader alone; here by all S ranks at once); flat
     ZeRO-1 sends that plus the parameters' all-gather across the hosts (measured:
     bench/RESULTS.md, "Issue 27").
     Values: S must divide the world (else DDP_ERR_INVALID_ARGUMENT naming shard_group and the
     world); S = world is plain sharding, and S = 1 a shard of one rank: everything whole on every
     rank, the level resolved to DDP_SHARD_NONE (ddp_config() says so), both accepted. shard_group
     with shard NONE (shard_optimizer 0): refused, naming both. With replica groups (desc.outer)
     the state is already split within each group: shard_group must be 0 or outer.group_size.
     uneven_inputs: as ZeRO-1 (the options reach every rank; each group's parts step and gather
     within it).
     The bits. CPU backend: each part's average is every rank's gradient added in rank order and
     divided by the world (the G holders of a part split it G ways; each averages its piece of
     every rank's buffer in the segment into its own, and copies the other holders' pieces once
     every rank is done): unsharded's bits, at any S (tests/test_hybrid.c); without the segment
     (DDP_STAGED_GRADS) the buckets are averaged whole: the same bits. MPI backend: each group
     must be one host's ranks in local rank order (hierarchical; a group across hosts or
     DDP_MPI_FLAT: refused by name at ddp_commit); the host's sum of the bucket through its shared
     memory (local rank order), then this rank's part across the hosts through a communicator of
     its holders: each holds a piece, MPI_Alltoallv, the host sums added in host order, divided
     by the world, MPI_Allgatherv: fp32 gradients give the unsharded hierarchical run's bits
     (tests/test_hybrid.sh, 2 hosts x 2 ranks). bf16 on the wire (bf16 parameters, reduce_dtype
     BF16): the values as bf16, summed in float the same way and rounded once: every rank the
     same bits, but not unsharded's, which adds every rank in rank order (the test holds the
     averaged gradients within a bound it derives: 3 float roundings of the sum, one to bf16). Outside a rank's part its gradient
     buffer holds the host's sum there (CPU: its own gradients). The stragglers of a hybrid bucket
     are the host's (the part across hosts is not counted). NCCL: three communicators, the
     world's, the shard group's (ranks [g*S, (g+1)*S)) and a cross-group one of the part's
     holders (ranks s, s+S, ..., s+(G-1)S), each set up non-blocking through the store (ids from
     the group's first rank and from rank s), watched, aborted and torn down alike, a set-up
     that never finishes named with its ranks. A bucket, on the comm stream: ncclReduceScatter
     (ncclSum) in the group into this rank's part (the tail reduced to the last member), then
     ncclAllReduce (ncclSum) of the part across the groups, then times 1/world; so a rank sends
     1/S of the bucket across the groups (an allreduce of its part: 2 (G-1)/G of it on a ring),
     as the MPI backend's hybrid does. The wire plan's conversions as for flat sharding: bf16 on
     the wire (reduce_dtype BF16) narrowed into staging, summed as bf16, widened and scaled in
     float; bf16 parameters summed as bf16 and scaled once into bf16, or (reduce_dtype FP32)
     widened, summed and scaled in float, rounded back once. The bits: NCCL's allreduce leaves
     every holder of a part the same values, so every rank ends every step with the same
     parameters; the sum is hierarchical (the group's in NCCL's order, then the groups'), and
     the factor 1/world is rounded to float (a power-of-two world: exact, so the sum divided by
     it rounded once), so they are not unsharded's bits (ncclAvg over the world adds in its own
     order too). Bound: with W ranks, M the sum of the magnitudes of the W values an element
     sums and u the rounding unit, |average - exact| <= (W-1) u M / W + 3 u |exact| (fp32: u =
     2^-24; with bf16 sums u = 2^-8 + 2^-24 and 2^-7 |exact| for the last roundings), which
     unsharded's average obeys as well (to first order), so the two differ by at most about
     twice it. tests/test_fake_nccl.c holds every step's averaged parts to that bound against the exact (double)
     average on 4 ranks in groups of 2 and 6 in groups of 2 and of 3 (fp32 and bf16 wire, bf16
     parameters, clipping, accumulation), counts the bytes each rank's cross-group communicator
     carries (its parts exactly; the world's carries none during a step), and names a failing
     cross-group communicator; on tests/fakegpu, not yet on GPUs. The timeline's comm lane shows
     both: "reduce-scatter bucket N (shard group)" and "allreduce bucket N's part across the
     shard groups" (bytes: the part's).
     Checkpoints: the shard table has S entries (format version 1); the file loads at any world
     size and sharding, and a hybrid run loads any file (an older ddp.h refuses hybrid files as an
     impossible header). ddp_gather_to_host takes each part from the root's group.
     With DDP_SHARD_PARAMETERS (MPI backend only; the others refuse it at ddp_init): the
     parameters in parts within the group too (4/S fp32 parameters, gathered per unit), a
     unit's gather an MPI_Iallgatherv among the group's ranks (a host's: no traffic across
     hosts), the gradients as above; the same bits as DDP_SHARD_OPTIMIZER in the same groups
     (tests/test_zero3_mpi.sh, 2 hosts x 2 ranks, S = 2).

   PARAMETER DTYPE (ddp_desc.param_dtype = DDP_DTYPE_BF16, or DDP_PARAM_DTYPE=bf16)
     bf16 training with fp32 master weights (docs/design.md): every parameter has a bf16 working
     copy, which the forward reads (ddp_param_bf16, ddp_flat_params_bf16), and a bf16 gradient,
     which the backward writes (ddp_grad_bf16, ddp_flat_grads_bf16); ddp.h keeps the fp32 master
     weights and AdamW's m and v. Initial values stay `const float *`: the master gets them, the
     working copy gets them rounded to nearest even (rank 0's, at commit). A ddp_bf16 is the bits
     (layout of __nv_bfloat16).
     The step: the buckets are the bf16 gradients themselves, reduced where they are; there is
     no fp32 copy of them (ddp_flat_grads is NULL, see below). CPU backend: every rank's bf16
     gradients live in the shared gradient segment (>>cpu-grads), and the owner of a part adds
     every rank's values in float, in rank order, divides by the world and rounds once to bf16,
     whichever reduce_dtype (both give these bits). Without the segment (DDP_STAGED_GRADS, no
     room in /dev/shm) a bucket is widened into one bucket's floats, goes through the staging
     slots as reduce_dtype says and is rounded back: the same bits. NCCL: reduce_dtype BF16 (the
     default for bf16 parameters) is ncclAllReduce (sharded: ncclReduceScatter) of ncclBfloat16
     on the gradients, in place (rounded to bf16 at each hop: world - 1 roundings, the same bits
     on every rank); FP32 widens each bucket into one bucket's floats on the comm stream,
     reduces those with ncclFloat and rounds the average (sharded: this rank's part) back into
     the gradients once. The norm (ADAMW: the fixed block order, in double;
     ddp_k_norm_blocks_bf16 on NCCL, the CPU's lanes and order) and clipping read the bf16
     gradients, widened exactly: the same bits on every backend, sharded or not. MPI: the CPU
     backend's bits, whatever the hosts (BACKENDS).
     ddp_adamw_step updates the fp32 master from them and writes the working copy, rounded to
     nearest even, in the same pass (the CPU loop; one kernel on NCCL, ddp_k_adamw_bf16). A
     skipped step (skip_nonfinite) changes neither.
     Memory per parameter: 2 (working copy) + 2 (gradient) + 4 (master) + 8 (m, v) = 16 bytes
     (sharded: 4 + 12/world); reduce_dtype FP32 adds one bucket's floats (the largest bucket, at
     most bucket_cap_mb) on NCCL, and on the CPU backend only without the segment (as does
     reduce_dtype BF16 there). Time: no pass over the gradients besides the reduction, the norm
     and AdamW, whose pass moves 2 bytes more than fp32's (the working copy) and reads the
     working copy once more for the misuse guard below (bench/RESULTS.md, "bf16 parameters").
     Accumulation: with sync off the program adds into its bf16 gradients (as PyTorch's bf16
     .grad does); the synchronizing backward reduces what they hold. find_unused zero-fills the
     bf16 gradient. uneven_inputs' DIVIDE_BY_ACTIVE rescales the bf16 average (rounded once more).
     The master: ddp_flat_params is the fp32 master (device memory on NCCL); ddp_param, ddp_grad
     and ddp_flat_grads return NULL with an error that points to the bf16 accessors (and those
     return NULL with an error on an fp32 context). Write parameters with ddp_copy_from_host /
     ddp_scatter_from_host (DDP_PARAMS: the working copies are rounded from what was written;
     DDP_GRADS: the bf16 gradients receive it rounded, and copies to the host give them widened).
     A lone write of one copy (ddp_param_bf16, or the master through ddp_flat_params) is found by
     the next AdamW pass, which compares each working copy with its master rounded as it goes:
     that ddp_adamw_step fails with DDP_ERR_INVALID_STATE naming the count and (CPU) the
     parameter; the step is taken and the copies agree again (NCCL counts on the device and
     reports it one step later). Checkpoints store the master (and m, v); after ddp_load the
     working copies are the loaded master rounded.
     Sharded (ZeRO-1): the master is what is sharded. A rank holds the fp32 master, m and v only
     for its own parts (the shard's count of floats each, packed in flat order: SHARDED OPTIMIZER),
     updates them and writes its working copies of those parts in the same pass; the bf16
     working copies are all-gathered bucket by bucket (2 bytes an element; CPU: in the shared
     segment; NCCL: ncclAllGather of ncclBfloat16): the same bits as unsharded on every rank. The
     whole master exists only during ddp_commit (rank 0's values arrive, are rounded into the
     working copies, then each rank keeps its parts). Only this rank's part of the bf16 gradients
     holds the average after a step. ddp_flat_params points to this rank's parts of the master
     (count: the shard's; ddp_flat_params_bf16's is the flat size); ddp_copy_to_host of
     DDP_PARAMS takes a range inside one of this rank's parts, any other is refused by name
     ("not all held by rank R"); ddp_copy_from_host of DDP_PARAMS is refused: write with
     ddp_scatter_from_host (every rank writes its parts of the master and all its working
     copies, rounded on the host with the kernels' bits). ddp_gather_to_host and checkpoints
     reach the master through its owners, so a checkpoint moves between sharded and unsharded
     runs and world sizes.
     Tests: tests/test_bf16_params.c; on the MPI backend tests/mpi_parity.c (the CPU backend's
     bits, checkpoints across the two).

   OUTER SYNC (ddp_desc.outer: replica groups, DiLoCo, streaming DiLoCo, periodic averaging)
     When: the network between groups of ranks (hosts) is much slower than the compute wants
     (Ethernet between workstations, cloud hosts without RDMA): DDP's every-step allreduce
     then dominates (bench/RESULTS.md, "across slow links"). The ranks split into groups of
     group_size (default local_world_size: a group a host); within a group every step is the DDP
     step above; across groups only the parameters meet, every inner_steps (H) steps:
       desc.outer = (ddp_outer){ .mode = DDP_OUTER_DILOCO, .inner_steps = 50 };
       ... every step as before: backward, ddp_adamw_step (it takes the outer step when due)
     DILOCO (arXiv 2311.08105): each group keeps an fp32 outer copy of the parameters and an outer
     momentum; at an outer step the outer gradient (outer copy minus the group's parameters),
     averaged over the groups, takes an outer SGD step with Nesterov momentum exactly as
     torch.optim.SGD(nesterov=True) defines it (lr 0.7, momentum 0.9 by default), and every
     group's parameters become the new outer copy; AdamW's state is kept. AVERAGE: lr 1 and
     momentum 0 (PyTorch's post-local SGD), the mean of the groups' parameters (what travels is
     then the parameters, in fp32: one group gives plain training bit for bit). STREAMING (arXiv
     2501.18512): the flat buffer is cut into `fragments` contiguous ranges, equal to within 16
     floats; fragment f is sent every H steps, at the steps t (1, 2, ...) with (t + f*H/F) % H
     == 0, so at most one is in flight; its exchange runs on a thread of its own while the next
     `delay_steps` inner steps compute, and then it merges: parameters = mix * their own + (1 -
     mix) * the new outer values (the paper's alpha; 0 with delay 0 is DiLoCo on the fragment).
     What travels (wire): BF16 by default (FP32 for AVERAGE), or INT8, one fp32 scale for every
     quant_block (64) values (max |x| / 127, values rounded to nearest): 1/4 of fp32 plus 1/16.
     Every group's encoding reaches every rank (a broadcast from each group's first rank; on the
     MPI backend with groups of one rank, one MPI_Allgather, which uses both directions of every
     link at once) and every rank adds the decoded values in group order: all ranks compute the
     same bits, on every backend.
     Parameters the program writes after ddp_commit (ddp_copy_from_host, ddp_scatter_from_host:
     its own weights, the same on every rank) become the outer copy too.
     A program with its own optimizer: ddp_consume_grads, its update, ddp_outer_step (every
     rank, every step; ddp_adamw_step calls it itself). ddp_outer_state: groups, this rank's
     group, inner steps, fragments merged, the one in flight, what the last exchange took and
     what the steps waited for exchanges (0 when the overlap hid them), and the straggler: an
     exchange begins with a barrier, each group's first rank sends what it waited there, so
     every rank names the group that arrived last and what it cost the earliest one.
     Checks: group_size must divide the world, H >= 1, fragments <= H and delay_steps < H /
     fragments (ddp_init), fragments <= the model's blocks of 16 floats (ddp_commit), every rank
     the same settings (ddp_commit: DDP_ERR_MISMATCH naming both). Backends: CPU and MPI, groups
     of any size: a group's buckets are averaged among its ranks only, overlapped with backward as
     without groups (CPU: through the shared segment, waiting for the group's ranks only; MPI: a
     communicator per group, each piece's owner adding the group's values in rank order, or a
     group of one host's ranks through that host's shared memory: the CPU backend's bits either
     way), while every other collective spans the world (but the sharded optimizer's, below); NCCL:
     groups of one rank (each GPU its own replica: its buckets move nothing), one group, or
     groups of several ranks, whose buckets go through a second communicator over the group's
     ranks (set up at ddp_init from an ncclUniqueId the group's first rank puts in the store;
     ncclAvg divides by the group's size: the CPU backend's bits), while the exchange and every
     other collective use the world's; the exchange staged through host memory and not
     overlapped (its collectives are ordered on the program's compute stream; tested on
     tests/fakegpu, not yet on a GPU). Not yet: shard_optimizer on NCCL with groups of several
     ranks, uneven_inputs (refused by name).
     shard_optimizer (ZeRO-1) within the groups (CPU and MPI; NCCL with groups of one rank, where
     it is a no-op, or one group): each group shards AdamW's state across its own ranks and every
     sharded exchange stays in the group (SHARDED OPTIMIZER); the outer exchange is as without
     it (fp32 parameters are whole on every rank). With bf16 parameters the fp32 master is in
     parts across the group's ranks: before a fragment is packed, and before it merges with mix,
     each member's parts of it travel to the group's other members (a broadcast among the group
     only: the CPU segment, MPI_Bcast on the group's communicator; fp32, the fragment's size
     once per group, nothing across the slow link), so every rank holds the group's whole master
     of the fragment, exchanges and steps it as unsharded (the same bits), then keeps the master
     of its own parts and writes all its working copies of the fragment (no gather after it).
     NCCL refuses bf16 parameters + shard_optimizer in one group of several ranks by name.
     ZeRO-3 (DDP_SHARD_PARAMETERS) within the groups, CPU and MPI backends (MPI: a unit's gathers on
     a duplicate of the group's communicator; NCCL: groups of one rank, a no-op there; groups of
     several refused by name): the parameters are in parts too; a fragment's
     fp32 parameters are gathered among the group as the bf16 master is above (fp32: from each
     member's own parts, flat-indexed), stepped whole, and each member writes back its own parts
     (bf16: its master and working copies of them), then the world meets at a barrier so that no
     unit is gathered from a part still being written. The outer copy and momentum stay whole on
     every rank (4 and 4 bytes a parameter on top of ZeRO-3's 16/S). The same bits as unsharded
     (tests/test_groups_shard.c: DiLoCo, streaming with a fragment in flight, fp32 and bf16,
     checkpoints both ways; the GPT trainer's --shard parameters --outer diloco).
     Checkpoints: each group's m, v (and master) come from its own members. Tests:
     tests/test_groups_shard.c (4 thread-ranks in 2 groups of 2; mpirun -n 4 in
     tests/test_groups.sh): sharded = unsharded bit for bit, fp32 and bf16 parameters, DiLoCo and
     streaming, a group skipping a step, resumed from a checkpoint either way.
     A host lost during an exchange: the
     backend's collective fails on every survivor within the timeout, as any collective does.
     Continuing without the lost group would take: the survivors agreeing on who is left (the
     store), a new group count for the average, and the outer state kept (it is the same on every
     group); not built. Checkpoints hold every group's state and the outer state, and resume bit
     for bit, a fragment in flight included; another group count loads too (CHECKPOINTS).

   CHECKPOINTS (ddp_save, ddp_load, ddp_save_check; collective: every rank calls them alike)
       int holds;
       ddp_save_check(ddp, path, &holds);        // before training: a bad path fails now
       if (holds) ddp_load(ddp, path, &mine, sizeof mine, my_check, &args, &info);
       ... ddp_save(ddp, path, &mine, sizeof mine);   // parameters, m, v, step + your blob
     What is saved: the parameters, AdamW's m, v and step, and an opaque user blob (rank 0's:
     the program's config, data position, RNG). Rank 0 writes one file: every rank's part of the
     state streams to it through ddp_gather_to_host in chunks of 4 MiB (no host copy of the
     model anywhere), so one file serves every world size and every sharding of the optimizer,
     and only rank 0's file system needs it (docs/design.md). The stored world size and sharding
     are information (ddp_checkpoint_info), not constraints.
     Writing: PATH.tmp.<pid>.<64 random bits> created with O_CREAT|O_EXCL|O_NOFOLLOW, fsync,
     rename onto PATH (a symlink at PATH is replaced, its target untouched; a FIFO, directory,
     device or socket there is refused, nothing written), fsync of the directory; a killed
     writer leaves only its temporary, and the next save sweeps those of dead writers (this
     user's, plain files). Windows: CREATE_NEW, FlushFileBuffers, and MoveFileExW(MOVEFILE_
     REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH), which returns once the rename is on disk
     (>>platform says why not ReplaceFileW).
     Reading, on rank 0: a FIFO, directory or device is refused at once (never blocked on); then
     magic, version, header (world size, sharding and shard layout, the parameters' names, sizes
     and flags) against the file's length (nothing after the checksum), the checksum over every
     byte, the caller's check of the user blob (ddp_checkpoint_check_fn, e.g. "another seed"),
     the parameters against this model by name; every integer at its stored width. Only then a
     second pass scatters the state to every rank (ddp_scatter_from_host), checksumming again: a
     refused file leaves the state untouched and the context usable; a file that changes during
     the load fails the group. Rank 0's refusal is every rank's error ("rank 0 could not load
     the checkpoint 'P': why"), so no rank waits for ever. After ddp_load on M ranks every rank
     holds the saved bits, and M ranks continue exactly as M ranks handed that state in memory
     (tests/test_checkpoint.c). Format: >>checkpoint.
     With the outer sync (desc.outer) the groups' inner states differ between syncs, so the file
     holds every group's: its parameters, m and v (from the group's first rank, through the
     broadcast every backend has, in the same chunks; all ranks of a group hold the same;
     shard_optimizer: each part from its holder in the group), and
     the outer state every rank holds alike: the fp32 outer parameters, the outer momentum, the
     inner step count, the syncs, the fragment in flight, when it lands and the groups' summed
     outer gradient for it (format version 2; a run without the outer sync writes version 1,
     as before, and both load). Between outer steps or with a fragment in flight, a run that
     saves, ends, and is loaded by a run of the same settings goes on bit for bit as if it never
     stopped (tests/test_outer_checkpoint.c; on NCCL, tests/test_fake_nccl.c). The cost: a file
     of 3 G + 1 model-sized arrays (G groups; + 1 with outer momentum), and every other group's
     3 arrays cross the network as broadcasts to rank 0, the slow links included: on such links
     save every many outer steps, not every step. What a load makes of another run's state:
       another group count (or world size): group g takes the saved group g mod G_saved's
         parameters, m and v; the outer parameters and momentum are every group's. Each group
         goes on from a trajectory that existed, its moments matching its parameters, and
         nothing the outer optimizer accumulated is lost; with more groups than saved, groups
         that start alike part as their data differ; with fewer, the saved groups past them are
         dropped (their progress reaches the others only through the outer parameters, which
         hold it up to the last sync). The fragment in flight stays in flight, its sum scaled
         to the new group count (the average the saved groups sent lands as planned);
       another schedule (fragments, inner_steps, delay_steps, the kind of sum: averaging's
         parameters or an outer gradient) or parameter layout: the fragment in flight lands at
         the load, with this run's outer step; the inner step count goes on (the next sends
         follow this run's schedule from it); outer lr, momentum, mix and wire are this run's;
         momentum zeros when the file holds none;
       the outer sync off in the loading run: group 0's parameters, m and v (right after a
         full DiLoCo sync, mix 0, they are the outer parameters);
       a file without outer state (version 1) into a run with it: the outer parameters are the
         loaded ones, momentum 0, the schedule from its start (inner step 0).
     ddp_checkpoint_info says what the file holds (outer_groups 0: no outer state).

   BACKENDS (one table each: THE IMPLEMENTATION below)
     single  one rank, no launcher: no network, no shared memory, no thread
     cpu     ranks on one host: shared memory (POSIX shm; Windows: named file mappings); each
             rank's communication thread averages buckets while backward runs (the rank's own
             thread takes over the ones left when it reaches ddp_finish, and the last bucket);
             every rank reduces its own part, so all end with the same bits
     nccl    GPUs (implementation compiled by nvcc, or with -DDDP_CUDA and ddp_kernels.cuh).
             Each rank uses GPU LOCAL_RANK % device count; rank 0's ncclUniqueId goes through
             the store; the communicator is non-blocking (set-up has a deadline that names the
             ranks that never started or finished it). ddp_param, ddp_grad, ddp_flat_params/
             grads and ddp_adamw_state's m and v are DEVICE pointers (initial values given to
             ddp_register_param are host memory). A ready bucket is an event on the compute
             stream, a wait on it by ddp.h's comm stream and ncclAllReduce(ncclAvg) in place
             (with one rank, no collective: its gradients are their own average); ddp_finish
             makes the compute stream wait for the last bucket. Nothing in a step waits on the
             host. ddp_adamw_step runs on the compute stream and clips and skips
             on the device; only with grad_norm_out does it read the norm back (a small copy
             and a wait: ask for it on the steps you log), which is also when NaN/Inf gives
             DDP_ERR_NONFINITE at once (otherwise the step is skipped on the device and the next
             ddp_adamw_step reports it). User collectives run on the comm stream, ordered after
             the compute stream's work and before its later work; host buffers are staged and
             waited for. A watchdog thread polls NCCL's asynchronous errors, the age of
             unfinished communication and the group's poison, and aborts the communicator rather
             than hang, until ddp_shutdown has destroyed it. Replica groups of several ranks
             (OUTER SYNC): a second communicator over each group's ranks (its ncclUniqueId from
             the group's first rank through the store; ncclCommInitRankConfig, so any NCCL from
             2.10), on which the buckets are averaged; the watchdog, aborts and shutdown cover it
             as they do the world's. Hybrid sharding (desc.shard_group): the shard group gets
             that second communicator (each bucket's reduce-scatter, the norm's blocks, the
             all-gather), and a third spans the holders of this rank's part, member s of every
             group, for the part's allreduce across the groups (HYBRID SHARDING). Step stats come from CUDA events, read
             lazily (stats.step names the step they describe).

     mpi     CPU ranks on several hosts (only with -DDDP_MPI, built by mpicc; tested with Open MPI
             4.1; MPICH's own environment (PMI_RANK) is not read by ENVIRONMENT below yet).
             Hierarchical: the ranks of a host reduce through the cpu backend's shared memory
             (>>cpu, with LOCAL_RANK and LOCAL_WORLD_SIZE), one leader per host (LOCAL_RANK 0) does
             the inter-host part through MPI, the leader's result goes back through shared memory;
             DDP_MPI_FLAT=1 puts every rank in MPI instead (for comparison). Across hosts each
             leader owns a slice: MPI_Alltoallv of the host sums, the owner adds them in host order
             and divides, MPI_Allgatherv: a fixed order, so every rank ends with the same bits
             (MPI_Allreduce's order is the library's). Buckets run on a communication thread while
             backward goes on; user collectives work across hosts. The ranks must be one MPI job
             (mpirun -H h1:2,h2:2, srun --mpi=pmix): ddprun --nnodes cannot start MPI ranks, and
             an MPI build under it fails at once saying so. If the program called MPI_Init_thread
             first, ddp.h uses that MPI; otherwise it initializes MPI in ddp_init and finalizes it
             at exit (atexit; not after a failure). It needs MPI_THREAD_MULTIPLE and fails by name
             when MPI granted less (why: docs/design.md). MPI calls have no timeout: a watchdog
             thread polls the store every 0.1 s (a poison, a dead rank's closed connection) and
             the age of the collective in progress (timeout_s; the ranks whose heartbeat in the
             store stopped are named with their hosts); on a failure while this rank waits in MPI
             it logs the named error, waits 0.5 s so the peers log theirs, and calls MPI_Abort
             (the one case where ddp.h ends the program).
             The bits. fp32 buckets: the fixed order above, which is the CPU backend's (every
             rank's value added in rank order) on one host, flat, or with one rank a host; with
             several ranks on several hosts the hosts' sums add in host order instead. bf16 on
             the wire (param_dtype BF16, or reduce_dtype BF16): the CPU backend's bits on any
             hosts. A host's partial sum would add in another order, so these buckets go among
             all ranks: each rank owns a piece of the bucket, every rank's bf16 values of it travel
             to the owner (MPI_Alltoallv, 2 bytes an element; fp32 parameters: rounded first, as
             the CPU backend's slots carry them), which adds them in float in rank order, divides
             and rounds once (the CPU backend's arithmetic), and MPI_Allgatherv returns the
             averages (bf16 parameters, sharded: each rank's piece is its part, and stays there).
             shard_optimizer: fp32 buckets are averaged whole, as unsharded (every part of
             ddp_flat_grads then holds the average; the step sends the parameters' all-gather on
             top of an unsharded step's bytes: the memory is saved, not the traffic; bf16 buckets
             are reduce-scattered, so there a sharded step sends what an unsharded one does);
             ddp_adamw_step updates this rank's parts, the
             norm's blocks reach every rank through one MPI_Allreduce in which each block is non-
             zero on its owner only (so exact in any order), and each bucket's parts are all-
             gathered once updated (MPI_Allgatherv of the fp32 parameters, or of the bf16 working
             copies): sharded gives unsharded's bits. Checkpoints move between the MPI and CPU
             backends and world sizes, sharded or not. ZeRO-2: each bucket's exchange as above,
             then the gradients outside this rank's parts released. ZeRO-3 (SHARDED PARAMETERS):
             a unit's gather is an MPI_Iallgatherv of the parts per bucket, started by
             ddp_unit_gather or ddp_unit_prefetch, on a communicator of the gathers' own;
             hybrid sharding too (within the host's ranks), and replica groups (within the
             group's ranks: a duplicate of its communicator). Replica groups of several ranks
             (OUTER SYNC): every bucket, fp32 too, goes that owner's way among the group's ranks
             only, through a communicator of the group (MPI_Comm_split): the CPU backend's bits
             for the same groups, on any hosts; a group that is exactly one host's ranks (the
             default, one group a host, with a launcher that numbers a host's ranks together)
             averages through the host's shared memory instead, no MPI, the same bits (DDP_LOG=
             info says which). The world's collectives stay as above. Hybrid sharding
             (desc.shard_group, a group a host): each bucket's host sum through the host's
             shared memory, then each part across the hosts through a communicator of the ranks
             that hold it (the leaders' order: fp32 keeps the unsharded bits; HYBRID SHARDING).
             Tests: tests/test_mpi_parity.sh (one host, flat and hierarchical),
             tests/test_mpi_hosts.sh (2 hosts x 2 ranks), tests/test_groups.sh (groups),
             tests/test_hybrid.sh (hybrid sharding), tests/test_zero2_mpi.sh, tests/test_zero3_mpi.sh
             (ZeRO-2, ZeRO-3 and ZeRO-3 hybrid).
             Over TCP (Open MPI's btl tcp): where ddp.h initializes MPI it sets the Open MPI
             parameters that mpirun --mca / OMPI_MCA_* left unset: btl_tcp_eager_limit,
             btl_tcp_rndv_eager_limit and btl_tcp_max_send_size 1 MiB, btl_tcp_links 2,
             mpi_yield_when_idle 1 (why: README.md, "The MPI backend over TCP"; DDP_MPI_TUNE=0:
             none). A rank bound to one CPU (mpirun's default for <= 2 ranks a host) is warned:
             start with --bind-to none, or several CPUs a rank.

   ENVIRONMENT (the launcher's: first match wins)
     torchrun style  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
     Open MPI        OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE (+ MASTER_ADDR/PORT)
     Slurm (srun)    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; the tasks on this node:
                     SLURM_STEP_TASKS_PER_NODE ("2(x3),1") at SLURM_NODEID (else
                     SLURM_TASKS_PER_NODE, else SLURM_NTASKS_PER_NODE); the whole list is
                     checked (the step's must sum to SLURM_NTASKS). MASTER_ADDR unset: a step
                     on one node uses 127.0.0.1; on several, the first host of
                     SLURM_STEP_NODELIST (Slurm's hostlist syntax, "cn[07-09,12],gpu[1-2]x[1-4]",
                     expanded by ddp.h; resolved like any name), and rank 0, if srun put it on
                     another node, refuses by name. MASTER_PORT unset: 20000 + (64 x
                     SLURM_JOB_ID + SLURM_STEP_ID) mod 12288, in [20000, 32288): steps 0..63 of one
                     job never share a port, two jobs only when their ids are equal modulo 192
                     (then the job ids refuse the stranger by name, JOB IDENTITY). A given
                     MASTER_ADDR / MASTER_PORT wins. A process of a Slurm job outside a step (no
                     SLURM_STEP_ID: the batch script, salloc's shell) is one rank, and refused by
                     name where SLURM_NTASKS > 1 (start it with srun).
     none            one rank, no network
     (ddp_desc.world_size > 0 gives the group by hand instead, and none of these is read.)
   The DDP_* variables. The rule, the same for each: a variable that is set (not empty) WINS over
   the descriptor field it stands for, whatever the program put there; the program's value is
   what runs when the variable is unset. Where the program had set the field to something else,
   rank 0 logs one warning naming each override ("DDP_TIMEOUT=30 over the program's
   ddp_desc.timeout_s = 300"), and ddp_config() gives what runs. An invalid value is refused at
   ddp_init by name (DDP_ERR_BAD_ENV) whether or not the program set the field (why the variable
   wins: docs/design.md). A program that must know reads ddp_config() after ddp_init.
   param_dtype changes which accessors work: a program written for fp32 that meets
   DDP_PARAM_DTYPE=bf16 gets NULL from ddp_param with an error that names the variable.
     DDP_JOB_TOKEN   job_token: shared secret of the job (ddprun makes a fresh one): rank 0's
                     store and each rank prove to each other that they know it, without sending
                     it (its value is never logged)
     DDP_JOB_ID      job_id: the job's name, the same on every rank (unset: the launcher's job id)
     DDP_TIMEOUT     timeout_s: seconds, plain decimal, in [0.001, 1e6]
     DDP_LOG         log_level: debug|info|warn|error|off
     (a string too long for its field is refused, naming it and the limit: DDP_TIMELINE 511
     characters, DDP_JOB_TOKEN 127, DDP_JOB_ID 255; the same for the ddp_desc fields)
     DDP_TIMELINE    timeline_path (its directory must take the file: checked at ddp_init; set
                     on every rank or none: ddp_commit refuses a mix, naming the ranks)
     DDP_CHECK_READY=0|1      check_ready
     DDP_SHARD_OPTIMIZER=0|1  shard_optimizer
     DDP_SHARD=none|optimizer|gradients|parameters  shard
     DDP_SHARD_GROUP=N        shard_group
     DDP_SHARD_ACCUMULATE=0|1 shard_accumulate
     DDP_SHARD_PREFETCH=on|off shard_prefetch_off (off: 1)
     DDP_PARAM_DTYPE=fp32|bf16  param_dtype
   and three with no field (0|1 as well; a typo is refused on every backend):
     DDP_MPI_FLAT=1  (MPI backend, the same on every rank) every rank in MPI, no host groups
     DDP_MPI_TUNE=0  (MPI backend, the same on every rank) keep Open MPI's TCP defaults (BACKENDS)
     DDP_STAGED_GRADS=1  (CPU backend, read by rank 0) gradient buckets through the staging
                     slots instead of in place through the shared gradient segment: the same
                     bits, slower; for comparisons

   JOB IDENTITY
     Two jobs on one host and one MASTER_PORT must not merge. The rendezvous checks the job id:
     $DDP_JOB_ID, else desc.job_id, else what the launcher sets alike for every rank of a job:
     Open MPI's PMIX_NAMESPACE (or OMPI_MCA_ess_base_jobid), Slurm's SLURM_JOB_ID and
     SLURM_STEP_ID, torchrun's TORCHELASTIC_RUN_ID (its default static rendezvous calls every run
     "none"; on one host the run's log directory in TORCHELASTIC_ERROR_FILE names it). A rank
     whose id differs from rank 0's is refused, and the message names both. Under ddprun the
     token is the identity. With no token and no id (ranks started by hand) rank 0 warns.
     The handshake (a challenge-response with HMAC-SHA-256, both ways, keyed by the token and the
     id) proves knowledge of the token without sending it; it is not encryption (what it
     protects against and what not: README.md, Security).
     A rank started twice in one job (a launcher bug, a typo in RANK): the first process to claim
     the rank at rank 0's store holds it; the other is refused (DDP_ERR_BAD_ENV, "two processes of
     this job were started as rank R: pid P on host 'H' holds it, ...") and the job goes on: a
     connection speaks for its rank (its hang-up is that rank's loss) only once its claim won.

   ERRORS
     Every call that can fail returns a ddp_result; ddp_last_error(ctx) says what, where and on
     which rank (every message starts with "rank N: ", or "pid P" before the rank is known; the
     string is a copy that stays as it is until the next ddp_last_error on that context). The
     library never exits or aborts the program (except the MPI backend's watchdog: BACKENDS).
     An error inside a collective (a dead peer, a timeout, a mismatch between ranks) poisons the
     process group: every rank fails fast with a message naming the rank that failed first,
     instead of waiting for the timeout. A peer that dies (a process, or a thread-rank that ends
     without ddp_shutdown) is noticed within about 0.1 s on the CPU backend (every waiter looks
     every DDP__LIVENESS_PERIOD_S; measured: bench/RESULTS.md; the message names every waited-for
     rank that is dead or still exiting, ddp__shm_gone_too), and by the NCCL watchdog's poll
     of the store (every 0.1 s) or NCCL's own error on the NCCL backend. Rank 0 gone before it
     listens (never started, or killed early) is a connection refused, as a slow rank 0 is: the
     wait stays timeout_s (docs/design.md), and is not silent: after half the timeout (10 s at
     most) of refusals each waiting rank warns "nothing listens at ADDR:PORT ... connection
     refused for N s", then every minute; at timeout_s it fails with "no store at ADDR:PORT -
     did rank 0 start?". A launcher that sees rank 0 die ends the job at once (ddprun, torchrun).
     Stopped time (Ctrl-Z of the whole job, then fg): the waits inside a step count only time the
     process could run (a gap of over DDP__STOPPED_GAP_S between two looks moves the deadline by
     the gap: the CPU backend's waits, the NCCL and MPI watchdogs' clocks), so a job stopped for
     longer than timeout_s trains on when continued; the waits on the rendezvous store
     (ddp_init, ddp_commit's layout check, the timeline gathered at ddp_shutdown) count wall time
     and time out. A rank stopped alone while its peers run is a stalled peer: they time out and
     name it. DDP_ERR_CANCELLED is not a failure of the job: the host program asked for it
     (EMBEDDING); it poisons the group like an error, so the peers stop too.

   NULL, LIFETIME AND THREADS
     Every entry point accepts a NULL context: calls return DDP_ERR_INVALID_ARGUMENT and leave
     the message in ddp_last_error(NULL) (per thread); accessors return -1 (ddp_rank,
     ddp_local_rank), 0 (ddp_world_size, ddp_num_params, ddp_num_buckets, ddp_param_count, a
     zeroed ddp_step_stats), NULL (ddp_config, ddp_param, ddp_grad, ddp_param_name, ddp_flat_*,
     which also set *count_out = 0), "none" (ddp_backend_name); ddp_set_sync and ddp_tape_reset
     do nothing. On a live context the views (ddp_param, ddp_grad, ddp_flat_*, their bf16
     forms) are NULL with a message in ddp_last_error before ddp_commit and for an id no
     parameter has. ddp_shutdown(NULL) is DDP_OK. ddp_shutdown frees the context: calling it twice,
     or anything after it, is a use after free. On failure ddp_init may still leave a context in
     *out that only reports the error: call ddp_last_error, then ddp_shutdown.
     A context belongs to the thread that steps it (the library runs one thread of its own per
     context: the communication thread on the CPU, the watchdog on NCCL). With ranks as threads
     of one process, the thread that last stepped the context is the rank: if it ends while the
     context is live (it returns, calls pthread_exit or ExitThread, or is cancelled with
     pthread_cancel, even in the middle of a backward) its peers fail at once, as for a dead
     process, and the host program can still ddp_shutdown the context it left. Distinct contexts
     are independent.
     From any thread: ddp_result_string; ddp_sampler_count and ddp_sample (pure, no context);
     ddp_cancel_token_set and ddp_cancel_token_is_set (also from a signal handler: one atomic
     store or load); ddp_cancel and ddp_progress_read while the
     context is live, that is from the end of ddp_init until ddp_shutdown begins (the host program
     keeps the context from going meanwhile, e.g. a slot under its own lock that the rank clears
     before ddp_shutdown: examples/engine.c). ddp_progress_read takes no lock and never holds up
     the rank (a seqlock: the rank's writes never wait, a reader retries). Everything else,
     ddp_report_loss and ddp_join included, on the thread that steps the context.

   EMBEDDING: CANCEL, PROGRESS, UNEVEN INPUTS (examples/engine.c; README.md)
     Cancel. ddp_cancel(ctx) cancels one rank; a ddp_cancel_token in ddp_desc.cancel_token (the
     host program's, outliving the contexts) cancels every rank that holds it, ddp_init included
     (a rendezvous waiting for a peer that never comes). The rank's current call, or its next
     one, returns DDP_ERR_CANCELLED within milliseconds: every wait looks (shared-memory waits
     between 20 ms futex sleeps, the communication thread, the rendezvous store's waits, NCCL's
     polls and its watchdog, which also aborts the communicator); the group is poisoned, so the
     peers (threads or processes) stop at their next wait with DDP_ERR_CANCELLED too, on every
     backend (NCCL and MPI peers read the cancel's code from the store's poison), and before
     the shared memory is up (rendezvous) with DDP_ERR_PEER_LOST once the cancelled rank leaves.
     Nothing waits out a timeout. Then ddp_shutdown as after any failure: quick, and it returns
     DDP_OK.
     Progress. ddp_progress_read(ctx, &p) from any thread: the step count, the last
     ddp_report_loss value and its step (this rank's number; nothing is sent), the last step's
     wall time and its ddp_step_stats times, the ranks with data, and the context's failure
     (DDP_ERR_CANCELLED once cancelled). It is written at each ddp_finish and ddp_report_loss.
     Uneven inputs (PyTorch's Join). With ddp_desc.uneven_inputs set on every rank, each
     synchronizing step begins with a tiny allreduce of who has data (on NCCL a host wait). A
     rank out of data calls ddp_join between steps: inside it the rank answers every step of the
     others with zero gradients (same buckets, same order) until all have joined. Their average
     is divided by the initial world size (DDP_JOIN_DIVIDE_BY_WORLD, PyTorch's default:
     joined ranks count as zeros) or by the ranks with data (DDP_JOIN_DIVIDE_BY_ACTIVE). A joined
     rank takes no AdamW steps; when the last rank joins, the lowest rank that still had data
     broadcasts its parameters and AdamW state (m, v, step) to every rank, so the replicas end
     bit-identical, and ddp_join returns on every rank (also when all join in the same step:
     then nothing is broadcast, the replicas are equal already). Gradient accumulation: a rank
     may call ddp_join with sync on or off, between micro-steps. Gradients it accumulated since
     its last ddp_zero_grad or synchronizing step (micro-steps with sync off) go into the others'
     next synchronizing step in place of its zeros, and it counts as a rank with data for that
     step's divisor (PyTorch's Join sends zeros instead); from then on it sends zeros. If no
     rank steps any more (all have joined), they are dropped: no one takes a step for them.
     ddp_join leaves ddp_set_sync as it found it. While a rank has joined, the others may not
     call user collectives (ddp_allreduce, ddp_broadcast, ddp_barrier): both sides fail with an
     error that names ddp_join, instead of hanging.
     Sharded (ZeRO-1, -2 and, on the CPU backend, -3; hybrid too), a joined rank owns parts of the
     state only it updates (m, v, the bf16 master; under ZeRO-3 the parameters), and the step's
     exchanges (the norm's blocks, skip_nonfinite's verdict, the all-gather) need every rank. So
     inside ddp_join each shadow step is followed by the joined rank's own ddp_adamw_step on its
     parts (PyTorch's ZeroRedundancyOptimizer does the same under Join), with the options the
     ranks with data pass: in a step some rank has joined, ddp_adamw_step's start broadcasts
     them (lr, betas, eps, weight_decay, max_grad_norm, as_given: values, 32 bytes) from the
     lowest rank with data; in even steps nothing is sent. Per-parameter settings (DDP_NO_DECAY)
     are each rank's own registration, the same everywhere. Why the bits are the unsharded run's:
     the joined rank's parts of the gradient are its parts of the same average (its zeros were
     in it, as they are unsharded), the norm and the skip verdict are exchanged as in every step,
     and its step count moved with the others' (it stepped in every step before it joined and
     steps in every one after), so each part takes the update the unsharded run's root makes on
     those floats; the all-gather (ZeRO-1, -2) or the owners' parts (ZeRO-3) then hold the
     unsharded parameters, and m, v and the step are the root's, in parts. So no broadcast ends
     a sharded join (nobody holds everything to send); unsharded, it ends as above. A step
     skipped (skip_nonfinite) or refused as non-finite is skipped by the joined rank alike (no
     error for it: the others go on). If the root's ddp_adamw_step fails before its exchanges
     (bad options, no averaged gradients), the joined ranks' ddp_join fails too, naming the
     root, instead of waiting. While a rank has joined, every synchronizing step of the ranks
     with data must end in ddp_adamw_step (the joined ranks wait for its options). Refused by
     name: shard_accumulate (its micro-steps' reduce-scatters need every rank; ddp_join answers
     synchronizing steps only), ZeRO-3 on NCCL (SHARDED PARAMETERS), replica groups (desc.outer,
     with or without sharding).

   SAMPLER (ddp_sampler; PyTorch's DistributedSampler, without its table of n indices)
       ddp_sampler s = { .n = samples, .world = ddp_world_size(ddp), .rank = ddp_rank(ddp),
                         .seed = 42, .shuffle = 1, .drop_last = 0 };
       uint64_t count, index;
       ddp_sampler_count(&s, &count);              // this rank's samples per epoch
       for (uint64_t i = 0; i < count; i++) { ddp_sample(&s, epoch, i, &index); ... }
     Each epoch is a sequence of global positions 0 .. world*count-1: the permutation of [0, n)
     (the identity without shuffle), and with padding its first world*count - n entries again at
     the end (drop_last: the last n mod world positions are dropped). Rank r's i-th sample is
     global position i*world + r. So the ranks' shares of an epoch are disjoint and, without
     drop_last, cover every sample (the padded ones twice); counts are PyTorch's: padding
     ceil(n/world) a rank (n < world: one each, the samples repeat), drop_last floor(n/world)
     (n < world: 0, and every ddp_sample is an error). The permutation depends only on (n, seed,
     epoch), not on world or rank, so a consumer that takes global batch k as positions
     [k*G, (k+1)*G) of the epoch (G = world x per-rank batch, each rank its i*world + r) trains
     the same samples a batch on any number of ranks; it differs from torch.randperm's (the
     counts, padding and rank split are the same). O(1) a sample, no memory (>>sampler), any n up
     to 2^64 - 1. Resuming: the position is (epoch, i) (README.md); this rank's k-th sample
     overall is (epoch k / count, i = k mod count).
     Errors: a NULL sampler or out pointer, shuffle or drop_last other than 0 or 1 (an
     uninitialized field: zero-initialize the struct), n = 0, world < 1 (0 is not taken for 1: a
     sampler whose world was never set would give every rank every sample), rank outside 0 ..
     world-1, and i >= count are DDP_ERR_INVALID_ARGUMENT with the reason (and the rank) in
     ddp_last_error(NULL); ddp_sample then sets *index_out = UINT64_MAX. Pure: any thread,
     before ddp_init or without it.

   PLATFORMS
     Linux: everything (every backend, ddprun, every test). Windows (10 and later; x86-64): the
     single and cpu backends, ranks as threads of one process (examples/engine.c, the texture
     example, cancel, progress, ddp_join) and ranks as processes on one machine (ddprun.exe),
     checkpoints, the timeline; the NCCL and MPI backends are Linux-only (DDP_CUDA or DDP_MPI in
     a Windows build stops with an #error that says so; ddp_desc.backend asking for one there is
     DDP_ERR_BACKEND, "Linux-only"). Build: MinGW-w64 (x86_64-w64-mingw32-gcc f.c -lws2_32
     -lbcrypt) or MSVC (cl f.c; the libraries come by #pragma comment); no pthreads (>>platform).
     The implementation includes <winsock2.h> and <windows.h> (WIN32_LEAN_AND_MEAN, NOMINMAX,
     _WIN32_WINNT at least Vista's) in the file that defines DDP_IMPLEMENTATION, so their macros
     are there too, except IN and OUT, which ddp.h removes (DDP_KEEP_WINDOWS_IN_OUT keeps them).
     Tested: the MinGW-w64 build under Wine (tests/test_windows.sh; what it covers, and MSVC:
     README.md, Platforms).
     What differs, and why: >>platform. macOS: the POSIX paths keep no Linux-only call without a
     fallback (futex: a short sleep; /proc: nothing to say), but nothing here has built or run it.

   COMPILE-TIME OPTIONS
     DDP_IMPLEMENTATION   in one file: the implementation (include ddp.h before other headers,
                          or build with -D_GNU_SOURCE; a strict -std=c99 otherwise stops with an
                          #error that says so)
     DDP_CUDA             the NCCL backend (nvcc defines it); with a C compiler, link cudart and
                          nccl and compile ddp_kernels.cuh once with DDP_KERNELS_IMPLEMENTATION
     DDP_MPI              the MPI backend (build with mpicc, or add MPI's include and library flags)
     DDP_MALLOC(size), DDP_FREE(ptr), DDP_ASSERT(cond)   allocator and assert hooks
     DDP_TEST_KILL_POINTS tests only: DDP_TEST_KILL_AT=POINT:RANK, and DDP_TEST_DIE_IN_CHECKPOINT=S
                          (rank 0 SIGKILLed inside ddp_save of AdamW step S, parameters written,
                          m and v not) kill a rank inside the library
     DDP_KEEP_WINDOWS_IN_OUT  Windows: keep windows.h's empty IN and OUT macros (PLATFORMS)

   THE IMPLEMENTATION, SECTION BY SECTION (bottom-up; grep the marker, e.g. ">>cpu")
     >>platform     the one place POSIX and Windows differ, one block per concern, each with both
                    halves: threads and locks, time and sleep, processes and threads alive, the
                    counters' wait/wake (futex; Windows: named semaphores), named shared memory,
                    pages given back (ddp__pages_punch: ZeRO-2's released gradients),
                    sockets, random bytes, address space (ddp__vm_*: reserve, commit, decommit,
                    release), files (the checkpoint's atomic replace); nothing below
                    asks which system it runs on
     >>types        tunables; parameters, buckets and their wire plan (ddp__wire), tape ops; the
                    engine's work queue and watchdog; the backend table ddp__backend; ddp_context,
                    nested by concern (job, rdv, model, flat, adam, shard, tape, step, tl, embed,
                    join; the chosen backend's own state behind impl, a union: ask be->id, never
                    whether a state pointer is set)
     >>util         time, aligned memory, non-finite tests by bits (fast math), logging, the error
                    verbs (below), the cancel check; the derived facts ddp__sharded, ddp__bf16_params
     >>sampler      the distributed sampler's arithmetic: counts, the epoch's keyed permutation
                    (cycle-walking Feistel; an exact shuffle up to 32 samples), a rank's i-th
                    sample; pure (its entry points, which
                    only check the struct, are in >>public like every other)
     >>timeline     per-thread event lists, the Chrome trace written at shutdown (a straggler's
                    wait: DDP__EV_STRAGGLER, "wait for rank N")
     >>env          the launcher environment (under srun: Slurm's hostlist syntax, the step's
                    first node and port); the descriptor: ddp__desc_check_given (flags, enums,
                    NaN, as the program gave it), the DDP_* variables (one rule:
                    ddp__desc_from_env), ddp__desc_defaults (every default, pure), validation,
                    the group
     >>store        the rendezvous store (server thread on rank 0, client on every rank); whose
                    hang-up is a rank's loss (ddp__conn_speaks_for_rank: a won claim); the ranks
                    missing from a key (ddp__list_missing)
     >>engine       what every backend's communication shares, written once: the communication
                    thread's work queue (ddp__workq: cpu, mpi; the backend gives its one-bucket
                    function) and the watchdog (ddp__watchdog: mpi, nccl; the 0.1 s tick, the
                    stopped time, the store's poison and lost ranks, the backend's hooks); the
                    stragglers' record (ddp__straggle_note, folded into ddp_step_stats at finish)
     >>shard        the shard layout (ddp__shard_range, ddp__master_parts) and the norm's blocks'
                    fixed-order sum every backend uses; the team (>>util: ddp__team_*) is the shard
                    group under hybrid sharding (ddp__hybrid; resolved by ddp__hybrid_resolve, >>env);
                    ZeRO-2's release of a settled bucket's gradients outside this rank's part
                    (ddp__z2, ddp__z2_clear, ddp__z2_release)
     >>host         what single and cpu share: host flat buffers (ZeRO-3 on MPI: whole-size ones
                    never touched, ddp__host_alloc_untouched), AdamW arithmetic (bf16 parameters:
                    the working copy written in the same pass), bf16 rounding and conversions,
                    the norm's blocks' sums of squares; ZeRO-2 on host gradients (cpu, mpi): a
                    settled bucket (ddp__z2_settled) and shard_accumulate's accumulator
     >>single       the single backend's table
     >>cpu          its types (the segment's blocks, ddp__cpu); shared-memory collectives over
                    the world or, for a gradient bucket, the team (ddp__span_*: replica groups),
                    liveness, poison; each exchange's arrivals (ddp__cpu_arrivals); >>cpu-grads
                    buckets averaged (or reduce-scattered) in place
                    (bf16 parameters: bf16 gradients, summed in float; hybrid sharding: each part
                    over the world, ddp__hybrid_bucket_in_place); sharded AdamW and its
                    all-gather (sharded parameters: a barrier instead, and each peer's parts read
                    where they are, ddp__cpu_z3_parts; its commit seeds each rank's parts from
                    rank 0's initial values a bucket at a time, ddp__cpu_z3_seed / _seed_bf16,
                    with no whole private flat buffers, ddp__z3_seed_deferred); its one-bucket function for the work
                    queue (ZeRO-2: then the release, ddp__z2_cpu_bucket); the cpu backend's table
     >>mpi          the MPI backend (only with DDP_MPI): host groups on the cpu backend's
                    segment, the leaders' fixed-order sum; bf16 buckets and the sharded optimizer
                    among all ranks (the CPU backend's rank order); with replica groups every
                    bucket among the team, through its own communicator (a team that is a host's
                    ranks: through the host's segment); hybrid sharding (ddp__hybrid_mpi_*: the
                    host's sum, each part across the hosts among its holders); stragglers across hosts
                    through the signature check (ddp__mpi_cross_arrivals, the leaders' relay);
                    the watchdog's hooks (heartbeats, the collective's age, MPI_Abort); ZeRO-2's
                    release after a bucket's MPI calls (ddp__z2_mpi_bucket); ZeRO-3's gathers
                    (ddp__mpi_z3_*: MPI_Iallgatherv per bucket of a unit on the gathers' own
                    communicator, started by gather or prefetch, polled by the wait) and its
                    commit (ddp__mpi_z3_seed: rank 0's initial values broadcast a chunk at a
                    time into each rank's parts, the whole-size buffers untouched,
                    ddp__z3_seed_mpi in >>host); its table
     >>nccl         the NCCL backend (only with DDP_CUDA): the communicators' life (the
                    world's; a replica group's or, hybrid, a shard group's: ddp__gpu_init_team;
                    hybrid's cross-group one of a part's holders: ddp__gpu_init_cross), the
                    watchdog's hooks, set-up, buckets on the comm stream as the wire plan says
                    (sharded: reduce-scattered; hybrid: ddp__nccl_hybrid, the group's reduce-
                    scatter then the part's allreduce across the groups), the norm's blocks, AdamW kernels (sharded: per
                    bucket, then all-gathered; sharded parameters: in place in the view, no
                    all-gather); ZeRO-3's device side (ddp__gpu_z3_*: the view's granules, a
                    unit's all-gather on the comm stream and its events, deferred unmaps); its table
     >>nccl-vm      inside >>nccl: the device address-space layer (ddp__gvm_*): a range reserved
                    once, granules mapped / released by holder counts through CUDA's virtual
                    memory management (driver entry points via the runtime, no -lcuda); ZeRO-2's
                    gradients on it (ddp__gpu_z2_*, in >>nccl: mapped by ddp_zero_grad, released
                    at the end of ddp_adamw_step; shard_accumulate: ddp__gpu_z2_accumulate into
                    a device accumulator, ddp__gpu_z2_micro_release at a micro-step's ddp_finish,
                    ddp__gpu_z2_map from ddp_set_sync through the table's grads_map)
     >>group        ddp__choose_backend (the one place that knows every backend), rendezvous,
                    init, shutdown
     >>embed        progress: the seqlock the rank writes and any thread reads (cancel itself:
                    ddp__check_cancel in >>util, called by every wait)
     >>params       registration, layout, buckets and their wire plan (ddp__plan_wire: what each
                    bucket is on the wire, decided once for every backend), the cross-rank
                    layout check, commit and its bucket plan (DDP_LOG=info); the bf16
                    conversion generic code asks for (ddp__bf16_op: the master rounded into the
                    working copies; the gradients need none)
     >>zero3        sharded parameters (ZeRO-3): units, the view reserved once and its pages'
                    counts, gather / prefetch (its own thread) / release, the tape's plan (each
                    unit's last op), the misuse checks, check_ready's fault naming; on NCCL the
                    same primitives hand the view, the gathers and the releases to >>nccl
                    (z3.device); on MPI the gathers to the backend's exchange (be->z3_start /
                    z3_wait, >>mpi: no thread); in >>params before ddp__commit
     >>step         ready hooks, launch in bucket order, the tape, finish (the no-overlap check;
                    messages worded for the tape or the program's own backward); with uneven
                    inputs the count of the ranks with data that begins a synchronizing step;
                    ZeRO-2's shard_accumulate launches the buckets of micro-steps with sync off too
     >>adamw        hyperparameters resolved and checked, handed to the backend; the averaged-
                    gradients guard, and ddp_consume_grads for a program's own optimizer
     >>collectives  user collectives, host copies of the state
     >>join         uneven inputs: ddp_join's shadow steps (sharded, each followed by the joined
                    rank's AdamW on its parts, with the options the root sends), the replicas
                    synced at the end (unsharded)
     >>outer        replica groups and their outer sync: fragments, the wire's encodings, the
                    exchange (its own thread when delayed; the wire's users wait for it), the
                    outer Nesterov step and the merge; the master in parts (ZeRO-3: the fp32
                    parameters' parts too) gathered within the group (ddp__outer_master_get /
                    _put, be->team_bcast), a barrier after a ZeRO-3 merge
     >>checkpoint   ddp_save / ddp_load: the file format, the atomic write, the strict two-pass
                    read, rank 0's verdict broadcast to every rank; the outer sync's state
                    (every group's, ddp__ckpt_outer_save / ddp__ckpt_outer_load)
     >>public       every public function: checks its arguments and the context, hands off
     The backend table (ddp__backend in >>types) is the only way generic code reaches a
     backend: setup, alloc_flat, commit, begin_step, launch, finish, zero, scale, bf16, adamw,
     adamw_state, copy, collective, allgather, team_bcast, z3_parts, z3_start, z3_wait, stats, poison, stop, teardown; its
     `shards` flag says whether it runs shard_optimizer (ddp_init refuses it by the backend's
     name otherwise), `shards_grads` likewise for DDP_SHARD_GRADIENTS (1: host memory that
     ddp__z2_release gives back; 2: device memory the backend maps and releases itself, NCCL). Each backend fills it by name (ddp__cpu_table and its like, into the
     context's own copy); an optional slot left NULL (setup, commit, begin_step, allgather,
     team_bcast, z3_parts, z3_start, z3_wait, stats, poison, stop) is nothing to do (allgather: the outer exchange broadcasts
     instead; team_bcast: bf16 + shard_optimizer in groups of several ranks is refused; z3_parts
     and z3_start both NULL: DDP_SHARD_PARAMETERS runs on one rank only, or on NCCL's own path), and the
     generic caller checks. A backend carries out each bucket's wire plan (ddp__wire, made at
     commit), and reaches the work queue and the watchdog (>>engine) through its hooks. Adding
     a backend is adding a section that fills one and a line in ddp__choose_backend.
     The error rule. ddp__fail records a message (rank first) and returns its code: for errors
     that leave the ranks in step (bad arguments, calls out of order, local resources); the
     context stays usable. ddp__fail_group records, makes the failure sticky and poisons the
     group (the peers stop at their next wait): for errors that leave the ranks out of step;
     code on the collective path calls it at the point of failure, and its callers only pass
     the result up. ddp__fatal escalates an error a callee recorded with ddp__fail, at the few
     boundaries where a local failure leaves the ranks out of step (a backend's setup and
     commit). ddp__set_failed marks the context alone (the peers were told already). A poison
     written from another thread (a watchdog's) is counted in ctx->telling, and ddp_shutdown
     hangs up its store connection only after it, so the peers read why, not "disconnected".

   Version: DDP_VERSION_STRING. License: see the end of this file.
*/
/* The implementation needs POSIX and Linux declarations: include ddp.h first in the file that
   defines DDP_IMPLEMENTATION (or build with -D_GNU_SOURCE). */
#if defined(DDP_IMPLEMENTATION) && !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _GNU_SOURCE
#endif

#ifndef DDP_H
#define DDP_H

/* nvcc compiling the implementation adds the NCCL backend; so does -DDDP_CUDA with a C compiler
   (then link cudart and nccl, and compile ddp_kernels.cuh once with DDP_KERNELS_IMPLEMENTATION). */
#if defined(__CUDACC__) && !defined(DDP_CUDA)
#define DDP_CUDA 1
#endif

#include <stddef.h>
#include <stdint.h>

#define DDP_VERSION_MAJOR 0
#define DDP_VERSION_MINOR 1
#define DDP_VERSION_PATCH 0
#define DDP_VERSION_STRING "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ddp_result {
    DDP_OK = 0,
    DDP_ERR_INVALID_ARGUMENT,  /* a bad argument or descriptor field */
    DDP_ERR_INVALID_STATE,     /* a call in the wrong order (e.g. a step before commit) */
    DDP_ERR_BAD_ENV,           /* launcher environment missing, malformed or inconsistent */
    DDP_ERR_NETWORK,           /* rendezvous: port in use, address unresolvable, bad peer */
    DDP_ERR_TIMEOUT,           /* a peer did not arrive or answer within timeout_s */
    DDP_ERR_PEER_LOST,         /* a peer rank died or failed */
    DDP_ERR_MISMATCH,          /* ranks disagree: parameters, options, collective calls */
    DDP_ERR_UNUSED_PARAMETER,  /* parameters got no gradient and find_unused is off */
    DDP_ERR_DOUBLE_READY,      /* a gradient was marked ready twice in one backward */
    DDP_ERR_OUT_OF_MEMORY,
    DDP_ERR_SYSTEM,            /* an operating-system call failed (shared memory, threads) */
    DDP_ERR_BACKEND,           /* the GPU backend failed */
    DDP_ERR_NONFINITE,         /* the averaged gradients hold NaN or Inf (parameters unchanged) */
    DDP_ERR_CANCELLED          /* ddp_cancel or a cancel token stopped this rank or a peer */
} ddp_result;

typedef enum ddp_backend { DDP_BACKEND_AUTO = 0, DDP_BACKEND_CPU, DDP_BACKEND_NCCL, DDP_BACKEND_SINGLE,
                           DDP_BACKEND_MPI /* CPU ranks on several hosts; only built with DDP_MPI */ } ddp_backend;
typedef enum ddp_op { DDP_AVG = 0, DDP_SUM } ddp_op;
/* DEFAULT (zero): param_dtype FP32; reduce_dtype the parameters' dtype (PARAMETER DTYPE in the manual). */
typedef enum ddp_dtype { DDP_DTYPE_DEFAULT = 0, DDP_DTYPE_FP32, DDP_DTYPE_BF16 } ddp_dtype;
/* The bits of a bfloat16 (the upper half of a float; layout-compatible with CUDA's __nv_bfloat16). */
typedef uint16_t ddp_bf16;
/* Uneven inputs (ddp_join): what a step's averaged gradient is divided by while some ranks have
   joined: the initial world size (their zeros count; PyTorch's default) or the ranks with data. */
typedef enum ddp_join_mode { DDP_JOIN_OFF = 0, DDP_JOIN_DIVIDE_BY_WORLD, DDP_JOIN_DIVIDE_BY_ACTIVE } ddp_join_mode;
/* How much of the training state is held in parts across the ranks (SHARDED STATE in the manual).
   DEFAULT: as shard_optimizer says (1: OPTIMIZER, 0: NONE). Every level gives the same bits. */
typedef enum ddp_shard {
    DDP_SHARD_DEFAULT = 0,
    DDP_SHARD_NONE,            /* DDP: every rank holds everything */
    DDP_SHARD_OPTIMIZER,       /* ZeRO-1: AdamW's m, v (and a bf16 run's fp32 master) in parts */
    DDP_SHARD_GRADIENTS,       /* ZeRO-2: the averaged gradients too */
    DDP_SHARD_PARAMETERS       /* ZeRO-3 / FSDP: the parameters too, gathered a unit at a time */
} ddp_shard;

/* A cancel token the host program owns (zero-initialized), shared by any number of contexts
   (ddp_desc.cancel_token): ddp_cancel_token_set stops every rank that holds it. It outlives the
   contexts, so setting it never races with a ddp_shutdown. */
typedef struct ddp_cancel_token { int cancelled; } ddp_cancel_token;
typedef enum ddp_log_level {
    DDP_LOG_DEFAULT = 0, DDP_LOG_DEBUG, DDP_LOG_INFO, DDP_LOG_WARN, DDP_LOG_ERROR, DDP_LOG_OFF
} ddp_log_level;

/* rank is -1 for messages from before the rank is known. */
typedef void (*ddp_log_fn)(void *user, ddp_log_level level, int rank, const char *message);

/* Outer synchronization across replica groups (OUTER SYNC in the manual): the ranks split into
   groups of group_size; within a group every step is data parallel as without it; across groups
   the parameters meet only every inner_steps steps (DiLoCo, arXiv 2311.08105), or in fragments
   at staggered steps, overlapped with the inner steps (streaming DiLoCo, arXiv 2501.18512). */
typedef enum ddp_outer_mode {
    DDP_OUTER_OFF = 0,         /* every step synchronizes the whole world (plain DDP) */
    DDP_OUTER_AVERAGE,         /* periodic parameter averaging (post-local SGD): outer lr 1, momentum 0 */
    DDP_OUTER_DILOCO,          /* outer Nesterov SGD on the averaged outer gradient, all at once */
    DDP_OUTER_STREAMING        /* DiLoCo in fragments, each overlapped with delay_steps inner steps */
} ddp_outer_mode;
/* What an outer gradient travels as: FP32, BF16, or INT8 (blockwise: one fp32 scale for every
   quant_block values, max |x| / 127, each value rounded to nearest). Default: BF16, except
   AVERAGE: FP32 (exact parameter averaging). */
typedef enum ddp_outer_wire { DDP_WIRE_DEFAULT = 0, DDP_WIRE_FP32, DDP_WIRE_BF16, DDP_WIRE_INT8 } ddp_outer_wire;
typedef struct ddp_outer {
    ddp_outer_mode mode;
    int group_size;            /* ranks a group (0: local_world_size, one group per host); divides the world */
    int inner_steps;           /* H > 0: a fragment (DiLoCo: the whole model) meets every H steps */
    float lr, momentum;        /* outer Nesterov SGD; 0: 0.7 and 0.9 unless as_given (AVERAGE: 1, 0) */
    int as_given;              /* 1: lr and momentum exactly as given, 0 included */
    int fragments;             /* STREAMING: F >= 1 contiguous ranges of the flat buffer (0: 1) */
    int delay_steps;           /* STREAMING: tau, inner steps a fragment's exchange overlaps (0: 0) */
    float mix;                 /* STREAMING: alpha; the merge keeps alpha of the local values (0: 0) */
    ddp_outer_wire wire;       /* what the outer gradients travel as (above) */
    int quant_block;           /* INT8: values per scale (0: 64) */
} ddp_outer;

typedef struct ddp_desc {
    ddp_backend backend;
    double timeout_s;
    double bucket_cap_mb;
    double first_bucket_mb;
    int find_unused;
    int skip_nonfinite;        /* 1: a step whose gradients hold NaN/Inf is skipped (everywhere) */
    int world_size;            /* > 0: the fields below replace the launcher environment */
    int rank;
    int local_rank;            /* default: rank */
    int local_world_size;      /* default: world_size */
    const char *master_addr;   /* default: 127.0.0.1 */
    int master_port;
    const char *job_token;     /* default: $DDP_JOB_TOKEN */
    ddp_log_fn log;
    void *log_user;
    ddp_log_level log_level;
    const char *timeline_path; /* default $DDP_TIMELINE; NULL/empty: no timeline */
    /* Benchmarks and tests only: every gradient/user allreduce also waits as if it crossed a
       network with this per-call latency and bandwidth (0: off). */
    double inject_comm_latency_ms;
    double inject_comm_gbps;
    /* What gradient buckets travel as: FP32, or BF16 (half the bytes; every rank's contribution
       and the average are rounded to bf16, the gradients receive the result). Default: the
       parameters' dtype (bf16 parameters: their bf16 gradients are reduced as they are). Every
       rank must use the same (checked at commit). User collectives stay fp32. */
    ddp_dtype reduce_dtype;
    /* NCCL backend: the compute stream (a cudaStream_t) the program's kernels run on; buckets
       wait on it and it waits on them. NULL: the legacy default stream. */
    void *cuda_stream;
    /* Which job this rank belongs to; a rank of another job is refused at the rendezvous.
       Default: $DDP_JOB_ID, else the launcher's job id (see JOB IDENTITY in the manual). */
    const char *job_id;
    /* Longest ddp_shutdown waits, after a failure, for peers still reading rank 0's store
       (default 1 s; without a failure shutdown waits for the peers as long as timeout_s). */
    double shutdown_timeout_s;
    /* Host programs: a token that cancels this rank when set (any thread, a signal handler too),
       with every other context that holds it. NULL: only ddp_cancel(ctx) cancels. */
    ddp_cancel_token *cancel_token;
    /* Uneven inputs: DDP_JOIN_OFF (default; ddp_join is an error), or the divisor while ranks
       have joined. Each synchronizing step then begins with a tiny allreduce (who has data). */
    ddp_join_mode uneven_inputs;
    /* ZeRO stage 1 (default $DDP_SHARD_OPTIMIZER, else 0): each rank keeps AdamW's m and v for its
       own part of every bucket only; buckets are reduce-scattered, each rank updates its part, the
       parameters are all-gathered. The same bits as unsharded. Ranks must agree. */
    int shard_optimizer;
    /* FP32 (default, or $DDP_PARAM_DTYPE=fp32|bf16) or BF16: every parameter has a bf16 working
       copy and a bf16 gradient (ddp_param_bf16, ddp_grad_bf16); ddp.h keeps the fp32 master
       weights and AdamW's m and v. Ranks must agree (checked at commit). */
    ddp_dtype param_dtype;
    /* 1 (or $DDP_CHECK_READY=1): a debugging run on ONE rank, host memory (single or CPU backend)
       checks the tape's ids: each gradient is copied when it is marked ready and compared at
       ddp_finish; a change means an op replayed later wrote it after its bucket could have been
       averaged (with several ranks: a wrong average). DDP_ERR_INVALID_STATE names the parameter.
       Costs a copy of the gradients. */
    int check_ready;
    /* Replica groups and their outer synchronization (OUTER SYNC in the manual). Default: off.
       Ranks must agree (checked at commit). */
    ddp_outer outer;
    /* The sharding level (default $DDP_SHARD=none|optimizer|gradients|parameters, else as
       shard_optimizer says; resolved, shard_optimizer is 1 for every level from OPTIMIZER up).
       Ranks must agree. */
    ddp_shard shard;
    /* The ranks a shard spans (default $DDP_SHARD_GROUP, else 0): 0 = every rank (with outer:
       the replica group, or its size); N, a divisor of the world below it: hybrid sharding, the
       state in parts within each N consecutive ranks, replicated across those groups (HYBRID
       SHARDING in the manual); the world: plain sharding; 1: DDP. Needs shard >= OPTIMIZER. */
    int shard_group;
    /* DDP_SHARD_GRADIENTS only (default $DDP_SHARD_ACCUMULATE, else 0): how micro-steps with sync
       off accumulate. 0: on each rank, the whole gradients kept until the synchronizing micro-step
       (PyTorch's no_sync; the bits of unsharded accumulation). 1: every micro-step's buckets are
       reduce-scattered and added into an fp32 accumulator of this rank's parts, the rest released
       at once (1/world of the gradient memory while accumulating, a reduce-scatter per micro-step;
       the same bits on every rank, not those of unsharded accumulation: SHARDED GRADIENTS). */
    int shard_accumulate;
    /* DDP_SHARD_PARAMETERS only (default $DDP_SHARD_PREFETCH=on|off, else 0): 1 turns the next
       unit's prefetch off: ddp_unit_prefetch does nothing and the tape's backward gathers each
       unit only when its first op replays (one unit gathered at a time instead of two: less
       memory, no overlap; the same bits). Each rank decides for itself. */
    int shard_prefetch_off;
} ddp_desc;

typedef struct ddp_context ddp_context;

/* The flat buffers' layout (MEMORY LAYOUT in the manual): parameter i starts at the sum of the
   earlier parameters' counts, each rounded up to a multiple of this many floats (64 bytes). */
#define DDP_PARAM_ALIGN_FLOATS 16

/* Parameter flags. */
enum { DDP_NO_DECAY = 1 << 0 };   /* AdamW skips weight decay for this parameter */

typedef struct ddp_adamw {
    float lr;                  /* used as given (0 is a valid learning rate) */
    float beta1, beta2, eps;   /* 0: 0.9, 0.999, 1e-8 */
    float weight_decay;        /* decoupled, as given; parameters flagged DDP_NO_DECAY skip it */
    float max_grad_norm;       /* > 0: clip by the global L2 norm first */
    int as_given;              /* 1: beta1, beta2 and eps are used exactly as given, 0 included */
} ddp_adamw;

typedef struct ddp_bucket_info {
    size_t offset, count;      /* range of the flat gradient buffer, in floats */
    int first_param, last_param; /* registration ids covered, inclusive */
} ddp_bucket_info;

typedef struct ddp_step_stats {
    double backward_ms;        /* backward start to ddp_finish */
    double comm_ms;            /* time the communication thread spent reducing buckets */
    double exposed_ms;         /* time ddp_finish waited for communication */
    double overlap_pct;        /* share of comm hidden under backward: 100 * (1 - exposed / comm) */
    double last_bucket_comm_ms;/* the last bucket's allreduce: what overlap cannot hide */
    uint64_t bytes_reduced;    /* gradient bytes handed to the allreduce, in the reduce dtype */
    int buckets_launched;
    int64_t step;              /* which ddp_finish (1, 2, ...) these numbers describe; on the NCCL
                                  backend the newest one whose GPU work has completed */
    /* Stragglers (STRAGGLERS in the manual): who arrived last at the step's synchronizing
       exchanges (each gradient bucket; with uneven inputs the count of ranks with data) and what
       it cost. CPU and MPI backends; -1 and zeros where unknown (one rank, a step with sync off,
       the NCCL backend). */
    int slowest_rank;          /* the rank that arrived last at the exchange whose arrivals spread
                                  most this step (the same on every rank); this rank itself when it
                                  kept the others waiting */
    double straggler_wait_ms;  /* this rank's waits for the last arrival, summed over the exchanges */
    double straggler_first_wait_ms; /* the first exchange's part: a slower forward/backward elsewhere */
    double straggler_spread_ms;/* last arrival - first arrival, summed over the exchanges: what the
                                  straggler cost the rank that waited most (an upper bound) */
} ddp_step_stats;

/* Process group. On failure *out may still hold a context that only reports the error: call
   ddp_last_error(*out), then ddp_shutdown(*out). ddp_shutdown frees the context: call it once. */
ddp_result ddp_init(ddp_context **out, const ddp_desc *desc);
ddp_result ddp_shutdown(ddp_context *ctx);
int ddp_rank(const ddp_context *ctx);
int ddp_world_size(const ddp_context *ctx);
int ddp_local_rank(const ddp_context *ctx);
const ddp_desc *ddp_config(const ddp_context *ctx);   /* every default resolved */
const char *ddp_backend_name(const ddp_context *ctx);
const char *ddp_last_error(const ddp_context *ctx);
const char *ddp_result_string(ddp_result result);

/* Parameters: register before commit (init may be NULL for zeros; it is read at commit). The id
   is the registration index (0, 1, ...; id_out may be NULL); ddp_param and the other views are
   NULL with an error before ddp_commit. */
ddp_result ddp_register_param(ddp_context *ctx, const char *name, size_t count, unsigned flags,
                              const float *init, int *id_out);
ddp_result ddp_commit(ddp_context *ctx);
float *ddp_param(ddp_context *ctx, int id);          /* views into the flat buffers (device memory on NCCL) */
float *ddp_grad(ddp_context *ctx, int id);
size_t ddp_param_count(const ddp_context *ctx, int id);
const char *ddp_param_name(const ddp_context *ctx, int id);
int ddp_num_params(const ddp_context *ctx);
float *ddp_flat_params(ddp_context *ctx, size_t *count_out);
float *ddp_flat_grads(ddp_context *ctx, size_t *count_out);
/* param_dtype BF16 (PARAMETER DTYPE in the manual): the bf16 working copies and gradients, views
   like ddp_param (device memory on NCCL); NULL with an error on an fp32 context. There ddp_param
   and ddp_grad are NULL with an error; ddp_flat_params is the fp32 master (read it; write
   parameters with ddp_copy_from_host / ddp_scatter_from_host, which round the working copies).
   With shard_optimizer it is this rank's parts of the master only, *count_out = their floats. */
ddp_bf16 *ddp_param_bf16(ddp_context *ctx, int id);
ddp_bf16 *ddp_grad_bf16(ddp_context *ctx, int id);
/* Units (SHARDED PARAMETERS in the manual): parameters first_id .. first_id + num_params - 1 (a
   run of registration ids) gathered and released together under DDP_SHARD_PARAMETERS; declared
   before ddp_commit, at any level (below PARAMETERS gather, prefetch and release do nothing).
   unit_out (may be NULL) is the unit's index: 0, 1, ... in declaration order. */
ddp_result ddp_register_unit(ddp_context *ctx, const char *name, int first_id, int num_params, int *unit_out);
ddp_result ddp_unit_gather(ddp_context *ctx, int unit);     /* returns once the unit's parameters are whole */
ddp_result ddp_unit_prefetch(ddp_context *ctx, int unit);   /* starts its gather; a later gather waits for it */
ddp_result ddp_unit_release(ddp_context *ctx, int unit);    /* its pages go: a touch faults until the next gather */
int ddp_num_units(const ddp_context *ctx);
int ddp_unit_gathered(const ddp_context *ctx, int unit);    /* 1 gathered, 0 released (or in flight), -1 no such unit */
ddp_bf16 *ddp_flat_params_bf16(ddp_context *ctx, size_t *count_out);
ddp_bf16 *ddp_flat_grads_bf16(ddp_context *ctx, size_t *count_out);
int ddp_num_buckets(const ddp_context *ctx);
ddp_result ddp_bucket(const ddp_context *ctx, int index, ddp_bucket_info *out);

/* The tape: an op records its backward (args are copied) and the ids of the parameters whose
   gradients that backward finalizes. ddp_backward replays it in reverse, then ddp_finish.
   A parameter used by several ops is listed on the FIRST op recorded that uses it (its backward
   runs last): listed on a later one, its bucket may be averaged before the other backwards add
   to it, a wrong answer only with several ranks. A run on one rank with check_ready
   ($DDP_CHECK_READY=1) finds it and names the parameter. A record that failed (its error is
   returned) makes the next ddp_backward fail and drop the tape: it lacks that op. */
typedef void (*ddp_backward_fn)(void *args);
ddp_result ddp_tape_record(ddp_context *ctx, ddp_backward_fn backward, const void *args,
                           size_t args_size, const int *param_ids, int num_param_ids);
ddp_result ddp_backward(ddp_context *ctx);
void ddp_tape_reset(ddp_context *ctx);               /* drop a forward that needs no backward */

/* For programs with their own autograd: mark a gradient final, then ddp_finish. */
ddp_result ddp_grad_ready(ddp_context *ctx, int id);
ddp_result ddp_finish(ddp_context *ctx);
ddp_result ddp_zero_grad(ddp_context *ctx);
/* Gradient accumulation: with sync off, backward accumulates locally and nothing is sent. */
void ddp_set_sync(ddp_context *ctx, int enabled);

ddp_result ddp_adamw_step(ddp_context *ctx, const ddp_adamw *opt, float *grad_norm_out);
/* The program's own optimizer on ddp.h's buffers: call this right before its update. It keeps
   ddp_adamw_step's guard: DDP_ERR_INVALID_STATE (nothing changes) unless a synchronizing
   ddp_finish averaged the gradients since the last step (ddp_adamw_step or this call), which
   it then marks used. Not with shard_optimizer (only this rank's part is averaged) nor bf16
   parameters (master and working copies move together only in ddp_adamw_step): refused at
   every world size. The
   NaN/Inf check stays the program's (find NaN by bits under -ffast-math: README). */
ddp_result ddp_consume_grads(ddp_context *ctx);
/* Optimizer state for checkpoints: m and v are flat like the parameters (device memory on NCCL);
   with shard_optimizer they hold this rank's parts only (SHARDED OPTIMIZER in the manual).
   *step is host memory on every backend. */
ddp_result ddp_adamw_state(ddp_context *ctx, float **m, float **v, int64_t **step);

/* Host copies of the training state on any backend: `count` floats of a flat buffer from
   `offset` (ddp_param(ctx, id) - ddp_flat_params(ctx, NULL) is a parameter's offset). Writing
   parameters or moments on one rank only makes the replicas differ: write the same everywhere. */
typedef enum ddp_buffer { DDP_PARAMS = 0, DDP_GRADS, DDP_ADAM_M, DDP_ADAM_V } ddp_buffer;
ddp_result ddp_copy_to_host(ddp_context *ctx, ddp_buffer which, size_t offset, float *dst, size_t count);
ddp_result ddp_copy_from_host(ddp_context *ctx, ddp_buffer which, size_t offset, const float *src, size_t count);
/* The same for checkpoints of a sharded state (ddp_desc.shard_optimizer): collective calls, made
   alike on every rank. Gather: root's dst receives the range from whichever rank holds it (dst
   may be NULL elsewhere). Scatter: root's src goes to every rank that holds part of the range
   (src may be NULL elsewhere). Unsharded, a gather sends nothing (root copies its own). */
ddp_result ddp_gather_to_host(ddp_context *ctx, ddp_buffer which, size_t offset, float *dst, size_t count, int root);
ddp_result ddp_scatter_from_host(ddp_context *ctx, ddp_buffer which, size_t offset, const float *src, size_t count, int root);

/* Checkpoints (CHECKPOINTS in the manual): collective calls, made alike on every rank. Rank 0
   writes and reads the one file; the state streams through ddp_gather_to_host /
   ddp_scatter_from_host, so any backend, world size and sharding saves and loads it. */
typedef struct ddp_checkpoint_info {
    int64_t step;              /* AdamW steps taken (ddp_adamw_state's count) */
    int32_t world_size;        /* of the run that saved it (information: any world size loads it) */
    int32_t sharded;           /* 1: that run's optimizer state was sharded (information) */
    uint64_t user_bytes;       /* the size of the user blob it holds */
    int32_t outer_groups;      /* replica groups of the run that saved it (0: no outer state in it) */
    int64_t outer_inner_steps; /* its outer sync's inner steps taken and fragments merged */
    int64_t outer_syncs;
} ddp_checkpoint_info;
/* Rank 0's look at a checkpoint's user blob (checksum verified) before anything is loaded:
   return 0 to refuse it, with the reason in err (the caller's error on every rank). */
typedef int (*ddp_checkpoint_check_fn)(void *arg, const ddp_checkpoint_info *info, const void *user,
                                       size_t user_bytes, char *err, size_t err_size);
/* Parameters, AdamW m, v and step, and rank 0's opaque user blob, to `path`, atomically. */
ddp_result ddp_save(ddp_context *ctx, const char *path, const void *user, size_t user_bytes);
/* Before training: can `path` take a checkpoint? *holds_out = 1 when a regular file is there. */
ddp_result ddp_save_check(ddp_context *ctx, const char *path, int *holds_out);
/* The state from `path` into every rank, the user blob into `user` (user_capacity bytes, the
   same on every rank; check may be NULL; info_out may be NULL). */
ddp_result ddp_load(ddp_context *ctx, const char *path, void *user, size_t user_capacity,
                    ddp_checkpoint_check_fn check, void *check_arg, ddp_checkpoint_info *info_out);

/* Collectives on user buffers, between steps (not while a backward is in flight). */
ddp_result ddp_allreduce(ddp_context *ctx, float *data, size_t count, ddp_op op);
ddp_result ddp_broadcast(ddp_context *ctx, void *data, size_t bytes, int root);
ddp_result ddp_barrier(ddp_context *ctx);

ddp_step_stats ddp_last_step_stats(const ddp_context *ctx);   /* of the last ddp_finish */

/* Outer sync (desc.outer; OUTER SYNC in the manual). ddp_adamw_step calls ddp_outer_step itself;
   a program with its own optimizer calls it right after each of its updates (collective: every
   rank, every inner step). Off: nothing happens. */
ddp_result ddp_outer_step(ddp_context *ctx);
typedef struct ddp_outer_status {
    int groups, group;         /* how many replica groups; this rank's (0 .. groups - 1) */
    int group_size, group_rank;/* ranks a group; this rank's index in it */
    int64_t inner_steps;       /* inner steps taken (ddp_outer_step calls) */
    int64_t syncs;             /* fragments merged so far (DiLoCo: outer steps) */
    int in_flight;             /* the fragment whose exchange is in flight, -1: none */
    double exchange_ms;        /* the last merged fragment's exchange took (its own thread with delay_steps) */
    double wait_ms;            /* all the time this rank waited for exchanges in flight (0: fully hidden) */
    /* the last merged exchange's straggler: the group whose first rank arrived last at its barrier
       (-1: one group), and how much longer than it the earliest group waited there */
    int slowest_group;
    double straggler_ms;
} ddp_outer_status;
ddp_outer_status ddp_outer_state(const ddp_context *ctx);

/* Embedding: cancel, progress, uneven inputs (NULL, LIFETIME AND THREADS in the manual says
   which thread may call what). */
ddp_result ddp_cancel(ddp_context *ctx);                  /* any thread, while ctx is live */
void ddp_cancel_token_set(ddp_cancel_token *token);       /* any thread, async-signal-safe */
int ddp_cancel_token_is_set(const ddp_cancel_token *token);
typedef struct ddp_progress {
    int64_t step;              /* ddp_finish calls completed on this rank (0: none yet) */
    int64_t loss_step;         /* the step the last ddp_report_loss came after (0: none reported) */
    double loss;               /* the last value given to ddp_report_loss */
    double step_ms;            /* wall time between the last two ddp_finish calls */
    double backward_ms, comm_ms, exposed_ms;   /* ddp_last_step_stats' values at the last ddp_finish */
    uint64_t bytes_reduced;
    int32_t active_ranks;      /* ranks with data in the last step (uneven inputs), else the world size */
    int32_t failed;            /* the context's sticky ddp_result: DDP_ERR_CANCELLED after a cancel */
} ddp_progress;
ddp_result ddp_progress_read(const ddp_context *ctx, ddp_progress *out);   /* any thread, lock-free; its
                                                       errors go to ddp_last_error(NULL), per thread */
ddp_result ddp_report_loss(ddp_context *ctx, float loss);                  /* this rank's; no communication */
/* Uneven inputs (ddp_desc.uneven_inputs): a rank out of data calls ddp_join between steps (or
   micro-steps: what it accumulated goes into the others' next step) and answers the other
   ranks' steps with zero gradients until every rank has joined (sharded, it also steps its
   parts of the state); then every rank holds the parameters and AdamW state of the last ranks
   with data. */
ddp_result ddp_join(ddp_context *ctx);

/* The distributed sampler (SAMPLER in the manual): this rank's disjoint share of each epoch of a
   dataset of n samples, the epoch's permutation the same on every rank. Pure functions of the
   struct: no context (usable before ddp_init, or without ddp.h's process group), no allocation,
   any thread. A checkpoint stores the position (epoch, i); the struct's fields must match. */
typedef struct ddp_sampler {
    uint64_t n;                /* samples in the dataset, >= 1 */
    int world, rank;           /* world >= 1 (0 is an error, not a default), 0 <= rank < world */
    uint64_t seed;             /* with the epoch, picks the permutation */
    int shuffle;               /* 0: the dataset's order; 1: a permutation seeded by (seed, epoch) */
    int drop_last;             /* 0: pad by repetition to ceil(n/world) a rank; 1: drop to floor(n/world) */
} ddp_sampler;
ddp_result ddp_sampler_count(const ddp_sampler *s, uint64_t *count_out);   /* this rank's samples per epoch */
/* The dataset index of this rank's i-th sample of `epoch`, 0 <= i < count (else an error and
   *index_out = UINT64_MAX). */
ddp_result ddp_sample(const ddp_sampler *s, uint64_t epoch, uint64_t i, uint64_t *index_out);

#ifdef __cplusplus
}
#endif
#endif /* DDP_H */

/* ============================================================================================
   IMPLEMENTATION
   ============================================================================================ */
#ifdef DDP_IMPLEMENTATION
/* The implementation needs POSIX and Linux declarations (clock_gettime, getaddrinfo, syscall,
   usleep). A strict -std=c99 hides them unless a feature macro is defined before the FIRST
   system header; when an earlier #include already settled that without them, no define here
   can bring them back: say so once, and skip the implementation (no wall of follow-on errors). */
#if defined(__GLIBC__) && !defined(__USE_MISC) && !defined(DDP__IMPLEMENTED)
#error "ddp.h: the implementation needs POSIX declarations that this file's earlier #includes left out (strict -std=c99). Put #define DDP_IMPLEMENTATION and #include \"ddp.h\" before every other #include in this file, or compile with -D_GNU_SOURCE (or -std=gnu99)."
#define DDP__IMPLEMENTED
#endif
#ifndef DDP__IMPLEMENTED
#define DDP__IMPLEMENTED


#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#ifdef _WIN32   /* the Windows half of >>platform: Win32 and Winsock, no pthreads */
#if defined(DDP_CUDA) || defined(DDP_MPI)
#error "ddp.h: the NCCL backend (DDP_CUDA) and the MPI backend (DDP_MPI) are Linux-only; on Windows ddp.h runs the single and cpu backends (build without DDP_CUDA / DDP_MPI, and not with nvcc)"
#endif
#if !defined(_WIN32_WINNT) || _WIN32_WINNT < 0x0600
#undef _WIN32_WINNT
#define _WIN32_WINNT 0x0600   /* Vista: WSAPoll, condition variables, SRW locks */
#endif
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <winsock2.h>
#include <ws2tcpip.h>
#include <windows.h>
#include <bcrypt.h>
#include <io.h>
#include <process.h>
/* windows.h defines IN and OUT as nothing (old parameter decorations): common names for sizes in
   a model's code (examples/minimal.c has IN). Gone, unless DDP_KEEP_WINDOWS_IN_OUT asks for them. */
#ifndef DDP_KEEP_WINDOWS_IN_OUT
#undef IN
#undef OUT
#endif
#else
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif
#endif

#ifndef DDP_MALLOC
#define DDP_MALLOC(size) malloc(size)
#define DDP_FREE(ptr) free(ptr)
#endif
#ifndef DDP_ASSERT
#include <assert.h>
#define DDP_ASSERT(cond) assert(cond)
#endif

#ifdef DDP_CUDA
#include <cuda_runtime_api.h>
#include <cuda.h>       /* types only (>>nccl-vm): the driver's entry points come through the runtime, no -lcuda */
#include <nccl.h>
#if defined(__CUDACC__) && !defined(DDP_KERNELS_IMPLEMENTATION)
#define DDP_KERNELS_IMPLEMENTATION   /* nvcc: the kernels come with the implementation */
#endif
#include "ddp_kernels.cuh"
#endif
#ifdef DDP_MPI
#define OMPI_SKIP_MPICXX 1    /* the C API only, also from C++ */
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* --------------------------------------------------------------------------------------------
   >>platform  The one place where POSIX and Windows differ. Everything below this section calls
   these and never asks which system it runs on; each concern is one block with a POSIX half and
   a Windows half: threads and locks, time and sleeping, processes and threads alive, the wait
   and wake of the shared-memory counters, named shared memory, sockets, random bytes, files
   (checkpoints). POSIX: the calls ddp.h always made (the names are macros where nothing is
   added, so the Linux hot paths are the same code). Windows (MinGW-w64 and MSVC): Win32 and
   Winsock only, no pthreads. Link with ws2_32 and bcrypt (MSVC: the #pragma below does it).
   What differs on Windows, and why:
   - wait/wake: WaitOnAddress wakes only threads of one process and keys on the virtual address,
     but every rank maps the segment at its own address, and ranks may be processes. So a counter
     a rank sleeps on has a named semaphore ("Local\<segment>-w<offset>"): a waiter counts itself
     in the counter's `waiters`, re-reads the value and sleeps on the semaphore (20 ms at most, as
     on the futex); the poster releases it once per waiter. A release nobody took leaves a count:
     a later wait returns at once and looks again (a spurious wake, never a lost one).
   - shared memory: a pagefile-backed file mapping, committed at creation (no SIGBUS later). The
     system frees it with its last handle and view, so a crashed job leaves nothing behind: the
     stale sweep and the early unlink have nothing to do. A rank keeps its handle until it unmaps.
   - sockets: Winsock has no MSG_DONTWAIT: ddp.h's sockets stay non-blocking there (every recv
     follows a poll), and WSAPoll stands in for poll; errors become errno values, so the messages
     are the same. Not inheritable, so a child process (ddprun) holds none of them.
   - a thread-rank that ended is seen through OpenThread + WaitForSingleObject, a process through
     OpenProcess (a process id that no longer exists, or has exited, is dead).
   -------------------------------------------------------------------------------------------- */
enum { DDP__SEG_CREATE, DDP__SEG_RESERVE, DDP__SEG_MAP, DDP__SEG_OPEN };   /* where a segment's set-up failed */
#ifdef _WIN32
#ifdef _MSC_VER
#pragma comment(lib, "ws2_32.lib")
#pragma comment(lib, "bcrypt.lib")
#endif
#ifndef EWOULDBLOCK
#define EWOULDBLOCK EAGAIN
#endif
#define MSG_NOSIGNAL 0         /* Windows has no SIGPIPE */
#define MSG_DONTWAIT 0         /* the sockets are non-blocking instead (above) */
#define DDP__SEG_PREFIX "Local\\ddp-"
#define DDP__WINDOWS 1         /* for the few messages that differ (a backend asked for that is Linux-only) */
#ifndef PATH_MAX
#define PATH_MAX MAX_PATH      /* MSVC's limits.h has none (MinGW's says 260 too) */
#endif
static int ddp__set_errno_win(void);

/* ---- atomics: cl.exe (not clang-cl) has no __atomic builtins. The shared code uses them on 32-
   and 64-bit integers only, so there they are Interlocked calls by size, each a full barrier (at
   least the order asked for; a load is a locked OR of 0, dearer than a plain load, in cl.exe
   builds only). DDP__ATOMICS_INTERLOCKED asks for this mapping on another compiler:
   tests/test_windows.sh runs MinGW builds with it, the only check of it here. ---- */
#if (defined(_MSC_VER) && !defined(__clang__)) || defined(DDP__ATOMICS_INTERLOCKED)
#include <intrin.h>
#undef __ATOMIC_RELAXED
#undef __ATOMIC_ACQUIRE
#undef __ATOMIC_RELEASE
#undef __ATOMIC_ACQ_REL
#undef __ATOMIC_SEQ_CST
#define __ATOMIC_RELAXED 0
#define __ATOMIC_ACQUIRE 2
#define __ATOMIC_RELEASE 3
#define __ATOMIC_ACQ_REL 4
#define __ATOMIC_SEQ_CST 5
static __int64 ddp__il_load(volatile void *p, size_t n) {
    return n == 8 ? _InterlockedOr64((volatile __int64 *)p, 0) : (__int64)_InterlockedOr((volatile long *)p, 0);
}
static void ddp__il_store(volatile void *p, size_t n, __int64 v) {
    if (n == 8) _InterlockedExchange64((volatile __int64 *)p, v);
    else _InterlockedExchange((volatile long *)p, (long)v);
}
static __int64 ddp__il_add(volatile void *p, size_t n, __int64 v) {   /* the new value */
    return n == 8 ? _InterlockedExchangeAdd64((volatile __int64 *)p, v) + v
                  : (__int64)(long)((unsigned long)_InterlockedExchangeAdd((volatile long *)p, (long)v) + (unsigned long)v);
}
static int ddp__il_cas(volatile void *p, void *expected, size_t n, __int64 desired) {
    if (n == 8) {
        __int64 want, old;
        memcpy(&want, expected, 8);
        old = _InterlockedCompareExchange64((volatile __int64 *)p, desired, want);
        if (old == want) return 1;
        memcpy(expected, &old, 8);
    } else {
        long want, old;
        memcpy(&want, expected, 4);
        old = _InterlockedCompareExchange((volatile long *)p, (long)desired, want);
        if (old == want) return 1;
        memcpy(expected, &old, 4);
    }
    return 0;
}
#define __atomic_load_n(p, order) ddp__il_load((volatile void *)(p), sizeof *(p))
#define __atomic_store_n(p, v, order) ddp__il_store((volatile void *)(p), sizeof *(p), (__int64)(v))
#define __atomic_add_fetch(p, v, order) ddp__il_add((volatile void *)(p), sizeof *(p), (__int64)(v))
#define __atomic_sub_fetch(p, v, order) ddp__il_add((volatile void *)(p), sizeof *(p), -(__int64)(v))
#define __atomic_compare_exchange_n(p, expected, desired, weak, success, failure) \
    ddp__il_cas((volatile void *)(p), (void *)(expected), sizeof *(p), (__int64)(desired))
#endif

/* ---- threads and locks ---- */
typedef SRWLOCK ddp__mutex;
typedef CONDITION_VARIABLE ddp__cond;
typedef HANDLE ddp__thread;
static int ddp__mutex_init(ddp__mutex *m) { InitializeSRWLock(m); return 0; }
static void ddp__mutex_destroy(ddp__mutex *m) { (void)m; }
static void ddp__mutex_lock(ddp__mutex *m) { AcquireSRWLockExclusive(m); }
static void ddp__mutex_unlock(ddp__mutex *m) { ReleaseSRWLockExclusive(m); }
static int ddp__cond_init(ddp__cond *c) { InitializeConditionVariable(c); return 0; }
static void ddp__cond_destroy(ddp__cond *c) { (void)c; }
static void ddp__cond_wait(ddp__cond *c, ddp__mutex *m) { SleepConditionVariableSRW(c, m, INFINITE, 0); }
static void ddp__cond_signal(ddp__cond *c) { WakeConditionVariable(c); }
static void ddp__cond_broadcast(ddp__cond *c) { WakeAllConditionVariable(c); }
/* a wait of at most `s` seconds (a watchdog's tick) */
static inline void ddp__cond_wait_s(ddp__cond *c, ddp__mutex *m, double s) { SleepConditionVariableSRW(c, m, (DWORD)(s * 1e3), 0); }
typedef struct ddp__thread_start { void *(*fn)(void *); void *arg; } ddp__thread_start;
static unsigned __stdcall ddp__thread_trampoline(void *p) {
    ddp__thread_start st = *(ddp__thread_start *)p;
    DDP_FREE(p);
    st.fn(st.arg);
    return 0;
}
/* 0, or non-zero when no thread could be started (as pthread_create) */
static int ddp__thread_create(ddp__thread *t, void *(*fn)(void *), void *arg) {
    ddp__thread_start *st = (ddp__thread_start *)DDP_MALLOC(sizeof *st);
    uintptr_t h;
    if (!st) return ENOMEM;
    st->fn = fn; st->arg = arg;
    h = _beginthreadex(NULL, 0, ddp__thread_trampoline, st, 0, NULL);   /* the CRT's: its per-thread state is set up */
    if (!h) { DDP_FREE(st); return EAGAIN; }
    *t = (HANDLE)h;
    return 0;
}
static void ddp__thread_join(ddp__thread t) { WaitForSingleObject(t, INFINITE); CloseHandle(t); }
static void ddp__thread_detach(ddp__thread t) { CloseHandle(t); }
/* POSIX thread cancellation has no Windows counterpart: nothing to hold off */
#define ddp__nocancel_begin(state) ((void)(*(state) = 0))
#define ddp__nocancel_end(state) ((void)(state))
static void ddp__comm_thread_short_slice(void) {}   /* Linux only (the POSIX half says why) */

/* ---- time, sleeping, the CPU ---- */
static double ddp__now(void) {
    LARGE_INTEGER freq, t;
    QueryPerformanceFrequency(&freq);   /* fixed at boot; a read of shared data, no system call */
    QueryPerformanceCounter(&t);
    return (double)t.QuadPart / (double)freq.QuadPart;
}
static void ddp__sleep_s(double s) { if (s > 0) Sleep((DWORD)(s * 1e3 + 0.999)); }
static void ddp__usleep(unsigned us) { Sleep((us + 999) / 1000); }
static void ddp__yield(void) { SwitchToThread(); }
static void ddp__cpu_relax(void) { YieldProcessor(); }
static long ddp__cpu_count(void) { SYSTEM_INFO si; GetSystemInfo(&si); return (long)si.dwNumberOfProcessors; }
static size_t ddp__page_size(void) { SYSTEM_INFO si; GetSystemInfo(&si); return (size_t)si.dwPageSize; }
static void ddp__hostname(char *buf, size_t n) {
    DWORD len = (DWORD)n;
    if (!GetComputerNameA(buf, &len)) snprintf(buf, n, "localhost");
}
/* A directory that exists (Windows has no execute bit on directories, and its read-only
   attribute does not stop creating files there); errno says why not. */
static int ddp__dir_writable(const char *dir) {
    DWORD a = GetFileAttributesA(dir);
    if (a == INVALID_FILE_ATTRIBUTES) return ddp__set_errno_win() + 1;
    if (!(a & FILE_ATTRIBUTE_DIRECTORY)) { errno = ENOTDIR; return 0; }
    return 1;
}
/* The last path separator: '/' or '\' */
static const char *ddp__last_sep(const char *path) {
    const char *a = strrchr(path, '/'), *b = strrchr(path, '\\');
    return a > b ? a : b;
}
#define ddp__kill_self() ((void)TerminateProcess(GetCurrentProcess(), 9))   /* tests' kill points: as abrupt as SIGKILL */

/* ---- processes and threads ---- */
static int ddp__getpid(void) { return (int)GetCurrentProcessId(); }
static int ddp__thread_id(void) { return (int)GetCurrentThreadId(); }
static int ddp__handle_alive(HANDLE h) {
    int alive;
    if (!h) return GetLastError() != ERROR_INVALID_PARAMETER;   /* no such id: gone; access denied: it exists */
    alive = WaitForSingleObject(h, 0) == WAIT_TIMEOUT;
    CloseHandle(h);
    return alive;
}
static int ddp__pid_alive(int pid) {
    if (pid <= 0) return 1;              /* not attached yet: nothing to say */
    return ddp__handle_alive(OpenProcess(SYNCHRONIZE | PROCESS_QUERY_LIMITED_INFORMATION, FALSE, (DWORD)pid));
}
static int ddp__thread_alive(int pid, int tid) {
    if (pid <= 0 || tid <= 0) return 1;
    return ddp__handle_alive(OpenThread(SYNCHRONIZE, FALSE, (DWORD)tid));
}
static int ddp__pid_gone(int pid) { return !ddp__pid_alive(pid); }   /* dead, or on its way out */

/* ---- errors: Win32 and Winsock codes become errno values, so every message is one path ---- */
static int ddp__errno_from_win(DWORD e) {
    switch (e) {
    case ERROR_FILE_NOT_FOUND: case ERROR_PATH_NOT_FOUND: case ERROR_INVALID_NAME: return ENOENT;
    case ERROR_ACCESS_DENIED: case ERROR_SHARING_VIOLATION: case ERROR_LOCK_VIOLATION: return EACCES;
    case ERROR_FILE_EXISTS: case ERROR_ALREADY_EXISTS: return EEXIST;
    case ERROR_NOT_ENOUGH_MEMORY: case ERROR_OUTOFMEMORY: case ERROR_COMMITMENT_LIMIT: return ENOMEM;
    case ERROR_DISK_FULL: case ERROR_HANDLE_DISK_FULL: return ENOSPC;
    case ERROR_FILENAME_EXCED_RANGE: return ENAMETOOLONG;
    case ERROR_DIRECTORY: return ENOTDIR;
    case WSAEWOULDBLOCK: return EWOULDBLOCK;
    case WSAEINPROGRESS: return EINPROGRESS;
    case WSAEINTR: return EINTR;
    case WSAECONNREFUSED: return ECONNREFUSED;
    case WSAETIMEDOUT: return ETIMEDOUT;
    case WSAEADDRINUSE: return EADDRINUSE;
    case WSAEADDRNOTAVAIL: return EADDRNOTAVAIL;
    case WSAECONNRESET: return ECONNRESET;
    case WSAECONNABORTED: return ECONNABORTED;
    case WSAENETUNREACH: return ENETUNREACH;
    case WSAEHOSTUNREACH: return EHOSTUNREACH;
    case WSAEMFILE: return EMFILE;
    case WSAENOBUFS: return ENOBUFS;
    default: return EIO;
    }
}
static int ddp__set_errno_win(void) { errno = ddp__errno_from_win(GetLastError()); return -1; }
/* The CRT's strerror knows the file errors only; the socket ones are named here. */
static const char *ddp__strerror(int e) {
    switch (e) {
    case EWOULDBLOCK: return "Operation would block";
    case EINPROGRESS: return "Operation in progress";
    case ECONNREFUSED: return "Connection refused";
    case ETIMEDOUT: return "Connection timed out";
    case EADDRINUSE: return "Address already in use";
    case EADDRNOTAVAIL: return "Cannot assign requested address";
    case ECONNRESET: return "Connection reset by peer";
    case ECONNABORTED: return "Connection aborted";
    case ENETUNREACH: return "Network is unreachable";
    case EHOSTUNREACH: return "No route to host";
    case ENOBUFS: return "No buffer space available";
    default: return strerror(e);
    }
}

/* ---- the wait and wake of a shared-memory counter (see the top of this section) ---- */
typedef struct ddp__seg_sem { size_t offset; HANDLE sem; } ddp__seg_sem;
typedef struct ddp__seg_map {    /* one mapping of a named segment in this process */
    unsigned char *base;
    size_t bytes;
    HANDLE mapping;
    char name[64];
    ddp__seg_sem *sems;
    int num_sems, cap_sems;
    struct ddp__seg_map *next;
} ddp__seg_map;
static SRWLOCK ddp__seg_lock = SRWLOCK_INIT;   /* the process's mappings: the OS's state, not a context's */
static ddp__seg_map *ddp__seg_maps;

/* The semaphore of the counter at addr (NULL: not in a segment, or none could be had). */
static HANDLE ddp__seg_sem_of(const void *addr) {
    ddp__seg_map *m;
    HANDLE h = NULL;
    int i;
    AcquireSRWLockExclusive(&ddp__seg_lock);
    for (m = ddp__seg_maps; m; m = m->next)
        if ((const unsigned char *)addr >= m->base && (const unsigned char *)addr < m->base + m->bytes) break;
    if (m) {
        size_t off = (size_t)((const unsigned char *)addr - m->base);
        for (i = 0; i < m->num_sems && !h; i++) if (m->sems[i].offset == off) h = m->sems[i].sem;
        if (!h && m->num_sems == m->cap_sems) {   /* room for more counters' semaphores */
            ddp__seg_sem *more = (ddp__seg_sem *)DDP_MALLOC(sizeof *more * (size_t)(2 * m->cap_sems + 16));
            if (more) {
                if (m->num_sems) memcpy(more, m->sems, sizeof *more * (size_t)m->num_sems);
                DDP_FREE(m->sems);
                m->sems = more;
                m->cap_sems = 2 * m->cap_sems + 16;
            }
        }
        if (!h && m->num_sems < m->cap_sems) {
            char name[96];
            snprintf(name, sizeof name, "%s-w%lu", m->name, (unsigned long)off);
            if ((h = CreateSemaphoreA(NULL, 0, 0x7fffffff, name)) != NULL) {
                m->sems[m->num_sems].offset = off;
                m->sems[m->num_sems++].sem = h;
            }
        }
    }
    ReleaseSRWLockExclusive(&ddp__seg_lock);
    return h;
}
static void ddp__futex_wait(uint32_t *addr, uint32_t seen, double seconds) {
    HANDLE h = ddp__seg_sem_of(addr);
    (void)seen;   /* the caller counted itself in `waiters` and saw `seen` after that: a post since releases the semaphore */
    if (h) WaitForSingleObject(h, (DWORD)(seconds * 1e3 + 0.999));
    else Sleep(1);
}
static void ddp__futex_wake(uint32_t *addr, uint32_t waiters) {
    HANDLE h = ddp__seg_sem_of(addr);
    if (h) ReleaseSemaphore(h, (LONG)waiters, NULL);
}

/* ---- named shared memory ---- */
static void ddp__seg_track(unsigned char *base, size_t bytes, HANDLE mapping, const char *name) {
    ddp__seg_map *m = (ddp__seg_map *)DDP_MALLOC(sizeof *m);
    if (!m) return;
    memset(m, 0, sizeof *m);   /* its counters' waits then poll every millisecond: slower, not wrong */
    m->base = base; m->bytes = bytes; m->mapping = mapping;
    snprintf(m->name, sizeof m->name, "%s", name);
    AcquireSRWLockExclusive(&ddp__seg_lock);
    m->next = ddp__seg_maps;
    ddp__seg_maps = m;
    ReleaseSRWLockExclusive(&ddp__seg_lock);
}
/* A fresh segment of `bytes` named `name` (exclusive), mapped: 0, or an errno value (EEXIST: the
   name is taken, try another) and *stage = the step that failed. Its pages are reserved now. */
static int ddp__seg_create(const char *name, size_t bytes, unsigned char **out, int *stage) {
    HANDLE h;
    void *p;
    *stage = DDP__SEG_CREATE;
    h = CreateFileMappingA(INVALID_HANDLE_VALUE, NULL, PAGE_READWRITE | SEC_COMMIT,
                           (DWORD)((unsigned long long)bytes >> 32), (DWORD)bytes, name);
    if (!h) return ddp__set_errno_win(), errno;
    if (GetLastError() == ERROR_ALREADY_EXISTS) { CloseHandle(h); return EEXIST; }
    *stage = DDP__SEG_MAP;
    if (!(p = MapViewOfFile(h, FILE_MAP_ALL_ACCESS, 0, 0, bytes))) { ddp__set_errno_win(); CloseHandle(h); return errno; }
    ddp__seg_track((unsigned char *)p, bytes, h, name);
    *out = (unsigned char *)p;
    return 0;
}
#define DDP__SEG_WRONG_SIZE (-2)
/* Map an existing segment of `bytes`: 0, an errno value, or DDP__SEG_WRONG_SIZE. */
static int ddp__seg_open(const char *name, size_t bytes, unsigned char **out, int *stage) {
    MEMORY_BASIC_INFORMATION mi;
    HANDLE h;
    void *p;
    *stage = DDP__SEG_OPEN;
    if (!(h = OpenFileMappingA(FILE_MAP_ALL_ACCESS, FALSE, name))) return ddp__set_errno_win(), errno;
    *stage = DDP__SEG_MAP;
    if (!(p = MapViewOfFile(h, FILE_MAP_ALL_ACCESS, 0, 0, 0))) { ddp__set_errno_win(); CloseHandle(h); return errno; }
    /* a mapping's size is its pages': a smaller one is the wrong one */
    if (!VirtualQuery(p, &mi, sizeof mi) || mi.RegionSize < bytes || mi.RegionSize >= bytes + ddp__page_size()) {
        UnmapViewOfFile(p); CloseHandle(h);
        return DDP__SEG_WRONG_SIZE;
    }
    ddp__seg_track((unsigned char *)p, bytes, h, name);
    *out = (unsigned char *)p;
    return 0;
}
static void ddp__seg_unlink(const char *name) { (void)name; }   /* freed with its last handle and view */
static void ddp__seg_unmap(unsigned char *p, size_t bytes) {
    ddp__seg_map **pm, *m = NULL;
    int i;
    (void)bytes;
    AcquireSRWLockExclusive(&ddp__seg_lock);
    for (pm = &ddp__seg_maps; *pm; pm = &(*pm)->next)
        if ((*pm)->base == p) { m = *pm; *pm = m->next; break; }
    ReleaseSRWLockExclusive(&ddp__seg_lock);
    UnmapViewOfFile(p);
    if (!m) return;
    for (i = 0; i < m->num_sems; i++) CloseHandle(m->sems[i].sem);
    DDP_FREE(m->sems);
    CloseHandle(m->mapping);
    DDP_FREE(m);
}
/* Nothing outlives a crashed job's last handle: nothing to sweep. */
static void ddp__seg_sweep_stale(char *removed, size_t n) { if (n) removed[0] = 0; }

/* ---- pages given back (ZeRO-2's released gradients, >>cpu-grads) ----
   ddp__pages_punch(p, bytes): give the whole pages of [p, p + bytes) back to the system, so that
   they read as zeros and cost no memory until written again; returns 1 when it did, 0 when the
   caller must zero the range itself. Windows: 0 always. A view of a section (the shared segment)
   cannot be decommitted while mapped, and MEM_RESET / DiscardVirtualMemory keep the pages
   committed with undefined contents, which the gradients' zeros cannot take: released gradients
   are zeroed there and stay resident (the layout, the bits and the checks are those of Linux). */
static int ddp__pages_punch(void *p, size_t bytes) { (void)p; (void)bytes; return 0; }

/* ---- sockets (Winsock; descriptors as int: Windows' socket handles are small numbers) ---- */
typedef int ddp__socklen;
static int ddp__net_init(void) {
    static volatile LONG started;
    WSADATA wd;
    if (started) return 0;
    if (WSAStartup(MAKEWORD(2, 2), &wd)) return -1;
    InterlockedExchange(&started, 1);   /* a second WSAStartup from a racing thread only counts twice */
    return 0;
}
static int ddp__socket(int family, int type) {
    SOCKET s;
    u_long on = 1;
    if (ddp__net_init()) { errno = EIO; return -1; }
    s = WSASocketW(family, type, 0, NULL, 0, WSA_FLAG_OVERLAPPED | WSA_FLAG_NO_HANDLE_INHERIT);
    if (s == INVALID_SOCKET) return ddp__set_errno_win();
    ioctlsocket(s, (long)FIONBIO, &on);
    return (int)s;
}
static void ddp__sock_close(int fd) { closesocket((SOCKET)fd); }
static void ddp__sock_cloexec(int fd) { (void)fd; }                 /* made not inheritable */
static void ddp__sock_nonblock(int fd) { (void)fd; }                /* made non-blocking */
static void ddp__sock_blocking(int fd) { (void)fd; }                /* stays non-blocking (above) */
static void ddp__sock_nodelay(int fd) { BOOL one = TRUE; setsockopt((SOCKET)fd, IPPROTO_TCP, TCP_NODELAY, (const char *)&one, sizeof one); }
/* SO_REUSEADDR on Windows would let another socket take the port: exclusive instead */
static void ddp__sock_reuseaddr(int fd) { BOOL one = TRUE; setsockopt((SOCKET)fd, SOL_SOCKET, SO_EXCLUSIVEADDRUSE, (const char *)&one, sizeof one); }
static long ddp__send(int fd, const void *p, size_t n, int flags) {
    int r = send((SOCKET)fd, (const char *)p, n > 0x40000000u ? 0x40000000 : (int)n, flags);
    return r == SOCKET_ERROR ? (long)ddp__set_errno_win() : (long)r;
}
static long ddp__recv(int fd, void *p, size_t n, int flags) {
    int r = recv((SOCKET)fd, (char *)p, n > 0x40000000u ? 0x40000000 : (int)n, flags);
    return r == SOCKET_ERROR ? (long)ddp__set_errno_win() : (long)r;
}
static int ddp__poll(struct pollfd *p, int n, int ms) {
    int r = WSAPoll(p, (ULONG)n, ms);
    return r == SOCKET_ERROR ? ddp__set_errno_win() : r;
}
static int ddp__connect(int fd, const struct sockaddr *a, size_t len) {
    if (connect((SOCKET)fd, a, (int)len) == 0) return 0;
    ddp__set_errno_win();
    if (errno == EWOULDBLOCK) errno = EINPROGRESS;   /* a non-blocking connect under way */
    return -1;
}
static int ddp__sock_error(int fd) {
    int err = 0, len = sizeof err;
    if (getsockopt((SOCKET)fd, SOL_SOCKET, SO_ERROR, (char *)&err, &len)) return ddp__errno_from_win((DWORD)WSAGetLastError());
    return err ? ddp__errno_from_win((DWORD)err) : 0;
}
static int ddp__bind_listen(int fd, const struct sockaddr *a, size_t len, int backlog) {
    if (bind((SOCKET)fd, a, (int)len) || listen((SOCKET)fd, backlog)) return ddp__set_errno_win();
    return 0;
}
static int ddp__accept(int fd) {
    SOCKET s = accept((SOCKET)fd, NULL, NULL);
    u_long on = 1;
    if (s == INVALID_SOCKET) return ddp__set_errno_win();
    SetHandleInformation((HANDLE)s, HANDLE_FLAG_INHERIT, 0);
    ioctlsocket(s, (long)FIONBIO, &on);
    return (int)s;
}
/* The store thread's wake-up: no pipe to poll on Windows, so a UDP socket connected to itself. */
static int ddp__wake_open(int w[2]) {
    struct sockaddr_in a;
    int len = sizeof a, s = ddp__socket(AF_INET, SOCK_DGRAM);
    w[0] = w[1] = -1;
    if (s < 0) return -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind((SOCKET)s, (struct sockaddr *)&a, sizeof a) || getsockname((SOCKET)s, (struct sockaddr *)&a, &len) ||
        connect((SOCKET)s, (struct sockaddr *)&a, sizeof a)) { closesocket((SOCKET)s); return ddp__set_errno_win(); }
    w[0] = w[1] = s;
    return 0;
}
static void ddp__wake_signal(int w[2]) { if (w[1] >= 0) send((SOCKET)w[1], "x", 1, 0); }
static void ddp__wake_close(int w[2]) { if (w[0] >= 0) closesocket((SOCKET)w[0]); w[0] = w[1] = -1; }

/* ---- random bytes ---- */
static int ddp__os_random(void *buf, size_t len) {
    return BCryptGenRandom(NULL, (PUCHAR)buf, (ULONG)len, BCRYPT_USE_SYSTEM_PREFERRED_RNG) == 0 ? 0 : (errno = EIO, -1);
}

/* ---- address space (sharded parameters: a range reserved once, its pages committed and
   decommitted as units are gathered and released; see the POSIX half). VirtualAlloc reserves at
   the allocation granularity (64 KiB) and commits by page; a page committed again reads as zeros. ---- */
static size_t ddp__vm_page(void) { return ddp__page_size(); }
static void *ddp__vm_reserve(size_t bytes) {
    void *p = VirtualAlloc(NULL, bytes, MEM_RESERVE, PAGE_NOACCESS);
    if (!p) ddp__set_errno_win();
    return p;
}
static int ddp__vm_commit(void *p, size_t bytes) {
    return VirtualAlloc(p, bytes, MEM_COMMIT, PAGE_READWRITE) ? 0 : ddp__set_errno_win();
}
static int ddp__vm_decommit(void *p, size_t bytes) {
    return VirtualFree(p, bytes, MEM_DECOMMIT) ? 0 : ddp__set_errno_win();
}
static int ddp__vm_release(void *p, size_t bytes) {
    (void)bytes;   /* MEM_RELEASE frees the whole reservation, and wants size 0 */
    return VirtualFree(p, 0, MEM_RELEASE) ? 0 : ddp__set_errno_win();
}
/* A hook told the address of each access violation before the system's handling goes on (a
   debugging run names what was touched; see the POSIX half): a vectored exception handler. */
static void (*ddp__fault_fn)(void *addr);
static PVOID ddp__fault_handle;
static LONG CALLBACK ddp__fault_vectored(PEXCEPTION_POINTERS e) {
    if (e->ExceptionRecord->ExceptionCode == EXCEPTION_ACCESS_VIOLATION && ddp__fault_fn && e->ExceptionRecord->NumberParameters >= 2)
        ddp__fault_fn((void *)e->ExceptionRecord->ExceptionInformation[1]);
    return EXCEPTION_CONTINUE_SEARCH;
}
static void ddp__fault_hook(void (*fn)(void *addr)) {
    ddp__fault_fn = fn;
    if (fn && !ddp__fault_handle) ddp__fault_handle = AddVectoredExceptionHandler(1, ddp__fault_vectored);
    if (!fn && ddp__fault_handle) { RemoveVectoredExceptionHandler(ddp__fault_handle); ddp__fault_handle = NULL; }
}
static void ddp__write_stderr(const char *s) { DWORD n; WriteFile(GetStdHandle(STD_ERROR_HANDLE), s, (DWORD)strlen(s), &n, NULL); }


/* ---- files (checkpoints): UTF-8 paths, wide Win32 calls; descriptors are the CRT's over the
   handles. The checkpoint's atomic replace is MoveFileExW(MOVEFILE_REPLACE_EXISTING |
   MOVEFILE_WRITE_THROUGH): one rename that replaces the old file (readers see the old or the new
   checkpoint, never a mix), returning only once it is on disk (what the directory fsync does on
   POSIX). Not ReplaceFileW: it needs the old file to exist (the first save has none), merges the
   old file's attributes into the new one, and can fail half-way leaving the old file under
   another name. Files ddp.h reads are opened with FILE_SHARE_DELETE so a save can replace a
   checkpoint being loaded, as on POSIX; another program holding it open without that share
   makes the save fail with a named error (Windows' rule), never a half-written file. ---- */
static wchar_t *ddp__wide(const char *path) {
    int n = MultiByteToWideChar(CP_UTF8, 0, path, -1, NULL, 0);
    wchar_t *w = n > 0 ? (wchar_t *)DDP_MALLOC(sizeof(wchar_t) * (size_t)n) : NULL;
    if (!w || !MultiByteToWideChar(CP_UTF8, 0, path, -1, w, n)) { DDP_FREE(w); errno = n > 0 ? ENOMEM : ENOENT; return NULL; }
    return w;
}
static int ddp__fd_of(HANDLE h) {
    int fd;
    if (h == INVALID_HANDLE_VALUE) return ddp__set_errno_win();
    if ((fd = _open_osfhandle((intptr_t)h, 0)) < 0) { CloseHandle(h); errno = EMFILE; }
    return fd;
}
static HANDLE ddp__handle_of(int fd) { return (HANDLE)_get_osfhandle(fd); }
static int ddp__file_open_read(const char *path) {
    wchar_t *w = ddp__wide(path);
    HANDLE h;
    if (!w) return -1;
    h = CreateFileW(w, GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, NULL, OPEN_EXISTING,
                    FILE_FLAG_BACKUP_SEMANTICS /* a directory opens too: then it is named */, NULL);
    if (h == INVALID_HANDLE_VALUE) ddp__set_errno_win();
    DDP_FREE(w);
    return h == INVALID_HANDLE_VALUE ? -1 : ddp__fd_of(h);
}
/* 0 with *kind NULL for a regular file (*size its length) or what the file is instead; -1 with errno. */
static int ddp__file_stat(int fd, uint64_t *size, const char **kind) {
    HANDLE h = ddp__handle_of(fd);
    BY_HANDLE_FILE_INFORMATION info;
    *kind = NULL;
    if (GetFileType(h) != FILE_TYPE_DISK) { *kind = GetFileType(h) == FILE_TYPE_PIPE ? "a pipe" : "a device"; return 0; }
    if (!GetFileInformationByHandle(h, &info)) return ddp__set_errno_win();
    if (info.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY) { *kind = "a directory"; return 0; }
    *size = (uint64_t)info.nFileSizeHigh << 32 | info.nFileSizeLow;
    return 0;
}
/* What is at `path` if it is something a rename must not replace (a directory or a device);
   NULL for nothing there, a file or a link. */
static const char *ddp__path_kind(const char *path) {
    wchar_t *w = ddp__wide(path);
    DWORD a = w ? GetFileAttributesW(w) : INVALID_FILE_ATTRIBUTES;
    const char *kind = NULL;
    DDP_FREE(w);
    if (a != INVALID_FILE_ATTRIBUTES && (a & FILE_ATTRIBUTE_DIRECTORY) && !(a & FILE_ATTRIBUTE_REPARSE_POINT)) return "a directory";
    if (a != INVALID_FILE_ATTRIBUTES) {   /* a DOS device name (NUL, CON) answers too: look at its type */
        int fd = ddp__file_open_read(path);
        uint64_t size;
        if (fd >= 0) {
            if (ddp__file_stat(fd, &size, &kind) != 0) kind = NULL;
            _close(fd);
        }
    }
    return kind;
}
/* A new file, refused if anything is there (a link included: CREATE_NEW does not follow one). */
static int ddp__file_create_excl(const char *path) {
    wchar_t *w = ddp__wide(path);
    HANDLE h;
    if (!w) return -1;
    h = CreateFileW(w, GENERIC_WRITE | GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_DELETE, NULL, CREATE_NEW,
                    FILE_ATTRIBUTE_NORMAL | FILE_FLAG_OPEN_REPARSE_POINT, NULL);
    if (h == INVALID_HANDLE_VALUE) ddp__set_errno_win();
    DDP_FREE(w);
    return h == INVALID_HANDLE_VALUE ? -1 : ddp__fd_of(h);
}
static long ddp__file_write(int fd, const void *p, size_t n) {
    DWORD done = 0;
    if (!WriteFile(ddp__handle_of(fd), p, n > 0x40000000u ? 0x40000000u : (DWORD)n, &done, NULL)) return ddp__set_errno_win();
    return (long)done;
}
static long ddp__file_pread(int fd, void *p, size_t n, uint64_t off) {
    OVERLAPPED o;
    DWORD done = 0;
    memset(&o, 0, sizeof o);
    o.Offset = (DWORD)off;
    o.OffsetHigh = (DWORD)(off >> 32);
    if (!ReadFile(ddp__handle_of(fd), p, n > 0x40000000u ? 0x40000000u : (DWORD)n, &done, &o))
        return GetLastError() == ERROR_HANDLE_EOF ? 0 : ddp__set_errno_win();
    return (long)done;
}
static int ddp__file_sync(int fd) { return FlushFileBuffers(ddp__handle_of(fd)) ? 0 : ddp__set_errno_win(); }
static int ddp__file_close(int fd) { return _close(fd); }
static int ddp__file_replace(const char *from, const char *to) {
    wchar_t *a = ddp__wide(from), *b = a ? ddp__wide(to) : NULL;
    int ok = b && MoveFileExW(a, b, MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH);
    if (b && !ok) ddp__set_errno_win();
    DDP_FREE(a); DDP_FREE(b);
    return ok ? 0 : -1;
}
static int ddp__file_unlink(const char *path) {
    wchar_t *w = ddp__wide(path);
    int ok = w && DeleteFileW(w);
    if (w && !ok) ddp__set_errno_win();
    DDP_FREE(w);
    return ok ? 0 : -1;
}
static int ddp__dir_sync(const char *dir) { (void)dir; return 1; }   /* MOVEFILE_WRITE_THROUGH did it */
static long ddp__name_max(const char *dir) { (void)dir; return 255; }  /* NTFS, FAT32, ReFS: 255 UTF-16 units */
/* Each entry of `dir` whose name begins with `prefix`: fn(user, name). */
static void ddp__dir_each(const char *dir, const char *prefix, void (*fn)(void *user, const char *name), void *user) {
    char pattern[PATH_MAX + 16];
    wchar_t *w;
    WIN32_FIND_DATAW fd;
    HANDLE h;
    snprintf(pattern, sizeof pattern, "%s\\%s*", dir, prefix);
    if (!(w = ddp__wide(pattern))) return;
    h = FindFirstFileW(w, &fd);
    DDP_FREE(w);
    if (h == INVALID_HANDLE_VALUE) return;
    do {
        char name[MAX_PATH * 4];
        if (WideCharToMultiByte(CP_UTF8, 0, fd.cFileName, -1, name, sizeof name, NULL, NULL)) fn(user, name);
    } while (FindNextFileW(h, &fd));
    FindClose(h);
}
/* Remove dir/name if it is a plain file (not a directory, link or device). Windows: the
   directory's permissions say whose it may be. */
static void ddp__file_remove_plain(const char *dir, const char *name) {
    char path[PATH_MAX + 300];
    wchar_t *w;
    DWORD a;
    snprintf(path, sizeof path, "%s\\%s", dir, name);
    if (!(w = ddp__wide(path))) return;
    a = GetFileAttributesW(w);
    if (a != INVALID_FILE_ATTRIBUTES && !(a & (FILE_ATTRIBUTE_DIRECTORY | FILE_ATTRIBUTE_REPARSE_POINT | FILE_ATTRIBUTE_DEVICE)))
        DeleteFileW(w);
    DDP_FREE(w);
}

#else /* POSIX ------------------------------------------------------------------------------ */
#define DDP__SEG_PREFIX "/ddp-"
#define DDP__WINDOWS 0
#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0         /* macOS: SO_NOSIGPIPE on each socket instead (ddp__sock_cloexec) */
#endif

/* ---- threads and locks ---- */
typedef pthread_mutex_t ddp__mutex;
typedef pthread_cond_t ddp__cond;
typedef pthread_t ddp__thread;
#define ddp__mutex_init(m) pthread_mutex_init((m), NULL)
#define ddp__mutex_destroy(m) pthread_mutex_destroy(m)
#define ddp__mutex_lock(m) pthread_mutex_lock(m)
#define ddp__mutex_unlock(m) pthread_mutex_unlock(m)
#define ddp__cond_init(c) pthread_cond_init((c), NULL)
#define ddp__cond_destroy(c) pthread_cond_destroy(c)
#define ddp__cond_wait(c, m) pthread_cond_wait((c), (m))
#define ddp__cond_signal(c) pthread_cond_signal(c)
#define ddp__cond_broadcast(c) pthread_cond_broadcast(c)
/* a wait of at most `s` seconds (a watchdog's tick); the condition's clock is the realtime one */
static inline void ddp__cond_wait_s(ddp__cond *c, ddp__mutex *m, double s) {
    struct timespec ts;
    long ns = (long)(s * 1e9);
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ns / 1000000000L;
    ts.tv_nsec += ns % 1000000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(c, m, &ts);
}
#define ddp__thread_create(t, fn, arg) pthread_create((t), NULL, (fn), (arg))
#define ddp__thread_join(t) pthread_join((t), NULL)
#define ddp__thread_detach(t) pthread_detach(t)
/* pthread_cancel of a rank's thread inside a section that holds a lock would leave it held */
#define ddp__nocancel_begin(state) pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, (state))
#define ddp__nocancel_end(state) pthread_setcancelstate((state), NULL)
/* The communication thread shares the cores with compute threads that never sleep. Each chunk
   of an allreduce is a handshake with the peers' communication threads, so what matters is how
   soon a woken communication thread runs. On Linux >= 6.12 (EEVDF) a short scheduler slice
   lets it preempt a busy compute thread at once; elsewhere the call fails and nothing changes.
   No privilege is needed and the thread's nice value is kept. */
static void ddp__comm_thread_short_slice(void) {
#if defined(__linux__) && defined(SYS_sched_setattr)
    struct { uint32_t size, policy; uint64_t flags; int32_t nice; uint32_t priority;
             uint64_t runtime, deadline, period; } attr;
    memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;          /* 48: SCHED_ATTR_SIZE_VER0 */
    attr.policy = 0;                  /* SCHED_OTHER */
    errno = 0;
    attr.nice = getpriority(PRIO_PROCESS, 0);
    attr.runtime = 100000;            /* slice: 0.1 ms */
    if (errno == 0) syscall(SYS_sched_setattr, 0, &attr, 0);
#endif
}

/* ---- time, sleeping, the CPU ---- */
static double ddp__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static void ddp__sleep_s(double s) {
    struct timespec ts;
    if (s <= 0) return;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) && errno == EINTR) {}
}
#define ddp__usleep(us) usleep(us)
#define ddp__yield() sched_yield()
/* A spin-wait hint: the core runs the sibling hyperthread and saves power while we poll. */
static void ddp__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}
#define ddp__cpu_count() sysconf(_SC_NPROCESSORS_ONLN)
#define ddp__page_size() ((size_t)sysconf(_SC_PAGESIZE))
static void ddp__hostname(char *buf, size_t n) { if (gethostname(buf, n - 1)) snprintf(buf, n, "localhost"); buf[n - 1] = 0; }
#define ddp__dir_writable(dir) (access((dir), W_OK | X_OK) == 0)
#define ddp__last_sep(path) strrchr((path), '/')
#define ddp__kill_self() raise(SIGKILL)
#define ddp__strerror(e) strerror(e)

/* ---- processes and threads ---- */
#define ddp__getpid() ((int)getpid())
/* The fields of /proc/.../stat after "(comm) ", read into buf: NULL when it cannot be read (the
   process or thread is gone, or was reaped while being read, or there is no /proc). */
static const char *ddp__proc_stat(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "r");
    const char *close_paren;
    size_t got = f ? fread(buf, 1, n - 1, f) : 0;
    if (f) fclose(f);
    buf[got] = 0;
    close_paren = strrchr(buf, ')');
    return close_paren && close_paren[1] == ' ' && close_paren[2] ? close_paren + 2 : NULL;
}
static int ddp__no_such_pid(int pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

/* Alive = exists and is not a zombie (a dead child its launcher has not reaped yet). A stat that
   cannot be read asks kill() again: a zombie reaped between the two looks is dead (taken for alive,
   a survivor's sweep left a dead rank 0's segment in /dev/shm). */
static int ddp__pid_alive(int pid) {
    char path[64], buf[256];
    const char *fields;
    if (pid <= 0) return 1;              /* not attached yet: nothing to say */
    if (ddp__no_such_pid(pid)) return 0;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    if (!(fields = ddp__proc_stat(path, buf, sizeof buf))) return !ddp__no_such_pid(pid);   /* no /proc: alive */
    return fields[0] != 'Z' && fields[0] != 'X';
}

/* A process on its way out (SIGKILLed, say): its sockets may already be closed, so a peer can
   see it gone before it is a zombie. PF_EXITING is the 9th field of /proc/PID/stat. */
static int ddp__pid_exiting(int pid) {
    char path[64], buf[512];
    const char *fields;
    unsigned flags = 0;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    fields = ddp__proc_stat(path, buf, sizeof buf);
    return fields && sscanf(fields, "%*c %*d %*d %*d %*d %*d %u", &flags) == 1 && (flags & 0x4u);
}
/* Dead, or on its way out (SIGKILLed: its threads torn down, not yet a zombie). */
static int ddp__pid_gone(int pid) { return pid > 0 && (!ddp__pid_alive(pid) || ddp__pid_exiting(pid)); }

/* The calling thread's id, and whether thread `tid` of process `pid` still runs. With ranks as
   threads of one process the process outlives a rank whose thread ended without ddp_shutdown:
   its peers must see that as they see a dead process. */
static int ddp__thread_id(void) {
#ifdef __linux__
    return (int)syscall(SYS_gettid);
#else
    return 0;
#endif
}

static int ddp__thread_alive(int pid, int tid) {
    char path[64], buf[256];
    const char *fields;
    if (pid <= 0 || tid <= 0) return 1;
    snprintf(path, sizeof path, "/proc/%d/task/%d/stat", pid, tid);
    if ((fields = ddp__proc_stat(path, buf, sizeof buf)) != NULL) return fields[0] != 'Z' && fields[0] != 'X';
    snprintf(path, sizeof path, "/proc/%d", pid);
    if (access(path, F_OK) == 0) return 0;   /* the process is there, the thread is not */
    return !ddp__no_such_pid(pid);           /* reaped: dead; no /proc to ask: nothing to say */
}

/* ---- the wait and wake of a shared-memory counter: a futex (elsewhere: a short sleep) ---- */
static void ddp__futex_wait(uint32_t *addr, uint32_t seen, double seconds) {
#ifdef __linux__
    struct timespec ts;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    syscall(SYS_futex, addr, FUTEX_WAIT, seen, &ts, NULL, 0);
#else
    (void)addr; (void)seen; (void)seconds;
    usleep(50);
#endif
}

static void ddp__futex_wake(uint32_t *addr, uint32_t waiters) {
    (void)waiters;
#ifdef __linux__
    syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#else
    (void)addr;
#endif
}

/* ---- named shared memory (POSIX shm) ---- */
/* Size a new segment and take its pages now. A tmpfs that runs out of room while a page is
   first touched kills the process with SIGBUS, mid-step; reserved here, the shortage is an
   error at init or commit instead. Returns 0 or an errno. */
static int ddp__shm_reserve(int fd, size_t bytes) {
    int err;
    if (ftruncate(fd, (off_t)bytes)) return errno;
#ifdef __linux__
    err = posix_fallocate(fd, 0, (off_t)bytes);
    if (err == EOPNOTSUPP || err == EINVAL) err = 0;   /* a file system without it: as before */
#else
    err = 0;
#endif
    return err;
}
static int ddp__seg_map_fd(int fd, size_t bytes, unsigned char **out) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (p == MAP_FAILED) return err;
    *out = (unsigned char *)p;
    return 0;
}
/* A fresh owner-only segment of `bytes` named `name` (exclusive), mapped: 0, or an errno value
   (EEXIST: the name is taken, try another) and *stage = the step that failed. */
static int ddp__seg_create(const char *name, size_t bytes, unsigned char **out, int *stage) {
    int fd, err;
    *stage = DDP__SEG_CREATE;
    if ((fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600)) < 0) return errno;
    *stage = DDP__SEG_RESERVE;
    if ((err = ddp__shm_reserve(fd, bytes)) != 0) { close(fd); shm_unlink(name); return err; }
    *stage = DDP__SEG_MAP;
    if ((err = ddp__seg_map_fd(fd, bytes, out)) != 0) { shm_unlink(name); return err; }
    return 0;
}
#define DDP__SEG_WRONG_SIZE (-2)
/* Map an existing segment of `bytes`: 0, an errno value, or DDP__SEG_WRONG_SIZE. */
static int ddp__seg_open(const char *name, size_t bytes, unsigned char **out, int *stage) {
    struct stat st;
    int fd;
    *stage = DDP__SEG_OPEN;
    if ((fd = shm_open(name, O_RDWR, 0600)) < 0) return errno;
    if (fstat(fd, &st) || (size_t)st.st_size != bytes) { close(fd); return DDP__SEG_WRONG_SIZE; }
    *stage = DDP__SEG_MAP;
    return ddp__seg_map_fd(fd, bytes, out);
}
#define ddp__seg_unlink(name) ((void)shm_unlink(name))
#define ddp__seg_unmap(p, bytes) ((void)munmap((p), (bytes)))
/* ---- pages given back (ZeRO-2's released gradients, >>cpu-grads) ----
   ddp__pages_punch(p, bytes): p and bytes whole pages. Give them back to the system so that they
   read as zeros and cost no memory until written again: 1 when done, 0 when the caller must
   zero the range itself. A shared mapping (the gradient segment, tmpfs): MADV_REMOVE punches
   the hole in the segment itself, so the pages leave the page cache for every rank that maps
   them (MADV_DONTNEED would only unmap them here and keep the contents). Private memory
   (DDP_STAGED_GRADS, the MPI backend): MADV_REMOVE is refused (EINVAL), MADV_DONTNEED frees
   them and the next touch maps a zero page. A punched page is no longer reserved by the
   segment's posix_fallocate: writing it again takes a page of /dev/shm, which a full /dev/shm
   refuses with SIGBUS (as any shared memory that grows). Systems without MADV_REMOVE (macOS):
   MADV_DONTNEED does not zero shared pages there, so 0 (zeroed by the caller, resident). */
static int ddp__pages_punch(void *p, size_t bytes) {
    if (!bytes) return 1;
#ifdef MADV_REMOVE
    if (madvise(p, bytes, MADV_REMOVE) == 0) return 1;
    if (errno == EINVAL && madvise(p, bytes, MADV_DONTNEED) == 0) return 1;   /* private anonymous memory */
#endif
    return 0;
}
/* Segments are named after the creating pid, so a segment whose creator is gone belongs to a
   crashed job and can go. The names removed are listed in `removed`. */
static void ddp__seg_sweep_stale(char *removed, size_t n) {
    DIR *dir = opendir("/dev/shm");
    struct dirent *e;
    size_t len = 0;
    if (n) removed[0] = 0;
    if (!dir) return;
    while ((e = readdir(dir)) != NULL) {
        char path[300];
        struct stat st;
        int pid;
        if (sscanf(e->d_name, "ddp-%d-", &pid) != 1 || (ddp__pid_alive(pid) && !ddp__pid_exiting(pid))) continue;
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        if (stat(path, &st) || st.st_uid != geteuid()) continue;
        snprintf(path, sizeof path, "/%s", e->d_name);
        if (shm_unlink(path) == 0 && len + strlen(path) + 3 < n)
            len += (size_t)snprintf(removed + len, n - len, "%s%s", len ? ", " : "", path);
    }
    closedir(dir);
}

/* ---- sockets ---- */
typedef socklen_t ddp__socklen;
#define ddp__net_init() ((void)0)
static int ddp__socket(int family, int type) {
    int fd = socket(family, type, 0);
#ifdef SO_NOSIGPIPE
    if (fd >= 0) { int one = 1; setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one); }   /* macOS: no MSG_NOSIGNAL */
#endif
    return fd;
}
#define ddp__sock_close(fd) close(fd)
#define ddp__sock_cloexec(fd) ((void)fcntl((fd), F_SETFD, FD_CLOEXEC))
#define ddp__sock_nonblock(fd) ((void)fcntl((fd), F_SETFL, fcntl((fd), F_GETFL) | O_NONBLOCK))
#define ddp__sock_blocking(fd) ((void)fcntl((fd), F_SETFL, fcntl((fd), F_GETFL) & ~O_NONBLOCK))
static void ddp__sock_nodelay(int fd) { int one = 1; setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); }
static void ddp__sock_reuseaddr(int fd) { int one = 1; setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); }
#define ddp__send(fd, p, n, flags) ((long)send((fd), (p), (n), (flags)))
#define ddp__recv(fd, p, n, flags) ((long)recv((fd), (p), (n), (flags)))
#define ddp__poll(p, n, ms) poll((p), (nfds_t)(n), (ms))
#define ddp__connect(fd, a, len) connect((fd), (a), (socklen_t)(len))
static int ddp__sock_error(int fd) {
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len)) return errno;
    return err;
}
static int ddp__bind_listen(int fd, const struct sockaddr *a, size_t len, int backlog) {
    return bind(fd, a, (socklen_t)len) || listen(fd, backlog) ? -1 : 0;
}
static int ddp__accept(int fd) {
    int c = accept(fd, NULL, NULL);
    if (c < 0) return c;
    ddp__sock_nonblock(c);
    ddp__sock_cloexec(c);
#ifdef SO_NOSIGPIPE
    { int one = 1; setsockopt(c, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one); }
#endif
    return c;
}
/* The store thread's wake-up: a pipe it polls. */
static int ddp__wake_open(int w[2]) {
    if (pipe(w)) { w[0] = w[1] = -1; return -1; }
    ddp__sock_cloexec(w[0]);
    ddp__sock_cloexec(w[1]);
    return 0;
}
static void ddp__wake_signal(int w[2]) { if (w[1] >= 0 && write(w[1], "x", 1) < 0) { /* the 50 ms poll wakes it anyway */ } }
static void ddp__wake_close(int w[2]) { if (w[0] >= 0) { close(w[0]); close(w[1]); } w[0] = w[1] = -1; }

/* ---- random bytes: the kernel's ---- */
static int ddp__os_random(void *buf, size_t len) {
    unsigned char *p = (unsigned char *)buf;
    int fd;
#if defined(__linux__) && defined(SYS_getrandom)
    while (len) {
        long n = syscall(SYS_getrandom, p, len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;                     /* an old kernel: /dev/urandom below */
        p += n; len -= (size_t)n;
    }
    if (!len) return 0;
#endif
    if ((fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC)) < 0) return -1;
    while (len) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) { close(fd); return -1; }
        p += n; len -= (size_t)n;
    }
    close(fd);
    return 0;
}
/* ---- address space: a range reserved once whose pages are committed and decommitted (sharded
   parameters: a unit's pages stand behind its parameters only while it is gathered, and the
   pointers never move). Reserve: PROT_NONE and MAP_NORESERVE, so it costs no memory and no
   commit charge; commit: read-write (pages appear, zero-filled, at the first touch); decommit:
   the contents dropped (MADV_DONTNEED on a private anonymous mapping frees them at once on Linux;
   elsewhere a fresh PROT_NONE mapping over the range, which drops them on every POSIX system) and
   PROT_NONE again, so a touch faults (SIGSEGV) instead of reading stale data. The calls take
   page-aligned addresses and sizes (ddp__vm_page). 0, or -1 with errno (reserve: NULL). ---- */
#if !defined(MAP_ANONYMOUS) && defined(MAP_ANON)
#define MAP_ANONYMOUS MAP_ANON
#endif
#ifndef MAP_NORESERVE
#define MAP_NORESERVE 0
#endif
static size_t ddp__vm_page(void) { return ddp__page_size(); }
static void *ddp__vm_reserve(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}
static int ddp__vm_commit(void *p, size_t bytes) { return mprotect(p, bytes, PROT_READ | PROT_WRITE); }
static int ddp__vm_decommit(void *p, size_t bytes) {
#ifdef __linux__
    if (madvise(p, bytes, MADV_DONTNEED) != 0) return -1;
    return mprotect(p, bytes, PROT_NONE);
#else
    return mmap(p, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED ? -1 : 0;
#endif
}
static int ddp__vm_release(void *p, size_t bytes) { return munmap(p, bytes); }
/* Pages of a shared segment (MAP_SHARED, tmpfs) whose contents nobody needs, given back to the
   system (MADV_REMOVE: a later touch reads zeros). Where there is no such call, nothing happens
   (more memory, the same results). */
/* A hook told the address of each SIGSEGV (fn NULL: removed). The handler calls it, puts the
   handler that was there before back, and returns: the access faults again and meets that one
   (by default the process dies of SIGSEGV, as it would have). Process-wide: one at a time. */
static void (*ddp__fault_fn)(void *addr);
static struct sigaction ddp__fault_prev;
static void ddp__fault_action(int sig, siginfo_t *si, void *uc) {
    (void)sig; (void)uc;
    if (ddp__fault_fn) ddp__fault_fn(si->si_addr);
    ddp__fault_fn = NULL;
    sigaction(SIGSEGV, &ddp__fault_prev, NULL);
}
static void ddp__fault_hook(void (*fn)(void *addr)) {
    struct sigaction sa;
    if (fn && !ddp__fault_fn) {
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = ddp__fault_action;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &ddp__fault_prev);
    } else if (!fn && ddp__fault_fn) sigaction(SIGSEGV, &ddp__fault_prev, NULL);
    ddp__fault_fn = fn;
}
static void ddp__write_stderr(const char *s) { if (write(2, s, strlen(s)) < 0) { /* nothing more to do in a fault */ } }
/* ---- files (checkpoints) ---- */
static int ddp__file_open_read(const char *path) { return open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); }   /* a FIFO must not block the open */
static const char *ddp__file_kind(mode_t mode) {
    return S_ISFIFO(mode) ? "a FIFO (named pipe)" : S_ISDIR(mode) ? "a directory" : S_ISCHR(mode) ? "a character device"
         : S_ISBLK(mode) ? "a block device" : S_ISSOCK(mode) ? "a socket" : "not a regular file";
}
/* 0 with *kind NULL for a regular file (*size its length) or what the file is instead; -1 with errno. */
static int ddp__file_stat(int fd, uint64_t *size, const char **kind) {
    struct stat sb;
    *kind = NULL;
    if (fstat(fd, &sb) != 0) return -1;
    if (!S_ISREG(sb.st_mode)) *kind = ddp__file_kind(sb.st_mode);
    else *size = (uint64_t)sb.st_size;
    return 0;
}
/* What is at `path` if it is something a rename must not replace (a FIFO, directory, device or
   socket); NULL for nothing there, a regular file or a symlink (replaced, its target untouched). */
static const char *ddp__path_kind(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0 && !S_ISREG(sb.st_mode) && !S_ISLNK(sb.st_mode) ? ddp__file_kind(sb.st_mode) : NULL;
}
/* A new file, refused if anything is there (a symlink included). */
static int ddp__file_create_excl(const char *path) { return open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666); }
#define ddp__file_write(fd, p, n) ((long)write((fd), (p), (n)))
#define ddp__file_pread(fd, p, n, off) ((long)pread((fd), (p), (n), (off_t)(off)))
#define ddp__file_sync(fd) fsync(fd)
#define ddp__file_close(fd) close(fd)
#define ddp__file_replace(from, to) rename((from), (to))
#define ddp__file_unlink(path) unlink(path)
/* fsync a directory: a rename is durable only once its directory is. 1 ok, 0 with errno. */
static int ddp__dir_sync(const char *dir) {
    int fd, ok;
    if ((fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) return 0;
    ok = fsync(fd) == 0 || errno == EINVAL;   /* EINVAL: a file system that cannot sync a directory */
    close(fd);
    return ok;
}
#define ddp__name_max(dir) pathconf((dir), _PC_NAME_MAX)
/* Each entry of `dir` whose name begins with `prefix`: fn(user, name). */
static void ddp__dir_each(const char *dir, const char *prefix, void (*fn)(void *user, const char *name), void *user) {
    DIR *d = opendir(dir);
    struct dirent *e;
    size_t n = strlen(prefix);
    if (!d) return;
    while ((e = readdir(d)) != NULL) if (!strncmp(e->d_name, prefix, n)) fn(user, e->d_name);
    closedir(d);
}
/* Remove dir/name if it is a plain file of this user's (not a link, directory or device). */
static void ddp__file_remove_plain(const char *dir, const char *name) {
    char path[PATH_MAX + 300];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid()) unlink(path);
}
#endif /* _WIN32 */

/* --------------------------------------------------------------------------------------------
   >>types  Tunables and types. The shared-memory allreduce streams buffers through per-rank slots of
   DDP__CHUNK_BYTES, DDP__SLOTS deep, so the data being reduced stays in cache while ranks
   pipeline chunk after chunk.
   -------------------------------------------------------------------------------------------- */
#define DDP__NAME_MAX 128
#define DDP__ALIGN_FLOATS DDP_PARAM_ALIGN_FLOATS   /* parameters start on 64-byte boundaries */
#define DDP__CHUNK_BYTES (256u * 1024u)
#define DDP__SLOTS 4u
#define DDP__AVG_BLOCK 512                   /* elements summed at a time by an in-place bucket's average, 3+ ranks */
#ifndef DDP__INPLACE_CHUNK_BYTES
#define DDP__INPLACE_CHUNK_BYTES (1024u * 1024u)   /* an in-place bucket's handshake unit (>>cpu-grads) */
#endif
/* A waiter polls for a short while, then sleeps on a futex. Between polls it pauses the core
   (a CPU hint, no system call) and every DDP__YIELD_EVERY polls yields it, so a thread waiting
   for this core gets it; with more ranks than CPUs it yields at every poll. A yield is a system
   call, dear in a virtual machine (on these VMs polling by yields alone was slower to see the
   peer's post than the transfer it waited for). The poll is bounded in time, not in polls: a
   yield to a busy compute thread can cost a whole scheduler slice. */
#define DDP__YIELD_EVERY 32
#define DDP__SPIN_SECONDS 100e-6
#define DDP__SPIN_SECONDS_OVERSUBSCRIBED 10e-6   /* more ranks than CPUs: sleep sooner */
/* The communication thread works while compute threads want every core: every poll it makes
   is compute lost, and (with its short slice, below) a futex wake-up reaches it quickly. */
#define DDP__SPIN_SECONDS_COMM_THREAD 5e-6
/* ... unless the rank's own thread is blocked in ddp_finish: then the core is the
   communication thread's, and the wake-ups of the exposed tail are what the step waits for. */
#define DDP__LIVENESS_PERIOD_S 0.1           /* how often a waiter checks that peers live */
#define DDP__STORE_MAX_KEY 1024u
#define DDP__STORE_MAX_VALUE (64u << 20)
#define DDP__ERR_MAX 1024
#define DDP__PROGRESS_WORDS ((sizeof(ddp_progress) + 7) / 8)
/* Sharding and the gradient norm share one grain: a rank's part of a bucket starts and ends on a
   multiple of this many floats from the bucket's start (the last rank also takes the tail), and
   the norm is summed per block of this many floats of a bucket, blocks numbered in bucket order
   then block order and added by ddp__norm_sum, whoever owns the block: so sharded and
   unsharded sum the same terms in the same order. */
#define DDP__SHARD_GRAIN 1024

typedef struct ddp__param {
    char name[DDP__NAME_MAX];
    size_t count, offset;
    unsigned flags;
    const float *init;
    int bucket;
    int ready;          /* marked ready in the current backward */
    int touched;        /* got a gradient since ddp_zero_grad */
    int ready_copied;   /* check_ready: its gradient was copied when it was marked ready */
} ddp__param;

/* What a bucket's gradients are on the wire and where the result lands: decided once at
   ddp_commit for every bucket (ddp__plan_wire, >>params); the backends carry it out and never
   re-decide it. */
enum { DDP__WIRE_AS_IS = 0,
       DDP__WIRE_NARROW /* fp32 gradients, bf16 on the wire: narrowed into staging, widened back */,
       DDP__WIRE_WIDEN  /* bf16 gradients, fp32 on the wire: widened (or summed in float), rounded back */ };
typedef struct ddp__wire {
    int moves;          /* 0: one rank, whose gradients are the average already */
    ddp_dtype grads;    /* the gradients' element type (the parameters') */
    ddp_dtype dtype;    /* the element type on the wire (reduce_dtype) */
    int convert;        /* DDP__WIRE_*: from the one to the other */
    int scatter;        /* 1: reduce-scatter (this rank's part averaged; AdamW all-gathers the parameters) */
    int in_place;       /* reduced where the gradients are, not through staging (the CPU backend decides
                           it at its commit: the shared gradient segment) */
    size_t lo, hi;      /* where the result lands: this rank's part of the flat buffer (all of the bucket
                           unless it scatters) */
    size_t bytes;       /* what the stats and the timeline count as moved: count x the reduce dtype's size */
} ddp__wire;

typedef struct ddp__bucket {
    size_t offset, count;
    int first_param, last_param;
    int pending;        /* parameters not yet ready in this backward */
    ddp__wire wire;     /* the plan */
} ddp__bucket;

typedef struct ddp__tape_op {
    ddp_backward_fn fn;
    size_t args_offset, ids_offset;
    int num_ids;
} ddp__tape_op;

/* The context's life cycle: parameters registered until ddp_commit, then steps, each with a
   backward in flight until ddp_finish; beside it two facts of the step (the gradients were
   averaged; a tape record failed). Every change is an event to ddp__life_event (>>util). */
enum { DDP__LIFE_REGISTERING = 0, DDP__LIFE_IDLE /* committed, no backward in flight */,
       DDP__LIFE_BACKWARD /* a backward has started and ddp_finish has not run */ };
enum { DDP__ON_COMMIT, DDP__ON_BACKWARD, DDP__ON_FINISH, DDP__ON_AVERAGED /* a ddp_finish with sync on */,
       DDP__ON_STEPPED /* the averages were used (ddp_adamw_step, ddp_consume_grads) */,
       DDP__ON_TAPE_FAILED, DDP__ON_TAPE_RESET };

/* What a collective does (the CPU backend also compares it across ranks before it runs one). */
enum { DDP__KIND_BARRIER = 1, DDP__KIND_BROADCAST, DDP__KIND_SUM, DDP__KIND_AVG, DDP__KIND_AVG_BF16,
       DDP__KIND_SHUTDOWN /* a barrier, named so that a peer still training can say why it ended */,
       DDP__KIND_JOIN     /* a sum: which ranks have data this step (uneven inputs, >>join) */,
       DDP__KIND_GATHER   /* sharded AdamW: the updated parameters, bucket by bucket (>>cpu-grads) */,
       DDP__KIND_OUTER    /* the outer exchange: every rank's encoded fragment to every rank (>>outer) */ };

typedef struct ddp__store_server ddp__store_server;

/* The communication thread's work queue (>>engine), one per backend that has the thread (cpu,
   mpi). Buckets are launched strictly in bucket order, so the queue is two counters: launched
   and done; bucket `done` is run next, by whichever thread holds the turn (busy). */
typedef ddp_result (*ddp__work_fn)(ddp_context *ctx, int bucket);
/* The watchdog thread (>>engine) of a backend whose waits cannot look for themselves (mpi, nccl):
   every DDP__WATCH_TICK_S it asks the backend (these hooks; NULL: nothing to do), the cancel,
   and the store (another rank's poison, a rank's connection closed). */
typedef struct ddp__watchdog_hooks {
    const char *cancel_where;      /* where a cancel is, for its message */
    void (*begin)(ddp_context *ctx);   /* first, on the watchdog thread */
    /* lock held, after each tick's wait, which took `slept` seconds (more than the tick: the
       process was stopped, and that time is nobody's wait) */
    void (*slept)(ddp_context *ctx, double slept);
    /* lock held, the group not failed: what the backend sees; DDP_OK, or a failure, described in msg */
    ddp_result (*inspect_locked)(ddp_context *ctx, char *msg, size_t cap);
    /* lock free, the group not failed: the backend's own look, as inspect_locked */
    ddp_result (*inspect)(ddp_context *ctx, char *msg, size_t cap);
    void (*on_failure)(ddp_context *ctx, ddp_result r, const char *msg);   /* what inspect found: act */
    void (*on_store)(ddp_context *ctx, ddp_result r);   /* the store says the group failed (it knows): act */
    void (*store_gone)(ddp_context *ctx, char *msg, size_t cap);           /* its words: no store */
    void (*store_died)(ddp_context *ctx, const char *rank, char *msg, size_t cap);   /* a rank's connection closed */
    void (*after)(ddp_context *ctx);   /* every tick, lock free, last */
} ddp__watchdog_hooks;

typedef struct ddp__watchdog {
    ddp_context *ctx;
    ddp__watchdog_hooks hooks;     /* the backend's, filled by name (a copy per context: no static
                                      that ranks as threads would fill at once) */
    ddp__mutex *lock;              /* the backend's, over what its hooks read; also guards stop */
    ddp__cond wake;
    ddp__thread thread;
    int started, stop;             /* started: the owning thread's */
    int tid;                       /* atomic: the watchdog thread's id once it runs (ddp__watchdog_is_me) */
    int fd;                        /* its own store connection (-1: none) */
} ddp__watchdog;

typedef struct ddp__workq {
    ddp_context *ctx;
    ddp__work_fn run;              /* what the backend does with one bucket */
    ddp__thread thread;
    int started, stop;
    ddp__mutex lock;
    ddp__cond wake, done_cond;
    int launched, done;
    int busy;                      /* a thread holds the turn: it runs bucket `done` (ddp__workq_turn) */
    ddp_result error;              /* the first bucket's failure; sticky */
    double seconds, last_seconds;  /* this step's time in the buckets, and the last bucket's */
} ddp__workq;

/* Who arrived last at this step's synchronizing exchanges, kept by a backend that can tell (cpu,
   mpi: ddp__straggle_note in >>engine) and folded into ddp_step_stats at ddp_finish. */
typedef struct ddp__straggle {
    double wait, first_wait, spread;   /* seconds, summed: this rank's waits, the first one, last - first arrival */
    double worst;                      /* the largest spread so far: its last arrival is the slowest rank */
    int slowest, exchanges;            /* exchanges: noted since the last fold (0: slowest is unknown) */
} ddp__straggle;

/* The bf16 conversions a backend does for param_dtype BF16 (the gradients need none: they are
   reduced, normed and stepped from in bf16): the fp32 master rounded into the working copies. */
enum { DDP__BF16_ROUND_PARAMS = 1,
       DDP__BF16_SHARD_MASTER /* sharded: keep this rank's parts of the master, packed (ddp__master_parts) */ };

typedef struct ddp__cpu ddp__cpu;   /* the CPU backend's state (>>cpu) */
typedef struct ddp__gpu ddp__gpu;   /* the NCCL backend's state (>>nccl; only built with CUDA) */
typedef struct ddp__mpi ddp__mpi;   /* the MPI backend's state (>>mpi; only built with DDP_MPI) */

/* The backend interface. ddp_init picks one table (>>group: ddp__choose_backend); everything
   that differs between backends goes through it, and nothing else asks which backend runs.
   Adding a backend is adding a section that fills one of these. Entries run on the thread that
   owns the context unless noted. */
typedef struct ddp__backend {
    const char *name;              /* what ddp_backend_name says */
    ddp_backend id;                /* what ddp_config()->backend says */
    int stats_later;               /* a synchronizing step's stats arrive later (stats below) */
    int shards;                    /* 1: runs desc.shard_optimizer (adamw then updates this rank's part
                                      and all-gathers the parameters); 0: ddp_init refuses it */
    int shards_grads;              /* 1: runs DDP_SHARD_GRADIENTS (ZeRO-2: its gradients are host memory
                                      that ddp__z2_release gives back); 2: runs it on device memory it
                                      gives back itself (NCCL: its zero maps, its adamw releases,
                                      ddp__gpu_z2_*); 0: ddp_init refuses it by name */
    /* after the rendezvous (world > 1; the NCCL backend also at world 1): bring up the data plane */
    ddp_result (*setup)(ddp_context *ctx, double deadline);
    /* commit, first half: ctx->flat.params / .grads for ctx->flat.count floats (bf16
       parameters: .params_bf16 / .grads_bf16, no .grads), each parameter's initial values in place */
    ddp_result (*alloc_flat)(ddp_context *ctx);
    /* commit, second half (buckets built, layouts verified alike on every rank): rank 0's
       parameters to everyone, whatever runs beside the step */
    ddp_result (*commit)(ddp_context *ctx);
    void (*begin_step)(ddp_context *ctx);
    /* ddp_set_sync, shard_accumulate: the gradients released after the last micro-step mapped
       again (NCCL: ddp__gpu_z2_map); NULL: nothing released needs mapping (host pages) */
    ddp_result (*grads_map)(ddp_context *ctx);
    ddp_result (*launch)(ddp_context *ctx, int bucket);          /* average one bucket, in bucket order */
    ddp_result (*finish)(ddp_context *ctx, double t_wait);       /* every bucket launched: settle them */
    /* gradients [offset, offset + count), in their dtype (fp32, or bf16 with bf16 parameters) */
    ddp_result (*zero)(ddp_context *ctx, size_t offset, size_t count);
    ddp_result (*scale)(ddp_context *ctx, size_t offset, size_t count, float factor);   /* g *= factor, after finish */
    /* param_dtype BF16 only, on [offset, offset + count) of the flat buffers, in stream order
       with the program's work (DDP__BF16_* in >>types) */
    ddp_result (*bf16)(ddp_context *ctx, int op, size_t offset, size_t count);
    ddp_result (*adamw)(ddp_context *ctx, const ddp_adamw *opt, float b1, float b2, float eps, float *grad_norm_out);
    ddp_result (*adamw_state)(ddp_context *ctx);                 /* m, v exist; ctx->adam.step is current */
    /* a copy between a flat buffer (params, grads, m, v: device memory on NCCL) and host memory */
    ddp_result (*copy)(ddp_context *ctx, void *dst, const void *src, size_t bytes, int to_host);
    ddp_result (*collective)(ddp_context *ctx, uint32_t kind, void *data, size_t count, int root);
    /* optional: every rank's `bytes` at recv + rank * stride to every rank (the outer exchange of
       groups of one rank, >>outer; NULL: a broadcast from each rank) */
    ddp_result (*allgather)(ddp_context *ctx, unsigned char *recv, size_t bytes, size_t stride);
    /* optional: `bytes` of host memory from team member `member` (ddp__team_*) to the team's
       other members only (the fp32 master in parts within a replica group, >>outer); NULL: the
       backend has no teams of several ranks beside the world's */
    ddp_result (*team_bcast)(ddp_context *ctx, void *data, size_t bytes, int member);
    /* optional: where team member `member`'s parts of the parameters are readable by this rank,
       flat-indexed (its own parts valid; DDP_SHARD_PARAMETERS' gathers copy from there, >>zero3);
       NULL (or a NULL result): the backend runs DDP_SHARD_PARAMETERS on one rank only */
    unsigned char *(*z3_parts)(ddp_context *ctx, int member);
    /* optional: a unit's gather by the backend's own exchange (MPI: ddp__mpi_z3_*), into the view
       (its pages committed): z3_start begins it (nonblocking), z3_wait completes it; every rank
       starts the same units in the same order. NULL: copies from z3_parts */
    ddp_result (*z3_start)(ddp_context *ctx, int unit);
    ddp_result (*z3_wait)(ddp_context *ctx, int unit);
    void (*stats)(ddp_context *ctx);                             /* bring ctx->step.last_stats up to date */
    void (*poison)(ddp_context *ctx, ddp_result code);           /* tell the peers; any thread */
    void (*stop)(ddp_context *ctx);                              /* shutdown: no step work in flight */
    void (*teardown)(ddp_context *ctx);                          /* free what the backend owns */
} ddp__backend;

/* A unit of sharded parameters (>>zero3): registration ids [first, first + n), flat floats [lo, hi). */
enum { DDP__Z3_RELEASED, DDP__Z3_IN_FLIGHT, DDP__Z3_GATHERED };
typedef struct ddp__z3_unit {
    char name[DDP__NAME_MAX];
    int first, n;
    size_t lo, hi;
    int state;                     /* DDP__Z3_*: written under z3.lock */
    int last_op;                   /* the backward: the last tape op to replay that lists it (-1: none) */
    double t0, t1;                 /* its last gather's copy (the timeline; the gather thread writes them) */
    int fetched;                   /* prefetched, its gather event not recorded yet (under z3.lock) */
} ddp__z3_unit;

struct ddp_context {
    ddp_desc desc;                 /* resolved */
    int rank, world, local_rank, local_world;
    const ddp__backend *be;        /* NULL until ddp_init has chosen one; then &table */
    ddp__backend table;            /* the chosen backend's table, filled by name (ddp__*_table) */
    union {                        /* the chosen backend's own state (its section's type) */
        ddp__cpu *cpu;
        ddp__gpu *gpu;
        ddp__mpi *mpi;
    } impl;
    int up;                        /* the backend's setup succeeded */
    int life;                      /* DDP__LIFE_*: registering, between steps, in a backward (ddp__life_event) */
    int closing;                   /* ddp_shutdown has begun (atomic: the NCCL watchdog reads it) */
    int failed;                    /* sticky ddp_result, set when the group is poisoned (atomic) */
    int telling;                   /* poisons in progress (atomic): ddp__shutdown hangs up only after them */
    char err[DDP__ERR_MAX];
    char err_shown[DDP__ERR_MAX];  /* ddp_last_error's copy: the caller reads it while err may change */
    ddp__mutex err_lock;
    const char *what;              /* the collective in progress, for errors */
    char what_buf[96];
    int quiet;                     /* ddp__shutdown's goodbye: a store already gone is expected, not logged
                                      (atomic: a watchdog's failure may be recorded meanwhile) */
    int dtype_env_told;            /* an accessor of the other dtype, with DDP_PARAM_DTYPE set: logged once (>>public) */

    struct {                       /* who this job is (>>env) */
        char master_addr[256];
        const char *master_addr_from;   /* what gave master_addr, for messages: NULL = MASTER_ADDR */
        char token[128];
        char env_overrides[512];   /* DDP_* variables that overrode a field the program set */
        char id[256];              /* desc.job_id: checked at the rendezvous */
        unsigned char store_key[32];    /* from the token and the job id: the store handshake's key */
    } job;
    struct {                       /* the rendezvous (>>store) */
        int store_fd;
        int *peer_pids;            /* liveness before the segment is shared */
        int rank0_here;            /* rank 0 runs on this host (its name): its process can be watched */
        ddp__store_server *server;
    } rdv;
    struct {                       /* registered parameters and their buckets (>>params) */
        ddp__param *params;
        int num_params, cap_params;
        ddp__bucket *buckets;
        int num_buckets;
    } model;
    struct {                       /* the flat buffers, `count` elements each */
        float *params, *grads;
        /* param_dtype BF16: the working copies and gradients the program uses; params is then
           the fp32 master (sharded: this rank's parts, packed: ddp__master_parts) and grads NULL:
           the buckets are reduced in bf16 where they are (PARAMETER DTYPE) */
        ddp_bf16 *params_bf16, *grads_bf16;
        size_t count;
        /* elements whose working copy was not the master rounded when an AdamW pass reached
           them (a write of one without the other), and the first such parameter (-1: not known) */
        uint64_t bf16_diverged;
        int bf16_diverged_param;
    } flat;
    struct {                       /* AdamW's state (>>adamw): the moments, the step count */
        float *m, *v;
        int64_t step;
    } adam;
    struct {                       /* sharding (desc.shard_optimizer; unsharded, a rank's part of a
                                      bucket is all of it): per bucket, where this rank's part begins
                                      in m and v (its parts in flat order, packed), and the bucket's
                                      first norm block; `count` floats of m and v, norm_blocks blocks */
        size_t *base, *norm_base;
        size_t count, norm_blocks;
        double *norm_sums;
        int hybrid;                /* hybrid sharding (desc.shard_group, >>shard): the shard group's
                                      size S, 2 <= S < world, the team of every sharded exchange while
                                      a bucket's average spans the world; 0: off */
        float *z2_acc;             /* ZeRO-2 with shard_accumulate: this rank's parts' sum of the micro-steps'
                                      averages since the last synchronizing one (count floats, packed as m) */
        int z2_acc_steps;          /* micro-steps (sync off) in z2_acc: 0, it holds nothing */
    } shard;
    struct {                       /* the tape (>>step) */
        ddp__tape_op *ops;
        int len, cap;
        unsigned char *arena;
        size_t arena_len, arena_cap;
        int replaying;             /* this backward is the tape's replay (messages speak of ops), else ddp_grad_ready's */
        int failed;                /* a ddp_tape_record since the last backward failed (ddp__life_event) */
    } tape;
    struct {                       /* the step (>>step) */
        int sync;                  /* gradients averaged at ddp_finish (ddp_set_sync) */
        int next_launch;
        double start;
        ddp_step_stats stats, last_stats;
        int ready_moment;          /* this backward's moments: tape ops replayed, or ddp_grad_ready calls */
        int first_launch_moment;   /* the moment the first bucket was launched (-1: not yet) */
        double first_launch_time;  /* and when (ddp__now) */
        int overlap_warned;        /* the no-overlap warning was given (once a context) */
        unsigned char *ready_copy; /* check_ready: each gradient as it was when marked ready */
        int grads_averaged;        /* a ddp_finish with sync on since the last ddp_adamw_step (>>adamw; ddp__life_event) */
    } step;
    struct {                       /* the timeline: one event list per thread, merged at shutdown */
        char path[512];
        struct ddp__timeline *main, *comm;
        double origin, forward_start;
        int step;
    } tl;
    struct {                       /* embedding (>>embed): cancel from any thread, progress read from any thread */
        int cancel;                /* ddp_cancel was called (atomic) */
        uint32_t seq;              /* seqlock: odd while the owner writes words */
        uint64_t words[DDP__PROGRESS_WORDS];   /* a ddp_progress, each word atomic */
        ddp_progress progress;     /* the owner's copy, published into words */
        double last_finish;
    } embed;
    struct {                       /* uneven inputs (>>join) */
        float *mask;               /* world floats: 1 for a rank with data this step */
        int active;                /* ranks with data in the current/last step */
        int root;                  /* the lowest of them, in the last step some rank had joined */
        int uneven;                /* some step since the last ddp_join ran with joined ranks */
        int shadow;                /* ddp_join's shadow step: the count is taken already */
        int pending;               /* micro-steps with sync off since the last zero_grad or sync */
        int step_uneven;           /* this step's count had joined ranks: sharded, ddp_adamw_step sends them its options */
    } join;
    struct {                       /* replica groups and the outer sync (>>outer; desc.outer) */
        int groups, group;         /* G = world / group_size groups; this rank's is ranks [group * size, + size) */
        int size, index;           /* ranks a group; this rank's index in its group (the team of the inner steps) */
        int64_t inner;             /* inner steps taken (ddp_outer_step calls that counted) */
        int64_t syncs;             /* fragments merged */
        size_t *frag;              /* fragments + 1 offsets into the flat buffer */
        float *theta, *mom;        /* the fp32 outer parameters and Nesterov momentum, flat.count each */
        unsigned char *recv;       /* every group's encoded fragment, in group order, slot bytes apart */
        size_t slot;
        float *sum;                /* the averaged outer gradient of the fragment in flight */
        float *host;               /* a fragment of the parameters in host memory (the NCCL backend's are on the device) */
        int flight;                /* the fragment in flight (-1: none) */
        int64_t lands;             /* the inner step after which it merges */
        int owed;                  /* ddp_consume_grads since the last ddp_outer_step (own optimizer) */
        struct {                   /* the exchange in the background (delay_steps > 0): a thread of its own */
            ddp__thread thread;
            ddp__mutex lock;
            ddp__cond cond;
            int started, job, stop;/* job: the fragment to exchange, -1: none */
            ddp_result result;
            double seconds;        /* the last exchange took */
            double t0, t1;         /* when the last exchange ran (the timeline's event) */
            double slow_s;         /* its longest broadcast from another group: that group's lateness, roughly */
            int slow_group;
            /* the backend's slots the exchange shares the wire with: they wait for it first */
            ddp_result (*collective)(ddp_context *ctx, uint32_t kind, void *data, size_t count, int root);
            ddp_result (*launch)(ddp_context *ctx, int bucket);
            void (*stop_backend)(ddp_context *ctx);
        } bg;
        double exchange_ms, wait_ms;   /* the last exchange; what the step waited for it in all */
        double straggler_ms;       /* the last exchange's longest wait for one group's broadcast */
        int slowest_group;         /* that group (-1: none) */
    } outer;
    struct {                       /* sharded parameters (desc.shard PARAMETERS; >>zero3) */
        int on;                    /* committed at that level */
        ddp__z3_unit *units;
        int num_units, cap_units;
        int *unit_of;              /* each parameter's unit */
        unsigned char *view;       /* the flat parameter buffer: reserved once, pages committed while gathered */
        size_t view_bytes, page, es;   /* es: bytes an element (4 fp32, 2 bf16) */
        uint32_t *page_refs;       /* gathered units on each page of the view (neighbours share a page) */
        ddp__thread thread;        /* prefetches: copies from the owners' parts */
        ddp__mutex lock;
        ddp__cond cond;
        int started, stop;
        int threaded;              /* the prefetch thread runs (not with shard_prefetch_off: nothing to do) */
        int seeded;                /* ddp_commit seeded the parts itself (ddp__cpu_z3_seed): no rounding, no packing after */
        int *queue, qhead, qlen;   /* units to copy, in order */
        int replay_op;             /* the tape op being replayed (-1: none) */
        int device;                /* NCCL: the view is device memory, the backend's (ddp__gpu_z3_*); no thread */
    } z3;
};

/* --------------------------------------------------------------------------------------------
   >>util  Small helpers: time, memory, errors, logging
   -------------------------------------------------------------------------------------------- */
static size_t ddp__round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Non-finite values are found by their bits (exponent field all ones), never by isfinite():
   -ffinite-math-only (in -ffast-math and -Ofast) lets the compiler assume no NaN/Inf exists and
   fold isfinite(x) to 1, which silently removed the NaN guard. The empty asm hides the bits'
   origin from the optimizer, so no flag can infer them from a float that "cannot" be NaN. */
static uint32_t ddp__bits_f(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
#if defined(__GNUC__)
    __asm__("" : "+r"(u));
#endif
    return u;
}
static uint64_t ddp__bits_d(double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
#if defined(__GNUC__)
    __asm__("" : "+r"(u));
#endif
    return u;
}
static int ddp__finite_f(float x) { return (ddp__bits_f(x) & 0x7f800000u) != 0x7f800000u; }
static int ddp__finite_d(double x) { return (ddp__bits_d(x) & 0x7ff0000000000000ull) != 0x7ff0000000000000ull; }
static int ddp__finite_bf16(uint16_t h) { return (h & 0x7f80u) != 0x7f80u; }
/* x >= 0 and not NaN (the NaN test by bits: under fast-math !(x >= 0) is no NaN check) */
static int ddp__nonneg_d(double x) { return (ddp__bits_d(x) & 0x7fffffffffffffffull) <= 0x7ff0000000000000ull && x >= 0; }

static void *ddp__calloc(size_t bytes) {
    void *p = DDP_MALLOC(bytes ? bytes : 1);
    if (p) memset(p, 0, bytes);
    return p;
}

/* Buffers the hot loops stream over are 64-byte aligned; the original pointer sits just
   before the aligned block so DDP_FREE gets what DDP_MALLOC returned. */
/* `count` floats, 64-byte aligned, the block's start stored just before them (ddp__free_floats);
   not yet zeroed. */
static float *ddp__alloc_floats_raw(size_t count) {
    size_t bytes = count * sizeof(float) + 64 + sizeof(void *);
    unsigned char *raw = (unsigned char *)DDP_MALLOC(bytes);
    uintptr_t aligned;
    if (!raw) return NULL;
    aligned = ((uintptr_t)(raw + sizeof(void *)) + 63u) & ~(uintptr_t)63u;
    memcpy((unsigned char *)aligned - sizeof(void *), &raw, sizeof(void *));
    return (float *)aligned;
}
static float *ddp__alloc_floats(size_t count) {
    float *p = ddp__alloc_floats_raw(count);
    if (p) memset(p, 0, count * sizeof(float));
    return p;
}

static void ddp__free_floats(float *p) {
    void *raw;
    if (!p) return;
    memcpy(&raw, (unsigned char *)p - sizeof(void *), sizeof(void *));
    DDP_FREE(raw);
}

static const char *ddp__level_name(ddp_log_level level) {
    switch (level) {
    case DDP_LOG_DEBUG: return "debug";
    case DDP_LOG_INFO: return "info";
    case DDP_LOG_WARN: return "warning";
    case DDP_LOG_ERROR: return "error";
    default: return "log";
    }
}

static void ddp__log(ddp_context *ctx, ddp_log_level level, const char *fmt, ...) {
    char msg[DDP__ERR_MAX];
    va_list ap;
    if (level < (ctx->desc.log_level ? ctx->desc.log_level : DDP_LOG_WARN)) return;   /* not resolved yet: the default */
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (ctx->desc.log) ctx->desc.log(ctx->desc.log_user, level, ctx->rank, msg);
    else fprintf(stderr, "ddp rank %d %s: %s\n", ctx->rank, ddp__level_name(level), msg);
}

/* Record an error; the message always starts with the rank. Returns code for `return`. */
static ddp_result ddp__fail(ddp_context *ctx, ddp_result code, const char *fmt, ...) {
    char msg[DDP__ERR_MAX - 32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ddp__mutex_lock(&ctx->err_lock);
    if (ctx->rank >= 0) snprintf(ctx->err, sizeof ctx->err, "rank %d: %s", ctx->rank, msg);
    else snprintf(ctx->err, sizeof ctx->err, "pid %d (rank not known yet): %s", ddp__getpid(), msg);
    ddp__mutex_unlock(&ctx->err_lock);
    if (!__atomic_load_n(&ctx->quiet, __ATOMIC_RELAXED)) ddp__log(ctx, DDP_LOG_DEBUG, "%s", msg);
    return code;
}

/* The error without its "rank N: " lead, for log lines (which name the rank themselves), copied
   into `buf` (DDP__ERR_MAX) under the lock: a watchdog or the communication thread may be
   recording a failure of its own meanwhile. */
static const char *ddp__err_body(ddp_context *ctx, char *buf) {
    const char *colon;
    ddp__mutex_lock(&ctx->err_lock);
    colon = strncmp(ctx->err, "rank ", 5) ? NULL : strstr(ctx->err, ": ");
    snprintf(buf, DDP__ERR_MAX, "%s", colon ? colon + 2 : ctx->err);
    ddp__mutex_unlock(&ctx->err_lock);
    return buf;
}

/* The sticky failure is set by either thread of a context and read by both. */
static ddp_result ddp__failed(const ddp_context *ctx) { return (ddp_result)__atomic_load_n(&ctx->failed, __ATOMIC_ACQUIRE); }
static ddp_result ddp__set_failed(ddp_context *ctx, ddp_result code) {
    int none = DDP_OK;
    __atomic_compare_exchange_n(&ctx->failed, &none, (int)code, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    return code;
}

/* A failure that leaves the ranks out of step: mark the context dead and tell the peers. For an
   error a callee has recorded already (ddp__fail); ddp__fail_group records and escalates in one. */
static ddp_result ddp__fatal(ddp_context *ctx, ddp_result code) {
    __atomic_add_fetch(&ctx->telling, 1, __ATOMIC_ACQ_REL);   /* before the mark another thread may see */
    ddp__set_failed(ctx, code);
    if (ctx->be && ctx->be->poison) ctx->be->poison(ctx, code);
    __atomic_sub_fetch(&ctx->telling, 1, __ATOMIC_ACQ_REL);
    return code;
}

static ddp_result ddp__fail_group(ddp_context *ctx, ddp_result code, const char *fmt, ...) {
    char msg[DDP__ERR_MAX - 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ddp__fatal(ctx, ddp__fail(ctx, code, "%s", msg));
}

/* Cancel (ddp_cancel, or the host's token): asked for from any thread, seen by every wait of
   the rank (shared-memory waits, the communication thread, the store, NCCL's polls). The first
   wait to see it makes it the group's failure, so the peers stop with DDP_ERR_CANCELLED too. */
static int ddp__cancel_requested(const ddp_context *ctx) {
    return __atomic_load_n(&ctx->embed.cancel, __ATOMIC_ACQUIRE) ||
           (ctx->desc.cancel_token && __atomic_load_n(&ctx->desc.cancel_token->cancelled, __ATOMIC_ACQUIRE));
}

/* A rank that was itself asked to cancel reports DDP_ERR_CANCELLED, whatever it met first: in
   ddp_init and ddp_commit a peer cancelled by the same token may tear down the store or the
   shared memory before this rank's own wait looks at the token. */
static ddp_result ddp__cancel_wins(ddp_context *ctx, ddp_result r, const char *call) {
    char first[DDP__ERR_MAX];
    if (r == DDP_OK || r == DDP_ERR_CANCELLED || !ddp__cancel_requested(ctx)) return r;
    ddp__err_body(ctx, first);   /* the communication thread may be failing too */
    return ddp__fail(ctx, DDP_ERR_CANCELLED, "cancelled (ddp_cancel or the cancel token) in %s (met first: %s)", call, first);
}

/* In a wait: DDP_OK, or the cancel made the group's failure (`where` for the message). */
static ddp_result ddp__check_cancel(ddp_context *ctx, const char *where) {
    if (!ddp__cancel_requested(ctx)) return DDP_OK;
    if (ddp__failed(ctx)) return ddp__failed(ctx);
    return ddp__fail_group(ctx, DDP_ERR_CANCELLED, "cancelled (ddp_cancel or the cancel token) in %s", where ? where : "a wait");
}

/* Gradient buckets travel as the reduce dtype says. */
static uint32_t ddp__grad_kind(const ddp_context *ctx) {
    return ctx->desc.reduce_dtype == DDP_DTYPE_BF16 ? DDP__KIND_AVG_BF16 : DDP__KIND_AVG;
}
static size_t ddp__wire_bytes(const ddp_context *ctx) {
    return ctx->desc.reduce_dtype == DDP_DTYPE_BF16 ? sizeof(uint16_t) : sizeof(float);
}
/* The life cycle's transitions, all of them (DDP__ON_* in >>types). */
static void ddp__life_event(ddp_context *ctx, int ev) {
    switch (ev) {
    /* atomic: the outer exchange's thread reads it (ddp__shm_wait_all) while the inner steps run */
    case DDP__ON_COMMIT: case DDP__ON_FINISH: __atomic_store_n(&ctx->life, DDP__LIFE_IDLE, __ATOMIC_RELAXED); break;
    case DDP__ON_BACKWARD: __atomic_store_n(&ctx->life, DDP__LIFE_BACKWARD, __ATOMIC_RELAXED); break;
    case DDP__ON_AVERAGED: ctx->step.grads_averaged = 1; break;
    case DDP__ON_STEPPED: ctx->step.grads_averaged = 0; break;
    case DDP__ON_TAPE_FAILED: ctx->tape.failed = 1; break;
    case DDP__ON_TAPE_RESET: ctx->tape.failed = 0; break;
    default: break;
    }
}
static int ddp__is_committed(const ddp_context *ctx) { return __atomic_load_n(&ctx->life, __ATOMIC_RELAXED) != DDP__LIFE_REGISTERING; }
static int ddp__in_backward(const ddp_context *ctx) { return __atomic_load_n(&ctx->life, __ATOMIC_RELAXED) == DDP__LIFE_BACKWARD; }

/* Derived facts, one definition each: the optimizer state is held in parts (shard_optimizer on
   a team of several ranks: the world, or with replica groups the group; a group of one rank
   keeps it whole, there is nobody to share it with); the parameters are bf16 working copies of
   an fp32 master. */
static int ddp__team_world(const ddp_context *ctx);
static int ddp__sharded(const ddp_context *ctx) { return ctx->desc.shard_optimizer && ddp__team_world(ctx) > 1; }
/* Sharded parameters are committed (>>zero3); and then, fp32 parameters on several ranks: held in
   parts, flat-indexed (this rank's parts valid, where ZeRO-1 keeps them whole) */
static int ddp__z3(const ddp_context *ctx) { return ctx->z3.on; }
static int ddp__z3_flat_parts(const ddp_context *ctx) { return ctx->z3.on && !ctx->flat.params_bf16 && ddp__sharded(ctx); }
static void ddp__z3_free(ddp_context *ctx);
static int ddp__z3_unit_index(const ddp_context *ctx, int i);
static int ddp__bf16_params(const ddp_context *ctx) { return ctx->desc.param_dtype == DDP_DTYPE_BF16; }

/* The team: the ranks a gradient bucket is averaged among. With replica groups (desc.outer,
   >>outer) it is this rank's group, ranks [g * S, (g + 1) * S); otherwise every rank. Its
   members are numbered 0 .. S - 1 in rank order (parts, sums and divisors follow that). Only
   the buckets are the team's: rank and world stay global (the sampler shards over every rank)
   and every other collective (broadcasts, user collectives, the outer exchange) spans the world.
   (outer.size is the world without groups; 0 in a context that never resolved it: the MPI
   backend's host context.)
   Hybrid sharding (desc.shard_group, no replica groups) makes the shard group the team of the
   sharded exchanges (the parts, the norm's blocks, the all-gather), while its buckets are
   averaged over the world (ddp__hybrid: the backends' bucket paths ask it). */
static int ddp__team_world(const ddp_context *ctx) {
    return ctx->shard.hybrid ? ctx->shard.hybrid : ctx->outer.size > 0 ? ctx->outer.size : ctx->world;
}
static int ddp__team_rank(const ddp_context *ctx) {
    return ctx->shard.hybrid ? ctx->rank % ctx->shard.hybrid : ctx->outer.size > 0 ? ctx->outer.index : ctx->rank;
}
static int ddp__hybrid(const ddp_context *ctx) { return ctx->shard.hybrid > 0; }
static int ddp__team_peer(const ddp_context *ctx, int i) { return ctx->rank - ddp__team_rank(ctx) + i; }   /* member i's rank */


/* --------------------------------------------------------------------------------------------
   >>sampler  The distributed sampler's arithmetic: pure functions of the ddp_sampler and the
   position, no context, no allocation, no state (the public entry points check their arguments
   in >>public and come here). The epoch's permutation is a keyed bijection on [0, n) evaluated
   at one position: a balanced Feistel network on the smallest even-bit domain 4^h >= n, walked
   until it lands inside [0, n) (cycle walking: the domain is under 4n, so under 4 rounds of the
   network on average, and it always ends, since the walk follows the cycle of a point that is
   itself inside). Keys come from (seed, epoch) alone: every rank computes the same permutation.
   A Feistel network on halves of 2 bits or more only makes even permutations of its domain, and
   on the smallest such domain (16 points) that shows through the walk: for n = 5 some orders came 3x as often as others,
   whatever the rounds. So up to DDP__SAMPLER_SMALL samples the permutation is an exact
   Fisher-Yates shuffle on a stack array instead (O(n) for one position, n <= 32).
   -------------------------------------------------------------------------------------------- */
#define DDP__SAMPLER_ROUNDS 6   /* 4 make a pseudo-random permutation in theory; 2 more are cheap */
#define DDP__SAMPLER_SMALL 32

static uint64_t ddp__mix64(uint64_t z) {   /* a 64-bit finalizer: every input bit reaches every output bit */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* This rank's samples per epoch: PyTorch's DistributedSampler count (world >= 1). */
static uint64_t ddp__sampler_count(const ddp_sampler *s) {
    uint64_t w = (uint64_t)s->world;
    return s->drop_last ? s->n / w : s->n / w + (s->n % w != 0);
}

/* The epoch's permutation of [0, n) at position x (< n). */
static uint64_t ddp__sampler_permute(const ddp_sampler *s, uint64_t epoch, uint64_t x) {
    uint64_t keys[DDP__SAMPLER_ROUNDS], mask, k = ddp__mix64(s->seed ^ 0x6a09e667f3bcc909ull);
    unsigned h = 1;
    int r;
    if (!s->shuffle || s->n == 1) return x;
    k = ddp__mix64(k + ddp__mix64(epoch + 0x3c6ef372fe94f82bull));
    if (s->n <= DDP__SAMPLER_SMALL) {   /* r % (j + 1): a bias below 2^-58, far under any test's reach */
        unsigned char order[DDP__SAMPLER_SMALL];
        unsigned j;
        for (j = 0; j < (unsigned)s->n; j++) order[j] = (unsigned char)j;
        for (j = (unsigned)s->n - 1; j > 0; j--) {
            unsigned pick = (unsigned)((k = ddp__mix64(k + 0x9e3779b97f4a7c15ull)) % (j + 1));
            unsigned char t = order[j];
            order[j] = order[pick];
            order[pick] = t;
        }
        return order[x];
    }
    while (h < 32 && ((s->n - 1) >> (2 * h)) != 0) h++;   /* halves of h bits: 4^h >= n */
    mask = (h == 32) ? 0xffffffffull : (((uint64_t)1 << h) - 1);
    for (r = 0; r < DDP__SAMPLER_ROUNDS; r++) keys[r] = k = ddp__mix64(k + 0x9e3779b97f4a7c15ull);
    do {
        uint64_t left = x >> h, right = x & mask;
        for (r = 0; r < DDP__SAMPLER_ROUNDS; r++) {
            uint64_t f = ddp__mix64(right ^ keys[r]) & mask;
            uint64_t next = left ^ f;
            left = right;
            right = next;
        }
        x = (left << h) | right;
    } while (x >= s->n);
    return x;
}

/* This rank's i-th sample of `epoch` (i < ddp__sampler_count): global position g = i*world +
   rank of the epoch's sequence, which is the permutation of [0, n) followed, with padding, by
   its own beginning again (g >= n reads position g mod n), computed without overflow for any n. */
static uint64_t ddp__sample(const ddp_sampler *s, uint64_t epoch, uint64_t i) {
    uint64_t w = (uint64_t)s->world, rank = (uint64_t)s->rank, base = i * w, g;   /* base < n: i < ceil(n/w) */
    if (rank < s->n - base) g = base + rank;
    else g = (rank - (s->n - base)) % s->n;   /* a padded position: (base + rank - n) mod n */
    return ddp__sampler_permute(s, epoch, g);
}

/* --------------------------------------------------------------------------------------------
   >>timeline  Each thread appends to its own event list (no locks on the hot path; when the
   timeline is off the lists are NULL and recording is one branch). At shutdown every rank
   turns its events into Chrome trace JSON and rank 0 gathers them into one file.
   -------------------------------------------------------------------------------------------- */
enum { DDP__EV_FORWARD, DDP__EV_BACKWARD_OP, DDP__EV_READY, DDP__EV_ALLREDUCE, DDP__EV_WAIT,
       DDP__EV_ADAMW, DDP__EV_STEP, DDP__EV_GPU_BACKWARD, DDP__EV_GPU_EXPOSED,
       DDP__EV_STRAGGLER /* this rank waited for the last arrival: index the bucket, bytes the rank */,
       DDP__EV_OUTER     /* an outer exchange (>>outer): index the fragment, bytes a group's encoding */,
       DDP__EV_GATHER    /* sharded parameters (>>zero3): a unit's gather, index the unit, bytes copied */,
       DDP__EV_RELEASE   /* and its release */,
       DDP__EV_CROSS     /* hybrid sharding on NCCL: a bucket's part summed across the shard groups, bytes the part's */ };
#define DDP__TIMELINE_MAX_EVENTS 150000      /* per thread: keeps a rank's trace under the store's cap */

typedef struct ddp__event {
    double t0, t1;
    int kind, step, index;             /* index: tape op or bucket (-1: a user collective) */
    int first_param, num_params;       /* backward ops: the parameters they finish */
    uint64_t bytes;
} ddp__event;

typedef struct ddp__timeline { ddp__event *ev; size_t len, cap; int full; } ddp__timeline;

static void ddp__tl_add(ddp__timeline *tl, int kind, int step, double t0, double t1, int index, uint64_t bytes) {
    ddp__event *e;
    if (tl->len == tl->cap) {
        size_t cap = tl->cap ? 2 * tl->cap : 4096;
        ddp__event *grown;
        if (tl->len >= DDP__TIMELINE_MAX_EVENTS || !(grown = (ddp__event *)DDP_MALLOC(cap * sizeof *grown))) { tl->full = 1; return; }
        if (tl->len) memcpy(grown, tl->ev, tl->len * sizeof *grown);
        DDP_FREE(tl->ev);
        tl->ev = grown;
        tl->cap = cap;
    }
    e = &tl->ev[tl->len++];
    e->t0 = t0; e->t1 = t1; e->kind = kind; e->step = step; e->index = index; e->bytes = bytes;
    e->first_param = -1; e->num_params = 0;
}

/* Recording sites call this: one branch when the timeline is off. What happens between two
   backwards (AdamW, loss averaging) belongs to the step that just finished. */
static inline void ddp__record(ddp_context *ctx, ddp__timeline *tl, int kind, double t0, double t1, int index, uint64_t bytes) {
    if (tl) ddp__tl_add(tl, kind, ddp__in_backward(ctx) || !ctx->tl.step ? ctx->tl.step : ctx->tl.step - 1, t0, t1, index, bytes);
}

typedef struct ddp__text { char *buf; size_t len, cap; int oom; } ddp__text;

static void ddp__text_printf(ddp__text *t, const char *fmt, ...) {
    va_list ap;
    int n;
    if (t->oom) return;
    for (;;) {
        size_t room = t->cap - t->len;
        va_start(ap, fmt);
        n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) { t->oom = 1; return; }
        if (t->buf && (size_t)n < room) { t->len += (size_t)n; return; }
        {
            size_t cap = t->cap ? t->cap : 65536;
            char *grown;
            while (cap - t->len <= (size_t)n) cap *= 2;
            if (!(grown = (char *)DDP_MALLOC(cap))) { t->oom = 1; return; }
            if (t->len) memcpy(grown, t->buf, t->len);
            DDP_FREE(t->buf);
            t->buf = grown;
            t->cap = cap;
        }
    }
}

/* Parameter names are ours (no quotes or backslashes can hurt: they are printed as given, so
   escape the two characters JSON cares about). */
static void ddp__text_json_name(ddp__text *t, const char *name) {
    for (; *name; name++) {
        if (*name == '"' || *name == '\\') ddp__text_printf(t, "\\%c", *name);
        else if ((unsigned char)*name >= 0x20) ddp__text_printf(t, "%c", *name);
    }
}

static void ddp__tl_event_json(ddp_context *ctx, ddp__text *t, const ddp__event *e) {
    static const char *cats[] = { "forward", "backward", "ready", "comm", "exposed", "optimizer", "step",
                                  "gpu_backward", "gpu_exposed", "straggler", "outer", "gather", "release", "comm" };
    static const int tids[] = { 0, 0, 0, 1, 0, 0, 2, 1, 1, 1, 3, 1, 1, 1 };   /* NCCL: the comm lane is the GPU clock */
    const char *cat = e->kind == DDP__EV_ALLREDUCE && e->index < 0 ? "user_comm" : cats[e->kind];
    double ts = 1e6 * (e->t0 - ctx->tl.origin), dur = 1e6 * (e->t1 - e->t0);
    int i;
    ddp__text_printf(t, ",\n{\"name\":\"");
    switch (e->kind) {
    case DDP__EV_BACKWARD_OP: ddp__text_printf(t, "backward op %d", e->index); break;
    case DDP__EV_READY: ddp__text_printf(t, "bucket %d ready", e->index); break;
    case DDP__EV_ALLREDUCE:   /* hybrid sharding on NCCL: the group's part of the bucket's reduction (then DDP__EV_CROSS) */
        if (e->index >= 0 && ddp__hybrid(ctx) && ctx->be && ctx->be->id == DDP_BACKEND_NCCL)
            ddp__text_printf(t, "reduce-scatter bucket %d (shard group)", e->index);
        else if (e->index >= 0) ddp__text_printf(t, "allreduce bucket %d", e->index);
        else ddp__text_printf(t, "allreduce (user)");
        break;
    case DDP__EV_CROSS: ddp__text_printf(t, "allreduce bucket %d's part across the shard groups", e->index); break;
    case DDP__EV_WAIT: ddp__text_printf(t, "wait for comm"); break;
    case DDP__EV_GPU_BACKWARD: ddp__text_printf(t, "backward (gpu)"); break;
    case DDP__EV_GPU_EXPOSED: ddp__text_printf(t, "exposed comm (gpu)"); break;
    case DDP__EV_STRAGGLER: ddp__text_printf(t, "wait for rank %d", (int)e->bytes); break;
    case DDP__EV_OUTER: ddp__text_printf(t, "outer exchange, fragment %d", e->index); break;
    case DDP__EV_GATHER: ddp__text_printf(t, "gather unit %d", e->index); break;
    case DDP__EV_RELEASE: ddp__text_printf(t, "release unit %d", e->index); break;
    default: ddp__text_printf(t, "%s", e->kind == DDP__EV_ADAMW ? "adamw" : cats[e->kind]); break;
    }
    ddp__text_printf(t, "\",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,", cat, ctx->rank, tids[e->kind], ts);
    if (e->kind == DDP__EV_READY) ddp__text_printf(t, "\"ph\":\"i\",\"s\":\"t\",");
    else ddp__text_printf(t, "\"ph\":\"X\",\"dur\":%.3f,", dur);
    ddp__text_printf(t, "\"args\":{\"step\":%d", e->step);
    if (e->kind == DDP__EV_READY || e->kind == DDP__EV_CROSS || (e->kind == DDP__EV_ALLREDUCE && e->index >= 0))
        ddp__text_printf(t, ",\"bucket\":%d", e->index);
    if (e->kind == DDP__EV_ALLREDUCE || e->kind == DDP__EV_CROSS) ddp__text_printf(t, ",\"bytes\":%llu", (unsigned long long)e->bytes);
    if (e->kind == DDP__EV_OUTER) ddp__text_printf(t, ",\"fragment\":%d,\"bytes\":%llu", e->index, (unsigned long long)e->bytes);
    if (e->kind == DDP__EV_GATHER || e->kind == DDP__EV_RELEASE)
    {
        ddp__text_printf(t, ",\"unit\":\"");
        if (e->index >= 0 && e->index < ctx->z3.num_units) ddp__text_json_name(t, ctx->z3.units[e->index].name);
        ddp__text_printf(t, "\",\"bytes\":%llu", (unsigned long long)e->bytes);
        if (e->kind == DDP__EV_GATHER) ddp__text_printf(t, ",\"prefetched\":%d", e->first_param == 1);
    }
    if (e->kind == DDP__EV_STRAGGLER)   /* bucket -1: the count of the ranks with data (uneven inputs) */
        ddp__text_printf(t, ",\"bucket\":%d,\"rank\":%d", e->index, (int)e->bytes);
    if (e->kind == DDP__EV_BACKWARD_OP && e->num_params > 0) {
        ddp__text_printf(t, ",\"params\":\"");
        for (i = 0; i < e->num_params && i < 4; i++) {
            if (i) ddp__text_printf(t, " ");
            ddp__text_json_name(t, ctx->model.params[e->first_param + i].name);
        }
        if (e->num_params > 4) ddp__text_printf(t, " +%d", e->num_params - 4);
        ddp__text_printf(t, "\"");
    }
    ddp__text_printf(t, "}}");
}

/* This rank's part of the trace: its process/thread names, then its events. */
static void ddp__tl_rank_json(ddp_context *ctx, ddp__text *t) {
    static const char *threads[] = { "compute", "comm", "steps", "outer exchange" };
    const ddp__timeline *lists[2];
    size_t i;
    int k;
    lists[0] = ctx->tl.main; lists[1] = ctx->tl.comm;
    ddp__text_printf(t, ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}", ctx->rank, ctx->rank);
    for (k = 0; k < 4; k++)
        ddp__text_printf(t, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
                         ctx->rank, k, threads[k]);
    for (k = 0; k < 2; k++)
        for (i = 0; lists[k] && i < lists[k]->len; i++) ddp__tl_event_json(ctx, t, &lists[k]->ev[i]);
}

static ddp_result ddp__tl_write_file(ddp_context *ctx, const char *path, const ddp__text *body) {
    FILE *f = fopen(path, "w");
    int ok;
    if (!f) return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot write the timeline %s: %s", path, ddp__strerror(errno));
    /* body starts with ",\n": skip the first comma so the array is valid JSON */
    ok = fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n") > 0 &&
         fwrite(body->buf + 2, 1, body->len - 2, f) == body->len - 2 && fprintf(f, "\n]}\n") > 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok) return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot write the timeline %s: %s", path, ddp__strerror(errno));
    ddp__log(ctx, DDP_LOG_INFO, "timeline written to %s", path);
    return DDP_OK;
}

static void ddp__tl_free(ddp__timeline *tl) {
    if (!tl) return;
    DDP_FREE(tl->ev);
    DDP_FREE(tl);
}

/* --------------------------------------------------------------------------------------------
   >>env  The launcher environment and the descriptor: what each field resolves to
   -------------------------------------------------------------------------------------------- */
/* Parse an integer variable; 0 = absent, 1 = ok, -1 = malformed (error recorded). */
static int ddp__env_int(ddp_context *ctx, const char *name, long lo, long hi, int *out) {
    const char *s = getenv(name);
    char *end;
    long v;
    if (!s || !*s) return 0;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) {
        ddp__fail(ctx, DDP_ERR_BAD_ENV, "%s='%s' is not an integer in [%ld, %ld]", name, s, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 1;
}

typedef struct ddp__env_scheme {
    const char *rank, *world, *local_rank, *local_world, *launcher;
} ddp__env_scheme;

/* The launcher's own job id, where it gives one: the same for every rank of one job, another for
   another job (say, one started on the same MASTER_PORT). Left "" where none can be had. Only the
   scheme that gave the rank is asked: its variables are the ones its launcher set alike. */
static void ddp__launcher_job_id(ddp_context *ctx, const ddp__env_scheme *sc) {
    char *out = ctx->job.id;
    size_t cap = sizeof ctx->job.id;
    const char *a, *b;
    if (!strcmp(sc->launcher, "Open MPI")) {
        /* Open MPI 4 sets both (equal), Open MPI 5 (PRRTE) the PMIx namespace */
        if (((a = getenv("PMIX_NAMESPACE")) && *a) || ((a = getenv("OMPI_MCA_ess_base_jobid")) && *a))
            snprintf(out, cap, "Open MPI job %s", a);
    } else if (!strcmp(sc->launcher, "Slurm")) {
        if (!(a = getenv("SLURM_JOB_ID")) || !*a) a = getenv("SLURM_JOBID");
        if (!(b = getenv("SLURM_STEP_ID")) || !*b) b = getenv("SLURM_STEPID");
        if (a && *a) snprintf(out, cap, "Slurm job %s step %s", a, b && *b ? b : "-");
    } else if ((a = getenv("TORCHELASTIC_RUN_ID")) != NULL && *a) {
        /* not TORCHELASTIC_RESTART_COUNT: each host's agent counts its own restarts */
        if (strcmp(a, "none")) {   /* --standalone makes a fresh uuid; c10d takes --rdzv-id */
            snprintf(out, cap, "torchrun run %s", a);
        } else if (ctx->local_world == ctx->world && (b = getenv("TORCHELASTIC_ERROR_FILE")) != NULL) {
            /* The default static rendezvous calls every run "none", but one host's agent gives
               its workers a fresh log directory: DIR/attempt_N/LOCAL_RANK/error.json */
            const char *end = b + strlen(b);
            int slashes = 0;
            while (end > b && slashes < 2) if (*--end == '/') slashes++;
            if (slashes == 2 && strstr(b, "/attempt_")) snprintf(out, cap, "torchrun %.*s", (int)(end - b), b);
        }
    }
}

/* Slurm's hostlist syntax (SLURM_STEP_NODELIST, `scontrol show hostnames`): names separated by
   commas; a name may hold bracket groups of numbers and ranges, "h[1-3,7]"; a number's width is
   its range's lower bound's ("a[01-03]" = a01 a02 a03, "n[8-10]" = n8 n9 n10); with several
   groups ("r[1-2]n[1-4]") the first varies slowest, as Slurm expands them. */
#define DDP__HOSTLIST_MAX 10000000L   /* hosts in one list: more is a malformed list, not a cluster */

/* Digits at q (at most 9): the number and how many digits; NULL where there are none or too many. */
static const char *ddp__hostlist_num(const char *q, const char *end, unsigned long *v, int *width) {
    int w = 0;
    *v = 0;
    while (q < end && *q >= '0' && *q <= '9') {
        if (++w > 9) return NULL;
        *v = *v * 10 + (unsigned long)(*q++ - '0');
    }
    if (width) *width = w;
    return w ? q : NULL;
}

/* One bracket group's inside [p, end): how many numbers; with idx >= 0 also the idx-th and its
   width. -1 with the reason in why where it is malformed. */
static long ddp__hostlist_group(const char *p, const char *end, long idx, unsigned long *value, int *width,
                                char *why, size_t why_cap) {
    long count = 0;
    for (;;) {
        unsigned long lo, hi;
        int w;
        const char *q = ddp__hostlist_num(p, end, &lo, &w);
        hi = lo;
        if (q && q < end && *q == '-') q = ddp__hostlist_num(q + 1, end, &hi, NULL);
        if (!q || (q < end && *q != ',')) {
            snprintf(why, why_cap, "'[%.*s]' is not a list of numbers and ranges of at most 9 digits", (int)(end - p), p);
            return -1;
        }
        if (hi < lo) { snprintf(why, why_cap, "the range %lu-%lu goes down", lo, hi); return -1; }
        if (idx >= count && idx - count <= (long)(hi - lo)) { *value = lo + (unsigned long)(idx - count); *width = w; }
        count += (long)(hi - lo) + 1;
        if (count > DDP__HOSTLIST_MAX) { snprintf(why, why_cap, "more than %ld hosts", DDP__HOSTLIST_MAX); return -1; }
        if (q == end) return count;
        p = q + 1;
    }
}

/* Host number `want` (from 0; -1 for none) of the list into out (cap bytes). Returns how many
   hosts the list names, or -1 with the reason in why. */
static long ddp__hostlist_nth(const char *list, long want, char *out, size_t cap, char *why, size_t why_cap) {
    const char *item = list, *p;
    long total = 0;
    if (cap) out[0] = 0;
    while (*item) {
        const char *end = item;
        long count = 1, g;
        int open = 0;
        while (*end && (open || *end != ',')) {   /* the item ends at a comma outside brackets */
            if (*end == '[' && open) { snprintf(why, why_cap, "'[' inside '[...]'"); return -1; }
            if (*end == ']' && !open) { snprintf(why, why_cap, "']' without its '['"); return -1; }
            if (*end == '[' || *end == ']') open = *end == '[';
            end++;
        }
        if (open) { snprintf(why, why_cap, "'[' is not closed"); return -1; }
        for (p = item; p < end; p++) {   /* its size: the product of its groups' */
            if (*p != '[') continue;
            if ((g = ddp__hostlist_group(p + 1, strchr(p, ']'), -1, NULL, NULL, why, why_cap)) < 0) return -1;
            if (count > DDP__HOSTLIST_MAX / g) { snprintf(why, why_cap, "more than %ld hosts", DDP__HOSTLIST_MAX); return -1; }
            count *= g;
            p = strchr(p, ']');
        }
        if (end == item) count = 0;   /* "a,,b": an empty name is no host */
        if (want >= total && want < total + count) {   /* this item's host: mixed radix, the last group fastest */
            long left = count, rem = want - total;
            size_t n = 0;
            for (p = item; p < end; p++) {
                char num[16];
                const char *piece = p;
                size_t len = 1;
                if (*p == '[') {
                    const char *close = strchr(p, ']');
                    unsigned long v = 0;
                    int w = 1;
                    left /= ddp__hostlist_group(p + 1, close, -1, NULL, NULL, why, why_cap);
                    ddp__hostlist_group(p + 1, close, rem / left, &v, &w, why, why_cap);
                    rem %= left;
                    snprintf(num, sizeof num, "%0*lu", w, v);
                    piece = num;
                    len = strlen(num);
                    p = close;
                }
                if (n + len >= cap) { snprintf(why, why_cap, "host %ld is longer than %d characters", want, (int)cap - 1); return -1; }
                memcpy(out + n, piece, len);
                out[n += len] = 0;
            }
        }
        total += count;
        if (total > DDP__HOSTLIST_MAX) { snprintf(why, why_cap, "more than %ld hosts", DDP__HOSTLIST_MAX); return -1; }
        item = *end ? end + 1 : end;
    }
    return total;
}

/* This node's tasks in the step: SLURM_STEP_TASKS_PER_NODE ("2(x3),1": counts, in the step's
   node order) at SLURM_NODEID (this node's index in the step). SLURM_NTASKS_PER_NODE, where the
   others are missing, can be the allocation's (sbatch --ntasks-per-node), not the step's. */
static ddp_result ddp__slurm_local_world(ddp_context *ctx, const char **name) {
    const char *s = getenv(*name = "SLURM_STEP_TASKS_PER_NODE"), *p;
    char *e;
    long at = 0, tasks = 0, reps, mine = -1;
    double sum = 0;   /* tasks in the whole step; double: reps x tasks cannot overflow it */
    int node = 0, step_list = 1;
    if (!s || !*s) { s = getenv(*name = "SLURM_TASKS_PER_NODE"); step_list = 0; }
    if (!s || !*s) {
        *name = "SLURM_NTASKS_PER_NODE";
        return ddp__env_int(ctx, *name, 1, ctx->world, &ctx->local_world) < 0 ? DDP_ERR_BAD_ENV : DDP_OK;
    }
    if (ddp__env_int(ctx, "SLURM_NODEID", 0, INT_MAX, &node) < 0) return DDP_ERR_BAD_ENV;
    for (p = s;; p = e + 1) {
        errno = 0;
        tasks = strtol(p, &e, 10);
        reps = 1;
        if (e != p && *e == '(' && e[1] == 'x') {
            const char *q = e + 2;
            reps = strtol(q, &e, 10);
            if (e == q || *e++ != ')') reps = 0;
        }
        /* the whole list, not only up to this node's entry: garbage or a trailing comma after it
           is a list some other program wrote (and other ranks would read it otherwise) */
        if (errno || e == p || tasks < 1 || tasks > ctx->world || reps < 1 || reps > INT_MAX || (*e && *e != ','))
            return ddp__fail(ctx, DDP_ERR_BAD_ENV, "%s='%s' is not a list of task counts like '2(x3),1' (at '%.20s')",
                             *name, s, p);
        if (mine < 0 && node >= at && node - at < reps) mine = tasks;
        if (at < INT_MAX) at += reps;
        sum += (double)tasks * (double)reps;
        if (!*e) break;
    }
    if (mine < 0)
        return ddp__fail(ctx, DDP_ERR_BAD_ENV, "SLURM_NODEID=%d, but %s='%s' counts tasks on %ld node(s)", node,
                         *name, s, at);
    /* the step's list sums to the step's tasks (SLURM_TASKS_PER_NODE is the allocation's: it may hold more) */
    if (step_list && sum != (double)ctx->world)
        return ddp__fail(ctx, DDP_ERR_BAD_ENV, "%s='%s' counts %.0f task(s), but SLURM_NTASKS=%d", *name, s, sum, ctx->world);
    ctx->local_world = (int)mine;
    return DDP_OK;
}

/* Rendezvous under srun with no MASTER_ADDR / MASTER_PORT. The address: the first node of the
   step (rank 0 is there under srun's block and cyclic distributions; rank 0 checks), by name,
   resolved like any MASTER_ADDR; for a step on one node, 127.0.0.1. The port: from the job and
   step ids, 20000 + (64 x job + step) mod 12288, in [20000, 32288), below Linux's ephemeral
   ports: the steps 0..63 of one job never share one, two jobs only when their ids are equal
   modulo 192 (the job ids then tell them apart by name at the rendezvous: >>store). */
static ddp_result ddp__slurm_rendezvous(ddp_context *ctx, int need_addr, int *port) {
    const char *list, *name = "SLURM_STEP_NODELIST", *j, *st;
    char why[160];
    unsigned long long job, step;
    char *e1, *e2;
    int node = -1, r = 0;
    if (need_addr && ctx->local_world < ctx->world) {
        if (!(list = getenv(name)) || !*list) list = getenv(name = "SLURM_NODELIST");
        if (!list || !*list)
            return ddp__fail(ctx, DDP_ERR_BAD_ENV, "MASTER_ADDR must be set for a job that spans hosts (neither it nor "
                             "SLURM_STEP_NODELIST is set)");
        snprintf(why, sizeof why, "it names no host");
        if (ddp__hostlist_nth(list, 0, ctx->job.master_addr, sizeof ctx->job.master_addr, why, sizeof why) < 1)
            return ddp__fail(ctx, DDP_ERR_BAD_ENV, "%s='%.200s' is not a Slurm host list: %s", name, list, why);
        ctx->job.master_addr_from = !strcmp(name, "SLURM_NODELIST") ? "the first node of SLURM_NODELIST"
                                                                 : "the first node of SLURM_STEP_NODELIST";
        if (ctx->rank == 0 && (r = ddp__env_int(ctx, "SLURM_NODEID", 0, INT_MAX, &node)) < 0) return DDP_ERR_BAD_ENV;
        if (ctx->rank == 0 && r == 1 && node != 0) {
            char host[256] = "?";
            ddp__hostname(host, sizeof host);
            return ddp__fail(ctx, DDP_ERR_BAD_ENV, "rank 0 runs on node %d of the step ('%s'), not on its first node '%s' "
                             "where the other ranks look for its store (a task distribution such as arbitrary or "
                             "plane?): set MASTER_ADDR to rank 0's host", node, host, ctx->job.master_addr);
        }
    }
    if (!getenv("MASTER_PORT") || !*getenv("MASTER_PORT")) {
        if (!(j = getenv("SLURM_JOB_ID")) || !*j) j = getenv("SLURM_JOBID");
        if (!(st = getenv("SLURM_STEP_ID")) || !*st) st = getenv("SLURM_STEPID");
        if (j && st && *j && *st) {
            errno = 0;
            job = strtoull(j, &e1, 10);
            step = strtoull(st, &e2, 10);
            if (!errno && !*e1 && !*e2) *port = 20000 + (int)((job % 12288u * 64u + step) % 12288u);
        }
    }
    return DDP_OK;
}

static ddp_result ddp__read_env(ddp_context *ctx) {
    static const ddp__env_scheme schemes[] = {
        { "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "torchrun-style" },
        { "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
          "OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI" },
        { "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "Slurm" },
    };
    const ddp__env_scheme *sc = NULL;
    const char *addr, *local_world_name, *s;
    size_t i;
    int port = 29500, r, slurm;
    for (i = 0; i < sizeof schemes / sizeof schemes[0] && !sc; i++)
        if (getenv(schemes[i].rank) || getenv(schemes[i].world)) sc = &schemes[i];
    if (!sc) { ctx->rank = 0; ctx->world = 1; ctx->local_rank = 0; ctx->local_world = 1; return DDP_OK; }
    slurm = sc == &schemes[2];
    local_world_name = sc->local_world;
    /* A batch script (or salloc's shell) runs once, with the job's SLURM_NTASKS: more than one is
       said at once, not a rank 0 waiting for tasks that srun never started; one is one rank. */
    if (slurm && ((s = getenv("SLURM_JOB_ID")) || (s = getenv("SLURM_JOBID"))) && *s && !getenv("SLURM_STEP_ID") &&
        !getenv("SLURM_STEPID")) {
        const char *n = getenv("SLURM_NTASKS");
        if (n && *n && strcmp(n, "1"))
            return ddp__fail(ctx, DDP_ERR_BAD_ENV, "SLURM_NTASKS=%s, but this process of Slurm job %s was not started "
                             "by srun (no SLURM_STEP_ID: the batch script itself?): start the program with srun, or "
                             "unset SLURM_NTASKS for one rank", n, s);
        ctx->rank = 0; ctx->world = 1; ctx->local_rank = 0; ctx->local_world = 1;
        return DDP_OK;
    }

    ctx->rank = -1;
    if (ddp__env_int(ctx, sc->world, 1, 1 << 20, &ctx->world) != 1 ||
        ddp__env_int(ctx, sc->rank, 0, INT_MAX, &r) != 1) {
        if (!ctx->err[0])
            ddp__fail(ctx, DDP_ERR_BAD_ENV, "%s environment is incomplete: %s and %s must both be set",
                      sc->launcher, sc->rank, sc->world);
        return DDP_ERR_BAD_ENV;
    }
    if (r >= ctx->world)
        return ddp__fail(ctx, DDP_ERR_BAD_ENV, "%s=%d is not below %s=%d", sc->rank, r, sc->world, ctx->world);
    ctx->rank = r;
    ctx->local_rank = r;
    ctx->local_world = ctx->world;
    if (ddp__env_int(ctx, sc->local_rank, 0, INT_MAX, &ctx->local_rank) < 0) return DDP_ERR_BAD_ENV;
    if (slurm) {
        if (ddp__slurm_local_world(ctx, &local_world_name) != DDP_OK) return DDP_ERR_BAD_ENV;
    } else if (ddp__env_int(ctx, sc->local_world, 1, ctx->world, &ctx->local_world) < 0) return DDP_ERR_BAD_ENV;
    if (ctx->local_rank >= ctx->local_world)
        return ddp__fail(ctx, DDP_ERR_BAD_ENV, "%s=%d is not below %s=%d", sc->local_rank,
                         ctx->local_rank, local_world_name, ctx->local_world);
    addr = getenv("MASTER_ADDR");
    snprintf(ctx->job.master_addr, sizeof ctx->job.master_addr, "%s", addr && *addr ? addr : "127.0.0.1");
    if (slurm && ctx->world > 1 && ddp__slurm_rendezvous(ctx, !addr || !*addr, &port) != DDP_OK) return DDP_ERR_BAD_ENV;
    if (ctx->world > 1 && ctx->local_world < ctx->world && (!addr || !*addr) && !ctx->job.master_addr_from)
        return ddp__fail(ctx, DDP_ERR_BAD_ENV, "MASTER_ADDR must be set for a job that spans hosts");
    if (ddp__env_int(ctx, "MASTER_PORT", 1, 65535, &port) < 0) return DDP_ERR_BAD_ENV;
    if (ctx->world > 1 && !getenv("MASTER_PORT") && sc == &schemes[0])
        return ddp__fail(ctx, DDP_ERR_BAD_ENV, "MASTER_PORT is not set (WORLD_SIZE=%d)", ctx->world);
    ctx->desc.master_port = port;
    if (!ctx->job.id[0]) ddp__launcher_job_id(ctx, sc);
    return DDP_OK;
}

#define DDP__MAX_TIMEOUT_S 1e6   /* 11.6 days: any wait stays a finite poll */
#define DDP__MIN_TIMEOUT_S 1e-3  /* below a millisecond every wait fails at once */

/* A number as a person writes it in a variable: decimal digits, a point, an exponent; no
   spaces around it, no hex (strtod takes " 5" and "0x1"), no inf or nan. */
static int ddp__plain_decimal(const char *s, double *out) {
    char *end;
    size_t i;
    if (!((s[0] >= '0' && s[0] <= '9') || (s[0] == '.' && s[1] >= '0' && s[1] <= '9'))) return 0;
    for (i = 0; s[i]; i++)
        if (!strchr("0123456789.eE+-", s[i])) return 0;
    *out = strtod(s, &end);
    return *end == 0;
}

/* One rule for every DDP_* variable that has a descriptor field: a variable that is set (not
   empty) wins over what the program put in the field, and an invalid value is refused by name
   whoever would have won (ENVIRONMENT in the manual says why). Where the program had set the
   field to something else, the override is noted (ctx->job.env_overrides) and rank 0 says so once
   the rank is known (ddp__resolve_desc). The variables without a field (DDP_STAGED_GRADS,
   DDP_MPI_FLAT, DDP_MPI_TUNE) are checked here too, so a typo fails on every backend. */
static void ddp__env_overrode(ddp_context *ctx, const char *var, const char *value, const char *field, const char *was) {
    size_t len = strlen(ctx->job.env_overrides);
    if (len + 8 >= sizeof ctx->job.env_overrides) return;
    snprintf(ctx->job.env_overrides + len, sizeof ctx->job.env_overrides - len, "%s%s=%s over the program's ddp_desc.%s = %s",
             len ? "; " : "", var, value, field, was);
}

static const char *ddp__env_set(const char *name) {
    const char *s = getenv(name);
    return s && *s ? s : NULL;
}

static ddp_result ddp__env_flag(ddp_context *ctx, const char *name, int *field, const char *field_name) {
    const char *s = ddp__env_set(name);
    if (!s) return DDP_OK;
    if (strcmp(s, "0") && strcmp(s, "1"))
        return ddp__fail(ctx, DDP_ERR_BAD_ENV, "%s='%s' is neither 0 nor 1", name, s);
    if (!field) return DDP_OK;
    if (*field && *field != s[0] - '0') {
        char was[16];
        snprintf(was, sizeof was, "%d", *field);
        ddp__env_overrode(ctx, name, s, field_name, was);
    }
    *field = s[0] - '0';
    return DDP_OK;
}

/* A string field: the variable, else the program's, copied into the context (the caller's may go
   away after ddp_init). secret: the values stay out of the log. */
static ddp_result ddp__env_string(ddp_context *ctx, const char *name, const char **field, const char *field_name,
                                  char *store, size_t cap, int secret) {
    const char *s = ddp__env_set(name), *v;
    if (s && *field && strcmp(*field, s)) ddp__env_overrode(ctx, name, secret ? "(set)" : s, field_name, secret ? "(another)" : *field);
    v = s ? s : *field ? *field : "";
    /* cut short, two different job ids (or tokens) would be one job, a path another file */
    if (strlen(v) >= cap)
        return ddp__fail(ctx, s ? DDP_ERR_BAD_ENV : DDP_ERR_INVALID_ARGUMENT, "%s%s is %zu characters long; at most %zu fit",
                         s ? "" : "ddp_desc.", s ? name : field_name, strlen(v), cap - 1);
    snprintf(store, cap, "%s", v);
    *field = store;
    return DDP_OK;
}

static ddp_result ddp__desc_from_env(ddp_context *ctx, ddp_desc *d) {
    static const char *const level_names[] = { "", "debug", "info", "warn", "error", "off" };
    const char *s;
    ddp_result r;
    int i;
    if ((s = ddp__env_set("DDP_LOG")) != NULL) {
        for (i = 1; i <= (int)DDP_LOG_OFF && strcmp(s, level_names[i]); i++) {}
        if (i > (int)DDP_LOG_OFF)
            return ddp__fail(ctx, DDP_ERR_BAD_ENV, "DDP_LOG='%s' is none of debug, info, warn, error, off", s);
        if (d->log_level && (int)d->log_level != i)
            ddp__env_overrode(ctx, "DDP_LOG", s, "log_level",
                              (int)d->log_level >= 1 && (int)d->log_level <= (int)DDP_LOG_OFF ? level_names[d->log_level] : "?");
        d->log_level = (ddp_log_level)i;
    }
    if ((r = ddp__env_string(ctx, "DDP_TIMELINE", &d->timeline_path, "timeline_path", ctx->tl.path,
                             sizeof ctx->tl.path, 0)) != DDP_OK) return r;
    if ((r = ddp__env_string(ctx, "DDP_JOB_TOKEN", &d->job_token, "job_token", ctx->job.token, sizeof ctx->job.token, 1)) != DDP_OK)
        return r;
    {   /* job_id: else the launcher's, in ddp__read_env; the descriptor keeps its own until then */
        const char *id = d->job_id;
        if ((r = ddp__env_string(ctx, "DDP_JOB_ID", &id, "job_id", ctx->job.id, sizeof ctx->job.id, 0)) != DDP_OK) return r;
    }
    if ((s = ddp__env_set("DDP_TIMEOUT")) != NULL) {
        double t = 0;
        if (!ddp__plain_decimal(s, &t) || !ddp__nonneg_d(t) || t < DDP__MIN_TIMEOUT_S || t > DDP__MAX_TIMEOUT_S)
            return ddp__fail(ctx, DDP_ERR_BAD_ENV, "DDP_TIMEOUT='%s' is not a number of seconds in [%g, %g] (plain "
                             "decimal, no spaces)", s, (double)DDP__MIN_TIMEOUT_S, (double)DDP__MAX_TIMEOUT_S);
        if (d->timeout_s != 0 && d->timeout_s != t) {
            char was[32];
            snprintf(was, sizeof was, "%g", d->timeout_s);
            ddp__env_overrode(ctx, "DDP_TIMEOUT", s, "timeout_s", was);
        }
        d->timeout_s = t;
    }
    if ((r = ddp__env_flag(ctx, "DDP_CHECK_READY", &d->check_ready, "check_ready")) != DDP_OK) return r;
    if ((r = ddp__env_flag(ctx, "DDP_SHARD_OPTIMIZER", &d->shard_optimizer, "shard_optimizer")) != DDP_OK) return r;
    if ((r = ddp__env_flag(ctx, "DDP_SHARD_ACCUMULATE", &d->shard_accumulate, "shard_accumulate")) != DDP_OK) return r;
    if ((s = ddp__env_set("DDP_SHARD")) != NULL) {
        static const char *const shard_names[] = { "", "none", "optimizer", "gradients", "parameters" };
        for (i = 1; i <= (int)DDP_SHARD_PARAMETERS && strcmp(s, shard_names[i]); i++) {}
        if (i > (int)DDP_SHARD_PARAMETERS)
            return ddp__fail(ctx, DDP_ERR_BAD_ENV, "DDP_SHARD='%s' is none of none, optimizer, gradients, parameters", s);
        if (d->shard && (int)d->shard != i)
            ddp__env_overrode(ctx, "DDP_SHARD", s, "shard", (int)d->shard >= 1 && (int)d->shard <= (int)DDP_SHARD_PARAMETERS
                              ? shard_names[d->shard] : "?");
        d->shard = (ddp_shard)i;
        if (d->shard_optimizer && d->shard == DDP_SHARD_NONE)
            return ddp__fail(ctx, DDP_ERR_BAD_ENV, "DDP_SHARD=none contradicts shard_optimizer 1 (set one of them)");
    }
    if ((s = ddp__env_set("DDP_SHARD_GROUP")) != NULL) {
        double g = 0;
        if (!ddp__plain_decimal(s, &g) || g < 0 || g > 1e6 || g != (double)(int)g)
            return ddp__fail(ctx, DDP_ERR_BAD_ENV, "DDP_SHARD_GROUP='%s' is not a count of ranks (0: every rank)", s);
        if (d->shard_group && d->shard_group != (int)g) {
            char was[32];
            snprintf(was, sizeof was, "%d", d->shard_group);
            ddp__env_overrode(ctx, "DDP_SHARD_GROUP", s, "shard_group", was);
        }
        d->shard_group = (int)g;
    }
    if ((s = ddp__env_set("DDP_SHARD_PREFETCH")) != NULL) {
        int off = !strcmp(s, "off") ? 1 : !strcmp(s, "on") ? 0 : -1;
        if (off < 0) return ddp__fail(ctx, DDP_ERR_BAD_ENV, "DDP_SHARD_PREFETCH='%s' is neither on nor off", s);
        if (d->shard_prefetch_off && d->shard_prefetch_off != off)
            ddp__env_overrode(ctx, "DDP_SHARD_PREFETCH", s, "shard_prefetch_off", "1");
        d->shard_prefetch_off = off;
    }
    if ((s = ddp__env_set("DDP_PARAM_DTYPE")) != NULL) {
        ddp_dtype t = !strcmp(s, "fp32") ? DDP_DTYPE_FP32 : !strcmp(s, "bf16") ? DDP_DTYPE_BF16 : DDP_DTYPE_DEFAULT;
        if (t == DDP_DTYPE_DEFAULT)
            return ddp__fail(ctx, DDP_ERR_BAD_ENV, "DDP_PARAM_DTYPE='%s' is neither fp32 nor bf16", s);
        if (d->param_dtype && d->param_dtype != t)
            ddp__env_overrode(ctx, "DDP_PARAM_DTYPE", s, "param_dtype", d->param_dtype == DDP_DTYPE_FP32 ? "DDP_DTYPE_FP32"
                              : d->param_dtype == DDP_DTYPE_BF16 ? "DDP_DTYPE_BF16" : "(not a ddp_dtype)");
        d->param_dtype = t;
    }
    if ((r = ddp__env_flag(ctx, "DDP_STAGED_GRADS", NULL, NULL)) != DDP_OK) return r;
    if ((r = ddp__env_flag(ctx, "DDP_MPI_FLAT", NULL, NULL)) != DDP_OK) return r;
    return ddp__env_flag(ctx, "DDP_MPI_TUNE", NULL, NULL);
}

/* Every default, in one place: a field still zero gets its documented value. Pure. */
static void ddp__desc_defaults(ddp_desc *d) {
    if (!d->log_level) d->log_level = DDP_LOG_WARN;
    if (d->timeout_s == 0) d->timeout_s = 300;
    if (d->bucket_cap_mb == 0) d->bucket_cap_mb = 25;
    if (d->first_bucket_mb == 0) d->first_bucket_mb = d->bucket_cap_mb < 1 ? d->bucket_cap_mb : 1;
    if (d->shutdown_timeout_s == 0) d->shutdown_timeout_s = 1;
    if (!d->param_dtype) d->param_dtype = DDP_DTYPE_FP32;
    if (!d->reduce_dtype) d->reduce_dtype = d->param_dtype;   /* bf16 gradients travel as bf16 unless asked */
    if (!d->shard) d->shard = d->shard_optimizer ? DDP_SHARD_OPTIMIZER : DDP_SHARD_NONE;
    d->shard_optimizer = d->shard >= DDP_SHARD_OPTIMIZER;     /* every level shards AdamW's state */
}

/* What only the resolved descriptor can show: ranges and combinations. Every flag, enum and
   number's sign was checked as the program gave it (ddp__desc_check_given) and every variable
   as it was parsed (ddp__desc_from_env), so they are not checked again here. */
static ddp_result ddp__desc_validate(ddp_context *ctx, const ddp_desc *d) {
    if (d->world_size < 0)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: world_size %d must not be negative", d->world_size);
    /* a wait is a poll of int milliseconds: past ~24 days it would wrap into "forever" */
    if (d->timeout_s > DDP__MAX_TIMEOUT_S || d->shutdown_timeout_s > DDP__MAX_TIMEOUT_S ||
        d->inject_comm_latency_ms > 1e3 * DDP__MAX_TIMEOUT_S)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: timeout_s %g, shutdown_timeout_s %g or "
                         "inject_comm_latency_ms %g is above %g s (infinite waits are not offered: a lost peer must "
                         "end the job)", d->timeout_s, d->shutdown_timeout_s, d->inject_comm_latency_ms,
                         (double)DDP__MAX_TIMEOUT_S);
    if ((d->timeout_s > 0 && d->timeout_s < DDP__MIN_TIMEOUT_S) || (d->shutdown_timeout_s > 0 && d->shutdown_timeout_s < DDP__MIN_TIMEOUT_S))
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: timeout_s %g or shutdown_timeout_s %g is below %g s "
                         "(every wait would fail at once)", d->timeout_s, d->shutdown_timeout_s, (double)DDP__MIN_TIMEOUT_S);
    if (d->bucket_cap_mb > 1048576.0 || d->first_bucket_mb > 1048576.0)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: bucket_cap_mb %g or first_bucket_mb %g is above "
                         "1048576 MiB (1 TiB)", d->bucket_cap_mb, d->first_bucket_mb);
    /* ddp_join answers the synchronizing steps only; shard_accumulate reduce-scatters every micro-step */
    if (d->shard_accumulate && d->uneven_inputs != DDP_JOIN_OFF)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: shard_accumulate 1 cannot be combined with uneven_inputs "
                         "(each micro-step's reduce-scatter would need the joined ranks, which answer synchronizing steps "
                         "only): accumulate with the whole gradients (shard_accumulate 0)");
    if (d->shard_accumulate && d->shard != DDP_SHARD_GRADIENTS)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: shard_accumulate 1 needs shard DDP_SHARD_GRADIENTS (it says how "
                         "ZeRO-2 accumulates micro-steps; the other levels keep the gradients whole)");
    /* hybrid: the other holders of this rank's part copy it after the bucket (out_pending), so it cannot
       be moved into the accumulator and released at once */
    if (d->shard_accumulate && d->shard_group)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: shard_accumulate 1 with shard_group %d (hybrid sharding) "
                         "is not built yet: accumulate with the whole gradients (shard_accumulate 0)", d->shard_group);
    /* hybrid: a group to shard within needs something sharded (the world's checks: ddp__hybrid_resolve) */
    if (d->shard_group && d->shard < DDP_SHARD_OPTIMIZER)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: shard_group %d shards within groups of %d ranks, but "
                         "shard is DDP_SHARD_NONE (shard_optimizer 0): set shard to DDP_SHARD_OPTIMIZER or above, or "
                         "shard_group to 0", d->shard_group, d->shard_group);
    return DDP_OK;
}

/* The process group: given by hand (world_size > 0) or read from the launcher's environment. */
static ddp_result ddp__resolve_group(ddp_context *ctx) {
    ddp_desc *d = &ctx->desc;
    if (d->world_size > 0) {
        if (d->rank < 0 || d->rank >= d->world_size)
            return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: rank %d is not in [0, %d)", d->rank, d->world_size);
        ctx->rank = d->rank;
        ctx->world = d->world_size;
        ctx->local_rank = d->local_world_size ? d->local_rank : d->rank;
        ctx->local_world = d->local_world_size ? d->local_world_size : d->world_size;
        snprintf(ctx->job.master_addr, sizeof ctx->job.master_addr, "%s", d->master_addr ? d->master_addr : "127.0.0.1");
        if (d->world_size > 1 && (d->master_port <= 0 || d->master_port > 65535))
            return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: master_port %d is not in [1, 65535]", d->master_port);
    } else {
        ddp_result r = ddp__read_env(ctx);
        if (r != DDP_OK) return r;
    }
    d->world_size = ctx->world;
    d->rank = ctx->rank;
    d->local_rank = ctx->local_rank;
    d->local_world_size = ctx->local_world;
    d->master_addr = ctx->job.master_addr;
    d->job_id = ctx->job.id;
    return DDP_OK;
}

/* The message every flag or enum field out of range ends with: the usual cause is a struct
   filled field by field, whose newer fields (zero = the old behaviour) hold stack garbage. */
#define DDP__ZERO_INIT_HINT "an uninitialized field? zero-initialize the struct (= {0} or designated initializers) " \
                            "and set only the fields you use"

/* The descriptor as the program gave it, before the environment and the defaults touch it:
   every flag is 0 or 1, every enum in range, no number NaN (found by its bits: under -ffast-math
   NaN == 0 may hold, and a NaN would silently become the default). */
static ddp_result ddp__desc_check_given(ddp_context *ctx, const ddp_desc *d) {
    const struct { const char *name; int value, max; } f[] = {
        { "backend", (int)d->backend, (int)DDP_BACKEND_MPI },      { "find_unused", d->find_unused, 1 },
        { "skip_nonfinite", d->skip_nonfinite, 1 },                 { "log_level", (int)d->log_level, (int)DDP_LOG_OFF },
        { "reduce_dtype", (int)d->reduce_dtype, (int)DDP_DTYPE_BF16 }, { "uneven_inputs", (int)d->uneven_inputs, (int)DDP_JOIN_DIVIDE_BY_ACTIVE },
        { "shard_optimizer", d->shard_optimizer, 1 },               { "param_dtype", (int)d->param_dtype, (int)DDP_DTYPE_BF16 },
        { "check_ready", d->check_ready, 1 },                       { "outer.mode", (int)d->outer.mode, (int)DDP_OUTER_STREAMING },
        { "outer.wire", (int)d->outer.wire, (int)DDP_WIRE_INT8 },   { "outer.as_given", d->outer.as_given, 1 },
        { "outer.group_size", d->outer.group_size, INT_MAX },       { "outer.inner_steps", d->outer.inner_steps, INT_MAX },
        { "outer.fragments", d->outer.fragments, INT_MAX },         { "outer.delay_steps", d->outer.delay_steps, INT_MAX },
        { "outer.quant_block", d->outer.quant_block, INT_MAX },
        { "shard", (int)d->shard, (int)DDP_SHARD_PARAMETERS },       { "shard_group", d->shard_group, INT_MAX },
        { "shard_accumulate", d->shard_accumulate, 1 },         { "shard_prefetch_off", d->shard_prefetch_off, 1 },
    };
    const struct { const char *name; double value; } x[] = {
        { "timeout_s", d->timeout_s }, { "bucket_cap_mb", d->bucket_cap_mb }, { "first_bucket_mb", d->first_bucket_mb },
        { "inject_comm_latency_ms", d->inject_comm_latency_ms }, { "inject_comm_gbps", d->inject_comm_gbps },
        { "shutdown_timeout_s", d->shutdown_timeout_s }, { "outer.lr", d->outer.lr }, { "outer.momentum", d->outer.momentum },
        { "outer.mix", d->outer.mix },
    };
    size_t i;
    for (i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].value < 0 || f[i].value > f[i].max)
            return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: %s %d is not %s%d: %s", f[i].name, f[i].value,
                             f[i].max == 1 ? "0 or " : "in 0 .. ", f[i].max, DDP__ZERO_INIT_HINT);
    for (i = 0; i < sizeof x / sizeof x[0]; i++)
        if (!ddp__nonneg_d(x[i].value))
            return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: %s is %g: must not be negative (or NaN); %s",
                             x[i].name, x[i].value, DDP__ZERO_INIT_HINT);
    if (d->cancel_token) {
        int c = __atomic_load_n(&d->cancel_token->cancelled, __ATOMIC_ACQUIRE);
        if (c != 0 && c != 1)
            return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: cancel_token holds %d, neither 0 (not cancelled) "
                             "nor 1 (cancelled): %s", c, DDP__ZERO_INIT_HINT);
    }
    if (d->shard_optimizer && d->shard == DDP_SHARD_NONE)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: shard DDP_SHARD_NONE contradicts shard_optimizer 1 "
                         "(set one of them: shard is the level, shard_optimizer 1 means DDP_SHARD_OPTIMIZER)");
    return DDP_OK;
}

/* Hybrid sharding (desc.shard_group = S, >>shard): the state in parts within each S consecutive
   ranks, replicated across the world / S groups. S = world is plain sharding and S = 1 a shard of
   one rank (everything whole on every rank: DDP, the level resolved to NONE); neither is hybrid.
   With replica groups the shard is the group already: S must be 0 or the group's size. */
static ddp_result ddp__hybrid_resolve(ddp_context *ctx) {
    ddp_desc *d = &ctx->desc;
    int s = d->shard_group;
    ctx->shard.hybrid = 0;
    if (!s) return DDP_OK;
    if (d->outer.mode != DDP_OUTER_OFF) {
        if (s != ctx->outer.size)
            return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: shard_group %d with replica groups of %d ranks "
                             "(outer.group_size): the sharded state is already split within each replica group, so "
                             "shard_group must be 0 or %d", s, ctx->outer.size, ctx->outer.size);
        return DDP_OK;
    }
    if (s > ctx->world || ctx->world % s)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: shard_group %d does not divide the %d ranks into groups "
                         "of equal size (hybrid sharding: the state in parts within each group of shard_group "
                         "consecutive ranks)", s, ctx->world);
    if (s == 1) {   /* nothing to share a part with: every rank holds everything, as DDP */
        d->shard = DDP_SHARD_NONE;
        d->shard_optimizer = 0;
        return DDP_OK;
    }
    if (s < ctx->world) ctx->shard.hybrid = s;
    return DDP_OK;
}

/* The outer settings resolved (defaults: ddp_outer's comments) and checked, and the replica
   groups laid out: group g is ranks [g * size, (g + 1) * size), so with a launcher that numbers
   a host's ranks together (ddprun, torchrun, Slurm's block distribution) the default size,
   local_world_size, makes one group a host. */
static ddp_result ddp__outer_resolve(ddp_context *ctx) {
    ddp_outer *o = &ctx->desc.outer;
    int gap, given = o->group_size;
    ctx->outer.flight = -1;
    ctx->outer.slowest_group = -1;
    ctx->outer.groups = 1;
    ctx->outer.size = ctx->world;
    ctx->outer.index = ctx->rank;
    if (o->mode == DDP_OUTER_OFF) return DDP_OK;
    if (o->group_size == 0) o->group_size = ctx->local_world;
    if (o->group_size > ctx->world || ctx->world % o->group_size)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc.outer: group_size %d does not divide the %d ranks into "
                         "groups of equal size%s", o->group_size, ctx->world, given == 0 ?
                         " (the default, local_world_size: every host must run as many ranks)" : "");
    if (o->inner_steps <= 0)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc.outer: inner_steps is %d: the groups must meet every H "
                         "inner steps, H >= 1 (DiLoCo's paper: 500; H = 1 with AVERAGE is DDP on the parameters)", o->inner_steps);
    if (o->mode == DDP_OUTER_AVERAGE && (o->lr != 0 || o->momentum != 0 || o->as_given))
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc.outer: AVERAGE is outer lr 1 and momentum 0; lr %g, "
                         "momentum %g (as_given %d) were given: use DDP_OUTER_DILOCO for another outer optimizer",
                         o->lr, o->momentum, o->as_given);
    if (o->mode != DDP_OUTER_STREAMING && (o->fragments > 1 || o->delay_steps || o->mix != 0))
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc.outer: fragments %d, delay_steps %d, mix %g are streaming "
                         "DiLoCo's: set mode DDP_OUTER_STREAMING", o->fragments, o->delay_steps, o->mix);
    if (o->mode == DDP_OUTER_AVERAGE) { o->lr = 1; o->momentum = 0; }
    else if (!o->as_given) { if (o->lr == 0) o->lr = 0.7f; if (o->momentum == 0) o->momentum = 0.9f; }
    if (o->fragments == 0) o->fragments = 1;
    if (o->quant_block == 0) o->quant_block = 64;
    if (o->wire == DDP_WIRE_DEFAULT) o->wire = o->mode == DDP_OUTER_AVERAGE ? DDP_WIRE_FP32 : DDP_WIRE_BF16;
    if (!ddp__finite_d(o->lr) || !(o->lr > 0) || !(o->momentum < 1) || !(o->mix < 1) || o->quant_block > 1 << 20)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc.outer: lr %g, momentum %g, mix %g or quant_block %d out "
                         "of range (lr finite and > 0; momentum and mix in [0, 1); quant_block in 1 .. 1048576)",
                         o->lr, o->momentum, o->mix, o->quant_block);
    gap = o->inner_steps / o->fragments;   /* the fewest steps between two fragments' sends */
    if (o->fragments > o->inner_steps || o->delay_steps >= gap)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc.outer: %d fragments over inner_steps %d with delay_steps "
                         "%d: a fragment is sent every %d steps, so at most one is in flight only if fragments <= "
                         "inner_steps and delay_steps < inner_steps / fragments", o->fragments, o->inner_steps,
                         o->delay_steps, gap > 0 ? gap : 0);
    if (ctx->desc.uneven_inputs != DDP_JOIN_OFF)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc.outer: replica groups are not built (yet) with "
                         "uneven_inputs: turn it off");
    ctx->outer.size = o->group_size;
    ctx->outer.groups = ctx->world / o->group_size;
    ctx->outer.group = ctx->rank / o->group_size;
    ctx->outer.index = ctx->rank % o->group_size;
    return DDP_OK;
}

/* The descriptor as ddp_config() reports it: copied, environment, defaults, checked, the group
   resolved. The backend is chosen later (>>group), once the backends are defined. */
static ddp_result ddp__resolve_desc(ddp_context *ctx, const ddp_desc *in) {
    ddp_result r;
    if (in && (r = ddp__desc_check_given(ctx, in)) != DDP_OK) return r;
    if (in) ctx->desc = *in;
    if ((r = ddp__desc_from_env(ctx, &ctx->desc)) != DDP_OK) return r;
    ddp__desc_defaults(&ctx->desc);
    if ((r = ddp__desc_validate(ctx, &ctx->desc)) != DDP_OK) return r;
    if ((r = ddp__resolve_group(ctx)) != DDP_OK) return r;
    if ((r = ddp__outer_resolve(ctx)) != DDP_OK) return r;
    if ((r = ddp__hybrid_resolve(ctx)) != DDP_OK) return r;
    if (ctx->job.env_overrides[0] && ctx->rank == 0)   /* once a job: every rank reads the same environment */
        ddp__log(ctx, DDP_LOG_WARN, "the environment overrides the program's settings (a DDP_* variable that is set wins): %s",
                 ctx->job.env_overrides);
    return DDP_OK;
}

/* --------------------------------------------------------------------------------------------
   >>store  Rendezvous: a small TCP key/value store served by rank 0.
   A frame is a 16-byte header (magic, op, key length, value length; little endian) followed by
   the key and the value. Every length is checked against a cap before anything is allocated.
   GET waits on the server until the key exists or the client's deadline passes.

   The handshake proves, both ways, that the other side knows the job token, without sending it:
   K = HMAC-SHA-256(token, "ddp.h store key" 0 job_id), then
     client -> HELLO  key: job_id (in clear: a rank of another job is told whose store it reached)
                      value: rank (int32) | client nonce (32 random bytes)
     server -> OK     value: server nonce (32) | HMAC(K, "server" 0 rank nonce_c nonce_s)
               or OTHER_JOB with the server's job id
     client -> AUTH   value: HMAC(K, "client" 0 rank nonce_c nonce_s)   (empty: "you failed")
     server -> OK, or REFUSED
   The server proves first, so a program squatting on MASTER_PORT learns only a random nonce
   and is refused by the ranks. Until AUTH passes, nothing but these two frames is accepted.
   -------------------------------------------------------------------------------------------- */
#define DDP__STORE_MAGIC 0x53504444u   /* "DDPS" */
enum { DDP__OP_HELLO = 1, DDP__OP_SET, DDP__OP_GET, DDP__OP_ADD, DDP__OP_CHECK, DDP__OP_AUTH };
enum { DDP__REPLY_OK = 0, DDP__REPLY_MISSING, DDP__REPLY_REFUSED, DDP__REPLY_PEER_LOST, DDP__REPLY_OTHER_JOB,
       DDP__REPLY_FAILED };
#define DDP__NONCE_BYTES 32u
#define DDP__HELLO_BYTES (4u + DDP__NONCE_BYTES)

/* ---- SHA-256 (FIPS 180-4) and HMAC (RFC 2104): the handshake's keyed hash ---- */
typedef struct ddp__sha256 { uint32_t h[8]; uint64_t bytes; unsigned char buf[64]; } ddp__sha256;

static uint32_t ddp__ror32(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void ddp__sha256_block(uint32_t h[8], const unsigned char *p) {
    static const uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2 };
    uint32_t w[64], v[8], t1, t2;
    int i;
    for (i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (i = 16; i < 64; i++)
        w[i] = w[i - 16] + (ddp__ror32(w[i - 15], 7) ^ ddp__ror32(w[i - 15], 18) ^ (w[i - 15] >> 3)) + w[i - 7] +
               (ddp__ror32(w[i - 2], 17) ^ ddp__ror32(w[i - 2], 19) ^ (w[i - 2] >> 10));
    memcpy(v, h, sizeof v);
    for (i = 0; i < 64; i++) {
        t1 = v[7] + (ddp__ror32(v[4], 6) ^ ddp__ror32(v[4], 11) ^ ddp__ror32(v[4], 25)) +
             ((v[4] & v[5]) ^ (~v[4] & v[6])) + k[i] + w[i];
        t2 = (ddp__ror32(v[0], 2) ^ ddp__ror32(v[0], 13) ^ ddp__ror32(v[0], 22)) +
             ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
        memmove(v + 1, v, 7 * sizeof v[0]);
        v[4] += t1;
        v[0] = t1 + t2;
    }
    for (i = 0; i < 8; i++) h[i] += v[i];
}

static void ddp__sha256_init(ddp__sha256 *c) {
    static const uint32_t h0[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
    memcpy(c->h, h0, sizeof h0);
    c->bytes = 0;
}

static void ddp__sha256_update(ddp__sha256 *c, const void *data, size_t len) {
    const unsigned char *p = (const unsigned char *)data;
    while (len) {
        size_t fill = (size_t)(c->bytes % 64), n = 64 - fill < len ? 64 - fill : len;
        memcpy(c->buf + fill, p, n);
        c->bytes += n; p += n; len -= n;
        if (fill + n == 64) ddp__sha256_block(c->h, c->buf);
    }
}

static void ddp__sha256_final(ddp__sha256 *c, unsigned char out[32]) {
    unsigned char tail[72];
    uint64_t bits = c->bytes * 8;
    size_t pad = 64 - (size_t)((c->bytes + 8) % 64), i;   /* 1..64 bytes: 0x80, then zeros */
    memset(tail, 0, sizeof tail);
    tail[0] = 0x80;
    for (i = 0; i < 8; i++) tail[pad + i] = (unsigned char)(bits >> (56 - 8 * i));
    ddp__sha256_update(c, tail, pad + 8);
    for (i = 0; i < 32; i++) out[i] = (unsigned char)(c->h[i / 4] >> (24 - 8 * (i % 4)));
}

static void ddp__hmac_sha256(const void *key, size_t klen, const void *msg, size_t mlen, unsigned char out[32]) {
    unsigned char k0[64], pad[64];
    ddp__sha256 c;
    size_t i;
    memset(k0, 0, sizeof k0);
    if (klen > 64) { ddp__sha256_init(&c); ddp__sha256_update(&c, key, klen); ddp__sha256_final(&c, k0); }
    else if (klen) memcpy(k0, key, klen);
    for (i = 0; i < 64; i++) pad[i] = (unsigned char)(k0[i] ^ 0x36);
    ddp__sha256_init(&c); ddp__sha256_update(&c, pad, 64); ddp__sha256_update(&c, msg, mlen); ddp__sha256_final(&c, out);
    for (i = 0; i < 64; i++) pad[i] = (unsigned char)(k0[i] ^ 0x5c);
    ddp__sha256_init(&c); ddp__sha256_update(&c, pad, 64); ddp__sha256_update(&c, out, 32); ddp__sha256_final(&c, out);
}

/* Equal in time independent of where they differ. */
static int ddp__same_bytes(const unsigned char *a, const unsigned char *b, size_t n) {
    unsigned diff = 0;
    size_t i;
    for (i = 0; i < n; i++) diff |= (unsigned)(a[i] ^ b[i]);
    return diff == 0;
}

/* Fresh nonces from the kernel: 0, or -1 when none can be had. */
static int ddp__random_bytes(void *buf, size_t len) {
#ifdef DDP__FIXED_NONCES_FOR_FUZZING   /* fuzz/fuzz_store.c: its seeds carry proofs made for these */
    memset(buf, 0x5a, len);
    return 0;
#else
    return ddp__os_random(buf, len);
#endif
}

/* The handshake key: the token and the job id, so one exchange checks both. */
static void ddp__derive_store_key(ddp_context *ctx) {
    static const char label[] = "ddp.h store key";
    unsigned char msg[sizeof label + sizeof ctx->job.id];
    size_t idlen = strlen(ctx->job.id);
    memcpy(msg, label, sizeof label);            /* the label's 0 separates it from the id */
    memcpy(msg + sizeof label, ctx->job.id, idlen);
    ddp__hmac_sha256(ctx->job.token, strlen(ctx->job.token), msg, sizeof label + idlen, ctx->job.store_key);
}

/* One side's proof: HMAC(K, side 0 rank nonce_c nonce_s). */
static void ddp__handshake_proof(const ddp_context *ctx, const char *side, const unsigned char hello[DDP__HELLO_BYTES],
                                 const unsigned char nonce_s[DDP__NONCE_BYTES], unsigned char out[32]) {
    unsigned char msg[8 + DDP__HELLO_BYTES + DDP__NONCE_BYTES];
    size_t n = strlen(side) + 1;
    memcpy(msg, side, n);
    memcpy(msg + n, hello, DDP__HELLO_BYTES);
    memcpy(msg + n + DDP__HELLO_BYTES, nonce_s, DDP__NONCE_BYTES);
    ddp__hmac_sha256(ctx->job.store_key, sizeof ctx->job.store_key, msg, n + DDP__HELLO_BYTES + DDP__NONCE_BYTES, out);
}

static void ddp__put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16); p[3] = (unsigned char)(v >> 24);
}
static uint32_t ddp__get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Send all bytes, or fail by the deadline. */
static int ddp__send_all(int fd, const void *buf, size_t len, double deadline) {
    const unsigned char *p = (const unsigned char *)buf;
    while (len) {
        long n = ddp__send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) { p += n; len -= (size_t)n; continue; }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
        {
            struct pollfd pfd;
            double left = deadline - ddp__now();
            if (left <= 0) return -1;
            pfd.fd = fd; pfd.events = POLLOUT; pfd.revents = 0;
            ddp__poll(&pfd, 1, (int)(left * 1000) + 1);
        }
    }
    return 0;
}

/* Rank 0 runs on this host and its process is gone. Its connection's close says so too, but not
   always at once: under Wine the server holds a killed process's sockets open. */
static int ddp__rank0_gone(const ddp_context *ctx) {
    return ctx->rank != 0 && ctx->rdv.rank0_here && ctx->rdv.peer_pids && !ddp__pid_alive(ctx->rdv.peer_pids[0]);
}

/* Receive exactly len bytes by the deadline: 0 ok, -1 error or closed, -2 timed out. With
   `watch` (a rank waiting for rank 0's store), also -1 once rank 0 is gone (ddp__rank0_gone). */
static int ddp__recv_watched(const ddp_context *watch, int fd, void *buf, size_t len, double deadline) {
    unsigned char *p = (unsigned char *)buf;
    while (len) {
        struct pollfd pfd;
        double left = deadline - ddp__now();
        long n;
        if (left <= 0) return -2;
        pfd.fd = fd; pfd.events = POLLIN; pfd.revents = 0;
        if (watch && left > DDP__LIVENESS_PERIOD_S) left = DDP__LIVENESS_PERIOD_S;
        if (ddp__poll(&pfd, 1, (int)(left * 1000) + 1) <= 0) {
            if (watch && ddp__rank0_gone(watch)) return -1;
            continue;
        }
        n = ddp__recv(fd, p, len, 0);
        if (n == 0) return -1;
        if (n < 0) { if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue; return -1; }
        p += n; len -= (size_t)n;
    }
    return 0;
}
static int ddp__recv_all(int fd, void *buf, size_t len, double deadline) { return ddp__recv_watched(NULL, fd, buf, len, deadline); }

static int ddp__send_frame(int fd, uint32_t op, const void *key, uint32_t klen,
                           const void *val, uint32_t vlen, double deadline) {
    unsigned char hdr[16];
    ddp__put_u32(hdr, DDP__STORE_MAGIC); ddp__put_u32(hdr + 4, op);
    ddp__put_u32(hdr + 8, klen); ddp__put_u32(hdr + 12, vlen);
    if (ddp__send_all(fd, hdr, 16, deadline)) return -1;
    if (klen && ddp__send_all(fd, key, klen, deadline)) return -1;
    if (vlen && ddp__send_all(fd, val, vlen, deadline)) return -1;
    return 0;
}

/* ---- the server (a thread of rank 0) ---- */
typedef struct ddp__kv { char *key; unsigned char *val; uint32_t vlen; } ddp__kv;
typedef struct ddp__conn {
    int fd, authed, waiting;       /* waiting: a GET parked until its key appears */
    int rank;                      /* as announced in HELLO */
    int admitted;                  /* its claim to `rank` (ADD "claim/RANK", ddp__rendezvous): 0 not made
                                      yet, 1 won, 2 refused (a duplicate: its hang-up is no rank's loss) */
    int challenged;                /* HELLO answered; its AUTH is due */
    unsigned char hello[DDP__HELLO_BYTES], nonce_s[DDP__NONCE_BYTES];
    unsigned char hdr[16];
    size_t got;                    /* bytes of header + body received so far */
    unsigned char *body;
    uint32_t op, klen, vlen;
    double deadline, opened;
} ddp__conn;

struct ddp__store_server {
    ddp_context *ctx;
    int listen_fd, wake_pipe[2], stop;
    ddp__thread thread;
    ddp__kv *kv;
    int num_kv, cap_kv;
    ddp__conn *conns;
    int num_conns, max_conns;
    int lost_rank;                 /* -1, or the first rank whose connection dropped */
    unsigned turned_away[3], unlogged;   /* per ddp__store_warn kind; not logged since the last count */
    double count_logged_at;
};

/* Clients turned away are logged, the first few of each kind in full, then only counted: a
   flood of wrong-token connections must not flood the log. */
enum { DDP__WARN_MALFORMED, DDP__WARN_TOKEN, DDP__WARN_OTHER_JOB };
#define DDP__STORE_WARN_FIRST 3
#define DDP__STORE_WARN_COUNT_EVERY_S 60.0
static void ddp__store_warn(ddp__store_server *s, int kind, const char *fmt, ...) {
    char msg[DDP__ERR_MAX];
    va_list ap;
    unsigned n = ++s->turned_away[kind];
    if (n > DDP__STORE_WARN_FIRST) { s->unlogged++; return; }
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ddp__log(s->ctx, DDP_LOG_WARN, "%s%s", msg, n == DDP__STORE_WARN_FIRST ? " (more of these are counted, not logged)" : "");
}

/* The count of what was not logged: every DDP__STORE_WARN_COUNT_EVERY_S while it grows, and at stop. */
static void ddp__store_warn_count(ddp__store_server *s, int final) {
    double now = ddp__now();
    if (!s->unlogged || (!final && now < s->count_logged_at + DDP__STORE_WARN_COUNT_EVERY_S)) return;
    ddp__log(s->ctx, DDP_LOG_WARN, "the rendezvous store turned away %u more client(s) without logging each; in all "
             "%u with a wrong job token, %u of another job, %u that sent malformed frames", s->unlogged,
             s->turned_away[DDP__WARN_TOKEN], s->turned_away[DDP__WARN_OTHER_JOB], s->turned_away[DDP__WARN_MALFORMED]);
    s->unlogged = 0;
    s->count_logged_at = now;
}

static ddp__kv *ddp__kv_find(ddp__store_server *s, const char *key) {
    int i;
    for (i = 0; i < s->num_kv; i++) if (!strcmp(s->kv[i].key, key)) return &s->kv[i];
    return NULL;
}

static int ddp__kv_set(ddp__store_server *s, const char *key, const unsigned char *val, uint32_t vlen) {
    ddp__kv *kv = ddp__kv_find(s, key);
    unsigned char *copy = (unsigned char *)DDP_MALLOC(vlen ? vlen : 1);
    if (!copy) return -1;
    if (vlen) memcpy(copy, val, vlen);
    if (!kv) {
        size_t klen = strlen(key) + 1;
        if (s->num_kv == s->cap_kv) {
            int cap = s->cap_kv ? 2 * s->cap_kv : 64;
            ddp__kv *grown = (ddp__kv *)DDP_MALLOC(sizeof(ddp__kv) * (size_t)cap);
            if (!grown) { DDP_FREE(copy); return -1; }
            if (s->num_kv) memcpy(grown, s->kv, sizeof(ddp__kv) * (size_t)s->num_kv);
            DDP_FREE(s->kv);
            s->kv = grown; s->cap_kv = cap;
        }
        kv = &s->kv[s->num_kv];
        kv->key = (char *)DDP_MALLOC(klen);
        if (!kv->key) { DDP_FREE(copy); return -1; }
        memcpy(kv->key, key, klen);
        kv->val = NULL;
        s->num_kv++;
    }
    DDP_FREE(kv->val);
    kv->val = copy; kv->vlen = vlen;
    return 0;
}

/* A rank that drops its connection before the job ends has died or failed: remember it, so
   that nobody waits out the timeout for a key it will never set. A rank that passed the
   shutdown barrier said goodbye first ("bye/RANK", ddp__shutdown): its hang-up is no loss. (It
   was one: a peer's NCCL watchdog, polling while that peer still waited for the same barrier to
   complete on its GPU, read it as a death and failed that peer's ddp_shutdown.) */
static int ddp__conn_said_bye(ddp__store_server *s, int rank) {
    char key[32];
    snprintf(key, sizeof key, "bye/%d", rank);
    return ddp__kv_find(s, key) != NULL;
}

/* Whose loss a hang-up is: a connection speaks for its rank once its claim won, or before any
   claim while no connection has won that rank (a rank dying between its handshake and its claim
   is still a loss). A refused duplicate, or one that leaves before claiming a rank already held,
   speaks for nobody: the job it tried to join goes on. */
static int ddp__conn_speaks_for_rank(ddp__store_server *s, const ddp__conn *c) {
    char key[32];
    /* a stray started with a larger WORLD_SIZE claims a rank this job lacks: it is refused
       ("ranks disagree on the world size"), and its hang-up is no rank's loss */
    if (c->rank < 0 || c->rank >= s->ctx->world || c->admitted == 2) return 0;
    if (c->admitted == 1) return 1;
    snprintf(key, sizeof key, "claim/%d", c->rank);
    return ddp__kv_find(s, key) == NULL;
}

static void ddp__conn_close(ddp__store_server *s, int i) {
    if (s->conns[i].authed && s->lost_rank < 0 && !__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE) &&
        ddp__conn_speaks_for_rank(s, &s->conns[i]) && !ddp__conn_said_bye(s, s->conns[i].rank))
        s->lost_rank = s->conns[i].rank;
    if (s->conns[i].challenged && !s->conns[i].authed && !__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE))
        ddp__store_warn(s, DDP__WARN_TOKEN, "rendezvous store: a client announcing rank %d did not finish the "
                        "handshake (it did not prove that it knows the job token)", s->conns[i].rank);
    ddp__sock_close(s->conns[i].fd);
    DDP_FREE(s->conns[i].body);
    s->conns[i] = s->conns[s->num_conns - 1];
    __atomic_sub_fetch(&s->num_conns, 1, __ATOMIC_RELEASE);   /* read by ddp__server_stop */
}

static void ddp__conn_reset(ddp__conn *c) {
    DDP_FREE(c->body);
    c->body = NULL; c->got = 0; c->waiting = 0;
}

/* Send within the job's timeout; a stop (ddp_shutdown) cuts short a send to a client that does
   not read. */
static int ddp__server_send(ddp__store_server *s, int fd, const void *buf, size_t len, double deadline) {
    const unsigned char *p = (const unsigned char *)buf;
    while (len) {
        struct pollfd pfd;
        double left = deadline - ddp__now();
        long n = ddp__send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) { p += n; len -= (size_t)n; continue; }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
        if (left <= 0 || __atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) return -1;
        pfd.fd = fd; pfd.events = POLLOUT; pfd.revents = 0;
        ddp__poll(&pfd, 1, left < 0.05 ? (int)(left * 1000) + 1 : 50);
    }
    return 0;
}

static int ddp__reply(ddp__store_server *s, ddp__conn *c, uint32_t status, const void *val, uint32_t vlen) {
    unsigned char hdr[16];
    double deadline = ddp__now() + s->ctx->desc.timeout_s;
    ddp__put_u32(hdr, DDP__STORE_MAGIC); ddp__put_u32(hdr + 4, status);
    ddp__put_u32(hdr + 8, 0); ddp__put_u32(hdr + 12, vlen);
    if (ddp__server_send(s, c->fd, hdr, 16, deadline)) return -1;
    return vlen ? ddp__server_send(s, c->fd, val, vlen, deadline) : 0;
}

/* The server's half of the handshake (see the top of this section). */
static int ddp__serve_handshake(ddp__store_server *s, ddp__conn *c, const unsigned char *key, const unsigned char *val) {
    ddp_context *ctx = s->ctx;
    unsigned char proof[32], reply[DDP__NONCE_BYTES + 32];
    size_t idlen = strlen(ctx->job.id);
    if (!c->challenged) {
        if (c->op != DDP__OP_HELLO || c->vlen != DDP__HELLO_BYTES) {
            ddp__store_warn(s, DDP__WARN_MALFORMED, "rendezvous store dropped a client whose first frame is not a "
                            "ddp.h handshake (another program, or a ddp.h of another version)");
            return -1;
        }
        memcpy(c->hello, val, DDP__HELLO_BYTES);
        c->rank = (int32_t)ddp__get_u32(val);
        if (c->klen != idlen || memcmp(key, ctx->job.id, idlen)) {
            ddp__store_warn(s, DDP__WARN_OTHER_JOB, "rendezvous store refused rank %d of another job: it is in job "
                            "'%.*s', this job is '%s' (two jobs on MASTER_PORT %d?)", c->rank, (int)c->klen,
                            (const char *)key, idlen ? ctx->job.id : "(none)", ctx->desc.master_port);
            ddp__reply(s, c, DDP__REPLY_OTHER_JOB, ctx->job.id, (uint32_t)idlen);
            return -1;
        }
        if (ddp__random_bytes(c->nonce_s, DDP__NONCE_BYTES)) return -1;
        ddp__handshake_proof(ctx, "server", c->hello, c->nonce_s, proof);
        memcpy(reply, c->nonce_s, DDP__NONCE_BYTES);
        memcpy(reply + DDP__NONCE_BYTES, proof, 32);
        c->challenged = 1;
        return ddp__reply(s, c, DDP__REPLY_OK, reply, sizeof reply);
    }
    c->challenged = 0;   /* answered: leaving now is not "left during the handshake" */
    if (c->op != DDP__OP_AUTH || c->klen || (c->vlen != 0 && c->vlen != 32)) {
        ddp__store_warn(s, DDP__WARN_MALFORMED, "rendezvous store dropped a client that broke off the handshake "
                        "with a malformed frame");
        return -1;
    }
    if (c->vlen == 0) {
        ddp__store_warn(s, DDP__WARN_TOKEN, "rendezvous store: a client announcing rank %d has another job token "
                        "(it could not verify this store's proof); it was not let in", c->rank);
        return -1;
    }
    ddp__handshake_proof(ctx, "client", c->hello, c->nonce_s, proof);
    if (!ddp__same_bytes(proof, val, 32)) {
        ddp__store_warn(s, DDP__WARN_TOKEN, "rendezvous store refused a client announcing rank %d: its proof of the "
                        "job token is wrong", c->rank);
        ddp__reply(s, c, DDP__REPLY_REFUSED, NULL, 0);
        return -1;
    }
    c->authed = 1;
    return ddp__reply(s, c, DDP__REPLY_OK, NULL, 0);
}

/* Handle one complete request; returns -1 to drop the connection. */
static int ddp__serve_request(ddp__store_server *s, ddp__conn *c) {
    char key[DDP__STORE_MAX_KEY + 1];
    const unsigned char *val = c->body + c->klen;
    ddp__kv *kv;
    memcpy(key, c->body, c->klen);
    key[c->klen] = 0;
    if (!c->authed) return ddp__serve_handshake(s, c, c->body, val);
    switch (c->op) {
    case DDP__OP_SET:
        if (ddp__kv_set(s, key, val, c->vlen)) return -1;
        return ddp__reply(s, c, DDP__REPLY_OK, NULL, 0);
    case DDP__OP_CHECK:
        return ddp__reply(s, c, ddp__kv_find(s, key) ? DDP__REPLY_OK : DDP__REPLY_MISSING, NULL, 0);
    case DDP__OP_ADD: {
        char num[32];
        long long cur = 0, delta;
        if (c->vlen >= sizeof num) return -1;
        memcpy(num, val, c->vlen); num[c->vlen] = 0;
        delta = strtoll(num, NULL, 10);
        if ((kv = ddp__kv_find(s, key)) != NULL && kv->vlen < sizeof num) {
            memcpy(num, kv->val, kv->vlen); num[kv->vlen] = 0;
            cur = strtoll(num, NULL, 10);
        }
        snprintf(num, sizeof num, "%lld", cur + delta);
        if (ddp__kv_set(s, key, (const unsigned char *)num, (uint32_t)strlen(num))) return -1;
        if (c->rank >= 0 && !c->admitted) {   /* this connection's claim to its rank: won or refused */
            char mine[32];
            snprintf(mine, sizeof mine, "claim/%d", c->rank);
            if (!strcmp(key, mine)) c->admitted = cur + delta == 1 ? 1 : 2;
        }
        return ddp__reply(s, c, DDP__REPLY_OK, num, (uint32_t)strlen(num));
    }
    case DDP__OP_GET: {
        char num[32];
        if ((kv = ddp__kv_find(s, key)) != NULL) return ddp__reply(s, c, DDP__REPLY_OK, kv->val, kv->vlen);
        if (c->vlen >= sizeof num) return -1;
        memcpy(num, val, c->vlen); num[c->vlen] = 0;
        c->deadline = ddp__now() + 1e-3 * strtod(num, NULL);
        c->waiting = 1;              /* answered when the key is set or the deadline passes */
        return 0;
    }
    default:
        return -1;
    }
}

/* Answer parked GETs whose key now exists or whose deadline has passed. */
static void ddp__serve_parked(ddp__store_server *s) {
    int i;
    double now = ddp__now();
    for (i = 0; i < s->num_conns; i++) {
        ddp__conn *c = &s->conns[i];
        char key[DDP__STORE_MAX_KEY + 1];
        ddp__kv *kv;
        int rc;
        if (!c->waiting) continue;
        memcpy(key, c->body, c->klen); key[c->klen] = 0;
        kv = ddp__kv_find(s, key);
        if (kv) rc = ddp__reply(s, c, DDP__REPLY_OK, kv->val, kv->vlen);
        else if (s->lost_rank >= 0) {
            char num[16];
            snprintf(num, sizeof num, "%d", s->lost_rank);
            rc = ddp__reply(s, c, DDP__REPLY_PEER_LOST, num, (uint32_t)strlen(num));
        } else if (ddp__failed(s->ctx)) {
            /* Rank 0 itself failed: the waiter gets its verdict now, not at its deadline. */
            char msg[4 + DDP__ERR_MAX];
            ddp__put_u32((unsigned char *)msg, (uint32_t)ddp__failed(s->ctx));
            ddp__mutex_lock(&s->ctx->err_lock);
            snprintf(msg + 4, DDP__ERR_MAX, "%s", s->ctx->err);
            ddp__mutex_unlock(&s->ctx->err_lock);
            rc = ddp__reply(s, c, DDP__REPLY_FAILED, msg, (uint32_t)(4 + strlen(msg + 4)));
        }
        else if (now >= c->deadline) rc = ddp__reply(s, c, DDP__REPLY_MISSING, NULL, 0);
        else continue;
        ddp__conn_reset(c);
        if (rc) ddp__conn_close(s, i--);
    }
}

/* Read what is available; returns -1 to drop the connection. */
static int ddp__conn_read(ddp__store_server *s, ddp__conn *c) {
    for (;;) {
        size_t need = c->got < 16 ? 16 - c->got : 16 + (size_t)c->klen + c->vlen - c->got;
        unsigned char *dst = c->got < 16 ? c->hdr + c->got : c->body + (c->got - 16);
        long n;
        if (c->waiting) {            /* one request at a time: only a hang-up can come now */
            char byte;
            n = ddp__recv(c->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
            return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
        }
        if (need == 0) {
            if (ddp__serve_request(s, c)) return -1;
            if (!c->waiting) ddp__conn_reset(c);
            continue;
        }
        n = ddp__recv(c->fd, dst, need, MSG_DONTWAIT);
        if (n == 0) return -1;
        if (n < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
        c->got += (size_t)n;
        if (c->got == 16) {
            c->op = ddp__get_u32(c->hdr + 4);
            c->klen = ddp__get_u32(c->hdr + 8);
            c->vlen = ddp__get_u32(c->hdr + 12);
            if (ddp__get_u32(c->hdr) != DDP__STORE_MAGIC || c->klen > DDP__STORE_MAX_KEY ||
                c->vlen > DDP__STORE_MAX_VALUE || (!c->authed && (c->vlen > 64 || c->klen >= sizeof s->ctx->job.id))) {
                ddp__store_warn(s, DDP__WARN_MALFORMED, "rendezvous store dropped a client that sent a malformed frame");
                return -1;
            }
            c->body = (unsigned char *)DDP_MALLOC((size_t)c->klen + c->vlen + 1);
            if (!c->body) return -1;
        }
    }
}

static void ddp__server_accept(ddp__store_server *s) {
    int fd = ddp__accept(s->listen_fd);
    if (fd < 0) return;
    if (s->num_conns == s->max_conns) {
        /* Full: the oldest client that has not shown the token yet makes room, so silent or
           garbage connections cannot lock the ranks out. */
        int i, oldest = -1;
        for (i = 0; i < s->num_conns; i++)
            if (!s->conns[i].authed && (oldest < 0 || s->conns[i].opened < s->conns[oldest].opened)) oldest = i;
        if (oldest < 0) { ddp__sock_close(fd); return; }
        ddp__conn_close(s, oldest);
    }
    ddp__sock_nodelay(fd);   /* (ddp__accept made it non-blocking and not inherited) */
    memset(&s->conns[s->num_conns], 0, sizeof(ddp__conn));
    s->conns[s->num_conns].fd = fd;
    s->conns[s->num_conns].opened = ddp__now();
    __atomic_add_fetch(&s->num_conns, 1, __ATOMIC_RELEASE);
}

static void *ddp__server_main(void *arg) {
    ddp__store_server *s = (ddp__store_server *)arg;
    struct pollfd *pfds = (struct pollfd *)ddp__calloc(sizeof(struct pollfd) * (size_t)(s->max_conns + 2));
    if (!pfds) return NULL;
    while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
        int i, n = 0;
        double now = ddp__now();
        pfds[n].fd = s->wake_pipe[0]; pfds[n++].events = POLLIN;
        pfds[n].fd = s->listen_fd; pfds[n++].events = POLLIN;
        for (i = 0; i < s->num_conns; i++) {
            pfds[n].fd = s->conns[i].fd; pfds[n].events = POLLIN; pfds[n++].revents = 0;
        }
        ddp__poll(pfds, n, 50);
        if (pfds[1].revents & POLLIN) ddp__server_accept(s);
        for (i = s->num_conns - 1; i >= 0; i--) {
            ddp__conn *c = &s->conns[i];
            /* a rank's handshake takes milliseconds; a rank itself gives up at its timeout */
            int unauth_too_long = !c->authed && now - c->opened > (s->ctx->desc.timeout_s < 10 ? s->ctx->desc.timeout_s : 10);
            if (i + 2 < n && (int)pfds[i + 2].fd == c->fd && (pfds[i + 2].revents & (POLLIN | POLLHUP | POLLERR))) {
                if (ddp__conn_read(s, c)) { ddp__conn_close(s, i); continue; }
            }
            if (unauth_too_long) ddp__conn_close(s, i);
        }
        ddp__serve_parked(s);
        ddp__store_warn_count(s, 0);
    }
    DDP_FREE(pfds);
    return NULL;
}

/* ---- name lookup by a deadline ----
   getaddrinfo has no timeout of its own (glibc asks each nameserver for 5 s, and again), so a rank
   whose nameserver does not answer would wait far past DDP_TIMEOUT. A name that is not an address
   is looked up on a thread of its own; the rank waits for it until the deadline, and whichever of
   the two finishes last frees the request. */
typedef struct ddp__lookup {
    ddp__mutex mu;
    ddp__cond cv;
    int refs, done, rc;
    struct addrinfo *res;
    char host[256], port[16];
} ddp__lookup;

static void ddp__lookup_put(ddp__lookup *l) {
    int last;
    ddp__mutex_lock(&l->mu);
    last = --l->refs == 0;
    ddp__mutex_unlock(&l->mu);
    if (!last) return;
    if (l->res) freeaddrinfo(l->res);
    ddp__cond_destroy(&l->cv);
    ddp__mutex_destroy(&l->mu);
    DDP_FREE(l);
}

static void ddp__lookup_hints(struct addrinfo *h, int flags) {
    memset(h, 0, sizeof *h);
    h->ai_family = AF_UNSPEC;
    h->ai_socktype = SOCK_STREAM;
    h->ai_flags = flags;
}

static void *ddp__lookup_main(void *p) {
    ddp__lookup *l = (ddp__lookup *)p;
    struct addrinfo hints, *res = NULL;
    int rc;
    ddp__lookup_hints(&hints, 0);
    rc = getaddrinfo(l->host, l->port, &hints, &res);
    ddp__mutex_lock(&l->mu);
    l->rc = rc; l->res = rc ? NULL : res; l->done = 1;
    ddp__cond_signal(&l->cv);
    ddp__mutex_unlock(&l->mu);
    ddp__lookup_put(l);
    return NULL;
}

/* getaddrinfo's answer (0, *out set) or its error code; *late when the deadline came first. */
static int ddp__lookup_by(const char *host, const char *port, double deadline, struct addrinfo **out, int *late) {
    struct addrinfo hints;
    ddp__lookup *l;
    ddp__thread t;
    int rc;
    *late = 0;
    *out = NULL;
    ddp__lookup_hints(&hints, AI_NUMERICHOST);   /* an address: no name service asked, no thread */
    if (getaddrinfo(host, port, &hints, out) == 0) return 0;
    l = (ddp__lookup *)ddp__calloc(sizeof *l);
    if (l && (ddp__mutex_init(&l->mu) || ddp__cond_init(&l->cv))) { DDP_FREE(l); l = NULL; }
    if (l) {
        snprintf(l->host, sizeof l->host, "%s", host);
        snprintf(l->port, sizeof l->port, "%s", port);
        l->refs = 2;
    }
    if (!l || ddp__thread_create(&t, ddp__lookup_main, l)) {   /* no thread to spare: ask here, unbounded */
        if (l) { ddp__cond_destroy(&l->cv); ddp__mutex_destroy(&l->mu); DDP_FREE(l); }
        ddp__lookup_hints(&hints, 0);
        return getaddrinfo(host, port, &hints, out);
    }
    ddp__thread_detach(t);
    ddp__mutex_lock(&l->mu);
    while (!l->done && ddp__now() < deadline) {
        double left = deadline - ddp__now();
        ddp__cond_wait_s(&l->cv, &l->mu, left < 0.1 ? left : 0.1);   /* the condition's clock may be the wall's */
    }
    *late = !l->done;
    rc = l->rc;
    *out = l->res;
    l->res = NULL;
    ddp__mutex_unlock(&l->mu);
    ddp__lookup_put(l);
    return rc;
}

static ddp_result ddp__resolve(ddp_context *ctx, int port, double deadline, struct addrinfo **out) {
    char port_s[16];
    int rc, late;
    double waited = deadline - ddp__now();
    const char *a = ctx->job.master_addr, *colon = strchr(a, ':');
    /* the usual slips, which the resolver only calls unknown names: "host:port", "[v6 address]" */
    const char *hint = strpbrk(a, "[]") ? " (an IPv6 address goes without brackets: MASTER_ADDR=::1)"
                       : colon && colon == strrchr(a, ':') ? " (MASTER_ADDR is the host alone; the port goes in MASTER_PORT)"
                       : "";
    snprintf(port_s, sizeof port_s, "%d", port);
    (void)ddp__net_init();   /* Windows: Winsock up before its resolver */
    rc = ddp__lookup_by(a, port_s, deadline, out, &late);
    if (late)
        return ddp__fail(ctx, DDP_ERR_TIMEOUT, "cannot resolve MASTER_ADDR '%s'%s%s%s: the name service gave no answer "
                         "within %.3g s (timeout_s, DDP_TIMEOUT). Check the nameservers (/etc/resolv.conf), or give "
                         "MASTER_ADDR as an address", a, hint, ctx->job.master_addr_from ? ", " : "",
                         ctx->job.master_addr_from ? ctx->job.master_addr_from : "", waited);
    if (rc)
        return ddp__fail(ctx, DDP_ERR_NETWORK, "cannot resolve MASTER_ADDR '%s'%s%s%s: %s", a, hint,
                         ctx->job.master_addr_from ? ", " : "", ctx->job.master_addr_from ? ctx->job.master_addr_from : "",
                         gai_strerror(rc));
    return DDP_OK;
}

static void ddp__server_free(ddp__store_server *s) {
    int i;
    if (!s) return;
    while (s->num_conns) ddp__conn_close(s, s->num_conns - 1);
    for (i = 0; i < s->num_kv; i++) { DDP_FREE(s->kv[i].key); DDP_FREE(s->kv[i].val); }
    DDP_FREE(s->kv);
    DDP_FREE(s->conns);
    if (s->listen_fd >= 0) ddp__sock_close(s->listen_fd);
    ddp__wake_close(s->wake_pipe);
    DDP_FREE(s);
}

/* Rank 0 listens on the master address only (not on every interface). */
static ddp_result ddp__server_start(ddp_context *ctx) {
    struct addrinfo *ai;
    ddp__store_server *s;
    int err;
    ddp_result r = ddp__resolve(ctx, ctx->desc.master_port, ddp__now() + ctx->desc.timeout_s, &ai);
    if (r != DDP_OK) return r;
    s = (ddp__store_server *)ddp__calloc(sizeof *s);
    if (!s) { freeaddrinfo(ai); return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory starting the store"); }
    s->ctx = ctx;
    s->lost_rank = -1;
    s->count_logged_at = ddp__now();
    s->wake_pipe[0] = s->wake_pipe[1] = -1;
    s->max_conns = 4 * ctx->world + 16;
    s->conns = (ddp__conn *)ddp__calloc(sizeof(ddp__conn) * (size_t)s->max_conns);
    s->listen_fd = ddp__socket(ai->ai_family, SOCK_STREAM);
    if (!s->conns || s->listen_fd < 0 || ddp__wake_open(s->wake_pipe)) {
        freeaddrinfo(ai); ddp__server_free(s);
        return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot create the store socket: %s", ddp__strerror(errno));
    }
    ddp__sock_cloexec(s->listen_fd);
    ddp__sock_reuseaddr(s->listen_fd);
    if (ddp__bind_listen(s->listen_fd, ai->ai_addr, ai->ai_addrlen, 128)) {
        err = errno;
        freeaddrinfo(ai); ddp__server_free(s);
        if (err == EADDRINUSE)
            return ddp__fail(ctx, DDP_ERR_NETWORK, "MASTER_PORT %d on %s is already in use (another job, "
                             "a process still holding it, or a second rank 0 of this job: check RANK); pick another port",
                             ctx->desc.master_port, ctx->job.master_addr);
        return ddp__fail(ctx, DDP_ERR_NETWORK, "cannot listen on %s:%d (MASTER_ADDR:MASTER_PORT): %s",
                         ctx->job.master_addr, ctx->desc.master_port, ddp__strerror(err));
    }
    freeaddrinfo(ai);
    ddp__sock_nonblock(s->listen_fd);
    if (ddp__thread_create(&s->thread, ddp__server_main, s)) {
        ddp__server_free(s);
        return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot start the store thread");
    }
    ctx->rdv.server = s;
    return DDP_OK;
}

/* After a failure the other ranks may still be reading the store to reach the same verdict. */
static void ddp__server_stop(ddp_context *ctx) {
    ddp__store_server *s = ctx->rdv.server;
    double until = ddp__now() + ctx->desc.shutdown_timeout_s;
    if (!s) return;
    /* After a failure, stay until every peer has hung up (each got its verdict, or died), at most
       shutdown_timeout_s: a peer descheduled for a moment between two requests must still find
       the store, and a hung one costs no more than the cap. */
    while (ddp__failed(ctx) && __atomic_load_n(&s->num_conns, __ATOMIC_ACQUIRE) > 0 && ddp__now() < until)
        ddp__usleep(10000);
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
    ddp__wake_signal(s->wake_pipe);
    ddp__thread_join(s->thread);
    ddp__store_warn_count(s, 1);
    ddp__server_free(s);
    ctx->rdv.server = NULL;
}

/* ---- the client (every rank, rank 0 included) ---- */
#define DDP__STORE_GRACE_S 2.0
/* On `fd`: the rank's connection, or the NCCL watchdog's own. */
static ddp_result ddp__store_request_on(ddp_context *ctx, int fd, uint32_t op, const char *key, const void *val,
                                        uint32_t vlen, unsigned char **reply, uint32_t *reply_len,
                                        uint32_t *status, double wait_s) {
    unsigned char hdr[16];
    uint32_t rlen;
    int rc;
    /* A parked GET is answered at its deadline; beyond that the store gets a short grace, any
       other request the job's timeout. */
    double timeout = ctx->desc.timeout_s, grace = wait_s > 0 && timeout > DDP__STORE_GRACE_S ? DDP__STORE_GRACE_S : timeout;
    double deadline = ddp__now() + wait_s + grace, next_look;
    if (ddp__send_frame(fd, op, key, (uint32_t)strlen(key), val, vlen, ddp__now() + timeout))
        return ddp__fail(ctx, DDP_ERR_PEER_LOST, "lost the connection to the rendezvous store on rank 0 (%s:%d)",
                         ctx->job.master_addr, ctx->desc.master_port);
    /* A parked GET can wait long: look for a cancel while the answer has not begun to arrive.
       Cancelled, the connection is out of step (its answer comes later): it is closed. */
    for (rc = 0, next_look = 0; wait_s > 0;) {
        struct pollfd pfd;
        double left = deadline - ddp__now();
        pfd.fd = fd; pfd.events = POLLIN; pfd.revents = 0;
        if (left <= 0 || ddp__poll(&pfd, 1, left < 0.02 ? (int)(left * 1000) + 1 : 20) > 0) break;
        if (ddp__cancel_requested(ctx)) {   /* closed first: the poison must not use it */
            if (fd == ctx->rdv.store_fd) { ddp__sock_close(fd); ctx->rdv.store_fd = -1; }
            return ddp__check_cancel(ctx, "a wait for the rendezvous store");
        }
        if (ddp__now() >= next_look) {   /* rank 0 gone: said now, not at the deadline */
            next_look = ddp__now() + DDP__LIVENESS_PERIOD_S;
            if (ddp__rank0_gone(ctx))
                return ddp__fail(ctx, DDP_ERR_PEER_LOST, "rank 0 (pid %d) died while this rank waited for the rendezvous "
                                 "store on it", ctx->rdv.peer_pids[0]);
        }
    }
    rc = ddp__recv_watched(ctx, fd, hdr, 16, deadline);
    if (rc == 0 && ddp__get_u32(hdr) != DDP__STORE_MAGIC) rc = -1;
    rlen = ddp__get_u32(hdr + 12);
    if (rc == 0 && rlen > DDP__STORE_MAX_VALUE) rc = -1;
    if (rc == -2) return ddp__fail(ctx, DDP_ERR_TIMEOUT, "the rendezvous store on rank 0 (%s:%d) did not answer within "
                                   "%g s: rank 0 is stopped or overloaded", ctx->job.master_addr, ctx->desc.master_port,
                                   wait_s + grace);
    if (rc) return ddp__fail(ctx, DDP_ERR_PEER_LOST, "lost the connection to the rendezvous store on rank 0 "
                             "(%s:%d): rank 0 failed or exited", ctx->job.master_addr, ctx->desc.master_port);
    *status = ddp__get_u32(hdr + 4);
    if (reply) {
        *reply = (unsigned char *)DDP_MALLOC(rlen + 1);
        if (!*reply) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory reading from the store");
        if (ddp__recv_watched(ctx, fd, *reply, rlen, deadline)) {
            DDP_FREE(*reply); *reply = NULL;
            return ddp__fail(ctx, DDP_ERR_PEER_LOST, "lost the connection to the rendezvous store on rank 0 "
                             "(%s:%d): rank 0 failed or exited", ctx->job.master_addr, ctx->desc.master_port);
        }
        (*reply)[rlen] = 0;
        if (reply_len) *reply_len = rlen;
    } else {
        unsigned char sink[256];
        while (rlen) {
            uint32_t n = rlen < sizeof sink ? rlen : (uint32_t)sizeof sink;
            if (ddp__recv_watched(ctx, fd, sink, n, deadline))
                return ddp__fail(ctx, DDP_ERR_PEER_LOST, "lost the connection to the rendezvous store on rank 0 "
                                 "(%s:%d): rank 0 failed or exited", ctx->job.master_addr, ctx->desc.master_port);
            rlen -= n;
        }
    }
    return DDP_OK;
}

#if defined(DDP_CUDA) || defined(DDP_MPI)
/* The group's poison in the store, for the backends whose ranks poll it (NCCL, MPI): set once,
   by the first rank that fails (its ADD on "poisoned" elects it), as its code in 4 bytes and its
   message, so that a cancel reaches the peers as a cancel. A store that is gone must not replace
   the real error: the message is written back only if the request changed it. */
static void ddp__store_poison(ddp_context *ctx, int fd, ddp_result code) {
    unsigned char *reply = NULL;
    uint32_t len = 0, status = 0;
    char msg[4 + DDP__ERR_MAX];
    if (fd < 0) return;
    ddp__put_u32((unsigned char *)msg, (uint32_t)code);
    ddp__mutex_lock(&ctx->err_lock);
    snprintf(msg + 4, DDP__ERR_MAX, "%s", ctx->err);
    ddp__mutex_unlock(&ctx->err_lock);
    if (ddp__store_request_on(ctx, fd, DDP__OP_ADD, "poisoned", "1", 1, &reply, &len, &status, 0) == DDP_OK &&
        reply && !strcmp((const char *)reply, "1"))
        ddp__store_request_on(ctx, fd, DDP__OP_SET, "poison", msg, (uint32_t)(4 + strlen(msg + 4)), NULL, NULL, &status, 0);
    DDP_FREE(reply);
    ddp__mutex_lock(&ctx->err_lock);
    if (strcmp(ctx->err, msg + 4)) snprintf(ctx->err, sizeof ctx->err, "%s", msg + 4);
    ddp__mutex_unlock(&ctx->err_lock);
}

/* What a poll of "poison" found: another rank's failure (DDP__REPLY_OK) or rank 0's own
   (DDP__REPLY_FAILED), each a code then a message. Returns what it means here (a cancel stays a
   cancel, anything else is a peer lost), or DDP_OK for no poison; *text: the message. */
static ddp_result ddp__store_poison_code(uint32_t status, const unsigned char *val, uint32_t len, const char **text) {
    ddp_result code;
    *text = "a peer failed";
    if (status != DDP__REPLY_OK && status != DDP__REPLY_FAILED) return DDP_OK;
    if (!val || len <= 4) return DDP_ERR_PEER_LOST;
    code = (ddp_result)ddp__get_u32(val);
    *text = (const char *)val + 4;
    return code == DDP_ERR_CANCELLED ? DDP_ERR_CANCELLED : DDP_ERR_PEER_LOST;
}
#endif

static ddp_result ddp__store_request(ddp_context *ctx, uint32_t op, const char *key, const void *val,
                                     uint32_t vlen, unsigned char **reply, uint32_t *reply_len,
                                     uint32_t *status, double wait_s) {
    return ddp__store_request_on(ctx, ctx->rdv.store_fd, op, key, val, vlen, reply, reply_len, status, wait_s);
}

static ddp_result ddp__store_set(ddp_context *ctx, const char *key, const void *val, size_t len) {
    uint32_t status = 0;
    return ddp__store_request(ctx, DDP__OP_SET, key, val, (uint32_t)len, NULL, NULL, &status, 0);
}

/* Wait for key until the deadline; *found = 0 when it never appeared. */
static ddp_result ddp__store_get(ddp_context *ctx, const char *key, double deadline,
                                 unsigned char **val, uint32_t *len, int *found) {
    char ms[32];
    uint32_t status = 0;
    double wait_s = deadline - ddp__now();
    ddp_result r;
    if (wait_s < 0) wait_s = 0;
    snprintf(ms, sizeof ms, "%.0f", wait_s * 1000);
    *val = NULL;
    r = ddp__store_request(ctx, DDP__OP_GET, key, ms, (uint32_t)strlen(ms), val, len, &status, wait_s);
    if (r != DDP_OK) return r;
    if (status == DDP__REPLY_PEER_LOST) {
        int lost = atoi((const char *)*val);
        DDP_FREE(*val); *val = NULL;
        return ddp__fail(ctx, DDP_ERR_PEER_LOST, "rank %d disconnected from the rendezvous store (it died or "
                         "failed) while this rank waited for '%s'", lost, key);
    }
    if (status == DDP__REPLY_FAILED && *len >= 4) {   /* rank 0 failed: its code and message */
        ddp_result code = (ddp_result)ddp__get_u32(*val);
        if (code <= DDP_OK || code > DDP_ERR_CANCELLED) code = DDP_ERR_PEER_LOST;
        r = ddp__fail(ctx, code, "stopped while waiting for '%s' because %s", key, (const char *)*val + 4);
        DDP_FREE(*val); *val = NULL;
        return r;
    }
    *found = status == DDP__REPLY_OK;
    if (!*found) { DDP_FREE(*val); *val = NULL; }
    return DDP_OK;
}

static ddp_result ddp__store_check(ddp_context *ctx, const char *key, int *exists) {
    uint32_t status = 0;
    ddp_result r = ddp__store_request(ctx, DDP__OP_CHECK, key, NULL, 0, NULL, NULL, &status, 0);
    *exists = r == DDP_OK && status == DDP__REPLY_OK;
    return r;
}

/* Connect to rank 0's store, retrying until it is up or the deadline passes. The connection
   announces `announce` as its rank: the store takes a hang-up of a rank's connection for that
   rank's death, so secondary connections announce -1. */
/* Why the last attempt did not get in (for the message at the deadline). */
enum { DDP__HELLO_NO_CONNECT = 1, DDP__HELLO_CLOSED, DDP__HELLO_SILENT };

/* connect(), given up at the deadline (a blocking one to an unreachable host takes minutes).
   0, or -1 with errno set. */
static int ddp__connect_by(int fd, const struct addrinfo *a, double deadline) {
    int err;
    ddp__sock_nonblock(fd);
    if (ddp__connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) return -1;
        for (;;) {
            struct pollfd pfd;
            double left = deadline - ddp__now();
            int n;
            if (left <= 0) { errno = 0; return -1; }   /* out of time: not a verdict on the address */
            pfd.fd = fd; pfd.events = POLLOUT; pfd.revents = 0;
            n = ddp__poll(&pfd, 1, left > 0.05 ? 50 : (int)(left * 1000) + 1);
            if (n > 0) break;
            if (n < 0 && errno != EINTR) return -1;
            /* WSAPoll before Windows 10 2004 never reports a failed connect: ask the socket */
            if (n == 0 && (err = ddp__sock_error(fd)) != 0) { errno = err; return -1; }
        }
        if ((err = ddp__sock_error(fd)) != 0) { errno = err; return -1; }
    }
    ddp__sock_blocking(fd);
    return 0;
}

/* Read a reply's header and its value (at most cap bytes) by the deadline: 0 ok, 1 closed,
   2 no answer in time, -1 not a ddp.h store's answer. */
static int ddp__hello_reply(int fd, double deadline, uint32_t *status, unsigned char *val, uint32_t cap, uint32_t *vlen) {
    unsigned char hdr[16];
    int rc = ddp__recv_all(fd, hdr, 16, deadline);
    if (rc) return rc == -2 ? 2 : 1;
    *status = ddp__get_u32(hdr + 4);
    *vlen = ddp__get_u32(hdr + 12);
    if (ddp__get_u32(hdr) != DDP__STORE_MAGIC || ddp__get_u32(hdr + 8) || *vlen > cap) return -1;
    rc = *vlen ? ddp__recv_all(fd, val, *vlen, deadline) : 0;
    return rc ? (rc == -2 ? 2 : 1) : 0;
}

/* One attempt at connect + handshake: 0 in, 1 try again (not listening yet, or the store closed
   the connection without an answer, e.g. while busy; *why says which), -1 refused for good
   (error recorded, *code). */
static int ddp__store_hello(ddp_context *ctx, const struct addrinfo *ai, int announce, double deadline, int *fd_out,
                            int *why, int *last_err, ddp_result *code) {
    const struct addrinfo *a;
    unsigned char hello[DDP__HELLO_BYTES], val[DDP__NONCE_BYTES + 32 + sizeof ctx->job.id], proof[32];
    uint32_t status = 0, vlen = 0;
    int sfd = -1, rc, out_of_time = 0;
    double sent;
    for (a = ai; a && sfd < 0; a = a->ai_next) {
        int fd = ddp__socket(a->ai_family, SOCK_STREAM);
        if (fd < 0) continue;
        if (ddp__connect_by(fd, a, deadline) == 0) sfd = fd;
        else { if (errno) *last_err = errno; else out_of_time = 1; ddp__sock_close(fd); }
    }
    /* A connect cut short by the deadline says nothing about the address: the attempts before it
       (a listener that closed every connection, one that stayed silent) keep their word. */
    if (sfd < 0) { if (!out_of_time || !*why) *why = DDP__HELLO_NO_CONNECT; return 1; }
    ddp__sock_cloexec(sfd);
    ddp__sock_nodelay(sfd);
    ddp__put_u32(hello, (uint32_t)announce);
    if (ddp__random_bytes(hello + 4, DDP__NONCE_BYTES)) {
        ddp__sock_close(sfd);
        *code = ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot read random bytes for the rendezvous handshake (getrandom, "
                          "/dev/urandom): %s", ddp__strerror(errno));
        return -1;
    }
    sent = ddp__now();
    rc = ddp__send_frame(sfd, DDP__OP_HELLO, ctx->job.id, (uint32_t)strlen(ctx->job.id), hello, DDP__HELLO_BYTES, deadline)
         ? 1 : ddp__hello_reply(sfd, deadline, &status, val, sizeof val - 1, &vlen);
    if (rc == 0 && status == DDP__REPLY_OTHER_JOB) {
        val[vlen] = 0;
        ddp__sock_close(sfd);
        *code = ddp__fail(ctx, DDP_ERR_NETWORK, "the rendezvous store at %s:%d belongs to another job ('%s'); this "
                          "rank is in job '%s'. Two jobs on one MASTER_PORT? Give each its own (if this is one job, "
                          "set DDP_JOB_ID alike on every rank)", ctx->job.master_addr, ctx->desc.master_port, vlen ? (const char *)val : "(none)",
                          ctx->job.id[0] ? ctx->job.id : "(none)");
        return -1;
    }
    if (rc == 0 && (status != DDP__REPLY_OK || vlen != DDP__NONCE_BYTES + 32)) rc = -1;
    if (rc == 0) {
        ddp__handshake_proof(ctx, "server", hello, val, proof);
        if (!ddp__same_bytes(proof, val + DDP__NONCE_BYTES, 32)) {
            ddp__send_frame(sfd, DDP__OP_AUTH, NULL, 0, NULL, 0, ddp__now() + 0.1);   /* "you failed": for its log */
            ddp__sock_close(sfd);
            *code = ddp__fail(ctx, DDP_ERR_NETWORK, "the process on %s:%d (MASTER_ADDR:MASTER_PORT) could not prove "
                              "that it knows this rank's job token: rank 0 runs with another DDP_JOB_TOKEN (another "
                              "job on this port?) or another program holds the port. Nothing secret was sent",
                              ctx->job.master_addr, ctx->desc.master_port);
            return -1;
        }
        ddp__handshake_proof(ctx, "client", hello, val, proof);
        rc = ddp__send_frame(sfd, DDP__OP_AUTH, NULL, 0, proof, 32, deadline) ? 1
             : ddp__hello_reply(sfd, deadline, &status, val, sizeof val - 1, &vlen);
        if (rc == 0 && status != DDP__REPLY_OK) {
            ddp__sock_close(sfd);
            *code = ddp__fail(ctx, DDP_ERR_NETWORK, "rank 0's rendezvous store at %s:%d refused this rank's proof of "
                              "the job token", ctx->job.master_addr, ctx->desc.master_port);
            return -1;
        }
    }
    if (rc < 0) {
        ddp__sock_close(sfd);
        *code = ddp__fail(ctx, DDP_ERR_NETWORK, "the process on %s:%d (MASTER_ADDR:MASTER_PORT) is not a ddp.h "
                          "rendezvous store of this version (it answered the handshake with something else): another "
                          "program holds the port", ctx->job.master_addr, ctx->desc.master_port);
        return -1;
    }
    /* The same for a handshake the deadline cut short: a silence shorter than half the timeout
       does not outweigh a listener that closed the connections before it. */
    if (rc) {
        if (rc == 1 || *why != DDP__HELLO_CLOSED || deadline - sent >= ctx->desc.timeout_s / 2)
            *why = rc == 2 ? DDP__HELLO_SILENT : DDP__HELLO_CLOSED;
        ddp__sock_close(sfd);
        return 1;
    }
    *fd_out = sfd;
    return 0;
}

/* Connect to rank 0's store, retrying until it is up (and has room) or the deadline passes. */
static ddp_result ddp__store_connect_as(ddp_context *ctx, double deadline, int announce, int *fd_out) {
    struct addrinfo *ai;
    int rc, why = 0, last_err = 0;
    ddp_result code = DDP_ERR_NETWORK;
    const char *addr = ctx->job.master_addr;
    int port = ctx->desc.master_port;
    double waited = ctx->desc.timeout_s, refused_since = 0, next_warn = 0;
    if ((code = ddp__resolve(ctx, ctx->desc.master_port, deadline, &ai)) != DDP_OK) return code;
    code = DDP_ERR_NETWORK;
    while ((rc = ddp__store_hello(ctx, ai, announce, deadline, fd_out, &why, &last_err, &code)) == 1 && ddp__now() < deadline) {
        double now = ddp__now();
        if (ddp__cancel_requested(ctx)) { rc = -1; code = ddp__check_cancel(ctx, "the connection to rank 0's rendezvous store"); break; }
        /* Refused: nothing listens. A rank 0 that died before it listened and one slow to start
           look the same from here, so the wait goes on to the timeout; but it is said, after 10 s
           (or half the timeout) and then every minute, so the lost time is not silent. */
        if (why == DDP__HELLO_NO_CONNECT && last_err == ECONNREFUSED) {
            if (refused_since == 0) {
                refused_since = now;
                next_warn = now + (ctx->desc.timeout_s / 2 < 10 ? ctx->desc.timeout_s / 2 : 10);
            } else if (now >= next_warn) {
                ddp__log(ctx, DDP_LOG_WARN, "nothing listens at %s:%d (MASTER_ADDR:MASTER_PORT): connection refused for "
                         "%.1f s. Rank 0 has not started its store yet, or died before it did (a rank cannot tell "
                         "which); waiting until timeout_s (%g s)", addr, port, now - refused_since, ctx->desc.timeout_s);
                next_warn = now + 60;
            }
        } else refused_since = 0;
        ddp__usleep(20000);
    }
    freeaddrinfo(ai);
    if (rc < 0) return code;
    if (rc == 0) return DDP_OK;
    if (why == DDP__HELLO_NO_CONNECT && last_err == ECONNREFUSED)
        return ddp__fail(ctx, DDP_ERR_TIMEOUT, "no store at %s:%d - did rank 0 start? Nothing listened there for %g s "
                         "(timeout_s, DDP_TIMEOUT). Without a launcher that stops the job when a rank dies, a rank "
                         "cannot tell a rank 0 that died before it listened from one slow to start", addr, port, waited);
    if (why == DDP__HELLO_NO_CONNECT)
        return ddp__fail(ctx, DDP_ERR_TIMEOUT, "cannot reach rank 0's rendezvous store at %s:%d within %g s: %s",
                         addr, port, waited, ddp__strerror(last_err ? last_err : ETIMEDOUT));
    if (why == DDP__HELLO_SILENT)
        return ddp__fail(ctx, DDP_ERR_TIMEOUT, "a process listens on %s:%d but did not answer the rendezvous handshake "
                         "within %g s: rank 0 is stopped or overloaded, or another program holds MASTER_PORT",
                         addr, port, waited);
    return ddp__fail(ctx, DDP_ERR_TIMEOUT, "the process on %s:%d closed every connection during the rendezvous "
                     "handshake for %g s: another program holds MASTER_PORT, or rank 0's store is flooded with "
                     "connections", addr, port, waited);
}

static ddp_result ddp__store_connect(ddp_context *ctx, double deadline) {
    return ddp__store_connect_as(ctx, deadline, ctx->rank, &ctx->rdv.store_fd);
}

/* What rank 0 published under `key` (a segment's name, the ncclUniqueId), waited for until
   `deadline`; the caller frees *val. */
static ddp_result ddp__fetch_from_rank0(ddp_context *ctx, const char *key, const char *what, double deadline,
                                        unsigned char **val, uint32_t *len) {
    int found = 0;
    ddp_result r = ddp__store_get(ctx, key, deadline, val, len, &found);
    if (r != DDP_OK) return r;
    if (!found) return ddp__fail(ctx, DDP_ERR_TIMEOUT, "rank 0 did not publish %s in time", what);
    return DDP_OK;
}

/* The ranks [first, first + n) that have not set PREFIX<rank> in the store, as "2, 5". */
static ddp_result ddp__list_missing(ddp_context *ctx, const char *prefix, int first, int n, char *out, size_t cap) {
    size_t len = 0;
    int s, exists;
    out[0] = 0;
    for (s = first; s < first + n && len + 16 < cap; s++) {
        char key[64];
        ddp_result r;
        snprintf(key, sizeof key, "%s%d", prefix, s);
        if ((r = ddp__store_check(ctx, key, &exists)) != DDP_OK) return r;
        if (!exists) len += (size_t)snprintf(out + len, cap - len, "%s%d", len ? ", " : "", s);
    }
    return DDP_OK;
}

/* --------------------------------------------------------------------------------------------
   >>engine  What every backend's communication shares: the communication thread's work queue
   (cpu, mpi), reached through the backend's one-bucket function; the watchdog (mpi, nccl) and its
   look at the store, reached through the backend's hooks (ddp__watchdog_hooks).
   -------------------------------------------------------------------------------------------- */
static void ddp__workq_init(ddp__workq *q, ddp_context *ctx, ddp__work_fn run) {
    q->ctx = ctx;
    q->run = run;
    ddp__mutex_init(&q->lock);
    ddp__cond_init(&q->wake);
    ddp__cond_init(&q->done_cond);
}

static void ddp__workq_destroy(ddp__workq *q) {
    if (!q->ctx) return;   /* never initialized */
    ddp__mutex_destroy(&q->lock);
    ddp__cond_destroy(&q->wake);
    ddp__cond_destroy(&q->done_cond);
}

/* Bucket `done`, by the thread that takes the turn: called with the lock held and the turn free;
   the lock is released while the bucket runs. After a failure the rest are only counted. */
static void ddp__workq_turn(ddp__workq *q) {
    ddp_context *ctx = q->ctx;
    int index = q->done;
    double t0, seconds = 0;
    ddp_result r = DDP_OK;
    q->busy = 1;
    ddp__mutex_unlock(&q->lock);
    if (!q->error) {
        snprintf(ctx->what_buf, sizeof ctx->what_buf, "the allreduce of gradient bucket %d", index);
        ctx->what = ctx->what_buf;
        t0 = ddp__now();
        r = q->run(ctx, index);
        seconds = ddp__now() - t0;
        ddp__record(ctx, ctx->tl.comm, DDP__EV_ALLREDUCE, t0, t0 + seconds, index, ctx->model.buckets[index].wire.bytes);
    }
    ddp__mutex_lock(&q->lock);
    q->seconds += seconds;
    q->last_seconds = seconds;
    if (r != DDP_OK && !q->error) q->error = r;
    q->done++;
    q->busy = 0;
    ddp__cond_broadcast(&q->done_cond);
}

static void *ddp__workq_main(void *arg) {
    ddp__workq *q = (ddp__workq *)arg;
    ddp__comm_thread_short_slice();
    ddp__mutex_lock(&q->lock);
    for (;;) {
        while (!q->stop && (q->done == q->launched || q->busy)) ddp__cond_wait(&q->wake, &q->lock);
        if (q->done == q->launched || q->busy) break;   /* stopped */
        ddp__workq_turn(q);
    }
    ddp__mutex_unlock(&q->lock);
    return NULL;
}

static ddp_result ddp__workq_start(ddp__workq *q) {
    if (ddp__thread_create(&q->thread, ddp__workq_main, q))
        return ddp__fail(q->ctx, DDP_ERR_SYSTEM, "cannot start the communication thread");
    q->started = 1;
    return DDP_OK;
}

/* One more bucket (the next in bucket order); `wake`: signal the communication thread. */
static void ddp__workq_push(ddp__workq *q, int wake) {
    ddp__mutex_lock(&q->lock);
    q->launched++;
    if (wake) ddp__cond_signal(&q->wake);
    ddp__mutex_unlock(&q->lock);
}

/* Every bucket launched is done: the step's times into `stats`, the counters back to zero.
   `take_turns`: this thread runs the next bucket itself whenever the turn is free. Returns the
   first failure (sticky). */
static ddp_result ddp__workq_wait(ddp__workq *q, int take_turns, ddp_step_stats *stats) {
    ddp_result r;
    ddp__mutex_lock(&q->lock);
    while (q->done < q->launched) {
        if (take_turns && !q->busy) ddp__workq_turn(q);
        else ddp__cond_wait(&q->done_cond, &q->lock);
    }
    r = q->error;
    stats->comm_ms = 1e3 * q->seconds;
    stats->last_bucket_comm_ms = 1e3 * q->last_seconds;
    q->seconds = q->last_seconds = 0;
    q->launched = q->done = 0;
    ddp__mutex_unlock(&q->lock);
    return r;
}

/* Shutdown: leaving mid-step tells the peers rather than let them wait for the timeout. */
static void ddp__workq_stop(ddp__workq *q) {
    if (!q->started) return;   /* setup failed, or nothing committed */
    ddp__mutex_lock(&q->lock);
    if (q->done != q->launched && !ddp__failed(q->ctx)) {
        ddp__mutex_unlock(&q->lock);
        ddp__fail_group(q->ctx, DDP_ERR_INVALID_STATE, "ddp_shutdown in the middle of a step");
        ddp__mutex_lock(&q->lock);
    }
    q->stop = 1;
    ddp__cond_signal(&q->wake);
    ddp__mutex_unlock(&q->lock);
    ddp__thread_join(q->thread);
    q->started = 0;
}

/* Stragglers: one exchange (bucket, or -1: the count of the ranks with data) that this rank
   reached at `mine` and then waited `wait` seconds in for `last_rank`, the last to arrive;
   `spread`: the most any rank waited in it. A wait of at least DDP__STRAGGLE_EVENT_S goes on the
   timeline as "wait for rank N" (shorter ones are the handshake itself). */
#define DDP__STRAGGLE_EVENT_S 1e-4
static void ddp__straggle_note(ddp_context *ctx, ddp__straggle *s, ddp__timeline *tl, int bucket,
                               double mine, double wait, double spread, int last_rank) {
    if (wait < 0) wait = 0;
    if (spread < wait) spread = wait;
    if (!s->exchanges) s->first_wait = wait;
    if (!s->exchanges || spread > s->worst) { s->worst = spread; s->slowest = last_rank; }
    s->wait += wait;
    s->spread += spread;
    s->exchanges++;
    if (wait >= DDP__STRAGGLE_EVENT_S) ddp__record(ctx, tl, DDP__EV_STRAGGLER, mine, mine + wait, bucket, (uint64_t)last_rank);
}

/* ddp_finish: the step's stragglers into its stats, the record emptied for the next step. */
static void ddp__straggle_fold(ddp__straggle *s, ddp_step_stats *st) {
    st->slowest_rank = s->exchanges ? s->slowest : -1;
    st->straggler_wait_ms = 1e3 * s->wait;
    st->straggler_first_wait_ms = 1e3 * s->first_wait;
    st->straggler_spread_ms = 1e3 * s->spread;
    memset(s, 0, sizeof *s);
}


#if defined(DDP_MPI) || defined(DDP_CUDA)
#define DDP__WATCH_TICK_S 0.1

static void ddp__watchdog_init(ddp__watchdog *w, ddp_context *ctx, ddp__mutex *lock) {
    w->ctx = ctx;
    w->lock = lock;
    w->fd = -1;
    ddp__cond_init(&w->wake);
}

static void ddp__watchdog_destroy(ddp__watchdog *w) {
    if (!w->ctx) return;   /* never initialized */
    if (w->fd >= 0) ddp__sock_close(w->fd);
    w->fd = -1;
    ddp__cond_destroy(&w->wake);
    w->ctx = NULL;
}

/* Is this the watchdog's thread? (Its requests go on its own store connection.) */
static int ddp__watchdog_is_me(ddp__watchdog *w) {
    int tid = __atomic_load_n(&w->tid, __ATOMIC_ACQUIRE);
    return tid != 0 && tid == ddp__thread_id();
}

/* The store's word on `fd`: another rank's poison, or a rank's connection closed (it died), in
   the backend's words. */
static ddp_result ddp__watch_store(ddp_context *ctx, const ddp__watchdog_hooks *h, int fd, char *msg, size_t cap) {
    unsigned char *val = NULL;
    uint32_t len = 0, status = 0;
    ddp_result r;
    if (fd < 0) return DDP_OK;
    r = ddp__store_request_on(ctx, fd, DDP__OP_GET, "poison", "0", 1, &val, &len, &status, 0);
    if (r != DDP_OK) {
        DDP_FREE(val);
        if (__atomic_load_n(&ctx->closing, __ATOMIC_ACQUIRE)) return DDP_OK;   /* rank 0 closes it at shutdown */
        h->store_gone(ctx, msg, cap);
        return DDP_ERR_PEER_LOST;
    }
    if (status == DDP__REPLY_PEER_LOST) {
        h->store_died(ctx, (const char *)val, msg, cap);
        r = DDP_ERR_PEER_LOST;
    } else {   /* a peer's poison, or rank 0's own failure: a code, then a message */
        const char *text;
        if ((r = ddp__store_poison_code(status, val, len, &text)) != DDP_OK) snprintf(msg, cap, "stopped because %s", text);
    }
    DDP_FREE(val);
    return r;
}

/* One look, after the tick's wait: called and left with the lock held. */
static void ddp__watchdog_look(ddp__watchdog *w, char *msg, size_t cap) {
    ddp_context *ctx = w->ctx;
    const ddp__watchdog_hooks *h = &w->hooks;
    ddp_result r = DDP_OK;
    if (h->inspect_locked && !ddp__failed(ctx)) r = h->inspect_locked(ctx, msg, cap);
    ddp__mutex_unlock(w->lock);
    if (r == DDP_OK && h->inspect && !ddp__failed(ctx)) r = h->inspect(ctx, msg, cap);
    if (ddp__failed(ctx)) {}   /* told already, or an inspect hook failed the group itself */
    else if (r != DDP_OK) h->on_failure(ctx, r, msg);
    else if (ddp__cancel_requested(ctx)) ddp__check_cancel(ctx, h->cancel_where);
    else if ((r = ddp__watch_store(ctx, h, w->fd, msg, cap)) != DDP_OK) {
        ddp__set_failed(ctx, ddp__fail(ctx, r, "%s", msg));   /* the store knows already (or is gone) */
        if (h->on_store) h->on_store(ctx, r);
    }
    if (h->after) h->after(ctx);
    ddp__mutex_lock(w->lock);
}

static void *ddp__watchdog_main(void *arg) {
    ddp__watchdog *w = (ddp__watchdog *)arg;
    char msg[DDP__ERR_MAX - 64];
    __atomic_store_n(&w->tid, ddp__thread_id(), __ATOMIC_RELEASE);
    if (w->hooks.begin) w->hooks.begin(w->ctx);
    ddp__mutex_lock(w->lock);
    while (!w->stop) {
        double before = ddp__now();
        ddp__cond_wait_s(&w->wake, w->lock, DDP__WATCH_TICK_S);
        if (w->hooks.slept) w->hooks.slept(w->ctx, ddp__now() - before);
        if (w->stop) break;
        ddp__watchdog_look(w, msg, sizeof msg);
    }
    ddp__mutex_unlock(w->lock);
    return NULL;
}

static int ddp__watchdog_start(ddp__watchdog *w) {
    if (ddp__thread_create(&w->thread, ddp__watchdog_main, w)) return -1;
    w->started = 1;
    return 0;
}

static void ddp__watchdog_stop(ddp__watchdog *w) {
    if (!w->started) return;
    ddp__mutex_lock(w->lock);
    w->stop = 1;
    ddp__cond_signal(&w->wake);
    ddp__mutex_unlock(w->lock);
    ddp__thread_join(w->thread);
    w->started = 0;
}
#endif /* DDP_MPI || DDP_CUDA */

/* --------------------------------------------------------------------------------------------
   >>shard  The shard layout every backend follows: which rank holds which part of a bucket
   (DDP__SHARD_GRAIN; with replica groups, which member of the group), whether the master is held in parts, and the fixed-order sum of the
   gradient norm's blocks (the blocks' sums of squares: >>host, and ddp_kernels.cuh on NCCL).
   -------------------------------------------------------------------------------------------- */
/* Team member s's part of bucket b, as a range of the flat buffer. Unsharded (or one rank) every
   rank holds all of it. Sharded, member s of the team (ddp__team_*: the world, or with replica
   groups the group; every group has the same layout) holds [s*P, (s+1)*P) of the bucket, P its
   1/team share rounded down to DDP__SHARD_GRAIN, and the last member the rest up to the
   bucket's end: parts are contiguous (a bucket is one reduce-scatter, its parts one
   all-gather), balanced to within team * DDP__SHARD_GRAIN floats, and a norm block never
   straddles two owners. */
static void ddp__shard_range(const ddp_context *ctx, int b, int s, size_t *lo, size_t *hi) {
    const ddp__bucket *k = &ctx->model.buckets[b];
    size_t part;
    int n = ddp__team_world(ctx);
    if (!ddp__sharded(ctx)) { *lo = k->offset; *hi = k->offset + k->count; return; }
    part = k->count / (size_t)n / DDP__SHARD_GRAIN * DDP__SHARD_GRAIN;
    *lo = k->offset + part * (size_t)s;
    *hi = s == n - 1 ? k->offset + k->count : *lo + part;
}

static int ddp__holds(const ddp_context *ctx, size_t i) {
    size_t lo, hi;
    int b;
    for (b = 0; b < ctx->model.num_buckets; b++) {
        const ddp__bucket *k = &ctx->model.buckets[b];
        if (i < k->offset || i >= k->offset + k->count) continue;
        ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
        return i >= lo && i < hi;
    }
    return 0;
}

/* bf16 parameters with shard_optimizer on several ranks: the fp32 master is held in parts, like
   m and v (shard.count floats, packed: master[shard.base[b] + i - lo] is flat element i of this
   rank's part [lo, hi) of bucket b); the bf16 working copies are whole, and what is gathered. */
static int ddp__master_parts(const ddp_context *ctx) {
    return ctx->flat.params_bf16 && ddp__sharded(ctx);
}

/* ZeRO-2 (desc.shard DDP_SHARD_GRADIENTS, SHARDED GRADIENTS in the manual): on top of ZeRO-1's
   parts, the gradients outside this rank's part of a bucket are released once the bucket's
   reduce-scatter is settled (every member has read them), and zeroed that way by ddp_zero_grad.
   The views never move: released pages read as zeros and come back when the backward writes
   them again. Off on one rank (nothing to shard across), as ZeRO-1. ZeRO-3 (PARAMETERS) shards
   the gradients too: the same release. */
static int ddp__z2(const ddp_context *ctx) {   /* (PARAMETERS on a backend without shards_grads: whole gradients) */
    return ctx->desc.shard >= DDP_SHARD_GRADIENTS && ddp__sharded(ctx) && ctx->be && ctx->be->shards_grads;
}

/* Flat gradient elements [from, to) of this rank's buffer read as zeros afterwards: the whole
   pages strictly inside given back (ddp__pages_punch), the rest zeroed (a page shared with a
   neighbouring range, or a system that cannot punch). Called for ranges nobody else touches
   now: a settled bucket's part (the communication thread), or every bucket (ddp_zero_grad). */
static void ddp__z2_clear(ddp_context *ctx, size_t from, size_t to) {
    size_t es = ctx->flat.grads_bf16 ? sizeof(ddp_bf16) : sizeof(float), page = ddp__page_size();
    unsigned char *base = ctx->flat.grads_bf16 ? (unsigned char *)ctx->flat.grads_bf16 : (unsigned char *)ctx->flat.grads;
    uintptr_t a = (uintptr_t)(base + from * es), e = (uintptr_t)(base + to * es);
    uintptr_t pa = (a + page - 1) / page * page, pe = e / page * page;
    if (to <= from) return;
    if (pe > pa && ddp__pages_punch((void *)pa, (size_t)(pe - pa))) {
        memset((void *)a, 0, (size_t)(pa - a));
        memset((void *)pe, 0, (size_t)(e - pe));
    } else memset((void *)a, 0, (size_t)(e - a));
}

/* Bucket b is settled on this rank (its reduce-scatter done, every member has read this rank's
   values): what lies outside this rank's part is released. */
static void ddp__z2_release(ddp_context *ctx, int b) {
    const ddp__bucket *k = &ctx->model.buckets[b];
    size_t lo, hi;
    ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
    ddp__z2_clear(ctx, k->offset, lo);
    ddp__z2_clear(ctx, hi, k->offset + k->count);
}

/* shard_accumulate: every micro-step's buckets are reduce-scattered, sync off too. */
static int ddp__z2_acc_on(const ddp_context *ctx) { return ctx->desc.shard_accumulate && ddp__z2(ctx); }

/* The sum of the norm's blocks in a fixed order: DDP__SUM_LANES running sums, sum j taking
   sums[j], sums[j + 256], ... in order, then the running sums added in order. The same terms in
   the same order, and so the same bits, whether one rank computed every block or each its own;
   ddp_kernels.cuh's ddp_k_sum_doubles adds in this order on the GPU, in parallel (one chain of
   dependent adds would be 30 us per million parameters there). */
#define DDP__SUM_LANES 256
static double ddp__norm_sum(const double *sums, size_t n) {
    double lane[DDP__SUM_LANES] = { 0 }, total = 0;
    size_t i;
    int j;
    for (i = 0; i < n; i++) lane[i % DDP__SUM_LANES] += sums[i];
    for (j = 0; j < DDP__SUM_LANES; j++) total += lane[j];
    return total;
}

static double ddp__norm_total(const double *sums, size_t n) { return sqrt(ddp__norm_sum(sums, n)); }

/* --------------------------------------------------------------------------------------------
   >>host  What the two host backends (single, cpu) share: flat buffers in host memory, the
   AdamW arithmetic (the NCCL backend's kernels compute the same, and its tests compare with
   these functions), the bf16 rounding both backends put on the wire.
   -------------------------------------------------------------------------------------------- */
/* bf16 is the upper half of a float, rounded to nearest even; NaN stays a (quiet) NaN. The same
   rounding as ddp_kernels.cuh, so both backends put the same bits on the wire. */
static uint16_t ddp__to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float ddp__from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* In double: float squares of large gradients would overflow into a false "not finite". Eight
   running sums in a fixed order: one sum is a chain of dependent adds (4 cycles each, 1.3 ms for
   this repo's tiny GPT, 5% of its step); eight independent ones vectorize and keep the order,
   and so the bits, the same on every rank and every run. */
#define DDP__NORM_LANES 8
static double ddp__sum_squares(const float *x, size_t n) {
    double lane[DDP__NORM_LANES] = { 0 }, total = 0;
    size_t i = 0;
    size_t j;
    for (; i + DDP__NORM_LANES <= n; i += DDP__NORM_LANES)
        for (j = 0; j < DDP__NORM_LANES; j++) lane[j] += (double)x[i + j] * (double)x[i + j];
    for (j = 0; i < n; i++, j++) lane[j] += (double)x[i] * (double)x[i];
    for (j = 0; j < DDP__NORM_LANES; j++) total += lane[j];
    return total;
}

/* The same lanes and order over bf16 gradients (each widened exactly): the bits of
   ddp__sum_squares on the widened values, which is what the fp32 staging used to hold. */
static double ddp__sum_squares_bf16(const ddp_bf16 *x, size_t n) {
    double lane[DDP__NORM_LANES] = { 0 }, total = 0, y;
    size_t i = 0;
    size_t j;
    for (; i + DDP__NORM_LANES <= n; i += DDP__NORM_LANES)
        for (j = 0; j < DDP__NORM_LANES; j++) { y = ddp__from_bf16(x[i + j]); lane[j] += y * y; }
    for (j = 0; i < n; i++, j++) { y = ddp__from_bf16(x[i]); lane[j] += y * y; }
    for (j = 0; j < DDP__NORM_LANES; j++) total += lane[j];
    return total;
}

/* The sums of squares of the norm blocks that lie in this rank's part (every block when
   unsharded) into sums[norm_base[b] + j]; the others are left alone. */
static void ddp__norm_blocks(ddp_context *ctx, double *sums) {
    int b;
    for (b = 0; b < ctx->model.num_buckets; b++) {
        const ddp__bucket *k = &ctx->model.buckets[b];
        size_t lo, hi, at;
        ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
        for (at = lo; at < hi; at += DDP__SHARD_GRAIN) {
            size_t n = hi - at < DDP__SHARD_GRAIN ? hi - at : DDP__SHARD_GRAIN;
            sums[ctx->shard.norm_base[b] + (at - k->offset) / DDP__SHARD_GRAIN] =
                ctx->flat.grads_bf16 ? ddp__sum_squares_bf16(ctx->flat.grads_bf16 + at, n) : ddp__sum_squares(ctx->flat.grads + at, n);
        }
    }
}

/* The gradients (fp32 grads, or bf16 grads16) are not finite: name the first offender (sharded:
   in this rank's part, the only one averaged here). Nothing has been touched yet. */
static ddp_result ddp__nonfinite(ddp_context *ctx, const float *grads, const ddp_bf16 *grads16, double norm) {
    int i;
    size_t k;
    for (i = 0; i < ctx->model.num_params; i++) {
        const ddp__param *p = &ctx->model.params[i];
        size_t k0 = 0, k1 = p->count, lo, hi;
        if (ddp__z2(ctx)) {   /* ZeRO-2: this rank's part only (a read of the released rest would bring its pages back) */
            ddp__shard_range(ctx, p->bucket, ddp__team_rank(ctx), &lo, &hi);
            k0 = lo > p->offset ? lo - p->offset : 0;
            k1 = hi <= p->offset ? 0 : hi - p->offset < p->count ? hi - p->offset : p->count;
        }
        for (k = k0; k < k1; k++) {
            float g = grads16 ? ddp__from_bf16(grads16[p->offset + k]) : grads[p->offset + k];
            if ((grads16 ? ddp__finite_bf16(grads16[p->offset + k]) : ddp__finite_f(g)) || (ctx->desc.shard_optimizer && !ddp__holds(ctx, p->offset + k))) continue;
            if (ctx->desc.skip_nonfinite) {
                if (ctx->rank == 0)
                    ddp__log(ctx, DDP_LOG_WARN, "optimizer step %lld skipped: the gradient of '%s' is %g at element "
                             "%zu", (long long)ctx->adam.step + 1, p->name, (double)g, k);
                return DDP_OK;
            }
            return ddp__fail(ctx, DDP_ERR_NONFINITE, "optimizer step %lld: the gradient of '%s' is %g at element %zu; "
                             "parameters unchanged (skip_nonfinite skips such steps)", (long long)ctx->adam.step + 1,
                             p->name, (double)g, k);
        }
    }
    if (ctx->desc.skip_nonfinite) {
        if (ctx->rank == 0)
            ddp__log(ctx, DDP_LOG_WARN, "optimizer step %lld skipped: the gradient norm is %g (in another rank's shard)",
                     (long long)ctx->adam.step + 1, norm);
        return DDP_OK;
    }
    return ddp__fail(ctx, DDP_ERR_NONFINITE, "optimizer step %lld: the gradient norm is %g%s; parameters unchanged",
                     (long long)ctx->adam.step + 1, norm, ctx->desc.shard_optimizer ? " (the culprit is in another rank's "
                     "shard)" : "");
}

static void ddp__adamw_range(float *p, const float *g, float *m, float *v, size_t n, float clip, float lr,
                             float b1, float b2, float eps, float decay, float step_size, float bc2_sqrt) {
    size_t i;
    for (i = 0; i < n; i++) {
        float grad = g[i] * clip;
        m[i] = b1 * m[i] + (1.0f - b1) * grad;
        v[i] = b2 * v[i] + (1.0f - b2) * grad * grad;
        p[i] -= lr * decay * p[i];
        p[i] -= step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
    }
}

/* The same arithmetic on the fp32 master from the bf16 gradients (widened exactly), the bf16
   working copy w written in the same pass. Returns how many working copies were not the master
   rounded before the step: the program wrote one of the two (ddp_param_bf16, or the master
   through ddp_flat_params) without the other. That comparison costs 17-29% of the loop alone
   (bench/bench_adamw_guard.c; 1-3% of a memory-bound step); the five buffers are distinct
   allocations, and saying so (__restrict: C99's restrict, in C and C++ alike) makes the loop
   1.4-1.5x as fast, guard included. */
#define DDP__RESTRICT __restrict
static size_t ddp__adamw_range_bf16(float *DDP__RESTRICT p, ddp_bf16 *DDP__RESTRICT w, const ddp_bf16 *DDP__RESTRICT g,
                                    float *DDP__RESTRICT m, float *DDP__RESTRICT v, size_t n, float clip, float lr, float b1,
                                    float b2, float eps, float decay, float step_size, float bc2_sqrt) {
    size_t i, diverged = 0;
    for (i = 0; i < n; i++) {
        float grad = ddp__from_bf16(g[i]) * clip;
        diverged += w[i] != ddp__to_bf16(p[i]);
        m[i] = b1 * m[i] + (1.0f - b1) * grad;
        v[i] = b2 * v[i] + (1.0f - b2) * grad * grad;
        p[i] -= lr * decay * p[i];
        p[i] -= step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
        w[i] = ddp__to_bf16(p[i]);
    }
    return diverged;
}

/* ZeRO-3 on the CPU backend's several ranks: no whole private flat buffers at all. The
   parameters (bf16: the working copies) and gradients live in the shared segment from the start
   (ddp__grads_share; bf16: the fp32 master as its packed parts only), and rank 0's initial values
   reach each rank's parts a bucket at a time (ddp__cpu_z3_seed): the commit never holds the whole
   model in one rank's memory. Without the segment, ddp__grads_share allocates them here after
   all (and ddp__z3_commit refuses by name). */
static int ddp__z3_seed_deferred(const ddp_context *ctx) {
    return ctx->desc.shard == DDP_SHARD_PARAMETERS && ctx->be->id == DDP_BACKEND_CPU && ctx->world > 1;
}
/* ZeRO-3 on the MPI backend's several ranks: the whole-size flat buffers (parameters or bf16
   working copies, gradients) are made without touching a page (ddp__alloc_floats_untouched), the
   fp32 master of bf16 parameters waits for the shard layout, and rank 0's initial values reach
   each rank's parts a chunk at a time at commit (ddp__mpi_z3_seed): no rank holds the model. */
static int ddp__z3_seed_mpi(const ddp_context *ctx) {
    return ctx->desc.shard == DDP_SHARD_PARAMETERS && ctx->be->id == DDP_BACKEND_MPI && ctx->world > 1;
}
static ddp_result ddp__host_alloc_private(ddp_context *ctx);
static ddp_result ddp__host_alloc_untouched(ddp_context *ctx);
static ddp_result ddp__host_alloc_flat(ddp_context *ctx) {
    if (ddp__z3_seed_mpi(ctx)) return ddp__host_alloc_untouched(ctx);
    return ddp__z3_seed_deferred(ctx) ? DDP_OK : ddp__host_alloc_private(ctx);   /* deferred: the initial values stay the program's */
}
/* ddp__alloc_floats' zeros without touching the block's whole pages: they are given back
   (ddp__pages_punch: untouched, they cost nothing; reused heap memory reads as zeros after), only
   the partial pages at the ends are written. Where pages cannot be given back, memset. */
static float *ddp__alloc_floats_untouched(size_t count) {
    size_t page = ddp__page_size();
    unsigned char *a = (unsigned char *)ddp__alloc_floats_raw(count);
    uintptr_t pa, pe, e;
    if (!a) return NULL;
    e = (uintptr_t)a + count * sizeof(float);
    pa = ((uintptr_t)a + page - 1) / page * page;
    pe = e / page * page;
    if (pe > pa && ddp__pages_punch((void *)pa, (size_t)(pe - pa))) {
        memset(a, 0, (size_t)(pa - (uintptr_t)a));
        memset((void *)pe, 0, (size_t)(e - pe));
    } else memset(a, 0, count * sizeof(float));
    return (float *)(void *)a;
}
static ddp_result ddp__host_alloc_untouched(ddp_context *ctx) {
    if (ddp__bf16_params(ctx)) {   /* the fp32 master: this rank's parts, made by the seed */
        ctx->flat.params_bf16 = (ddp_bf16 *)(void *)ddp__alloc_floats_untouched(ctx->flat.count / 2);
        ctx->flat.grads_bf16 = (ddp_bf16 *)(void *)ddp__alloc_floats_untouched(ctx->flat.count / 2);
        if (!ctx->flat.params_bf16 || !ctx->flat.grads_bf16)
            return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for %zu bf16 parameters", ctx->flat.count);
        return DDP_OK;
    }
    ctx->flat.params = ddp__alloc_floats_untouched(ctx->flat.count);
    ctx->flat.grads = ddp__alloc_floats_untouched(ctx->flat.count);
    if (!ctx->flat.params || !ctx->flat.grads) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for %zu parameters", ctx->flat.count);
    return DDP_OK;
}
static ddp_result ddp__host_alloc_private(ddp_context *ctx) {
    int i;
    ctx->flat.params = ddp__alloc_floats(ctx->flat.count);
    if (ddp__bf16_params(ctx)) {   /* flat.count is a multiple of 16: whole floats */
        ctx->flat.params_bf16 = (ddp_bf16 *)(void *)ddp__alloc_floats(ctx->flat.count / 2);
        ctx->flat.grads_bf16 = (ddp_bf16 *)(void *)ddp__alloc_floats(ctx->flat.count / 2);   /* zeros: +0 in bf16 */
        if (!ctx->flat.params_bf16 || !ctx->flat.grads_bf16)
            return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for %zu bf16 parameters", ctx->flat.count);
    } else
        ctx->flat.grads = ddp__alloc_floats(ctx->flat.count);
    if (!ctx->flat.params || (!ctx->flat.grads && !ctx->flat.grads_bf16))
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for %zu parameters", ctx->flat.count);
    for (i = 0; i < ctx->model.num_params; i++) {
        ddp__param *p = &ctx->model.params[i];
        if (p->init) memcpy(ctx->flat.params + p->offset, p->init, p->count * sizeof(float));
        p->init = NULL;
    }
    return DDP_OK;
}

static ddp_result ddp__host_zero(ddp_context *ctx, size_t offset, size_t count) {
    if (ctx->flat.grads_bf16) memset(ctx->flat.grads_bf16 + offset, 0, count * sizeof(ddp_bf16));
    else memset(ctx->flat.grads + offset, 0, count * sizeof(float));
    return DDP_OK;
}

static ddp_result ddp__host_scale(ddp_context *ctx, size_t offset, size_t count, float factor) {
    size_t i;
    if (ctx->flat.grads_bf16)
        for (i = offset; i < offset + count; i++) ctx->flat.grads_bf16[i] = ddp__to_bf16(ddp__from_bf16(ctx->flat.grads_bf16[i]) * factor);
    else
        for (i = offset; i < offset + count; i++) ctx->flat.grads[i] *= factor;
    return DDP_OK;
}

/* The master's parts, packed (at commit, once the working copies hold the whole master rounded). */
static ddp_result ddp__host_shard_master(ddp_context *ctx) {
    float *parts = ddp__alloc_floats(ctx->shard.count ? ctx->shard.count : 1);
    size_t lo, hi;
    int b;
    if (!parts) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for %zu floats of the fp32 master", ctx->shard.count);
    for (b = 0; b < ctx->model.num_buckets; b++) {
        ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
        memcpy(parts + ctx->shard.base[b], ctx->flat.params + lo, (hi - lo) * sizeof(float));
    }
    ddp__free_floats(ctx->flat.params);
    ctx->flat.params = parts;
    return DDP_OK;
}

static ddp_result ddp__host_bf16(ddp_context *ctx, int op, size_t offset, size_t count) {
    size_t i;
    if (op == DDP__BF16_SHARD_MASTER) return ddp__host_shard_master(ctx);
    for (i = offset; i < offset + count; i++) ctx->flat.params_bf16[i] = ddp__to_bf16(ctx->flat.params[i]);
    return DDP_OK;
}

/* m and v: this rank's parts only (sharded: shard.count floats, packed in flat order; unsharded
   shard.count is the flat buffer's size and m[i] belongs to flat element i). */
static ddp_result ddp__host_adamw_state(ddp_context *ctx) {
    if (ctx->adam.m) return DDP_OK;
    ctx->adam.m = ddp__alloc_floats(ctx->shard.count);
    ctx->adam.v = ddp__alloc_floats(ctx->shard.count);
    if (!ctx->adam.m || !ctx->adam.v) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for AdamW state");
    return DDP_OK;
}

/* What one AdamW step needs besides the options: the clip factor and the bias corrections. */
typedef struct ddp__adamw_now { float clip, step_size, bc2_sqrt, b1, b2, eps; } ddp__adamw_now;

/* The norm is known: skip (not finite), or advance the step and fill `now`. Returns DDP_OK with
   *skip = 1 for a skipped step. */
static ddp_result ddp__adamw_prepare(ddp_context *ctx, const ddp_adamw *opt, float b1, float b2, float eps, double norm,
                                     float *grad_norm_out, ddp__adamw_now *now, int *skip) {
    *skip = 0;
    if (grad_norm_out) *grad_norm_out = (float)norm;
    if (!ddp__finite_d(norm)) { *skip = 1; return ddp__nonfinite(ctx, ctx->flat.grads, ctx->flat.grads_bf16, norm); }
    now->clip = 1.0f;
    if (opt->max_grad_norm > 0 && norm > opt->max_grad_norm) now->clip = (float)(opt->max_grad_norm / (norm + 1e-6));
    ctx->adam.step++;
    now->step_size = (float)(opt->lr / (1.0 - pow(b1, (double)ctx->adam.step)));
    now->bc2_sqrt = (float)sqrt(1.0 - pow(b2, (double)ctx->adam.step));
    now->b1 = b1; now->b2 = b2; now->eps = eps;
    return DDP_OK;
}

/* AdamW on this rank's part of bucket b (all of it unsharded), parameter by parameter (the
   decay flag), skipping the padding between parameters. */
static void ddp__adamw_bucket(ddp_context *ctx, int b, const ddp_adamw *opt, const ddp__adamw_now *now) {
    const ddp__bucket *k = &ctx->model.buckets[b];
    size_t lo, hi;
    int i;
    ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
    for (i = k->first_param; i <= k->last_param; i++) {
        const ddp__param *p = &ctx->model.params[i];
        size_t from = p->offset > lo ? p->offset : lo, to = p->offset + p->count < hi ? p->offset + p->count : hi;
        size_t at = ctx->shard.base[b] + (from - lo);
        float decay = (p->flags & DDP_NO_DECAY) ? 0.0f : opt->weight_decay;
        if (to <= from) continue;
        if (ctx->flat.params_bf16) {
            size_t bad = ddp__adamw_range_bf16(ctx->flat.params + (ddp__master_parts(ctx) ? at : from), ctx->flat.params_bf16 + from, ctx->flat.grads_bf16 + from,
                                               ctx->adam.m + at, ctx->adam.v + at, to - from, now->clip, opt->lr, now->b1,
                                               now->b2, now->eps, decay, now->step_size, now->bc2_sqrt);
            if (bad && !ctx->flat.bf16_diverged) ctx->flat.bf16_diverged_param = i;
            ctx->flat.bf16_diverged += bad;
        } else
            ddp__adamw_range(ctx->flat.params + from, ctx->flat.grads + from, ctx->adam.m + at, ctx->adam.v + at, to - from,
                             now->clip, opt->lr, now->b1, now->b2, now->eps, decay, now->step_size, now->bc2_sqrt);
    }
}

/* Every rank holds every part (unsharded, or one rank). */
static ddp_result ddp__host_adamw(ddp_context *ctx, const ddp_adamw *opt, float b1, float b2, float eps, float *grad_norm_out) {
    ddp__adamw_now now;
    ddp_result r;
    int b, skip;
    if ((r = ddp__host_adamw_state(ctx)) != DDP_OK) return r;
    ddp__norm_blocks(ctx, ctx->shard.norm_sums);
    r = ddp__adamw_prepare(ctx, opt, b1, b2, eps, ddp__norm_total(ctx->shard.norm_sums, ctx->shard.norm_blocks), grad_norm_out, &now, &skip);
    if (r != DDP_OK || skip) return r;
    for (b = 0; b < ctx->model.num_buckets; b++) ddp__adamw_bucket(ctx, b, opt, &now);
    return DDP_OK;
}

static ddp_result ddp__host_copy(ddp_context *ctx, void *dst, const void *src, size_t bytes, int to_host) {
    (void)ctx; (void)to_host;
    memmove(dst, src, bytes);
    return DDP_OK;
}

/* The end of a synchronizing step on the host: how long ddp_finish waited, the share of
   communication hidden under backward, the timeline's wait and step events. */
static void ddp__host_step_done(ddp_context *ctx, double t_wait) {
    double t = ddp__now();
    ctx->step.stats.exposed_ms = 1e3 * (t - t_wait);
    if (ctx->step.stats.comm_ms > 0) {
        double hidden = 1.0 - ctx->step.stats.exposed_ms / ctx->step.stats.comm_ms;
        ctx->step.stats.overlap_pct = 100.0 * (hidden < 0 ? 0 : hidden);
    }
    if (ctx->tl.main) {
        ddp__record(ctx, ctx->tl.main, DDP__EV_WAIT, t_wait, t, -1, 0);
        ddp__record(ctx, ctx->tl.main, DDP__EV_STEP, ctx->tl.forward_start != 0 ? ctx->tl.forward_start : ctx->step.start, t, -1, 0);
        ctx->tl.forward_start = 0;
    }
}

static void ddp__host_free(ddp_context *ctx) {
    ddp__free_floats(ctx->flat.params);
    ddp__free_floats(ctx->flat.grads);
    ddp__free_floats(ctx->adam.m);
    ddp__free_floats(ctx->adam.v);
    ddp__free_floats((float *)(void *)ctx->flat.params_bf16);
    ddp__free_floats((float *)(void *)ctx->flat.grads_bf16);
    ctx->flat.params = ctx->flat.grads = ctx->adam.m = ctx->adam.v = NULL;
    ctx->flat.params_bf16 = ctx->flat.grads_bf16 = NULL;
}

/* The slots the host backends share (single, cpu, mpi), by name; each fills the rest. */
static void ddp__host_table(ddp__backend *t) {
    memset(t, 0, sizeof *t);
    t->alloc_flat = ddp__host_alloc_flat;
    t->zero = ddp__host_zero;
    t->scale = ddp__host_scale;
    t->bf16 = ddp__host_bf16;
    t->adamw = ddp__host_adamw;
    t->adamw_state = ddp__host_adamw_state;
    t->copy = ddp__host_copy;
    t->teardown = ddp__host_free;
}

/* ZeRO-2 (>>shard: ddp__z2) on the host backends' gradients (cpu, mpi: host memory). */
/* shard_accumulate, bucket b settled: a micro-step with sync off adds this rank's part (this
   micro-step's average) into the accumulator and releases the part, so that the next micro-step
   starts from zeros; the synchronizing one leaves accumulator + its average in the part, where
   AdamW, the norm and ddp_gather_to_host read it. In float, micro-step after micro-step (bf16
   gradients: widened exactly, rounded once at the end). */
static void ddp__z2_accumulate(ddp_context *ctx, int b) {
    size_t lo, hi, i, n;
    float *acc = ctx->shard.z2_acc + ctx->shard.base[b];
    int first = ctx->shard.z2_acc_steps == 0;
    ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
    n = hi - lo;
    if (!ctx->step.sync) {
        if (ctx->flat.grads_bf16) {
            const ddp_bf16 *g = ctx->flat.grads_bf16 + lo;
            for (i = 0; i < n; i++) acc[i] = first ? ddp__from_bf16(g[i]) : acc[i] + ddp__from_bf16(g[i]);
        } else {
            const float *g = ctx->flat.grads + lo;
            if (first) memcpy(acc, g, n * sizeof(float));
            else for (i = 0; i < n; i++) acc[i] += g[i];
        }
        return;   /* the caller releases the whole bucket */
    }
    if (first) return;   /* one micro-step: the part holds the average already */
    if (ctx->flat.grads_bf16) {
        ddp_bf16 *g = ctx->flat.grads_bf16 + lo;
        for (i = 0; i < n; i++) g[i] = ddp__to_bf16(acc[i] + ddp__from_bf16(g[i]));
    } else {
        float *g = ctx->flat.grads + lo;
        for (i = 0; i < n; i++) g[i] = acc[i] + g[i];
    }
}

/* The communication thread's end of a settled bucket under ZeRO-2 (ddp__z2_cpu_bucket, _mpi_). */
static void ddp__z2_settled(ddp_context *ctx, int b) {
    const ddp__bucket *k = &ctx->model.buckets[b];
    if (ddp__z2_acc_on(ctx)) ddp__z2_accumulate(ctx, b);
    if (ddp__z2_acc_on(ctx) && !ctx->step.sync) ddp__z2_clear(ctx, k->offset, k->offset + k->count);   /* all of it, in one */
    else ddp__z2_release(ctx, b);
}

/* --------------------------------------------------------------------------------------------
   >>single  One rank and nobody to talk to: no network, no shared memory, no thread. Buckets
   are still built and marked ready (the same bookkeeping as with peers), and launching one
   does nothing.
   -------------------------------------------------------------------------------------------- */
static ddp_result ddp__single_launch(ddp_context *ctx, int bucket) { (void)ctx; (void)bucket; return DDP_OK; }
static ddp_result ddp__single_finish(ddp_context *ctx, double t_wait) { ddp__host_step_done(ctx, t_wait); return DDP_OK; }
static ddp_result ddp__single_collective(ddp_context *ctx, uint32_t kind, void *data, size_t count, int root) {
    (void)ctx; (void)kind; (void)data; (void)count; (void)root;
    return DDP_OK;   /* one rank: its data already is the result */
}

/* Filled by name into the context's own copy (nvcc's C++ takes no designated initializers, and
   a static filled at first use would race between ranks that are threads); a slot left NULL is
   nothing to do. */
static void ddp__single_table(ddp__backend *t) {
    ddp__host_table(t);
    t->name = "single";
    t->id = DDP_BACKEND_SINGLE;
    t->shards = 1;
    t->shards_grads = 1;
    t->launch = ddp__single_launch;   /* one rank: its gradients are the average already */
    t->finish = ddp__single_finish;
    t->collective = ddp__single_collective;
}

/* --------------------------------------------------------------------------------------------
   >>cpu  The CPU backend: collectives through one POSIX shared-memory segment (and the gradient
   buckets through a second one that holds every rank's gradients; see below).

   Every rank owns DDP__SLOTS slots of DDP__CHUNK_BYTES and three monotonically increasing
   stage counters (IN, RED, OUT), bumped once per chunk. An allreduce streams the buffer chunk
   by chunk; for chunk q each rank
     IN   copies the parts of its chunk that other ranks reduce into its slot q % DDP__SLOTS,
     RED  sums its own part over all ranks, in rank order (so the result is the same bits
          whichever rank computes it), and leaves the sum in its slot,
     OUT  copies the other ranks' sums out of their slots,
   waiting between stages until every rank has posted the previous one. That is reduce-scatter
   then all-gather, with every rank doing 1/N of the arithmetic, and the working set stays in
   cache. A slot is rewritten only once every rank has posted OUT for the chunk it held.
   A waiter spins briefly, then sleeps on a futex; while asleep it checks every
   DDP__LIVENESS_PERIOD_S that its peers are alive and that the group is not poisoned.
   With replica groups (desc.outer) a gradient bucket spans only the team, this rank's group
   (ddp__span_*): "every rank" above is then every member, in member order, and the divisor is
   the group's size; everything else spans the world. The counters stay one sequence on every
   rank (all issue the same collectives in the same order), and a team chunk whose slot a
   world-wide chunk held last waits for the world's OUT before it rewrites it (world_end).
   -------------------------------------------------------------------------------------------- */
#define DDP__SHM_MAGIC 0x31504444534d4853ull

/* One rank's control block in the shared segment; each field a cache line of its own. */
typedef struct ddp__shm_counter { uint32_t value; uint32_t waiters; char pad[56]; } ddp__shm_counter;
typedef struct ddp__shm_sig { uint32_t id, kind, root, bucket; uint64_t count; } ddp__shm_sig;   /* bucket: index + 1, 0: none */
typedef struct ddp__shm_rank {
    int32_t pid;
    int32_t tid;           /* the thread that steps this rank (ranks may be threads of one process) */
    ddp__shm_sig sig;
    double arrived;        /* when this rank posted its last gradient bucket (or join count): stragglers */
    char pad1[64 - 8 - sizeof(ddp__shm_sig) - sizeof(double)];
    ddp__shm_counter stage[3];
} ddp__shm_rank;
enum { DDP__STAGE_IN = 0, DDP__STAGE_RED = 1, DDP__STAGE_OUT = 2 };

typedef struct ddp__shm_header {
    uint64_t magic;
    uint32_t world, slots;
    uint64_t chunk_bytes, total_bytes;
    double origin;         /* rank 0's clock at creation: the job's time zero */
    int32_t failed_rank;   /* -1, or the first rank that poisoned the group */
    int32_t failed_code;
    char failed_msg[DDP__ERR_MAX];
    int32_t poison_claimed; /* 1 once a rank has begun to write failed_*: one writer, then failed_rank */
    /* an MPI host group's leader tells its host's ranks who came last to a gradient exchange across
       hosts (ddp__mpi_collective_run): written before it posts the result's broadcast, read after it */
    int32_t relay_rank;
    double relay_wait, relay_spread;
} ddp__shm_header;

/* The CPU backend's state: the collective segment, every rank's gradients in one more segment,
   and the communication thread that averages buckets while backward runs (>>cpu). */
struct ddp__cpu {
    char shm_name[64];
    unsigned char *shm;
    size_t shm_bytes;
    uint32_t shm_seq;              /* chunks processed: the same on every rank */
    uint32_t shm_collectives;      /* collectives issued: the same on every rank */
    double spin_seconds;
    double wait_grace_s;           /* added to timeout_s in a wait: an MPI host's non-leaders (ddp__mpi_host_up) */
    int host_waiting;              /* atomic: the rank's thread waits in ddp_finish (the comm thread may spin) */
    uint32_t sig_bucket;           /* the gradient bucket the next collective averages, + 1; 0: none */
    char grads_name[64];           /* every rank's gradients, in one segment (world > 1) */
    unsigned char *grads_shm;
    size_t grads_shm_bytes, grads_stride;   /* stride: floats from one rank's buffer to the next */
    int params_shared;             /* sharded: every rank's parameters follow the gradients in the segment */
    double *norm_recv;             /* sharded: a peer's norm blocks, as they arrive */
    float *bucket_f32;             /* bf16 parameters without the gradient segment: one bucket widened
                                      for the staging slots (the largest bucket's floats) */
    ddp__workq comm;               /* the communication thread's queue (>>engine) */
    uint32_t out_pending;          /* in place: the peers may still copy from this rank's buffer until
                                      every rank posts STAGE_OUT this far (0: nothing pending) */
    int team;                      /* the collective in progress is a gradient bucket's: it spans the
                                      team (ddp__team_*), not the world (ddp__span_*) */
    uint32_t world_end;            /* shm_seq after the last chunk that spanned the world (a team
                                      chunk that reuses a slot that chunk held waits for the world) */
    ddp__straggle straggle;        /* this step's last arrivals (ddp__cpu_arrivals) */
};

static size_t ddp__shm_ranks_offset(void) { return ddp__round_up(sizeof(ddp__shm_header), 64); }
static size_t ddp__shm_data_offset(int world) {
    return ddp__round_up(ddp__shm_ranks_offset() + sizeof(ddp__shm_rank) * (size_t)world, 4096);
}
static size_t ddp__shm_size(int world) {
    return ddp__shm_data_offset(world) + (size_t)world * DDP__SLOTS * DDP__CHUNK_BYTES;
}
static ddp__shm_header *ddp__shm_hdr(ddp_context *ctx) { return (ddp__shm_header *)ctx->impl.cpu->shm; }
static ddp__shm_rank *ddp__shm_block(ddp_context *ctx, int r) {
    return (ddp__shm_rank *)(ctx->impl.cpu->shm + ddp__shm_ranks_offset()) + r;
}
static unsigned char *ddp__shm_slot(ddp_context *ctx, int r, uint32_t chunk) {
    size_t index = (size_t)r * DDP__SLOTS + chunk % DDP__SLOTS;
    return ctx->impl.cpu->shm + ddp__shm_data_offset(ctx->world) + index * DDP__CHUNK_BYTES;
}

static int ddp__reached(uint32_t value, uint32_t target) { return (int32_t)(value - target) >= 0; }

/* The ranks the collective in progress spans: the world, or for a gradient bucket the team (with
   replica groups, this rank's group; else the world again). Every rank issues the same
   collectives in the same order, teams and world alike (the same model, the same buckets), so
   the stage counters and shm_seq agree on every rank, and a wait looks only at the span's
   ranks; a member's part of a chunk, its turn in a sum and the divisor follow its place in the
   span (ddp__span_first + i is member i). */
static int ddp__span_first(ddp_context *ctx) { return ctx->impl.cpu->team ? ddp__team_peer(ctx, 0) : 0; }
static int ddp__span_world(ddp_context *ctx) { return ctx->impl.cpu->team ? ddp__team_world(ctx) : ctx->world; }

static void ddp__shm_post(ddp_context *ctx, int stage, uint32_t value) {
    ddp__shm_counter *c = &ddp__shm_block(ctx, ctx->rank)->stage[stage];
    uint32_t waiters;
    __atomic_store_n(&c->value, value, __ATOMIC_SEQ_CST);
    if ((waiters = __atomic_load_n(&c->waiters, __ATOMIC_SEQ_CST)) != 0) ddp__futex_wake(&c->value, waiters);
}

/* Poison: the first rank to fail leaves its message in the segment's header, where every
   waiter looks (ddp__shm_check_peers). */
static void ddp__cpu_poison(ddp_context *ctx, ddp_result code) {
    ddp__shm_header *h;
    int32_t none = -1, none_claimed = 0;
    if (!ctx->impl.cpu || !ctx->impl.cpu->shm) return;
    h = ddp__shm_hdr(ctx);
    /* One writer (ranks failing at once, a cancel token say, race for the claim), and
       failed_rank only once the message is there: a reader that sees it reads the message. */
    if (__atomic_compare_exchange_n(&h->poison_claimed, &none_claimed, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        ddp__mutex_lock(&ctx->err_lock);
        snprintf(h->failed_msg, sizeof h->failed_msg, "%s", ctx->err);
        ddp__mutex_unlock(&ctx->err_lock);
        h->failed_code = (int32_t)code;
        __atomic_compare_exchange_n(&h->failed_rank, &none, ctx->rank, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
}

/* The group's poison, if a rank has left it (DDP_OK: none): it names the root cause (a rank that
   timed out waiting for a stopped peer, then exited, must not be reported as the problem). */
static ddp_result ddp__shm_poisoned(ddp_context *ctx) {
    ddp__shm_header *h = ddp__shm_hdr(ctx);
    int failed = __atomic_load_n(&h->failed_rank, __ATOMIC_ACQUIRE);
    if (failed < 0) return DDP_OK;
    if (failed == ctx->rank) return ddp__failed(ctx) ? ddp__failed(ctx) : DDP_ERR_PEER_LOST;   /* already told */
    /* a cancel stays a cancel: the host program stopped the job, nothing broke */
    return ddp__fail_group(ctx, h->failed_code == DDP_ERR_CANCELLED ? DDP_ERR_CANCELLED : DDP_ERR_PEER_LOST,
                           "stopped in %s because %s", ctx->what, h->failed_msg);
}

/* Rank s's pid: from its block once attached, from the rendezvous before. */
static int ddp__shm_peer_pid(ddp_context *ctx, int s) {
    int pid = __atomic_load_n(&ddp__shm_block(ctx, s)->pid, __ATOMIC_ACQUIRE);
    return !pid && ctx->rdv.peer_pids ? ctx->rdv.peer_pids[s] : pid;
}

/* The other ranks of [first, first + n) besides `dead` that have not posted and are gone or
   going (a SIGKILLed rank 0 is on its way out while rank 2, which saw its socket close, has
   already failed and exited): "; gone as well: rank 0 (pid N)", or "". */
static void ddp__shm_gone_too(ddp_context *ctx, int stage, uint32_t target, int first, int n, int dead, char *out, size_t cap) {
    size_t len = 0;
    int s;
    out[0] = 0;
    for (s = first; s < first + n && len + 48 < cap; s++) {
        int pid = ddp__shm_peer_pid(ctx, s);
        if (s == dead || s == ctx->rank || !ddp__pid_gone(pid) ||
            ddp__reached(__atomic_load_n(&ddp__shm_block(ctx, s)->stage[stage].value, __ATOMIC_ACQUIRE), target)) continue;
        len += (size_t)snprintf(out + len, cap - len, "%srank %d (pid %d)", len ? ", " : "; gone as well: ", s, pid);
    }
}

/* Checked while sleeping: the group poisoned by another rank, a dead peer among ranks
   [first, first + n) (the ones waited for), the deadline. */
static ddp_result ddp__shm_check_peers(ddp_context *ctx, int stage, uint32_t target, double deadline, int first, int n) {
    int s;
    ddp_result r;
    if ((r = ddp__shm_poisoned(ctx)) != DDP_OK) return r;   /* the poison first */
    for (s = first; s < first + n; s++) {
        int pid = ddp__shm_peer_pid(ctx, s);
        /* A peer that posted what this wait needs and then exited is done, not lost: after the
           last barrier of ddp_shutdown a rank may exit between our look at its counter and this
           check. Its counter is read after its death is seen, so "not reached" is final. */
        int tid = __atomic_load_n(&ddp__shm_block(ctx, s)->tid, __ATOMIC_ACQUIRE);
        int process = ddp__pid_alive(pid), thread = !process || ddp__thread_alive(pid, tid), k;
        if (s != ctx->rank && (!process || !thread) &&
            !ddp__reached(__atomic_load_n(&ddp__shm_block(ctx, s)->stage[stage].value, __ATOMIC_ACQUIRE), target)) {
            /* A killed process's threads are gone a moment before the process is a zombie: give
               it 100 ms to be one before calling it a thread that ended alone. */
            for (k = 0; process && k < 20; k++) { ddp__usleep(5000); process = ddp__pid_alive(pid); }
            /* A peer that poisoned the group (a cancel, say) and then ended did so after our
               first look at the poison: its poison, read after its end is seen, is the cause. */
            if ((r = ddp__shm_poisoned(ctx)) != DDP_OK) return r;
            if (!process) {   /* a peer that failed because another died first: name that one too */
                char also[160];
                ddp__shm_gone_too(ctx, stage, target, first, n, s, also, sizeof also);
                return ddp__fail_group(ctx, DDP_ERR_PEER_LOST, "rank %d (pid %d) died%s; this rank was in %s",
                                       s, pid, also, ctx->what);
            }
            return ddp__fail_group(ctx, DDP_ERR_PEER_LOST, "rank %d (pid %d, thread %d) ended without ddp_shutdown; "
                                   "this rank was in %s", s, pid, tid, ctx->what);
        }
    }
    if (ddp__now() > deadline) {
        char missing[256];
        size_t len = 0;
        missing[0] = 0;
        for (s = first; s < first + n && len < sizeof missing - 16; s++) {
            uint32_t v = __atomic_load_n(&ddp__shm_block(ctx, s)->stage[stage].value, __ATOMIC_ACQUIRE);
            if (s != ctx->rank && !ddp__reached(v, target))
                len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? ", " : "", s);
        }
        if (!missing[0]) return DDP_OK;   /* everyone posted as the deadline passed: not a timeout */
        return ddp__fail_group(ctx, DDP_ERR_TIMEOUT, "timed out after %g s in %s waiting for rank(s) %s",
                                         ctx->desc.timeout_s, ctx->what, missing);
    }
    return DDP_OK;
}

/* The deadline counts time this process could run: a gap between two looks far longer than the
   poll (the whole job stopped with Ctrl-Z and continued, say) moves it out by the gap, or the
   first rank to run again would time out before its peers got the CPU back. */
#define DDP__STOPPED_GAP_S 1.0

/* Every rank of [first, first + n) has posted `stage` up to target. */
static ddp_result ddp__shm_wait_ranks(ddp_context *ctx, int stage, uint32_t target, int first, int n) {
    double deadline = 0, next_check = 0, last_look = 0;
    int s;
    for (s = first; s < first + n; s++) {
        ddp__shm_counter *c = &ddp__shm_block(ctx, s)->stage[stage];
        double spin_until = 0;
        int polls = 0;
        if (s == ctx->rank) continue;
        while (!ddp__reached(__atomic_load_n(&c->value, __ATOMIC_ACQUIRE), target)) {
            uint32_t seen;
            if (polls++ % 16 == 0 && spin_until == 0)
                spin_until = ddp__now() + (ddp__in_backward(ctx) && !__atomic_load_n(&ctx->impl.cpu->host_waiting, __ATOMIC_ACQUIRE)
                                           ? DDP__SPIN_SECONDS_COMM_THREAD : ctx->impl.cpu->spin_seconds);
            if (polls % 16 || ddp__now() < spin_until) {
                if (polls % DDP__YIELD_EVERY == 0 || ctx->impl.cpu->spin_seconds == DDP__SPIN_SECONDS_OVERSUBSCRIBED) ddp__yield();
                else ddp__cpu_relax();
                continue;
            }
            if (deadline == 0) {
                last_look = ddp__now();
                deadline = last_look + ctx->desc.timeout_s + ctx->impl.cpu->wait_grace_s;
                next_check = 0;
            }
            if (ddp__now() - last_look > DDP__STOPPED_GAP_S) deadline += ddp__now() - last_look;
            last_look = ddp__now();
            {   /* between two futex sleeps (20 ms): a cancel, and a poison, seen at once */
                ddp_result r = ddp__check_cancel(ctx, ctx->what);
                if (r != DDP_OK) return r;
                /* (a peer that posted, then failed, is looked at in its collective first) */
                if (__atomic_load_n(&ddp__shm_hdr(ctx)->failed_rank, __ATOMIC_ACQUIRE) >= 0 &&
                    !ddp__reached(__atomic_load_n(&c->value, __ATOMIC_ACQUIRE), target))
                    next_check = 0;
            }
            if (ddp__now() >= next_check) {
                ddp_result r = ddp__shm_check_peers(ctx, stage, target, deadline, first, n);
                if (r != DDP_OK) return r;
                next_check = ddp__now() + DDP__LIVENESS_PERIOD_S;
            }
            __atomic_add_fetch(&c->waiters, 1, __ATOMIC_SEQ_CST);
            seen = __atomic_load_n(&c->value, __ATOMIC_SEQ_CST);
            if (!ddp__reached(seen, target)) ddp__futex_wait(&c->value, seen, 0.02);
            __atomic_sub_fetch(&c->waiters, 1, __ATOMIC_SEQ_CST);
        }
    }
    return DDP_OK;
}

/* Every rank of the span (ddp__span_*) has posted `stage` up to target. */
static ddp_result ddp__shm_wait_all(ddp_context *ctx, int stage, uint32_t target) {
    return ddp__shm_wait_ranks(ctx, stage, target, ddp__span_first(ctx), ddp__span_world(ctx));
}

/* What a rank's posted collective is, in words. */
static const char *ddp__describe_sig(const ddp__shm_sig *sig, char *out, size_t cap) {
    unsigned long long n = (unsigned long long)sig->count;
    const char *avg = sig->kind == DDP__KIND_AVG_BF16 ? "avg, bf16" : "avg";
    switch (sig->kind) {
    case DDP__KIND_SHUTDOWN: snprintf(out, cap, "ddp_shutdown"); break;
    case DDP__KIND_BARRIER: snprintf(out, cap, "a barrier"); break;
    case DDP__KIND_BROADCAST: snprintf(out, cap, "a broadcast of %llu bytes from rank %u", n, sig->root); break;
    case DDP__KIND_SUM: snprintf(out, cap, "an allreduce(sum) of %llu elements", n); break;
    case DDP__KIND_GATHER: snprintf(out, cap, "ddp_adamw_step's all-gather of the updated parameters (shard_optimizer)"); break;
    case DDP__KIND_OUTER: snprintf(out, cap, "the outer exchange's all-gather of %llu bytes a rank (desc.outer)", n); break;
    case DDP__KIND_JOIN: snprintf(out, cap, "the count of the ranks with data (uneven inputs: a step, or ddp_join; "
                                  "no user collective while a rank has joined)"); break;
    case DDP__KIND_AVG: case DDP__KIND_AVG_BF16:
        if (sig->bucket) snprintf(out, cap, "the allreduce(%s) of gradient bucket %u (%llu elements)", avg, sig->bucket - 1, n);
        else snprintf(out, cap, "an allreduce(%s) of %llu elements", avg, n);
        break;
    default: snprintf(out, cap, "collective kind %u", sig->kind); break;
    }
    return out;
}

/* Every rank must be in the same collective: compare what each posted with this rank's. */
static ddp_result ddp__shm_check_sigs(ddp_context *ctx) {
    const ddp__shm_sig *mine = &ddp__shm_block(ctx, ctx->rank)->sig;
    char a[128], b[128];
    int s, first = ddp__span_first(ctx), n = ddp__span_world(ctx);
    for (s = first; s < first + n; s++) {
        const ddp__shm_sig *o = &ddp__shm_block(ctx, s)->sig;
        if (o->id == mine->id && o->kind == mine->kind && o->count == mine->count && o->root == mine->root &&
            o->bucket == mine->bucket)
            continue;
        if (o->kind == DDP__KIND_SHUTDOWN)
            return ddp__fail_group(ctx, DDP_ERR_PEER_LOST, "rank %d called ddp_shutdown while this rank is in %s",
                                   s, ddp__describe_sig(mine, a, sizeof a));
        return ddp__fail_group(ctx, DDP_ERR_MISMATCH, "ranks called different collectives: this rank is in %s "
                               "(collective #%u), rank %d in %s (collective #%u)", ddp__describe_sig(mine, a, sizeof a),
                               mine->id, s, ddp__describe_sig(o, b, sizeof b), o->id);
    }
    return DDP_OK;
}

/* The part of an m-element chunk that rank s reduces: 64-byte aligned, possibly empty. */
static void ddp__part(size_t m, int world, int s, size_t *lo, size_t *hi) {
    size_t part = ddp__round_up((m + (size_t)world - 1) / (size_t)world, DDP__ALIGN_FLOATS);
    *lo = part * (size_t)s < m ? part * (size_t)s : m;
    *hi = *lo + part < m ? *lo + part : m;
}

/* The bf16 average: slots carry bf16; the owner of a part adds every rank's bf16 values in
   float, in rank order, divides, and rounds once more. Its own values are rounded the same way
   first, so the result does not depend on which rank owns the part. */
static void ddp__reduce_part_bf16(ddp_context *ctx, float *buf, size_t lo, size_t hi, uint32_t chunk) {
    uint16_t *acc = (uint16_t *)(void *)ddp__shm_slot(ctx, ctx->rank, chunk) + lo;
    int s, first = ddp__span_first(ctx), span = ddp__span_world(ctx);
    float w = (float)span;
    size_t j, n = hi - lo;
    for (j = 0; j < n; j++) {
        float sum = 0;
        for (s = first; s < first + span; s++) {
            float x = s == ctx->rank ? ddp__from_bf16(ddp__to_bf16(buf[lo + j]))
                                     : ddp__from_bf16(((const uint16_t *)(void *)ddp__shm_slot(ctx, s, chunk))[lo + j]);
            sum = s == first ? x : sum + x;
        }
        acc[j] = ddp__to_bf16(sum / w);
        buf[lo + j] = ddp__from_bf16(acc[j]);
    }
}

/* x / w for a rank count w. Where w is a power of two, 1/w is exact and x * (1/w) is the same
   correctly rounded x / w, bit for bit, at a fraction of a division's cost (a vector division
   was the largest part of averaging a bucket in cache). */
static float ddp__div_world(float x, float w) {
    int k = (int)w;
    return (k & (k - 1)) ? x / w : x * (1.0f / w);
}

static void ddp__reduce_part(ddp_context *ctx, float *buf, size_t lo, size_t hi, uint32_t chunk, uint32_t kind) {
    float *acc = (float *)ddp__shm_slot(ctx, ctx->rank, chunk) + lo;
    const float *src[2];
    size_t j, n = hi - lo;
    int s, first = ddp__span_first(ctx), span = ddp__span_world(ctx);
    if (!n) return;
    src[0] = ctx->rank == first ? buf + lo : (const float *)ddp__shm_slot(ctx, first, chunk) + lo;
    src[1] = ctx->rank == first + 1 ? buf + lo : (const float *)ddp__shm_slot(ctx, first + 1, chunk) + lo;
    for (j = 0; j < n; j++) acc[j] = src[0][j] + src[1][j];
    for (s = first + 2; s < first + span; s++) {
        const float *x = s == ctx->rank ? buf + lo : (const float *)ddp__shm_slot(ctx, s, chunk) + lo;
        for (j = 0; j < n; j++) acc[j] += x[j];
    }
    if (kind == DDP__KIND_AVG && !(span & (span - 1))) {   /* see ddp__div_world */
        float inv = 1.0f / (float)span;
        for (j = 0; j < n; j++) acc[j] *= inv;
    } else if (kind == DDP__KIND_AVG) {
        float w = (float)span;
        for (j = 0; j < n; j++) acc[j] /= w;
    }
    memcpy(buf + lo, acc, n * sizeof(float));
}

static void ddp__stage_in(ddp_context *ctx, uint32_t kind, unsigned char *buf, size_t m, int root, uint32_t chunk) {
    unsigned char *slot = ddp__shm_slot(ctx, ctx->rank, chunk);
    int s, first = ddp__span_first(ctx), n = ddp__span_world(ctx);
    if (kind == DDP__KIND_AVG_BF16) {
        for (s = 0; s < n; s++) {
            size_t lo, hi, j;
            ddp__part(m, n, s, &lo, &hi);
            if (first + s == ctx->rank) continue;
            for (j = lo; j < hi; j++) ((uint16_t *)(void *)slot)[j] = ddp__to_bf16(((const float *)(void *)buf)[j]);
        }
    } else if (kind == DDP__KIND_BROADCAST) {
        if (ctx->rank == root) memcpy(slot, buf, m);
    } else if (kind != DDP__KIND_BARRIER) {
        for (s = 0; s < n; s++) {
            size_t lo, hi;
            ddp__part(m, n, s, &lo, &hi);
            if (first + s != ctx->rank && hi > lo) memcpy(slot + lo * 4, buf + lo * 4, (hi - lo) * 4);
        }
    }
}

static void ddp__stage_out(ddp_context *ctx, uint32_t kind, unsigned char *buf, size_t m, int root, uint32_t chunk) {
    int s, first = ddp__span_first(ctx), n = ddp__span_world(ctx);
    if (kind == DDP__KIND_AVG_BF16) {
        for (s = 0; s < n; s++) {
            const uint16_t *sums = (const uint16_t *)(void *)ddp__shm_slot(ctx, first + s, chunk);
            size_t lo, hi, j;
            ddp__part(m, n, s, &lo, &hi);
            if (first + s == ctx->rank) continue;
            for (j = lo; j < hi; j++) ((float *)(void *)buf)[j] = ddp__from_bf16(sums[j]);
        }
    } else if (kind == DDP__KIND_BROADCAST) {
        if (ctx->rank != root) memcpy(buf, ddp__shm_slot(ctx, root, chunk), m);
    } else if (kind != DDP__KIND_BARRIER) {
        for (s = 0; s < n; s++) {
            size_t lo, hi;
            ddp__part(m, n, s, &lo, &hi);
            if (first + s != ctx->rank && hi > lo) memcpy(buf + lo * 4, ddp__shm_slot(ctx, first + s, chunk) + lo * 4, (hi - lo) * 4);
        }
    }
}

/* A gradient bucket's exchange, or the count of the ranks with data (uneven inputs), is one a
   straggler holds up: this rank's arrival goes into its block before it posts, and once every
   rank has posted (the first wait) all arrivals are there, on one clock (the segment's ranks share
   a host), and stay until this rank posts the exchange's next stage. */
static int ddp__cpu_counts_arrival(ddp_context *ctx, uint32_t kind) {
    return ctx->world > 1 && (ctx->impl.cpu->sig_bucket || kind == DDP__KIND_JOIN);
}

static void ddp__cpu_arrivals(ddp_context *ctx, double mine) {
    double first = mine, last = mine;
    int s, last_rank = ctx->rank, bucket = (int)ctx->impl.cpu->sig_bucket - 1, first_rank = ddp__span_first(ctx);
    for (s = first_rank; s < first_rank + ddp__span_world(ctx); s++) {   /* the team's, for a bucket */
        double t = ddp__shm_block(ctx, s)->arrived;
        if (t < first) first = t;
        if (t > last) { last = t; last_rank = s; }
    }
    ddp__straggle_note(ctx, &ctx->impl.cpu->straggle, bucket >= 0 ? ctx->tl.comm : ctx->tl.main, bucket,
                       mine, last - mine, last - first, last_rank);
}

/* Benchmarks and tests stand a slow network in for shared memory: sleep what the transfer
   would have cost beyond the time it took. */
static void ddp__inject_comm_delay(ddp_context *ctx, size_t bytes, double started) {
    double want = 1e-3 * ctx->desc.inject_comm_latency_ms;
    if (ctx->desc.inject_comm_gbps > 0) want += (double)bytes / (ctx->desc.inject_comm_gbps * 1e9);
    ddp__sleep_s(want - (ddp__now() - started));
}

/* One collective over the segment; count is in floats for reductions, bytes for broadcast. */
static ddp_result ddp__shm_collective(ddp_context *ctx, uint32_t kind, void *data, size_t count, int root) {
    ddp__shm_sig *sig = &ddp__shm_block(ctx, ctx->rank)->sig;
    int reduces = kind == DDP__KIND_SUM || kind == DDP__KIND_AVG || kind == DDP__KIND_AVG_BF16 || kind == DDP__KIND_JOIN;
    size_t unit = reduces ? sizeof(float) : 1;                              /* in the user's buffer */
    size_t wire = kind == DDP__KIND_AVG_BF16 ? sizeof(uint16_t) : unit;     /* in the slots */
    size_t per_chunk = DDP__CHUNK_BYTES / wire, done = 0;
    unsigned char *buf = (unsigned char *)data;
    int first = 1, arrival = ddp__cpu_counts_arrival(ctx, kind);
    double started = ddp__now();
    if (ddp__failed(ctx)) return ddp__failed(ctx);
    sig->id = ++ctx->impl.cpu->shm_collectives;
    sig->kind = kind;
    sig->root = (uint32_t)root;
    sig->bucket = ctx->impl.cpu->sig_bucket;
    sig->count = count;
    if (arrival) ddp__shm_block(ctx, ctx->rank)->arrived = started;
    do {
        uint32_t q = ctx->impl.cpu->shm_seq;
        size_t m = count - done < per_chunk ? count - done : per_chunk;
        size_t lo, hi;
        unsigned char *at = buf ? buf + done * unit : buf;   /* an empty collective may have no buffer */
        /* slot q's last chunk, q - DDP__SLOTS, done by every rank that read it: the span's, or
           the world's where a chunk that spanned the world may have held it */
        ddp_result r = ddp__reached(ctx->impl.cpu->world_end, q + 1 - DDP__SLOTS)
                       ? ddp__shm_wait_ranks(ctx, DDP__STAGE_OUT, q + 1 - DDP__SLOTS, 0, ctx->world)
                       : ddp__shm_wait_all(ctx, DDP__STAGE_OUT, q + 1 - DDP__SLOTS);
        if (r != DDP_OK) return r;
        ddp__stage_in(ctx, kind, at, m, root, q);
        ddp__shm_post(ctx, DDP__STAGE_IN, q + 1);
        if ((r = ddp__shm_wait_all(ctx, DDP__STAGE_IN, q + 1)) != DDP_OK) return r;
        if (first && (r = ddp__shm_check_sigs(ctx)) != DDP_OK) return r;
        if (first && arrival) ddp__cpu_arrivals(ctx, started);
        if (reduces) {
            ddp__part(m, ddp__span_world(ctx), ctx->rank - ddp__span_first(ctx), &lo, &hi);
            if (kind == DDP__KIND_AVG_BF16) ddp__reduce_part_bf16(ctx, (float *)(void *)at, lo, hi, q);
            else ddp__reduce_part(ctx, (float *)(void *)at, lo, hi, q, kind);
        }
        ddp__shm_post(ctx, DDP__STAGE_RED, q + 1);
        if ((r = ddp__shm_wait_all(ctx, DDP__STAGE_RED, q + 1)) != DDP_OK) return r;
        ddp__stage_out(ctx, kind, at, m, root, q);
        ddp__shm_post(ctx, DDP__STAGE_OUT, q + 1);
        ctx->impl.cpu->shm_seq = q + 1;
        if (!ctx->impl.cpu->team) ctx->impl.cpu->world_end = q + 1;
        done += m;
        first = 0;
    } while (done < count);
    if (reduces && (ctx->desc.inject_comm_latency_ms > 0 || ctx->desc.inject_comm_gbps > 0))
        ddp__inject_comm_delay(ctx, count * wire, started);
    return DDP_OK;
}

/* --------------------------------------------------------------------------------------------
   >>cpu-grads  Gradient buckets in place. With more than one rank every rank's flat gradient buffer lives in
   one more shared segment (ddp__grads_share), so a bucket needs no staging: each rank averages
   its part straight from every rank's buffer (in rank order, the same arithmetic as the staged
   path, so the same bits), writes it into its own buffer, and then copies the other ranks'
   parts from theirs. With bf16 parameters the buffers hold the bf16 gradients (2 bytes an
   element), summed in float and rounded once. Per rank that reads 1.5 and writes 1 bucket's
   worth of memory where the staged path moves 2 and 2. It waits for its peers once per bucket
   (my gradients are final), once per DDP__INPLACE_CHUNK_BYTES of the bucket (my part of that
   chunk is averaged; a rank averages chunk k before it copies the peers' parts of chunk k - 1,
   so it rarely waits and copies sums still in the peer's cache: one pass over a 25 MiB bucket
   ran from memory at ~0.5 of the speed), and once per step in ddp_finish (every rank has copied
   its parts from me), instead of three times per 256 KiB chunk. Both matter when compute keeps
   every core busy: the reduction's CPU time and each wake-up come straight out of the step.
   -------------------------------------------------------------------------------------------- */
static float *ddp__rank_grads(ddp_context *ctx, int s) { return (float *)(void *)ctx->impl.cpu->grads_shm + (size_t)s * ctx->impl.cpu->grads_stride; }

/* Gradients in the segment are bf16 with bf16 parameters: element j of rank s's buffer. */
static ddp_bf16 *ddp__rank_grads_bf16(ddp_context *ctx, int s) { return (ddp_bf16 *)(void *)ddp__rank_grads(ctx, s); }

/* The bf16 average of `world` (2 or more) ranks' n values, rank s's at x + s * stride: each
   element's values added in float in rank order (exact widening, the sum the fp32 path
   computes), divided by world and rounded once into out (which may be one rank's own values):
   the bits the fp32 staging gave, for either reduce_dtype. The CPU backend's in-place buckets
   and the MPI backend's owners of a part (>>mpi) both reduce through it. */
static void ddp__average_bf16(const ddp_bf16 *x, size_t stride, int world, size_t n, ddp_bf16 *out) {
    const ddp_bf16 *a = x, *b = x + stride;
    float w = (float)world;
    size_t j;
    int s;
    if (world == 2) {   /* no inner loop: the compiler vectorizes it */
        for (j = 0; j < n; j++) out[j] = ddp__to_bf16((ddp__from_bf16(a[j]) + ddp__from_bf16(b[j])) * 0.5f);   /* = / 2 */
        return;
    }
    for (j = 0; j < n; j += DDP__AVG_BLOCK) {   /* a block at a time, each rank's values in turn: vectorized */
        float sum[DDP__AVG_BLOCK];
        size_t i, m = n - j < DDP__AVG_BLOCK ? n - j : DDP__AVG_BLOCK;
        for (i = 0; i < m; i++) sum[i] = ddp__from_bf16(a[j + i]) + ddp__from_bf16(b[j + i]);
        for (s = 2; s < world; s++) {
            const ddp_bf16 *y = x + (size_t)s * stride + j;
            for (i = 0; i < m; i++) sum[i] += ddp__from_bf16(y[i]);
        }
        for (i = 0; i < m; i++) out[j + i] = ddp__to_bf16(ddp__div_world(sum[i], w));
    }
}

/* The fp32 average of `world` (2 or more) ranks' n values, rank s's at x + s * stride: added in
   rank order, divided by world (ddp__div_world), into out (which may be one rank's own values):
   the staged path's bits. The CPU backend's in-place buckets and the MPI backend's owners of a
   part with replica groups (>>mpi) both reduce through it. */
static void ddp__average_f32(const float *x, size_t stride, int world, size_t n, float *out) {
    const float *a = x, *b = x + stride;
    float w = (float)world;
    size_t j;
    int s;
    if (world == 2) {   /* the common case: a loop without an inner one, which the compiler vectorizes */
        for (j = 0; j < n; j++) out[j] = (a[j] + b[j]) * 0.5f;   /* = / 2 (ddp__div_world) */
        return;
    }
    for (j = 0; j < n; j += DDP__AVG_BLOCK) {   /* a block at a time, each rank's values in turn: vectorized */
        float sum[DDP__AVG_BLOCK];
        size_t i, m = n - j < DDP__AVG_BLOCK ? n - j : DDP__AVG_BLOCK;
        for (i = 0; i < m; i++) sum[i] = a[j + i] + b[j + i];
        for (s = 2; s < world; s++) {
            const float *y = x + (size_t)s * stride + j;
            for (i = 0; i < m; i++) sum[i] += y[i];
        }
        for (i = 0; i < m; i++) out[j + i] = ddp__div_world(sum[i], w);
    }
}

/* This rank's part [lo, hi) of the chunk at offset, averaged over the team (ddp__team_*: its
   members' buffers follow one another in the segment, grads_stride floats apart; bf16
   gradients: 2 * grads_stride bf16). */
static void ddp__average_part_in_place(ddp_context *ctx, size_t offset, size_t lo, size_t hi) {
    int first = ddp__team_peer(ctx, 0), n = ddp__team_world(ctx);
    if (ctx->flat.grads_bf16)
        ddp__average_bf16(ddp__rank_grads_bf16(ctx, first) + offset + lo, 2 * ctx->impl.cpu->grads_stride, n, hi - lo,
                          ddp__rank_grads_bf16(ctx, ctx->rank) + offset + lo);
    else ddp__average_f32(ddp__rank_grads(ctx, first) + offset + lo, ctx->impl.cpu->grads_stride, n, hi - lo,
                          ddp__rank_grads(ctx, ctx->rank) + offset + lo);
}

/* Hybrid sharding (desc.shard_group): bucket b reduce-scattered into the shard group's parts
   (ddp__shard_range), each averaged over the WORLD: the G = world / S ranks that hold part s
   (member s of every group) split it G ways; holder g adds its piece of every rank's buffer in
   rank order (the unsharded in-place bits: element by element the same sum, the same division)
   into its own buffer, and once every rank has posted that, copies the other holders' pieces
   from theirs. On one host the groups share the segment, so the cross-group allreduce is those
   copies. The peers copy from this rank's buffer after this returns: ddp_finish waits for them
   (out_pending), as for an unsharded bucket. The span (c->team 0) is the world. */
static ddp_result ddp__hybrid_bucket_in_place(ddp_context *ctx, size_t offset, size_t count, int bucket, uint32_t q,
                                              double started) {
    size_t lo, hi, a, z, es = ctx->flat.grads_bf16 ? sizeof(ddp_bf16) : sizeof(float);
    int g, groups = ctx->world / ctx->shard.hybrid, me = ctx->rank / ctx->shard.hybrid, s = ddp__team_rank(ctx);
    ddp_result r;
    ddp__shard_range(ctx, bucket, s, &lo, &hi);
    ddp__part(hi - lo, groups, me, &a, &z);
    if (z > a && ctx->flat.grads_bf16)
        ddp__average_bf16(ddp__rank_grads_bf16(ctx, 0) + lo + a, 2 * ctx->impl.cpu->grads_stride, ctx->world, z - a,
                          ddp__rank_grads_bf16(ctx, ctx->rank) + lo + a);
    else if (z > a) ddp__average_f32(ddp__rank_grads(ctx, 0) + lo + a, ctx->impl.cpu->grads_stride, ctx->world, z - a,
                                     ddp__rank_grads(ctx, ctx->rank) + lo + a);
    ddp__shm_post(ctx, DDP__STAGE_RED, q + 1);
    if ((r = ddp__shm_wait_all(ctx, DDP__STAGE_RED, q + 1)) != DDP_OK) return r;
    /* from here no rank reads this rank's buffer outside its part [lo, hi) (the holders copy from it) */
    for (g = 0; g < groups; g++) {   /* the other holders' pieces of part s */
        if (g == me) continue;
        ddp__part(hi - lo, groups, g, &a, &z);
        if (z > a) memcpy((unsigned char *)ddp__rank_grads(ctx, ctx->rank) + (lo + a) * es,
                          (unsigned char *)ddp__rank_grads(ctx, g * ctx->shard.hybrid + s) + (lo + a) * es, (z - a) * es);
    }
    ddp__shm_post(ctx, DDP__STAGE_OUT, q + 1);
    ctx->impl.cpu->out_pending = q + 1;
    ctx->impl.cpu->shm_seq = q + 1;
    (void)offset;
    if (ctx->desc.inject_comm_latency_ms > 0 || ctx->desc.inject_comm_gbps > 0)
        ddp__inject_comm_delay(ctx, count * ddp__wire_bytes(ctx), started);
    return DDP_OK;
}

/* A bucket averaged in place: an allreduce, or with bucket >= 0 (sharded) a reduce-scatter into
   the parts ddp__shard_range gives. */
static ddp_result ddp__shm_bucket_in_place(ddp_context *ctx, size_t offset, size_t count, int bucket) {
    ddp__shm_sig *sig = &ddp__shm_block(ctx, ctx->rank)->sig;
    uint32_t q = ctx->impl.cpu->shm_seq;
    size_t lo, hi, per, es = ctx->flat.grads_bf16 ? sizeof(ddp_bf16) : sizeof(float);   /* the gradients' element */
    uint32_t k, chunks;
    int s;
    ddp_result r;
    double started = ddp__now();
    if (ddp__failed(ctx)) return ddp__failed(ctx);
    sig->id = ++ctx->impl.cpu->shm_collectives;
    sig->kind = ddp__grad_kind(ctx);
    sig->root = 0;
    sig->bucket = ctx->impl.cpu->sig_bucket;
    sig->count = count;
    ddp__shm_block(ctx, ctx->rank)->arrived = started;
    ddp__shm_post(ctx, DDP__STAGE_IN, q + 1);                 /* my gradients are final */
    if ((r = ddp__shm_wait_all(ctx, DDP__STAGE_IN, q + 1)) != DDP_OK) return r;
    if ((r = ddp__shm_check_sigs(ctx)) != DDP_OK) return r;
    ddp__cpu_arrivals(ctx, started);
    if (bucket >= 0 && ddp__hybrid(ctx)) return ddp__hybrid_bucket_in_place(ctx, offset, count, bucket, q, started);
    if (bucket >= 0) {   /* sharded: a reduce-scatter; each rank's part is where its AdamW needs it */
        ddp__shard_range(ctx, bucket, ddp__team_rank(ctx), &lo, &hi);
        ddp__average_part_in_place(ctx, offset, lo - offset, hi - offset);
        ddp__shm_post(ctx, DDP__STAGE_RED, q + 1);
        /* every rank has read my buffer once all have averaged: then it may change */
        if ((r = ddp__shm_wait_all(ctx, DDP__STAGE_RED, q + 1)) != DDP_OK) return r;
        ddp__shm_post(ctx, DDP__STAGE_OUT, q + 1);
        ctx->impl.cpu->shm_seq = q + 1;
        if (ctx->desc.inject_comm_latency_ms > 0 || ctx->desc.inject_comm_gbps > 0)
            ddp__inject_comm_delay(ctx, count * ddp__wire_bytes(ctx), started);
        return DDP_OK;
    }
    per = DDP__INPLACE_CHUNK_BYTES / es;
    chunks = count ? (uint32_t)((count + per - 1) / per) : 1;
    for (k = 0; k <= chunks; k++) {   /* average chunk k, then copy out chunk k - 1 */
        if (k < chunks) {
            size_t c0 = (size_t)k * per, m = count - c0 < per ? count - c0 : per;
            ddp__part(m, ddp__team_world(ctx), ddp__team_rank(ctx), &lo, &hi);
            ddp__average_part_in_place(ctx, offset + c0, lo, hi);
            ddp__shm_post(ctx, DDP__STAGE_RED, q + 1 + k);
        }
        if (k > 0) {
            size_t c0 = (size_t)(k - 1) * per, m = count - c0 < per ? count - c0 : per;
            if ((r = ddp__shm_wait_all(ctx, DDP__STAGE_RED, q + k)) != DDP_OK) return r;
            for (s = 0; s < ddp__team_world(ctx); s++) {   /* the team's other members' parts */
                if (s == ddp__team_rank(ctx)) continue;
                ddp__part(m, ddp__team_world(ctx), s, &lo, &hi);
                if (hi > lo) memcpy((unsigned char *)ddp__rank_grads(ctx, ctx->rank) + (offset + c0 + lo) * es,
                                    (unsigned char *)ddp__rank_grads(ctx, ddp__team_peer(ctx, s)) + (offset + c0 + lo) * es,
                                    (hi - lo) * es);
            }
        }
    }
    ddp__shm_post(ctx, DDP__STAGE_OUT, q + chunks);
    /* Until every rank has copied my part, my buffer must not change. Within the step nothing
       writes this bucket again, so the next bucket need not wait for that: ddp_finish does, once,
       before the program may zero or accumulate into its gradients (ddp__cpu_finish). */
    ctx->impl.cpu->out_pending = q + chunks;
    ctx->impl.cpu->shm_seq = q + chunks;
    if (ctx->desc.inject_comm_latency_ms > 0 || ctx->desc.inject_comm_gbps > 0)
        ddp__inject_comm_delay(ctx, count * ddp__wire_bytes(ctx), started);
    return DDP_OK;
}

/* bf16 gradients without the segment (DDP_STAGED_GRADS, no room in /dev/shm): the bucket
   widened (exactly) into one bucket's floats, averaged through the staging slots as an fp32
   model's bucket, rounded back: the in-place path's bits (the slots' bf16 average adds in float in
   rank order and rounds once; the fp32 one is rounded once here). Sharded, the whole bucket. */
static ddp_result ddp__shm_bucket_staged_bf16(ddp_context *ctx, size_t offset, size_t count) {
    float *f = ctx->impl.cpu->bucket_f32;
    ddp_bf16 *g = ctx->flat.grads_bf16 + offset;
    size_t j;
    ddp_result r;
    for (j = 0; j < count; j++) f[j] = ddp__from_bf16(g[j]);
    if ((r = ddp__shm_collective(ctx, ddp__grad_kind(ctx), f, count, 0)) != DDP_OK) return r;
    for (j = 0; j < count; j++) g[j] = ddp__to_bf16(f[j]);
    return DDP_OK;
}

/* Segments are named after the creating pid, so a segment whose creator is gone belongs to a
   crashed job and can go. (A healthy job unlinks its segment as soon as every rank has it
   mapped, so normally nothing is left in /dev/shm at all.) Rank 0 sweeps before it creates
   one, and every rank after a failure: a rank 0 killed between creating a segment and its
   peers' mapping it leaves it behind. (Windows: nothing to sweep, >>platform.) */
static void ddp__shm_sweep_stale(ddp_context *ctx) {
    char removed[512];
    ddp__seg_sweep_stale(removed, sizeof removed);
    if (removed[0]) ddp__log(ctx, DDP_LOG_INFO, "removed %s left by a crashed job", removed);
}

/* A new owner-only segment of `bytes` under a fresh name "/ddp-PID-NONCE" (the pid lets a later
   job sweep it if this one crashes before unlinking it), mapped at *out. */
static ddp_result ddp__shm_new(ddp_context *ctx, char name[64], size_t bytes, unsigned char **out) {
    int attempt, err = EEXIST;
    int stage = DDP__SEG_CREATE;
    for (attempt = 0; attempt < 16 && err == EEXIST; attempt++) {
        unsigned nonce = (unsigned)(uint64_t)(ddp__now() * 1e9) ^ ((unsigned)(uintptr_t)name * 2654435761u) ^ (unsigned)attempt;
        snprintf(name, 64, DDP__SEG_PREFIX "%d-%08x", ddp__getpid(), nonce);
        err = ddp__seg_create(name, bytes, out, &stage);
    }
    if (err && stage == DDP__SEG_CREATE)
        return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot create shared memory %s: %s", name, ddp__strerror(err));
    if (err && stage == DDP__SEG_RESERVE)
        return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot reserve %zu bytes of shared memory for %s (/dev/shm too small or "
                         "full? a container's default is 64 MiB: docker run --shm-size): %s", bytes, name, ddp__strerror(err));
    if (err)
        return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot map shared memory %s (%zu bytes): %s", name, bytes, ddp__strerror(err));
    return DDP_OK;
}

static ddp_result ddp__shm_create(ddp_context *ctx) {
    size_t bytes = ddp__shm_size(ctx->world);
    ddp__shm_header *h;
    int s;
    ddp_result r;
    ddp__shm_sweep_stale(ctx);
    if ((r = ddp__shm_new(ctx, ctx->impl.cpu->shm_name, bytes, &ctx->impl.cpu->shm)) != DDP_OK) return r;
    ctx->impl.cpu->shm_bytes = bytes;
    h = ddp__shm_hdr(ctx);
    h->world = (uint32_t)ctx->world;
    h->slots = DDP__SLOTS;
    h->chunk_bytes = DDP__CHUNK_BYTES;
    h->total_bytes = bytes;
    h->failed_rank = -1;
    h->origin = ctx->tl.origin;
    for (s = 0; s < ctx->world; s++) ddp__shm_block(ctx, s)->pid = 0;
    __atomic_store_n(&h->magic, DDP__SHM_MAGIC, __ATOMIC_RELEASE);
    return DDP_OK;
}

static ddp_result ddp__shm_attach(ddp_context *ctx, const char *name) {
    size_t bytes = ddp__shm_size(ctx->world);
    ddp__shm_header *h;
    int stage, err;
    snprintf(ctx->impl.cpu->shm_name, sizeof ctx->impl.cpu->shm_name, "%s", name);
    err = ddp__seg_open(ctx->impl.cpu->shm_name, bytes, &ctx->impl.cpu->shm, &stage);
    if (err == DDP__SEG_WRONG_SIZE)
        return ddp__fail(ctx, DDP_ERR_MISMATCH, "rank 0's shared memory %s has the wrong size (a different ddp.h "
                         "version or world size?)", name);
    if (err && stage == DDP__SEG_OPEN)
        return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot open rank 0's shared memory %s: %s "
                         "(are all ranks on one host?)", name, ddp__strerror(err));
    if (err) return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot map shared memory %s (%zu bytes): %s", name, bytes, ddp__strerror(err));
    ctx->impl.cpu->shm_bytes = bytes;
    h = ddp__shm_hdr(ctx);
    if (h->magic != DDP__SHM_MAGIC || h->world != (uint32_t)ctx->world || h->chunk_bytes != DDP__CHUNK_BYTES)
        return ddp__fail(ctx, DDP_ERR_MISMATCH, "rank 0's shared memory %s was made by a different ddp.h version", name);
    return DDP_OK;
}

/* Tests only: built with DDP_TEST_KILL_POINTS, DDP_TEST_KILL_AT=POINT:RANK SIGKILLs that rank at
   that point (tests/test_failures.sh checks what a kill there leaves behind). */
#ifdef DDP_TEST_KILL_POINTS
static void ddp__kill_point(const ddp_context *ctx, const char *point) {
    const char *at = getenv("DDP_TEST_KILL_AT"), *colon = at ? strrchr(at, ':') : NULL;
    size_t n = strlen(point);
    if (colon && (size_t)(colon - at) == n && !strncmp(at, point, n) && atoi(colon + 1) == ctx->rank) ddp__kill_self();
}
#else
#define ddp__kill_point(ctx, point) ((void)(ctx))
#endif

/* Rank 0 creates the segment and publishes its name; once everyone has it mapped it is
   unlinked, so a crash from here on leaves nothing behind. */
static ddp_result ddp__shm_setup(ddp_context *ctx, double deadline) {
    ddp_result r;
    if (ctx->rank == 0) {
        if ((r = ddp__shm_create(ctx)) != DDP_OK) return r;
        ddp__kill_point(ctx, "shm-created");
        if ((r = ddp__store_set(ctx, "shm", ctx->impl.cpu->shm_name, strlen(ctx->impl.cpu->shm_name))) != DDP_OK) return r;
        ddp__kill_point(ctx, "shm-published");
    } else {
        unsigned char *name;
        uint32_t len;
        if ((r = ddp__fetch_from_rank0(ctx, "shm", "its shared memory", deadline, &name, &len)) != DDP_OK) return r;
        r = ddp__shm_attach(ctx, (const char *)name);
        DDP_FREE(name);
        if (r != DDP_OK) return r;
    }
    __atomic_store_n(&ddp__shm_block(ctx, ctx->rank)->tid, (int32_t)ddp__thread_id(), __ATOMIC_RELEASE);
    __atomic_store_n(&ddp__shm_block(ctx, ctx->rank)->pid, (int32_t)ddp__getpid(), __ATOMIC_RELEASE);
    ctx->tl.origin = ddp__shm_hdr(ctx)->origin;   /* one clock (CLOCK_MONOTONIC), one zero */
    ctx->impl.cpu->spin_seconds = ctx->local_world > ddp__cpu_count() ? DDP__SPIN_SECONDS_OVERSUBSCRIBED : DDP__SPIN_SECONDS;
    ctx->what = "the shared-memory handshake";
    r = ddp__shm_collective(ctx, DDP__KIND_BARRIER, NULL, 0, 0);
    if (ctx->rank == 0) ddp__seg_unlink(ctx->impl.cpu->shm_name);
    return r;
}

/* Rank 0's part: make the gradient segment, or settle on the staged path (asked for with
   DDP_STAGED_GRADS, or no room in /dev/shm, which costs speed only), and publish the choice: a
   segment name, or "" for the staged path. Returns the segment mapped, or NULL for the staged path. */
static unsigned char *ddp__grads_create(ddp_context *ctx, size_t bytes, ddp_result *r) {
    char eb[DDP__ERR_MAX];
    const char *staged = getenv("DDP_STAGED_GRADS");
    unsigned char *seg = NULL;
    ctx->impl.cpu->grads_name[0] = 0;
    if (!staged || !*staged || !strcmp(staged, "0")) {
        if (ddp__shm_new(ctx, ctx->impl.cpu->grads_name, bytes, &seg) != DDP_OK) {
            seg = NULL;
            ddp__log(ctx, DDP_LOG_WARN, "%s; gradient buckets go through the staging slots instead (slower)",
                     ddp__err_body(ctx, eb));
            ctx->impl.cpu->grads_name[0] = 0;
            ctx->err[0] = 0;
        }
    }
    *r = ddp__store_set(ctx, "grads", ctx->impl.cpu->grads_name, strlen(ctx->impl.cpu->grads_name));
    if (*r != DDP_OK && seg) { ddp__seg_unmap(seg, bytes); seg = NULL; }   /* the name stays: shutdown unlinks it */
    return seg;
}

/* At commit (world > 1, CPU backend): rank 0 makes the gradient segment, one page-aligned
   buffer per rank, and publishes its name; every rank maps it and uses its own buffer as
   ddp_flat_grads (bf16 parameters: ddp_flat_grads_bf16, 2 bytes an element). A fresh segment
   reads as zeros, like a fresh gradient buffer. Rank 0 unlinks it once every rank has it mapped
   (ddp__grads_unlink, after the next collective). */
static ddp_result ddp__grads_share(ddp_context *ctx, double deadline) {
    size_t page = ddp__page_size(), bytes;
    /* sharded: the parameters too (the all-gather); ZeRO-3 always (its gathers copy from there,
       even in replica groups of one rank, where each rank's part is everything) */
    int copies = ddp__sharded(ctx) || ddp__z3_seed_deferred(ctx) ? 2 : 1;
    unsigned char *p = NULL;
    size_t es = ctx->flat.grads_bf16 || ddp__bf16_params(ctx) ? sizeof(ddp_bf16) : sizeof(float);   /* bf16 parameters: bf16 gradients and copies */
    ctx->impl.cpu->grads_stride = ddp__round_up(ctx->flat.count * es, page) / sizeof(float);
    bytes = ctx->impl.cpu->grads_stride * sizeof(float) * (size_t)ctx->world * (size_t)copies;
    if (ctx->rank == 0) {
        ddp_result r;
        p = ddp__grads_create(ctx, bytes, &r);
        if (r != DDP_OK) return r;
        ddp__kill_point(ctx, "grads-published");
        if (!p) return ddp__z3_seed_deferred(ctx) ? ddp__host_alloc_private(ctx) : DDP_OK;   /* private gradients (and parameters) */
    } else {
        unsigned char *name;
        uint32_t len;
        ddp_result r = ddp__fetch_from_rank0(ctx, "grads", "its gradient segment", deadline, &name, &len);
        if (r != DDP_OK) return r;
        snprintf(ctx->impl.cpu->grads_name, sizeof ctx->impl.cpu->grads_name, "%.*s", (int)len, (const char *)name);
        DDP_FREE(name);
        if (!ctx->impl.cpu->grads_name[0])   /* rank 0 had no room: private gradients everywhere */
            return ddp__z3_seed_deferred(ctx) ? ddp__host_alloc_private(ctx) : DDP_OK;
        {
            int stage, err = ddp__seg_open(ctx->impl.cpu->grads_name, bytes, &p, &stage);
            if (err == DDP__SEG_WRONG_SIZE)
                return ddp__fail(ctx, DDP_ERR_MISMATCH, "rank 0's gradient segment %s has the wrong size", ctx->impl.cpu->grads_name);
            if (err && stage == DDP__SEG_OPEN)
                return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot open rank 0's gradient segment %s: %s", ctx->impl.cpu->grads_name, ddp__strerror(err));
            if (err)
                return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot map the gradient segment %s (%zu bytes): %s", ctx->impl.cpu->grads_name, bytes, ddp__strerror(err));
        }
    }
    ctx->impl.cpu->grads_shm = p;
    ctx->impl.cpu->grads_shm_bytes = bytes;
    if (ddp__z3_seed_deferred(ctx)) {   /* straight into the segment (zeros): ddp__cpu_z3_seed fills this rank's parts */
        ctx->impl.cpu->params_shared = 1;
        if (ctx->flat.grads_bf16 || ddp__bf16_params(ctx)) {   /* the master: this rank's parts, packed, from the start */
            ctx->flat.grads_bf16 = ddp__rank_grads_bf16(ctx, ctx->rank);
            ctx->flat.params_bf16 = (ddp_bf16 *)(void *)ddp__rank_grads(ctx, ctx->world + ctx->rank);
            if (!(ctx->flat.params = ddp__alloc_floats(ctx->shard.count ? ctx->shard.count : 1)))
                return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for %zu floats of the fp32 master", ctx->shard.count);
        } else {
            ctx->flat.grads = ddp__rank_grads(ctx, ctx->rank);
            ctx->flat.params = ddp__rank_grads(ctx, ctx->world + ctx->rank);
        }
        return DDP_OK;
    }
    if (ctx->flat.grads_bf16) {
        ddp__free_floats((float *)(void *)ctx->flat.grads_bf16);
        ctx->flat.grads_bf16 = ddp__rank_grads_bf16(ctx, ctx->rank);
    } else {
        ddp__free_floats(ctx->flat.grads);
        ctx->flat.grads = ddp__rank_grads(ctx, ctx->rank);
    }
    if (copies == 2 && ctx->flat.params_bf16) {   /* bf16: the working copies are what is gathered (filled at commit) */
        ddp__free_floats((float *)(void *)ctx->flat.params_bf16);
        ctx->flat.params_bf16 = (ddp_bf16 *)(void *)ddp__rank_grads(ctx, ctx->world + ctx->rank);
        ctx->impl.cpu->params_shared = 1;
    } else if (copies == 2) {   /* this rank's parameters (its initial values) move into the segment */
        float *mine = ddp__rank_grads(ctx, ctx->world + ctx->rank);
        memcpy(mine, ctx->flat.params, ctx->flat.count * sizeof(float));
        ddp__free_floats(ctx->flat.params);
        ctx->flat.params = mine;
        ctx->impl.cpu->params_shared = 1;
    }
    return DDP_OK;
}

static void ddp__grads_unlink(ddp_context *ctx) {
    if (ctx->rank == 0 && ctx->impl.cpu->grads_name[0]) ddp__seg_unlink(ctx->impl.cpu->grads_name);
    ctx->impl.cpu->grads_name[0] = 0;
}

/* Sharded AdamW (desc.shard_optimizer). The buckets were reduce-scattered: this rank's part of
   each holds the average, the rest its own gradients. (1) The norm: each rank sums the norm
   blocks of its parts, every rank's blocks reach every rank (one broadcast per rank of its block
   array, nothing added on the way, so exact), and each adds all blocks in ddp__norm_sum's
   fixed order: the same bits as unsharded. (2) Each rank updates its part of bucket 0, 1, ... and posts each as done;
   (3) one bucket behind, it copies the peers' parts of the bucket before from their parameters
   in the segment (the all-gather), so the copies of early buckets overlap the peers' updates of
   later ones. Without the segment (no room in /dev/shm, DDP_STAGED_GRADS) the parts travel by
   broadcast. Before returning every rank waits until all have copied from it: the program may
   write its parameters next. bf16 parameters: the parts gathered are the bf16 working copies (in
   the segment in place of fp32 parameters), half the bytes; the fp32 master stays in parts. */
static float *ddp__rank_params(ddp_context *ctx, int s) { return ddp__rank_grads(ctx, ctx->world + s); }

static ddp_result ddp__cpu_norm_exchange(ddp_context *ctx) {
    size_t bytes = ctx->shard.norm_blocks * sizeof(double), lo, hi;
    ddp_result r;
    int s, b;
    if (!ctx->impl.cpu->norm_recv && !(ctx->impl.cpu->norm_recv = (double *)ddp__calloc(bytes ? bytes : 1)))
        return ddp__fail_group(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for the gradient norm's blocks");
    ctx->what = "ddp_adamw_step's exchange of the gradient norm's blocks (shard_optimizer)";
    for (s = 0; s < ddp__team_world(ctx); s++) {   /* the team's members (c->team: the caller's) */
        if (s == ddp__team_rank(ctx)) {
            if ((r = ddp__shm_collective(ctx, DDP__KIND_BROADCAST, ctx->shard.norm_sums, bytes, ctx->rank)) != DDP_OK) return r;
            continue;
        }
        if ((r = ddp__shm_collective(ctx, DDP__KIND_BROADCAST, ctx->impl.cpu->norm_recv, bytes, ddp__team_peer(ctx, s))) != DDP_OK) return r;
        for (b = 0; b < ctx->model.num_buckets; b++) {
            size_t first, end, off = ctx->model.buckets[b].offset;
            ddp__shard_range(ctx, b, s, &lo, &hi);
            first = ctx->shard.norm_base[b] + (lo - off) / DDP__SHARD_GRAIN;
            end = ctx->shard.norm_base[b] + (hi - off + DDP__SHARD_GRAIN - 1) / DDP__SHARD_GRAIN;
            if (end > first) memcpy(ctx->shard.norm_sums + first, ctx->impl.cpu->norm_recv + first, (end - first) * sizeof(double));
        }
    }
    return DDP_OK;
}

/* The peers' parts of bucket b, once each has posted it (sequence number q). */
static ddp_result ddp__cpu_gather_bucket(ddp_context *ctx, int b, uint32_t q, int first) {
    size_t lo, hi;
    ddp_result r;
    int s;
    if ((r = ddp__shm_wait_all(ctx, DDP__STAGE_IN, q + 1)) != DDP_OK) return r;
    if (first && (r = ddp__shm_check_sigs(ctx)) != DDP_OK) return r;
    for (s = 0; s < ddp__team_world(ctx); s++) {   /* the team's members */
        if (s == ddp__team_rank(ctx)) continue;
        ddp__shard_range(ctx, b, s, &lo, &hi);
        if (hi > lo && ctx->flat.params_bf16)
            memcpy(ctx->flat.params_bf16 + lo, (ddp_bf16 *)(void *)ddp__rank_params(ctx, ddp__team_peer(ctx, s)) + lo,
                   (hi - lo) * sizeof(ddp_bf16));
        else if (hi > lo) memcpy(ctx->flat.params + lo, ddp__rank_params(ctx, ddp__team_peer(ctx, s)) + lo, (hi - lo) * sizeof(float));
    }
    ddp__shm_post(ctx, DDP__STAGE_RED, q + 1);
    ddp__shm_post(ctx, DDP__STAGE_OUT, q + 1);
    return DDP_OK;
}

/* Replica groups: the team is this rank's group, so every exchange here waits for and reads the
   group's members only (c->team), like its buckets; a group's skipped step (skip_nonfinite: the
   norm is the group's) still runs the gather, of unchanged values, so that every group takes
   the same count of exchanges. */
static ddp_result ddp__cpu_adamw_team(ddp_context *ctx, const ddp_adamw *opt, float b1, float b2, float eps, float *grad_norm_out) {
    ddp__shm_sig *sig;
    ddp__adamw_now now;
    ddp_result r;
    uint32_t q0;
    size_t lo, hi;
    int b, s, skip;
    ddp__norm_blocks(ctx, ctx->shard.norm_sums);
    if ((r = ddp__cpu_norm_exchange(ctx)) != DDP_OK) return r;
    r = ddp__adamw_prepare(ctx, opt, b1, b2, eps, ddp__norm_total(ctx->shard.norm_sums, ctx->shard.norm_blocks), grad_norm_out, &now, &skip);
    /* the norm is the same on the team's ranks: they return here alike (the world's, without groups) */
    if (r != DDP_OK || (skip && ddp__team_world(ctx) == ctx->world)) return r;
    if (ddp__z3(ctx)) {   /* sharded parameters: no all-gather (the next forward gathers), only a barrier */
        for (b = 0; b < ctx->model.num_buckets && !skip; b++) ddp__adamw_bucket(ctx, b, opt, &now);
        ctx->what = "ddp_adamw_step's barrier (sharded parameters: every part updated before any is gathered)";
        return ddp__shm_collective(ctx, DDP__KIND_BARRIER, NULL, 0, 0);
    }
    ctx->what = "ddp_adamw_step's all-gather of the updated parameters (shard_optimizer)";
    if (!ctx->impl.cpu->params_shared) {
        for (b = 0; b < ctx->model.num_buckets && !skip; b++) ddp__adamw_bucket(ctx, b, opt, &now);
        for (b = 0; b < ctx->model.num_buckets; b++)
            for (s = 0; s < ddp__team_world(ctx); s++) {
                int root = ddp__team_peer(ctx, s);
                ddp__shard_range(ctx, b, s, &lo, &hi);
                if (hi > lo && (r = ctx->flat.params_bf16
                                        ? ddp__shm_collective(ctx, DDP__KIND_BROADCAST, ctx->flat.params_bf16 + lo,
                                                              (hi - lo) * sizeof(ddp_bf16), root)
                                        : ddp__shm_collective(ctx, DDP__KIND_BROADCAST, ctx->flat.params + lo,
                                                              (hi - lo) * sizeof(float), root)) != DDP_OK) return r;
            }
        return DDP_OK;
    }
    if (ddp__failed(ctx)) return ddp__failed(ctx);
    sig = &ddp__shm_block(ctx, ctx->rank)->sig;
    sig->id = ++ctx->impl.cpu->shm_collectives;
    sig->kind = DDP__KIND_GATHER;
    sig->root = 0;
    sig->bucket = 0;
    sig->count = ctx->flat.count;
    q0 = ctx->impl.cpu->shm_seq;
    for (b = 0; b <= ctx->model.num_buckets; b++) {
        if (b < ctx->model.num_buckets) {
            if (!skip) ddp__adamw_bucket(ctx, b, opt, &now);
            ddp__shm_post(ctx, DDP__STAGE_IN, q0 + (uint32_t)b + 1);
        }
        if (b > 0 && (r = ddp__cpu_gather_bucket(ctx, b - 1, q0 + (uint32_t)b - 1, b == 1)) != DDP_OK) return r;
    }
    ctx->impl.cpu->shm_seq = q0 + (uint32_t)ctx->model.num_buckets;
    return ddp__shm_wait_all(ctx, DDP__STAGE_OUT, ctx->impl.cpu->shm_seq);
}

/* A broadcast among the team only (be->team_bcast): its members' slots and waits (c->team). */
static ddp_result ddp__cpu_team_bcast(ddp_context *ctx, void *data, size_t bytes, int member) {
    ddp_result r;
    ctx->impl.cpu->team = ddp__team_world(ctx) < ctx->world;
    r = ddp__shm_collective(ctx, DDP__KIND_BROADCAST, data, bytes, ddp__team_peer(ctx, member));
    ctx->impl.cpu->team = 0;
    return r;
}

/* Sharded parameters (>>zero3): member s's parts, in its part of the segment. */
static unsigned char *ddp__cpu_z3_parts(ddp_context *ctx, int member) {
    return ctx->impl.cpu && ctx->impl.cpu->params_shared ? (unsigned char *)ddp__rank_params(ctx, member) : NULL;
}

static ddp_result ddp__cpu_adamw(ddp_context *ctx, const ddp_adamw *opt, float b1, float b2, float eps, float *grad_norm_out) {
    ddp_result r;
    if (!ddp__sharded(ctx)) return ddp__host_adamw(ctx, opt, b1, b2, eps, grad_norm_out);
    if ((r = ddp__host_adamw_state(ctx)) != DDP_OK) return ddp__fatal(ctx, r);
    /* a team's waits never look at the other groups: a peer group's failure is looked at first */
    if (ddp__team_world(ctx) < ctx->world && (r = ddp__shm_poisoned(ctx)) != DDP_OK) return r;
    ctx->impl.cpu->team = ddp__team_world(ctx) < ctx->world;
    r = ddp__cpu_adamw_team(ctx, opt, b1, b2, eps, grad_norm_out);
    ctx->impl.cpu->team = 0;
    return r;
}

/* One bucket on the communication thread's turn (ddp__workq_turn): the turn is launched buckets
   reduced one at a time, in bucket order, by whichever thread holds it. The communication thread
   takes it while backward runs; once the rank's thread waits in ddp_finish it takes the turn
   itself whenever the communication thread is not mid-bucket, so the bucket that is exposed (the
   last, usually launched just before ddp_finish) costs no wake-up of another thread on either
   side, only the handshakes with the peers. */
static ddp_result ddp__cpu_run_bucket(ddp_context *ctx, int index) {
    ddp__cpu *c = ctx->impl.cpu;
    const ddp__bucket *b = &ctx->model.buckets[index];
    const ddp__wire *w = &b->wire;
    ddp_result r;
    /* Replica groups: a team's waits never look at the other groups, so a group whose peer group
       failed (a rank died, say) would train on until the next world-wide collective, possibly
       H steps away; the poison is looked at before each bucket instead. */
    if (ddp__team_world(ctx) < ctx->world && (r = ddp__shm_poisoned(ctx)) != DDP_OK) return r;
    c->sig_bucket = (uint32_t)index + 1;
    c->team = !ddp__hybrid(ctx);   /* averaged among the team (replica groups: this rank's group), not the world;
                                      hybrid sharding: the world (ddp__hybrid_bucket_in_place) */
    r = w->in_place ? ddp__shm_bucket_in_place(ctx, b->offset, b->count, w->scatter ? index : -1)
        : w->grads == DDP_DTYPE_BF16 ? ddp__shm_bucket_staged_bf16(ctx, b->offset, b->count)
        : ddp__shm_collective(ctx, w->dtype == DDP_DTYPE_BF16 ? DDP__KIND_AVG_BF16 : DDP__KIND_AVG,
                              ctx->flat.grads + b->offset, b->count, 0);
    c->team = 0;
    c->sig_bucket = 0;
    return r;
}

/* ZeRO-2: once a bucket is settled, this rank's gradients outside its part are released
   (ddp__z2_release). In place that is after every member has averaged its part, which is when
   the sharded ddp__shm_bucket_in_place returns; staged, the bucket was averaged whole here. */
static ddp_result ddp__z2_cpu_bucket(ddp_context *ctx, int index) {
    ddp_result r = ddp__cpu_run_bucket(ctx, index);
    if (r == DDP_OK && ddp__z2(ctx)) ddp__z2_settled(ctx, index);
    return r;
}

/* The CPU backend's entry points (the table at the end). */
static ddp_result ddp__cpu_setup(ddp_context *ctx, double deadline) {
    ddp__cpu *c;
    ddp_result r;
    if (ctx->world > 1 && ctx->local_world != ctx->world)
        return ddp__fail(ctx, DDP_ERR_BAD_ENV, "the CPU backend needs every rank on one host, but "
                         "WORLD_SIZE=%d and LOCAL_WORLD_SIZE=%d", ctx->world, ctx->local_world);
    if (!(c = ctx->impl.cpu = (ddp__cpu *)ddp__calloc(sizeof *c))) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory");
    ddp__workq_init(&c->comm, ctx, ddp__z2_cpu_bucket);
    if ((r = ddp__shm_setup(ctx, deadline)) != DDP_OK) return r;
    ddp__log(ctx, DDP_LOG_INFO, "rank %d of %d up (cpu backend, segment %s)", ctx->rank, ctx->world, c->shm_name);
    return DDP_OK;
}

/* ZeRO-3's commit without a whole-model copy (ddp__z3_seed_deferred): a bucket at a time, rank 0
   writes the bucket's initial values (the program's, registered with each parameter) into its
   parameters in the segment, every peer copies its own part of it from there, and once all have
   (a barrier) rank 0 gives back the bucket's pages that hold none of its own parts. So a rank
   holds its parts, and rank 0 one bucket (and a page) more, never the model: the same values as
   the broadcast of rank 0's whole buffer, every rank's parts rank 0's initial values. */
static ddp_result ddp__cpu_z3_seed(ddp_context *ctx) {
    size_t page = ddp__page_size(), np = ddp__round_up(ctx->flat.count * sizeof(float), page) / page, lo, hi, q;
    float *root = ddp__rank_params(ctx, 0);
    unsigned char *keep = NULL;
    ddp_result r = DDP_OK;
    int b, i;
    if (ctx->rank == 0) {   /* rank 0's own parts' pages stay */
        if (!(keep = (unsigned char *)ddp__calloc(np ? np : 1)))
            return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for the sharded parameters' page map");
        for (b = 0; b < ctx->model.num_buckets; b++) {
            ddp__shard_range(ctx, b, 0, &lo, &hi);
            if (hi > lo) for (q = lo * sizeof(float) / page; q < (hi * sizeof(float) + page - 1) / page; q++) keep[q] = 1;
        }
    }
    ctx->what = "ddp_commit's seeding of the sharded parameters (rank 0's initial values, a bucket at a time)";
    for (b = 0; b < ctx->model.num_buckets && r == DDP_OK; b++) {
        const ddp__bucket *k = &ctx->model.buckets[b];
        size_t a = k->offset, z = k->offset + k->count;
        if (ctx->rank == 0)
            for (i = 0; i < ctx->model.num_params; i++) {   /* the parameters' pieces inside the bucket */
                const ddp__param *p = &ctx->model.params[i];
                size_t s0 = p->offset > a ? p->offset : a, s1 = p->offset + p->count < z ? p->offset + p->count : z;
                if (p->init && s1 > s0) memcpy(root + s0, p->init + (s0 - p->offset), (s1 - s0) * sizeof(float));
            }
        if ((r = ddp__shm_collective(ctx, DDP__KIND_BARRIER, NULL, 0, 0)) != DDP_OK) break;   /* written */
        ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);   /* hybrid: member s of every group holds part s */
        if (ctx->rank != 0 && hi > lo) memcpy(ctx->flat.params + lo, root + lo, (hi - lo) * sizeof(float));
        if ((r = ddp__shm_collective(ctx, DDP__KIND_BARRIER, NULL, 0, 0)) != DDP_OK) break;   /* copied by every peer */
        if (ctx->rank == 0)   /* pages it shares with the next bucket are written again there and given back after */
            for (q = a * sizeof(float) / page; q < (z * sizeof(float) + page - 1) / page; q++)
                if (!keep[q]) (void)ddp__pages_punch((unsigned char *)root + q * page, page);
    }
    DDP_FREE(keep);
    for (i = 0; i < ctx->model.num_params; i++) ctx->model.params[i].init = NULL;
    ctx->z3.seeded = r == DDP_OK;
    return r;
}

/* The same with bf16 parameters: the fp32 initial values travel through rank 0's gradient buffer
   in the segment (zeros until the first backward; a chunk of it at a time, as many floats as it
   holds), and each rank keeps its parts twice: the fp32 master packed (ddp__master_parts) and the
   working copies rounded (what DDP__BF16_ROUND_PARAMS and _SHARD_MASTER make from a whole master
   at the other levels). Rank 0's gradient buffer is zeros again at the end. */
static ddp_result ddp__cpu_z3_seed_bf16(ddp_context *ctx) {
    float *stage = ddp__rank_grads(ctx, 0);
    size_t chunk = ctx->impl.cpu->grads_stride, used = 0, lo, hi, c0, c1, x;
    ddp_result r = DDP_OK;
    int b, i;
    ctx->what = "ddp_commit's seeding of the sharded parameters (rank 0's initial values, a bucket at a time)";
    for (b = 0; b < ctx->model.num_buckets && r == DDP_OK; b++) {
        const ddp__bucket *k = &ctx->model.buckets[b];
        ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
        for (c0 = k->offset; c0 < k->offset + k->count && r == DDP_OK; c0 = c1) {
            c1 = k->offset + k->count - c0 < chunk ? k->offset + k->count : c0 + chunk;
            if (ctx->rank == 0) {   /* [c0, c1) at stage[0 ..], padding zeros */
                memset(stage, 0, (c1 - c0) * sizeof(float));
                if (c1 - c0 > used) used = c1 - c0;
                for (i = 0; i < ctx->model.num_params; i++) {
                    const ddp__param *p = &ctx->model.params[i];
                    size_t s0 = p->offset > c0 ? p->offset : c0, s1 = p->offset + p->count < c1 ? p->offset + p->count : c1;
                    if (p->init && s1 > s0) memcpy(stage + (s0 - c0), p->init + (s0 - p->offset), (s1 - s0) * sizeof(float));
                }
            }
            if ((r = ddp__shm_collective(ctx, DDP__KIND_BARRIER, NULL, 0, 0)) != DDP_OK) break;   /* written */
            for (x = lo > c0 ? lo : c0; x < hi && x < c1; x++) {
                ctx->flat.params[ctx->shard.base[b] + (x - lo)] = stage[x - c0];
                ctx->flat.params_bf16[x] = ddp__to_bf16(stage[x - c0]);
            }
            if ((r = ddp__shm_collective(ctx, DDP__KIND_BARRIER, NULL, 0, 0)) != DDP_OK) break;   /* copied by every rank */
        }
    }
    if (ctx->rank == 0 && used) {   /* the gradients start at zero; the pages go back where the system can */
        memset(stage, 0, used * sizeof(float));
        size_t whole = used * sizeof(float) / ddp__page_size() * ddp__page_size();   /* the pages it covers entirely */
        if (whole) (void)ddp__pages_punch(stage, whole);
    }
    for (i = 0; i < ctx->model.num_params; i++) ctx->model.params[i].init = NULL;
    ctx->z3.seeded = r == DDP_OK;
    return r;
}

/* Every rank's gradients into the shared segment, rank 0's parameters to everyone, the
   communication thread. */
static ddp_result ddp__cpu_commit(ddp_context *ctx) {
    ddp_result r;
    size_t largest = 0;
    int b;
    if ((r = ddp__grads_share(ctx, ddp__now() + ctx->desc.timeout_s)) != DDP_OK) return ddp__fatal(ctx, r);
    for (b = 0; b < ctx->model.num_buckets; b++) {
        ddp__wire *w = &ctx->model.buckets[b].wire;   /* in the segment: summed where it is (bf16 in float) */
        w->in_place = ctx->impl.cpu->grads_shm && w->convert != DDP__WIRE_NARROW;
        if (ctx->model.buckets[b].count > largest) largest = ctx->model.buckets[b].count;
    }
    if (ctx->flat.grads_bf16 && !ctx->impl.cpu->grads_shm && !(ctx->impl.cpu->bucket_f32 = ddp__alloc_floats(largest ? largest : 1)))
        return ddp__fatal(ctx, ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for one bucket's %zu floats", largest));
    if (ddp__z3_seed_deferred(ctx) && ctx->impl.cpu->grads_shm)
        r = ddp__bf16_params(ctx) ? ddp__cpu_z3_seed_bf16(ctx) : ddp__cpu_z3_seed(ctx);
    else {
        ctx->what = "the broadcast of rank 0's initial parameters";
        r = ddp__shm_collective(ctx, DDP__KIND_BROADCAST, ctx->flat.params, ctx->flat.count * sizeof(float), 0);
    }
    ddp__grads_unlink(ctx);   /* every rank passed ddp__grads_share to get here */
    if (r != DDP_OK) return r;
    if ((r = ddp__workq_start(&ctx->impl.cpu->comm)) != DDP_OK) return ddp__fatal(ctx, r);
    return DDP_OK;
}

/* The thread that steps a rank is the rank (ddp__thread_alive): note it each step, so a
   context handed to another thread follows it. */
static void ddp__cpu_begin_step(ddp_context *ctx) {
    int32_t *tid = &ddp__shm_block(ctx, ctx->rank)->tid, me = (int32_t)ddp__thread_id();
    if (__atomic_load_n(tid, __ATOMIC_RELAXED) != me) __atomic_store_n(tid, me, __ATOMIC_RELEASE);
}

static ddp_result ddp__cpu_launch(ddp_context *ctx, int index) {
    ddp__cpu *c = ctx->impl.cpu;
    ctx->step.stats.buckets_launched++;
    ctx->step.stats.bytes_reduced += ctx->model.buckets[index].wire.bytes;
    /* The last bucket is left to ddp_finish, which follows at once: a wake-up of the
       communication thread would only take a core from this thread (ddp__cpu_run_bucket). A busy
       communication thread still takes it when it is done with the one before. */
    ddp__workq_push(&c->comm, index != ctx->model.num_buckets - 1);
    return DDP_OK;
}

static ddp_result ddp__cpu_finish(ddp_context *ctx, double t_wait) {
    ddp__cpu *c = ctx->impl.cpu;
    ddp_result r;
    uint32_t out;
    int cancel_state;
    /* pthread_cancel of the rank's thread here would leave it holding the lock, and the
       communication thread (and the host's ddp_shutdown of the context) stuck on it. */
    ddp__nocancel_begin(&cancel_state);
    __atomic_store_n(&c->host_waiting, 1, __ATOMIC_RELEASE);
    r = ddp__workq_wait(&c->comm, 1, &ctx->step.stats);   /* this thread reduces the next bucket itself when it can */
    ddp__straggle_fold(&c->straggle, &ctx->step.stats);
    out = c->out_pending;   /* the last turn wrote it before it counted its bucket done */
    c->out_pending = 0;
    if (r == DDP_OK && out) {   /* every peer of the team has copied its parts of the last bucket from this rank's buffer */
        ctx->what = "the end of the gradient buckets' allreduce (the peers' last copies)";
        c->team = !ddp__hybrid(ctx);   /* hybrid: every rank of the world may copy from it */
        r = ddp__shm_wait_all(ctx, DDP__STAGE_OUT, out);
        c->team = 0;
    }
    __atomic_store_n(&c->host_waiting, 0, __ATOMIC_RELEASE);
    ddp__nocancel_end(cancel_state);
    ddp__host_step_done(ctx, t_wait);
    return r;
}

/* User collectives (and the shutdown barrier); reductions appear on the timeline's comm lane. */
static ddp_result ddp__cpu_collective(ddp_context *ctx, uint32_t kind, void *data, size_t count, int root) {
    double t0;
    ddp_result r;
    if (!ctx->tl.main || (kind != DDP__KIND_SUM && kind != DDP__KIND_AVG)) return ddp__shm_collective(ctx, kind, data, count, root);
    t0 = ddp__now();
    r = ddp__shm_collective(ctx, kind, data, count, root);
    ddp__record(ctx, ctx->tl.comm, DDP__EV_ALLREDUCE, t0, ddp__now(), -1, count * sizeof(float));
    return r;
}

static void ddp__cpu_stop(ddp_context *ctx) {
    if (ctx->impl.cpu) ddp__workq_stop(&ctx->impl.cpu->comm);
}

static void ddp__cpu_teardown(ddp_context *ctx) {
    ddp__cpu *c = ctx->impl.cpu;
    if (c) {
        ddp__workq_stop(&c->comm);
        if (c->shm) {
            ddp__seg_unmap(c->shm, c->shm_bytes);
            if (ctx->rank == 0) ddp__seg_unlink(c->shm_name);   /* already gone unless init failed */
        }
        ddp__grads_unlink(ctx);                            /* likewise */
        if (c->grads_shm) {
            ddp__seg_unmap(c->grads_shm, c->grads_shm_bytes);
            ctx->flat.grads = NULL;                        /* it pointed into the segment */
            ctx->flat.grads_bf16 = NULL;                        /* or this did */
            if (c->params_shared && ctx->flat.params_bf16) ctx->flat.params_bf16 = NULL;   /* so did this */
            else if (c->params_shared) ctx->flat.params = NULL;
        }
        DDP_FREE(c->norm_recv);
        ddp__free_floats(c->bucket_f32);
        ddp__workq_destroy(&c->comm);
        DDP_FREE(c);
        ctx->impl.cpu = NULL;
    }
    if (ddp__failed(ctx) && ctx->world > 1) ddp__shm_sweep_stale(ctx);   /* a dead rank 0's, made before we mapped it */
    ddp__host_free(ctx);
}

static void ddp__cpu_table(ddp__backend *t) {
    ddp__host_table(t);
    t->name = "cpu";
    t->id = DDP_BACKEND_CPU;
    t->shards = 1;
    t->shards_grads = 1;
    t->setup = ddp__cpu_setup;
    t->commit = ddp__cpu_commit;
    t->begin_step = ddp__cpu_begin_step;
    t->launch = ddp__cpu_launch;
    t->finish = ddp__cpu_finish;
    t->adamw = ddp__cpu_adamw;
    t->collective = ddp__cpu_collective;
    t->team_bcast = ddp__cpu_team_bcast;
    t->z3_parts = ddp__cpu_z3_parts;
    t->poison = ddp__cpu_poison;
    t->stop = ddp__cpu_stop;
    t->teardown = ddp__cpu_teardown;
}

/* --------------------------------------------------------------------------------------------
   >>mpi  The MPI backend (only with DDP_MPI): CPU ranks on several hosts.
   Hierarchical by default. The ranks of one host form a host group that runs the CPU backend's
   shared-memory collectives (>>cpu: a second ddp_context, `host`, whose rank and world are
   LOCAL_RANK and LOCAL_WORLD_SIZE; its segment's name travels by MPI_Bcast inside the host).
   One leader per host (LOCAL_RANK 0) talks across hosts. A sum is: the host's sum through the
   segment (rank order), then among the leaders each owns a slice (ddp__part): MPI_Alltoallv of
   the host sums, the owner adds them in host order (and divides for an average), MPI_Allgatherv;
   then the leader's result to its host (a segment broadcast). Every step of that has a fixed
   order, so every rank ends with the same bits (MPI_Allreduce's order is the library's own).
   DDP_MPI_FLAT=1 (every rank alike): no host groups, every rank is its own "host" in MPI.
   bf16 buckets and the sharded optimizer's exchanges go among all ranks instead, in the CPU
   backend's rank order (below, from ddp__mpi_bf16_wire).
   Threads: the communication thread runs the buckets, the rank's thread the user collectives
   (never both at once: they run between steps), the watchdog may call MPI_Abort meanwhile:
   MPI_THREAD_MULTIPLE is required and checked. MPI has no timeout: the watchdog looks every
   0.1 s at the store's poison, the ranks' store connections (a dead rank's closes) and the age
   of the collective in progress; on a failure while this rank is inside a collective it logs
   the named error, gives the peers DDP__MPI_ABORT_GRACE_S to log theirs, and calls MPI_Abort.
   -------------------------------------------------------------------------------------------- */
#ifdef DDP_MPI
#define DDP__MPI_MAX_COUNT (1 << 28)      /* elements per MPI call: MPI counts are ints */
#define DDP__MPI_ABORT_GRACE_S 0.5
#define DDP__MPI_BEAT_S 0.5               /* heartbeat through the store: who went silent */

struct ddp__mpi {
    int flat, leader, nodes, node;
    MPI_Comm world, local, leaders;       /* MPI_COMM_NULL where this rank has none */
    MPI_Comm team;                        /* the team's (ddp__team_*), split from world: with replica
                                             groups this rank's group, else every rank */
    int *rank_node, *rank_local;          /* world entries */
    char (*hosts)[64];                    /* each rank's host name */
    ddp_context *host;                    /* this host's ranks through shared memory; NULL: alone */
    float *scratch;
    size_t scratch_count;
    int *counts, *displs, *rcounts, *rdispls;
    uint64_t seq;                         /* collectives issued: the same on every rank */
    /* exchanges among all ranks (m->world: bf16 buckets, the sharded optimizer; ddp__mpi_ranks_alloc) */
    int *wcounts, *wdispls, *wrcounts, *wrdispls;   /* world entries each */
    ddp_bf16 *wire, *rounded;             /* this rank's piece from every rank; fp32 gradients rounded */
    size_t wire_count;
    float *wire_f32;                      /* replica groups, fp32 buckets: this rank's piece from every
                                             member (team_host, bf16 gradients: one bucket widened) */
    int team_host;                        /* the team is this host's ranks: buckets through its segment */
    MPI_Comm hcross;                      /* hybrid sharding: the ranks holding the same part (member s
                                             of every shard group), in group order; else MPI_COMM_NULL */
    int *hcounts, *hdispls, *hrcounts, *hrdispls;   /* hybrid: an entry per shard group */
    float *hscratch, *hbucket;            /* hybrid: the owner's pieces; one bucket in float (bf16 wire) */
    size_t hscratch_count, hbucket_count;
    size_t wire_f32_count;
    uint64_t wseq;                        /* their collectives issued: the same on every rank */
    ddp__workq comm;                      /* the communication thread's queue (>>engine) */
    pthread_mutex_t lock;                 /* the watch fields */
    ddp__watchdog wd;                     /* its thread and store connection (>>engine) */
    double busy_since;                    /* when the collective in progress began; 0: none */
    char busy_what[96];
    /* the watchdog thread's own: busy_* as it last saw them, its heartbeats, the peers' beats
       at its first look near a deadline, when it saw the group failed */
    double seen_since, next_beat, snap_at, failed_at;
    char seen_what[96];
    long beat, *beats_before;
    /* stragglers (ddp__mpi_arrivals): the exchange in progress is gradient bucket straggle_bucket - 1
       (0: none; the count of the ranks with data counts too); each signature exchange's end, per
       communicator (leaders, world), is the zero the next one's arrivals count from */
    int straggle_bucket, straggle_counted;
    double sig_exit[2];
    double host_at, host_wait, host_spread;   /* this exchange's host group part: arrival, this rank's wait, the spread */
    int host_last;                            /* the host's last arrival (a world rank) */
    double cross_at, cross_wait, cross_spread;/* its part across the signature exchange's members (leaders or all) */
    int cross_last;                           /* -1: not known (no zero yet, or not a member) */
    ddp__straggle straggle;
    MPI_Comm z3comm;                      /* sharded parameters: the gathers' own duplicate of team
                                             (the world's, the shard or replica group's: ddp__mpi_z3_*);
                                             MPI_COMM_NULL below that level */
    struct ddp__mpi_z3 *z3;               /* each unit's gather in flight */
    uint64_t z3seq;                       /* gathers started: the same on every rank of the team */
};

/* One unit's gather in flight (ddp__mpi_z3_start): its requests (req[0] the signature), each
   data request's counts and displacements (MPI reads them until it completes), the signatures. */
typedef struct ddp__mpi_z3 {
    MPI_Request *req;
    int nreq;
    int *cd;
    uint64_t mine[2], *sigs;
} ddp__mpi_z3;

static int ddp__mpi_owned, ddp__mpi_dirty;   /* ddp.h initialized MPI; a context failed */
static void ddp__mpi_atexit(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && !__atomic_load_n(&ddp__mpi_dirty, __ATOMIC_ACQUIRE)) MPI_Finalize();   /* after a failure: no collective finalize */
}

static const char *ddp__mpi_host_name(ddp_context *ctx, int rank) {
    return ctx->impl.mpi->hosts && rank >= 0 && rank < ctx->world && ctx->impl.mpi->hosts[rank][0] ? ctx->impl.mpi->hosts[rank] : "?";
}

/* "ranks 2, 3" on rank r's host */
static void ddp__mpi_host_ranks(ddp_context *ctx, int node, char *out, size_t cap) {
    size_t len = 0;
    int s;
    out[0] = 0;
    for (s = 0; s < ctx->world && len + 16 < cap; s++)
        if (ctx->impl.mpi->rank_node && ctx->impl.mpi->rank_node[s] == node)
            len += (size_t)snprintf(out + len, cap - len, "%s%d", len ? ", " : "", s);
}

/* An MPI call's error, failing the group; `what` says what the call was doing (ctx->what, or a
   caller's own words where ctx->what_buf belongs to another thread) */
static ddp_result ddp__mpi_check_in(ddp_context *ctx, int rc, const char *call, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (rc == MPI_SUCCESS) return DDP_OK;
    if (ddp__failed(ctx)) return ddp__failed(ctx);
    s[0] = 0;
    MPI_Error_string(rc, s, &n);
    return ddp__fail_group(ctx, DDP_ERR_PEER_LOST, "%s failed in %s: %s", call, what, s);
}

static ddp_result ddp__mpi_check(ddp_context *ctx, int rc, const char *call) { return ddp__mpi_check_in(ctx, rc, call, ctx->what); }

static void ddp__mpi_busy(ddp_context *ctx, int on) {
    ddp__mpi *m = ctx->impl.mpi;
    pthread_mutex_lock(&m->lock);
    m->busy_since = on ? ddp__now() : 0;
    if (on) snprintf(m->busy_what, sizeof m->busy_what, "%s", ctx->what ? ctx->what : "a collective");
    pthread_mutex_unlock(&m->lock);
}

/* The host group's part of a collective; its errors (local rank numbers) become this rank's,
   with the map from local ranks to ranks. */
static ddp_result ddp__mpi_host(ddp_context *ctx, uint32_t kind, void *data, size_t count, int root) {
    char eb[DDP__ERR_MAX];
    ddp_context *h = ctx->impl.mpi->host;
    char ranks[128];
    ddp_result r;
    if (!h) return DDP_OK;
    h->what = ctx->what;
    h->life = ctx->life;
    if (ddp__cancel_requested(ctx)) __atomic_store_n(&h->embed.cancel, 1, __ATOMIC_RELEASE);
    /* a gradient bucket's host sum notes the host's arrivals (ddp__cpu_arrivals) */
    h->impl.cpu->sig_bucket = ctx->impl.mpi->straggle_counted && kind != DDP__KIND_BROADCAST ? (uint32_t)ctx->impl.mpi->straggle_bucket : 0;
    if (kind == DDP__KIND_JOIN || h->impl.cpu->sig_bucket) {
        memset(&h->impl.cpu->straggle, 0, sizeof h->impl.cpu->straggle);
        ctx->impl.mpi->host_at = ddp__now();
    }
    r = ddp__shm_collective(h, kind, data, count, root);
    h->impl.cpu->sig_bucket = 0;
    if (r == DDP_OK) return DDP_OK;
    if (ddp__failed(ctx)) return ddp__failed(ctx);
    ddp__mpi_host_ranks(ctx, ctx->impl.mpi->node, ranks, sizeof ranks);
    return ddp__fail_group(ctx, r, "on host %s (its local ranks 0.. are ranks %s): %s", ddp__mpi_host_name(ctx, ctx->rank),
                           ranks, ddp__err_body(h, eb));
}

/* Stragglers across the members of a signature exchange (ddp__mpi_check_sigs_on's 7 words a
   member): the last to arrive, this member's wait for it, and the most any rank waited (a
   member's wait plus its host's spread). */
static void ddp__mpi_cross_arrivals(ddp_context *ctx, const uint64_t *all, int n, int me, double at) {
    ddp__mpi *m = ctx->impl.mpi;
    double a_last = -1, a_me = -1, a, lead;
    int i, last = -1;
    m->cross_last = -1;
    m->cross_at = at;
    m->cross_wait = m->cross_spread = 0;
    for (i = 0; i < n; i++) {
        memcpy(&a, &all[7 * i + 4], sizeof a);
        if (a < 0) return;   /* a member without a zero yet: the first exchange of the job */
        if (a > a_last) { a_last = a; last = i; }
    }
    for (i = 0; i < n; i++) {
        memcpy(&a, &all[7 * i + 4], sizeof a);
        memcpy(&lead, &all[7 * i + 6], sizeof lead);
        if (a_last - a + lead > m->cross_spread) m->cross_spread = a_last - a + lead;
    }
    memcpy(&a_me, &all[7 * me + 4], sizeof a_me);
    m->cross_wait = a_last - a_me;
    m->cross_last = (int)(int64_t)all[7 * last + 5];
}

/* After a counted exchange's host sum: the host group's part (local ranks made world ranks). */
static void ddp__mpi_host_arrivals(ddp_context *ctx) {
    ddp__mpi *m = ctx->impl.mpi;
    const ddp__straggle *hs = m->host && m->host->impl.cpu ? &m->host->impl.cpu->straggle : NULL;
    int s;
    m->host_wait = m->host_spread = 0;
    m->host_last = ctx->rank;
    m->cross_last = -1;
    if (!hs || !hs->exchanges) return;   /* alone on the host */
    m->host_wait = hs->wait;
    m->host_spread = hs->spread;
    for (s = 0; s < ctx->world; s++)
        if (m->rank_node[s] == m->node && m->rank_local[s] == hs->slowest) m->host_last = s;
}

/* The exchange's stragglers into the step's: the host part, then the part across hosts (the
   leader's own, or what it relayed to this rank in ddp__mpi_collective_run), each its own timeline event. */
static void ddp__mpi_arrivals(ddp_context *ctx, double relay_end) {
    ddp__mpi *m = ctx->impl.mpi;
    int bucket = m->straggle_bucket - 1, last = m->cross_last >= 0 ? m->cross_last : m->host_last;
    ddp__timeline *tl = bucket >= 0 ? ctx->tl.comm : ctx->tl.main;
    double cross_wait = m->cross_last >= 0 ? m->cross_wait : 0, spread = m->cross_last >= 0 ? m->cross_spread : m->host_spread;
    if (m->host_wait >= DDP__STRAGGLE_EVENT_S)
        ddp__record(ctx, tl, DDP__EV_STRAGGLER, m->host_at, m->host_at + m->host_wait, bucket, (uint64_t)m->host_last);
    if (cross_wait >= DDP__STRAGGLE_EVENT_S) {   /* a rank that is no leader waited for it in the result's broadcast */
        double t0 = relay_end > 0 ? relay_end - cross_wait : m->cross_at;
        ddp__record(ctx, tl, DDP__EV_STRAGGLER, t0, t0 + cross_wait, bucket, (uint64_t)last);
    }
    ddp__straggle_note(ctx, &m->straggle, NULL, bucket, m->host_at, m->host_wait + cross_wait, spread, last);
}

/* Every member of `comm` in the same collective (what, how much, from where), else a named
   mismatch on every member: the n members are the leaders (member i is host i; first < 0), or
   ranks (member i is rank first + i: every rank, or the team); seq counts the collectives on comm. */
static ddp_result ddp__mpi_check_sigs_on(ddp_context *ctx, MPI_Comm comm, int n, int first, uint64_t seq, uint32_t kind,
                                         size_t count, int root) {
    ddp__mpi *m = ctx->impl.mpi;
    uint64_t mine[7], *all;
    int i, rc, zero = comm == m->leaders ? 0 : 1;
    double at = ddp__now(), t;
    mine[0] = seq; mine[1] = kind; mine[2] = count; mine[3] = (uint64_t)(int64_t)root;
    /* stragglers: when this member arrived, counted from the end of the last signature exchange
       on this communicator (all members left it together, within a latency: one zero for all,
       with no clock shared across hosts), its host's last arrival and spread */
    t = m->sig_exit[zero] > 0 ? at - m->sig_exit[zero] : -1;
    memcpy(&mine[4], &t, sizeof t);
    mine[5] = (uint64_t)(int64_t)(comm == m->leaders ? m->host_last : ctx->rank);
    t = comm == m->leaders ? m->host_spread : 0;
    memcpy(&mine[6], &t, sizeof t);
    if (!(all = (uint64_t *)ddp__calloc(sizeof mine * (size_t)n))) return ddp__fail_group(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory");
    rc = MPI_Allgather(mine, 7, MPI_UINT64_T, all, 7, MPI_UINT64_T, comm);
    m->sig_exit[zero] = ddp__now();
    if (rc != MPI_SUCCESS) { DDP_FREE(all); return ddp__mpi_check(ctx, rc, "MPI_Allgather"); }
    if (m->straggle_counted) ddp__mpi_cross_arrivals(ctx, all, n, zero ? ctx->rank - first : m->node, at);
    for (i = 0; i < n; i++) {
        const uint64_t *o = all + 7 * i;
        if (o[1] != mine[1] || o[2] != mine[2] || o[3] != mine[3] || o[0] != mine[0]) {
            int s, by_rank = first >= 0, other = by_rank ? first + i : -1;
            char a[128], b[128];
            ddp__shm_sig sa, sb;
            for (s = 0; s < ctx->world && other < 0; s++) if (m->rank_node[s] == i) other = s;
            memset(&sa, 0, sizeof sa); memset(&sb, 0, sizeof sb);
            sa.kind = (uint32_t)mine[1]; sa.count = mine[2]; sa.root = (uint32_t)mine[3];
            sb.kind = (uint32_t)o[1]; sb.count = o[2]; sb.root = (uint32_t)o[3];
            DDP_FREE(all);
            if (sb.kind == DDP__KIND_SHUTDOWN)
                return ddp__fail_group(ctx, DDP_ERR_PEER_LOST, "host %s (rank %d) called ddp_shutdown while this rank is in %s",
                                       ddp__mpi_host_name(ctx, other), other, ddp__describe_sig(&sa, a, sizeof a));
            return ddp__fail_group(ctx, DDP_ERR_MISMATCH, "%s called different collectives: this %s is in %s, "
                                   "host %s (rank %d) in %s", by_rank ? "ranks" : "hosts", by_rank ? "rank" : "host",
                                   ddp__describe_sig(&sa, a, sizeof a), ddp__mpi_host_name(ctx, other), other,
                                   ddp__describe_sig(&sb, b, sizeof b));
        }
    }
    DDP_FREE(all);
    return DDP_OK;
}

/* Leaders: every leader in the same collective. */
static ddp_result ddp__mpi_check_sigs(ddp_context *ctx, uint32_t kind, size_t count, int root) {
    ddp__mpi *m = ctx->impl.mpi;
    return ddp__mpi_check_sigs_on(ctx, m->leaders, m->nodes, -1, ++m->seq, kind, count, root);
}

/* Leaders: buf = the sum over hosts, in host order, divided by `divide` when > 0. */
static ddp_result ddp__mpi_leaders_sum(ddp_context *ctx, float *buf, size_t n, float divide) {
    ddp__mpi *m = ctx->impl.mpi;
    size_t lo, hi, mine_lo, mine_hi, k, j;
    int i, rc;
    ddp__part(n, m->nodes, m->node, &mine_lo, &mine_hi);
    k = mine_hi - mine_lo;
    if (m->scratch_count < k * (size_t)m->nodes || !m->scratch) {
        ddp__free_floats(m->scratch);
        m->scratch_count = k * (size_t)m->nodes;
        if (!(m->scratch = ddp__alloc_floats(m->scratch_count ? m->scratch_count : 1)))
            return ddp__fail_group(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for %zu floats", m->scratch_count);
    }
    for (i = 0; i < m->nodes; i++) {
        ddp__part(n, m->nodes, i, &lo, &hi);
        m->counts[i] = (int)(hi - lo);
        m->displs[i] = (int)lo;
        m->rcounts[i] = (int)k;
        m->rdispls[i] = (int)k * i;
    }
    rc = MPI_Alltoallv(buf, m->counts, m->displs, MPI_FLOAT, m->scratch, m->rcounts, m->rdispls, MPI_FLOAT, m->leaders);
    if (rc != MPI_SUCCESS) return ddp__mpi_check(ctx, rc, "MPI_Alltoallv");
    for (j = 0; j < k; j++) {
        float sum = m->nodes > 1 ? m->scratch[j] + m->scratch[k + j] : m->scratch[j];
        for (i = 2; i < m->nodes; i++) sum += m->scratch[(size_t)i * k + j];
        m->scratch[j] = divide > 0 ? sum / divide : sum;
    }
    rc = MPI_Allgatherv(m->scratch, (int)k, MPI_FLOAT, buf, m->counts, m->displs, MPI_FLOAT, m->leaders);
    return ddp__mpi_check(ctx, rc, "MPI_Allgatherv");
}

/* One collective across hosts; count in floats for reductions, bytes for broadcast. */
static ddp_result ddp__mpi_collective_run(ddp_context *ctx, uint32_t kind, void *data, size_t count, int root) {
    ddp__mpi *m = ctx->impl.mpi;
    size_t done, step;
    ddp_result r;
    int rc;
    if (kind == DDP__KIND_BROADCAST) {
        int rn = m->rank_node[root];
        if (m->node == rn && (r = ddp__mpi_host(ctx, kind, data, count, m->rank_local[root])) != DDP_OK) return r;
        if (m->leader) {
            if ((r = ddp__mpi_check_sigs(ctx, kind, count, root)) != DDP_OK) return r;
            for (done = 0; done < count; done += step) {
                step = count - done < DDP__MPI_MAX_COUNT ? count - done : DDP__MPI_MAX_COUNT;
                rc = MPI_Bcast((unsigned char *)data + done, (int)step, MPI_BYTE, rn, m->leaders);
                if ((r = ddp__mpi_check(ctx, rc, "MPI_Bcast")) != DDP_OK) return r;
            }
        }
        if (m->node != rn) return ddp__mpi_host(ctx, kind, data, count, 0);
        return DDP_OK;
    }
    if (kind == DDP__KIND_BARRIER || kind == DDP__KIND_SHUTDOWN) {
        if ((r = ddp__mpi_host(ctx, kind, NULL, 0, 0)) != DDP_OK) return r;
        if (m->leader && (r = ddp__mpi_check_sigs(ctx, kind, 0, 0)) != DDP_OK) return r;
        return ddp__mpi_host(ctx, kind, NULL, 0, 0);
    }
    /* sum, average, the count of ranks with data: the host's sum first, in local rank order */
    m->straggle_counted = m->straggle_bucket || kind == DDP__KIND_JOIN;
    if (m->straggle_counted) m->host_at = ddp__now();
    r = ddp__mpi_host(ctx, kind == DDP__KIND_JOIN ? DDP__KIND_JOIN : DDP__KIND_SUM, data, count, 0);
    if (r == DDP_OK && m->straggle_counted) ddp__mpi_host_arrivals(ctx);
    if (r == DDP_OK && m->leader) {
        if ((r = ddp__mpi_check_sigs(ctx, kind, count, 0)) != DDP_OK) { m->straggle_counted = 0; return r; }
        for (done = 0; done < count; done += step) {
            step = count - done < DDP__MPI_MAX_COUNT ? count - done : DDP__MPI_MAX_COUNT;
            if ((r = ddp__mpi_leaders_sum(ctx, (float *)data + done, step, kind == DDP__KIND_AVG ? (float)ctx->world : 0)) != DDP_OK)
                break;
        }
    }
    if (r == DDP_OK && m->straggle_counted && m->host) {   /* the leader's word to its host: ddp__mpi_arrivals */
        ddp__shm_header *hh = ddp__shm_hdr(m->host);
        if (m->leader) { hh->relay_rank = m->cross_last; hh->relay_wait = m->cross_wait; hh->relay_spread = m->cross_spread; }
    }
    if (r == DDP_OK) r = ddp__mpi_host(ctx, DDP__KIND_BROADCAST, data, count * sizeof(float), 0);
    if (r == DDP_OK && m->straggle_counted) {
        double relay_end = 0;
        if (!m->leader && m->host) {
            ddp__shm_header *hh = ddp__shm_hdr(m->host);
            m->cross_last = hh->relay_rank; m->cross_wait = hh->relay_wait; m->cross_spread = hh->relay_spread;
            relay_end = ddp__now();
        }
        ddp__mpi_arrivals(ctx, relay_end);
    }
    m->straggle_counted = 0;
    return r;
}

static ddp_result ddp__mpi_collective_timed(ddp_context *ctx, uint32_t kind, void *data, size_t count, int root) {
    ddp_result r;
    double started = ddp__now();
    if (ddp__failed(ctx)) return ddp__failed(ctx);
    if ((r = ddp__check_cancel(ctx, ctx->what)) != DDP_OK) return r;
    ddp__mpi_busy(ctx, 1);
    r = ddp__mpi_collective_run(ctx, kind, data, count, root);
    ddp__mpi_busy(ctx, 0);
    if (r == DDP_OK && (kind == DDP__KIND_SUM || kind == DDP__KIND_AVG) &&
        (ctx->desc.inject_comm_latency_ms > 0 || ctx->desc.inject_comm_gbps > 0))
        ddp__inject_comm_delay(ctx, count * sizeof(float), started);
    return r;
}

/* Exchanges among all ranks (m->world, hierarchical or flat), where the bits must be the CPU
   backend's. bf16 gradients (bf16 parameters, or reduce_dtype BF16): the CPU backend adds each
   element's bf16 values in float in rank order and rounds once; a host's partial sum would add
   in another order, so each piece of a bucket has an owner, every rank's values of it travel to
   the owner (MPI_Alltoallv, 2 bytes an element), which averages them with the CPU backend's
   ddp__average_bf16, and MPI_Allgatherv brings the pieces back (sharded bf16 gradients: the
   pieces are the ranks' parts and stay where they are, a reduce-scatter). With replica groups
   (desc.outer) every bucket, fp32 too (ddp__average_f32), goes this way among the team only,
   through its communicator (m->team; the pieces, owners and order are the team's members'):
   the CPU backend's bits for the same groups. The sharded optimizer:
   the norm's blocks (each non-zero on its owner only, so MPI_Allreduce's sum adds zeros to it:
   exact in any order) and the all-gather of each bucket's updated parts (MPI_Allgatherv). */
static int ddp__mpi_bf16_wire(const ddp_context *ctx) { return ctx->flat.grads_bf16 || ctx->desc.reduce_dtype == DDP_DTYPE_BF16; }
static int ddp__mpi_teams(const ddp_context *ctx) { return ddp__team_world(ctx) < ctx->world; }   /* replica groups of several ranks */

/* Elements of a bucket per exchange: MPI counts and displacements are ints, and an owner
   receives world pieces of up to this many. */
static size_t ddp__mpi_window(const ddp_context *ctx) {
    size_t w = (size_t)DDP__MPI_MAX_COUNT / (size_t)ctx->world / DDP__SHARD_GRAIN * DDP__SHARD_GRAIN;
    return w ? w : DDP__SHARD_GRAIN;
}

/* Team member s's piece [lo, hi) of the window [c0, c1) of bucket b (counted from the bucket's
   start): with by_shard its part (ddp__shard_range; sharded, the team is the world) within the
   window, else ddp__part of the window. */
static void ddp__mpi_piece(ddp_context *ctx, int b, int by_shard, size_t c0, size_t c1, int s, size_t *lo, size_t *hi) {
    size_t off = ctx->model.buckets[b].offset;
    if (!by_shard) {
        ddp__part(c1 - c0, ddp__team_world(ctx), s, lo, hi);
        *lo += c0; *hi += c0;
        return;
    }
    ddp__shard_range(ctx, b, s, lo, hi);
    *lo = *lo - off < c0 ? c0 : *lo - off > c1 ? c1 : *lo - off;
    *hi = *hi - off < *lo ? *lo : *hi - off > c1 ? c1 : *hi - off;
}

/* Every team member's piece of the window as MPI counts and displacements from c0; this rank's
   piece starts at *mine and is the count returned. */
static size_t ddp__mpi_pieces(ddp_context *ctx, int b, int by_shard, size_t c0, size_t c1, size_t *mine) {
    ddp__mpi *m = ctx->impl.mpi;
    size_t lo, hi, k = 0;
    int s;
    *mine = c0;
    for (s = 0; s < ddp__team_world(ctx); s++) {
        ddp__mpi_piece(ctx, b, by_shard, c0, c1, s, &lo, &hi);
        m->wcounts[s] = (int)(hi - lo);
        m->wdispls[s] = (int)(lo - c0);
        if (s == ddp__team_rank(ctx)) { *mine = lo; k = hi - lo; }
    }
    return k;
}

/* The window [c0, c1) of a bucket's values g (bf16, or with f32 floats): every team member's
   values of this rank's piece arrive side by side, and their average replaces this rank's piece. */
static ddp_result ddp__mpi_average_window(ddp_context *ctx, void *g, int f32, int b, int by_shard, size_t c0, size_t c1) {
    ddp__mpi *m = ctx->impl.mpi;
    size_t lo, k = ddp__mpi_pieces(ctx, b, by_shard, c0, c1, &lo), need;
    int s, rc, n = ddp__team_world(ctx);
    need = k * (size_t)n;
    if (f32 && (m->wire_f32_count < need || !m->wire_f32)) {
        ddp__free_floats(m->wire_f32);
        m->wire_f32_count = need;
        if (!(m->wire_f32 = ddp__alloc_floats(need ? need : 1)))
            return ddp__fail_group(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for %zu gradients", need);
    } else if (!f32 && (m->wire_count < need || !m->wire)) {
        ddp__free_floats((float *)(void *)m->wire);
        m->wire_count = need;
        if (!(m->wire = (ddp_bf16 *)(void *)ddp__alloc_floats(m->wire_count / 2 + 1)))
            return ddp__fail_group(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for %zu bf16 gradients", m->wire_count);
    }
    for (s = 0; s < n; s++) { m->wrcounts[s] = (int)k; m->wrdispls[s] = (int)k * s; }
    if (f32) {
        rc = MPI_Alltoallv((float *)g + c0, m->wcounts, m->wdispls, MPI_FLOAT, m->wire_f32, m->wrcounts, m->wrdispls,
                           MPI_FLOAT, m->team);
        if (rc != MPI_SUCCESS) return ddp__mpi_check(ctx, rc, "MPI_Alltoallv");
        if (k) ddp__average_f32(m->wire_f32, k, n, k, (float *)g + lo);
        return DDP_OK;
    }
    rc = MPI_Alltoallv((ddp_bf16 *)g + c0, m->wcounts, m->wdispls, MPI_UINT16_T, m->wire, m->wrcounts, m->wrdispls,
                       MPI_UINT16_T, m->team);
    if (rc != MPI_SUCCESS) return ddp__mpi_check(ctx, rc, "MPI_Alltoallv");
    if (k) ddp__average_bf16(m->wire, k, n, k, (ddp_bf16 *)g + lo);
    return DDP_OK;
}

/* Every member's piece of the window (ddp__mpi_pieces said which) to every member of comm, in place. */
static ddp_result ddp__mpi_gather_window(ddp_context *ctx, void *window, MPI_Datatype type, MPI_Comm comm) {
    ddp__mpi *m = ctx->impl.mpi;
    int rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, window, m->wcounts, m->wdispls, type, comm);
    return ddp__mpi_check(ctx, rc, "MPI_Allgatherv");
}

/* A bucket's signature check among the team (every team member in the same exchange), which
   also says who arrived last (stragglers: every member counted, no host part). */
static ddp_result ddp__mpi_team_sigs(ddp_context *ctx, uint32_t kind, size_t count, int b) {
    ddp__mpi *m = ctx->impl.mpi;
    ddp_result r;
    m->straggle_counted = 1;
    m->host_at = ddp__now(); m->host_wait = m->host_spread = 0; m->host_last = ctx->rank;
    r = ddp__mpi_check_sigs_on(ctx, m->team, ddp__team_world(ctx), ddp__team_peer(ctx, 0), ++m->wseq, kind, count, b);
    if (r == DDP_OK) ddp__mpi_arrivals(ctx, 0);
    m->straggle_counted = 0;
    return r;
}

/* A bucket of bf16 gradients averaged with the CPU backend's bits (fp32 gradients with
   reduce_dtype BF16: rounded first, as the CPU backend's slots carry them, and widened back). */
static ddp_result ddp__mpi_bucket_bf16(ddp_context *ctx, int b) {
    ddp__mpi *m = ctx->impl.mpi;
    const ddp__bucket *k = &ctx->model.buckets[b];
    int scatter = k->wire.grads == DDP_DTYPE_BF16 && k->wire.scatter;   /* the CPU backend's in-place reduce-scatter */
    size_t win = ddp__mpi_window(ctx), c0, c1, j;
    ddp_bf16 *g = ctx->flat.grads_bf16 ? ctx->flat.grads_bf16 + k->offset : m->rounded;
    ddp_result r;
    if (!ctx->flat.grads_bf16) for (j = 0; j < k->count; j++) g[j] = ddp__to_bf16(ctx->flat.grads[k->offset + j]);
    if ((r = ddp__mpi_team_sigs(ctx, DDP__KIND_AVG_BF16, k->count, b)) != DDP_OK) return r;
    for (c0 = 0; c0 < k->count; c0 = c1) {
        c1 = k->count - c0 < win ? k->count : c0 + win;
        if ((r = ddp__mpi_average_window(ctx, g, 0, b, scatter, c0, c1)) != DDP_OK) return r;
        if (!scatter && (r = ddp__mpi_gather_window(ctx, g + c0, MPI_UINT16_T, m->team)) != DDP_OK) return r;
    }
    if (!ctx->flat.grads_bf16) for (j = 0; j < k->count; j++) ctx->flat.grads[k->offset + j] = ddp__from_bf16(g[j]);
    return DDP_OK;
}

/* Replica groups: a bucket of fp32 gradients averaged among the team, the CPU backend's bits
   (its members' values added in team order: ddp__average_f32). Without groups fp32 buckets go
   through the host groups and leaders (ddp__mpi_collective_run) instead. */
static ddp_result ddp__mpi_bucket_f32(ddp_context *ctx, int b) {
    ddp__mpi *m = ctx->impl.mpi;
    const ddp__bucket *k = &ctx->model.buckets[b];
    size_t win = ddp__mpi_window(ctx), c0, c1;
    float *g = ctx->flat.grads + k->offset;
    ddp_result r;
    if ((r = ddp__mpi_team_sigs(ctx, DDP__KIND_AVG, k->count, b)) != DDP_OK) return r;
    for (c0 = 0; c0 < k->count; c0 = c1) {
        c1 = k->count - c0 < win ? k->count : c0 + win;
        if ((r = ddp__mpi_average_window(ctx, g, 1, b, 0, c0, c1)) != DDP_OK) return r;
        if ((r = ddp__mpi_gather_window(ctx, g + c0, MPI_FLOAT, m->team)) != DDP_OK) return r;
    }
    return DDP_OK;
}

/* Sharded AdamW: every rank's norm blocks to every rank. */
static ddp_result ddp__mpi_norm_exchange(ddp_context *ctx, int unused) {
    ddp__mpi *m = ctx->impl.mpi;
    size_t done, n;
    ddp_result r;
    int rc;
    (void)unused;
    MPI_Comm comm = ddp__mpi_teams(ctx) ? m->team : m->world;   /* replica groups: the group's */
    memset(ctx->shard.norm_sums, 0, ctx->shard.norm_blocks * sizeof(double));
    ddp__norm_blocks(ctx, ctx->shard.norm_sums);
    if ((r = ddp__mpi_check_sigs_on(ctx, comm, ddp__team_world(ctx), ddp__team_peer(ctx, 0), ++m->wseq, DDP__KIND_SUM,
                                    ctx->shard.norm_blocks, 0)) != DDP_OK) return r;
    for (done = 0; done < ctx->shard.norm_blocks; done += n) {
        n = ctx->shard.norm_blocks - done < DDP__MPI_MAX_COUNT ? ctx->shard.norm_blocks - done : DDP__MPI_MAX_COUNT;
        rc = MPI_Allreduce(MPI_IN_PLACE, ctx->shard.norm_sums + done, (int)n, MPI_DOUBLE, MPI_SUM, comm);
        if ((r = ddp__mpi_check(ctx, rc, "MPI_Allreduce")) != DDP_OK) return r;
    }
    return DDP_OK;
}

/* Sharded AdamW: bucket b's updated parts to every rank (bf16 parameters: the working copies). */
static ddp_result ddp__mpi_gather_params(ddp_context *ctx, int b) {
    ddp__mpi *m = ctx->impl.mpi;
    const ddp__bucket *k = &ctx->model.buckets[b];
    size_t win = ddp__mpi_window(ctx), es = ctx->flat.params_bf16 ? sizeof(ddp_bf16) : sizeof(float), c0, c1, lo;
    unsigned char *base = ctx->flat.params_bf16 ? (unsigned char *)(ctx->flat.params_bf16 + k->offset) : (unsigned char *)(ctx->flat.params + k->offset);
    ddp_result r;
    MPI_Comm comm = ddp__mpi_teams(ctx) ? m->team : m->world;   /* replica groups: the group's */
    if (b == 0 && (r = ddp__mpi_check_sigs_on(ctx, comm, ddp__team_world(ctx), ddp__team_peer(ctx, 0), ++m->wseq, DDP__KIND_GATHER,
                                              ctx->flat.count, 0)) != DDP_OK)
        return r;
    for (c0 = 0; c0 < k->count; c0 = c1) {
        c1 = k->count - c0 < win ? k->count : c0 + win;
        ddp__mpi_pieces(ctx, b, 1, c0, c1, &lo);
        if ((r = ddp__mpi_gather_window(ctx, base + c0 * es, ctx->flat.params_bf16 ? MPI_UINT16_T : MPI_FLOAT, comm)) != DDP_OK)
            return r;
    }
    return DDP_OK;
}

/* One of the above, watched like any collective (the watchdog's clock, a failure or cancel first). */
static ddp_result ddp__mpi_watched(ddp_context *ctx, ddp_result (*run)(ddp_context *, int), int arg) {
    ddp_result r;
    if (ddp__failed(ctx)) return ddp__failed(ctx);
    if ((r = ddp__check_cancel(ctx, ctx->what)) != DDP_OK) return r;
    ddp__mpi_busy(ctx, 1);
    r = run(ctx, arg);
    ddp__mpi_busy(ctx, 0);
    return r;
}

/* Replica groups where a group is exactly this host's ranks, in local rank order (the default:
   group_size = local_world_size, with a launcher that numbers a host's ranks together): its
   buckets are averaged through the host's segment (ddp__mpi_host: the CPU backend's staging
   slots, no MPI), the same bits as through the team's communicator (members added in order,
   divided by the group's size; bf16 gradients widened and rounded once, as the CPU backend's
   staged path). Every member decides alike (the layout tables are every rank's). */
static int ddp__mpi_team_is_host(ddp_context *ctx) {
    ddp__mpi *m = ctx->impl.mpi;
    int i, first = ddp__team_peer(ctx, 0), n = ddp__team_world(ctx);
    if (!m->host || m->host->world != n) return 0;
    for (i = 0; i < n; i++)
        if (m->rank_node[first + i] != m->node || m->rank_local[first + i] != i) return 0;
    return 1;
}

static ddp_result ddp__mpi_bucket_host(ddp_context *ctx, int b) {
    ddp__mpi *m = ctx->impl.mpi;
    const ddp__bucket *k = &ctx->model.buckets[b];
    ddp_bf16 *g = ctx->flat.grads_bf16 ? ctx->flat.grads_bf16 + k->offset : NULL;
    size_t j;
    ddp_result r;
    if (g && (m->wire_f32_count < k->count || !m->wire_f32)) {   /* one bucket's floats, kept */
        ddp__free_floats(m->wire_f32);
        m->wire_f32_count = k->count;
        if (!(m->wire_f32 = ddp__alloc_floats(k->count ? k->count : 1)))
            return ddp__fail_group(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for one bucket's %zu floats", k->count);
    }
    m->straggle_counted = 1;   /* the host's arrivals are the group's */
    m->host_at = ddp__now();
    if (g) {
        for (j = 0; j < k->count; j++) m->wire_f32[j] = ddp__from_bf16(g[j]);
        r = ddp__mpi_host(ctx, DDP__KIND_AVG, m->wire_f32, k->count, 0);
        if (r == DDP_OK) for (j = 0; j < k->count; j++) g[j] = ddp__to_bf16(m->wire_f32[j]);
    } else r = ddp__mpi_host(ctx, k->wire.dtype == DDP_DTYPE_BF16 ? DDP__KIND_AVG_BF16 : DDP__KIND_AVG,
                             ctx->flat.grads + k->offset, k->count, 0);
    if (r == DDP_OK) {
        ddp__mpi_host_arrivals(ctx);
        ddp__mpi_arrivals(ctx, 0);
    }
    m->straggle_counted = 0;
    return r;
}

/* Hybrid sharding (desc.shard_group, >>shard) on the MPI backend: each shard group must be one
   host's ranks in local rank order (the case it is for: shard within the fast host, replicate
   across the slow links), so that a bucket's sum is the hierarchical path's. Told at commit. */
static ddp_result ddp__hybrid_mpi_commit(ddp_context *ctx) {
    ddp__mpi *m = ctx->impl.mpi;
    int groups = ctx->world / ctx->shard.hybrid;
    if (!(m->team_host = ddp__mpi_team_is_host(ctx)))
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: shard_group %d (hybrid sharding) on the %s backend needs "
                         "every shard group to be one host's ranks (hierarchical, not DDP_MPI_FLAT; LOCAL_WORLD_SIZE %d, "
                         "ranks %d..%d: %s)", ctx->shard.hybrid, ctx->be->name, ctx->local_world, ddp__team_peer(ctx, 0),
                         ddp__team_peer(ctx, ctx->shard.hybrid - 1), m->flat ? "DDP_MPI_FLAT is set" :
                         "not this host's ranks: shard_group = the ranks a host runs");
    if (!(m->hcounts = (int *)ddp__calloc(sizeof(int) * 4 * (size_t)groups)))
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory");
    m->hdispls = m->hcounts + groups; m->hrcounts = m->hdispls + groups; m->hrdispls = m->hrcounts + groups;
    ddp__log(ctx, DDP_LOG_INFO, "hybrid sharding: the state in parts across host %s's %d ranks, each part averaged across "
             "the %d hosts by MPI among the ranks that hold it", ddp__mpi_host_name(ctx, ctx->rank), ctx->shard.hybrid, groups);
    return DDP_OK;
}

/* Every holder of this part (hcross) in the same exchange, else a named mismatch. */
static ddp_result ddp__hybrid_mpi_sigs(ddp_context *ctx, uint64_t seq, size_t count, int b) {
    ddp__mpi *m = ctx->impl.mpi;
    uint64_t mine[3], *all;
    int i, rc, groups = ctx->world / ctx->shard.hybrid;
    mine[0] = seq; mine[1] = (uint64_t)b; mine[2] = count;
    if (!(all = (uint64_t *)ddp__calloc(sizeof mine * (size_t)groups))) return ddp__fail_group(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory");
    rc = MPI_Allgather(mine, 3, MPI_UINT64_T, all, 3, MPI_UINT64_T, m->hcross);
    if (rc != MPI_SUCCESS) { DDP_FREE(all); return ddp__mpi_check(ctx, rc, "MPI_Allgather"); }
    for (i = 0; i < groups; i++)
        if (memcmp(all + 3 * i, mine, sizeof mine)) {
            int other = i * ctx->shard.hybrid + ddp__team_rank(ctx);
            long long ob = (long long)all[3 * i + 1], oc = (long long)all[3 * i + 2];
            DDP_FREE(all);
            return ddp__fail_group(ctx, DDP_ERR_MISMATCH, "ranks called different collectives: this rank is in the hybrid "
                                   "reduction of gradient bucket %d (%zu elements), rank %d (host %s) in that of bucket %lld "
                                   "(%lld elements)", b, count, other, ddp__mpi_host_name(ctx, other), ob, oc);
        }
    DDP_FREE(all);
    return DDP_OK;
}

/* Bucket b, hybrid: the host's sum of the whole bucket through its segment (the CPU backend's
   staging, local rank order: the hierarchical path's host sum), then this rank's part across
   the hosts among its holders (hcross) as the leaders do the whole bucket (ddp__mpi_leaders_sum:
   each owns a piece, MPI_Alltoallv, the host sums added in host order and divided by the world,
   MPI_Allgatherv): fp32, the unsharded hierarchical bits, with 1/S of the bucket a rank on the
   slow links. bf16 on the wire (bf16 parameters or reduce_dtype BF16): the values rounded to
   bf16 (as the CPU backend's slots carry them) and summed in float the same way, the average
   rounded once; that order (the hosts' sums) is not the unsharded bf16 path's (every rank in
   rank order), so bf16 differs from unsharded by float rounding (HYBRID SHARDING). */
static ddp_result ddp__hybrid_mpi_bucket(ddp_context *ctx, int b) {
    ddp__mpi *m = ctx->impl.mpi;
    const ddp__bucket *k = &ctx->model.buckets[b];
    int groups = ctx->world / ctx->shard.hybrid, me = ctx->rank / ctx->shard.hybrid, i, rc;
    int bf16 = k->wire.grads == DDP_DTYPE_BF16 || k->wire.dtype == DDP_DTYPE_BF16;
    size_t lo, hi, a, z, j, n, mine, c0, c1, win = (size_t)DDP__MPI_MAX_COUNT / (size_t)groups;
    float *f = bf16 ? NULL : ctx->flat.grads + k->offset;
    ddp_result r;
    ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
    lo -= k->offset; hi -= k->offset;
    if (bf16) {
        if (m->hbucket_count < k->count || !m->hbucket) {
            ddp__free_floats(m->hbucket);
            m->hbucket_count = k->count;
            if (!(m->hbucket = ddp__alloc_floats(k->count ? k->count : 1)))
                return ddp__fail_group(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for one bucket's %zu floats", k->count);
        }
        f = m->hbucket;
        if (ctx->flat.grads_bf16) for (j = 0; j < k->count; j++) f[j] = ddp__from_bf16(ctx->flat.grads_bf16[k->offset + j]);
        else for (j = 0; j < k->count; j++) f[j] = ddp__from_bf16(ddp__to_bf16(ctx->flat.grads[k->offset + j]));
    }
    m->straggle_counted = 1;   /* the host's arrivals (the part across hosts is not counted) */
    m->host_at = ddp__now();
    r = ddp__mpi_host(ctx, DDP__KIND_SUM, f, k->count, 0);
    if (r == DDP_OK) { ddp__mpi_host_arrivals(ctx); ddp__mpi_arrivals(ctx, 0); }
    m->straggle_counted = 0;
    if (r != DDP_OK) return r;
    if ((r = ddp__hybrid_mpi_sigs(ctx, ++m->wseq, k->count, b)) != DDP_OK) return r;
    for (c0 = lo; c0 < hi; c0 = c1) {   /* windows: MPI counts are ints */
        c1 = hi - c0 < win ? hi : c0 + win;
        n = c1 - c0;
        ddp__part(n, groups, me, &a, &z);
        mine = z - a;
        if (m->hscratch_count < mine * (size_t)groups || !m->hscratch) {
            ddp__free_floats(m->hscratch);
            m->hscratch_count = mine * (size_t)groups;
            if (!(m->hscratch = ddp__alloc_floats(m->hscratch_count ? m->hscratch_count : 1)))
                return ddp__fail_group(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for %zu floats", m->hscratch_count);
        }
        for (i = 0; i < groups; i++) {
            ddp__part(n, groups, i, &a, &z);
            m->hcounts[i] = (int)(z - a); m->hdispls[i] = (int)a;
            m->hrcounts[i] = (int)mine; m->hrdispls[i] = (int)mine * i;
        }
        rc = MPI_Alltoallv(f + c0, m->hcounts, m->hdispls, MPI_FLOAT, m->hscratch, m->hrcounts, m->hrdispls, MPI_FLOAT, m->hcross);
        if (rc != MPI_SUCCESS) return ddp__mpi_check(ctx, rc, "MPI_Alltoallv");
        for (j = 0; j < mine; j++) {   /* the leaders' arithmetic (ddp__mpi_leaders_sum) */
            float sum = groups > 1 ? m->hscratch[j] + m->hscratch[mine + j] : m->hscratch[j];
            for (i = 2; i < groups; i++) sum += m->hscratch[(size_t)i * mine + j];
            m->hscratch[j] = sum / (float)ctx->world;
        }
        rc = MPI_Allgatherv(m->hscratch, (int)mine, MPI_FLOAT, f + c0, m->hcounts, m->hdispls, MPI_FLOAT, m->hcross);
        if (rc != MPI_SUCCESS) return ddp__mpi_check(ctx, rc, "MPI_Allgatherv");
    }
    if (bf16 && ctx->flat.grads_bf16) for (j = lo; j < hi; j++) ctx->flat.grads_bf16[k->offset + j] = ddp__to_bf16(f[j]);
    else if (bf16) for (j = lo; j < hi; j++) ctx->flat.grads[k->offset + j] = ddp__from_bf16(ddp__to_bf16(f[j]));
    return DDP_OK;
}

/* The communication thread's work for bucket b (ddp__workq_turn): fp32 gradients through the host groups and
   leaders (ddp__mpi_collective_run; sharded too, averaged whole: the bits of unsharded), bf16
   ones among all ranks; with replica groups both among the team (ddp__mpi_bucket_f32), through
   the host's segment where the team is the host's ranks (ddp__mpi_bucket_host). */
static ddp_result ddp__mpi_bucket(ddp_context *ctx, int b) {
    const ddp__bucket *k = &ctx->model.buckets[b];
    double started = ddp__now();
    int f32 = k->wire.grads == DDP_DTYPE_FP32 && k->wire.dtype == DDP_DTYPE_FP32;   /* the plan: fp32 all the way */
    ddp_result r;
    ctx->impl.mpi->straggle_bucket = b + 1;   /* the exchange notes its arrivals (ddp__mpi_arrivals) */
    if (ddp__hybrid(ctx)) {
        r = ddp__mpi_watched(ctx, ddp__hybrid_mpi_bucket, b);
        ctx->impl.mpi->straggle_bucket = 0;
        if (r == DDP_OK && (ctx->desc.inject_comm_latency_ms > 0 || ctx->desc.inject_comm_gbps > 0))
            ddp__inject_comm_delay(ctx, k->wire.bytes, started);
        return r;
    }
    if (f32 && !ddp__mpi_teams(ctx)) {
        r = ddp__mpi_collective_timed(ctx, DDP__KIND_AVG, ctx->flat.grads + k->offset, k->count, 0);
        ctx->impl.mpi->straggle_bucket = 0;
        return r;
    }
    r = ddp__mpi_watched(ctx, ddp__mpi_teams(ctx) && ctx->impl.mpi->team_host ? ddp__mpi_bucket_host
                              : f32 ? ddp__mpi_bucket_f32 : ddp__mpi_bucket_bf16, b);
    ctx->impl.mpi->straggle_bucket = 0;
    if (r == DDP_OK && (ctx->desc.inject_comm_latency_ms > 0 || ctx->desc.inject_comm_gbps > 0))
        ddp__inject_comm_delay(ctx, k->wire.bytes, started);
    return r;
}

/* ZeRO-2: a bucket's MPI calls have all returned, so no peer reads this rank's values of it
   any more: what lies outside this rank's part is released (private memory: MADV_DONTNEED). */
static ddp_result ddp__z2_mpi_bucket(ddp_context *ctx, int b) {
    ddp_result r = ddp__mpi_bucket(ctx, b);
    if (r == DDP_OK && ddp__z2(ctx)) ddp__z2_settled(ctx, b);
    return r;
}

/* Sharded parameters (>>zero3: be->z3_start / z3_wait). A gather of unit u is, per bucket of the
   unit (per window: MPI counts are ints), MPI_Iallgatherv of the team's parts (the equal parts and
   the last member's tail, ddp__shard_range: ZeRO-1's layout after AdamW) from each owner's
   storage (flat.params, or the bf16 working copies: flat-indexed, only its parts kept) into the
   view, on m->z3comm: the world's ranks, the shard group's with hybrid sharding, or the replica
   group's with desc.outer (member s of every group holds the same parts), the ranks that hold
   the unit's parts. Before them a signature ({gathers so far, u}) is all-gathered, so
   ranks that gather different units are named, not left in mismatched exchanges.
   Why nonblocking, started on the program's thread: MPI matches collectives on a communicator by
   the order they are started, and only the program's own calls (ddp_unit_gather, _prefetch and
   the tape's backward) have the same order on every rank; a prefetch thread would race the
   program's next gather, and the comm thread's buckets run in another order (their readiness).
   On a communicator of their own the gathers never meet the buckets' exchanges (world, host,
   leaders, hcross on the comm thread: MPI_THREAD_MULTIPLE, which the backend requires). So
   ddp_unit_prefetch starts the exchange and returns; the transfer goes on while the program
   computes as far as the MPI library progresses nonblocking collectives by itself (Open MPI: while
   any of this rank's threads is inside MPI, as the comm thread is during a backward); the wait
   polls (MPI_Test) and checks the group's failure, cancel and timeout_s, as a watched collective. */
static ddp_result ddp__mpi_z3_check(ddp_context *ctx, int rc, const char *call, int u) {
    char what[DDP__NAME_MAX + 64];
    if (rc == MPI_SUCCESS) return DDP_OK;
    snprintf(what, sizeof what, "the gather of unit '%s' (sharded parameters)", ctx->z3.units[u].name);
    return ddp__mpi_check_in(ctx, rc, call, what);
}

static ddp_result ddp__mpi_z3_start(ddp_context *ctx, int u) {
    ddp__mpi *m = ctx->impl.mpi;
    ddp__mpi_z3 *x = &m->z3[u];
    const ddp__z3_unit *k = &ctx->z3.units[u];
    size_t es = ctx->z3.es, win = ddp__mpi_window(ctx), c0, c1, lo, hi, mine;
    int n = ddp__team_world(ctx), me = ddp__team_rank(ctx), b, s, i, nreq = 1, rc;
    unsigned char *own = ctx->flat.params_bf16 ? (unsigned char *)ctx->flat.params_bf16 : (unsigned char *)ctx->flat.params;
    MPI_Datatype type = es == sizeof(ddp_bf16) ? MPI_UINT16_T : MPI_FLOAT;
    if (ddp__failed(ctx)) return ddp__failed(ctx);
    for (b = 0; b < ctx->model.num_buckets; b++) {
        const ddp__bucket *bk = &ctx->model.buckets[b];
        if (bk->offset >= k->lo && bk->offset + bk->count <= k->hi) nreq += (int)((bk->count + win - 1) / win);
    }
    x->req = (MPI_Request *)ddp__calloc(sizeof(MPI_Request) * (size_t)nreq);
    x->cd = (int *)ddp__calloc(sizeof(int) * 2 * (size_t)n * (size_t)nreq);
    x->sigs = (uint64_t *)ddp__calloc(sizeof(uint64_t) * 2 * (size_t)n);
    if (!x->req || !x->cd || !x->sigs) {
        DDP_FREE(x->req); DDP_FREE(x->cd); DDP_FREE(x->sigs);
        x->req = NULL; x->cd = NULL; x->sigs = NULL;
        return ddp__fail_group(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for the gather of unit '%s'", k->name);
    }
    x->mine[0] = ++m->z3seq;
    x->mine[1] = (uint64_t)u;
    rc = MPI_Iallgather(x->mine, 2, MPI_UINT64_T, x->sigs, 2, MPI_UINT64_T, m->z3comm, &x->req[0]);
    x->nreq = 1;
    if (rc != MPI_SUCCESS) return ddp__mpi_z3_check(ctx, rc, "MPI_Iallgather", u);
    for (b = 0, i = 1; b < ctx->model.num_buckets; b++) {
        const ddp__bucket *bk = &ctx->model.buckets[b];
        if (bk->offset < k->lo || bk->offset + bk->count > k->hi) continue;   /* units cut the buckets: whole ones */
        for (c0 = 0; c0 < bk->count; c0 = c1, i++) {
            int *counts = x->cd + 2 * (size_t)n * (size_t)i, *displs = counts + n;
            c1 = bk->count - c0 < win ? bk->count : c0 + win;
            for (s = 0, mine = c0; s < n; s++) {   /* ddp__mpi_pieces' layout, in this request's own arrays */
                ddp__mpi_piece(ctx, b, 1, c0, c1, s, &lo, &hi);
                counts[s] = (int)(hi - lo);
                displs[s] = (int)(lo - c0);
                if (s == me) mine = lo;
            }
            rc = MPI_Iallgatherv(own + (bk->offset + mine) * es, counts[me], type, ctx->z3.view + (bk->offset + c0) * es, counts,
                                 displs, type, m->z3comm, &x->req[i]);
            x->nreq = i + 1;
            if (rc != MPI_SUCCESS) return ddp__mpi_z3_check(ctx, rc, "MPI_Iallgatherv", u);
        }
    }
    return DDP_OK;
}

/* Requests [from, to) of unit u's gather completed (polled: the group's failure, cancel and
   timeout_s are looked at meanwhile). */
static ddp_result ddp__mpi_z3_poll(ddp_context *ctx, int u, int from, int to) {
    ddp__mpi_z3 *x = &ctx->impl.mpi->z3[u];
    double deadline = ddp__now() + ctx->desc.timeout_s;
    ddp_result r;
    int done = 0, spins = 0, rc;
    for (;;) {
        rc = MPI_Testall(to - from, x->req + from, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return ddp__mpi_z3_check(ctx, rc, "MPI_Testall", u);
        if (done) return DDP_OK;
        if ((r = ddp__failed(ctx)) != DDP_OK) return r;
        if ((r = ddp__check_cancel(ctx, "ddp_unit_gather")) != DDP_OK) return r;
        if (ddp__now() > deadline)
            return ddp__fail_group(ctx, DDP_ERR_TIMEOUT, "the gather of unit '%s' (sharded parameters, MPI) did not complete "
                                   "within %g s: a rank of its %d did not gather or prefetch it (every rank gathers the "
                                   "same units in the same order)", ctx->z3.units[u].name, ctx->desc.timeout_s,
                                   ddp__team_world(ctx));
        if (++spins > 200) ddp__usleep(50);   /* the other threads (the comm thread's buckets) get the cores */
        else ddp__yield();
    }
}

static ddp_result ddp__mpi_z3_wait(ddp_context *ctx, int u) {
    ddp__mpi *m = ctx->impl.mpi;
    ddp__mpi_z3 *x = &m->z3[u];
    ddp_result r;
    int s, n = ddp__team_world(ctx);
    if (!x->nreq) return ddp__failed(ctx);   /* nothing in flight (a failed start: the group knows) */
    if ((r = ddp__mpi_z3_poll(ctx, u, 0, 1)) != DDP_OK) return r;   /* the signatures first: mismatched sizes never wait */
    for (s = 0; s < n; s++)
        if (x->sigs[2 * s] != x->mine[0] || x->sigs[2 * s + 1] != x->mine[1]) {
            int other = ddp__team_peer(ctx, s);
            uint64_t ou = x->sigs[2 * s + 1];
            return ddp__fail_group(ctx, DDP_ERR_MISMATCH, "ranks called different collectives: this rank gathers unit '%s' "
                                   "(its gather %llu of the sharded parameters), rank %d unit '%s' (its gather %llu): every "
                                   "rank gathers and prefetches the same units in the same order", ctx->z3.units[u].name,
                                   (unsigned long long)x->mine[0], other, ou < (uint64_t)ctx->z3.num_units ?
                                   ctx->z3.units[ou].name : "?", (unsigned long long)x->sigs[2 * s]);
        }
    if ((r = ddp__mpi_z3_poll(ctx, u, 1, x->nreq)) != DDP_OK) return r;
    DDP_FREE(x->req); DDP_FREE(x->cd); DDP_FREE(x->sigs);   /* completed: MPI holds none of them now */
    x->req = NULL; x->cd = NULL; x->sigs = NULL;
    x->nreq = 0;
    return DDP_OK;
}

/* AdamW: unsharded the host arithmetic on every rank; sharded, this rank's parts (the norm from
   every rank's blocks), each bucket's parts all-gathered once updated. */
static ddp_result ddp__mpi_adamw(ddp_context *ctx, const ddp_adamw *opt, float b1, float b2, float eps, float *grad_norm_out) {
    ddp__adamw_now now;
    ddp_result r;
    int b, skip;
    if (!ddp__sharded(ctx)) return ddp__host_adamw(ctx, opt, b1, b2, eps, grad_norm_out);
    if ((r = ddp__host_adamw_state(ctx)) != DDP_OK) return ddp__fatal(ctx, r);
    ctx->what = "ddp_adamw_step's exchange of the gradient norm's blocks (shard_optimizer)";
    if ((r = ddp__mpi_watched(ctx, ddp__mpi_norm_exchange, 0)) != DDP_OK) return r;
    r = ddp__adamw_prepare(ctx, opt, b1, b2, eps, ddp__norm_total(ctx->shard.norm_sums, ctx->shard.norm_blocks), grad_norm_out, &now, &skip);
    /* the norm is the team's: its ranks return here alike; with replica groups a group's skipped
       step still gathers (unchanged values), so every group counts the same exchanges */
    if (r != DDP_OK || (skip && !ddp__mpi_teams(ctx))) return r;
    if (ddp__z3(ctx)) {   /* sharded parameters: updated in place, no all-gather (the next gather's exchange reads them) */
        for (b = 0; b < ctx->model.num_buckets && !skip; b++) ddp__adamw_bucket(ctx, b, opt, &now);
        return DDP_OK;
    }
    ctx->what = "ddp_adamw_step's all-gather of the updated parameters (shard_optimizer)";
    for (b = 0; b < ctx->model.num_buckets; b++) {
        if (!skip) ddp__adamw_bucket(ctx, b, opt, &now);
        if ((r = ddp__mpi_watched(ctx, ddp__mpi_gather_params, b)) != DDP_OK) return r;
    }
    return DDP_OK;
}

/* At commit: the counts of the exchanges among all ranks, and for fp32 gradients on a bf16
   wire one bucket's rounded values (the largest bucket's). */
static ddp_result ddp__mpi_ranks_alloc(ddp_context *ctx) {
    ddp__mpi *m = ctx->impl.mpi;
    size_t largest = 0;
    int b;
    if (!(m->wcounts = (int *)ddp__calloc(sizeof(int) * 4 * (size_t)ctx->world))) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory");
    m->wdispls = m->wcounts + ctx->world; m->wrcounts = m->wdispls + ctx->world; m->wrdispls = m->wrcounts + ctx->world;
    if (ctx->flat.grads_bf16 || !ddp__mpi_bf16_wire(ctx)) return DDP_OK;
    for (b = 0; b < ctx->model.num_buckets; b++) if (ctx->model.buckets[b].count > largest) largest = ctx->model.buckets[b].count;
    if (!(m->rounded = (ddp_bf16 *)(void *)ddp__alloc_floats(largest / 2 + 1)))
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for one bucket's %zu bf16 gradients", largest);
    return DDP_OK;
}

/* This host's ranks stop at their next wait, with this rank's message. */
static void ddp__mpi_poison_host(ddp_context *ctx, ddp_result code) {
    ddp_context *h = ctx->impl.mpi->host;
    __atomic_store_n(&ddp__mpi_dirty, 1, __ATOMIC_RELEASE);
    if (!h || !h->impl.cpu || !h->impl.cpu->shm) return;
    pthread_mutex_lock(&ctx->err_lock);
    pthread_mutex_lock(&h->err_lock);
    snprintf(h->err, sizeof h->err, "%s", ctx->err);
    pthread_mutex_unlock(&h->err_lock);
    pthread_mutex_unlock(&ctx->err_lock);
    ddp__set_failed(h, code);
    ddp__cpu_poison(h, code);
}

/* Poison: the store (every rank's watchdog polls it) and this host's segment. */
static void ddp__mpi_poison(ddp_context *ctx, ddp_result code) {
    ddp__mpi *m = ctx->impl.mpi;
    int fd;
    if (!m) return;
    ddp__mpi_poison_host(ctx, code);
    fd = ddp__watchdog_is_me(&m->wd) ? m->wd.fd : ctx->rdv.store_fd;
    ddp__store_poison(ctx, fd, code);
}

/* Which ranks' heartbeats did not move between two looks: the silent hosts, in words. */
static void ddp__mpi_silent(ddp_context *ctx, const long *before, char *out, size_t cap) {
    size_t len = 0;
    int s;
    out[0] = 0;
    for (s = 0; s < ctx->world && len + 48 < cap; s++) {
        char key[32];
        unsigned char *val = NULL;
        uint32_t n = 0, status = 0;
        long now_beat = -1;
        snprintf(key, sizeof key, "mpi/beat/%d", s);
        if (ddp__store_request_on(ctx, ctx->impl.mpi->wd.fd, DDP__OP_GET, key, "0", 1, &val, &n, &status, 0) == DDP_OK &&
            status == DDP__REPLY_OK && val)
            now_beat = atol((const char *)val);
        DDP_FREE(val);
        if (s != ctx->rank && (now_beat < 0 || now_beat == before[s]))
            len += (size_t)snprintf(out + len, cap - len, "%srank %d on host %s", len ? ", " : "", s, ddp__mpi_host_name(ctx, s));
    }
}

static void ddp__mpi_beats(ddp_context *ctx, long *out) {
    int s;
    for (s = 0; s < ctx->world; s++) {
        char key[32];
        unsigned char *val = NULL;
        uint32_t n = 0, status = 0;
        snprintf(key, sizeof key, "mpi/beat/%d", s);
        out[s] = -1;
        if (ddp__store_request_on(ctx, ctx->impl.mpi->wd.fd, DDP__OP_GET, key, "0", 1, &val, &n, &status, 0) == DDP_OK &&
            status == DDP__REPLY_OK && val)
            out[s] = atol((const char *)val);
        DDP_FREE(val);
    }
}

/* The store's words (ddp__watch_store). */
static void ddp__mpi_store_gone(ddp_context *ctx, char *msg, size_t cap) {
    snprintf(msg, cap, "lost the connection to the rendezvous store on rank 0 (host %s, MASTER_ADDR %s): host %s or "
             "the link to it is down", ddp__mpi_host_name(ctx, 0), ctx->job.master_addr, ddp__mpi_host_name(ctx, 0));
}
static void ddp__mpi_store_died(ddp_context *ctx, const char *rank, char *msg, size_t cap) {
    int lost = rank ? atoi(rank) : -1;
    snprintf(msg, cap, "rank %d on host %s died (its connection to the rendezvous store closed)", lost,
             ddp__mpi_host_name(ctx, lost));
}

/* The watchdog's tick (lock held): a wait of 0.1 s that took over DDP__STOPPED_GAP_S: the
   process was stopped (Ctrl-Z of the whole job); that time is not the collective's (as the CPU
   backend's waits). Then what the rank is in, for the look. */
static void ddp__mpi_watch_slept(ddp_context *ctx, double slept) {
    ddp__mpi *m = ctx->impl.mpi;
    if (m->busy_since > 0 && slept > DDP__STOPPED_GAP_S) m->busy_since += slept;
    m->seen_since = m->busy_since;
    snprintf(m->seen_what, sizeof m->seen_what, "%s", m->busy_what);
}

/* This rank's heartbeat; a store that does not answer costs up to timeout_s once, not once per
   request. */
static ddp_result ddp__mpi_watch_beat(ddp_context *ctx, char *msg, size_t cap) {
    ddp__mpi *m = ctx->impl.mpi;
    char key[32], num[24];
    uint32_t status = 0;
    if (ddp__now() < m->next_beat || m->wd.fd < 0) return DDP_OK;
    snprintf(key, sizeof key, "mpi/beat/%d", ctx->rank);
    snprintf(num, sizeof num, "%ld", ++m->beat);
    m->next_beat = ddp__now() + DDP__MPI_BEAT_S;
    if (ddp__store_request_on(ctx, m->wd.fd, DDP__OP_SET, key, num, (uint32_t)strlen(num), NULL, NULL, &status, 0) == DDP_OK ||
        __atomic_load_n(&ctx->closing, __ATOMIC_ACQUIRE))
        return DDP_OK;
    ddp__mpi_store_gone(ctx, msg, cap);
    return DDP_ERR_PEER_LOST;
}

/* The age of the collective in progress: near the deadline a first look at the heartbeats (for
   the silent ones), past it the group fails, naming them. */
static void ddp__mpi_watch_age(ddp_context *ctx) {
    ddp__mpi *m = ctx->impl.mpi;
    char silent[512];
    double since = m->seen_since, now = ddp__now();
    long *before = m->beats_before;
    if (since > 0 && before && now - since > ctx->desc.timeout_s - 3 * DDP__MPI_BEAT_S && m->snap_at < since) {
        ddp__mpi_beats(ctx, before);
        m->snap_at = now;
    } else if (since > 0 && now - since > ctx->desc.timeout_s) {
        if (before && m->snap_at >= since) ddp__mpi_silent(ctx, before, silent, sizeof silent);
        else snprintf(silent, sizeof silent, "?");
        ddp__fail_group(ctx, DDP_ERR_TIMEOUT, "timed out after %g s in %s: no answer across hosts; not heard "
                        "from: %s", ctx->desc.timeout_s, m->seen_what, silent[0] ? silent : "none (a rank stopped?)");
    }
}

/* The watchdog's own look: the heartbeat, a cancel, the age of the collective in progress. */
static ddp_result ddp__mpi_watch_inspect(ddp_context *ctx, char *msg, size_t cap) {
    ddp_result r = ddp__mpi_watch_beat(ctx, msg, cap);
    if (r != DDP_OK) return r;
    if (ddp__cancel_requested(ctx)) ddp__check_cancel(ctx, "a collective across hosts");
    else ddp__mpi_watch_age(ctx);
    return DDP_OK;
}

/* The store is gone, or said the group failed: this host's ranks stop too. */
static void ddp__mpi_watch_failed(ddp_context *ctx, ddp_result r, const char *msg) {
    ddp__set_failed(ctx, ddp__fail(ctx, r, "%s", msg));
    ddp__mpi_poison_host(ctx, r);
}
static void ddp__mpi_watch_on_store(ddp_context *ctx, ddp_result r) { ddp__mpi_poison_host(ctx, r); }

/* Failed while this rank waits in a collective (or soon will): MPI cannot be interrupted. Say
   why, let the peers say theirs, end the job. */
static void ddp__mpi_watch_after(ddp_context *ctx) {
    ddp__mpi *m = ctx->impl.mpi;
    char eb[DDP__ERR_MAX];
    double now = ddp__now();
    if (!ddp__failed(ctx) || m->seen_since <= 0 || __atomic_load_n(&ctx->closing, __ATOMIC_ACQUIRE)) return;
    if (m->failed_at == 0) {
        m->failed_at = now;
        ddp__log(ctx, DDP_LOG_ERROR, "%s", ddp__err_body(ctx, eb));
    } else if (now - m->failed_at > DDP__MPI_ABORT_GRACE_S) {
        ddp__log(ctx, DDP_LOG_ERROR, "ending the job with MPI_Abort: MPI calls cannot be interrupted");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

static void ddp__mpi_watch_hooks(ddp__watchdog_hooks *h) {
    h->cancel_where = "a collective across hosts";
    h->slept = ddp__mpi_watch_slept;
    h->inspect = ddp__mpi_watch_inspect;
    h->on_failure = ddp__mpi_watch_failed;
    h->on_store = ddp__mpi_watch_on_store;
    h->store_gone = ddp__mpi_store_gone;
    h->store_died = ddp__mpi_store_died;
    h->after = ddp__mpi_watch_after;
}

/* Ranks of this host: a context of their own on the CPU backend's segment (LOCAL_RANK and
   LOCAL_WORLD_SIZE as its rank and world); the leader makes the segment and MPI_Bcast names it. */
static ddp_result ddp__mpi_host_up(ddp_context *ctx) {
    char eb[DDP__ERR_MAX];
    ddp__mpi *m = ctx->impl.mpi;
    ddp_context *h;
    char name[64];
    ddp_result r = DDP_OK;
    int rc;
    if (!(h = m->host = (ddp_context *)ddp__calloc(sizeof *h))) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory");
    h->desc = ctx->desc;
    h->desc.log_level = DDP_LOG_OFF;   /* its errors reach the log as this rank's */
    h->rank = h->local_rank = ctx->local_rank;
    h->world = h->local_world = ctx->local_world;
    h->rdv.store_fd = -1;
    ddp__cpu_table(&h->table);
    h->be = &h->table;
    h->tl.origin = ctx->tl.origin;
    pthread_mutex_init(&h->err_lock, NULL);
    if (!(h->impl.cpu = (ddp__cpu *)ddp__calloc(sizeof *h->impl.cpu))) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory");
    memset(name, 0, sizeof name);
    if (h->rank == 0) {
        if ((r = ddp__shm_create(h)) == DDP_OK) snprintf(name, sizeof name, "%s", h->impl.cpu->shm_name);
    }
    rc = MPI_Bcast(name, (int)sizeof name, MPI_CHAR, 0, m->local);
    if (rc != MPI_SUCCESS) return ddp__mpi_check(ctx, rc, "MPI_Bcast");
    if (r != DDP_OK) return ddp__fail(ctx, r, "%s", ddp__err_body(h, eb));
    if (!name[0]) return ddp__fail(ctx, DDP_ERR_SYSTEM, "the leader of host %s could not make its shared memory",
                                   ddp__mpi_host_name(ctx, ctx->rank));
    if (h->rank != 0 && (r = ddp__shm_attach(h, name)) != DDP_OK) return ddp__fail(ctx, r, "%s", ddp__err_body(h, eb));
    __atomic_store_n(&ddp__shm_block(h, h->rank)->tid, (int32_t)ddp__thread_id(), __ATOMIC_RELEASE);
    __atomic_store_n(&ddp__shm_block(h, h->rank)->pid, (int32_t)getpid(), __ATOMIC_RELEASE);
    h->impl.cpu->spin_seconds = h->world > sysconf(_SC_NPROCESSORS_ONLN) ? DDP__SPIN_SECONDS_OVERSUBSCRIBED : DDP__SPIN_SECONDS;
    /* A non-leader waits on its leader, and the leader on the other hosts from a moment later: with
       one timeout, the non-leader's would end first (on a loaded machine) and name its own leader,
       "waiting for rank(s) 0", not the silent host. Its waits outlast the leader's, so the leader's
       poison, which names the host, arrives first. */
    if (h->rank != 0) h->impl.cpu->wait_grace_s = 1.0;
    ctx->what = "the host's shared-memory handshake";
    r = ddp__mpi_host(ctx, DDP__KIND_BARRIER, NULL, 0, 0);
    if (h->rank == 0) shm_unlink(h->impl.cpu->shm_name);
    return r;
}

/* Open MPI's defaults for TCP, set where ddp.h starts MPI and neither mpirun --mca nor an
   OMPI_MCA_ variable chose them (the same on every rank: receivers size eager buffers by it).
   Measured on 1 Gbit/s links (bench/RESULTS.md, "MPI backend across 2 hosts"): the 64 KiB eager
   limit costs a rendezvous round trip per message of a 1 MiB bucket; one TCP connection per
   peer carrying both directions of the exchange falls to half duplex when a rank waits for a
   CPU (two connections keep both directions busy); busy polling takes the CPU that backward and
   the peer need while the communication thread waits. */
static void ddp__mpi_tcp_defaults(void) {
    static const char *const set[][2] = {
        {"OMPI_MCA_btl_tcp_eager_limit", "1048576"}, {"OMPI_MCA_btl_tcp_rndv_eager_limit", "1048576"},
        {"OMPI_MCA_btl_tcp_max_send_size", "1048576"}, {"OMPI_MCA_btl_tcp_links", "2"},
        {"OMPI_MCA_mpi_yield_when_idle", "1"}};
    size_t i;
    const char *no = getenv("DDP_MPI_TUNE");
    if (no && !strcmp(no, "0")) return;
    for (i = 0; i < sizeof set / sizeof set[0]; i++) setenv(set[i][0], set[i][1], 0);
}

/* A rank bound to one CPU (Open MPI binds to a core when there are 2 ranks or fewer) runs
   backward, the communication thread and MPI's progress on that one CPU: overlap cannot pay. */
static void ddp__mpi_check_binding(ddp_context *ctx) {
#if defined(__linux__) && defined(CPU_COUNT)
    cpu_set_t set;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    CPU_ZERO(&set);
    if (online > 1 && sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) == 1)
        ddp__log(ctx, DDP_LOG_WARN, "rank %d is bound to one CPU of %ld (mpirun binds to a core by default): backward, "
                 "the communication thread and MPI's progress share it; start with mpirun --bind-to none, or give each "
                 "rank several (--map-by ppr:N:node:PE=K)", ctx->rank, online);
#else
    (void)ctx;
#endif
}

/* MPI up (ours, or the program's), with the thread level the backend needs. */
static ddp_result ddp__mpi_start(ddp_context *ctx) {
    int init = 0, fin = 0, provided = 0, size = 0, me = -1;
    MPI_Finalized(&fin);
    if (fin) return ddp__fail(ctx, DDP_ERR_BACKEND, "MPI was finalized already: the MPI backend cannot start again");
    MPI_Initialized(&init);
    if (!init && !getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMIX_RANK") && !getenv("PMI_RANK") && !getenv("PMI_SIZE"))
        return ddp__fail(ctx, DDP_ERR_BAD_ENV, "the MPI backend needs the ranks started as one MPI job (mpirun, srun "
                         "--mpi=pmix), but no MPI launcher started this rank (no OMPI_COMM_WORLD_SIZE, PMIX_RANK or "
                         "PMI_RANK): ddprun --nnodes starts ranks that MPI cannot connect (Open MPI's singletons do not "
                         "support MPI_Comm_join); use mpirun -H host1:N,host2:N");
    if (!init) {
        ddp__mpi_tcp_defaults();
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
            return ddp__fail(ctx, DDP_ERR_BACKEND, "MPI_Init_thread failed");
        ddp__mpi_owned = 1;
        atexit(ddp__mpi_atexit);
    } else MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE)
        return ddp__fail(ctx, DDP_ERR_BACKEND, "the MPI backend needs MPI_THREAD_MULTIPLE (buckets are reduced on its "
                         "communication thread, user collectives on the rank's, and its watchdog may call MPI_Abort "
                         "while either waits), but MPI granted level %d%s", provided, ddp__mpi_owned ? "" :
                         ": the program called MPI_Init; call MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) instead");
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (size != ctx->world || me != ctx->rank)
        return ddp__fail(ctx, DDP_ERR_BAD_ENV, "the MPI backend needs the ranks started as one MPI job (mpirun, srun "
                         "--mpi=pmix): MPI_COMM_WORLD has %d rank(s) and this is its rank %d, but the environment says "
                         "rank %d of %d (ddprun starts ranks that MPI does not know of)", size, me, ctx->rank, ctx->world);
    return DDP_OK;
}

/* Who is where: every rank's host, local rank and flat setting; the leaders; the host groups. */
static ddp_result ddp__mpi_layout(ddp_context *ctx) {
    ddp__mpi *m = ctx->impl.mpi;
    int mine[3], *all, s, rc, lsize = 1, lrank = 0, count[2];
    char host[64];
    const char *flat = getenv("DDP_MPI_FLAT");
    ddp_result r = DDP_OK;
    memset(host, 0, sizeof host);
    gethostname(host, sizeof host - 1);
    m->flat = flat && strcmp(flat, "0") && *flat;
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &m->world)) != MPI_SUCCESS) return ddp__mpi_check(ctx, rc, "MPI_Comm_dup");
    MPI_Comm_set_errhandler(m->world, MPI_ERRORS_RETURN);
    /* the team's own communicator, members in rank order (without replica groups: every rank).
       Every rank splits, whatever its settings: ranks that disagree on them are told at commit
       (the layout check), not left in a collective only some of them call. */
    ctx->what = "the split of the replica groups' communicators";
    if ((rc = MPI_Comm_split(m->world, ddp__hybrid(ctx) ? ctx->rank / ctx->shard.hybrid : ctx->outer.group, ctx->rank,
                             &m->team)) != MPI_SUCCESS) {
        m->team = MPI_COMM_NULL;
        return ddp__mpi_check(ctx, rc, "MPI_Comm_split");
    }
    MPI_Comm_set_errhandler(m->team, MPI_ERRORS_RETURN);
    /* hybrid sharding: member s of every shard group (every rank splits: MPI_UNDEFINED without it) */
    if ((rc = MPI_Comm_split(m->world, ddp__hybrid(ctx) ? ddp__team_rank(ctx) : MPI_UNDEFINED, ctx->rank, &m->hcross)) != MPI_SUCCESS) {
        m->hcross = MPI_COMM_NULL;
        return ddp__mpi_check(ctx, rc, "MPI_Comm_split");
    }
    if (m->hcross != MPI_COMM_NULL) MPI_Comm_set_errhandler(m->hcross, MPI_ERRORS_RETURN);
    m->hosts = (char (*)[64])ddp__calloc(64 * (size_t)ctx->world);
    m->rank_node = (int *)ddp__calloc(sizeof(int) * (size_t)ctx->world);
    m->rank_local = (int *)ddp__calloc(sizeof(int) * (size_t)ctx->world);
    all = (int *)ddp__calloc(sizeof mine * (size_t)ctx->world);
    if (!m->hosts || !m->rank_node || !m->rank_local || !all) { DDP_FREE(all); return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory"); }
    ctx->what = "the exchange of host names";
    if ((rc = MPI_Allgather(host, 64, MPI_CHAR, m->hosts, 64, MPI_CHAR, m->world)) != MPI_SUCCESS) { DDP_FREE(all); return ddp__mpi_check(ctx, rc, "MPI_Allgather"); }
    if (!m->flat) {
        if ((rc = MPI_Comm_split_type(m->world, MPI_COMM_TYPE_SHARED, ctx->rank, MPI_INFO_NULL, &m->local)) != MPI_SUCCESS) { DDP_FREE(all); return ddp__mpi_check(ctx, rc, "MPI_Comm_split_type"); }
        MPI_Comm_set_errhandler(m->local, MPI_ERRORS_RETURN);
        MPI_Comm_size(m->local, &lsize);
        MPI_Comm_rank(m->local, &lrank);
    }
    m->leader = m->flat || lrank == 0;
    mine[0] = m->flat; mine[1] = lsize; mine[2] = lrank;
    if ((rc = MPI_Allgather(mine, 3, MPI_INT, all, 3, MPI_INT, m->world)) != MPI_SUCCESS) { DDP_FREE(all); return ddp__mpi_check(ctx, rc, "MPI_Allgather"); }
    for (s = 0; s < ctx->world && r == DDP_OK; s++) {
        if (all[3 * s] != m->flat)
            r = ddp__fail(ctx, DDP_ERR_MISMATCH, "ranks disagree on DDP_MPI_FLAT: rank %d (host %s) has %d, this rank %d",
                          s, m->hosts[s], all[3 * s], m->flat);
        m->rank_local[s] = m->flat ? 0 : all[3 * s + 2];
    }
    DDP_FREE(all);
    if (r != DDP_OK) return r;
    if (!m->flat && (lsize != ctx->local_world || lrank != ctx->local_rank))
        return ddp__fail(ctx, DDP_ERR_BAD_ENV, "LOCAL_RANK=%d and LOCAL_WORLD_SIZE=%d disagree with MPI, which puts this "
                         "rank as %d of %d on host %s", ctx->local_rank, ctx->local_world, lrank, lsize, host);
    rc = MPI_Comm_split(m->world, m->leader ? 0 : MPI_UNDEFINED, ctx->rank, &m->leaders);
    if (rc != MPI_SUCCESS) return ddp__mpi_check(ctx, rc, "MPI_Comm_split");
    if (m->leader) {
        MPI_Comm_set_errhandler(m->leaders, MPI_ERRORS_RETURN);
        MPI_Comm_size(m->leaders, &m->nodes);
        MPI_Comm_rank(m->leaders, &m->node);
    }
    count[0] = m->node; count[1] = m->nodes;
    if (!m->flat && (rc = MPI_Bcast(count, 2, MPI_INT, 0, m->local)) != MPI_SUCCESS) return ddp__mpi_check(ctx, rc, "MPI_Bcast");
    m->node = count[0]; m->nodes = count[1];
    if ((rc = MPI_Allgather(&m->node, 1, MPI_INT, m->rank_node, 1, MPI_INT, m->world)) != MPI_SUCCESS) return ddp__mpi_check(ctx, rc, "MPI_Allgather");
    m->counts = (int *)ddp__calloc(sizeof(int) * 4 * (size_t)m->nodes);
    if (!m->counts) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory");
    m->displs = m->counts + m->nodes; m->rcounts = m->displs + m->nodes; m->rdispls = m->rcounts + m->nodes;
    return DDP_OK;
}

static ddp_result ddp__mpi_setup(ddp_context *ctx, double deadline) {
    ddp__mpi *m;
    ddp_result r;
    if (!(m = ctx->impl.mpi = (ddp__mpi *)ddp__calloc(sizeof *m))) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory");
    m->world = m->local = m->leaders = m->team = MPI_COMM_NULL;
    m->hcross = MPI_COMM_NULL;
    m->z3comm = MPI_COMM_NULL;
    ddp__workq_init(&m->comm, ctx, ddp__z2_mpi_bucket);
    pthread_mutex_init(&m->lock, NULL);
    ddp__watchdog_init(&m->wd, ctx, &m->lock);
    ddp__mpi_watch_hooks(&m->wd.hooks);
    m->beats_before = (long *)ddp__calloc(sizeof(long) * (size_t)ctx->world);   /* NULL: no names at a timeout */
    if ((r = ddp__mpi_start(ctx)) != DDP_OK) return r;
    ddp__mpi_check_binding(ctx);
    if ((r = ddp__store_connect_as(ctx, deadline, -1, &m->wd.fd)) != DDP_OK) return r;
    if (ddp__watchdog_start(&m->wd)) return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot start the MPI watchdog thread");
    ddp__mpi_busy(ctx, 1);   /* set-up's collectives are watched too */
    r = ddp__mpi_layout(ctx);
    if (r == DDP_OK && !m->flat && ctx->local_world > 1) r = ddp__mpi_host_up(ctx);
    ddp__mpi_busy(ctx, 0);
    if (r != DDP_OK) return r;
    ddp__log(ctx, DDP_LOG_INFO, "rank %d of %d up (mpi backend%s, host %s, %d in the inter-host allreduce)", ctx->rank, ctx->world,
             m->flat ? ", flat" : "", ddp__mpi_host_name(ctx, ctx->rank), m->nodes);
    return DDP_OK;
}

/* ZeRO-3's commit without a whole-model copy (ddp__z3_seed_mpi): rank 0 writes a chunk of the
   flat buffer's initial values (the program's, registered with each parameter; padding and NULL
   are zeros) into a staging buffer, the world's broadcast (hierarchical: the host's shared memory,
   then the leaders) brings it to every rank, and each copies the pieces of its parts inside it
   (bf16: into the fp32 master's packed parts and, rounded, the working copies). A broadcast, not
   a scatter: every shard group's member s (hybrid) or replica group's (desc.outer) holds part s,
   so a part goes to several ranks, and the host-first path is the whole broadcast's. Each rank
   holds its parts and the chunk (DDP__Z3_SEED_FLOATS), never the model; the same values as the
   broadcast of rank 0's whole buffer. Pages of the whole-size buffers outside the parts stay
   untouched (ddp__host_alloc_untouched). */
#define DDP__Z3_SEED_FLOATS ((size_t)1 << 20)   /* 4 MB a chunk: 16 broadcasts a 64 MB model */
static ddp_result ddp__mpi_z3_seed(ddp_context *ctx) {
    size_t chunk = ctx->flat.count < DDP__Z3_SEED_FLOATS ? ctx->flat.count : DDP__Z3_SEED_FLOATS, c0, c1, lo, hi, a, z, x;
    int bf16 = ctx->flat.params_bf16 != NULL, parts = ddp__master_parts(ctx), b, i;
    float *stage, *m;
    ddp_result r = DDP_OK;
    /* out of memory: the group is failed (the peers wait in the broadcast; they read why) */
    if (bf16 && !(ctx->flat.params = ddp__alloc_floats(parts ? (ctx->shard.count ? ctx->shard.count : 1) : ctx->flat.count)))
        return ddp__fatal(ctx, ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for %zu floats of the fp32 master",
                                         parts ? ctx->shard.count : ctx->flat.count));
    if (!(stage = ddp__alloc_floats(chunk ? chunk : 1)))
        return ddp__fatal(ctx, ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for the sharded parameters' staging (%zu floats)",
                                         chunk));
    ctx->what = "ddp_commit's seeding of the sharded parameters (the broadcast of rank 0's initial values, a chunk at a time)";
    for (c0 = 0; c0 < ctx->flat.count && r == DDP_OK; c0 = c1) {
        c1 = ctx->flat.count - c0 < chunk ? ctx->flat.count : c0 + chunk;
        if (ctx->rank == 0) {   /* [c0, c1) at stage[0 ..], padding zeros */
            memset(stage, 0, (c1 - c0) * sizeof(float));
            for (i = 0; i < ctx->model.num_params; i++) {
                const ddp__param *p = &ctx->model.params[i];
                size_t s0 = p->offset > c0 ? p->offset : c0, s1 = p->offset + p->count < c1 ? p->offset + p->count : c1;
                if (p->init && s1 > s0) memcpy(stage + (s0 - c0), p->init + (s0 - p->offset), (s1 - s0) * sizeof(float));
            }
        }
        if ((r = ddp__mpi_collective_timed(ctx, DDP__KIND_BROADCAST, stage, (c1 - c0) * sizeof(float), 0)) != DDP_OK) break;
        for (b = 0; b < ctx->model.num_buckets; b++) {   /* this rank's parts inside the chunk: [a, z) */
            ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
            a = lo > c0 ? lo : c0;
            z = hi < c1 ? hi : c1;
            if (z <= a) continue;
            if (!bf16) { memcpy(ctx->flat.params + a, stage + (a - c0), (z - a) * sizeof(float)); continue; }
            m = ctx->flat.params + (parts ? ctx->shard.base[b] + (a - lo) : a);   /* flat element a in the master */
            for (x = a; x < z; x++) {
                m[x - a] = stage[x - c0];
                ctx->flat.params_bf16[x] = ddp__to_bf16(stage[x - c0]);
            }
        }
    }
    ddp__free_floats(stage);
    for (i = 0; i < ctx->model.num_params; i++) ctx->model.params[i].init = NULL;
    ctx->z3.seeded = r == DDP_OK;
    return r;
}

static ddp_result ddp__mpi_commit(ddp_context *ctx) {
    ddp_result r;
    ctx->what = "the broadcast of rank 0's initial parameters";
    if (ddp__z3_seed_mpi(ctx)) r = ddp__mpi_z3_seed(ctx);
    else r = ddp__mpi_collective_timed(ctx, DDP__KIND_BROADCAST, ctx->flat.params, ctx->flat.count * sizeof(float), 0);
    if (r != DDP_OK) return r;
    if ((r = ddp__mpi_ranks_alloc(ctx)) != DDP_OK) return ddp__fatal(ctx, r);
    if (ddp__hybrid(ctx) && (r = ddp__hybrid_mpi_commit(ctx)) != DDP_OK) return ddp__fatal(ctx, r);
    if (ctx->desc.shard == DDP_SHARD_PARAMETERS) {   /* the gathers' own communicator (ddp__mpi_z3_start says why) */
        int rc;
        ctx->what = "the duplicate of the team's communicator for the sharded parameters' gathers";
        if ((rc = MPI_Comm_dup(ctx->impl.mpi->team, &ctx->impl.mpi->z3comm)) != MPI_SUCCESS) {
            ctx->impl.mpi->z3comm = MPI_COMM_NULL;
            return ddp__mpi_check(ctx, rc, "MPI_Comm_dup");
        }
        MPI_Comm_set_errhandler(ctx->impl.mpi->z3comm, MPI_ERRORS_RETURN);
        if (!(ctx->impl.mpi->z3 = (ddp__mpi_z3 *)ddp__calloc(sizeof(ddp__mpi_z3) * (size_t)(ctx->z3.num_units ? ctx->z3.num_units : 1))))
            return ddp__fatal(ctx, ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for the units' gathers"));
    }
    if (ddp__mpi_teams(ctx) && ctx->outer.size > 1) {
        ctx->impl.mpi->team_host = ddp__mpi_team_is_host(ctx);
        ddp__log(ctx, DDP_LOG_INFO, "replica group %d (ranks %d..%d): its buckets through %s", ctx->outer.group,
                 ddp__team_peer(ctx, 0), ddp__team_peer(ctx, ctx->outer.size - 1),
                 ctx->impl.mpi->team_host ? "the host's shared memory (the group is the host's ranks)" : "its MPI communicator");
    }
    if ((r = ddp__workq_start(&ctx->impl.mpi->comm)) != DDP_OK) return ddp__fatal(ctx, r);
    return DDP_OK;
}

static void ddp__mpi_begin_step(ddp_context *ctx) {
    if (ctx->impl.mpi->host) ddp__cpu_begin_step(ctx->impl.mpi->host);
}

static ddp_result ddp__mpi_launch(ddp_context *ctx, int index) {
    ddp__mpi *m = ctx->impl.mpi;
    ctx->step.stats.buckets_launched++;
    ctx->step.stats.bytes_reduced += ctx->model.buckets[index].wire.bytes;
    ddp__workq_push(&m->comm, 1);
    return DDP_OK;
}

static ddp_result ddp__mpi_finish(ddp_context *ctx, double t_wait) {
    ddp__mpi *m = ctx->impl.mpi;
    ddp_result r;
    int cancel_state;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
    r = ddp__workq_wait(&m->comm, 0, &ctx->step.stats);
    ddp__straggle_fold(&m->straggle, &ctx->step.stats);
    pthread_setcancelstate(cancel_state, NULL);
    ddp__host_step_done(ctx, t_wait);
    return r;
}

static ddp_result ddp__mpi_collective(ddp_context *ctx, uint32_t kind, void *data, size_t count, int root) {
    double t0 = ddp__now();
    ddp_result r = ddp__mpi_collective_timed(ctx, kind, data, count, root);
    if (ctx->tl.main && (kind == DDP__KIND_SUM || kind == DDP__KIND_AVG))
        ddp__record(ctx, ctx->tl.comm, DDP__EV_ALLREDUCE, t0, ddp__now(), -1, count * sizeof(float));
    return r;
}

static void ddp__mpi_stop(ddp_context *ctx) {
    if (ctx->impl.mpi) ddp__workq_stop(&ctx->impl.mpi->comm);
}

static void ddp__mpi_teardown(ddp_context *ctx) {
    ddp__mpi *m = ctx->impl.mpi;
    if (m) {
        ddp__mpi_stop(ctx);
        ddp__watchdog_stop(&m->wd);
        ddp__watchdog_destroy(&m->wd);   /* and its store connection closed */
        if (m->host) {
            ddp_context *h = m->host;
            if (h->impl.cpu) {
                if (h->impl.cpu->shm) {
                    munmap(h->impl.cpu->shm, h->impl.cpu->shm_bytes);
                    if (h->rank == 0) shm_unlink(h->impl.cpu->shm_name);   /* already gone unless set-up failed */
                }
                DDP_FREE(h->impl.cpu);
            }
            pthread_mutex_destroy(&h->err_lock);
            DDP_FREE(h);
        }
        if (ddp__failed(ctx)) __atomic_store_n(&ddp__mpi_dirty, 1, __ATOMIC_RELEASE);   /* MPI_Finalize would wait for the lost */
        else {
            if (m->team != MPI_COMM_NULL) MPI_Comm_free(&m->team);
            if (m->hcross != MPI_COMM_NULL) MPI_Comm_free(&m->hcross);
            if (m->z3comm != MPI_COMM_NULL) MPI_Comm_free(&m->z3comm);
            if (m->leaders != MPI_COMM_NULL) MPI_Comm_free(&m->leaders);
            if (m->local != MPI_COMM_NULL) MPI_Comm_free(&m->local);
            if (m->world != MPI_COMM_NULL) MPI_Comm_free(&m->world);
        }
        ddp__free_floats(m->scratch);
        ddp__free_floats((float *)(void *)m->wire);
        ddp__free_floats(m->wire_f32);
        ddp__free_floats((float *)(void *)m->rounded);
        ddp__free_floats(m->hscratch);
        ddp__free_floats(m->hbucket);
        DDP_FREE(m->z3);   /* each unit's arrays went at its wait (after a failure a request may still hold them: left) */
        DDP_FREE(m->hcounts);
        DDP_FREE(m->wcounts);
        DDP_FREE(m->counts);
        DDP_FREE(m->hosts);
        DDP_FREE(m->rank_node);
        DDP_FREE(m->rank_local);
        ddp__workq_destroy(&m->comm);
        DDP_FREE(m->beats_before);
        pthread_mutex_destroy(&m->lock);
        DDP_FREE(m);
        ctx->impl.mpi = NULL;
    }
    if (ddp__failed(ctx)) ddp__shm_sweep_stale(ctx);
    ddp__host_free(ctx);
}

/* The outer exchange of groups of one rank (>>outer): one MPI_Allgather among all ranks, which
   uses both directions of every link at once (a broadcast from each rank in turn would not). The
   slots are `stride` apart: a derived type whose extent is the stride. */
static ddp_result ddp__mpi_allgather(ddp_context *ctx, unsigned char *recv, size_t bytes, size_t stride) {
    ddp__mpi *m = ctx->impl.mpi;
    MPI_Datatype slot, spaced;
    ddp_result r;
    int rc;
    if (ddp__failed(ctx)) return ddp__failed(ctx);
    if ((r = ddp__check_cancel(ctx, ctx->what)) != DDP_OK) return r;
    if (bytes > DDP__MPI_MAX_COUNT || stride > DDP__MPI_MAX_COUNT)
        return ddp__fail_group(ctx, DDP_ERR_INVALID_ARGUMENT, "%s: %zu bytes a rank is above MPI's count (use more fragments)",
                               ctx->what, bytes);
    ddp__mpi_busy(ctx, 1);
    r = ddp__mpi_check_sigs_on(ctx, m->world, ctx->world, 0, ++m->wseq, DDP__KIND_OUTER, bytes, 0);   /* member i: rank 0 + i */
    if (r == DDP_OK) {
        MPI_Type_contiguous((int)bytes, MPI_BYTE, &slot);
        MPI_Type_create_resized(slot, 0, (MPI_Aint)stride, &spaced);
        MPI_Type_commit(&spaced);
        rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, 1, spaced, m->world);
        MPI_Type_free(&spaced);
        MPI_Type_free(&slot);
        r = ddp__mpi_check(ctx, rc, "MPI_Allgather");
    }
    ddp__mpi_busy(ctx, 0);
    return r;
}

/* A broadcast among the team only (be->team_bcast): its communicator (the world's without groups). */
static ddp_result ddp__mpi_team_bcast(ddp_context *ctx, void *data, size_t bytes, int member) {
    ddp__mpi *m = ctx->impl.mpi;
    MPI_Comm comm = ddp__mpi_teams(ctx) ? m->team : m->world;
    size_t done, n;
    ddp_result r;
    int rc;
    if (ddp__failed(ctx)) return ddp__failed(ctx);
    if ((r = ddp__check_cancel(ctx, ctx->what)) != DDP_OK) return r;
    ddp__mpi_busy(ctx, 1);
    r = ddp__mpi_check_sigs_on(ctx, comm, ddp__team_world(ctx), ddp__team_peer(ctx, 0), ++m->wseq, DDP__KIND_BROADCAST, bytes,
                               member);
    for (done = 0; done < bytes && r == DDP_OK; done += n) {
        n = bytes - done < DDP__MPI_MAX_COUNT ? bytes - done : DDP__MPI_MAX_COUNT;
        rc = MPI_Bcast((unsigned char *)data + done, (int)n, MPI_BYTE, member, comm);
        r = ddp__mpi_check(ctx, rc, "MPI_Bcast");
    }
    ddp__mpi_busy(ctx, 0);
    return r;
}

static void ddp__mpi_table(ddp__backend *t) {
    ddp__host_table(t);
    t->name = "mpi";
    t->id = DDP_BACKEND_MPI;
    t->shards = 1;
    t->shards_grads = 1;
    t->setup = ddp__mpi_setup;
    t->commit = ddp__mpi_commit;
    t->begin_step = ddp__mpi_begin_step;
    t->launch = ddp__mpi_launch;
    t->finish = ddp__mpi_finish;
    t->adamw = ddp__mpi_adamw;
    t->collective = ddp__mpi_collective;
    t->allgather = ddp__mpi_allgather;
    t->team_bcast = ddp__mpi_team_bcast;
    t->z3_start = ddp__mpi_z3_start;
    t->z3_wait = ddp__mpi_z3_wait;
    t->poison = ddp__mpi_poison;
    t->stop = ddp__mpi_stop;
    t->teardown = ddp__mpi_teardown;
}
#endif /* DDP_MPI */

/* --------------------------------------------------------------------------------------------
   >>nccl  The NCCL backend. Flat parameters, gradients and AdamW state live in device memory.
   There is no communication thread: launching a bucket is enqueueing it. An event recorded on
   the compute stream when the bucket's last gradient is ready makes the comm stream wait, the
   comm stream averages the bucket in place (ncclAvg), and at ddp_finish the compute stream
   waits for the last bucket. The host never waits inside a step. The communicator is
   non-blocking, so no NCCL call can hang the caller; a watchdog thread polls NCCL's
   asynchronous errors, the age of unfinished communication (timeout_s) and the store's poison
   key, and aborts the communicator instead of letting the job hang, until teardown is done.
   With replica groups of several ranks (>>outer) a second communicator spans the group's ranks
   and carries the buckets; everything else stays on the world's, and the life, the watchdog's
   look, aborts and teardown cover both. Hybrid sharding: the second spans the shard group, a
   third (DDP__NCCL_CROSS) the holders of this rank's part across the groups; all three alike.
   Every CUDA and NCCL call is checked; a failure is DDP_ERR_BACKEND (or _PEER_LOST, _TIMEOUT)
   with the call, file, line and rank.
   -------------------------------------------------------------------------------------------- */
#ifdef DDP_CUDA
/* The watchdog's clock for unfinished communication, kept as two groups: the oldest (its event
   recorded at the first enqueue after everything before it was seen done, counting from then)
   and everything enqueued since (one event re-recorded at each enqueue, so it covers them all).
   When the oldest group completes, the newer one takes its place and counts from that moment:
   a timeout means no progress for timeout_s. (One event re-recorded at every enqueue, counting
   from the first, is never seen complete while the host keeps ahead of the GPU, and a healthy
   job that never waits on the host would be aborted timeout_s after its first bucket.) Plain
   logic, no CUDA calls: tests/gpu/test_kernel_math_host.cu drives it without a GPU. */
typedef struct ddp__watch {
    double since;                  /* when the oldest group began to count; 0: nothing pending */
    int newer;                     /* something was enqueued after the oldest group */
    char what[96], newer_what[96]; /* the first operation of each group, for messages */
} ddp__watch;

/* An enqueue at `now`: returns which event to record, 0 the oldest group's, 1 the newer one's. */
static int ddp__watch_enqueue(ddp__watch *w, double now, const char *what) {
    if (w->since == 0) {
        w->since = now;
        snprintf(w->what, sizeof w->what, "%s", what);
        return 0;
    }
    if (!w->newer) snprintf(w->newer_what, sizeof w->newer_what, "%s", what);
    w->newer = 1;
    return 1;
}

/* What a query of the oldest group's event found (done or not) at `now`. Returns 1 when the
   newer group became the oldest: the caller swaps the two events and queries again. */
static int ddp__watch_progress(ddp__watch *w, int done, double now) {
    if (w->since == 0 || !done) return 0;
    if (!w->newer) { w->since = 0; return 0; }
    w->since = now;
    w->newer = 0;
    memcpy(w->what, w->newer_what, sizeof w->what);
    return 1;
}

static int ddp__watch_expired(const ddp__watch *w, double now, double timeout_s) {
    return w->since > 0 && now - w->since > timeout_s;
}

/* The watchdog's 0.1 s wait took `slept` seconds: beyond DDP__STOPPED_GAP_S the process could not
   run (stopped with the whole job by Ctrl-Z, say), and that time is not waiting for the peers. */
static void ddp__watch_slept(ddp__watch *w, double slept) {
    if (w->since > 0 && slept > DDP__STOPPED_GAP_S) w->since += slept;
}

/* Who may call NCCL on the communicator, and who frees it: the decisions of ddp__nccl_enter,
   _leave, _claim and ddp__gpu_abort, as plain logic (the callers hold the lock and make the
   NCCL call the answer asks for). tests/gpu/test_kernel_math_host.cu drives it without a GPU. */
typedef struct ddp__life {
    int live;                      /* created, neither destroyed nor aborted */
    int in_call;                   /* threads inside an NCCL call on it */
    int abort_pending;             /* abort asked for while in_call > 0: the last one out aborts */
} ddp__life;

static int ddp__life_enter(ddp__life *l) {            /* 1: call NCCL, then leave */
    if (!l->live || l->abort_pending) return 0;
    l->in_call++;
    return 1;
}
static int ddp__life_leave(ddp__life *l) {            /* 1: abort it now */
    if (--l->in_call > 0 || !l->abort_pending || !l->live) return 0;
    l->live = 0;
    return 1;
}
static int ddp__life_abort(ddp__life *l) {            /* 1: abort it now */
    if (!l->live) return 0;
    if (l->in_call) { l->abort_pending = 1; return 0; }
    l->live = 0;
    return 1;
}
static int ddp__life_claim(ddp__life *l) {            /* 1: destroy it now */
    if (!l->live || l->in_call || l->abort_pending) return 0;
    l->live = 0;
    return 1;
}

struct ddp__gpu {
    int device;
    cudaStream_t compute;          /* the program's (desc.cuda_stream); NULL: legacy default */
    cudaStream_t comm;             /* ours: bucket allreduces */
    ncclComm_t nccl;               /* non-blocking: no NCCL call waits for the peers */
    ddp__life life;                /* under lock */
    ncclComm_t team;               /* replica groups of several ranks (>>outer): the group's ranks, for the
                                      buckets (ddp__team_*); NULL: the buckets go on nccl */
    ddp__life team_life;           /* team's, under lock */
    ncclComm_t cross;              /* hybrid sharding (desc.shard_group): the holders of this rank's part, member
                                      ddp__team_rank of every shard group (ranks s, s + S, ...), for each bucket's
                                      part across the groups (ddp__nccl_hybrid); NULL otherwise */
    ddp__life cross_life;          /* cross's, under lock */
    pthread_mutex_t lock;          /* life, the watch fields; never held across an NCCL call */
    cudaEvent_t *ready;            /* per bucket: the compute stream reached its last gradient */
    cudaEvent_t *comm_start[2], *comm_end[2];   /* per bucket; two steps' worth (parity) */
    cudaEvent_t *comm_cross[2];    /* hybrid: per bucket, the group's reduce-scatter done, the part's allreduce
                                      across the groups begins (the timeline's two spans) */
    cudaEvent_t step_begin[2], step_finish[2];
    int timed[2], last_bucket[2];  /* that parity holds a step whose times are not read yet */
    double host_begin[2];          /* host clock when step_begin was recorded: the timeline's anchor */
    ddp_step_stats timed_stats[2];
    unsigned char *no_decay;       /* one byte per DDP_K_MASK_GROUP elements */
    double *norm_blocks;           /* ddp.h's norm: one sum of squares per block (ctx->shard.norm_blocks) */
    cudaEvent_t *updated;          /* sharded, per bucket: the compute stream updated this rank's part */
    cudaEvent_t gathered;          /* sharded: the comm stream has all-gathered every bucket */
    /* ZeRO-2 (ddp__z2, ddp__gpu_z2_*): the gradients (flat.grads, or grads_bf16) are a device
       range (>>nccl-vm) whose holders are this rank's parts (the whole run) and each bucket's
       span (from ddp_zero_grad to the end of the ddp_adamw_step after its reduce-scatter) */
    struct ddp__gvm *z2vm;
    size_t *z2_span;               /* per bucket b: elements [z2_span[2b], z2_span[2b + 1]); the spans tile the buffer */
    unsigned char *z2_held;        /* per bucket: its span is mapped (a holder counted) */
    unsigned char *z2_due;         /* per bucket: reduce-scattered this step: its span goes at the end of ddp_adamw_step */
    cudaEvent_t z2_used;           /* the compute stream at ddp_adamw_step's start: the backward's and the
                                      reduce-scatters' use of the spans ends before it (ddp__gpu_z2_release);
                                      with shard_accumulate also at a micro-step's ddp_finish */
    float *z2_acc;                 /* shard_accumulate: the device accumulator of this rank's parts
                                      (ctx->shard.count floats, packed as m: ctx->shard.base[b]) */
    int z2_taped;                  /* shard_accumulate: the last micro-step's backward was the tape's
                                      (ddp_backward maps the gradients back: ddp_set_sync leaves them) */
    double *norm_sq;
    ddp_k_adamw_state *state;      /* device: step, clip, skip */
    ddp_k_adamw_state *state_host; /* pinned copy, read when state_copied has completed */
    unsigned long long diverged_seen; /* state->diverged already reported (bf16 parameters) */
    cudaEvent_t state_copied;
    int state_pending, step_dirty; /* step_dirty: the program may have changed the step count */
    long long skipped_seen;
    uint16_t *bf16;                /* staging for bf16 buckets (the largest bucket) of fp32 parameters */
    float *f32;                    /* bf16 parameters, reduce_dtype FP32: one bucket widened (the largest) */
    void *scratch, *scratch_host;  /* user collectives on host memory go through these */
    size_t scratch_bytes;
    cudaEvent_t sync_event;
    cudaEvent_t coll_ready, coll_done;   /* a user collective's hand-over between the two streams */
    cudaEvent_t watch_event;       /* the oldest group of unfinished communication (ddp__watch) */
    cudaEvent_t watch_newer;       /* everything enqueued after that group */
    ddp__watch watch;
    ddp__watchdog wd;              /* its thread and store connection (>>engine) */
    /* DDP_SHARD_PARAMETERS (>>zero3, ddp__gpu_z3_*): the view, reserved once (>>nccl-vm), its own
       parts mapped for the whole run, a unit's other granules while it is gathered */
    struct ddp__gvm *z3vm;
    int z3_units;                  /* the units the events below are for */
    cudaEvent_t *z3_gathered;      /* per unit: its all-gather on the comm stream is done */
    cudaEvent_t *z3_used;          /* per unit: the compute stream is past its last use before a release */
    int *z3_unmaps, z3_pending;    /* per unit: releases whose unmap waits for z3_used; their sum */
    cudaEvent_t z3_ready;          /* the compute stream's work before a gather (AdamW's updates of the parts) */
};

static ddp_result ddp__cuda_fail(ddp_context *ctx, cudaError_t e, const char *call, const char *file, int line) {
    return ddp__fail(ctx, DDP_ERR_BACKEND, "%s failed at %s:%d: %s (%s)", call, file, line, cudaGetErrorName(e),
                     cudaGetErrorString(e));
}
static ddp_result ddp__nccl_fail(ddp_context *ctx, ncclResult_t e, const char *call, const char *file, int line) {
    /* NCCL ignores the argument (the last error is per thread), so the detail is there for a
       failed ncclCommInitRank too, e.g. "Duplicate GPU detected" when ranks share a device. */
    const char *detail = ncclGetLastError(NULL);
    const char *hint = detail && strstr(detail, "Duplicate GPU")
        ? " (each rank needs a GPU of its own: rank r takes GPU LOCAL_RANK % the GPUs it sees; start at most as many "
          "ranks a host as it has GPUs, or, for tests only, share one through tools/nccl_one_gpu.sh)" : "";
    return ddp__fail(ctx, e == ncclRemoteError ? DDP_ERR_PEER_LOST : DDP_ERR_BACKEND, "%s failed at %s:%d: %s%s%s%s",
                     call, file, line, ncclGetErrorString(e), detail && *detail ? ": " : "", detail ? detail : "", hint);
}
/* In a function with `ctx` in scope: any failure poisons the group and returns. */
#define DDP__CUDA(call) do { cudaError_t e_ = (call); \
    if (e_ != cudaSuccess) return ddp__fatal(ctx, ddp__cuda_fail(ctx, e_, #call, __FILE__, __LINE__)); } while (0)
#define DDP__NCCL(call) do { ncclResult_t e_ = (call); \
    if (e_ != ncclSuccess) return ddp__fatal(ctx, ddp__nccl_fail(ctx, e_, #call, __FILE__, __LINE__)); } while (0)

/* An event's state, without waiting. cudaEventQuery records cudaErrorNotReady as the thread's
   last error; left there, the next cudaGetLastError (a launcher's check, or the program's own
   after its kernels) would report a healthy launch as failed. So NotReady is taken back here. */
static void ddp__cuda_forget(cudaError_t ours) {
    if (cudaPeekAtLastError() == ours) (void)cudaGetLastError();   /* only ours: a program's own error stays */
}

static cudaError_t ddp__gpu_query(cudaEvent_t event) {
    cudaError_t q = cudaEventQuery(event);
    if (q == cudaErrorNotReady) ddp__cuda_forget(q);
    return q;
}

static int ddp__gpu_visible(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) { ddp__cuda_forget(e); return 0; }
    return n > 0;
}

/* >>nccl-vm  The device address-space layer (ZeRO-2's gradients, ZeRO-3's parameters on NCCL):
   a range of device addresses reserved once (pointers never move), its granules backed by
   physical memory on demand and given back when no holder wants them. CUDA's virtual memory
   management is the driver API; ddp.h links only the runtime (no -lcuda: a program built
   against the runtime alone keeps working), so the eight driver functions come through
   cudaGetDriverEntryPointByVersion (CUDA >= 12.5), loaded once per process at the first use
   (driver entry points are process-wide), under a lock: a rank reads the table only after its
   own load saw it complete. A driver without them is asked again at the next reservation. */
/* The layer's functions serve ZeRO-2's gradients and ZeRO-3's parameters: a build, or a
   branch, that uses only some of them must not warn about the rest. */
#if defined(__GNUC__) || defined(__clang__)
#define DDP__GVM_FN static __attribute__((unused))
#else
#define DDP__GVM_FN static
#endif
typedef CUresult (*ddp__cu_reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*ddp__cu_afree_fn)(CUdeviceptr, size_t);
typedef CUresult (*ddp__cu_create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*ddp__cu_release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*ddp__cu_map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*ddp__cu_unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*ddp__cu_access_fn)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*ddp__cu_gran_fn)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
static struct {
    ddp__cu_reserve_fn reserve;
    ddp__cu_afree_fn address_free;
    ddp__cu_create_fn create;
    ddp__cu_release_fn release;
    ddp__cu_map_fn map;
    ddp__cu_unmap_fn unmap;
    ddp__cu_access_fn set_access;
    ddp__cu_gran_fn granularity;
    int loaded;
    char missing[160];             /* what could not be loaded at the last try */
} ddp__cuvm;
static pthread_mutex_t ddp__cuvm_lock = PTHREAD_MUTEX_INITIALIZER;

static void ddp__cuvm_load_locked(void) {
    static const char *const names[8] = { "cuMemAddressReserve", "cuMemAddressFree", "cuMemCreate", "cuMemRelease",
                                          "cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuMemGetAllocationGranularity" };
    void *fn[8];
    int i;
    ddp__cuvm.missing[0] = 0;
    for (i = 0; i < 8; i++) {
        fn[i] = NULL;
#if CUDART_VERSION >= 12050
        {
            enum cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
            cudaError_t e = cudaGetDriverEntryPointByVersion(names[i], &fn[i], 12000, cudaEnableDefault, &found);
            if (e != cudaSuccess || found != cudaDriverEntryPointSuccess) {
                if (e != cudaSuccess) ddp__cuda_forget(e);
                snprintf(ddp__cuvm.missing, sizeof ddp__cuvm.missing, "%s (%s)", names[i],
                         e != cudaSuccess ? cudaGetErrorName(e) : found == cudaDriverEntryPointVersionNotSufficent
                         ? "the driver is older than CUDA 12.0" : "not in the driver");
                return;
            }
        }
#else
        snprintf(ddp__cuvm.missing, sizeof ddp__cuvm.missing, "%s (built against a CUDA runtime older than 12.5, "
                 "without cudaGetDriverEntryPointByVersion)", names[i]);
        return;
#endif
    }
    /* object pointers to function pointers through memcpy: C99 has no cast between the two */
    memcpy(&ddp__cuvm.reserve, &fn[0], sizeof fn[0]);
    memcpy(&ddp__cuvm.address_free, &fn[1], sizeof fn[1]);
    memcpy(&ddp__cuvm.create, &fn[2], sizeof fn[2]);
    memcpy(&ddp__cuvm.release, &fn[3], sizeof fn[3]);
    memcpy(&ddp__cuvm.map, &fn[4], sizeof fn[4]);
    memcpy(&ddp__cuvm.unmap, &fn[5], sizeof fn[5]);
    memcpy(&ddp__cuvm.set_access, &fn[6], sizeof fn[6]);
    memcpy(&ddp__cuvm.granularity, &fn[7], sizeof fn[7]);
    ddp__cuvm.loaded = 1;
}

/* The driver's functions, or a named error (at ddp_init / commit, where the first range is reserved). */
static ddp_result ddp__cuvm_load(ddp_context *ctx, const char *what) {
    char missing[sizeof ddp__cuvm.missing];
    pthread_mutex_lock(&ddp__cuvm_lock);
    if (!ddp__cuvm.loaded) ddp__cuvm_load_locked();
    memcpy(missing, ddp__cuvm.missing, sizeof missing);
    pthread_mutex_unlock(&ddp__cuvm_lock);
    if (!missing[0]) return DDP_OK;
    return ddp__fail(ctx, DDP_ERR_BACKEND, "%s needs CUDA virtual memory management (cuMemAddressReserve, cuMemCreate, "
                     "cuMemMap, ...), which this CUDA driver does not offer: %s", what, missing);
}

static const char *ddp__cu_name(CUresult r) {
    switch ((int)r) {
    case 1: return "CUDA_ERROR_INVALID_VALUE";
    case 2: return "CUDA_ERROR_OUT_OF_MEMORY";
    case 3: return "CUDA_ERROR_NOT_INITIALIZED";
    case 101: return "CUDA_ERROR_INVALID_DEVICE";
    case 201: return "CUDA_ERROR_INVALID_CONTEXT";
    case 801: return "CUDA_ERROR_NOT_SUPPORTED";
    default: return "CUDA driver error";
    }
}

typedef struct ddp__gvm {           /* a device address range reserved once; granules mapped on demand */
    unsigned char *base;            /* fixed for the whole run: pointers never move */
    size_t bytes, gran;             /* reserved bytes (a multiple of gran), the allocation granularity */
    int device;
    unsigned long long *handle;     /* per granule: its physical allocation (0: none mapped) */
    uint32_t *refs;                 /* per granule: how many holders want it mapped */
} ddp__gvm;

static void ddp__gvm_prop(const ddp__gvm *g, int device, CUmemAllocationProp *prop) {
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = g ? g->device : device;
}

/* Reserve `bytes` (rounded up to the granularity) on ctx's device; nothing mapped. */
DDP__GVM_FN ddp_result ddp__gvm_reserve(ddp_context *ctx, ddp__gvm *g, size_t bytes, const char *what) {
    CUmemAllocationProp prop;
    CUdeviceptr ptr = 0;
    CUresult cr;
    size_t gran = 0, n;
    int device = 0;
    ddp_result r;
    memset(g, 0, sizeof *g);
    if ((r = ddp__cuvm_load(ctx, what)) != DDP_OK) return r;
    DDP__CUDA(cudaGetDevice(&device));
    ddp__gvm_prop(NULL, device, &prop);
    if ((cr = ddp__cuvm.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) != CUDA_SUCCESS || !gran)
        return ddp__fail(ctx, DDP_ERR_BACKEND, "cuMemGetAllocationGranularity on device %d for %s failed: %s (%d)", device,
                         what, ddp__cu_name(cr), (int)cr);
    n = (bytes ? bytes : 1) / gran + ((bytes ? bytes : 1) % gran != 0);
    g->handle = (unsigned long long *)ddp__calloc(sizeof *g->handle * n);
    g->refs = (uint32_t *)ddp__calloc(sizeof *g->refs * n);
    if (!g->handle || !g->refs) {
        DDP_FREE(g->handle); DDP_FREE(g->refs);
        memset(g, 0, sizeof *g);
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for the granule table of %s", what);
    }
    if ((cr = ddp__cuvm.reserve(&ptr, n * gran, gran, 0, 0)) != CUDA_SUCCESS) {
        DDP_FREE(g->handle); DDP_FREE(g->refs);
        memset(g, 0, sizeof *g);
        return ddp__fail(ctx, cr == CUDA_ERROR_OUT_OF_MEMORY ? DDP_ERR_OUT_OF_MEMORY : DDP_ERR_BACKEND,
                         "cuMemAddressReserve of %zu bytes for %s on device %d failed: %s (%d)", n * gran, what, device,
                         ddp__cu_name(cr), (int)cr);
    }
    g->base = (unsigned char *)(uintptr_t)ptr;
    g->bytes = n * gran;
    g->gran = gran;
    g->device = device;
    return DDP_OK;
}

/* The granules [*g0, *g1) that touch [off, off + len); 0 when the range leaves the reservation. */
static int ddp__gvm_span(const ddp__gvm *g, size_t off, size_t len, size_t *g0, size_t *g1) {
    if (!g->base || off > g->bytes || len > g->bytes - off) return 0;
    *g0 = off / g->gran;
    *g1 = len ? (off + len + g->gran - 1) / g->gran : *g0;
    return 1;
}

/* Give granule i's physical memory back (its last holder left). */
static CUresult ddp__gvm_drop(ddp__gvm *g, size_t i) {
    CUresult a = ddp__cuvm.unmap((CUdeviceptr)(uintptr_t)(g->base + i * g->gran), g->gran);
    CUresult b = ddp__cuvm.release((CUmemGenericAllocationHandle)g->handle[i]);
    g->handle[i] = 0;
    return a != CUDA_SUCCESS ? a : b;
}

/* ddp__gvm_map, and the byte range it newly mapped ([*mapped_lo, *mapped_hi), empty when every
   granule was mapped already; either pointer may be NULL): a caller that must fill new memory
   (zero it, copy a part in) fills only that. */
DDP__GVM_FN ddp_result ddp__gvm_map_range(ddp_context *ctx, ddp__gvm *g, size_t off, size_t len, const char *what,
                                     size_t *mapped_lo, size_t *mapped_hi) {
    CUmemAllocationProp prop;
    CUmemAccessDesc access;
    size_t g0, g1, i, lo = 0, hi = 0;
    if (mapped_lo) *mapped_lo = 0;
    if (mapped_hi) *mapped_hi = 0;
    if (!ddp__gvm_span(g, off, len, &g0, &g1))
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "mapping [%zu, +%zu) of %s: outside its reserved %zu bytes", off, len,
                         what, g->bytes);
    ddp__gvm_prop(g, 0, &prop);
    memset(&access, 0, sizeof access);
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (i = g0; i < g1; i++) {
        CUmemGenericAllocationHandle h = 0;
        CUdeviceptr at = (CUdeviceptr)(uintptr_t)(g->base + i * g->gran);
        CUresult cr;
        const char *call = "cuMemCreate";
        if (g->refs[i]++) continue;
        if ((cr = ddp__cuvm.create(&h, g->gran, &prop, 0)) == CUDA_SUCCESS) {
            call = "cuMemMap";
            if ((cr = ddp__cuvm.map(at, g->gran, 0, h, 0)) == CUDA_SUCCESS) {
                call = "cuMemSetAccess";
                if ((cr = ddp__cuvm.set_access(at, g->gran, &access, 1)) != CUDA_SUCCESS) (void)ddp__cuvm.unmap(at, g->gran);
            }
            if (cr != CUDA_SUCCESS) (void)ddp__cuvm.release(h);
        }
        if (cr != CUDA_SUCCESS) {
            /* nothing changes: this granule's count back, and the granules before it as they were */
            size_t j;
            g->refs[i]--;
            for (j = g0; j < i; j++)
                if (--g->refs[j] == 0) (void)ddp__gvm_drop(g, j);
            return ddp__fail(ctx, cr == CUDA_ERROR_OUT_OF_MEMORY ? DDP_ERR_OUT_OF_MEMORY : DDP_ERR_BACKEND,
                             "%s of %zu bytes for %s on device %d failed: %s (%d)%s", call, g->gran, what, g->device,
                             ddp__cu_name(cr), (int)cr, cr == CUDA_ERROR_OUT_OF_MEMORY
                             ? " (the device is out of memory: fewer or smaller buckets, a higher shard level, or more ranks)" : "");
        }
        g->handle[i] = (unsigned long long)h;
        if (hi == 0) lo = i * g->gran;
        hi = (i + 1) * g->gran;
    }
    if (mapped_lo) *mapped_lo = lo;
    if (mapped_hi) *mapped_hi = hi;
    return DDP_OK;
}

/* Count one holder on every granule touching [off, off+len); map (cuMemCreate + cuMemMap +
   cuMemSetAccess) the ones that go 0 -> 1. On failure nothing changes (DDP_ERR_OUT_OF_MEMORY named
   with `what`, the bytes and the device). Contents of newly mapped granules are undefined: the
   caller fills/zeroes what it needs (ddp__gvm_map_range says which bytes are new). */
DDP__GVM_FN ddp_result ddp__gvm_map(ddp_context *ctx, ddp__gvm *g, size_t off, size_t len, const char *what) {
    return ddp__gvm_map_range(ctx, g, off, len, what, NULL, NULL);
}

/* Uncount; unmap + release granules that go 1 -> 0. The CALLER guarantees no stream still uses
   them (an event it synchronized / queried). An unmap of what nobody holds is a bug of ddp.h:
   refused by name, nothing changes. */
DDP__GVM_FN ddp_result ddp__gvm_unmap(ddp_context *ctx, ddp__gvm *g, size_t off, size_t len) {
    size_t g0, g1, i;
    CUresult first = CUDA_SUCCESS;
    if (!ddp__gvm_span(g, off, len, &g0, &g1))
        return ddp__fail(ctx, DDP_ERR_BACKEND, "unmapping [%zu, +%zu): outside the reserved %zu bytes", off, len, g->bytes);
    for (i = g0; i < g1; i++)
        if (!g->refs[i]) return ddp__fail(ctx, DDP_ERR_BACKEND, "unmapping granule %zu of a device range: not mapped", i);
    for (i = g0; i < g1; i++)
        if (--g->refs[i] == 0) {
            CUresult cr = ddp__gvm_drop(g, i);
            if (first == CUDA_SUCCESS) first = cr;
        }
    if (first != CUDA_SUCCESS)
        return ddp__fail(ctx, DDP_ERR_BACKEND, "cuMemUnmap / cuMemRelease on device %d failed: %s (%d)", g->device,
                         ddp__cu_name(first), (int)first);
    return DDP_OK;
}

/* Bytes mapped now (device bytes; for stats and tests). */
DDP__GVM_FN size_t ddp__gvm_mapped(const ddp__gvm *g) {
    size_t i, n = g->gran ? g->bytes / g->gran : 0, mapped = 0;
    for (i = 0; i < n; i++) if (g->refs[i]) mapped += g->gran;
    return mapped;
}

/* Unmap everything, free the reservation (teardown; idempotent on a zeroed struct). */
DDP__GVM_FN void ddp__gvm_free(ddp_context *ctx, ddp__gvm *g) {
    size_t i, n = g->gran ? g->bytes / g->gran : 0;
    (void)ctx;
    if (g->base) {
        for (i = 0; i < n; i++) if (g->refs[i]) { g->refs[i] = 0; (void)ddp__gvm_drop(g, i); }
        (void)ddp__cuvm.address_free((CUdeviceptr)(uintptr_t)g->base, g->bytes);
    }
    DDP_FREE(g->handle);
    DDP_FREE(g->refs);
    memset(g, 0, sizeof *g);
}


/* The communicators: the world's (team 0) and, with replica groups of several ranks, the
   group's (team 1, the buckets'); hybrid sharding: the shard group's (team 1) and the holders'
   across the groups (DDP__NCCL_CROSS). */
#define DDP__NCCL_CROSS 2
#define DDP__NCCL_COMMS 3
static ddp__life *ddp__nccl_life(ddp__gpu *g, int team) {
    return team == DDP__NCCL_CROSS ? &g->cross_life : team ? &g->team_life : &g->life;
}
static ncclComm_t ddp__nccl_comm(const ddp__gpu *g, int team) { return team == DDP__NCCL_CROSS ? g->cross : team ? g->team : g->nccl; }
/* Its name in messages: "" (the world's), "replica group's " / "shard group's ", "cross-group ". */
static const char *ddp__nccl_whose(const ddp_context *ctx, int team) {
    return team == DDP__NCCL_CROSS ? "cross-group " : !team ? "" : ddp__hybrid(ctx) ? "shard group's " : "replica group's ";
}

/* A communicator's life under g->lock: a thread that calls NCCL enters (refused once the
   communicator is aborted or claimed for teardown), makes the call without the lock, and
   leaves. An abort asked for while a call is in progress is left to the last thread out, so
   nobody frees the communicator under a call, and the watchdog never waits on one. */
static int ddp__nccl_enter(ddp__gpu *g, int team) {
    int live;
    pthread_mutex_lock(&g->lock);
    live = ddp__life_enter(ddp__nccl_life(g, team));
    pthread_mutex_unlock(&g->lock);
    return live;
}

static void ddp__nccl_leave(ddp__gpu *g, int team) {
    int abort_now;
    pthread_mutex_lock(&g->lock);
    abort_now = ddp__life_leave(ddp__nccl_life(g, team));
    pthread_mutex_unlock(&g->lock);
    if (abort_now) ncclCommAbort(ddp__nccl_comm(g, team));
}

/* Abort the communicators (any thread): whatever of this rank waits on its peers ends. */
static void ddp__gpu_abort(ddp_context *ctx) {
    ddp__gpu *g = ctx->impl.gpu;
    int abort_now[DDP__NCCL_COMMS], k;
    if (!g) return;
    pthread_mutex_lock(&g->lock);
    for (k = 0; k < DDP__NCCL_COMMS; k++) abort_now[k] = ddp__life_abort(ddp__nccl_life(g, k));
    pthread_mutex_unlock(&g->lock);
    for (k = 0; k < DDP__NCCL_COMMS; k++) if (abort_now[k]) ncclCommAbort(ddp__nccl_comm(g, k));
}

/* Take a communicator for teardown: 1 if this thread may now destroy it. */
static int ddp__nccl_claim(ddp__gpu *g, int team) {
    int mine;
    pthread_mutex_lock(&g->lock);
    mine = ddp__life_claim(ddp__nccl_life(g, team));
    pthread_mutex_unlock(&g->lock);
    return mine;
}

/* Poison: the first rank to fail leaves its message in the store (an ADD decides who is first),
   every rank's watchdog polls it; then this rank's communicator is aborted so that nothing of
   its own waits on the peers. */
static void ddp__gpu_poison(ddp_context *ctx, ddp_result code) {
    ddp__gpu *g = ctx->impl.gpu;
    int from_watchdog;
    if (!g) return;
    from_watchdog = ddp__watchdog_is_me(&g->wd);
    ddp__store_poison(ctx, from_watchdog ? g->wd.fd : ctx->rdv.store_fd, code);
    ddp__gpu_abort(ctx);
}

/* What the watchdog sees with the lock held: an asynchronous NCCL error, or communication that
   has not finished within the timeout. Returns a ddp_result and fills msg. */
static ddp_result ddp__gpu_inspect_locked(ddp_context *ctx, char *msg, size_t cap) {
    ddp__gpu *g = ctx->impl.gpu;
    ncclResult_t async = ncclSuccess;
    int k;
    if (!g->life.live) return DDP_OK;
    /* The clock first, so that an asynchronous error names what is still unfinished, not an
       operation that completed long ago and was not yet seen complete. */
    while (g->watch.since > 0) {
        cudaError_t q = ddp__gpu_query(g->watch_event);
        double now = ddp__now();
        if (q != cudaSuccess && q != cudaErrorNotReady) {
            snprintf(msg, cap, "the GPU failed during %s: %s (%s)", g->watch.what, cudaGetErrorName(q), cudaGetErrorString(q));
            return DDP_ERR_BACKEND;
        }
        if (ddp__watch_progress(&g->watch, q == cudaSuccess, now)) {   /* the newer group is the oldest now */
            cudaEvent_t oldest = g->watch_newer;
            g->watch_newer = g->watch_event;
            g->watch_event = oldest;
            continue;
        }
        break;
    }
    for (k = 0; k < DDP__NCCL_COMMS; k++) {   /* the world's communicator, then the group's, then the cross-group one */
        ncclComm_t c = ddp__nccl_comm(g, k);
        if (!ddp__nccl_life(g, k)->live) continue;
        if (ncclCommGetAsyncError(c, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
            const char *detail = ncclGetLastError(c);
            snprintf(msg, cap, "NCCL reported an asynchronous error%s%s%s during %s: %s%s%s; the communicator was aborted",
                     k ? " on the " : "", k ? ddp__nccl_whose(ctx, k) : "", k ? "communicator" : "",
                     g->watch.since > 0 ? g->watch.what : "communication",
                     ncclGetErrorString(async), detail && *detail ? ": " : "", detail ? detail : "");
            return async == ncclRemoteError ? DDP_ERR_PEER_LOST : DDP_ERR_BACKEND;
        }
    }
    if (ddp__watch_expired(&g->watch, ddp__now(), ctx->desc.timeout_s)) {
        snprintf(msg, cap, "timed out after %g s in %s: the GPU never finished it (a peer stuck or gone?); "
                 "the NCCL communicator was aborted", ctx->desc.timeout_s, g->watch.what);
        return DDP_ERR_TIMEOUT;
    }
    return DDP_OK;
}

/* The store's words (ddp__watch_store). */
static void ddp__gpu_store_gone(ddp_context *ctx, char *msg, size_t cap) {
    (void)ctx;
    snprintf(msg, cap, "lost the watchdog's connection to the rendezvous store on rank 0 (rank 0 died or "
             "failed); the NCCL communicator was aborted");
}
static void ddp__gpu_store_died(ddp_context *ctx, const char *rank, char *msg, size_t cap) {
    (void)ctx;
    snprintf(msg, cap, "rank %s disconnected from the rendezvous store (it died or failed); the NCCL "
             "communicator was aborted", rank ? rank : "?");
}
/* Another rank poisoned the group, or a rank's store connection dropped (it died). */
static ddp_result ddp__gpu_check_store(ddp_context *ctx, int fd, char *msg, size_t cap) {
    return ddp__watch_store(ctx, &ctx->impl.gpu->wd.hooks, fd, msg, cap);
}

/* NCCL failed asynchronously (or timed out). When a peer died, NCCL's error (a closed socket,
   a remote error) says nothing of who: the store learns of the death from the dead rank's
   connection at about the same moment (and when rank 0 died, the store itself is gone). Ask it
   on `fd` for `window` seconds (at least once) and, when it names the rank, fail the group with
   that. Returns the group's error then, DDP_OK when the store named nobody. */
static ddp_result ddp__gpu_blame(ddp_context *ctx, int fd, double window, const char *nccl_msg) {
    char who[DDP__ERR_MAX / 2];
    double until = ddp__now() + window;
    do {
        ddp_result r;
        if (ddp__failed(ctx)) return ddp__failed(ctx);
        if ((r = ddp__gpu_check_store(ctx, fd, who, sizeof who)) != DDP_OK)   /* a cancel stays a cancel */
            return ddp__fail_group(ctx, r, "%s (%.300s)", who, nccl_msg);
        if (ddp__now() < until) usleep(20000);
    } while (ddp__now() < until);
    return DDP_OK;
}

/* The watchdog's finding: name the lost rank if the store can, then tell the peers and abort. */
static void ddp__gpu_report(ddp_context *ctx, ddp_result r, const char *nccl_msg) {
    if (ddp__gpu_blame(ctx, ctx->impl.gpu->wd.fd, r == DDP_ERR_TIMEOUT ? 0 : 0.5, nccl_msg) == DDP_OK)
        ddp__fail_group(ctx, r, "%s", nccl_msg);
}

/* The watchdog's hooks (>>engine): the device, the clock's stopped time, the look under the lock. */
static void ddp__gpu_watch_begin(ddp_context *ctx) { cudaSetDevice(ctx->impl.gpu->device); }
static void ddp__gpu_watch_slept(ddp_context *ctx, double slept) { ddp__watch_slept(&ctx->impl.gpu->watch, slept); }
static void ddp__gpu_watch_on_store(ddp_context *ctx, ddp_result r) { (void)r; ddp__gpu_abort(ctx); }   /* already told: only abort */

/* A cancel (the generic look) tells the peers and aborts the communicator: whatever of this
   rank waits on the GPU for them ends. */
static void ddp__gpu_watch_hooks(ddp__watchdog_hooks *h) {
    h->cancel_where = "the NCCL watchdog's poll";
    h->begin = ddp__gpu_watch_begin;
    h->slept = ddp__gpu_watch_slept;
    h->inspect_locked = ddp__gpu_inspect_locked;
    h->on_failure = ddp__gpu_report;
    h->on_store = ddp__gpu_watch_on_store;
    h->store_gone = ddp__gpu_store_gone;
    h->store_died = ddp__gpu_store_died;
}

static void ddp__gpu_stop_watchdog(ddp_context *ctx) {
    if (ctx->impl.gpu) ddp__watchdog_stop(&ctx->impl.gpu->wd);
}

/* Note communication enqueued on `stream` for the watchdog (see ddp__watch). Called with the
   lock held. */
static cudaError_t ddp__gpu_watch_locked(ddp__gpu *g, cudaStream_t stream, const char *what) {
    return cudaEventRecord(ddp__watch_enqueue(&g->watch, ddp__now(), what) ? g->watch_newer : g->watch_event, stream);
}

/* Wait for `stream` on the host without blocking in CUDA: poll, so that a timeout, an
   asynchronous NCCL error or a poisoned group ends the wait. Only outside the step. */
static ddp_result ddp__gpu_wait_event(ddp_context *ctx, cudaEvent_t event, const char *what) {
    ddp__gpu *g = ctx->impl.gpu;
    double deadline = ddp__now() + ctx->desc.timeout_s;
    char msg[DDP__ERR_MAX - 64];
    for (;;) {
        cudaError_t q = ddp__gpu_query(event);
        ddp_result r;
        if (q == cudaSuccess) return DDP_OK;
        if (q != cudaErrorNotReady) return ddp__fatal(ctx, ddp__cuda_fail(ctx, q, what, __FILE__, __LINE__));
        if (ddp__failed(ctx)) return ddp__failed(ctx);
        if ((r = ddp__check_cancel(ctx, what)) != DDP_OK) return r;
        pthread_mutex_lock(&g->lock);
        r = ddp__gpu_inspect_locked(ctx, msg, sizeof msg);
        pthread_mutex_unlock(&g->lock);
        if (r != DDP_OK) {   /* as the watchdog does: name the lost rank when the store can */
            ddp_result b = ddp__gpu_blame(ctx, ctx->rdv.store_fd, r == DDP_ERR_TIMEOUT ? 0 : 0.5, msg);
            return b != DDP_OK ? b : ddp__fail_group(ctx, r, "%s", msg);
        }
        if (ddp__now() > deadline)
            return ddp__fail_group(ctx, DDP_ERR_TIMEOUT, "timed out after %g s waiting for %s on the GPU",
                                             ctx->desc.timeout_s, what);
        usleep(50);
    }
}
/* The same for everything enqueued on `stream` so far. */
static ddp_result ddp__gpu_wait(ddp_context *ctx, cudaStream_t stream, const char *what) {
    DDP__CUDA(cudaEventRecord(ctx->impl.gpu->sync_event, stream));
    return ddp__gpu_wait_event(ctx, ctx->impl.gpu->sync_event, what);
}

/* NCCL's remote error says a peer went away, not which: a failing rank leaves its message in
   the store before it aborts its communicator, so ask the store (this thread's connection) for
   half a second and name the rank (ddp__gpu_blame). */
static ddp_result ddp__nccl_remote_fail(ddp_context *ctx, ncclResult_t e, const char *what) {
    char nccl_msg[DDP__ERR_MAX / 2];
    const char *detail = ncclGetLastError(NULL);
    ddp_result r;
    snprintf(nccl_msg, sizeof nccl_msg, "%s failed: %s%s%s", what, ncclGetErrorString(e), detail && *detail ? ": " : "",
             detail ? detail : "");
    if ((r = ddp__gpu_blame(ctx, ctx->rdv.store_fd, 0.5, nccl_msg)) != DDP_OK) return r;
    return ddp__fatal(ctx, ddp__nccl_fail(ctx, e, what, __FILE__, __LINE__));
}

/* Calls on a non-blocking communicator may return ncclInProgress: NCCL finishes them in the
   background (set-up, a first connection to a peer), and nothing else may be called on the
   communicator before it has. Poll its state until then, against `deadline`, the group's
   poison and (at set-up, where the watchdog does not run yet) the store. Call between
   ddp__nccl_enter and _leave, so that the communicator (team: ddp__nccl_comm) cannot be freed
   meanwhile. */
static ddp_result ddp__nccl_settle(ddp_context *ctx, int team, ncclResult_t e, const char *what, double deadline) {
    ddp__gpu *g = ctx->impl.gpu;
    double next_store_check = 0;
    char msg[DDP__ERR_MAX - 64];
    while (e == ncclInProgress) {
        ddp_result r;
        if (ddp__failed(ctx)) return ddp__failed(ctx);
        if ((r = ddp__check_cancel(ctx, what)) != DDP_OK) return r;
        if (!g->wd.started && ddp__now() >= next_store_check) {
            if ((r = ddp__gpu_check_store(ctx, ctx->rdv.store_fd, msg, sizeof msg)) != DDP_OK)
                return ddp__set_failed(ctx, ddp__fail(ctx, r, "%s (during %s)", msg, what));   /* told already */
            next_store_check = ddp__now() + DDP__LIVENESS_PERIOD_S;
        }
        if (ddp__now() > deadline) return DDP_ERR_TIMEOUT;   /* the caller names what is missing */
        usleep(200);
        if (ncclCommGetAsyncError(ddp__nccl_comm(g, team), &e) != ncclSuccess) e = ncclInternalError;
    }
    if (e != ncclSuccess && ddp__failed(ctx)) return ddp__failed(ctx);
    if (e == ncclRemoteError) return ddp__nccl_remote_fail(ctx, e, what);
    if (e != ncclSuccess) return ddp__fatal(ctx, ddp__nccl_fail(ctx, e, what, __FILE__, __LINE__));
    return DDP_OK;
}

/* One collective on ddp.h's comm stream: entered, settled, left, then noted for the watchdog.
   Nothing waits for it. count is NCCL's: a reduce-scatter's per-rank result, an all-gather's
   per-rank contribution (in place when recv/send is the other + rank * count). team: on the
   replica group's communicator (ranks and roots are then the group's), else the world's. */
enum { DDP__NCCL_ALLREDUCE, DDP__NCCL_BROADCAST, DDP__NCCL_REDUCE, DDP__NCCL_REDUCE_SCATTER, DDP__NCCL_ALL_GATHER };
static ddp_result ddp__nccl_call(ddp_context *ctx, int team, int call, const void *send, void *recv, size_t count,
                                 ncclDataType_t type, ncclRedOp_t op, int root, const char *what) {
    ddp__gpu *g = ctx->impl.gpu;
    ncclComm_t c = ddp__nccl_comm(g, team);
    ncclResult_t e;
    ddp_result r;
    cudaError_t w;
    if (!ddp__nccl_enter(g, team))
        return ddp__failed(ctx) ? ddp__failed(ctx) : ddp__fail_group(ctx, DDP_ERR_BACKEND, "%s: the NCCL %s"
                                                                                "communicator is gone (aborted)", what,
                                                                                ddp__nccl_whose(ctx, team));
    switch (call) {
    case DDP__NCCL_BROADCAST: e = ncclBroadcast(send, recv, count, type, root, c, g->comm); break;
    case DDP__NCCL_REDUCE: e = ncclReduce(send, recv, count, type, op, root, c, g->comm); break;
    case DDP__NCCL_REDUCE_SCATTER: e = ncclReduceScatter(send, recv, count, type, op, c, g->comm); break;
    case DDP__NCCL_ALL_GATHER: e = ncclAllGather(send, recv, count, type, c, g->comm); break;
    default: e = ncclAllReduce(send, recv, count, type, op, c, g->comm); break;
    }
    r = ddp__nccl_settle(ctx, team, e, what, ddp__now() + ctx->desc.timeout_s);
    ddp__nccl_leave(g, team);
    if (r == DDP_ERR_TIMEOUT && !ddp__failed(ctx))
        r = ddp__fail_group(ctx, DDP_ERR_TIMEOUT, "timed out after %g s in %s: NCCL never finished "
                                      "enqueueing it (a peer stuck or gone?)", ctx->desc.timeout_s, what);
    if (r != DDP_OK) return r;
    pthread_mutex_lock(&g->lock);
    w = ddp__gpu_watch_locked(g, g->comm, what);
    pthread_mutex_unlock(&g->lock);
    DDP__CUDA(w);
    return DDP_OK;
}

/* In place: an allreduce, or a broadcast from broadcast_root >= 0. */
static ddp_result ddp__nccl_enqueue(ddp_context *ctx, void *buf, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                    int broadcast_root, const char *what) {
    return ddp__nccl_call(ctx, 0, broadcast_root >= 0 ? DDP__NCCL_BROADCAST : DDP__NCCL_ALLREDUCE, buf, buf, count, type, op,
                          broadcast_root, what);
}

/* A gradient bucket averaged in place among the team (ddp__team_*): on the replica group's
   communicator when there is one (ncclAvg then divides by the group's size), else the world's. */
static ddp_result ddp__nccl_bucket(ddp_context *ctx, void *buf, size_t count, ncclDataType_t type, const char *what) {
    int team = ctx->impl.gpu->team != NULL && !ddp__hybrid(ctx);   /* hybrid: the team is the shard group's; buckets span the world */
    return ddp__nccl_call(ctx, team, DDP__NCCL_ALLREDUCE, buf, buf, count, type, ncclAvg, -1, what);
}

/* Sharded (ddp__shard_range): bucket b's parts, rank s's at s * part for part floats, the last
   rank's also the tail from world * part on. A reduce-scatter of the equal parts, in place (NCCL
   wants equal counts), and a reduce of the tail to the last rank; or (gather) an all-gather and a
   broadcast of the tail from the last rank. `base` is the bucket's start in the buffer. */
static ddp_result ddp__nccl_parts(ddp_context *ctx, int b, void *base, ncclDataType_t type, size_t elem, int gather,
                                  const char *what) {
    const ddp__bucket *k = &ctx->model.buckets[b];
    size_t lo, hi, part, tail;
    unsigned char *at = (unsigned char *)base;
    ddp_result r;
    /* hybrid sharding: the parts are the shard group's, on its communicator (only the gather:
       its buckets are summed by ddp__nccl_hybrid) */
    int team = ddp__hybrid(ctx), n = team ? ddp__team_world(ctx) : ctx->world, me = team ? ddp__team_rank(ctx) : ctx->rank;
    ddp__shard_range(ctx, b, 0, &lo, &hi);
    part = hi - lo;
    tail = k->count - part * (size_t)n;
    if (part) {
        r = gather ? ddp__nccl_call(ctx, team, DDP__NCCL_ALL_GATHER, at + (size_t)me * part * elem, at, part, type, ncclSum, 0, what)
                   : ddp__nccl_call(ctx, team, DDP__NCCL_REDUCE_SCATTER, at, at + (size_t)me * part * elem, part, type, ncclAvg, 0, what);
        if (r != DDP_OK) return r;
    }
    if (!tail) return DDP_OK;
    at += part * (size_t)n * elem;
    return ddp__nccl_call(ctx, team, gather ? DDP__NCCL_BROADCAST : DDP__NCCL_REDUCE, at, at, tail, type, ncclAvg, n - 1, what);
}

/* Hybrid sharding (desc.shard_group = S, >>shard; HYBRID SHARDING): bucket b summed into this
   rank's part, on the comm stream. First a reduce-scatter in the shard group (ncclSum on the
   group's communicator: the equal parts in place, the tail reduced to the last member, as
   ddp__nccl_parts lays them out), then the part, which member s of every group holds, summed
   across the G = world / S groups (ncclAllReduce, ncclSum, on the cross-group communicator of
   its holders): 1/S of the bucket on the link between the groups. The caller scales the sum by
   1/world (ddp__gpu_hybrid_scale). NCCL's allreduce leaves every holder the same bits, so every
   rank ends with the same average; its order is hierarchical (the group's sum, then the groups'),
   not the world's rank order. The comm stream records comm_cross[par][b] between the two. */
static ddp_result ddp__nccl_hybrid(ddp_context *ctx, int b, void *base, ncclDataType_t type, size_t elem) {
    ddp__gpu *g = ctx->impl.gpu;
    const ddp__bucket *k = &ctx->model.buckets[b];
    size_t lo, hi, part, tail;
    unsigned char *at = (unsigned char *)base;
    int n = ddp__team_world(ctx), me = ddp__team_rank(ctx), par = ctx->tl.step & 1;
    char what[160];
    ddp_result r;
    ddp__shard_range(ctx, b, 0, &lo, &hi);
    part = hi - lo;
    tail = k->count - part * (size_t)n;
    snprintf(what, sizeof what, "the reduce-scatter of gradient bucket %d (%zu elements) in the shard group", b, k->count);
    if (part && (r = ddp__nccl_call(ctx, 1, DDP__NCCL_REDUCE_SCATTER, at, at + (size_t)me * part * elem, part, type, ncclSum, 0,
                                    what)) != DDP_OK) return r;
    if (tail && (r = ddp__nccl_call(ctx, 1, DDP__NCCL_REDUCE, at + part * (size_t)n * elem, at + part * (size_t)n * elem, tail,
                                    type, ncclSum, n - 1, what)) != DDP_OK) return r;
    if (g->comm_cross[par]) DDP__CUDA(cudaEventRecord(g->comm_cross[par][b], g->comm));
    ddp__shard_range(ctx, b, me, &lo, &hi);
    if (hi == lo) return DDP_OK;   /* an empty part (a small bucket: the last member holds it all); so for every holder */
    snprintf(what, sizeof what, "the allreduce of gradient bucket %d's part (%zu of %zu elements) across the shard groups "
             "(the cross-group communicator)", b, hi - lo, k->count);
    return ddp__nccl_call(ctx, DDP__NCCL_CROSS, DDP__NCCL_ALLREDUCE, at + (lo - k->offset) * elem, at + (lo - k->offset) * elem,
                          hi - lo, type, ncclSum, -1, what);
}

/* The hybrid sum (ddp__nccl_hybrid) made an average: times 1/world rounded to float, one rounding
   of the product (a power-of-two world: the sum divided by it exactly, rounded once), on the
   comm stream. bf16 gradients: in float, rounded back to bf16 once. */
static ddp_result ddp__gpu_hybrid_scale(ddp_context *ctx, float *f32, uint16_t *bf16, size_t n) {
    float inv = 1.0f / (float)ctx->world;
    if (f32) DDP__CUDA(ddp_k_scale(f32, n, inv, ctx->impl.gpu->comm));
    else DDP__CUDA(ddp_k_scale_bf16(bf16, n, inv, ctx->impl.gpu->comm));
    return DDP_OK;
}

/* Every entry point runs on the caller's thread, which may have another device current. */
#define DDP__GPU_DEVICE(g) DDP__CUDA(cudaSetDevice((g)->device))

/* A communicator, non-blocking: ncclCommInitRank would wait for every peer with no deadline,
   and one that died or never came would hang this rank for good. Each rank says in the store
   when it starts and when it is done, so a timeout can name the ranks that never came and
   those that came but never finished. team 0: the world's; 1: the replica group's (hybrid: the
   shard group's), ranks [first, first + n) of the world, this rank its member ddp__team_rank;
   DDP__NCCL_CROSS (hybrid): the holders of this rank's part, ranks s, s + S, ... (s its member
   number, S the group's size), this rank the holder rank / S. */
static ddp_result ddp__gpu_init_comm(ddp_context *ctx, int team, ncclUniqueId *id, double deadline, int version) {
    ddp__gpu *g = ctx->impl.gpu;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclResult_t e;
    ddp_result r;
    ddp__life *life = ddp__nccl_life(g, team);
    int cross = team == DDP__NCCL_CROSS, i;
    const char *start = cross ? "nccl/cross-start/" : team ? "nccl/team-start/" : "nccl/start/";
    const char *done = cross ? "nccl/cross-done/" : team ? "nccl/team-done/" : "nccl/done/";
    int n = cross ? ctx->world / ddp__team_world(ctx) : team ? ddp__team_world(ctx) : ctx->world;
    int first = cross ? ddp__team_rank(ctx) : team ? ddp__team_peer(ctx, 0) : 0, stride = cross ? ddp__team_world(ctx) : 1;
    int me = cross ? ctx->rank / stride : team ? ddp__team_rank(ctx) : ctx->rank;
    char key[40], never[256], unfinished[256], what[128];
    config.blocking = 0;
    snprintf(key, sizeof key, "%s%d", start, ctx->rank);
    if (ctx->world > 1 && (r = ddp__store_set(ctx, key, "1", 1)) != DDP_OK) return r;
    e = ncclCommInitRankConfig(cross ? &g->cross : team ? &g->team : &g->nccl, n, *id, me, &config);
    if (e != ncclSuccess && e != ncclInProgress) return ddp__nccl_fail(ctx, e, "ncclCommInitRankConfig", __FILE__, __LINE__);
    life->live = 1;
    life->in_call = 1;   /* alone until set-up returns: nobody else can reach it yet */
    snprintf(what, sizeof what, "NCCL's set-up%s%s%s (ncclCommInitRankConfig)", team ? " of the " : "",
             ddp__nccl_whose(ctx, team), team ? "communicator" : "");
    r = ddp__nccl_settle(ctx, team, e, what, deadline);
    ddp__nccl_leave(g, team);
    if (r == DDP_ERR_TIMEOUT && !ddp__failed(ctx)) {
        size_t a = 0, z = 0;
        int k, exists;
        never[0] = unfinished[0] = 0;
        for (i = 0; ctx->world > 1 && i < n && a + 16 < sizeof never && z + 16 < sizeof unfinished; i++)
            for (k = 0; k < 2; k++) {   /* the members in rank order (cross: every S-th rank), as ddp__list_missing */
                snprintf(key, sizeof key, "%s%d", k ? done : start, first + i * stride);
                if (ddp__store_check(ctx, key, &exists) != DDP_OK) { i = n; break; }
                if (exists) continue;
                if (k) z += (size_t)snprintf(unfinished + z, sizeof unfinished - z, "%s%d", z ? ", " : "", first + i * stride);
                else a += (size_t)snprintf(never + a, sizeof never - a, "%s%d", a ? ", " : "", first + i * stride);
            }
        ddp__gpu_abort(ctx);
        return ddp__fail(ctx, DDP_ERR_TIMEOUT, "timed out after %g s in NCCL's set-up%s%s%s; rank(s) never started it: "
                         "%s; rank(s) that did not finish it: %s; the communicator was aborted", ctx->desc.timeout_s,
                         team ? " of the " : "", ddp__nccl_whose(ctx, team), team ? "communicator" : "",
                         never[0] ? never : "none", unfinished[0] ? unfinished : "none");
    }
    if (r != DDP_OK) return r;
    snprintf(key, sizeof key, "%s%d", done, ctx->rank);
    if (ctx->world > 1 && (r = ddp__store_set(ctx, key, "1", 1)) != DDP_OK) return r;
    if (cross) ddp__log(ctx, DDP_LOG_INFO, "rank %d: the cross-group communicator of part %d up (ranks %d, %d, .. %d: "
                        "member %d of every shard group)", ctx->rank, first, first, first + stride, first + (n - 1) * stride, first);
    else if (team) ddp__log(ctx, DDP_LOG_INFO, "rank %d: %s group %d's communicator up (ranks %d .. %d)", ctx->rank,
                       ddp__hybrid(ctx) ? "shard" : "replica", first / n, first, first + n - 1);
    else ddp__log(ctx, DDP_LOG_INFO, "rank %d of %d up (nccl backend %d.%d.%d, device %d)", ctx->rank, ctx->world,
                  version / 10000, version / 100 % 100, version % 100, g->device);
    return DDP_OK;
}

/* A second communicator's ncclUniqueId, through the store under `key`: made and published by rank
   `maker`, fetched by every other member (`who`: the maker in the timeout's words; `whose`: the
   communicator's). */
static ddp_result ddp__nccl_share_id(ddp_context *ctx, const char *key, int maker, const char *who, const char *whose,
                                     double deadline, ncclUniqueId *id) {
    unsigned char *val;
    uint32_t len;
    int found = 0;
    ddp_result r;
    if (ctx->rank == maker) {
        DDP__NCCL(ncclGetUniqueId(id));
        return ddp__store_set(ctx, key, id, sizeof *id);
    }
    if ((r = ddp__store_get(ctx, key, deadline, &val, &len, &found)) != DDP_OK) return r;
    if (!found)
        return ddp__fail(ctx, DDP_ERR_TIMEOUT, "rank %d (%s) did not publish %s ncclUniqueId in time", maker, who, whose);
    if (len != sizeof *id) {
        DDP_FREE(val);
        return ddp__fail(ctx, DDP_ERR_MISMATCH, "rank %d's ncclUniqueId has %u bytes, not %zu (another NCCL version?)", maker,
                         len, sizeof *id);
    }
    memcpy(id, val, sizeof *id);
    DDP_FREE(val);
    return DDP_OK;
}

/* Replica groups of several ranks (desc.outer, >>outer; more than one group): a second
   communicator over the group's ranks, for the buckets (its ncclAvg divides by the group's
   size); everything else stays on the world's. Its ncclUniqueId comes from the group's first
   rank through the store (ncclCommInitRankConfig, not ncclCommSplit: any NCCL from 2.10, and
   the same set-up path, deadline and naming of missing ranks as the world's). */
static ddp_result ddp__gpu_init_team(ddp_context *ctx, double deadline, int version) {
    ncclUniqueId id;
    char key[40], who[48];
    ddp_result r;
    int group = ddp__hybrid(ctx) ? ctx->rank / ctx->shard.hybrid : ctx->outer.group;   /* hybrid: the shard group's */
    if ((ctx->desc.outer.mode == DDP_OUTER_OFF && !ddp__hybrid(ctx)) || ddp__team_world(ctx) <= 1 || ddp__team_world(ctx) >= ctx->world)
        return DDP_OK;
    snprintf(key, sizeof key, "nccl/team-id/%d", group);
    snprintf(who, sizeof who, "%s group %d's first", ddp__hybrid(ctx) ? "shard" : "replica", group);
    if ((r = ddp__nccl_share_id(ctx, key, ddp__team_peer(ctx, 0), who, "the group's", deadline, &id)) != DDP_OK) return r;
    return ddp__gpu_init_comm(ctx, 1, &id, deadline, version);
}

/* Hybrid sharding (desc.shard_group = S; 1 < S < world): a third communicator over the holders
   of this rank's part, member s of every shard group (ranks s, s + S, ..., the world / S of
   them, numbered by group), on which each bucket's part is summed across the groups
   (ddp__nccl_hybrid). Its ncclUniqueId comes from rank s (group 0's member s) through the
   store, as the shard group's does from its first rank. */
static ddp_result ddp__gpu_init_cross(ddp_context *ctx, double deadline, int version) {
    ncclUniqueId id;
    char key[40], who[48];
    ddp_result r;
    int s = ddp__team_rank(ctx);
    if (!ddp__hybrid(ctx) || ddp__team_world(ctx) <= 1 || ddp__team_world(ctx) >= ctx->world) return DDP_OK;
    snprintf(key, sizeof key, "nccl/cross-id/%d", s);
    snprintf(who, sizeof who, "shard group 0's member %d", s);
    if ((r = ddp__nccl_share_id(ctx, key, s, who, "the cross-group communicator's", deadline, &id)) != DDP_OK) return r;
    return ddp__gpu_init_comm(ctx, DDP__NCCL_CROSS, &id, deadline, version);
}

/* Bring-up: the device (LOCAL_RANK modulo the devices visible), the comm stream, and the
   communicator: rank 0 makes the ncclUniqueId and shares it through the store. */
static ddp_result ddp__gpu_setup(ddp_context *ctx, double deadline) {
    ddp__gpu *g;
    ncclUniqueId id;
    int count = 0, version = 0, k;
    cudaError_t e;
    if (!(g = (ddp__gpu *)ddp__calloc(sizeof *g))) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory");
    ctx->impl.gpu = g;
    pthread_mutex_init(&g->lock, NULL);
    ddp__watchdog_init(&g->wd, ctx, &g->lock);
    ddp__gpu_watch_hooks(&g->wd.hooks);
    if ((e = cudaGetDeviceCount(&count)) != cudaSuccess || count == 0)
        return ddp__fail(ctx, DDP_ERR_BACKEND, "the NCCL backend needs a CUDA device, but cudaGetDeviceCount says %s",
                         e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    g->device = ctx->local_rank % count;
    DDP__CUDA(cudaSetDevice(g->device));
    DDP__NCCL(ncclGetVersion(&version));
    if (version < 21000)
        return ddp__fail(ctx, DDP_ERR_BACKEND, "the NCCL backend needs NCCL 2.10 or newer (ncclAvg); this is %d", version);
    g->compute = (cudaStream_t)ctx->desc.cuda_stream;
    DDP__CUDA(cudaStreamCreateWithFlags(&g->comm, cudaStreamNonBlocking));
    DDP__CUDA(cudaEventCreateWithFlags(&g->sync_event, cudaEventDisableTiming));
    DDP__CUDA(cudaEventCreateWithFlags(&g->coll_ready, cudaEventDisableTiming));
    DDP__CUDA(cudaEventCreateWithFlags(&g->coll_done, cudaEventDisableTiming));
    DDP__CUDA(cudaEventCreateWithFlags(&g->watch_event, cudaEventDisableTiming));
    DDP__CUDA(cudaEventCreateWithFlags(&g->watch_newer, cudaEventDisableTiming));
    DDP__CUDA(cudaEventCreateWithFlags(&g->state_copied, cudaEventDisableTiming));
    for (k = 0; k < 2; k++) {
        DDP__CUDA(cudaEventCreate(&g->step_begin[k]));
        DDP__CUDA(cudaEventCreate(&g->step_finish[k]));
    }
    if (ctx->world == 1) DDP__NCCL(ncclGetUniqueId(&id));
    else if (ctx->rank == 0) {
        ddp_result r;
        DDP__NCCL(ncclGetUniqueId(&id));
        if ((r = ddp__store_set(ctx, "nccl/id", &id, sizeof id)) != DDP_OK) return r;
    } else {
        unsigned char *val;
        uint32_t len;
        ddp_result r = ddp__fetch_from_rank0(ctx, "nccl/id", "its ncclUniqueId", deadline, &val, &len);
        if (r != DDP_OK) return r;
        if (len != sizeof id) { DDP_FREE(val); return ddp__fail(ctx, DDP_ERR_MISMATCH, "rank 0's ncclUniqueId has %u bytes, not %zu (another NCCL version?)", len, sizeof id); }
        memcpy(&id, val, sizeof id);
        DDP_FREE(val);
    }
    {
        ddp_result r = ddp__gpu_init_comm(ctx, 0, &id, deadline, version);
        if (r == DDP_OK) r = ddp__gpu_init_team(ctx, deadline, version);
        return r != DDP_OK ? r : ddp__gpu_init_cross(ctx, deadline, version);
    }
}

/* ZeRO-2 on the NCCL backend (ddp__z2; SHARDED GRADIENTS in the manual). The gradients (flat.grads,
   or grads_bf16 with bf16 parameters) are one device range reserved once (>>nccl-vm), so
   ddp_grad's pointers never move. Its holders: this rank's part of every bucket, for the whole
   run; and each bucket's span (its elements and the padding up to the next bucket's, so that the
   spans tile the buffer), from ddp_zero_grad, which maps every span and zeroes the buffer on the
   compute stream, to the end of the ddp_adamw_step after the bucket's reduce-scatter. What only a
   span held is then unmapped: the gradients outside this rank's parts, but for the granules a
   part shares with them (up to 2 a bucket part). */
static size_t ddp__gpu_z2_es(const ddp_context *ctx) { return ctx->flat.grads_bf16 ? sizeof(ddp_bf16) : sizeof(float); }

/* alloc_flat: the range, mapped whole under one holder until commit knows the buckets, zeroed. */
static ddp_result ddp__gpu_z2_alloc(ddp_context *ctx, int bf16) {
    ddp__gpu *g = ctx->impl.gpu;
    size_t bytes = ctx->flat.count * (bf16 ? sizeof(ddp_bf16) : sizeof(float));
    const char *what = "the gradients (DDP_SHARD_GRADIENTS)";
    ddp_result r;
    if (!(g->z2vm = (struct ddp__gvm *)ddp__calloc(sizeof *g->z2vm))) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory");
    if ((r = ddp__gvm_reserve(ctx, g->z2vm, bytes, what)) != DDP_OK) return r;
    if ((r = ddp__gvm_map(ctx, g->z2vm, 0, bytes, what)) != DDP_OK) return r;
    if (bf16) ctx->flat.grads_bf16 = (ddp_bf16 *)g->z2vm->base;
    else ctx->flat.grads = (float *)g->z2vm->base;
    DDP__CUDA(cudaMemset(g->z2vm->base, 0, bytes));
    return DDP_OK;
}

/* commit (buckets and parts known): the spans; this rank's parts and every span held; the
   alloc's holder dropped (nothing is unmapped: every granule is in some span). */
static ddp_result ddp__gpu_z2_commit(ddp_context *ctx) {
    ddp__gpu *g = ctx->impl.gpu;
    size_t es = ddp__gpu_z2_es(ctx), lo, hi;
    int b, c, nb = ctx->model.num_buckets;
    ddp_result r;
    g->z2_span = (size_t *)ddp__calloc(sizeof(size_t) * 2 * (size_t)nb);
    g->z2_held = (unsigned char *)ddp__calloc((size_t)nb);
    g->z2_due = (unsigned char *)ddp__calloc((size_t)nb);
    if (!g->z2_span || !g->z2_held || !g->z2_due) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory");
    DDP__CUDA(cudaEventCreateWithFlags(&g->z2_used, cudaEventDisableTiming));
    for (b = 0; b < nb; b++) {
        size_t off = ctx->model.buckets[b].offset, end = ctx->flat.count;
        int lowest = 1;
        for (c = 0; c < nb; c++) {
            size_t o = ctx->model.buckets[c].offset;
            if (o > off && o < end) end = o;
            if (o < off) lowest = 0;
        }
        g->z2_span[2 * b] = lowest ? 0 : off;
        g->z2_span[2 * b + 1] = end;
    }
    for (b = 0; b < nb; b++) {
        ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
        if (hi > lo && (r = ddp__gvm_map(ctx, g->z2vm, lo * es, (hi - lo) * es, "this rank's parts of the gradients")) != DDP_OK)
            return r;
    }
    for (b = 0; b < nb; b++) {
        if ((r = ddp__gvm_map(ctx, g->z2vm, g->z2_span[2 * b] * es, (g->z2_span[2 * b + 1] - g->z2_span[2 * b]) * es,
                              "the gradients of a bucket")) != DDP_OK)
            return r;
        g->z2_held[b] = 1;
    }
    if (ddp__z2_acc_on(ctx)) DDP__CUDA(cudaMalloc((void **)&g->z2_acc, (ctx->shard.count ? ctx->shard.count : 1) * sizeof(float)));
    return ddp__gvm_unmap(ctx, g->z2vm, 0, ctx->flat.count * es);
}

/* Bucket b's span mapped again (ddp_zero_grad; or a backward that begins without it): granule
   by granule, so that exactly the newly mapped ones are zeroed (on the compute stream), as
   released gradients read zeros; a part's granules keep their values. On failure nothing
   changes (the granules mapped so far go again): an out-of-memory error naming the device. */
static ddp_result ddp__gpu_z2_hold(ddp_context *ctx, int b) {
    ddp__gpu *g = ctx->impl.gpu;
    struct ddp__gvm *vm = g->z2vm;
    size_t es = ddp__gpu_z2_es(ctx), lo = g->z2_span[2 * b] * es, hi = g->z2_span[2 * b + 1] * es, at;
    size_t total = ctx->flat.count * es, run_lo = 0, run_hi = 0;
    ddp_result r;
    char what[96];
    if (g->z2_held[b]) return DDP_OK;
    snprintf(what, sizeof what, "the gradients of bucket %d (DDP_SHARD_GRADIENTS)", b);
    for (at = lo; at < hi;) {
        size_t end = (at / vm->gran + 1) * vm->gran, nlo, nhi;
        if (end > hi) end = hi;
        if ((r = ddp__gvm_map_range(ctx, vm, at, end - at, what, &nlo, &nhi)) != DDP_OK) {
            if (at > lo) (void)ddp__gvm_unmap(ctx, vm, lo, at - lo);
            return r;
        }
        if (nhi > total) nhi = total;
        if (nhi > nlo) {
            if (run_hi != nlo && run_hi > run_lo) DDP__CUDA(cudaMemsetAsync(vm->base + run_lo, 0, run_hi - run_lo, g->compute));
            if (run_hi != nlo) run_lo = nlo;
            run_hi = nhi;
        }
        at = end;
    }
    if (run_hi > run_lo) DDP__CUDA(cudaMemsetAsync(vm->base + run_lo, 0, run_hi - run_lo, g->compute));
    g->z2_held[b] = 1;
    return DDP_OK;
}

/* Every span touching gradient elements [offset, offset + count) held (ddp__gpu_zero's range;
   a backward's: all). */
static ddp_result ddp__gpu_z2_hold_range(ddp_context *ctx, size_t offset, size_t count) {
    ddp__gpu *g = ctx->impl.gpu;
    ddp_result r;
    int b;
    for (b = 0; b < ctx->model.num_buckets; b++)
        if (g->z2_span[2 * b] < offset + count && offset < g->z2_span[2 * b + 1] && (r = ddp__gpu_z2_hold(ctx, b)) != DDP_OK)
            return r;
    return DDP_OK;
}

/* The end of ddp_adamw_step (its kernels and all-gathers enqueued): the spans of the buckets
   reduce-scattered this step are unmapped. Unmapping needs the device done with them: the
   program's backward, its reduce-scatter (the compute stream waited for the last one at
   ddp_finish), and any kernel of the program's that read the gradients before the step. All
   that is before z2_used, recorded on the compute stream when this step began. Why here and
   not at ddp_finish: a host wait there (for the reduce-scatters) would stop the host from
   enqueueing the step while the network works; an event query there finds them mostly not
   done; and until the step every gradient address stays valid for the program's own kernels.
   Here the host waits only for the backward's device work, while the device has the step's
   norm, AdamW and all-gathers queued behind it: it never idles for this wait. */
static ddp_result ddp__gpu_z2_release(ddp_context *ctx) {
    ddp__gpu *g = ctx->impl.gpu;
    size_t es = ddp__gpu_z2_es(ctx);
    ddp_result r;
    int b, any = 0;
    for (b = 0; b < ctx->model.num_buckets; b++) any |= g->z2_due[b] && g->z2_held[b];
    if (!any) return DDP_OK;
    if ((r = ddp__gpu_wait_event(ctx, g->z2_used, "the backward's use of the gradients before their release "
                                 "(DDP_SHARD_GRADIENTS)")) != DDP_OK)
        return r;
    for (b = 0; b < ctx->model.num_buckets; b++) {
        if (!g->z2_due[b] || !g->z2_held[b]) continue;
        g->z2_due[b] = g->z2_held[b] = 0;
        if ((r = ddp__gvm_unmap(ctx, g->z2vm, g->z2_span[2 * b] * es, (g->z2_span[2 * b + 1] - g->z2_span[2 * b]) * es)) != DDP_OK)
            return ddp__fatal(ctx, r);
    }
    return DDP_OK;
}

/* shard_accumulate (ddp__z2_acc_on; SHARDED GRADIENTS): bucket b's reduce-scatter is enqueued
   on the comm stream, every micro-step; its part (this micro-step's average, in flat.grads or
   grads_bf16) goes into the device accumulator, after it on the same stream. The CPU backend's
   ddp__z2_accumulate, operation for operation (ddp_k_accumulate): sync off, the first
   micro-step copies and the others add (acc + g, in float); the synchronizing one leaves acc + g
   in the part (bf16: rounded once), nothing to do after a single micro-step. */
static ddp_result ddp__gpu_z2_accumulate(ddp_context *ctx, int b) {
    ddp__gpu *g = ctx->impl.gpu;
    size_t lo, hi;
    float *acc = g->z2_acc + ctx->shard.base[b];
    int first = ctx->shard.z2_acc_steps == 0, mode;
    if (ctx->step.sync && first) return DDP_OK;   /* one micro-step: the part holds the average already */
    mode = ctx->step.sync ? DDP_K_ACC_FINAL : first ? DDP_K_ACC_FIRST : DDP_K_ACC_ADD;
    ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
    if (ctx->flat.grads_bf16) DDP__CUDA(ddp_k_accumulate_bf16(acc, ctx->flat.grads_bf16 + lo, hi - lo, mode, g->comm));
    else DDP__CUDA(ddp_k_accumulate(acc, ctx->flat.grads + lo, hi - lo, mode, g->comm));
    return DDP_OK;
}

/* shard_accumulate, a micro-step with sync off (ddp_finish; the compute stream waits for the
   last bucket already): the gradients read zeros for the next micro-step, as on the CPU, and
   only this rank's parts stay mapped. What stays mapped is the granules touching a part (the
   part holders'): zeroed on the compute stream (the part, now in the accumulator, and the
   neighbours' leftovers that share its granules); the rest is unmapped (ddp__gpu_z2_release,
   waiting for the compute stream up to here, so for every bucket's reduce-scatter and
   accumulation) and comes back zeroed when mapped again: ddp_set_sync (ddp__gpu_z2_map), the
   next backward's start, or ddp_zero_grad. A host wait at every micro-step's end: the price of
   giving the memory back before the next forward (the device has nothing queued behind it
   that the host could have added meanwhile but the next micro-step). */
static ddp_result ddp__gpu_z2_micro_release(ddp_context *ctx) {
    ddp__gpu *g = ctx->impl.gpu;
    struct ddp__gvm *vm = g->z2vm;
    size_t es = ddp__gpu_z2_es(ctx), total = ctx->flat.count * es, lo, hi;
    int b;
    for (b = 0; b < ctx->model.num_buckets; b++) {
        ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
        if (hi <= lo) continue;
        lo = lo * es / vm->gran * vm->gran;
        hi = (hi * es + vm->gran - 1) / vm->gran * vm->gran;
        if (hi > total) hi = total;
        DDP__CUDA(cudaMemsetAsync(vm->base + lo, 0, hi - lo, g->compute));
    }
    DDP__CUDA(cudaEventRecord(g->z2_used, g->compute));
    g->z2_taped = ctx->tape.replaying;
    return ddp__gpu_z2_release(ctx);
}

/* shard_accumulate: ddp_set_sync before a micro-step maps the gradients released after the
   last one again (zeroed), so that a program's own backward kernels, which write them before
   ddp.h sees that backward, find memory there. Not after a backward of the tape's: ddp_backward
   maps them before its first op, and the forward between runs without them. Out of device
   memory: named, nothing changes; the backward's start tries again. */
static ddp_result ddp__gpu_z2_map(ddp_context *ctx) {
    ddp__gpu *g = ctx->impl.gpu;
    if (!g || !g->z2_acc || !g->z2_span || g->z2_taped) return DDP_OK;
    DDP__GPU_DEVICE(g);
    return ddp__gpu_z2_hold_range(ctx, 0, ctx->flat.count);
}

/* The no-decay mask ddp_k_adamw reads: one byte per DDP_K_MASK_GROUP elements of the flat
   buffer, 1 where the parameter there is flagged DDP_NO_DECAY (parameters start on 16-float
   boundaries, so a group never mixes two). NULL with *status DDP_OK when no parameter is. */
static unsigned char *ddp__gpu_no_decay_mask(const ddp_context *ctx, ddp_result *status) {
    size_t groups = ctx->flat.count / DDP_K_MASK_GROUP, k;
    unsigned char *mask;
    int i, any = 0;
    *status = DDP_OK;
    for (i = 0; i < ctx->model.num_params; i++) any |= (ctx->model.params[i].flags & DDP_NO_DECAY) != 0;
    if (!any) return NULL;
    if (!(mask = (unsigned char *)ddp__calloc(groups))) { *status = DDP_ERR_OUT_OF_MEMORY; return NULL; }
    for (i = 0; i < ctx->model.num_params; i++) {
        const ddp__param *p = &ctx->model.params[i];
        if (!(p->flags & DDP_NO_DECAY)) continue;
        for (k = p->offset / DDP_K_MASK_GROUP; k < (p->offset + p->count + DDP_K_MASK_GROUP - 1) / DDP_K_MASK_GROUP; k++) mask[k] = 1;
    }
    return mask;
}

static ddp_result ddp__gpu_z3_reserve(ddp_context *ctx, void **at, size_t bytes);

/* Commit, first half: the flat buffers in device memory with this rank's initial values (rank
   0's reach everyone later, by broadcast), and the no-decay mask. */
static ddp_result ddp__gpu_alloc_flat(ddp_context *ctx) {
    ddp__gpu *g = ctx->impl.gpu;
    size_t bytes = ctx->flat.count * sizeof(float), groups = ctx->flat.count / DDP_K_MASK_GROUP;
    unsigned char *mask;
    ddp_result r;
    int i;
    int z3 = ctx->desc.shard == DDP_SHARD_PARAMETERS, bf16 = ddp__bf16_params(ctx);
    DDP__GPU_DEVICE(g);
    /* sharded parameters: what the program sees (fp32, or the bf16 working copies) is the view,
       whole until ddp__gpu_z3_commit keeps this rank's parts */
    if (z3 && !bf16 && (r = ddp__gpu_z3_reserve(ctx, (void **)&ctx->flat.params, bytes)) != DDP_OK) return r;
    if (!z3 || bf16) DDP__CUDA(cudaMalloc((void **)&ctx->flat.params, bytes));
    DDP__CUDA(cudaMemset(ctx->flat.params, 0, bytes));
    if (bf16) {   /* the working copies are filled at commit, from the master */
        if (z3 && (r = ddp__gpu_z3_reserve(ctx, (void **)&ctx->flat.params_bf16, ctx->flat.count * sizeof(ddp_bf16))) != DDP_OK)
            return r;
        if (!z3) DDP__CUDA(cudaMalloc((void **)&ctx->flat.params_bf16, ctx->flat.count * sizeof(ddp_bf16)));
        if (ddp__z2(ctx)) {   /* ZeRO-2 (and ZeRO-3's gradients): a device range, >>nccl-vm */
            if ((r = ddp__gpu_z2_alloc(ctx, 1)) != DDP_OK) return r;
        } else {
            DDP__CUDA(cudaMalloc((void **)&ctx->flat.grads_bf16, ctx->flat.count * sizeof(ddp_bf16)));
            DDP__CUDA(cudaMemset(ctx->flat.grads_bf16, 0, ctx->flat.count * sizeof(ddp_bf16)));
        }
    } else if (ddp__z2(ctx)) {
        if ((r = ddp__gpu_z2_alloc(ctx, 0)) != DDP_OK) return r;
    } else {
        DDP__CUDA(cudaMalloc((void **)&ctx->flat.grads, bytes));
        DDP__CUDA(cudaMemset(ctx->flat.grads, 0, bytes));
    }
    for (i = 0; i < ctx->model.num_params; i++) {
        ddp__param *p = &ctx->model.params[i];
        if (p->init) DDP__CUDA(cudaMemcpy(ctx->flat.params + p->offset, p->init, p->count * sizeof(float), cudaMemcpyHostToDevice));
        p->init = NULL;
    }
    if ((mask = ddp__gpu_no_decay_mask(ctx, &r)) != NULL) {
        cudaError_t e = cudaMalloc((void **)&g->no_decay, groups);
        if (e == cudaSuccess) e = cudaMemcpy(g->no_decay, mask, groups, cudaMemcpyHostToDevice);
        DDP_FREE(mask);
        DDP__CUDA(e);
    } else if (r != DDP_OK) return ddp__fail(ctx, r, "out of memory for the no-decay mask");
    /* cudaMemset returns before it is done, and a pageable cudaMemcpy before its last DMA lands;
       both run on the legacy default stream, which the comm stream (non-blocking) and a
       non-blocking compute stream do not wait for: rank 0's broadcast or the first forward
       could read the parameters before they hold their values. Nothing is in flight on ddp.h's
       side yet, so one device-wide wait here costs nothing and cannot hang. */
    DDP__CUDA(cudaDeviceSynchronize());
    return DDP_OK;
}

static ddp_result ddp__gpu_create_events(ddp_context *ctx, cudaEvent_t **events, unsigned flags) {
    int b;
    if (!(*events = (cudaEvent_t *)ddp__calloc(sizeof(cudaEvent_t) * (size_t)ctx->model.num_buckets)))
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for bucket events");
    for (b = 0; b < ctx->model.num_buckets; b++) DDP__CUDA(cudaEventCreateWithFlags(&(*events)[b], flags));
    return DDP_OK;
}

/* Commit, second half (buckets exist, layouts checked): events, staging, rank 0's parameters
   to everyone, the watchdog. */
static ddp_result ddp__gpu_commit(ddp_context *ctx) {
    ddp__gpu *g = ctx->impl.gpu;
    size_t largest = 0;
    ddp_result r;
    int b, k;
    DDP__GPU_DEVICE(g);
    if ((r = ddp__gpu_create_events(ctx, &g->ready, cudaEventDisableTiming)) != DDP_OK) return r;
    for (k = 0; k < 2; k++) {
        if ((r = ddp__gpu_create_events(ctx, &g->comm_start[k], cudaEventDefault)) != DDP_OK) return r;
        if ((r = ddp__gpu_create_events(ctx, &g->comm_end[k], cudaEventDefault)) != DDP_OK) return r;
        if (g->cross && (r = ddp__gpu_create_events(ctx, &g->comm_cross[k], cudaEventDefault)) != DDP_OK) return r;
    }
    if (ddp__sharded(ctx)) {
        if ((r = ddp__gpu_create_events(ctx, &g->updated, cudaEventDisableTiming)) != DDP_OK) return r;
        DDP__CUDA(cudaEventCreateWithFlags(&g->gathered, cudaEventDisableTiming));
    }
    if (g->z2vm && (r = ddp__gpu_z2_commit(ctx)) != DDP_OK) return r;
    for (b = 0; b < ctx->model.num_buckets; b++) if (ctx->model.buckets[b].count > largest) largest = ctx->model.buckets[b].count;
    if (ctx->desc.reduce_dtype == DDP_DTYPE_BF16 && ctx->world > 1 && !ctx->flat.grads_bf16)
        DDP__CUDA(cudaMalloc((void **)&g->bf16, largest * sizeof(uint16_t)));
    if (ctx->desc.reduce_dtype == DDP_DTYPE_FP32 && ctx->world > 1 && ctx->flat.grads_bf16)
        DDP__CUDA(cudaMalloc((void **)&g->f32, largest * sizeof(float)));
    if (ctx->world > 1) {
        const char *what = "the broadcast of rank 0's initial parameters";
        if ((r = ddp__nccl_enqueue(ctx, ctx->flat.params, ctx->flat.count, ncclFloat, ncclSum, 0, what)) != DDP_OK) return r;
        if ((r = ddp__gpu_wait(ctx, g->comm, what)) != DDP_OK) return r;
        if ((r = ddp__store_connect_as(ctx, ddp__now() + ctx->desc.timeout_s, -1, &g->wd.fd)) != DDP_OK) return ddp__fatal(ctx, r);
    }
    if (ddp__watchdog_start(&g->wd)) return ddp__fail_group(ctx, DDP_ERR_SYSTEM, "cannot start the NCCL watchdog thread");
    return DDP_OK;
}

/* bf16 parameters: the bucket's bf16 gradients averaged where they are (ncclBfloat16), or with
   reduce_dtype FP32 widened into one bucket's floats, averaged in fp32 and rounded back (sharded:
   this rank's part), all on the comm stream. */
static ddp_result ddp__gpu_launch_bf16(ddp_context *ctx, int index, const char *what) {
    ddp__gpu *g = ctx->impl.gpu;
    const ddp__bucket *b = &ctx->model.buckets[index];
    const ddp__wire *w = &b->wire;
    ddp_bf16 *grads = ctx->flat.grads_bf16 + b->offset;
    ddp_result r;
    int scatter = w->scatter && !ddp__hybrid(ctx), hybrid = w->scatter && ddp__hybrid(ctx);   /* hybrid: ddp__nccl_hybrid */
    if (w->convert == DDP__WIRE_AS_IS && hybrid) {   /* bf16 sums; the average rounded to bf16 once more */
        if ((r = ddp__nccl_hybrid(ctx, index, grads, ncclBfloat16, sizeof(ddp_bf16))) != DDP_OK) return r;
        return ddp__gpu_hybrid_scale(ctx, NULL, ctx->flat.grads_bf16 + w->lo, w->hi - w->lo);
    }
    if (w->convert == DDP__WIRE_AS_IS)
        return scatter ? ddp__nccl_parts(ctx, index, grads, ncclBfloat16, sizeof(ddp_bf16), 0, what)
                       : ddp__nccl_bucket(ctx, grads, b->count, ncclBfloat16, what);
    DDP__CUDA(ddp_k_bf16_to_f32(grads, g->f32, b->count, g->comm));
    r = hybrid ? ddp__nccl_hybrid(ctx, index, g->f32, ncclFloat, sizeof(float))
        : scatter ? ddp__nccl_parts(ctx, index, g->f32, ncclFloat, sizeof(float), 0, what)
                : ddp__nccl_bucket(ctx, g->f32, b->count, ncclFloat, what);
    if (r != DDP_OK) return r;
    if (hybrid && (r = ddp__gpu_hybrid_scale(ctx, g->f32 + (w->lo - b->offset), NULL, w->hi - w->lo)) != DDP_OK) return r;
    DDP__CUDA(ddp_k_f32_to_bf16(g->f32 + (w->lo - b->offset), ctx->flat.grads_bf16 + w->lo, w->hi - w->lo, g->comm));
    return DDP_OK;
}

/* A bucket is ready: the comm stream waits for the compute stream up to here, then averages
   the bucket in place (through bf16 staging when asked), all enqueued, nothing waited for.
   Sharded: reduce-scattered instead (ddp__nccl_parts). */
static ddp_result ddp__gpu_launch(ddp_context *ctx, int index) {
    ddp__gpu *g = ctx->impl.gpu;
    const ddp__bucket *b = &ctx->model.buckets[index];
    const ddp__wire *w = &b->wire;
    float *grads = ctx->flat.grads ? ctx->flat.grads + b->offset : NULL;   /* NULL: bf16 parameters */
    int par = ctx->tl.step & 1, bf16 = w->convert == DDP__WIRE_NARROW;
    double inject_ms = ctx->desc.inject_comm_latency_ms;
    char what[96];
    ddp_result r;
    DDP__GPU_DEVICE(g);
    ctx->step.stats.buckets_launched++;
    ctx->step.stats.bytes_reduced += w->bytes;
    if (ctx->desc.inject_comm_gbps > 0) inject_ms += 1e3 * (double)w->bytes / (ctx->desc.inject_comm_gbps * 1e9);
    DDP__CUDA(cudaEventRecord(g->ready[index], g->compute));
    DDP__CUDA(cudaStreamWaitEvent(g->comm, g->ready[index], 0));
    DDP__CUDA(cudaEventRecord(g->comm_start[par][index], g->comm));
    if (inject_ms > 0) DDP__CUDA(ddp_k_spin(inject_ms, g->comm));   /* tests/benchmarks: a slow network */
    if (bf16) DDP__CUDA(ddp_k_f32_to_bf16(grads, g->bf16, b->count, g->comm));
    if (w->grads == DDP_DTYPE_BF16) {   /* bf16 parameters; one rank: its gradients are the average already */
        snprintf(what, sizeof what, "the %s of gradient bucket %d (%zu elements)",
                 ctx->desc.shard_optimizer ? "reduce-scatter" : "allreduce", index, b->count);
        if (w->moves && (r = ddp__gpu_launch_bf16(ctx, index, what)) != DDP_OK) return r;
    } else if (w->scatter && ddp__hybrid(ctx)) {   /* summed in the shard group, the part across the groups */
        r = bf16 ? ddp__nccl_hybrid(ctx, index, g->bf16, ncclBfloat16, sizeof(uint16_t))
                 : ddp__nccl_hybrid(ctx, index, grads, ncclFloat, sizeof(float));
        if (r != DDP_OK) return r;
        if (bf16) DDP__CUDA(ddp_k_bf16_to_f32(g->bf16 + (w->lo - b->offset), ctx->flat.grads + w->lo, w->hi - w->lo, g->comm));
        if ((r = ddp__gpu_hybrid_scale(ctx, ctx->flat.grads + w->lo, NULL, w->hi - w->lo)) != DDP_OK) return r;   /* in float */
    } else if (w->scatter) {   /* a reduce-scatter: this rank's part is averaged */
        snprintf(what, sizeof what, "the reduce-scatter of gradient bucket %d (%zu elements)", index, b->count);
        r = bf16 ? ddp__nccl_parts(ctx, index, g->bf16, ncclBfloat16, sizeof(uint16_t), 0, what)
                 : ddp__nccl_parts(ctx, index, grads, ncclFloat, sizeof(float), 0, what);
        if (r != DDP_OK) return r;
        if (bf16) DDP__CUDA(ddp_k_bf16_to_f32(g->bf16 + (w->lo - b->offset), ctx->flat.grads + w->lo, w->hi - w->lo, g->comm));
    } else if (w->moves) {   /* one rank: its gradients are the average already, nothing to move */
        snprintf(what, sizeof what, "the allreduce of gradient bucket %d (%zu elements)", index, b->count);
        if (bf16) r = ddp__nccl_bucket(ctx, g->bf16, b->count, ncclBfloat16, what);
        else r = ddp__nccl_bucket(ctx, grads, b->count, ncclFloat, what);
        if (r != DDP_OK) return r;
        if (bf16) DDP__CUDA(ddp_k_bf16_to_f32(g->bf16, grads, b->count, g->comm));
    }
    if (g->z2_acc && (r = ddp__gpu_z2_accumulate(ctx, index)) != DDP_OK) return r;
    DDP__CUDA(cudaEventRecord(g->comm_end[par][index], g->comm));
    g->last_bucket[par] = index;
    /* ZeRO-2: released at the end of ddp_adamw_step (shard_accumulate, sync off: at ddp_finish) */
    if (g->z2vm && (ctx->step.sync || g->z2_acc)) g->z2_due[index] = 1;
    return DDP_OK;
}

/* The timeline's comm lane on this backend: each bucket's allreduce as the comm stream's events
   saw it, placed on the host clock from the start of backward (the step_begin event, at host
   time host_begin: ddp_step_begin's enqueue). (The compute lane holds
   host times: when the program enqueued its work.) The lane also gets the step's device-side
   spans, which no host time can give: backward on the GPU (step_begin to step_finish) and the
   exposed tail (step_finish to the last bucket's end, empty when comm ended first); the
   backward span goes first so that a viewer draws the allreduces over it. */
static void ddp__gpu_timeline(ddp_context *ctx, int par, const ddp_step_stats *st) {
    ddp__gpu *g = ctx->impl.gpu;
    int b, step = (int)st->step - 1;
    float t0, t1;
    double h = g->host_begin[par];
    if (!ctx->tl.comm) return;
    if (cudaEventElapsedTime(&t1, g->step_begin[par], g->step_finish[par]) == cudaSuccess) {
        ddp__tl_add(ctx->tl.comm, DDP__EV_GPU_BACKWARD, step, h, h + 1e-3 * t1, -1, 0);
        if (st->buckets_launched &&
            cudaEventElapsedTime(&t0, g->step_begin[par], g->comm_end[par][g->last_bucket[par]]) == cudaSuccess)
            ddp__tl_add(ctx->tl.comm, DDP__EV_GPU_EXPOSED, step, h + 1e-3 * t1, h + 1e-3 * (t0 > t1 ? t0 : t1), -1, 0);
    }
    for (b = 0; b < st->buckets_launched; b++) {
        float tx;
        const ddp__wire *w = &ctx->model.buckets[b].wire;
        if (cudaEventElapsedTime(&t0, g->step_begin[par], g->comm_start[par][b]) != cudaSuccess ||
            cudaEventElapsedTime(&t1, g->step_begin[par], g->comm_end[par][b]) != cudaSuccess) continue;
        if (g->comm_cross[par] && w->scatter &&   /* hybrid: the group's reduce-scatter, then the part across the groups */
            cudaEventElapsedTime(&tx, g->step_begin[par], g->comm_cross[par][b]) == cudaSuccess) {
            ddp__tl_add(ctx->tl.comm, DDP__EV_ALLREDUCE, step, h + 1e-3 * t0, h + 1e-3 * tx, b, w->bytes);
            ddp__tl_add(ctx->tl.comm, DDP__EV_CROSS, step, h + 1e-3 * tx, h + 1e-3 * t1, b,
                        (w->hi - w->lo) * (w->bytes / (ctx->model.buckets[b].count ? ctx->model.buckets[b].count : 1)));
        } else ddp__tl_add(ctx->tl.comm, DDP__EV_ALLREDUCE, step, h + 1e-3 * t0, h + 1e-3 * t1, b, w->bytes);
    }
}

/* The GPU times of a step, once its events have completed (never waited for). */
static void ddp__gpu_harvest(ddp_context *ctx, int par) {
    ddp__gpu *g = ctx->impl.gpu;
    ddp_step_stats st = g->timed_stats[par];
    int b, last = g->last_bucket[par];
    float ms;
    if (!g->timed[par] || ddp__gpu_query(g->step_finish[par]) != cudaSuccess) return;
    if (st.buckets_launched && ddp__gpu_query(g->comm_end[par][last]) != cudaSuccess) return;
    if (cudaEventElapsedTime(&ms, g->step_begin[par], g->step_finish[par]) == cudaSuccess) st.backward_ms = ms;
    for (b = 0; b < st.buckets_launched; b++)
        if (cudaEventElapsedTime(&ms, g->comm_start[par][b], g->comm_end[par][b]) == cudaSuccess) st.comm_ms += ms;
    if (st.buckets_launched) {
        if (cudaEventElapsedTime(&ms, g->comm_start[par][last], g->comm_end[par][last]) == cudaSuccess) st.last_bucket_comm_ms = ms;
        if (cudaEventElapsedTime(&ms, g->step_finish[par], g->comm_end[par][last]) == cudaSuccess) st.exposed_ms = ms > 0 ? ms : 0;
    }
    if (st.comm_ms > 0) {
        double hidden = 1.0 - st.exposed_ms / st.comm_ms;
        st.overlap_pct = 100.0 * (hidden < 0 ? 0 : hidden);
    }
    ddp__gpu_timeline(ctx, par, &st);
    ctx->step.last_stats = st;
    g->timed[par] = 0;
}

/* A step begins: read what the last two steps' events can tell, then mark the start. */
static void ddp__gpu_begin_step(ddp_context *ctx) {
    ddp__gpu *g = ctx->impl.gpu;
    int par = ctx->tl.step & 1;
    if (cudaSetDevice(g->device) != cudaSuccess) {
        ddp__fail_group(ctx, DDP_ERR_BACKEND, "cudaSetDevice(%d) failed at the start of a step", g->device);
        return;
    }
    if (g->z2_span) {   /* ZeRO-2: a backward without ddp_zero_grad after a step: the released gradients back, zeroed */
        ddp_result r = ddp__gpu_z2_hold_range(ctx, 0, ctx->flat.count);
        if (r != DDP_OK) { ddp__fatal(ctx, r); return; }
    }
    ddp__gpu_harvest(ctx, par);       /* two steps ago */
    ddp__gpu_harvest(ctx, par ^ 1);   /* the last step: newest wins */
    g->timed[par] = 0;   /* two steps old and still running: its times are lost, its events reused */
    g->host_begin[par] = ddp__now();
    {
        cudaError_t e = cudaEventRecord(g->step_begin[par], g->compute);
        if (e != cudaSuccess) ddp__fatal(ctx, ddp__cuda_fail(ctx, e, "cudaEventRecord(step begin, compute stream)", __FILE__, __LINE__));
    }
}

/* Shutdown: let the last steps' GPU work finish so that their times reach the stats and the
   timeline (the only host wait for step work, outside any step). */
static void ddp__gpu_drain(ddp_context *ctx) {
    ddp__gpu *g = ctx->impl.gpu;
    int older = ctx->tl.step & 1;
    if (!g || ddp__failed(ctx)) return;
    if (ddp__gpu_wait(ctx, g->compute, "the last step before shutdown") != DDP_OK) return;
    if (ddp__gpu_wait(ctx, g->comm, "the last communication before shutdown") != DDP_OK) return;
    ddp__gpu_harvest(ctx, older);
    ddp__gpu_harvest(ctx, older ^ 1);
}

/* Finish: the compute stream waits for the last bucket. Nothing waits on the host. */
static ddp_result ddp__gpu_finish(ddp_context *ctx, double t_wait) {
    ddp__gpu *g = ctx->impl.gpu;
    int par = ctx->tl.step & 1;
    (void)t_wait;   /* the wait happens on the device; its time comes from the events */
    DDP__GPU_DEVICE(g);
    DDP__CUDA(cudaEventRecord(g->step_finish[par], g->compute));
    if (ctx->step.stats.buckets_launched) DDP__CUDA(cudaStreamWaitEvent(g->compute, g->comm_end[par][g->last_bucket[par]], 0));
    g->timed_stats[par] = ctx->step.stats;
    g->timed_stats[par].step = ctx->tl.step + 1;
    g->timed[par] = 1;
    if (g->z2_acc && !ctx->step.sync) {   /* shard_accumulate: the micro-step's gradients go now */
        ddp_result r = ddp__gpu_z2_micro_release(ctx);
        if (r != DDP_OK) return r;
    }
    return ddp__failed(ctx);
}

static ddp_result ddp__gpu_zero(ddp_context *ctx, size_t offset, size_t count) {
    DDP__GPU_DEVICE(ctx->impl.gpu);
    if (ctx->impl.gpu->z2_span) {   /* ZeRO-2: what is zeroed is mapped (ddp_zero_grad: all of it) */
        ddp_result r;
        if (offset == 0 && count == ctx->flat.count) memset(ctx->impl.gpu->z2_due, 0, (size_t)ctx->model.num_buckets);
        if ((r = ddp__gpu_z2_hold_range(ctx, offset, count)) != DDP_OK) return r;
    }
    if (ctx->flat.grads_bf16) DDP__CUDA(cudaMemsetAsync(ctx->flat.grads_bf16 + offset, 0, count * sizeof(ddp_bf16), ctx->impl.gpu->compute));
    else DDP__CUDA(cudaMemsetAsync(ctx->flat.grads + offset, 0, count * sizeof(float), ctx->impl.gpu->compute));
    return DDP_OK;
}

static ddp_result ddp__gpu_scale(ddp_context *ctx, size_t offset, size_t count, float factor) {
    DDP__GPU_DEVICE(ctx->impl.gpu);
    if (ctx->flat.grads_bf16) DDP__CUDA(ddp_k_scale_bf16(ctx->flat.grads_bf16 + offset, count, factor, ctx->impl.gpu->compute));
    else DDP__CUDA(ddp_k_scale(ctx->flat.grads + offset, count, factor, ctx->impl.gpu->compute));
    return DDP_OK;
}

/* On the compute stream, in order with the program's work. */
static ddp_result ddp__gpu_bf16(ddp_context *ctx, int op, size_t offset, size_t count) {
    cudaStream_t s = ctx->impl.gpu->compute;
    DDP__GPU_DEVICE(ctx->impl.gpu);
    if (op == DDP__BF16_SHARD_MASTER) {   /* the master's parts, packed (ddp__master_parts) */
        float *parts = NULL;
        size_t lo, hi;
        int b;
        DDP__CUDA(cudaMalloc((void **)&parts, (ctx->shard.count ? ctx->shard.count : 1) * sizeof(float)));
        for (b = 0; b < ctx->model.num_buckets; b++) {
            ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
            if (hi > lo)
                DDP__CUDA(cudaMemcpyAsync(parts + ctx->shard.base[b], ctx->flat.params + lo, (hi - lo) * sizeof(float),
                                          cudaMemcpyDeviceToDevice, s));
        }
        DDP__CUDA(cudaStreamSynchronize(s));   /* the rounding before and these copies read the whole master */
        DDP__CUDA(cudaFree(ctx->flat.params));
        ctx->flat.params = parts;
    } else DDP__CUDA(ddp_k_f32_to_bf16(ctx->flat.params + offset, ctx->flat.params_bf16 + offset, count, s));
    return DDP_OK;
}

/* m and v: this rank's parts (shard.count floats; unsharded the whole flat buffer). */
static ddp_result ddp__gpu_alloc_adamw(ddp_context *ctx) {
    ddp__gpu *g = ctx->impl.gpu;
    size_t bytes = ctx->shard.count * sizeof(float);
    if (ctx->adam.m) return DDP_OK;
    DDP__CUDA(cudaMalloc((void **)&ctx->adam.m, bytes ? bytes : sizeof(float)));
    DDP__CUDA(cudaMalloc((void **)&ctx->adam.v, bytes ? bytes : sizeof(float)));
    DDP__CUDA(cudaMalloc((void **)&g->norm_blocks, (ctx->shard.norm_blocks + 1) * sizeof(double)));
    DDP__CUDA(cudaMalloc((void **)&g->norm_sq, sizeof(double)));
    DDP__CUDA(cudaMalloc((void **)&g->state, sizeof(ddp_k_adamw_state)));
    /* Zeroed on the compute stream, where the AdamW kernels read them next: a plain cudaMemset
       runs on the legacy default stream, which a non-blocking compute stream does not wait for
       (the first step could read an uninitialized step count and moments). */
    DDP__CUDA(cudaMemsetAsync(ctx->adam.m, 0, bytes, g->compute));
    DDP__CUDA(cudaMemsetAsync(ctx->adam.v, 0, bytes, g->compute));
    DDP__CUDA(cudaMemsetAsync(g->state, 0, sizeof(ddp_k_adamw_state), g->compute));
    DDP__CUDA(cudaMallocHost((void **)&g->state_host, sizeof(ddp_k_adamw_state)));
    memset(g->state_host, 0, sizeof(ddp_k_adamw_state));
    return DDP_OK;
}

/* A step skipped on the device (gradients not finite, nobody asked for the norm on the host)
   is reported by the next call that finds the pinned copy of the state complete. */
/* bf16 parameters: working copies the AdamW kernel found not to be the master rounded (counted
   on the device, reported by ddp__adamw_step once the state's copy has arrived). */
static void ddp__gpu_diverged(ddp_context *ctx) {
    ddp__gpu *g = ctx->impl.gpu;
    if (g->state_host->diverged == g->diverged_seen) return;
    ctx->flat.bf16_diverged += g->state_host->diverged - g->diverged_seen;
    ctx->flat.bf16_diverged_param = -1;
    g->diverged_seen = g->state_host->diverged;
}

static ddp_result ddp__gpu_report_skips(ddp_context *ctx) {
    ddp__gpu *g = ctx->impl.gpu;
    long long skipped;
    if (!g->state_pending || ddp__gpu_query(g->state_copied) != cudaSuccess) return DDP_OK;
    g->state_pending = 0;
    ctx->adam.step = g->state_host->step;
    ddp__gpu_diverged(ctx);
    skipped = g->state_host->skipped - g->skipped_seen;
    g->skipped_seen = g->state_host->skipped;
    if (skipped <= 0) return DDP_OK;
    if (ctx->desc.skip_nonfinite) {
        if (ctx->rank == 0)
            ddp__log(ctx, DDP_LOG_WARN, "%lld optimizer step(s) skipped on the GPU: the gradients were not finite", skipped);
        return DDP_OK;
    }
    return ddp__fail(ctx, DDP_ERR_NONFINITE, "%lld earlier optimizer step(s) had non-finite gradients and were skipped on "
                     "the GPU (parameters unchanged by them); pass grad_norm_out to get this error from the step "
                     "itself, naming the parameter", skipped);
}

/* The global norm's square into g->norm_sq: each bucket's blocks in this rank's part (all of it
   unsharded), sharded their exchange (an allreduce of the block array: every block is non-zero
   on its owner only, so nothing is rounded), then the blocks added in order: the CPU backend's
   bits, sharded or not. The exchange runs on the comm stream between the compute stream's work. */
static ddp_result ddp__gpu_norm(ddp_context *ctx) {
    ddp__gpu *g = ctx->impl.gpu;
    size_t lo, hi;
    int b, sharded = ddp__sharded(ctx);
    /* sharded: the last exchange left every rank's blocks here; the others' must be zeros again */
    if (sharded) DDP__CUDA(cudaMemsetAsync(g->norm_blocks, 0, ctx->shard.norm_blocks * sizeof(double), g->compute));
    for (b = 0; b < ctx->model.num_buckets; b++) {
        size_t off = ctx->model.buckets[b].offset;
        ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
        double *out = g->norm_blocks + ctx->shard.norm_base[b] + (lo - off) / DDP__SHARD_GRAIN;
        if (ctx->flat.grads_bf16) DDP__CUDA(ddp_k_norm_blocks_bf16(ctx->flat.grads_bf16 + lo, hi - lo, DDP__SHARD_GRAIN, out, g->compute));
        else DDP__CUDA(ddp_k_norm_blocks(ctx->flat.grads + lo, hi - lo, DDP__SHARD_GRAIN, out, g->compute));
    }
    if (sharded) {
        ddp_result r;
        DDP__CUDA(cudaEventRecord(g->coll_ready, g->compute));
        DDP__CUDA(cudaStreamWaitEvent(g->comm, g->coll_ready, 0));
        r = ddp__nccl_call(ctx, ddp__hybrid(ctx), DDP__NCCL_ALLREDUCE, g->norm_blocks, g->norm_blocks, ctx->shard.norm_blocks,
                           ncclFloat64, ncclSum, -1, "ddp_adamw_step's allreduce of the gradient norm's blocks (shard_optimizer)");
        if (r != DDP_OK) return r;
        DDP__CUDA(cudaEventRecord(g->coll_done, g->comm));
        DDP__CUDA(cudaStreamWaitEvent(g->compute, g->coll_done, 0));
    }
    DDP__CUDA(ddp_k_sum_doubles(g->norm_blocks, ctx->shard.norm_blocks, g->norm_sq, g->compute));
    return DDP_OK;
}

/* The fused step on this rank's part of each bucket (the whole buffer unsharded). Sharded, as
   each bucket's part is updated the comm stream all-gathers that bucket (the gather of early
   buckets overlaps the update of later ones), and the compute stream waits for the last
   gather before the program's next kernels read the parameters. A skipped step (state->skip)
   changes nothing, and the gather then moves the unchanged values. */
static ddp_result ddp__gpu_update(ddp_context *ctx, const ddp_adamw *opt, float b1, float b2, float eps) {
    ddp__gpu *g = ctx->impl.gpu;
    int b, sharded = ddp__sharded(ctx);
    size_t lo, hi;
    if (!sharded && ctx->flat.params_bf16) {
        DDP__CUDA(ddp_k_adamw_bf16(ctx->flat.params, ctx->flat.params_bf16, ctx->flat.grads_bf16, ctx->adam.m, ctx->adam.v, ctx->flat.count,
                                   g->no_decay, opt->lr, b1, b2, eps, opt->weight_decay, g->state, g->compute));
        return DDP_OK;
    }
    if (!sharded) {
        DDP__CUDA(ddp_k_adamw(ctx->flat.params, ctx->flat.grads, ctx->adam.m, ctx->adam.v, ctx->flat.count, g->no_decay,
                              opt->lr, b1, b2, eps, opt->weight_decay, g->state, g->compute));
        return DDP_OK;
    }
    for (b = 0; b < ctx->model.num_buckets; b++) {
        const ddp__bucket *k = &ctx->model.buckets[b];
        char what[96];
        ddp_result r;
        ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
        if (ctx->flat.params_bf16)   /* this part's master (packed) and working copies; the others' copies come gathered */
            DDP__CUDA(ddp_k_adamw_bf16(ctx->flat.params + ctx->shard.base[b], ctx->flat.params_bf16 + lo, ctx->flat.grads_bf16 + lo,
                                       ctx->adam.m + ctx->shard.base[b], ctx->adam.v + ctx->shard.base[b], hi - lo,
                                       g->no_decay ? g->no_decay + lo / DDP_K_MASK_GROUP : NULL, opt->lr, b1, b2, eps,
                                       opt->weight_decay, g->state, g->compute));
        else
            DDP__CUDA(ddp_k_adamw(ctx->flat.params + lo, ctx->flat.grads + lo, ctx->adam.m + ctx->shard.base[b],
                                  ctx->adam.v + ctx->shard.base[b], hi - lo, g->no_decay ? g->no_decay + lo / DDP_K_MASK_GROUP : NULL,
                                  opt->lr, b1, b2, eps, opt->weight_decay, g->state, g->compute));
        if (ddp__z3(ctx)) continue;   /* sharded parameters: the parts are updated in the view; gathers come per unit */
        DDP__CUDA(cudaEventRecord(g->updated[b], g->compute));
        DDP__CUDA(cudaStreamWaitEvent(g->comm, g->updated[b], 0));
        snprintf(what, sizeof what, "the all-gather of bucket %d's updated parameters (shard_optimizer)", b);
        r = ctx->flat.params_bf16 ? ddp__nccl_parts(ctx, b, ctx->flat.params_bf16 + k->offset, ncclBfloat16, sizeof(ddp_bf16), 1, what)
                             : ddp__nccl_parts(ctx, b, ctx->flat.params + k->offset, ncclFloat, sizeof(float), 1, what);
        if (r != DDP_OK) return r;
    }
    if (ddp__z3(ctx)) return DDP_OK;
    DDP__CUDA(cudaEventRecord(g->gathered, g->comm));
    DDP__CUDA(cudaStreamWaitEvent(g->compute, g->gathered, 0));
    return DDP_OK;
}

/* AdamW on the device: sum of squares -> (skip, clip, step, bias corrections) -> the fused
   step, all on the compute stream. Only with grad_norm_out does the host read the norm back
   (one 40-byte copy and a wait for the compute stream); a program that wants no host wait in
   its steps asks for the norm only on the steps it logs. */
static ddp_result ddp__gpu_adamw(ddp_context *ctx, const ddp_adamw *opt, float b1, float b2, float eps, float *grad_norm_out) {
    ddp__gpu *g = ctx->impl.gpu;
    int host_norm = grad_norm_out != NULL;   /* clipping happens on the device either way */
    ddp_result r;
    DDP__GPU_DEVICE(g);
    if ((r = ddp__gpu_alloc_adamw(ctx)) != DDP_OK) return r;
    if (g->z2vm) DDP__CUDA(cudaEventRecord(g->z2_used, g->compute));   /* ZeRO-2: see ddp__gpu_z2_release */
    /* This call waits for the compute stream below anyway. An earlier step's lazy copy of the
       state that has not completed yet (the host ran ahead) would be overwritten by this step's
       and its skip counted as seen, never reported: settle it first, before anything of this
       step is enqueued. */
    if (host_norm && g->state_pending && (r = ddp__gpu_wait(ctx, g->compute, "the optimizer state")) != DDP_OK) return r;
    if ((r = ddp__gpu_report_skips(ctx)) != DDP_OK) return r;
    if (g->step_dirty) {   /* ddp_adamw_state handed out the step count: it may have been restored */
        DDP__CUDA(cudaMemcpyAsync(&g->state->step, &ctx->adam.step, sizeof(long long), cudaMemcpyHostToDevice, g->compute));
        g->step_dirty = 0;
    }
    if ((r = ddp__gpu_norm(ctx)) != DDP_OK) return r;
    DDP__CUDA(ddp_k_adamw_prepare(g->state, g->norm_sq, opt->max_grad_norm, opt->lr, b1, b2, g->compute));
    if (host_norm) {
        double norm;
        DDP__CUDA(cudaMemcpyAsync(g->state_host, g->state, sizeof(ddp_k_adamw_state), cudaMemcpyDeviceToHost, g->compute));
        if ((r = ddp__gpu_wait(ctx, g->compute, "the gradient norm")) != DDP_OK) return r;
        g->state_pending = 0;
        g->skipped_seen = g->state_host->skipped;
        ctx->adam.step = g->state_host->step;
        ddp__gpu_diverged(ctx);
        norm = sqrt(g->state_host->norm_sq);
        if (grad_norm_out) *grad_norm_out = (float)norm;
        if (!ddp__finite_d(norm)) {   /* the device skipped the step; name the culprit like the CPU does */
            size_t es = ctx->flat.grads_bf16 ? sizeof(ddp_bf16) : sizeof(float);
            void *host = DDP_MALLOC(ctx->flat.count * es + 1);
            if (!host) return ddp__fail(ctx, DDP_ERR_NONFINITE, "optimizer step %lld: the gradient norm is %g", ctx->adam.step + 1, norm);
            cudaError_t e = cudaMemcpy(host, ctx->flat.grads_bf16 ? (void *)ctx->flat.grads_bf16 : (void *)ctx->flat.grads, ctx->flat.count * es,
                                       cudaMemcpyDeviceToHost);
            if (e != cudaSuccess) DDP_FREE(host);
            DDP__CUDA(e);
            r = ctx->flat.grads_bf16 ? ddp__nonfinite(ctx, NULL, (const ddp_bf16 *)host, norm) : ddp__nonfinite(ctx, (const float *)host, NULL, norm);
            DDP_FREE(host);
            if (g->z2vm) {   /* ZeRO-2: a skipped step gives the gradients back like any other */
                ddp_result rr = ddp__gpu_z2_release(ctx);
                if (rr != DDP_OK) return rr;
            }
            return r;
        }
    }
    if ((r = ddp__gpu_update(ctx, opt, b1, b2, eps)) != DDP_OK) return r;
    if (!host_norm) {
        DDP__CUDA(cudaMemcpyAsync(g->state_host, g->state, sizeof(ddp_k_adamw_state), cudaMemcpyDeviceToHost, g->compute));
        DDP__CUDA(cudaEventRecord(g->state_copied, g->compute));
        g->state_pending = 1;
    }
    return g->z2vm ? ddp__gpu_z2_release(ctx) : DDP_OK;
}

/* Checkpoints: m and v are device pointers; the step count is read from the device now, and
   whatever the program leaves in it is uploaded before the next step. */
static ddp_result ddp__gpu_adamw_state(ddp_context *ctx) {
    ddp__gpu *g = ctx->impl.gpu;
    ddp_result r;
    DDP__GPU_DEVICE(g);
    if ((r = ddp__gpu_alloc_adamw(ctx)) != DDP_OK) return r;
    if (!g->step_dirty) {
        DDP__CUDA(cudaMemcpyAsync(g->state_host, g->state, sizeof(ddp_k_adamw_state), cudaMemcpyDeviceToHost, g->compute));
        if ((r = ddp__gpu_wait(ctx, g->compute, "reading the optimizer step")) != DDP_OK) return r;
        ctx->adam.step = g->state_host->step;
        g->state_pending = 0;
    }
    g->step_dirty = 1;
    return DDP_OK;
}

/* Collectives on user buffers, on the compute stream. Device memory: enqueued, ordered with
   the program's kernels, not waited for. Host memory: staged through pinned memory and waited
   for (polled, with the timeout). */
static ddp_result ddp__gpu_collective(ddp_context *ctx, uint32_t kind, void *data, size_t count, int root) {
    ddp__gpu *g = ctx->impl.gpu;
    struct cudaPointerAttributes at;
    int barrier = kind == DDP__KIND_BARRIER || kind == DDP__KIND_SHUTDOWN;
    size_t bytes = kind == DDP__KIND_BROADCAST ? count : barrier ? sizeof(float) : count * sizeof(float);
    int on_device = 0;
    void *buf = data;
    cudaError_t e;
    ddp_result r;
    DDP__GPU_DEVICE(g);
    if (data) {
        e = cudaPointerGetAttributes(&at, data);
        if (e == cudaSuccess) on_device = at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged;
        else ddp__cuda_forget(e);   /* older CUDA: plain host memory is an error here, and ours */
    }
    if (!on_device) {
        if (bytes > g->scratch_bytes) {
            if (g->scratch) { cudaFree(g->scratch); cudaFreeHost(g->scratch_host); g->scratch = g->scratch_host = NULL; g->scratch_bytes = 0; }
            DDP__CUDA(cudaMalloc(&g->scratch, bytes));
            DDP__CUDA(cudaMallocHost(&g->scratch_host, bytes));
            g->scratch_bytes = bytes;
        }
        buf = g->scratch;
        if (data && bytes) {
            memcpy(g->scratch_host, data, bytes);
            DDP__CUDA(cudaMemcpyAsync(g->scratch, g->scratch_host, bytes, cudaMemcpyHostToDevice, g->compute));
        } else DDP__CUDA(cudaMemsetAsync(g->scratch, 0, bytes, g->compute));
    }
    /* NCCL runs on ddp.h's comm stream, after the compute stream's work so far, and the compute
       stream's later work runs after it: ordered like a kernel of the program's own. */
    DDP__CUDA(cudaEventRecord(g->coll_ready, g->compute));
    DDP__CUDA(cudaStreamWaitEvent(g->comm, g->coll_ready, 0));
    if (kind == DDP__KIND_BROADCAST) r = ddp__nccl_enqueue(ctx, buf, count, ncclUint8, ncclSum, root, ctx->what);
    else if (kind == DDP__KIND_BARRIER || kind == DDP__KIND_SHUTDOWN) r = ddp__nccl_enqueue(ctx, buf, 1, ncclFloat, ncclSum, -1, ctx->what);
    else r = ddp__nccl_enqueue(ctx, buf, count, ncclFloat, kind == DDP__KIND_SUM || kind == DDP__KIND_JOIN ? ncclSum : ncclAvg,
                               -1, ctx->what);
    if (r != DDP_OK) return r;
    DDP__CUDA(cudaEventRecord(g->coll_done, g->comm));
    DDP__CUDA(cudaStreamWaitEvent(g->compute, g->coll_done, 0));
    if (on_device) return DDP_OK;
    if (data && bytes && !barrier) {
        DDP__CUDA(cudaMemcpyAsync(g->scratch_host, g->scratch, bytes, cudaMemcpyDeviceToHost, g->compute));
        if ((r = ddp__gpu_wait(ctx, g->compute, ctx->what)) != DDP_OK) return r;
        memcpy(data, g->scratch_host, bytes);
        return DDP_OK;
    }
    return ddp__gpu_wait(ctx, g->compute, ctx->what);
}

/* A communicator's end: finalized (every operation issued completes; polled, the watchdog
   still watching) and destroyed; after a failure, or when finalizing fails, aborted (destroy
   would wait for operations that can never finish), with the other one. */
/* DDP_SHARD_PARAMETERS here (>>zero3's device side): the view is device address space reserved
   once (ddp__gvm), so ddp_param never moves. This rank's parts stay mapped for the whole run:
   they are its owner storage, flat-indexed as ZeRO-1 keeps them, and AdamW updates them in
   place with no all-gather. A gather maps the unit's other granules and enqueues, on the comm
   stream after the compute stream's work so far (AdamW's updates), the in-place all-gather of
   each of its buckets (a unit is whole buckets), as ZeRO-1's after AdamW, and records the
   unit's event; the compute stream waits on that event, the host never does. A release records
   an event on the compute stream (the unit's last use) and its granules are unmapped once that
   event has completed: a deferred count drained at each gather, release and step, with a host
   wait only when a map finds no memory or at the step. Every collective is enqueued from the
   program's thread in the order the program calls gather, prefetch and the buckets, the same on
   every rank: nothing depends on timing. */
static ddp_result ddp__gpu_z3_reserve(ddp_context *ctx, void **at, size_t bytes) {
    ddp__gpu *g = ctx->impl.gpu;
    ddp_result r;
    if (!g->z3vm && !(g->z3vm = (struct ddp__gvm *)ddp__calloc(sizeof *g->z3vm)))
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for the sharded parameters' view");
    if ((r = ddp__gvm_reserve(ctx, g->z3vm, bytes, "the sharded parameters' view (DDP_SHARD_PARAMETERS)")) != DDP_OK) return r;
    if ((r = ddp__gvm_map(ctx, g->z3vm, 0, bytes, "the parameters until ddp_commit (DDP_SHARD_PARAMETERS)")) != DDP_OK) return r;
    *at = g->z3vm->base;
    return DDP_OK;
}

/* Unit u's bytes in the view. */
static void ddp__gpu_z3_span(const ddp_context *ctx, int u, size_t *off, size_t *len) {
    *off = ctx->z3.units[u].lo * ctx->z3.es;
    *len = (ctx->z3.units[u].hi - ctx->z3.units[u].lo) * ctx->z3.es;
}

/* The end of ddp_commit (ddp__z3_commit): the view holds this rank's parts only from here on. */
static ddp_result ddp__gpu_z3_commit(ddp_context *ctx) {
    ddp__gpu *g = ctx->impl.gpu;
    size_t lo, hi, es = ctx->z3.es;
    ddp_result r;
    int u, b;
    DDP__GPU_DEVICE(g);
    ctx->z3.view = g->z3vm->base;
    ctx->z3.view_bytes = g->z3vm->bytes;
    ctx->z3.page = g->z3vm->gran;
    g->z3_units = ctx->z3.num_units;
    if (!(g->z3_gathered = (cudaEvent_t *)ddp__calloc(sizeof(cudaEvent_t) * (size_t)g->z3_units)) ||
        !(g->z3_used = (cudaEvent_t *)ddp__calloc(sizeof(cudaEvent_t) * (size_t)g->z3_units)) ||
        !(g->z3_unmaps = (int *)ddp__calloc(sizeof(int) * (size_t)g->z3_units)))
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for the units' events");
    for (u = 0; u < g->z3_units; u++) {
        DDP__CUDA(cudaEventCreateWithFlags(&g->z3_gathered[u], cudaEventDisableTiming));
        DDP__CUDA(cudaEventCreateWithFlags(&g->z3_used[u], cudaEventDisableTiming));
    }
    DDP__CUDA(cudaEventCreateWithFlags(&g->z3_ready, cudaEventDisableTiming));
    /* the broadcast, the rounding and the master's packing read and wrote the whole view */
    if ((r = ddp__gpu_wait(ctx, g->compute, "the parameters' setup (DDP_SHARD_PARAMETERS)")) != DDP_OK) return r;
    if ((r = ddp__gpu_wait(ctx, g->comm, "the broadcast of rank 0's initial parameters")) != DDP_OK) return r;
    for (b = 0; b < ctx->model.num_buckets; b++) {   /* one holder on the own parts' granules, for good */
        ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
        if (hi > lo && (r = ddp__gvm_map(ctx, g->z3vm, lo * es, (hi - lo) * es, "this rank's parts of the parameters")) != DDP_OK)
            return r;
    }
    return ddp__gvm_unmap(ctx, g->z3vm, 0, ctx->flat.count * es);   /* the setup's holder on everything */
}

/* Released units whose last use has completed: unmapped. wait: the compute stream first. */
static ddp_result ddp__gpu_z3_drain(ddp_context *ctx, int wait) {
    ddp__gpu *g = ctx->impl.gpu;
    size_t off, len;
    ddp_result r;
    int u;
    if (!g->z3_pending) return DDP_OK;
    if (wait && (r = ddp__gpu_wait(ctx, g->compute, "the last use of released units (DDP_SHARD_PARAMETERS)")) != DDP_OK)
        return r;
    for (u = 0; u < g->z3_units && g->z3_pending; u++) {
        cudaError_t q;
        if (!g->z3_unmaps[u]) continue;
        if ((q = ddp__gpu_query(g->z3_used[u])) == cudaErrorNotReady) continue;
        DDP__CUDA(q);
        ddp__gpu_z3_span(ctx, u, &off, &len);
        for (; g->z3_unmaps[u]; g->z3_unmaps[u]--, g->z3_pending--)
            if ((r = ddp__gvm_unmap(ctx, g->z3vm, off, len)) != DDP_OK) return r;
    }
    return DDP_OK;
}

/* Unit u's gather enqueued: its granules mapped, its buckets all-gathered on the comm stream. */
static ddp_result ddp__gpu_z3_gather(ddp_context *ctx, int u) {
    ddp__gpu *g = ctx->impl.gpu;
    const ddp__z3_unit *k = &ctx->z3.units[u];
    size_t off, len, es = ctx->z3.es;
    ddp_result r;
    char what[DDP__NAME_MAX + 160];
    int b;
    DDP__GPU_DEVICE(g);
    if ((r = ddp__gpu_z3_drain(ctx, 0)) != DDP_OK) return r;
    ddp__gpu_z3_span(ctx, u, &off, &len);
    r = ddp__gvm_map(ctx, g->z3vm, off, len, k->name);
    if (r == DDP_ERR_OUT_OF_MEMORY && g->z3_pending) {   /* released units' memory, once their last use is done */
        if ((r = ddp__gpu_z3_drain(ctx, 1)) != DDP_OK) return r;
        r = ddp__gvm_map(ctx, g->z3vm, off, len, k->name);
    }
    if (r != DDP_OK) return r;
    if (ddp__sharded(ctx)) {   /* one rank (or replica groups of one): its parts are the whole view, mapped */
        DDP__CUDA(cudaEventRecord(g->z3_ready, g->compute));
        DDP__CUDA(cudaStreamWaitEvent(g->comm, g->z3_ready, 0));
        for (b = 0; b < ctx->model.num_buckets; b++) {
            const ddp__bucket *bk = &ctx->model.buckets[b];
            if (bk->offset < k->lo || bk->offset >= k->hi) continue;
            snprintf(what, sizeof what, "the all-gather of unit '%s' (bucket %d, %zu elements; DDP_SHARD_PARAMETERS)", k->name, b,
                     bk->count);
            r = es == sizeof(ddp_bf16) ? ddp__nccl_parts(ctx, b, ctx->z3.view + bk->offset * es, ncclBfloat16, es, 1, what)
                                       : ddp__nccl_parts(ctx, b, ctx->z3.view + bk->offset * es, ncclFloat, es, 1, what);
            if (r != DDP_OK) return r;
        }
    }
    DDP__CUDA(cudaEventRecord(g->z3_gathered[u], ddp__sharded(ctx) ? g->comm : g->compute));
    return DDP_OK;
}

/* The compute stream's later work waits for unit u's gather. */
static ddp_result ddp__gpu_z3_wait(ddp_context *ctx, int u) {
    DDP__GPU_DEVICE(ctx->impl.gpu);
    DDP__CUDA(cudaStreamWaitEvent(ctx->impl.gpu->compute, ctx->impl.gpu->z3_gathered[u], 0));
    return DDP_OK;
}

/* Unit u released: its granules go once the compute stream's work so far is done. */
static ddp_result ddp__gpu_z3_release(ddp_context *ctx, int u) {
    ddp__gpu *g = ctx->impl.gpu;
    DDP__GPU_DEVICE(g);
    DDP__CUDA(cudaEventRecord(g->z3_used[u], g->compute));
    g->z3_unmaps[u]++;
    g->z3_pending++;
    return ddp__gpu_z3_drain(ctx, 0);
}

static void ddp__gpu_close_one(ddp_context *ctx, int team) {
    ddp__gpu *g = ctx->impl.gpu;
    ddp_result r = DDP_ERR_BACKEND;
    if (!ddp__nccl_comm(g, team)) return;   /* no such communicator (replica or shard group's, cross-group) */
    if (!ddp__failed(ctx) && ddp__nccl_enter(g, team)) {
        r = ddp__gpu_wait(ctx, g->comm, "the last communication before shutdown");
        if (r == DDP_OK) r = ddp__nccl_settle(ctx, team, ncclCommFinalize(ddp__nccl_comm(g, team)), "ncclCommFinalize",
                                              ddp__now() + ctx->desc.timeout_s);
        ddp__nccl_leave(g, team);
        if (r == DDP_ERR_TIMEOUT && !ddp__failed(ctx))
            ddp__set_failed(ctx, ddp__fail(ctx, DDP_ERR_TIMEOUT, "timed out after %g s finalizing the NCCL %scommunicator "
                                           "at shutdown (a peer stuck or gone?); it was aborted", ctx->desc.timeout_s,
                                           ddp__nccl_whose(ctx, team)));
    }
    if (r == DDP_OK && ddp__nccl_claim(g, team)) ncclCommDestroy(ddp__nccl_comm(g, team));
    else ddp__gpu_abort(ctx);
}

/* The cross-group communicator, the group's, then the world's (set-up's reverse). */
static void ddp__gpu_close_comm(ddp_context *ctx) {
    ddp__gpu_close_one(ctx, DDP__NCCL_CROSS);
    ddp__gpu_close_one(ctx, 1);
    ddp__gpu_close_one(ctx, 0);
}

/* Teardown: the communicator closed while the watchdog still runs, then the watchdog, then
   the memory. */
static void ddp__gpu_teardown(ddp_context *ctx) {
    ddp__gpu *g = ctx->impl.gpu;
    int k, b;
    if (!g) return;
    if (g->z2vm) {   /* ZeRO-2: the gradients are the range's, freed below, not cudaMalloc's */
        if (ctx->flat.grads == (float *)g->z2vm->base) ctx->flat.grads = NULL;
        if (ctx->flat.grads_bf16 == (ddp_bf16 *)g->z2vm->base) ctx->flat.grads_bf16 = NULL;
    }
    cudaSetDevice(g->device);
    ddp__gpu_close_comm(ctx);
    ddp__gpu_stop_watchdog(ctx);
    if (g->z3vm) {   /* the view is not cudaMalloc's: freed below, after cudaFree has synchronized the device */
        if ((void *)ctx->flat.params == (void *)g->z3vm->base) ctx->flat.params = NULL;
        if ((void *)ctx->flat.params_bf16 == (void *)g->z3vm->base) ctx->flat.params_bf16 = NULL;
    }
    cudaFree(ctx->flat.params); cudaFree(ctx->flat.grads); cudaFree(ctx->adam.m); cudaFree(ctx->adam.v);
    cudaFree(ctx->flat.params_bf16); cudaFree(ctx->flat.grads_bf16);
    ctx->flat.params = ctx->flat.grads = ctx->adam.m = ctx->adam.v = NULL;
    ctx->flat.params_bf16 = ctx->flat.grads_bf16 = NULL;
    cudaFree(g->no_decay); cudaFree(g->norm_blocks); cudaFree(g->norm_sq); cudaFree(g->state); cudaFree(g->bf16); cudaFree(g->f32);
    cudaFree(g->scratch);
    if (g->z2vm) { ddp__gvm_free(ctx, g->z2vm); DDP_FREE(g->z2vm); }   /* after cudaFree's device-wide wait */
    DDP_FREE(g->z2_span); DDP_FREE(g->z2_held); DDP_FREE(g->z2_due);
    cudaFree(g->z2_acc);
    if (g->z2_used) cudaEventDestroy(g->z2_used);
    if (g->scratch_host) cudaFreeHost(g->scratch_host);
    if (g->state_host) cudaFreeHost(g->state_host);
    for (b = 0; b < ctx->model.num_buckets; b++) {
        if (g->ready) cudaEventDestroy(g->ready[b]);
        for (k = 0; k < 2; k++) {
            if (g->comm_start[k]) cudaEventDestroy(g->comm_start[k][b]);
            if (g->comm_end[k]) cudaEventDestroy(g->comm_end[k][b]);
            if (g->comm_cross[k]) cudaEventDestroy(g->comm_cross[k][b]);
        }
    }
    for (b = 0; g->updated && b < ctx->model.num_buckets; b++) cudaEventDestroy(g->updated[b]);
    DDP_FREE(g->updated);
    if (g->gathered) cudaEventDestroy(g->gathered);
    DDP_FREE(g->ready);
    for (k = 0; k < 2; k++) {
        DDP_FREE(g->comm_start[k]); DDP_FREE(g->comm_end[k]); DDP_FREE(g->comm_cross[k]);
        if (g->step_begin[k]) cudaEventDestroy(g->step_begin[k]);
        if (g->step_finish[k]) cudaEventDestroy(g->step_finish[k]);
    }
    if (g->sync_event) cudaEventDestroy(g->sync_event);
    if (g->coll_ready) cudaEventDestroy(g->coll_ready);
    if (g->coll_done) cudaEventDestroy(g->coll_done);
    if (g->watch_event) cudaEventDestroy(g->watch_event);
    if (g->watch_newer) cudaEventDestroy(g->watch_newer);
    if (g->state_copied) cudaEventDestroy(g->state_copied);
    for (k = 0; k < g->z3_units; k++) {
        if (g->z3_gathered && g->z3_gathered[k]) cudaEventDestroy(g->z3_gathered[k]);
        if (g->z3_used && g->z3_used[k]) cudaEventDestroy(g->z3_used[k]);
    }
    if (g->z3_ready) cudaEventDestroy(g->z3_ready);
    DDP_FREE(g->z3_gathered); DDP_FREE(g->z3_used); DDP_FREE(g->z3_unmaps);
    if (g->z3vm) ddp__gvm_free(ctx, g->z3vm);
    DDP_FREE(g->z3vm);
    if (g->comm) cudaStreamDestroy(g->comm);
    ddp__watchdog_destroy(&g->wd);
    pthread_mutex_destroy(&g->lock);
    DDP_FREE(g);
    ctx->impl.gpu = NULL;
}

/* NCCL: reading completed events changes only this cache. */
static void ddp__gpu_stats(ddp_context *ctx) {
    ddp__gpu_harvest(ctx, ctx->tl.step & 1);         /* the step before the last */
    ddp__gpu_harvest(ctx, (ctx->tl.step + 1) & 1);   /* the last: newest wins */
}

/* Host <-> device, for checkpoints and inspection: ordered after the compute stream's work
   (a copy on that stream, then a polled wait), outside any step. */
static ddp_result ddp__gpu_copy(ddp_context *ctx, void *dst, const void *src, size_t bytes, int to_host) {
    ddp__gpu *g = ctx->impl.gpu;
    DDP__GPU_DEVICE(g);
    DDP__CUDA(cudaMemcpyAsync(dst, src, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, g->compute));
    return ddp__gpu_wait(ctx, g->compute, to_host ? "a copy to host memory" : "a copy from host memory");
}

/* Shutdown begins: the last steps' work done. The watchdog keeps watching until teardown. */
static void ddp__gpu_stop(ddp_context *ctx) {
    if (ctx->impl.gpu) cudaSetDevice(ctx->impl.gpu->device);
    ddp__gpu_drain(ctx);
}

static void ddp__nccl_table(ddp__backend *t) {
    memset(t, 0, sizeof *t);
    t->name = "nccl";
    t->id = DDP_BACKEND_NCCL;
    t->stats_later = 1;
    t->shards = 1;
    t->shards_grads = 2;   /* ZeRO-2 on device memory it maps and releases itself (ddp__gpu_z2_*) */
    t->setup = ddp__gpu_setup;
    t->alloc_flat = ddp__gpu_alloc_flat;
    t->commit = ddp__gpu_commit;
    t->begin_step = ddp__gpu_begin_step;
    t->grads_map = ddp__gpu_z2_map;
    t->launch = ddp__gpu_launch;
    t->finish = ddp__gpu_finish;
    t->zero = ddp__gpu_zero;
    t->scale = ddp__gpu_scale;
    t->bf16 = ddp__gpu_bf16;
    t->adamw = ddp__gpu_adamw;
    t->adamw_state = ddp__gpu_adamw_state;
    t->copy = ddp__gpu_copy;
    t->collective = ddp__gpu_collective;
    t->stats = ddp__gpu_stats;
    t->poison = ddp__gpu_poison;
    t->stop = ddp__gpu_stop;
    t->teardown = ddp__gpu_teardown;
}
#endif /* DDP_CUDA */


/* --------------------------------------------------------------------------------------------
   >>group  The process group: the choice of backend, the rendezvous, init and shutdown
   -------------------------------------------------------------------------------------------- */
/* The one place that knows every backend. AUTO: NCCL when built with CUDA and a GPU is
   visible (so one binary runs everywhere), else single for one rank, cpu for several. */
static ddp_result ddp__choose_backend(ddp_context *ctx) {
    ddp_desc *d = &ctx->desc;
    int nccl = d->backend == DDP_BACKEND_NCCL;
#ifdef DDP_CUDA
    if (d->backend == DDP_BACKEND_AUTO && ddp__gpu_visible()) nccl = 1;
    if (nccl) { ddp__nccl_table(&ctx->table); ctx->be = &ctx->table; d->backend = DDP_BACKEND_NCCL; return DDP_OK; }
#else
    if (nccl)
        return ddp__fail(ctx, DDP_ERR_BACKEND, DDP__WINDOWS ? "the NCCL backend is Linux-only (NCCL has no Windows build): "
                         "on Windows ddp.h runs the single and cpu backends" : "the NCCL backend needs the implementation "
                         "compiled with CUDA (by nvcc, or with -DDDP_CUDA and ddp_kernels.cuh)");
#endif
    if (d->backend == DDP_BACKEND_SINGLE && ctx->world > 1)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: the single backend is for one rank, but the world "
                         "size is %d", ctx->world);
    if (ctx->world == 1) { ddp__single_table(&ctx->table); ctx->be = &ctx->table; d->backend = DDP_BACKEND_SINGLE; return DDP_OK; }
#ifdef DDP_MPI
    if (d->backend == DDP_BACKEND_MPI || (d->backend == DDP_BACKEND_AUTO && ctx->local_world != ctx->world)) {
        ddp__mpi_table(&ctx->table); ctx->be = &ctx->table; d->backend = DDP_BACKEND_MPI; return DDP_OK;
    }
#else
    if (d->backend == DDP_BACKEND_MPI)
        return ddp__fail(ctx, DDP_ERR_BACKEND, DDP__WINDOWS ? "the MPI backend is Linux-only: on Windows ddp.h runs the "
                         "single and cpu backends" : "the MPI backend needs the implementation built with MPI (mpicc -DDDP_MPI)");
#endif
    if (ctx->local_world != ctx->world) {
        /* Said at once, on every rank, before any network: the hosts this rank knows of, and
           what would run instead. */
        char host[256] = "?";
        ddp__hostname(host, sizeof host);
        return ddp__fail(ctx, DDP_ERR_BAD_ENV, "the CPU backend needs every rank on one host, but "
                         "WORLD_SIZE=%d and LOCAL_WORLD_SIZE=%d: the job spans hosts (this rank on '%s', rank 0's "
                         "store on MASTER_ADDR %s). What works: all %d ranks on one host (ddprun -n %d), GPUs "
                         "(the NCCL backend), or the MPI backend for CPU ranks on several hosts (a build by mpicc "
                         "-DDDP_MPI, started by mpirun or srun --mpi=pmix)", ctx->world,
                         ctx->local_world, host, ctx->job.master_addr, ctx->world, ctx->world);
    }
    ddp__cpu_table(&ctx->table); ctx->be = &ctx->table;
    d->backend = DDP_BACKEND_CPU;
    return DDP_OK;
}

/* Every rank announces itself; each then waits for all the others and checks they agree. */
static ddp_result ddp__rendezvous(ddp_context *ctx, double deadline) {
    char key[64], info[400], num[8], host[256] = "?";
    unsigned char *reply;
    uint32_t len = 0, status = 0;
    int s, found;
    ddp_result r;
    if (!(ctx->rdv.peer_pids = (int *)ddp__calloc(sizeof(int) * (size_t)ctx->world)))
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for %d ranks", ctx->world);
    ddp__hostname(host, sizeof host);
    snprintf(key, sizeof key, "claim/%d", ctx->rank);
    r = ddp__store_request(ctx, DDP__OP_ADD, key, "1", 1, &reply, &len, &status, 0);
    if (r != DDP_OK) return r;
    snprintf(num, sizeof num, "%.7s", (const char *)reply);
    DDP_FREE(reply);
    if (strcmp(num, "1")) {
        /* Refused: the store does not count this connection for the rank (>>store), so the job
           goes on. Say who holds the rank: the winner publishes rank/R right after its claim. */
        int holder_pid = 0;
        char holder_host[256] = "?";
        snprintf(key, sizeof key, "rank/%d", ctx->rank);
        found = 0;
        if (ddp__store_get(ctx, key, ddp__now() + (ctx->desc.timeout_s < 2 ? ctx->desc.timeout_s : 2), &reply, &len,
                           &found) == DDP_OK && found) {
            sscanf((const char *)reply, "%*d %d %255s", &holder_pid, holder_host);
            DDP_FREE(reply);
        }
        if (holder_pid > 0)
            return ddp__fail(ctx, DDP_ERR_BAD_ENV, "two processes of this job were started as rank %d: pid %d on host "
                             "'%s' holds it, this one (pid %d on '%s') was refused and the job goes on without it "
                             "(check RANK, or the launcher)", ctx->rank, holder_pid, holder_host, ddp__getpid(), host);
        return ddp__fail(ctx, DDP_ERR_BAD_ENV, "two processes of this job were started as rank %d: another process "
                         "claimed it first (it did not say which in time), this one (pid %d on '%s') was refused "
                         "(check RANK, or the launcher)", ctx->rank, ddp__getpid(), host);
    }
    snprintf(key, sizeof key, "rank/%d", ctx->rank);
    snprintf(info, sizeof info, "%d %d %s", ctx->world, ddp__getpid(), host);
    if ((r = ddp__store_set(ctx, key, info, strlen(info))) != DDP_OK) return r;
    for (s = 0; s < ctx->world; s++) {
        int world = 0, pid = 0;
        snprintf(key, sizeof key, "rank/%d", s);
        if ((r = ddp__store_get(ctx, key, deadline, &reply, &len, &found)) != DDP_OK) return r;
        if (!found) {
            char missing[256];
            if ((r = ddp__list_missing(ctx, "rank/", s, ctx->world - s, missing, sizeof missing)) != DDP_OK) return r;
            return ddp__fail(ctx, DDP_ERR_TIMEOUT, "rank(s) %s never arrived at the rendezvous on %s:%d within "
                             "%g s (WORLD_SIZE=%d)", missing, ctx->job.master_addr, ctx->desc.master_port,
                             ctx->desc.timeout_s, ctx->world);
        }
        if (s == 0) {
            char where[256] = "";
            sscanf((const char *)reply, "%d %d %255s", &world, &pid, where);
            ctx->rdv.rank0_here = !strcmp(where, host);
        } else sscanf((const char *)reply, "%d %d", &world, &pid);
        DDP_FREE(reply);
        ctx->rdv.peer_pids[s] = pid;
        if (world != ctx->world)
            return ddp__fail(ctx, DDP_ERR_MISMATCH, "ranks disagree on the world size: rank %d (pid %d) was "
                             "started with WORLD_SIZE=%d, this rank with %d", s, pid, world, ctx->world);
    }
    return DDP_OK;
}

/* The timeline, at shutdown: every rank's events go through the store to rank 0, which writes
   one trace. After a failure (or when a rank's trace does not fit the store) each rank writes
   its own, PATH.rankR.json. Called twice: before the shutdown barrier (publish) and after it
   (rank 0 gathers). */
static void ddp__tl_shutdown(ddp_context *ctx, ddp__text *mine, int gather) {
    char eb[DDP__ERR_MAX];
    int together = ctx->world > 1 && ctx->up && ctx->rdv.store_fd >= 0 && !ddp__failed(ctx) && !mine->oom &&
                   mine->len <= DDP__STORE_MAX_VALUE;
    char key[32], path[600];
    int s, found;
    if (!ctx->tl.main) return;
    if (!gather) {
        if (!mine->buf) ddp__text_printf(mine, ",\n{\"name\":\"empty\",\"ph\":\"M\",\"pid\":%d}", ctx->rank);
        snprintf(key, sizeof key, "timeline/%d", ctx->rank);
        if (together && ctx->rank != 0) ddp__store_set(ctx, key, mine->buf, mine->len);
        return;
    }
    if (!together) {
        if (ctx->world > 1) snprintf(path, sizeof path, "%s.rank%d.json", ctx->tl.path, ctx->rank);
        else snprintf(path, sizeof path, "%s", ctx->tl.path);
        if (ddp__tl_write_file(ctx, path, mine) != DDP_OK) ddp__log(ctx, DDP_LOG_WARN, "%s", ddp__err_body(ctx, eb));
        return;
    }
    if (ctx->rank != 0) return;
    for (s = 1; s < ctx->world; s++) {
        unsigned char *text;
        uint32_t len;
        snprintf(key, sizeof key, "timeline/%d", s);
        if (ddp__store_get(ctx, key, ddp__now() + ctx->desc.timeout_s, &text, &len, &found) != DDP_OK || !found) continue;
        ddp__text_printf(mine, "%.*s", (int)len, (const char *)text);
        DDP_FREE(text);
    }
    if (ctx->tl.main->full || ctx->tl.comm->full)
        ddp__log(ctx, DDP_LOG_WARN, "the timeline kept only the first %d events per thread", DDP__TIMELINE_MAX_EVENTS);
    if (ddp__tl_write_file(ctx, ctx->tl.path, mine) != DDP_OK) ddp__log(ctx, DDP_LOG_WARN, "%s", ddp__err_body(ctx, eb));
}


/* The shutdown barriers: through the backend (world > 1 only). */
static ddp_result ddp__group_barrier(ddp_context *ctx) {
    if (ddp__failed(ctx) || ctx->world == 1 || !ctx->up) return DDP_OK;
    return ctx->be->collective(ctx, DDP__KIND_SHUTDOWN, NULL, 0, 0);
}

static ddp_result ddp__outer_backend(ddp_context *ctx);   /* >>outer */

/* Environment and descriptor, the timeline's lists, the backend; with peers, the store and the
   rendezvous; then the backend's data plane. */
static ddp_result ddp__init(ddp_context *ctx, const ddp_desc *desc) {
    double deadline;
    ddp_result r;
    if ((r = ddp__resolve_desc(ctx, desc)) != DDP_OK) return r;
    if (ctx->tl.path[0]) {
        char dir[sizeof ctx->tl.path];
        const char *slash = ddp__last_sep(ctx->tl.path);
        /* the file is written at ddp_shutdown: a directory that cannot take it is told now */
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - ctx->tl.path) + (slash == ctx->tl.path) : 1,
                 slash ? ctx->tl.path : ".");
        if (!ddp__dir_writable(dir))
            return ddp__fail(ctx, DDP_ERR_BAD_ENV, "the timeline '%s' (DDP_TIMELINE or ddp_desc.timeline_path) cannot be "
                             "written: its directory '%s': %s", ctx->tl.path, dir, ddp__strerror(errno));
        ctx->tl.main = (ddp__timeline *)ddp__calloc(sizeof(ddp__timeline));
        ctx->tl.comm = (ddp__timeline *)ddp__calloc(sizeof(ddp__timeline));
        if (!ctx->tl.main || !ctx->tl.comm) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for the timeline");
    }
    if ((r = ddp__choose_backend(ctx)) != DDP_OK) return r;
    if ((r = ddp__outer_backend(ctx)) != DDP_OK) return r;
    if (ctx->desc.shard_optimizer && !ctx->be->shards)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: shard_optimizer is not supported by the %s backend "
                         "(yet): run unsharded there", ctx->be->name);
    /* NCCL gathers by all-gather (>>nccl: ddp__gpu_z3_*), MPI by its own exchange (z3_start), the cpu backend copies from z3_parts */
    if (ctx->desc.shard == DDP_SHARD_PARAMETERS && ctx->world > 1 && !ctx->be->z3_parts && !ctx->be->z3_start &&
        ctx->be->id != DDP_BACKEND_NCCL)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: DDP_SHARD_PARAMETERS is not built yet on the %s backend "
                         "(the cpu backend runs it on one host; DDP_SHARD_OPTIMIZER runs here)", ctx->be->name);
    /* hybrid: every backend gathers within the shard group (cpu: its members' parts; NCCL: the
       group's communicator; MPI: ddp__mpi_z3_start on the group's). Replica groups: within the
       replica group likewise (MPI: a duplicate of the group's communicator, m->team), the outer
       step's gather of the parameters' parts through be->team_bcast (>>outer) */
    /* a joined rank runs no forward, so it makes none of the others' gathers: only local reads work */
    if (ctx->desc.shard == DDP_SHARD_PARAMETERS && ctx->world > 1 && ctx->desc.uneven_inputs != DDP_JOIN_OFF &&
        ctx->be->id != DDP_BACKEND_CPU)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: DDP_SHARD_PARAMETERS with uneven_inputs is not built on "
                         "the %s backend: there a unit's gather is a collective every rank makes, and a rank inside "
                         "ddp_join runs no forward (the cpu backend's gathers are local reads: it runs this; "
                         "DDP_SHARD_GRADIENTS runs here)", ctx->be->name);
    if (ctx->desc.shard == DDP_SHARD_GRADIENTS && !ctx->be->shards_grads)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc: shard DDP_SHARD_GRADIENTS (ZeRO-2) is not built yet on "
                         "the %s backend: use DDP_SHARD_OPTIMIZER there (the same reduce-scatter, the gradients kept "
                         "whole)", ctx->be->name);
    deadline = ddp__now() + ctx->desc.timeout_s;
    if (ctx->world > 1) {
        if (!ctx->job.token[0] && !ctx->job.id[0])
            ddp__log(ctx, ctx->rank == 0 ? DDP_LOG_WARN : DDP_LOG_INFO, "no job identity: no DDP_JOB_TOKEN or DDP_JOB_ID, "
                     "and the launcher gives no job id (TORCHELASTIC_RUN_ID, PMIX_NAMESPACE, SLURM_JOB_ID); a rank of "
                     "another job started on %s:%d would be taken into this one. Set DDP_JOB_ID (or DDP_JOB_TOKEN) "
                     "alike on every rank of a job; ddprun does", ctx->job.master_addr, ctx->desc.master_port);
        else if (!ctx->job.token[0])
            ddp__log(ctx, ctx->local_world < ctx->world ? DDP_LOG_WARN : DDP_LOG_INFO, "no DDP_JOB_TOKEN: the "
                     "rendezvous store on %s:%d accepts any client that can reach it and names this job ('%s')",
                     ctx->job.master_addr, ctx->desc.master_port, ctx->job.id);
        ddp__derive_store_key(ctx);
        if (ctx->rank == 0 && (r = ddp__server_start(ctx)) != DDP_OK) return r;
        if ((r = ddp__store_connect(ctx, deadline)) != DDP_OK) return r;
        if ((r = ddp__rendezvous(ctx, deadline)) != DDP_OK) return r;
    }
    if (ctx->be->setup && (r = ctx->be->setup(ctx, deadline)) != DDP_OK) return ddp__fatal(ctx, r);
    ctx->up = 1;
    return DDP_OK;
}

/* The backend's step work settled, the timeline gathered, two barriers (rank 0 closes its store
   only once every rank is done with it, and no rank returns, and perhaps starts a new group on
   the same port, before the store is closed), then everything freed. */
static ddp_result ddp__shutdown(ddp_context *ctx) {
    char eb[DDP__ERR_MAX];
    ddp_result r;
    ddp__text timeline;
    memset(&timeline, 0, sizeof timeline);
    __atomic_store_n(&ctx->closing, 1, __ATOMIC_RELEASE);
    if (ctx->be && ctx->be->stop) ctx->be->stop(ctx);
    if (ctx->tl.main) ddp__tl_rank_json(ctx, &timeline);
    ddp__tl_shutdown(ctx, &timeline, 0);
    ctx->what = "the shutdown barrier";
    r = ddp__group_barrier(ctx);
    ddp__tl_shutdown(ctx, &timeline, 1);
    DDP_FREE(timeline.buf);
    ddp__tl_free(ctx->tl.main);
    ddp__tl_free(ctx->tl.comm);
    if (ctx->rdv.store_fd >= 0 && r == DDP_OK && !ddp__failed(ctx)) {   /* every rank is here: hanging up is no death */
        char bye[32];
        snprintf(bye, sizeof bye, "bye/%d", ctx->rank);
        /* every rank passed the barrier: rank 0 may have closed its store already, which is no
           failure, and not logged even at debug (the context is freed below: nothing reads it) */
        __atomic_store_n(&ctx->quiet, 1, __ATOMIC_RELAXED);
        (void)ddp__store_set(ctx, bye, "1", 1);
        __atomic_store_n(&ctx->quiet, 0, __ATOMIC_RELAXED);
    }
    /* A poison in flight on another thread (the watchdog's) is published first: hung up before it,
       this rank's connection would tell the peers only "rank N disconnected", not why. Bounded:
       a poison's store request gives up at the job's timeout. */
    {
        double until = ddp__now() + ctx->desc.timeout_s;
        while (__atomic_load_n(&ctx->telling, __ATOMIC_ACQUIRE) > 0 && ddp__now() < until) ddp__usleep(1000);
    }
    if (ctx->rdv.store_fd >= 0) ddp__sock_close(ctx->rdv.store_fd);
    ctx->rdv.store_fd = -1;   /* a late poison must not write to a reused descriptor */
    ddp__server_stop(ctx);
    if (r == DDP_OK) r = ddp__group_barrier(ctx);
    /* The context is freed below, so ddp_last_error cannot tell the caller: say it here. */
    if (r != DDP_OK) ddp__log(ctx, DDP_LOG_ERROR, "ddp_shutdown: %s", ddp__err_body(ctx, eb));
    ddp__z3_free(ctx);   /* its thread reads the backend's segment: before the teardown */
    if (ctx->be) ctx->be->teardown(ctx);
    DDP_FREE(ctx->model.params);
    DDP_FREE(ctx->rdv.peer_pids);
    DDP_FREE(ctx->join.mask);
    DDP_FREE(ctx->step.ready_copy);
    DDP_FREE(ctx->model.buckets);
    DDP_FREE(ctx->shard.base);
    DDP_FREE(ctx->shard.norm_base);
    DDP_FREE(ctx->shard.norm_sums);
    ddp__free_floats(ctx->shard.z2_acc);
    DDP_FREE(ctx->tape.ops);
    DDP_FREE(ctx->tape.arena);
    DDP_FREE(ctx->outer.frag);   /* >>outer */
    ddp__free_floats(ctx->outer.theta);
    ddp__free_floats(ctx->outer.mom);
    ddp__free_floats(ctx->outer.sum);
    ddp__free_floats(ctx->outer.host);
    DDP_FREE(ctx->outer.recv);
    ddp__mutex_destroy(&ctx->err_lock);
    DDP_FREE(ctx);
    return r;
}

/* --------------------------------------------------------------------------------------------
   >>embed  What a host program running ranks as threads reads from another thread: progress,
   through a seqlock the owner writes without waiting for anyone (the reader retries instead).
   Every word is an atomic, so a reader never sees a torn value and ThreadSanitizer sees no race.
   (Cancel: ddp__check_cancel in >>util, called by every wait.)
   -------------------------------------------------------------------------------------------- */
static void ddp__progress_publish(ddp_context *ctx) {
    uint64_t words[DDP__PROGRESS_WORDS];
    uint32_t seq = ctx->embed.seq;   /* only the owner writes it */
    size_t i;
    memset(words, 0, sizeof words);
    memcpy(words, &ctx->embed.progress, sizeof ctx->embed.progress);
    /* odd: a write in progress. Release stores of the words (no fences: ThreadSanitizer does not
       model them): a reader that sees a new word sees the odd count after it. */
    __atomic_store_n(&ctx->embed.seq, seq + 1, __ATOMIC_RELAXED);
    for (i = 0; i < DDP__PROGRESS_WORDS; i++) __atomic_store_n(&ctx->embed.words[i], words[i], __ATOMIC_RELEASE);
    __atomic_store_n(&ctx->embed.seq, seq + 2, __ATOMIC_RELEASE);
}

static void ddp__progress_read(const ddp_context *ctx, ddp_progress *out) {
    uint64_t words[DDP__PROGRESS_WORDS];
    int tries;
    size_t i;
    for (tries = 0;; tries++) {
        uint32_t before = __atomic_load_n(&ctx->embed.seq, __ATOMIC_ACQUIRE), after;
        if (!(before & 1)) {
            for (i = 0; i < DDP__PROGRESS_WORDS; i++) words[i] = __atomic_load_n(&ctx->embed.words[i], __ATOMIC_ACQUIRE);
            after = __atomic_load_n(&ctx->embed.seq, __ATOMIC_RELAXED);
            if (after == before) break;
        }
        if (tries > 64) ddp__yield();   /* the owner was preempted mid-write: let it finish */
    }
    memcpy(out, words, sizeof *out);
    out->failed = (int32_t)ddp__failed(ctx);
}

/* The end of a step (ddp_finish): what the host program's progress display shows. */
static void ddp__progress_step(ddp_context *ctx) {
    double now = ddp__now();
    ddp_progress *p = &ctx->embed.progress;
    p->step = ctx->tl.step;
    p->step_ms = ctx->embed.last_finish > 0 ? 1e3 * (now - ctx->embed.last_finish) : 0;
    ctx->embed.last_finish = now;
    p->backward_ms = ctx->step.last_stats.backward_ms;
    p->comm_ms = ctx->step.last_stats.comm_ms;
    p->exposed_ms = ctx->step.last_stats.exposed_ms;
    p->bytes_reduced = ctx->step.last_stats.bytes_reduced;
    p->active_ranks = ctx->join.active ? ctx->join.active : ctx->world;
    ddp__progress_publish(ctx);
}

static void ddp__report_loss(ddp_context *ctx, float loss) {
    ctx->embed.progress.loss = loss;
    ctx->embed.progress.loss_step = ctx->tl.step;
    ddp__progress_publish(ctx);
}

/* --------------------------------------------------------------------------------------------
   >>params  Parameters, the flat buffers and the buckets
   -------------------------------------------------------------------------------------------- */
static ddp_result ddp__register_param(ddp_context *ctx, const char *name, size_t count, unsigned flags,
                                      const float *init, int *id_out) {
    ddp__param *p;
    int i;
    if (ddp__is_committed(ctx))
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_register_param('%s') after ddp_commit", name ? name : "");
    if (!name || !*name || strlen(name) >= DDP__NAME_MAX || strchr(name, '\n'))
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "parameter names must be 1 to %d characters without newlines",
                         DDP__NAME_MAX - 1);
    if (count == 0 || count > ((size_t)1 << 40))
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "parameter '%s' has %zu elements", name, count);
    if (flags & ~(unsigned)DDP_NO_DECAY)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "parameter '%s' has unknown flags 0x%x", name, flags);
    for (i = 0; i < ctx->model.num_params; i++)
        if (!strcmp(ctx->model.params[i].name, name))
            return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "parameter '%s' is registered twice", name);
    if (ctx->model.num_params == ctx->model.cap_params) {
        int cap = ctx->model.cap_params ? 2 * ctx->model.cap_params : 32;
        ddp__param *grown = (ddp__param *)DDP_MALLOC(sizeof(ddp__param) * (size_t)cap);
        if (!grown) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory registering '%s'", name);
        if (ctx->model.num_params) memcpy(grown, ctx->model.params, sizeof(ddp__param) * (size_t)ctx->model.num_params);
        DDP_FREE(ctx->model.params);
        ctx->model.params = grown;
        ctx->model.cap_params = cap;
    }
    p = &ctx->model.params[ctx->model.num_params];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->count = count;
    p->flags = flags;
    p->init = init;
    if (id_out) *id_out = ctx->model.num_params;
    ctx->model.num_params++;
    return DDP_OK;
}

/* Buckets walk the parameters backwards (the order backward finalizes them): the first is
   capped at first_bucket_mb so communication starts early, the rest at bucket_cap_mb. A
   parameter larger than the cap gets a bucket of its own; none is ever split. */
static ddp_result ddp__build_buckets(ddp_context *ctx) {
    size_t first_cap = (size_t)(ctx->desc.first_bucket_mb * 1048576.0);
    size_t cap = (size_t)(ctx->desc.bucket_cap_mb * 1048576.0);
    int i, n = 0;
    ctx->model.buckets = (ddp__bucket *)ddp__calloc(sizeof(ddp__bucket) * (size_t)ctx->model.num_params);
    if (!ctx->model.buckets) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory building buckets");
    for (i = ctx->model.num_params - 1; i >= 0; i--) {
        ddp__param *p = &ctx->model.params[i];
        size_t end = i + 1 < ctx->model.num_params ? ctx->model.params[i + 1].offset : ctx->flat.count;
        size_t bytes = (end - p->offset) * sizeof(float);
        ddp__bucket *b = n ? &ctx->model.buckets[n - 1] : NULL;
        size_t limit = n <= 1 ? first_cap : cap;
        /* declared units (>>zero3) cut buckets at their boundaries, at every level: so a unit's
           gradients are whole buckets, and every level has the same buckets (the norm's blocks) */
        int cut = b && i + 1 < ctx->model.num_params && ddp__z3_unit_index(ctx, i) != ddp__z3_unit_index(ctx, i + 1);
        if (!b || cut || (b->count * sizeof(float) + bytes > limit && b->count > 0)) {
            b = &ctx->model.buckets[n++];
            b->last_param = i;
            b->count = 0;
        }
        b->first_param = i;
        b->offset = p->offset;
        b->count += end - p->offset;
        p->bucket = n - 1;
    }
    ctx->model.num_buckets = n;
    return DDP_OK;
}

/* Where each bucket's part of this rank begins in m and v (parts packed in flat order, so
   unsharded m[i] is flat element i), and each bucket's first norm block. */
static ddp_result ddp__shard_layout(ddp_context *ctx) {
    size_t at = 0, blocks = 0, lo, hi;
    int b;
    ctx->shard.base = (size_t *)ddp__calloc(sizeof(size_t) * (size_t)ctx->model.num_buckets);
    ctx->shard.norm_base = (size_t *)ddp__calloc(sizeof(size_t) * (size_t)ctx->model.num_buckets);
    if (!ctx->shard.base || !ctx->shard.norm_base) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for the shard layout");
    for (b = ctx->model.num_buckets - 1; b >= 0; b--) {   /* the last bucket holds the first parameters */
        ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
        ctx->shard.base[b] = at;
        at += hi - lo;
    }
    for (b = 0; b < ctx->model.num_buckets; b++) {
        ctx->shard.norm_base[b] = blocks;
        blocks += (ctx->model.buckets[b].count + DDP__SHARD_GRAIN - 1) / DDP__SHARD_GRAIN;
    }
    ctx->shard.count = at;
    ctx->shard.norm_blocks = blocks;
    if (!(ctx->shard.norm_sums = (double *)ddp__calloc(sizeof(double) * (blocks ? blocks : 1))))
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for the norm's blocks");
    return DDP_OK;
}

/* param_dtype BF16: a conversion between the bf16 buffers and the fp32 ones (DDP__BF16_*);
   nothing on an fp32 context. */
static ddp_result ddp__bf16_op(ddp_context *ctx, int op, size_t offset, size_t count) {
    if (!ctx->flat.params_bf16 || !count) return DDP_OK;
    return ctx->be->bf16(ctx, op, offset, count);
}

/* Zero gradients, in their dtype (bf16 with bf16 parameters). */
static ddp_result ddp__zero_grads(ddp_context *ctx, size_t offset, size_t count) {
    return ctx->be->zero(ctx, offset, count);
}

/* One line per parameter; every rank must produce the same text. */
static char *ddp__layout_text(ddp_context *ctx, size_t *len_out) {
    size_t cap = 512 + (size_t)ctx->model.num_params * (DDP__NAME_MAX + 48), len;
    char *text = (char *)DDP_MALLOC(cap);
    int i;
    if (!text) return NULL;
    len = (size_t)snprintf(text, cap, "buckets %.6f %.6f %d reduce %s uneven %d shard %d%s param %s shard_group %d\n",
                           ctx->desc.first_bucket_mb, ctx->desc.bucket_cap_mb, ctx->desc.find_unused,
                           ctx->desc.reduce_dtype == DDP_DTYPE_BF16 ? "bf16" : "fp32", (int)ctx->desc.uneven_inputs,
                           (int)ctx->desc.shard, ctx->desc.shard_accumulate ? " accumulate" : "",   /* the level (shard_optimizer follows it) */
                           ddp__bf16_params(ctx) ? "bf16" : "fp32", ctx->shard.hybrid);
    /* a timeline on some ranks only would stall shutdown (rank 0 waits for each missing trace) */
    len += (size_t)snprintf(text + len, cap - len, "timeline %s\n", ctx->tl.path[0] ? "on" : "off");
    len += (size_t)snprintf(text + len, cap - len, "outer mode %d group_size %d inner_steps %d lr %.9g momentum %.9g "
                            "fragments %d delay_steps %d mix %.9g wire %d quant_block %d\n", (int)ctx->desc.outer.mode,
                            ctx->desc.outer.group_size, ctx->desc.outer.inner_steps, ctx->desc.outer.lr,
                            ctx->desc.outer.momentum, ctx->desc.outer.fragments, ctx->desc.outer.delay_steps,
                            ctx->desc.outer.mix, (int)ctx->desc.outer.wire, ctx->desc.outer.quant_block);
    for (i = 0; i < ctx->model.num_params; i++)
        len += (size_t)snprintf(text + len, cap - len, "%s %zu %u\n", ctx->model.params[i].name,
                                ctx->model.params[i].count, ctx->model.params[i].flags);
    *len_out = len;
    return text;
}

static const char *ddp__line(const char *text, int index, char *out, size_t cap) {
    int i;
    for (i = 0; i < index && text; i++) { text = strchr(text, '\n'); if (text) text++; }
    if (!text || !*text) { snprintf(out, cap, "nothing"); return out; }
    snprintf(out, cap, "%.*s", (int)(strchr(text, '\n') ? strchr(text, '\n') - text : (long)strlen(text)), text);
    return out;
}

/* Name the first line where two layouts differ, as a sentence every rank prints alike. */
static ddp_result ddp__layout_mismatch(ddp_context *ctx, const char *a, const char *b, int rank_b) {
    char la[DDP__NAME_MAX + 64], lb[DDP__NAME_MAX + 64];
    int i = 0;
    while (!strcmp(ddp__line(a, i, la, sizeof la), ddp__line(b, i, lb, sizeof lb))) i++;
    if (i == 0)
        return ddp__fail(ctx, DDP_ERR_MISMATCH, "ranks 0 and %d use different options: rank 0 has '%s', rank %d "
                         "has '%s' (first_bucket_mb, bucket_cap_mb, find_unused, reduce_dtype, uneven_inputs, shard_optimizer / shard / shard_accumulate, param_dtype, shard_group)", rank_b, la, rank_b, lb);
    if (i == 2)
        return ddp__fail(ctx, DDP_ERR_MISMATCH, "ranks 0 and %d use different outer settings (ddp_desc.outer): rank 0 "
                         "has '%s', rank %d has '%s'", rank_b, la, rank_b, lb);
    if (i == 1)
        return ddp__fail(ctx, DDP_ERR_MISMATCH, "ranks 0 and %d use different options: the timeline (DDP_TIMELINE or "
                         "ddp_desc.timeline_path) is set on rank %d and not on rank %d; set it on every rank or on none",
                         rank_b, strcmp(la, "timeline on") ? rank_b : 0, strcmp(la, "timeline on") ? 0 : rank_b);
    return ddp__fail(ctx, DDP_ERR_MISMATCH, "ranks registered different parameters: parameter #%d is '%s' "
                     "(name, elements, flags) on rank 0 but '%s' on rank %d", i - 3, la, lb, rank_b);
}

/* All ranks fetch rank 0's layout and every other rank's, so all reach the same verdict. */
static ddp_result ddp__verify_layout(ddp_context *ctx) {
    size_t len;
    char *mine = ddp__layout_text(ctx, &len), *ref = NULL, key[32];
    double deadline = ddp__now() + ctx->desc.timeout_s;
    ddp_result r;
    uint32_t rlen;
    int s, found;
    if (!mine) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory checking the layout");
    snprintf(key, sizeof key, "layout/%d", ctx->rank);
    r = ddp__store_set(ctx, key, mine, len);
    for (s = 0; s < ctx->world && r == DDP_OK; s++) {
        unsigned char *text;
        snprintf(key, sizeof key, "layout/%d", s);
        if ((r = ddp__store_get(ctx, key, deadline, &text, &rlen, &found)) != DDP_OK) break;
        if (!found) { r = ddp__fail(ctx, DDP_ERR_TIMEOUT, "rank %d did not reach ddp_commit within %g s", s, ctx->desc.timeout_s); break; }
        if (s == 0) { ref = (char *)text; continue; }
        if (strcmp(ref, (const char *)text)) r = ddp__layout_mismatch(ctx, ref, (const char *)text, s);
        DDP_FREE(text);
    }
    DDP_FREE(ref);
    DDP_FREE(mine);
    return r;
}

/* check_ready (a debugging run): one rank, so the gradients stay as the backward left them (no
   average writes them), in host memory. The copy holds each gradient as it was marked ready. */
static ddp_result ddp__ready_check_alloc(ddp_context *ctx) {
    size_t elem = ddp__bf16_params(ctx) ? sizeof(ddp_bf16) : sizeof(float);
    if (ctx->world > 1 || ctx->be->id == DDP_BACKEND_NCCL)
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "check_ready (%s) is a debugging run on one "
                         "rank with host memory (world size %d, backend %s): run the model once on one CPU rank "
                         "with it", ddp__env_set("DDP_CHECK_READY") ? "DDP_CHECK_READY=1" : "ddp_desc.check_ready = 1",
                         ctx->world, ctx->be->name);
    if (!(ctx->step.ready_copy = (unsigned char *)DDP_MALLOC(elem * ctx->flat.count)))
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for check_ready's copy of the gradients");
    return DDP_OK;
}

/* DDP_LOG=info: the bucket plan, once (rank 0; every rank has the same), so a program can see
   which gradients travel together and in which order. */
static void ddp__log_plan(ddp_context *ctx) {
    int b, shown = 0;
    size_t elem = ddp__bf16_params(ctx) ? sizeof(ddp_bf16) : sizeof(float);
    if (ctx->rank != 0 || ctx->desc.log_level > DDP_LOG_INFO) return;
    ddp__log(ctx, DDP_LOG_INFO, "bucket plan: %d parameter(s), %zu floats (%.3f MiB of %s gradients, parameters "
             "on %d-float boundaries) in %d bucket(s) (first_bucket_mb %g, bucket_cap_mb %g); launched in this order, "
             "each as soon as its last parameter is ready, in reverse registration order:", ctx->model.num_params,
             ctx->flat.count, (double)(ctx->flat.count * elem) / 1048576.0, elem == 2 ? "bf16" : "fp32",
             DDP_PARAM_ALIGN_FLOATS, ctx->model.num_buckets, ctx->desc.first_bucket_mb, ctx->desc.bucket_cap_mb);
    for (b = 0; b < ctx->model.num_buckets && shown < 32; b++, shown++) {
        const ddp__bucket *k = &ctx->model.buckets[b];
        int n = k->last_param - k->first_param + 1;
        double bytes = (double)(k->count * elem);
        ddp__log(ctx, DDP_LOG_INFO, "  bucket %d: %.*f %s, floats [%zu, %zu), %d parameter(s): '%s'%s%s%s", b,
                 bytes < 1048576.0 ? 1 : 3, bytes < 1048576.0 ? bytes / 1024.0 : bytes / 1048576.0,
                 bytes < 1048576.0 ? "KiB" : "MiB", k->offset, k->offset + k->count, n, ctx->model.params[k->last_param].name,
                 n > 1 ? " .. '" : "", n > 1 ? ctx->model.params[k->first_param].name : "", n > 1 ? "'" : "");
    }
    if (b < ctx->model.num_buckets) ddp__log(ctx, DDP_LOG_INFO, "  ... and %d more bucket(s)", ctx->model.num_buckets - b);
    if (ctx->model.num_buckets == 1 && ctx->world > 1)
        ddp__log(ctx, DDP_LOG_INFO, "one bucket holds every gradient: its average can begin only when the last "
                 "parameter is ready, so no communication overlaps the backward (right for a small model; a smaller "
                 "first_bucket_mb / bucket_cap_mb splits it)");
}

/* The wire plan: what each bucket's gradients are on the wire and where the result lands, for
   every backend (the CPU backend adds in_place at its commit, once its segment is there). */
static void ddp__plan_wire(ddp_context *ctx) {
    int b;
    for (b = 0; b < ctx->model.num_buckets; b++) {
        ddp__bucket *k = &ctx->model.buckets[b];
        ddp__wire *w = &k->wire;
        w->moves = ctx->world > 1 && ctx->outer.size > 1;   /* replica groups of one rank average nothing (>>outer) */
        w->grads = ddp__bf16_params(ctx) ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
        w->dtype = ctx->desc.reduce_dtype == DDP_DTYPE_BF16 ? DDP_DTYPE_BF16 : DDP_DTYPE_FP32;
        w->convert = !w->moves || w->grads == w->dtype ? DDP__WIRE_AS_IS
                     : w->grads == DDP_DTYPE_FP32 ? DDP__WIRE_NARROW : DDP__WIRE_WIDEN;
        w->scatter = ddp__sharded(ctx);
        w->in_place = w->convert == DDP__WIRE_AS_IS;
        ddp__shard_range(ctx, b, ddp__team_rank(ctx), &w->lo, &w->hi);
        w->bytes = k->count * ddp__wire_bytes(ctx);
    }
}

/* --------------------------------------------------------------------------------------------
   >>zero3  Sharded parameters (desc.shard DDP_SHARD_PARAMETERS; SHARDED PARAMETERS in the
   manual). On top of ZeRO-1's machinery (each bucket's parts by ddp__shard_range, its reduce-
   scatter, the norm's blocks, m and v in parts, the bf16 master in parts): the flat parameter
   buffer the program sees (ddp_param, ddp_flat_params) is an address range reserved once
   (z3.view), whose pages stand behind a unit only while it is gathered; each rank's own parts
   stay where ZeRO-1 keeps them (the owner storage: the rank's parameters in the CPU backend's
   segment, flat-indexed, only its parts' pages kept; with bf16 parameters the working copies
   there and the fp32 master packed), and AdamW updates them in place. A gather commits the
   unit's pages and copies every part from its owner's storage (on the CPU backend a peer's
   segment, readable by every rank: a gather is local copies, no exchange, so a prefetch runs on
   this section's own thread); a release decommits them. Neighbouring units share at most the
   page at their boundary (the layout is the same at every level: no padding added), which stays
   while either is gathered (page_refs). The owners' parts change only inside ddp_adamw_step,
   which ends with a barrier: a gather never reads a part mid-update.
   -------------------------------------------------------------------------------------------- */
/* This rank's owner storage: the fp32 parameters, or the bf16 working copies, flat-indexed. */
static unsigned char *ddp__z3_own(ddp_context *ctx) {
    return ctx->flat.params_bf16 ? (unsigned char *)ctx->flat.params_bf16 : (unsigned char *)ctx->flat.params;
}
static unsigned char *ddp__z3_source(ddp_context *ctx, int member) {
    if (ctx->world == 1) return ddp__z3_own(ctx);
    return ctx->be->z3_parts ? ctx->be->z3_parts(ctx, ddp__team_peer(ctx, member)) : NULL;
}

static ddp_result ddp__register_unit(ddp_context *ctx, const char *name, int first, int n, int *unit_out) {
    int u;
    if (ddp__is_committed(ctx))
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_register_unit('%s') after ddp_commit: declare units before it "
                         "(the flat buffers are laid out there)", name ? name : "");
    if (!name || !*name || strlen(name) >= DDP__NAME_MAX)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_register_unit: a unit needs a name of 1 to %d characters",
                         DDP__NAME_MAX - 1);
    if (n < 1)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_register_unit('%s'): an empty unit (%d parameters): a unit "
                         "holds one parameter at least", name, n);
    if (first < 0 || first > ctx->model.num_params - n)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_register_unit('%s'): parameters %d..%d are not all registered "
                         "(ids 0..%d are): a unit is a run of registered ids, declared after its parameters", name, first,
                         first + n - 1, ctx->model.num_params - 1);
    for (u = 0; u < ctx->z3.num_units; u++) {
        const ddp__z3_unit *k = &ctx->z3.units[u];
        int a = first > k->first ? first : k->first, z = first + n < k->first + k->n ? first + n : k->first + k->n;
        if (!strcmp(k->name, name))
            return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_register_unit('%s'): a unit of that name exists (unit %d)", name, u);
        if (a < z)
            return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_register_unit('%s'): parameters %d..%d overlap unit '%s' "
                             "(%d..%d): parameter '%s' would be in both", name, first, first + n - 1, k->name, k->first,
                             k->first + k->n - 1, ctx->model.params[a].name);
    }
    if (ctx->z3.num_units == ctx->z3.cap_units) {
        int cap = ctx->z3.cap_units ? 2 * ctx->z3.cap_units : 16;
        ddp__z3_unit *grown = (ddp__z3_unit *)DDP_MALLOC(sizeof *grown * (size_t)cap);
        if (!grown) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for units");
        if (ctx->z3.num_units) memcpy(grown, ctx->z3.units, sizeof *grown * (size_t)ctx->z3.num_units);
        DDP_FREE(ctx->z3.units);
        ctx->z3.units = grown;
        ctx->z3.cap_units = cap;
    }
    u = ctx->z3.num_units++;
    memset(&ctx->z3.units[u], 0, sizeof ctx->z3.units[u]);
    snprintf(ctx->z3.units[u].name, DDP__NAME_MAX, "%s", name);
    ctx->z3.units[u].first = first;
    ctx->z3.units[u].n = n;
    ctx->z3.units[u].last_op = -1;
    if (unit_out) *unit_out = u;
    return DDP_OK;
}

/* The declared unit parameter i is in (-1: none); before ddp_commit too. */
static int ddp__z3_unit_index(const ddp_context *ctx, int i) {
    int u;
    for (u = 0; u < ctx->z3.num_units; u++)
        if (i >= ctx->z3.units[u].first && i < ctx->z3.units[u].first + ctx->z3.units[u].n) return u;
    return -1;
}

/* At ddp_commit, before anything is laid out: under PARAMETERS every parameter is in a unit. */
static ddp_result ddp__z3_check_units(ddp_context *ctx) {
    int i, u;
    if (ctx->desc.shard != DDP_SHARD_PARAMETERS) return DDP_OK;
    for (i = 0; i < ctx->model.num_params; i++) {
        for (u = 0; u < ctx->z3.num_units; u++)
            if (i >= ctx->z3.units[u].first && i < ctx->z3.units[u].first + ctx->z3.units[u].n) break;
        if (u == ctx->z3.num_units)
            return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_commit: parameter '%s' (id %d) is in no unit: with "
                             "DDP_SHARD_PARAMETERS every parameter belongs to one (ddp_register_unit), which is gathered "
                             "before its forward and released after", ctx->model.params[i].name, i);
    }
    return DDP_OK;
}

/* Unit u's parts, every owner's, into the view (its pages committed already): the bytes copied.
   Runs on the rank's thread or the prefetch thread; reads only what no one writes until the
   next ddp_adamw_step. */
static size_t ddp__z3_copy(ddp_context *ctx, int u) {
    const ddp__z3_unit *k = &ctx->z3.units[u];
    size_t es = ctx->z3.es, lo, hi, a, z, bytes = 0;
    int b, s;
    for (b = 0; b < ctx->model.num_buckets; b++) {
        const ddp__bucket *bk = &ctx->model.buckets[b];
        if (bk->offset >= k->hi || bk->offset + bk->count <= k->lo) continue;
        for (s = 0; s < ddp__team_world(ctx); s++) {
            const unsigned char *src;
            ddp__shard_range(ctx, b, s, &lo, &hi);
            a = lo > k->lo ? lo : k->lo;
            z = hi < k->hi ? hi : k->hi;
            if (z <= a || !(src = ddp__z3_source(ctx, s))) continue;
            memcpy(ctx->z3.view + a * es, src + a * es, (z - a) * es);
            bytes += (z - a) * es;
        }
    }
    return bytes;
}

/* The pages of unit u's range: [*p0, *p1). */
static void ddp__z3_page_span(const ddp_context *ctx, int u, size_t *p0, size_t *p1) {
    const ddp__z3_unit *k = &ctx->z3.units[u];
    *p0 = k->lo * ctx->z3.es / ctx->z3.page;
    *p1 = (k->hi * ctx->z3.es + ctx->z3.page - 1) / ctx->z3.page;
}

/* Commit the pages of unit u that no gathered unit holds, then count u on each (under z3.lock).
   0, or -1 with errno (nothing changed). */
static int ddp__z3_commit_pages(ddp_context *ctx, int u) {
    size_t p0, p1, p, q, page = ctx->z3.page;
    uint32_t *refs = ctx->z3.page_refs;
    ddp__z3_page_span(ctx, u, &p0, &p1);
    for (p = p0; p < p1; p = q) {
        if (refs[p]) { q = p + 1; continue; }
        for (q = p; q < p1 && !refs[q]; q++) {}
        if (ddp__vm_commit(ctx->z3.view + p * page, (q - p) * page) != 0) {
            int e = errno;
            size_t x, y;
            for (x = p0; x < p; x = y) {   /* undo this call's commits */
                if (refs[x]) { y = x + 1; continue; }
                for (y = x; y < p && !refs[y]; y++) {}
                ddp__vm_decommit(ctx->z3.view + x * page, (y - x) * page);
            }
            errno = e;
            return -1;
        }
    }
    for (p = p0; p < p1; p++) refs[p]++;
    return 0;
}

/* Uncount unit u on its pages and decommit those no gathered unit holds (under z3.lock). */
static int ddp__z3_decommit_pages(ddp_context *ctx, int u) {
    size_t p0, p1, p, q, page = ctx->z3.page;
    uint32_t *refs = ctx->z3.page_refs;
    int rc = 0;
    ddp__z3_page_span(ctx, u, &p0, &p1);
    for (p = p0; p < p1; p++) refs[p]--;
    for (p = p0; p < p1; p = q) {
        if (refs[p]) { q = p + 1; continue; }
        for (q = p; q < p1 && !refs[q]; q++) {}
        if (ddp__vm_decommit(ctx->z3.view + p * page, (q - p) * page) != 0) rc = -1;
    }
    return rc;
}

/* Unit u's pages committed and its state IN_FLIGHT (this thread's to fill), the lock not held:
   copy it, then mark it gathered with the copy's times (the timeline). Returns with the lock held. */
static void ddp__z3_fill(ddp_context *ctx, int u) {
    double t0 = ddp__now(), t1;
    ddp__z3_copy(ctx, u);
    t1 = ddp__now();
    ddp__mutex_lock(&ctx->z3.lock);
    ctx->z3.units[u].t0 = t0;
    ctx->z3.units[u].t1 = t1;
    ctx->z3.units[u].state = DDP__Z3_GATHERED;
    ddp__cond_broadcast(&ctx->z3.cond);
}

/* The prefetch thread: copies queued units, marks each gathered. */
static void *ddp__z3_main(void *arg) {
    ddp_context *ctx = (ddp_context *)arg;
    ddp__mutex_lock(&ctx->z3.lock);
    for (;;) {
        int u;
        while (!ctx->z3.stop && !ctx->z3.qlen) ddp__cond_wait(&ctx->z3.cond, &ctx->z3.lock);
        if (ctx->z3.stop) break;
        u = ctx->z3.queue[ctx->z3.qhead];
        ctx->z3.qhead = (ctx->z3.qhead + 1) % ctx->z3.num_units;
        ctx->z3.qlen--;
        ddp__mutex_unlock(&ctx->z3.lock);
        ddp__z3_fill(ctx, u);
    }
    ddp__mutex_unlock(&ctx->z3.lock);
    return NULL;
}

static size_t ddp__z3_unit_bytes(const ddp_context *ctx, int u) { return (ctx->z3.units[u].hi - ctx->z3.units[u].lo) * ctx->z3.es; }

/* The timeline's gather event: the copy's times; prefetched (args "prefetched": 1) when the
   prefetch thread made it (NCCL: when ddp_unit_prefetch enqueued it). */
static void ddp__z3_record_gather(ddp_context *ctx, int u, double t0, double t1, int prefetched) {
    ddp__timeline *tl = ctx->tl.main;
    size_t len = tl ? tl->len : 0;
    ddp__record(ctx, tl, DDP__EV_GATHER, t0, t1, u, ddp__z3_unit_bytes(ctx, u));
    if (tl && tl->len == len + 1) tl->ev[len].first_param = prefetched;
}
static int ddp__z3_state(ddp_context *ctx, int u);
static ddp_result ddp__z3_prefetch(ddp_context *ctx, int u);

/* The backend's exchange (be->z3_start, MPI): unit u's pages committed and its gather started
   on this thread (a collective: the program's calls order it alike on every rank); the wait is
   ddp__z3_exchange_wait. fetched: started by a prefetch (the timeline says so). */
static ddp_result ddp__z3_exchange_start(ddp_context *ctx, int u, int fetched, const char *call) {
    ddp_result r;
    int rc;
    ddp__mutex_lock(&ctx->z3.lock);
    rc = ddp__z3_commit_pages(ctx, u);
    if (rc == 0) {
        ctx->z3.units[u].state = DDP__Z3_IN_FLIGHT;
        ctx->z3.units[u].fetched = fetched;
        ctx->z3.units[u].t0 = ddp__now();
    }
    ddp__mutex_unlock(&ctx->z3.lock);
    if (rc != 0) {   /* a local failure before any exchange: the ranks stay in step only if every rank fails alike */
        int e = errno;
        return ddp__fail_group(ctx, DDP_ERR_OUT_OF_MEMORY, "%s: no memory for unit '%s' (%zu bytes): %s", call,
                               ctx->z3.units[u].name, ddp__z3_unit_bytes(ctx, u), ddp__strerror(e));
    }
    if ((r = ctx->be->z3_start(ctx, u)) != DDP_OK) return r;   /* failed the group: the view stays as it is */
    return DDP_OK;
}

/* The exchange of a unit in flight completed: the unit is gathered. */
static ddp_result ddp__z3_exchange_wait(ddp_context *ctx, int u) {
    ddp_result r = ctx->be->z3_wait(ctx, u);
    if (r != DDP_OK) return r;
    ddp__mutex_lock(&ctx->z3.lock);
    ctx->z3.units[u].t1 = ddp__now();
    ctx->z3.units[u].state = DDP__Z3_GATHERED;
    ddp__mutex_unlock(&ctx->z3.lock);
    return DDP_OK;
}

/* Unit u gathered, on this thread or by waiting for its prefetch. */
static ddp_result ddp__z3_gather(ddp_context *ctx, int u) {
    double t0, t1;
    int fetched;
    if (ctx->be->z3_start && ctx->world > 1) {   /* MPI: started here or by a prefetch, completed here */
        ddp_result r;
        int was = ddp__z3_state(ctx, u);
        if (was == DDP__Z3_GATHERED) return DDP_OK;
        if (was == DDP__Z3_RELEASED && (r = ddp__z3_exchange_start(ctx, u, 0, "ddp_unit_gather")) != DDP_OK) return r;
        if ((r = ddp__z3_exchange_wait(ctx, u)) != DDP_OK) return r;
        ddp__mutex_lock(&ctx->z3.lock);
        fetched = ctx->z3.units[u].fetched;
        ctx->z3.units[u].fetched = 0;
        ddp__mutex_unlock(&ctx->z3.lock);
        ddp__z3_record_gather(ctx, u, ctx->z3.units[u].t0, ctx->z3.units[u].t1, fetched);
        return DDP_OK;
    }
#ifdef DDP_CUDA
    if (ctx->z3.device) {   /* enqueued (or prefetched), and the compute stream waits for it: no host wait */
        ddp_result r;
        int was;
        if ((was = ddp__z3_state(ctx, u)) == DDP__Z3_GATHERED) return DDP_OK;
        if (was == DDP__Z3_RELEASED && (r = ddp__z3_prefetch(ctx, u)) != DDP_OK) return r;
        if ((r = ddp__gpu_z3_wait(ctx, u)) != DDP_OK) return r;
        ddp__mutex_lock(&ctx->z3.lock);
        ctx->z3.units[u].state = DDP__Z3_GATHERED;
        ddp__mutex_unlock(&ctx->z3.lock);
        ddp__z3_record_gather(ctx, u, ctx->z3.units[u].t0, ctx->z3.units[u].t1, was == DDP__Z3_IN_FLIGHT);
        return DDP_OK;
    }
#endif
    ddp__mutex_lock(&ctx->z3.lock);
    while (ctx->z3.units[u].state == DDP__Z3_IN_FLIGHT) ddp__cond_wait(&ctx->z3.cond, &ctx->z3.lock);
    if (ctx->z3.units[u].state == DDP__Z3_GATHERED) {
        t0 = ctx->z3.units[u].t0; t1 = ctx->z3.units[u].t1;
        fetched = ctx->z3.units[u].fetched;   /* its prefetch's event, once (a gathered unit's gather: none) */
        ctx->z3.units[u].fetched = 0;
        ddp__mutex_unlock(&ctx->z3.lock);
        if (fetched) ddp__z3_record_gather(ctx, u, t0, t1, 1);
        return DDP_OK;
    }
    if (ddp__z3_commit_pages(ctx, u) != 0) {
        int e = errno;
        ddp__mutex_unlock(&ctx->z3.lock);
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "ddp_unit_gather: no memory for unit '%s' (%zu bytes): %s",
                         ctx->z3.units[u].name, ddp__z3_unit_bytes(ctx, u), ddp__strerror(e));
    }
    ctx->z3.units[u].state = DDP__Z3_IN_FLIGHT;   /* the pages are ours: copy outside the lock */
    ddp__mutex_unlock(&ctx->z3.lock);
    ddp__z3_fill(ctx, u);
    t0 = ctx->z3.units[u].t0; t1 = ctx->z3.units[u].t1;
    ddp__mutex_unlock(&ctx->z3.lock);
    ddp__z3_record_gather(ctx, u, t0, t1, 0);
    return DDP_OK;
}

/* Unit u's gather started on the prefetch thread (nothing to do if it is gathered or on its way). */
static ddp_result ddp__z3_prefetch(ddp_context *ctx, int u) {
#ifdef DDP_CUDA
    if (ctx->z3.device) {   /* the gather enqueued on the comm stream (its times: the enqueue's) */
        ddp_result r;
        double t0 = ddp__now();
        if (ddp__z3_state(ctx, u) != DDP__Z3_RELEASED) return DDP_OK;
        if ((r = ddp__gpu_z3_gather(ctx, u)) != DDP_OK) return r;
        ddp__mutex_lock(&ctx->z3.lock);
        ctx->z3.units[u].t0 = t0;
        ctx->z3.units[u].t1 = ddp__now();
        ctx->z3.units[u].state = DDP__Z3_IN_FLIGHT;
        ddp__mutex_unlock(&ctx->z3.lock);
        return DDP_OK;
    }
#endif
    if (ctx->be->z3_start && ctx->world > 1)   /* MPI: the exchange started now, on this thread (ddp__mpi_z3_start says why) */
        return ddp__z3_state(ctx, u) != DDP__Z3_RELEASED ? DDP_OK : ddp__z3_exchange_start(ctx, u, 1, "ddp_unit_prefetch");
    ddp__mutex_lock(&ctx->z3.lock);
    if (ctx->z3.units[u].state != DDP__Z3_RELEASED) { ddp__mutex_unlock(&ctx->z3.lock); return DDP_OK; }
    if (ddp__z3_commit_pages(ctx, u) != 0) {
        int e = errno;
        ddp__mutex_unlock(&ctx->z3.lock);
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "ddp_unit_prefetch: no memory for unit '%s' (%zu bytes): %s",
                         ctx->z3.units[u].name, ddp__z3_unit_bytes(ctx, u), ddp__strerror(e));
    }
    ctx->z3.units[u].state = DDP__Z3_IN_FLIGHT;
    ctx->z3.units[u].fetched = 1;
    ctx->z3.queue[(ctx->z3.qhead + ctx->z3.qlen) % ctx->z3.num_units] = u;
    ctx->z3.qlen++;
    ddp__cond_broadcast(&ctx->z3.cond);
    ddp__mutex_unlock(&ctx->z3.lock);
    return DDP_OK;
}

/* A parameter of unit u that tape op `op` lists (for messages). */
static const char *ddp__z3_op_param(const ddp_context *ctx, int op, int u) {
    const ddp__tape_op *o = &ctx->tape.ops[op];
    int j, id;
    for (j = 0; j < o->num_ids; j++) {
        memcpy(&id, ctx->tape.arena + o->ids_offset + sizeof(int) * (size_t)j, sizeof id);
        if (ctx->z3.unit_of[id] == u) return ctx->model.params[id].name;
    }
    return "?";
}

/* Unit u's pages decommitted. quiet: the backward's own release (nothing to do if released). */
static ddp_result ddp__z3_release(ddp_context *ctx, int u, int quiet) {
    double t0 = ddp__now();
    int rc;
    if (!quiet && ctx->z3.replay_op >= 0 && ctx->z3.units[u].last_op >= 0 && ctx->z3.units[u].last_op < ctx->z3.replay_op)
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_unit_release: unit '%s' is still in use by a recorded op: tape op "
                         "%d, not replayed yet, lists its parameter '%s' (ddp_backward releases the unit itself once its "
                         "last op has run)", ctx->z3.units[u].name, ctx->z3.units[u].last_op,
                         ddp__z3_op_param(ctx, ctx->z3.units[u].last_op, u));
#ifdef DDP_CUDA
    if (ctx->z3.device) {   /* unmapped once the compute stream is past the unit's last use (ddp__gpu_z3_drain) */
        ddp_result r;
        int s = ddp__z3_state(ctx, u);
        if (s == DDP__Z3_RELEASED)
            return quiet ? DDP_OK : ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_unit_release: unit '%s' is not gathered "
                                              "(released twice?)", ctx->z3.units[u].name);
        if (s == DDP__Z3_IN_FLIGHT && (r = ddp__gpu_z3_wait(ctx, u)) != DDP_OK) return r;   /* prefetched: its gather first */
        ddp__mutex_lock(&ctx->z3.lock);
        ctx->z3.units[u].state = DDP__Z3_RELEASED;
        ddp__mutex_unlock(&ctx->z3.lock);
        if ((r = ddp__gpu_z3_release(ctx, u)) != DDP_OK) return r;
        ddp__record(ctx, ctx->tl.main, DDP__EV_RELEASE, t0, ddp__now(), u, ddp__z3_unit_bytes(ctx, u));
        return DDP_OK;
    }
#endif
    if (ctx->be->z3_start && ctx->world > 1 && ddp__z3_state(ctx, u) == DDP__Z3_IN_FLIGHT) {   /* MPI: prefetched, its exchange first */
        ddp_result r = ddp__z3_exchange_wait(ctx, u);
        if (r != DDP_OK) return r;
    }
    ddp__mutex_lock(&ctx->z3.lock);
    while (ctx->z3.units[u].state == DDP__Z3_IN_FLIGHT) ddp__cond_wait(&ctx->z3.cond, &ctx->z3.lock);
    if (ctx->z3.units[u].state != DDP__Z3_GATHERED) {
        ddp__mutex_unlock(&ctx->z3.lock);
        return quiet ? DDP_OK : ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_unit_release: unit '%s' is not gathered "
                                          "(released twice?)", ctx->z3.units[u].name);
    }
    ctx->z3.units[u].state = DDP__Z3_RELEASED;
    rc = ddp__z3_decommit_pages(ctx, u);
    if (ctx->z3.units[u].fetched) {   /* prefetched and released unused: its copy still happened */
        double c0 = ctx->z3.units[u].t0, c1 = ctx->z3.units[u].t1;
        ctx->z3.units[u].fetched = 0;
        ddp__mutex_unlock(&ctx->z3.lock);
        ddp__z3_record_gather(ctx, u, c0, c1, 1);
    } else
        ddp__mutex_unlock(&ctx->z3.lock);
    if (rc != 0)
        return ddp__fail(ctx, DDP_ERR_SYSTEM, "ddp_unit_release: unit '%s': its pages could not be decommitted: %s",
                         ctx->z3.units[u].name, ddp__strerror(errno));
    ddp__record(ctx, ctx->tl.main, DDP__EV_RELEASE, t0, ddp__now(), u, ddp__z3_unit_bytes(ctx, u));
    return DDP_OK;
}

static int ddp__z3_state(ddp_context *ctx, int u) {
    int s;
    ddp__mutex_lock(&ctx->z3.lock);
    s = ctx->z3.units[u].state;
    ddp__mutex_unlock(&ctx->z3.lock);
    return s;
}

/* The first unit not released (-1: none). */
static int ddp__z3_any_gathered(ddp_context *ctx) {
    int u;
    for (u = 0; ddp__z3(ctx) && u < ctx->z3.num_units; u++) if (ddp__z3_state(ctx, u) != DDP__Z3_RELEASED) return u;
    return -1;
}

/* Pages of this rank's owner storage outside its parts hold nothing anyone reads (the commit's
   broadcast filled them): given back (ddp__pages_punch; where it cannot, they stay: more memory,
   the same results). Pages counted on the machine's grid, and only those wholly inside the
   storage: the MPI backend's is a 64-byte aligned heap block whose neighbours share its end pages. */
static void ddp__z3_drop_unowned(ddp_context *ctx) {
    size_t page = ctx->z3.page, es = ctx->z3.es, bytes = ctx->flat.count * es, lo, hi, p, q, np;
    unsigned char *own = ddp__z3_own(ctx), *base = own - (uintptr_t)own % page, *keep;
    int b;
    np = ((size_t)(own - base) + bytes + page - 1) / page;
    if (!(keep = (unsigned char *)ddp__calloc(np ? np : 1))) return;   /* nothing given back: more memory, the same results */
    if (np) { keep[0] = own != base; keep[np - 1] |= (size_t)(own + bytes - base) % page != 0; }   /* shared with a neighbour */
    for (b = 0; b < ctx->model.num_buckets; b++) {
        ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
        if (hi > lo)
            for (p = (size_t)(own + lo * es - base) / page; p < ((size_t)(own + hi * es - base) + page - 1) / page; p++) keep[p] = 1;
    }
    for (p = 0; p < np; p = q) {
        if (keep[p]) { q = p + 1; continue; }
        for (q = p; q < np && !keep[q]; q++) {}
        (void)ddp__pages_punch(base + p * page, (q - p) * page);
    }
    DDP_FREE(keep);
}

/* check_ready (a debugging run, one rank): a touch of a released page is named before the
   process dies of it. The handler may run at any moment: it only reads what commit fixed (the
   view, the units' ranges, the parameters' offsets and names) and writes with write(2). */
static ddp_context *ddp__z3_fault_ctx;
static void ddp__z3_fault(void *addr) {
    ddp_context *ctx = ddp__z3_fault_ctx;
    const unsigned char *a = (const unsigned char *)addr;
    size_t at;
    int u, i;
    if (!ctx || a < ctx->z3.view || a >= ctx->z3.view + ctx->z3.view_bytes) return;
    at = (size_t)(a - ctx->z3.view) / ctx->z3.es;
    for (u = 0; u < ctx->z3.num_units && !(at >= ctx->z3.units[u].lo && at < ctx->z3.units[u].hi); u++) {}
    for (i = ctx->model.num_params - 1; i > 0 && ctx->model.params[i].offset > at; i--) {}
    ddp__write_stderr("ddp rank 0 error: DDP_CHECK_READY: the program touched parameter '");
    ddp__write_stderr(ctx->model.params[i].name);
    ddp__write_stderr("' of unit '");
    ddp__write_stderr(u < ctx->z3.num_units ? ctx->z3.units[u].name : "?");
    ddp__write_stderr("', which is released (DDP_SHARD_PARAMETERS: its pages are gone until ddp_unit_gather); the fault goes on\n");
}

/* The end of ddp_commit at PARAMETERS: units' ranges, the view reserved (every unit released),
   the owner storage trimmed to this rank's parts, the prefetch thread. */
static ddp_result ddp__z3_commit(ddp_context *ctx) {
    size_t np;
    int u, i;
    if (ctx->desc.shard != DDP_SHARD_PARAMETERS) return DDP_OK;
    ctx->z3.es = ctx->flat.params_bf16 ? sizeof(ddp_bf16) : sizeof(float);
    ctx->z3.page = ddp__vm_page();
    ctx->z3.replay_op = -1;
    ctx->z3.device = ctx->be->id == DDP_BACKEND_NCCL;
    if (ctx->world > 1 && !ctx->z3.device && !ctx->be->z3_start && !ddp__z3_source(ctx, 0))
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_commit: DDP_SHARD_PARAMETERS on the %s backend needs the parameters' "
                         "parts in its shared segment, which it does not have (DDP_STAGED_GRADS is set, or /dev/shm had no "
                         "room: see the warning above)", ctx->be->name);
    if (!(ctx->z3.unit_of = (int *)DDP_MALLOC(sizeof(int) * (size_t)ctx->model.num_params)) ||
        !(ctx->z3.queue = (int *)DDP_MALLOC(sizeof(int) * (size_t)ctx->z3.num_units)))
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for the units");
    for (u = 0; u < ctx->z3.num_units; u++) {
        ddp__z3_unit *k = &ctx->z3.units[u];
        for (i = k->first; i < k->first + k->n; i++) ctx->z3.unit_of[i] = u;
        k->lo = ctx->model.params[k->first].offset;
        k->hi = k->first + k->n < ctx->model.num_params ? ctx->model.params[k->first + k->n].offset : ctx->flat.count;
        k->state = DDP__Z3_RELEASED;
    }
#ifdef DDP_CUDA
    if (ctx->z3.device) {   /* the view is the backend's device memory: no pages here, no thread */
        ddp_result r;
        if ((r = ddp__gpu_z3_commit(ctx)) != DDP_OK) return r;
        ddp__mutex_init(&ctx->z3.lock);
        ddp__cond_init(&ctx->z3.cond);
        ctx->z3.on = 1;
        return DDP_OK;
    }
#endif
    ctx->z3.view_bytes = ddp__round_up(ctx->flat.count * ctx->z3.es, ctx->z3.page);
    np = ctx->z3.view_bytes / ctx->z3.page;
    if (!(ctx->z3.page_refs = (uint32_t *)ddp__calloc(sizeof(uint32_t) * (np ? np : 1))))
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for the units' page counts");
    if (!(ctx->z3.view = (unsigned char *)ddp__vm_reserve(ctx->z3.view_bytes)))
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "cannot reserve %zu bytes of address space for the sharded "
                         "parameters: %s", ctx->z3.view_bytes, ddp__strerror(errno));
    if (ctx->world > 1) {
        ddp_result r;
        ddp__z3_drop_unowned(ctx);
        /* a peer may still be writing its parts (the commit's broadcast, the rounding): no gather before all are done */
        ctx->what = "ddp_commit's barrier (sharded parameters: every rank's parts in place before any gather)";
        if ((r = ctx->be->collective(ctx, DDP__KIND_BARRIER, NULL, 0, 0)) != DDP_OK) return r;
    }
    ddp__mutex_init(&ctx->z3.lock);
    ddp__cond_init(&ctx->z3.cond);
    /* prefetch off, or the backend's exchange (MPI: started on the program's thread): no thread (nor its stack) at all */
    if (!ctx->desc.shard_prefetch_off && !(ctx->be->z3_start && ctx->world > 1) &&
        ddp__thread_create(&ctx->z3.thread, ddp__z3_main, ctx) != 0) {
        ddp__cond_destroy(&ctx->z3.cond);
        ddp__mutex_destroy(&ctx->z3.lock);
        return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot start the prefetch thread of the sharded parameters (with "
                         "DDP_SHARD_PREFETCH=off there is none)");
    }
    ctx->z3.threaded = !ctx->desc.shard_prefetch_off && !(ctx->be->z3_start && ctx->world > 1);
    ctx->z3.started = 1;
    ctx->z3.on = 1;
    if (ctx->desc.check_ready && !ddp__z3_fault_ctx) { ddp__z3_fault_ctx = ctx; ddp__fault_hook(ddp__z3_fault); }
    return DDP_OK;
}

/* Shutdown (before the backend's teardown: the thread reads the peers' parts). */
static void ddp__z3_free(ddp_context *ctx) {
    int u, pending = 0;
    /* MPI: a prefetch never waited for still writes into the view: completed first (after a failure
       it may never complete: the view's address range is then left reserved, not handed back) */
    for (u = 0; ctx->z3.on && ctx->be->z3_start && ctx->world > 1 && u < ctx->z3.num_units; u++)
        if (ctx->z3.units[u].state == DDP__Z3_IN_FLIGHT && (ddp__failed(ctx) || ctx->be->z3_wait(ctx, u) != DDP_OK)) pending = 1;
    if (pending) ctx->z3.view = NULL;
    if (ctx->z3.started) {
        ddp__mutex_lock(&ctx->z3.lock);
        ctx->z3.stop = 1;
        ddp__cond_broadcast(&ctx->z3.cond);
        ddp__mutex_unlock(&ctx->z3.lock);
        if (ctx->z3.threaded) ddp__thread_join(ctx->z3.thread);
        ctx->z3.threaded = 0;
        ddp__cond_destroy(&ctx->z3.cond);
        ddp__mutex_destroy(&ctx->z3.lock);
        ctx->z3.started = 0;
    } else if (ctx->z3.device && ctx->z3.on) {   /* the lock without a thread */
        ddp__cond_destroy(&ctx->z3.cond);
        ddp__mutex_destroy(&ctx->z3.lock);
    }
    if (ddp__z3_fault_ctx == ctx) { ddp__fault_hook(NULL); ddp__z3_fault_ctx = NULL; }
    if (ctx->z3.view && !ctx->z3.device) ddp__vm_release(ctx->z3.view, ctx->z3.view_bytes);   /* NCCL: the backend's */
    ctx->z3.view = NULL;
    ctx->z3.on = 0;
    DDP_FREE(ctx->z3.page_refs);
    DDP_FREE(ctx->z3.unit_of);
    DDP_FREE(ctx->z3.queue);
    DDP_FREE(ctx->z3.units);
    ctx->z3.page_refs = NULL; ctx->z3.unit_of = NULL; ctx->z3.queue = NULL; ctx->z3.units = NULL;
    ctx->z3.num_units = 0;
}

/* The tape's backward (ddp__backward): which op last needs each unit, then around op i the
   units it lists gathered, the next ops' prefetched, and those it was the last to need released. */
static void ddp__z3_plan_backward(ddp_context *ctx) {
    int i, j, id, u;
    for (u = 0; u < ctx->z3.num_units; u++) ctx->z3.units[u].last_op = -1;
    for (i = 0; i < ctx->tape.len; i++) {
        const ddp__tape_op *o = &ctx->tape.ops[i];
        for (j = 0; j < o->num_ids; j++) {
            memcpy(&id, ctx->tape.arena + o->ids_offset + sizeof(int) * (size_t)j, sizeof id);
            u = ctx->z3.unit_of[id];
            if (ctx->z3.units[u].last_op < 0) ctx->z3.units[u].last_op = i;
        }
    }
}

#define DDP__Z3_LOOKAHEAD 8   /* tape ops the prefetch looks past for the next one that lists parameters */
static ddp_result ddp__z3_before_op(ddp_context *ctx, int i) {
    const ddp__tape_op *o = &ctx->tape.ops[i];
    ddp_result r = DDP_OK;
    int j, k, id;
    for (j = 0; j < o->num_ids && r == DDP_OK; j++) {
        memcpy(&id, ctx->tape.arena + o->ids_offset + sizeof(int) * (size_t)j, sizeof id);
        r = ddp__z3_gather(ctx, ctx->z3.unit_of[id]);
    }
    for (k = i - 1; k >= 0 && k >= i - DDP__Z3_LOOKAHEAD && r == DDP_OK && !ctx->desc.shard_prefetch_off; k--) {   /* the next op with parameters */
        const ddp__tape_op *n = &ctx->tape.ops[k];
        for (j = 0; j < n->num_ids && r == DDP_OK; j++) {
            memcpy(&id, ctx->tape.arena + n->ids_offset + sizeof(int) * (size_t)j, sizeof id);
            r = ddp__z3_prefetch(ctx, ctx->z3.unit_of[id]);
        }
        if (n->num_ids) break;
    }
    if (r == DDP_OK) ctx->z3.replay_op = i;
    return r;
}

static ddp_result ddp__z3_after_op(ddp_context *ctx, int i) {
    const ddp__tape_op *o = &ctx->tape.ops[i];
    ddp_result r = DDP_OK;
    int j, id, u;
    ctx->z3.replay_op = -1;
    for (j = 0; j < o->num_ids && r == DDP_OK; j++) {
        memcpy(&id, ctx->tape.arena + o->ids_offset + sizeof(int) * (size_t)j, sizeof id);
        u = ctx->z3.unit_of[id];
        if (ctx->z3.units[u].last_op == i) r = ddp__z3_release(ctx, u, 1);
    }
    return r;
}

/* ddp_tape_record in the forward: the parameters an op lists are gathered (their values behind
   ddp_param are what the op read). */
static ddp_result ddp__z3_check_record(ddp_context *ctx, const int *ids, int n) {
    int j, u;
    if (!ddp__z3(ctx) || ctx->tape.replaying) return DDP_OK;
    for (j = 0; j < n; j++) {
        u = ctx->z3.unit_of[ids[j]];
        if (ddp__z3_state(ctx, u) != DDP__Z3_GATHERED)
            return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_tape_record: parameter '%s' is in unit '%s', which is not "
                             "gathered (released, or prefetched and not waited for): its memory holds no values; call "
                             "ddp_unit_gather(ddp, %d) before the op's forward", ctx->model.params[ids[j]].name,
                             ctx->z3.units[u].name, u);
    }
    return DDP_OK;
}

/* ddp_adamw_step at PARAMETERS: every unit released (its values would be stale after the step). */
static ddp_result ddp__z3_check_step(ddp_context *ctx, const char *call) {
    int u = ddp__z3_any_gathered(ctx);
#ifdef DDP_CUDA
    if (u < 0 && ctx->z3.device) return ddp__gpu_z3_drain(ctx, 1);   /* the step: every released unit's memory back */
#endif
    if (u < 0) return DDP_OK;
    return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "%s: unit '%s' is still gathered (a gather without a release): release "
                     "every unit first (ddp_unit_release; the tape's backward releases the units its ops list), or its "
                     "gathered parameters would keep the values from before; nothing was changed", call, ctx->z3.units[u].name);
}

/* The layout (parameters on 16-float boundaries), the backend's flat buffers, the buckets, the
   check that every rank registered the same, then the backend's own commit. */
static ddp_result ddp__commit(ddp_context *ctx) {
    size_t offset = 0;
    ddp_result r;
    int i;
    if (ddp__is_committed(ctx)) return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_commit called twice");
    if (ctx->model.num_params == 0) return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_commit with no parameters registered");
    if ((r = ddp__z3_check_units(ctx)) != DDP_OK) return r;
    for (i = 0; i < ctx->model.num_params; i++) {
        ctx->model.params[i].offset = offset;
        offset += ddp__round_up(ctx->model.params[i].count, DDP__ALIGN_FLOATS);
    }
    ctx->flat.count = offset;
    if ((r = ctx->be->alloc_flat(ctx)) != DDP_OK) return r;
    if ((r = ddp__build_buckets(ctx)) != DDP_OK) return r;
    if ((r = ddp__shard_layout(ctx)) != DDP_OK) return r;
    if (ddp__z2_acc_on(ctx) && ctx->be->shards_grads == 1 &&   /* (NCCL: a device one, ddp__gpu_z2_commit) */
        !(ctx->shard.z2_acc = ddp__alloc_floats(ctx->shard.count ? ctx->shard.count : 1)))
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for the gradients' accumulator (%zu floats, shard_accumulate)",
                         ctx->shard.count);
    ddp__plan_wire(ctx);
    if (ctx->world > 1 && (r = ddp__verify_layout(ctx)) != DDP_OK) return ddp__fatal(ctx, r);
    if (ctx->be->commit && (r = ctx->be->commit(ctx)) != DDP_OK) return r;
    /* the working copies: rank 0's initial values, rounded; the gradients start at zero (alloc_flat);
       ZeRO-3's seeded commit (ddp__cpu_z3_seed_bf16) made both of its parts already */
    if (!ctx->z3.seeded && (r = ddp__bf16_op(ctx, DDP__BF16_ROUND_PARAMS, 0, ctx->flat.count)) != DDP_OK) return r;
    /* sharded: from here on this rank holds the master of its parts only */
    if (!ctx->z3.seeded && ddp__master_parts(ctx) && (r = ddp__bf16_op(ctx, DDP__BF16_SHARD_MASTER, 0, ctx->flat.count)) != DDP_OK)
        return ddp__fatal(ctx, r);
    /* sharded parameters: the flat buffer the program sees becomes the view, every unit released */
    if ((r = ddp__z3_commit(ctx)) != DDP_OK) return ddp__fatal(ctx, r);
    if (ctx->desc.check_ready && (r = ddp__ready_check_alloc(ctx)) != DDP_OK) return r;
    ddp__life_event(ctx, DDP__ON_COMMIT);
    ddp__log_plan(ctx);
    return DDP_OK;
}

/* --------------------------------------------------------------------------------------------
   >>step  The step: ready hooks, the tape, finish
   -------------------------------------------------------------------------------------------- */
/* Launch every bucket that is complete and whose predecessors are launched, in bucket order
   (the same on every rank). The NCCL backend launches even alone (a communicator of one), so
   one GPU runs the path many GPUs run. */
static ddp_result ddp__launch_ready(ddp_context *ctx) {
    ddp_result r = DDP_OK;
    if (!ctx->step.sync && !ddp__z2_acc_on(ctx)) return DDP_OK;   /* ZeRO-2's shard_accumulate: every micro-step */
    while (r == DDP_OK && ctx->step.next_launch < ctx->model.num_buckets && ctx->model.buckets[ctx->step.next_launch].pending == 0) {
        r = ctx->be->launch(ctx, ctx->step.next_launch++);
    }
    return r;
}

/* Uneven inputs (>>join): every rank says what it brings to this step (a sum of one-hot rows):
   1, a step of its own (data, and an AdamW step after); 2, only the gradients it accumulated
   before it joined (no step); 0, zeros. The ranks that bring gradients (the divisor of
   DIVIDE_BY_ACTIVE) and the lowest rank that steps are kept for the step and for ddp_join;
   *stepping (may be NULL) gets how many ranks step. */
static ddp_result ddp__join_count(ddp_context *ctx, int has_data, int *stepping) {
    int s, n = 0, steps = 0, first = -1;
    ddp_result r;
    if (!ctx->join.mask && !(ctx->join.mask = (float *)ddp__calloc(sizeof(float) * (size_t)ctx->world)))
        return ddp__fail_group(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for the uneven-inputs count");
    for (s = 0; s < ctx->world; s++) ctx->join.mask[s] = 0;
    ctx->join.mask[ctx->rank] = (float)has_data;
    ctx->what = "the count of the ranks with data (uneven inputs)";
    if ((r = ctx->be->collective(ctx, DDP__KIND_JOIN, ctx->join.mask, (size_t)ctx->world, 0)) != DDP_OK) return r;
    for (s = 0; s < ctx->world; s++) {
        if (ctx->join.mask[s] != 0) n++;
        if (ctx->join.mask[s] == 1.0f) { steps++; if (first < 0) first = s; }
    }
    ctx->join.active = n;
    ctx->join.step_uneven = steps > 0 && steps < ctx->world;
    if (ctx->join.step_uneven) { ctx->join.uneven = 1; ctx->join.root = first; }
    if (stepping) *stepping = steps;
    return DDP_OK;
}

static ddp_result ddp__begin_step(ddp_context *ctx) {
    int i;
    if (ddp__in_backward(ctx)) return DDP_OK;
    /* uneven inputs: a synchronizing step first counts the ranks with data (ddp_join's shadow
       step has counted already); nothing of this step is in flight yet */
    if (ctx->desc.uneven_inputs && ctx->world > 1 && ctx->step.sync && !ctx->join.shadow) {
        ddp_result r = ddp__join_count(ctx, 1, NULL);
        if (r != DDP_OK) return r;
    }
    ddp__life_event(ctx, DDP__ON_BACKWARD);
    ctx->step.ready_moment = 0;
    ctx->step.first_launch_moment = -1;
    ctx->step.start = ddp__now();
    memset(&ctx->step.stats, 0, sizeof ctx->step.stats);
    ctx->step.stats.slowest_rank = -1;   /* unknown unless the backend tells (ddp__straggle_fold) */
    for (i = 0; i < ctx->model.num_buckets; i++)
        ctx->model.buckets[i].pending = ctx->model.buckets[i].last_param - ctx->model.buckets[i].first_param + 1;
    ctx->step.next_launch = 0;
    if (ctx->be->begin_step) ctx->be->begin_step(ctx);
    return ddp__failed(ctx);   /* (NCCL ZeRO-2: the gradients could not be mapped again) */
}

/* check_ready: copy a gradient as it is marked ready (take = 1), or say whether it is still
   that (take = 0; nonzero: it changed). */
static int ddp__ready_check(ddp_context *ctx, ddp__param *p, int take) {
    size_t elem = ddp__bf16_params(ctx) ? sizeof(ddp_bf16) : sizeof(float);
    const unsigned char *grad = ddp__bf16_params(ctx) ? (const unsigned char *)ctx->flat.grads_bf16
                                                                        : (const unsigned char *)ctx->flat.grads;
    unsigned char *copy = ctx->step.ready_copy + elem * p->offset;
    grad += elem * p->offset;
    p->ready_copied = take;
    if (take) memcpy(copy, grad, elem * p->count);
    return take ? 0 : memcmp(copy, grad, elem * p->count);
}

/* At ddp_finish: a gradient written after it was marked ready names the parameter. */
static ddp_result ddp__ready_check_all(ddp_context *ctx) {
    const ddp__param *changed = NULL;
    int i;
    for (i = 0; i < ctx->model.num_params; i++) {
        ddp__param *p = &ctx->model.params[i];
        if (p->ready_copied && ddp__ready_check(ctx, p, 0) && !changed) changed = p;
    }
    if (changed && ctx->tape.replaying)
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "check_ready: the gradient of '%s' changed after it was marked "
                         "ready (an op replayed later wrote it). List a parameter on the FIRST op recorded that uses "
                         "it (its backward runs last); with several ranks its bucket would have been averaged before "
                         "that write", changed->name);
    if (changed)   /* the program's own backward: no tape, no ops */
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "check_ready: the gradient of '%s' changed after ddp_grad_ready "
                         "marked it ready: call ddp_grad_ready for a parameter only once your backward has finished "
                         "writing its gradient (every use of the parameter added in); with several ranks its bucket "
                         "would have been averaged before that write", changed->name);
    return DDP_OK;
}

static ddp_result ddp__grad_ready(ddp_context *ctx, int id) {
    ddp__param *p;
    ddp_result r;
    if (id < 0 || id >= ctx->model.num_params)
        return ddp__fail_group(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_grad_ready: no parameter has id %d", id);
    if ((r = ddp__begin_step(ctx)) != DDP_OK) return r;
    p = &ctx->model.params[id];
    if (!ctx->tape.replaying) ctx->step.ready_moment++;   /* the tape counts its ops instead */
    if (p->ready && ctx->tape.replaying)
        return ddp__fail_group(ctx, DDP_ERR_DOUBLE_READY, "the gradient of '%s' was marked ready twice in "
                               "one backward (list a parameter only with the op whose backward finishes it; or the "
                               "tape holds two forwards: one whose ddp_backward never ran, which ddp_tape_reset drops)",
                               p->name);
    if (p->ready)
        return ddp__fail_group(ctx, DDP_ERR_DOUBLE_READY, "ddp_grad_ready('%s') was called twice in one backward: call "
                               "it once a step for each parameter, when its gradient is final (then ddp_finish ends "
                               "the backward)", p->name);
    p->ready = 1;
    p->touched = 1;
    if (ctx->step.ready_copy) ddp__ready_check(ctx, p, 1);
    if (--ctx->model.buckets[p->bucket].pending == 0) {
        if (ctx->tl.main) { double t = ddp__now(); ddp__record(ctx, ctx->tl.main, DDP__EV_READY, t, t, p->bucket, 0); }
        r = ddp__launch_ready(ctx);
        if (ctx->step.first_launch_moment < 0 && ctx->step.next_launch > 0) {
            ctx->step.first_launch_moment = ctx->step.ready_moment;
            ctx->step.first_launch_time = ddp__now();
        }
        return r;
    }
    return DDP_OK;
}

/* Parameters without a gradient in a synchronizing backward: an error naming them, or (with
   find_unused) a zero gradient unless an earlier accumulation micro-step gave them one. */
static ddp_result ddp__handle_unused(ddp_context *ctx) {
    char names[512];
    size_t len = 0;
    int i, unused = 0;
    names[0] = 0;
    for (i = 0; i < ctx->model.num_params; i++) {
        ddp__param *p = &ctx->model.params[i];
        if (p->ready) continue;
        if (ctx->desc.find_unused) {
            if (!p->touched) {
                ddp_result r = ddp__zero_grads(ctx, p->offset, p->count);
                if (r != DDP_OK) return r;
            }
            p->ready = 1;
            ctx->model.buckets[p->bucket].pending--;
            continue;
        }
        if (unused++ < 8 && len + DDP__NAME_MAX + 8 < sizeof names)
            len += (size_t)snprintf(names + len, sizeof names - len, "%s'%s'", len ? ", " : "", p->name);
    }
    if (unused > 8) snprintf(names + len, sizeof names - len, " and %d more", unused - 8);
    if (unused && ctx->tape.replaying)
        return ddp__fail_group(ctx, DDP_ERR_UNUSED_PARAMETER, "%d parameter(s) got no gradient in this "
                                         "backward: %s (no op recorded on the tape listed them; set find_unused in "
                                         "ddp_desc if that is intended)", unused, names);
    if (unused)   /* the program's own backward */
        return ddp__fail_group(ctx, DDP_ERR_UNUSED_PARAMETER, "%d parameter(s) were never marked ready "
                               "(ddp_grad_ready) in this backward: %s. Every parameter must be marked ready every "
                               "step, once its gradient is final (set find_unused in ddp_desc if some legitimately "
                               "get no gradient)", unused, names);
    return DDP_OK;
}

static void ddp__end_step(ddp_context *ctx) {
    int i;
    for (i = 0; i < ctx->model.num_params; i++) ctx->model.params[i].ready = 0;
    ddp__life_event(ctx, DDP__ON_FINISH);
    ctx->tape.replaying = 0;
    ctx->tl.step++;
    ctx->step.stats.step = ctx->tl.step;
    /* NCCL: a synchronizing step's times arrive later, from its events (be->stats) */
    if (!ctx->be->stats_later || !ctx->step.sync) ctx->step.last_stats = ctx->step.stats;
    ddp__progress_step(ctx);
}

/* A synchronizing backward whose first bucket was complete only at its last moment (the last
   tape op, or the last ddp_grad_ready call) overlapped no communication: say so once, with the
   usual causes. ddp.h cannot see the backward's compute, so "moment" is what it can count. Ready
   calls made back to back count as several moments: without a tape, a first bucket complete
   under 2% of the step (the time since the last ddp_finish, 1 ms or more) before this
   ddp_finish is said too, as measured. */
static void ddp__overlap_check(ddp_context *ctx) {
    double now, window, cycle;
    if (ctx->step.overlap_warned || ctx->join.shadow || ctx->world < 2 || ctx->model.num_buckets < 2 || ctx->step.ready_moment < 2) return;
    if (ctx->step.first_launch_moment >= 0 && ctx->step.first_launch_moment < ctx->step.ready_moment) {
        if (ctx->tape.replaying || ctx->embed.last_finish <= 0) return;
        now = ddp__now();
        window = now - ctx->step.first_launch_time;
        cycle = now - ctx->embed.last_finish;
        if (cycle < 1e-3 || window >= 0.02 * cycle) return;
        ctx->step.overlap_warned = 1;
        if (ctx->rank == 0)
            ddp__log(ctx, DDP_LOG_WARN, "the first gradient bucket was complete only %.3f ms before ddp_finish, in a "
                     "step of %.1f ms since the last ddp_finish (step %lld): almost no communication overlapped the "
                     "backward. Were the ddp_grad_ready calls made back to back after the backward? Call each as soon "
                     "as your backward has finished that gradient, the parameters registered last first (README.md, "
                     "\"Your own autograd\")", 1e3 * window, 1e3 * cycle, (long long)ctx->tl.step + 1);
        return;
    }
    ctx->step.overlap_warned = 1;
    if (ctx->rank != 0) return;   /* the ranks run the same program: one says it */
    ddp__log(ctx, DDP_LOG_WARN, "no gradient bucket was complete before the backward's last %s (step %lld): all %d "
             "buckets (%.2f MiB) were averaged after it, none while it ran. Buckets complete in reverse registration "
             "order (bucket 0 holds the last parameters registered): %s. A tensor that stacks every layer (all layers' "
             "weights of one kind in one parameter) is final only when the backward ends: register one slice per layer "
             "instead (README.md, \"Memory layout and overlap\"). DDP_LOG=info prints the bucket plan",
             ctx->tape.replaying ? "op" : "ddp_grad_ready call", (long long)ctx->tl.step + 1, ctx->model.num_buckets,
             (double)ctx->flat.count * sizeof(float) / 1048576.0,
             ctx->tape.replaying ? "the op replayed first (recorded last) should list the parameters registered last"
                            : "call ddp_grad_ready as soon as a gradient is final, the parameters registered last "
                              "first (register them in the order the forward uses them)");
}

static ddp_result ddp__finish(ddp_context *ctx) {
    ddp_result r;
    double t_wait;
    if ((r = ddp__begin_step(ctx)) != DDP_OK) return r;
    t_wait = ddp__now();
    ctx->step.stats.backward_ms = 1e3 * (t_wait - ctx->step.start);
    if (ctx->step.sync || ddp__z2_acc_on(ctx)) {   /* ZeRO-2's shard_accumulate: every micro-step reduce-scatters */
        ddp__overlap_check(ctx);
        if ((r = ddp__handle_unused(ctx)) != DDP_OK) return r;
        if ((r = ddp__launch_ready(ctx)) != DDP_OK) return r;
        r = ctx->be->finish(ctx, t_wait);
        if (ddp__z2_acc_on(ctx)) ctx->shard.z2_acc_steps = ctx->step.sync ? 0 : ctx->shard.z2_acc_steps + 1;
        /* uneven inputs, divided by the ranks with data: the buckets divided by the world size */
        if (r == DDP_OK && ctx->desc.uneven_inputs == DDP_JOIN_DIVIDE_BY_ACTIVE && ctx->join.active > 0 &&
            ctx->join.active < ctx->world)
            r = ctx->be->scale(ctx, 0, ctx->flat.count, (float)((double)ctx->world / ctx->join.active));
    }
    ctx->join.pending = !ctx->step.sync;   /* a micro-step's gradients wait for the sync (>>join) */
    if (r == DDP_OK && ctx->step.ready_copy) r = ddp__ready_check_all(ctx);   /* one rank: the average left them as they were */
    if (r == DDP_OK && ctx->step.sync) ddp__life_event(ctx, DDP__ON_AVERAGED);
    ddp__end_step(ctx);
    return r;
}

static ddp_result ddp__tape_record(ddp_context *ctx, ddp_backward_fn backward, const void *args,
                                   size_t args_size, const int *param_ids, int num_param_ids) {
    size_t args_at, ids_at, need;
    ddp__tape_op *op;
    int i;
    if (!backward || (args_size && !args) || num_param_ids < 0 || (num_param_ids && !param_ids))
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_tape_record: needs a backward function, and args/ids "
                         "pointers when their sizes are non-zero");
    if (args_size > ((size_t)1 << 40))   /* and no size below wraps */
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_tape_record: args_size %zu is not the size of an "
                         "argument struct (at most 2^40 bytes)", args_size);
    for (i = 0; i < num_param_ids; i++)
        if (param_ids[i] < 0 || param_ids[i] >= ctx->model.num_params)
            return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_tape_record: no parameter has id %d", param_ids[i]);
    if (ddp__z3(ctx) && ddp__z3_check_record(ctx, param_ids, num_param_ids) != DDP_OK) return DDP_ERR_INVALID_STATE;
    args_at = ddp__round_up(ctx->tape.arena_len, 16);
    ids_at = ddp__round_up(args_at + args_size, sizeof(int));
    need = ids_at + sizeof(int) * (size_t)num_param_ids;
    if (need > ctx->tape.arena_cap) {
        size_t cap = ctx->tape.arena_cap ? ctx->tape.arena_cap : 4096;
        unsigned char *grown;
        while (cap < need) cap *= 2;
        if (!(grown = (unsigned char *)DDP_MALLOC(cap))) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory growing the tape");
        if (ctx->tape.arena_len) memcpy(grown, ctx->tape.arena, ctx->tape.arena_len);
        DDP_FREE(ctx->tape.arena);
        ctx->tape.arena = grown;
        ctx->tape.arena_cap = cap;
    }
    if (ctx->tape.len == ctx->tape.cap) {
        int cap = ctx->tape.cap ? 2 * ctx->tape.cap : 64;
        ddp__tape_op *grown = (ddp__tape_op *)DDP_MALLOC(sizeof(ddp__tape_op) * (size_t)cap);
        if (!grown) return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory growing the tape");
        if (ctx->tape.len) memcpy(grown, ctx->tape.ops, sizeof(ddp__tape_op) * (size_t)ctx->tape.len);
        DDP_FREE(ctx->tape.ops);
        ctx->tape.ops = grown;
        ctx->tape.cap = cap;
    }
    if (ctx->tl.main && ctx->tape.len == 0) ctx->tl.forward_start = ddp__now();
    if (args_size) memcpy(ctx->tape.arena + args_at, args, args_size);
    if (num_param_ids) memcpy(ctx->tape.arena + ids_at, param_ids, sizeof(int) * (size_t)num_param_ids);
    ctx->tape.arena_len = need;
    op = &ctx->tape.ops[ctx->tape.len++];
    op->fn = backward;
    op->args_offset = args_at;
    op->ids_offset = ids_at;
    op->num_ids = num_param_ids;
    return DDP_OK;
}

static void ddp__tape_reset(ddp_context *ctx) { ctx->tape.len = 0; ctx->tape.arena_len = 0; ddp__life_event(ctx, DDP__ON_TAPE_RESET); }

/* A backward op's event names the parameters it finishes (the first few; they are registered
   in order in the common case of one layer per op). */
static void ddp__tl_record_op(ddp_context *ctx, const ddp__tape_op *op, int index, double t0) {
    ddp__timeline *tl = ctx->tl.main;
    size_t before = tl->len;
    ddp__record(ctx, tl, DDP__EV_BACKWARD_OP, t0, ddp__now(), index, 0);
    if (tl->len > before && op->num_ids > 0) {
        int first;
        memcpy(&first, ctx->tape.arena + op->ids_offset, sizeof first);
        tl->ev[tl->len - 1].first_param = first;
        tl->ev[tl->len - 1].num_params = first + op->num_ids <= ctx->model.num_params ? op->num_ids : 1;
    }
}

static ddp_result ddp__backward(ddp_context *ctx) {
    ddp_result r = DDP_OK;
    int i, k;
    if (ctx->tape.failed) {   /* a replay without that op would be a wrong gradient, every call "ok" */
        ddp__tape_reset(ctx);
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_backward: a ddp_tape_record of this forward failed (its "
                         "error was returned then), so the tape lacks that op's backward; the tape is dropped: fix "
                         "the record, then run the forward again");
    }
    if (ctx->tape.len == 0 && !ddp__in_backward(ctx))
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_backward: the tape is empty: nothing was recorded since the "
                         "last ddp_backward (called twice for one forward?); record each op's backward with "
                         "ddp_tape_record, or use ddp_grad_ready and ddp_finish");
    if ((r = ddp__begin_step(ctx)) != DDP_OK) { ddp__tape_reset(ctx); return r; }
    ctx->tape.replaying = 1;
    if (ctx->tl.main && ctx->tape.len && ctx->tl.forward_start != 0)
        ddp__record(ctx, ctx->tl.main, DDP__EV_FORWARD, ctx->tl.forward_start, ctx->step.start, -1, 0);
    if (ddp__z3(ctx)) ddp__z3_plan_backward(ctx);
    for (i = ctx->tape.len - 1; i >= 0 && r == DDP_OK; i--) {
        const ddp__tape_op *op = &ctx->tape.ops[i];
        int ids[64];
        int n = op->num_ids;
        double t0 = ctx->tl.main ? ddp__now() : 0;
        if (ddp__z3(ctx) && (r = ddp__z3_before_op(ctx, i)) != DDP_OK) break;   /* its units gathered, the next prefetched */
        op->fn(ctx->tape.arena + op->args_offset);
        if (ddp__z3(ctx) && (r = ddp__z3_after_op(ctx, i)) != DDP_OK) break;    /* the units it needed last released */
        ctx->step.ready_moment++;
        if (ctx->tl.main) ddp__tl_record_op(ctx, op, i, t0);
        for (k = 0; k < n && r == DDP_OK; k += 64) {
            int j, m = n - k < 64 ? n - k : 64;
            memcpy(ids, ctx->tape.arena + op->ids_offset + sizeof(int) * (size_t)k, sizeof(int) * (size_t)m);
            for (j = 0; j < m && r == DDP_OK; j++) r = ddp__grad_ready(ctx, ids[j]);
        }
    }
    ddp__tape_reset(ctx);
    return r == DDP_OK ? ddp__finish(ctx) : r;
}

/* ZeRO-2's ddp_zero_grad: this rank's parts zeroed in place (their pages are written every step:
   giving them back would cost a fault a page in the next backward), the rest released (after a
   synchronizing step it is released already, and punching an empty range costs a system call;
   after micro-steps with sync off it holds this rank's accumulated gradients). */
static void ddp__z2_zero(ddp_context *ctx) {
    size_t lo, hi, es = ctx->flat.grads_bf16 ? sizeof(ddp_bf16) : sizeof(float);
    unsigned char *base = ctx->flat.grads_bf16 ? (unsigned char *)ctx->flat.grads_bf16 : (unsigned char *)ctx->flat.grads;
    int b;
    for (b = 0; b < ctx->model.num_buckets; b++) {
        ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
        memset(base + lo * es, 0, (hi - lo) * es);
        ddp__z2_release(ctx, b);
    }
}

static ddp_result ddp__zero_grad(ddp_context *ctx) {
    ddp_result r;
    int i;
    if (ddp__in_backward(ctx)) return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_zero_grad while a backward is in flight");
    if (ddp__z2(ctx) && ctx->be->shards_grads == 1) ddp__z2_zero(ctx);   /* host memory (CPU, MPI): no memset that would bring the released pages back */
    else if ((r = ddp__zero_grads(ctx, 0, ctx->flat.count)) != DDP_OK) return r;
    ctx->shard.z2_acc_steps = 0;           /* shard_accumulate: the accumulator holds nothing */
    for (i = 0; i < ctx->model.num_params; i++) ctx->model.params[i].touched = 0;
    ctx->join.pending = 0;
    return DDP_OK;
}

/* --------------------------------------------------------------------------------------------
   >>adamw  AdamW: the hyperparameters resolved and checked, then one fused pass over the flat
   buffers by the backend (host: >>host, ddp__host_adamw; NCCL: ddp_kernels.cuh).
   -------------------------------------------------------------------------------------------- */
/* A step takes averaged gradients: a ddp_finish with sync on since the last step, at every world
   size (so that a program tried on one rank finds the mistake before it costs a multi-rank run).
   Without it the ranks would step on their own gradients and drift apart, every call "ok". */
static ddp_result ddp__check_averaged(ddp_context *ctx, const char *call) {
    if (ctx->join.pending)
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "%s after a backward with gradient sync off "
                         "(ddp_set_sync(ddp, 0)): these gradients are this rank's alone; turn sync on "
                         "(ddp_set_sync(ddp, 1)) before the last micro-batch's backward", call);
    if (!ctx->step.grads_averaged)
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "%s with no ddp_backward or ddp_finish since the "
                         "last step (or since ddp_commit): the gradients were never averaged across ranks; run the "
                         "backward (ddp_backward, or ddp_grad_ready for each parameter and ddp_finish) first", call);
    return DDP_OK;
}

/* The program's own optimizer keeps the guard ddp_adamw_step has: its step takes averaged
   gradients, each average once. Sharded, only this rank's part was averaged: refused. */
static ddp_result ddp__consume_grads(ddp_context *ctx) {
    ddp_result r;
    if (ddp__in_backward(ctx))
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_consume_grads while a backward is in flight (call ddp_finish first)");
    /* Refused at every world size (one rank included), so a program tried on one rank meets it. */
    if (ctx->desc.shard_optimizer)
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_consume_grads with shard_optimizer%s: with several ranks "
                         "only this rank's part of each bucket holds the average, so the program's own optimizer cannot "
                         "step on ddp_flat_grads; use ddp_adamw_step, or turn shard_optimizer off",
                         ddp__env_set("DDP_SHARD_OPTIMIZER") ? " (from DDP_SHARD_OPTIMIZER, which wins over the program's "
                         "setting)" : "");
    if (ddp__bf16_params(ctx))
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_consume_grads with bf16 parameters%s: the fp32 master and "
                         "its bf16 working copies must move together, which ddp_adamw_step does; a program's own "
                         "optimizer needs fp32 parameters", ddp__env_set("DDP_PARAM_DTYPE") ? " (from DDP_PARAM_DTYPE, "
                         "which wins over the program's setting)" : "");
    if ((r = ddp__check_averaged(ctx, "ddp_consume_grads")) != DDP_OK) return r;
    ddp__life_event(ctx, DDP__ON_STEPPED);   /* the next step needs the next backward's averages */
    return DDP_OK;
}

/* The options resolved (0 -> the defaults) and checked, and the step's guards. */
static ddp_result ddp__adamw_resolve(ddp_context *ctx, const ddp_adamw *opt, float *b1_out, float *b2_out, float *eps_out) {
    float b1, b2, eps;
    ddp_result r;
    if (!opt) return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_adamw_step needs options (a ddp_adamw)");
    if (opt->as_given != 0 && opt->as_given != 1)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_adamw.as_given is %d, not 0 or 1: %s", opt->as_given,
                         DDP__ZERO_INIT_HINT);
    /* NaN by bits first: under -ffast-math NaN != 0 may be false, and a NaN would become the default */
    if (!ddp__finite_d(opt->beta1) || !ddp__finite_d(opt->beta2) || !ddp__finite_d(opt->eps))
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_adamw: beta1=%g beta2=%g eps=%g: not finite numbers (%s)",
                         opt->beta1, opt->beta2, opt->eps, DDP__ZERO_INIT_HINT);
    b1 = opt->beta1 != 0 || opt->as_given ? opt->beta1 : 0.9f;
    b2 = opt->beta2 != 0 || opt->as_given ? opt->beta2 : 0.999f;
    eps = opt->eps != 0 || opt->as_given ? opt->eps : 1e-8f;
    if (!ddp__nonneg_d(opt->lr) || !ddp__nonneg_d(b1) || !(b1 < 1) || !ddp__nonneg_d(b2) || !(b2 < 1) ||
        !ddp__nonneg_d(eps) || !ddp__nonneg_d(opt->weight_decay) || !ddp__nonneg_d(opt->max_grad_norm) ||
        !ddp__finite_d(opt->lr) || !ddp__finite_d(eps) || !ddp__finite_d(opt->weight_decay) ||
        !ddp__finite_d(opt->max_grad_norm))
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_adamw: lr=%g beta1=%g beta2=%g eps=%g weight_decay=%g "
                         "max_grad_norm=%g out of range (lr, eps, weight_decay, max_grad_norm finite and >= 0; betas in [0, 1))",
                         opt->lr, b1, b2, eps, opt->weight_decay, opt->max_grad_norm);
    if ((r = ddp__check_averaged(ctx, "ddp_adamw_step")) != DDP_OK) return r;
    if ((r = ddp__z3_check_step(ctx, "ddp_adamw_step")) != DDP_OK) return r;
    *b1_out = b1; *b2_out = b2; *eps_out = eps;
    return DDP_OK;
}

static ddp_result ddp__join_send_options(ddp_context *ctx, const ddp_adamw *opt, int go);

static ddp_result ddp__adamw_step(ddp_context *ctx, const ddp_adamw *opt, float *grad_norm_out) {
    float b1 = 0, b2 = 0, eps = 0;
    double t0;
    ddp_result r;
    if (ddp__in_backward(ctx))
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_adamw_step while a backward is in flight (call ddp_finish first)");
    r = ddp__adamw_resolve(ctx, opt, &b1, &b2, &eps);
    /* uneven inputs, sharded: the joined ranks wait in ddp_join for these options (>>join), also
       when this call fails (then they are told to fail too, instead of waiting) */
    if (ctx->join.step_uneven && ddp__sharded(ctx)) {
        ddp_result s;
        ctx->join.step_uneven = 0;
        s = ddp__join_send_options(ctx, opt, r == DDP_OK);
        if (r == DDP_OK) r = s;
    }
    if (r != DDP_OK) return r;
    t0 = ddp__now();
    ddp__life_event(ctx, DDP__ON_STEPPED);   /* the next step needs the next backward's averages */
    r = ctx->be->adamw(ctx, opt, b1, b2, eps, grad_norm_out);
    /* bf16 parameters: the backend's pass wrote the working copies of this rank's part; sharded,
       the other parts arrived as working copies (the all-gather of bf16) */
    if (r == DDP_OK && ctx->flat.bf16_diverged) {   /* the step is taken alike everywhere; the working copies agree again */
        uint64_t n = ctx->flat.bf16_diverged;
        int p = ctx->flat.bf16_diverged_param;
        ctx->flat.bf16_diverged = 0;
        ctx->flat.bf16_diverged_param = -1;
        r = ddp__fail(ctx, DDP_ERR_INVALID_STATE, "%llu element(s) of the bf16 working copies%s%s%s were not the fp32 master "
                      "rounded when an optimizer step reached them: the program wrote the working copy (ddp_param_bf16) or "
                      "the master (ddp_flat_params) without the other (a write of the working copy alone is lost; one of the "
                      "master alone reached the forward a step late). Write parameters with ddp_copy_from_host / "
                      "ddp_scatter_from_host, which update both", (unsigned long long)n,
                      p >= 0 ? " (the first in '" : "", p >= 0 ? ctx->model.params[p].name : "", p >= 0 ? "')" : "");
    }
    ddp__record(ctx, ctx->tl.main, DDP__EV_ADAMW, t0, ddp__now(), -1, 0);   /* NCCL: host time, the enqueue */
    return r;
}

/* --------------------------------------------------------------------------------------------
   >>collectives  Collectives on user buffers, between steps
   -------------------------------------------------------------------------------------------- */
/* The root of a collective (broadcast, gather, scatter) names a rank. */
static ddp_result ddp__check_root(ddp_context *ctx, int root, const char *call) {
    if (root < 0 || root >= ctx->world)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "%s: root %d is not a rank (world size %d)", call, root, ctx->world);
    return DDP_OK;
}

static ddp_result ddp__user_collective(ddp_context *ctx, uint32_t kind, void *data, size_t count, int root, const char *name) {
    ddp_result r;
    if (ddp__in_backward(ctx))
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "%s while a backward is in flight (call it between steps)", name);
    if (count && !data) return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "%s: NULL buffer of %zu elements", name, count);
    if ((r = ddp__check_root(ctx, root, name)) != DDP_OK) return r;
    if (ctx->world == 1) return DDP_OK;
    snprintf(ctx->what_buf, sizeof ctx->what_buf, "%s of %zu %s", name, count, kind == DDP__KIND_BROADCAST ? "bytes" : "elements");
    ctx->what = ctx->what_buf;
    return ctx->be->collective(ctx, kind, data, count, root);
}

/* The flat buffer a host copy reads or writes, with its range checked. AdamW's moments exist
   (as zeros) from the first copy on. */
static ddp_result ddp__state_buffer(ddp_context *ctx, ddp_buffer which, size_t offset, const void *host, size_t count,
                                    const char *call, float **flat) {
    ddp_result r;
    if (ddp__in_backward(ctx)) return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "%s while a backward is in flight", call);
    if (count && !host) return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "%s: NULL host buffer of %zu floats", call, count);
    if (offset > ctx->flat.count || count > ctx->flat.count - offset)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "%s: floats [%zu, %zu) are outside the flat buffer of %zu",
                         call, offset, offset + count, ctx->flat.count);
    switch (which) {
    case DDP_PARAMS: *flat = ctx->flat.params; return DDP_OK;
    case DDP_GRADS: *flat = ctx->flat.grads; return DDP_OK;
    case DDP_ADAM_M: case DDP_ADAM_V:
        if ((r = ctx->be->adamw_state(ctx)) != DDP_OK) return r;
        *flat = which == DDP_ADAM_M ? ctx->adam.m : ctx->adam.v;
        return DDP_OK;
    }
    return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "%s: unknown buffer %d", call, (int)which);
}

/* bf16 parameters: host values written into the fp32 master reach the bf16 working copies the
   program uses, rounded; the two never disagree. */
static ddp_result ddp__state_written(ddp_context *ctx, ddp_buffer which, size_t offset, size_t count, ddp_result r) {
    if (r != DDP_OK || which != DDP_PARAMS) return r;
    return ddp__bf16_op(ctx, DDP__BF16_ROUND_PARAMS, offset, count);
}

/* n floats between host memory and flat element `at` of `which`, `local` being where that is in
   this rank's memory. bf16 gradients (bf16 parameters; there is no fp32 copy, local is NULL) are
   widened to the host's floats, or rounded from them, through a small bounce. */
#define DDP__GRADS_BOUNCE 4096
static ddp_result ddp__state_copy(ddp_context *ctx, ddp_buffer which, float *local, size_t at, float *host, size_t n, int to_host) {
    ddp_bf16 bounce[DDP__GRADS_BOUNCE];
    size_t done, k, i;
    ddp_result r = DDP_OK;
    if (which != DDP_GRADS || !ctx->flat.grads_bf16)
        return to_host ? ctx->be->copy(ctx, host, local, n * sizeof(float), 1) : ctx->be->copy(ctx, local, host, n * sizeof(float), 0);
    for (done = 0; done < n && r == DDP_OK; done += k) {
        k = n - done < DDP__GRADS_BOUNCE ? n - done : DDP__GRADS_BOUNCE;
        if (to_host) {
            if ((r = ctx->be->copy(ctx, bounce, ctx->flat.grads_bf16 + at + done, k * sizeof(ddp_bf16), 1)) != DDP_OK) break;
            for (i = 0; i < k; i++) host[done + i] = ddp__from_bf16(bounce[i]);
        } else {
            for (i = 0; i < k; i++) bounce[i] = ddp__to_bf16(host[done + i]);
            r = ctx->be->copy(ctx, ctx->flat.grads_bf16 + at + done, bounce, k * sizeof(ddp_bf16), 0);
        }
    }
    return r;
}

#define DDP__SCATTER_CHUNK ((size_t)1 << 20)   /* floats per broadcast: 4 MiB of bounce buffer */

/* Is `which` held in parts (packed: ddp__shard_layout)? Sharded, m and v; with bf16 parameters
   the fp32 master too (ddp__master_parts). */
static int ddp__in_parts(const ddp_context *ctx, ddp_buffer which) {
    if (which == DDP_PARAMS) return ddp__master_parts(ctx) || ddp__z3_flat_parts(ctx);   /* sharded parameters: flat-indexed */
    return (which == DDP_ADAM_M || which == DDP_ADAM_V) && ddp__sharded(ctx);
}

/* Where flat element `offset` of `which` is in this rank's memory, `count` floats from there.
   A buffer held in parts (ddp__in_parts): a range outside one of this rank's parts is refused by
   name (the collective calls below reach any range); a write of the master in parts is refused
   (the working copies of the part on the other ranks would not follow). */
static ddp_result ddp__state_at(ddp_context *ctx, ddp_buffer which, size_t offset, const void *host, size_t count,
                                const char *call, int write, float **at) {
    float *flat = NULL;
    size_t lo, hi;
    ddp_result r = ddp__state_buffer(ctx, which, offset, host, count, call, &flat);
    int b;
    if (r != DDP_OK) return r;
    if (write && which == DDP_PARAMS && ddp__master_parts(ctx))
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "%s: rank %d cannot write parameters alone: with shard_optimizer "
                         "and bf16 parameters each rank holds the fp32 master only for its own part of each bucket, and "
                         "every rank's bf16 working copies must follow; use ddp_scatter_from_host (collective)", call, ctx->rank);
    /* the outer copy (>>outer) takes what is written, the same on every rank: from parts, a collective */
    if (write && which == DDP_PARAMS && ddp__z3_flat_parts(ctx) && ctx->desc.outer.mode != DDP_OUTER_OFF)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "%s: rank %d cannot write parameters alone: with DDP_SHARD_PARAMETERS "
                         "in replica groups (desc.outer) each rank holds only its parts, and the outer copy of the "
                         "parameters must follow on every rank; use ddp_scatter_from_host (collective)", call, ctx->rank);
    if (!write && which == DDP_GRADS && ddp__z2(ctx) && count) {   /* ZeRO-2: the rest is released (zeros) */
        for (b = 0; b < ctx->model.num_buckets; b++) {
            ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
            if (offset >= lo && offset + count <= hi) break;
        }
        if (b == ctx->model.num_buckets)
            return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "%s: floats [%zu, %zu) of the gradients are not all held by rank "
                             "%d: with DDP_SHARD_GRADIENTS each rank keeps the averaged gradients only for its own part of "
                             "each bucket, the rest is released after each step (ddp_gather_to_host reaches any range)",
                             call, offset, offset + count, ctx->rank);
    }
    if (!ddp__in_parts(ctx, which) || !count) {
        *at = flat ? flat + offset : NULL;   /* NULL: the bf16 gradients (ddp__state_copy) */
        return DDP_OK;
    }
    for (b = 0; b < ctx->model.num_buckets; b++) {
        ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
        if (offset >= lo && offset + count <= hi) {
            *at = flat + (which == DDP_PARAMS && ddp__z3_flat_parts(ctx) ? offset : ctx->shard.base[b] + (offset - lo));
            return DDP_OK;
        }
    }
    return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "%s: floats [%zu, %zu) of %s are not all held by rank %d: with "
                     "shard_optimizer each rank holds %s only for its own part of each bucket (ddp_gather_to_host "
                     "and ddp_scatter_from_host reach any range)", call, offset, offset + count,
                     which == DDP_ADAM_M ? "AdamW's m" : which == DDP_ADAM_V ? "AdamW's v" : ddp__z3_flat_parts(ctx) ?
                     "the parameters" : "the fp32 master", ctx->rank, which != DDP_PARAMS ? "m and v" : ddp__z3_flat_parts(ctx)
                     ? "the parameters (DDP_SHARD_PARAMETERS; ddp_param's view holds a unit only while it is gathered)"
                     : "the fp32 master (bf16 parameters)");
}

/* Sharded: the pieces of [offset, offset + count) of m, v, the master in parts (or, gathered, the averaged gradients)
   by owner, in bucket order then rank order, the same walk on every rank. A piece its owner
   holds on the root is a local copy; any other travels by broadcast (from its owner for a
   gather, from the root for a scatter) through a bounce buffer. */
static ddp_result ddp__sharded_move(ddp_context *ctx, ddp_buffer which, size_t offset, float *host, size_t count, int root,
                                    int gather) {
    float *bounce = NULL, *mine = which == DDP_ADAM_M ? ctx->adam.m : which == DDP_ADAM_V ? ctx->adam.v
                                : which == DDP_PARAMS ? ctx->flat.params : ctx->flat.grads;
    size_t lo, hi, chunk = count < DDP__SCATTER_CHUNK ? count : DDP__SCATTER_CHUNK;
    ddp_result r = DDP_OK;
    int b, s, team = ddp__team_world(ctx), me = ddp__team_rank(ctx);
    if (!(bounce = (float *)DDP_MALLOC(chunk * sizeof(float) + 1)))   /* the peers are in it already: they must hear */
        return ddp__fail_group(ctx, DDP_ERR_OUT_OF_MEMORY, "%s: no memory for a bounce buffer of %zu floats",
                               gather ? "ddp_gather_to_host" : "ddp_scatter_from_host", chunk);
    ctx->what = gather ? "ddp_gather_to_host's broadcast from a part's owner" : "ddp_scatter_from_host's broadcast";
    /* With replica groups every group holds every part, member s of each: a gather takes them
       from the root's group (its first rank: root - root % team), a scatter gives each part to
       member s of every group. */
    for (b = 0; b < ctx->model.num_buckets && r == DDP_OK; b++)
        for (s = 0; s < team && r == DDP_OK; s++) {
            size_t a, z, done, n, mlo, mhi;
            float *local = NULL;
            int owner = root - root % team + s;   /* the part's owner in the root's group */
            ddp__shard_range(ctx, b, s, &lo, &hi);
            a = lo > offset ? lo : offset;
            z = hi < offset + count ? hi : offset + count;
            if (z <= a) continue;
            if (s == me && mine) {   /* where the piece is here (bf16 gradients: ddp__state_copy finds them) */
                ddp__shard_range(ctx, b, me, &mlo, &mhi);
                local = which == DDP_GRADS || (which == DDP_PARAMS && ddp__z3_flat_parts(ctx)) ? mine + a   /* flat-indexed */
                        : mine + ctx->shard.base[b] + (a - mlo);
            }
            if (owner == root && (gather || team == ctx->world)) {   /* nobody else needs it */
                if (ctx->rank == root) r = ddp__state_copy(ctx, which, local, a, host + (a - offset), z - a, gather);
                continue;
            }
            for (done = a; done < z && r == DDP_OK; done += n) {
                n = z - done < chunk ? z - done : chunk;
                if (gather && owner == ctx->rank) r = ddp__state_copy(ctx, which, local ? local + (done - a) : NULL, done, bounce, n, 1);
                if (!gather && ctx->rank == root) memcpy(bounce, host + (done - offset), n * sizeof(float));
                if (r == DDP_OK) r = ctx->be->collective(ctx, DDP__KIND_BROADCAST, bounce, n * sizeof(float), gather ? owner : root);
                if (r != DDP_OK) break;
                if (gather && ctx->rank == root) memcpy(host + (done - offset), bounce, n * sizeof(float));
                if (!gather && s == me) r = ddp__state_copy(ctx, which, local ? local + (done - a) : NULL, done, bounce, n, 0);
            }
        }
    DDP_FREE(bounce);
    return r;
}

/* Host values of parameters [offset, offset + n) on every rank, the master in parts: each rank
   writes the master of its parts and its working copies of the whole range, rounded on the host
   (ddp__to_bf16 has the kernels' bits). */
static ddp_result ddp__master_parts_put(ddp_context *ctx, size_t offset, const float *src, size_t n, ddp_bf16 *rounded) {
    size_t lo, hi, a, z, i;
    ddp_result r = DDP_OK;
    int b;
    for (b = 0; b < ctx->model.num_buckets && r == DDP_OK; b++) {
        ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
        a = lo > offset ? lo : offset;
        z = hi < offset + n ? hi : offset + n;
        if (z > a) r = ctx->be->copy(ctx, ctx->flat.params + ctx->shard.base[b] + (a - lo), src + (a - offset), (z - a) * sizeof(float), 0);
    }
    for (i = 0; i < n; i++) rounded[i] = ddp__to_bf16(src[i]);
    for (b = 0; b < ctx->model.num_buckets && r == DDP_OK && ddp__z3(ctx); b++) {   /* sharded parameters: own parts only */
        ddp__shard_range(ctx, b, ddp__team_rank(ctx), &lo, &hi);
        a = lo > offset ? lo : offset;
        z = hi < offset + n ? hi : offset + n;
        if (z > a) r = ctx->be->copy(ctx, ctx->flat.params_bf16 + a, rounded + (a - offset), (z - a) * sizeof(ddp_bf16), 0);
    }
    if (ddp__z3(ctx)) return r;
    return r != DDP_OK ? r : ctx->be->copy(ctx, ctx->flat.params_bf16 + offset, rounded, n * sizeof(ddp_bf16), 0);
}

/* ddp_scatter_from_host of parameters, the master in parts: root's values to every rank in
   chunks (every rank's working copies take all of them). */
static ddp_result ddp__scatter_master_parts(ddp_context *ctx, size_t offset, const float *src, size_t count, int root) {
    size_t chunk = count < DDP__SCATTER_CHUNK ? count : DDP__SCATTER_CHUNK, done, n;
    float *bounce = (float *)DDP_MALLOC(chunk * sizeof(float) + chunk * sizeof(ddp_bf16));
    ddp_result r = DDP_OK;
    if (!bounce)   /* the peers are in the broadcast already: they must hear of it */
        return ddp__fail_group(ctx, DDP_ERR_OUT_OF_MEMORY, "ddp_scatter_from_host: no memory for a bounce buffer of %zu floats", chunk);
    ctx->what = "ddp_scatter_from_host's broadcast";
    for (done = 0; done < count && r == DDP_OK; done += n) {
        n = count - done < chunk ? count - done : chunk;
        if (ctx->rank == root) memcpy(bounce, src + done, n * sizeof(float));
        r = ctx->be->collective(ctx, DDP__KIND_BROADCAST, bounce, n * sizeof(float), root);
        if (r == DDP_OK) r = ddp__master_parts_put(ctx, offset + done, bounce, n, (ddp_bf16 *)(void *)(bounce + chunk));
    }
    DDP_FREE(bounce);
    return r;
}

/* The state to and from one rank's host memory, for checkpoints: collective calls, alike on
   every rank. Gather: root's dst receives [offset, offset + count) of `which` from whichever rank
   holds it. Scatter: root's src goes to every rank that holds part of the range. Without a
   sharded optimizer every rank holds everything: a gather is root's own copy (nothing is
   sent), a scatter a broadcast in chunks through a bounce buffer (root's src is only read). */

static ddp_result ddp__gather_to_host(ddp_context *ctx, ddp_buffer which, size_t offset, float *dst, size_t count, int root) {
    float *flat = NULL;
    ddp_result r = ddp__state_buffer(ctx, which, offset, ctx->rank == root ? (const void *)dst : (const void *)ctx, count,
                                     "ddp_gather_to_host", &flat);
    if (r == DDP_OK && count && (which != DDP_PARAMS || ddp__master_parts(ctx) || ddp__z3_flat_parts(ctx)) && ddp__sharded(ctx))
        return ddp__sharded_move(ctx, which, offset, dst, count, root, 1);
    if (r != DDP_OK || ctx->rank != root || !count) return r;
    return ddp__state_copy(ctx, which, flat ? flat + offset : NULL, offset, dst, count, 1);
}

static ddp_result ddp__scatter_from_host_any(ddp_context *ctx, ddp_buffer which, size_t offset, const float *src, size_t count, int root);
/* Sharded parameters: every owner's parts written before any rank's next gather reads them. */
static ddp_result ddp__scatter_from_host(ddp_context *ctx, ddp_buffer which, size_t offset, const float *src, size_t count, int root) {
    ddp_result r = ddp__scatter_from_host_any(ctx, which, offset, src, count, root);
    if (r != DDP_OK || which != DDP_PARAMS || !ddp__z3(ctx) || ctx->world == 1) return r;
    ctx->what = "ddp_scatter_from_host's barrier (sharded parameters: every part written before any gather)";
    return ctx->be->collective(ctx, DDP__KIND_BARRIER, NULL, 0, 0);
}

static ddp_result ddp__scatter_from_host_any(ddp_context *ctx, ddp_buffer which, size_t offset, const float *src, size_t count, int root) {
    float *flat = NULL, *bounce;
    size_t done, n;
    ddp_result r = ddp__state_buffer(ctx, which, offset, ctx, count, "ddp_scatter_from_host", &flat);
    if (r != DDP_OK || !count) return r;
    if (ctx->rank == root && !src)   /* the peers wait in the broadcast: stop them too */
        return ddp__fail_group(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_scatter_from_host: the root's source is NULL (%zu floats)", count);
    if (ctx->world == 1)
        return ddp__state_written(ctx, which, offset, count, ddp__state_copy(ctx, which, flat ? flat + offset : NULL, offset,
                                                                             (float *)(uintptr_t)src, count, 0));
    if (which == DDP_PARAMS && (r = ddp__z3_check_step(ctx, "ddp_scatter_from_host")) != DDP_OK) return r;
    if (((which == DDP_ADAM_M || which == DDP_ADAM_V) && ddp__sharded(ctx)) || (which == DDP_PARAMS && ddp__z3_flat_parts(ctx)))
        return ddp__sharded_move(ctx, which, offset, (float *)(uintptr_t)src, count, root, 0);
    if (which == DDP_PARAMS && ddp__master_parts(ctx)) return ddp__scatter_master_parts(ctx, offset, src, count, root);
    bounce = (float *)DDP_MALLOC((count < DDP__SCATTER_CHUNK ? count : DDP__SCATTER_CHUNK) * sizeof(float));
    if (!bounce)   /* the peers are in the broadcast already: they must hear of it */
        return ddp__fail_group(ctx, DDP_ERR_OUT_OF_MEMORY, "ddp_scatter_from_host: no memory for a bounce buffer of %zu floats",
                               count < DDP__SCATTER_CHUNK ? count : DDP__SCATTER_CHUNK);
    ctx->what = "ddp_scatter_from_host's broadcast";
    for (done = 0; done < count && r == DDP_OK; done += n) {
        n = count - done < DDP__SCATTER_CHUNK ? count - done : DDP__SCATTER_CHUNK;
        if (ctx->rank == root) memcpy(bounce, src + done, n * sizeof(float));
        r = ctx->be->collective(ctx, DDP__KIND_BROADCAST, bounce, n * sizeof(float), root);
        if (r == DDP_OK) r = ddp__state_copy(ctx, which, flat ? flat + offset + done : NULL, offset + done, bounce, n, 0);
    }
    DDP_FREE(bounce);
    return ddp__state_written(ctx, which, offset, count, r);
}

/* --------------------------------------------------------------------------------------------
   >>join  Uneven inputs (PyTorch's Join). With desc.uneven_inputs every synchronizing step begins
   with a tiny allreduce in which each rank says whether it has data (1) or has joined (0). A
   rank out of data calls ddp_join, which answers every step of the others with a shadow step:
   the same count, then every bucket in bucket order, its gradients zero (so the average is over
   the initial world size, or, divided by the ranks with data, rescaled after ddp_finish). A
   rank that joins in the middle of an accumulation window (micro-steps with sync off since its
   last zero_grad or synchronizing step) says 2 in its first count instead: its first shadow
   step sends the gradients it accumulated instead of zeros, and it counts among the ranks with
   data for that step's divisor, but takes no step. Unsharded it takes no AdamW steps of its
   own: once no rank steps (every rank has joined), the lowest rank that stepped in the last
   uneven step broadcasts its parameters and AdamW state to all, so every replica ends
   bit-identical. Sharded, each shadow step ends in ddp_adamw_step on this rank's parts, with the
   options the root sends at the start of its own (join.step_uneven says the step had joined
   ranks; EMBEDDING in the manual says why the bits are the unsharded run's), and nothing is
   broadcast at the end.
   Nothing here depends on the backend's bucket path (the CPU backend's in-place buckets wait
   until every peer has read a rank's buffer before the step ends, so the next shadow step may
   zero it) or on reduce_dtype (a zero is a zero in bf16; the rescale of DIVIDE_BY_ACTIVE is the
   same float multiply on every rank); with find_unused a shadow step marks every parameter
   ready, so nothing of it is zero-filled twice. A user collective made by a rank with data
   while another has joined is refused on both sides as a mismatch (the message names the join).
   -------------------------------------------------------------------------------------------- */
/* The ranks with data's replicas to every rank: parameters, AdamW's moments and step count. */
static ddp_result ddp__join_sync_replicas(ddp_context *ctx) {
    size_t bytes = ctx->flat.count * sizeof(float);
    int root = ctx->join.root;
    ddp_result r;
    if ((r = ctx->be->adamw_state(ctx)) != DDP_OK) return ddp__fatal(ctx, r);
    ctx->what = "ddp_join's broadcast of the parameters";
    if ((r = ctx->be->collective(ctx, DDP__KIND_BROADCAST, ctx->flat.params, bytes, root)) != DDP_OK) return r;
    if ((r = ddp__bf16_op(ctx, DDP__BF16_ROUND_PARAMS, 0, ctx->flat.count)) != DDP_OK) return r;
    ctx->what = "ddp_join's broadcast of the AdamW state";
    if ((r = ctx->be->collective(ctx, DDP__KIND_BROADCAST, ctx->adam.m, bytes, root)) != DDP_OK) return r;
    if ((r = ctx->be->collective(ctx, DDP__KIND_BROADCAST, ctx->adam.v, bytes, root)) != DDP_OK) return r;
    return ctx->be->collective(ctx, DDP__KIND_BROADCAST, &ctx->adam.step, sizeof ctx->adam.step, root);
}

/* Sharded (>>join): an uneven step's options for AdamW, as values (ddp_adamw holds no pointers;
   the per-parameter DDP_NO_DECAY flags are each rank's own registration, equal on every rank),
   from the lowest rank with data to every rank; go 0: its ddp_adamw_step failed before any
   exchange, and the joined ranks fail too instead of waiting for the step's exchanges. */
typedef struct ddp__join_options {
    float lr, beta1, beta2, eps, weight_decay, max_grad_norm;
    int32_t as_given, go;
} ddp__join_options;

static ddp_result ddp__join_options_bcast(ddp_context *ctx, ddp__join_options *o) {
    ctx->what = "ddp_adamw_step's options to the joined ranks (uneven inputs, sharded)";
    return ctx->be->collective(ctx, DDP__KIND_BROADCAST, o, sizeof *o, ctx->join.root);
}

/* A rank with data, at the start of an uneven step's ddp_adamw_step (the root's values count). */
static ddp_result ddp__join_send_options(ddp_context *ctx, const ddp_adamw *opt, int go) {
    ddp__join_options o;
    memset(&o, 0, sizeof o);
    if (opt) {
        o.lr = opt->lr; o.beta1 = opt->beta1; o.beta2 = opt->beta2; o.eps = opt->eps;
        o.weight_decay = opt->weight_decay; o.max_grad_norm = opt->max_grad_norm; o.as_given = opt->as_given;
    }
    o.go = opt && go;
    return ddp__join_options_bcast(ctx, &o);
}

/* A joined rank, after a shadow step's ddp_finish (sharded): the same ddp_adamw_step on its parts
   as the ranks with data take on theirs. Its gradients are its parts of the same average (its
   zeros were in it), the norm's blocks and skip_nonfinite's verdict are exchanged as in any step,
   and its step count moved with the others' in every step before: so its parts take the bits they
   would take had it called ddp_adamw_step itself with zero gradients, and the all-gather (ZeRO-1,
   ZeRO-2) or the parts kept (ZeRO-3) leave every rank with the unsharded run's state. */
static ddp_result ddp__join_shadow_adamw(ddp_context *ctx) {
    ddp__join_options o;
    ddp_adamw opt;
    ddp_result r;
    memset(&o, 0, sizeof o);
    ctx->join.step_uneven = 0;   /* received here, not sent again by the call below */
    if ((r = ddp__join_options_bcast(ctx, &o)) != DDP_OK) return r;
    if (!o.go)
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_join: the ddp_adamw_step of rank %d (a rank with data) failed "
                         "before its exchanges (its own error names why), so this rank's parts of the state took no "
                         "step; the ranks are out of step now", ctx->join.root);
    memset(&opt, 0, sizeof opt);
    opt.lr = o.lr; opt.beta1 = o.beta1; opt.beta2 = o.beta2; opt.eps = o.eps;
    opt.weight_decay = o.weight_decay; opt.max_grad_norm = o.max_grad_norm; opt.as_given = o.as_given;
    r = ddp__adamw_step(ctx, &opt, NULL);
    return r == DDP_ERR_NONFINITE ? DDP_OK : r;   /* skipped alike everywhere, nothing changed: the others go on */
}

static ddp_result ddp__join(ddp_context *ctx) {
    ddp_result r = DDP_OK;
    int i, stepping, sync = ctx->step.sync, pending = ctx->join.pending;
    if (!ctx->desc.uneven_inputs)
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_join needs ddp_desc.uneven_inputs (DDP_JOIN_DIVIDE_BY_WORLD "
                         "or DDP_JOIN_DIVIDE_BY_ACTIVE) on every rank");
    if (ddp__in_backward(ctx)) return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_join while a backward is in flight (call it between steps)");
    if (ctx->world == 1) return DDP_OK;
    ctx->step.sync = 1;   /* the shadow steps synchronize; the caller's setting comes back at the end */
    for (;;) {
        /* 2: this rank's accumulated micro-steps go into the others' next step (the first one) */
        if ((r = ddp__join_count(ctx, pending ? 2 : 0, &stepping)) != DDP_OK) break;
        if (stepping == 0) break;   /* every rank has joined (gradients still pending are dropped: no one steps) */
        /* a shadow step: zero gradients (or the pending ones, once), every bucket in order, the same finish */
        if (!pending) {   /* ZeRO-2 on host memory: no memset that would bring the released pages back */
            if (ddp__z2(ctx) && ctx->be->shards_grads == 1) ddp__z2_zero(ctx);
            else if ((r = ddp__zero_grads(ctx, 0, ctx->flat.count)) != DDP_OK) break;
        }
        pending = 0;
        for (i = 0; i < ctx->model.num_params; i++) ctx->model.params[i].touched = 0;
        ddp__tape_reset(ctx);
        ctx->join.shadow = 1;
        for (i = 0; i < ctx->model.num_params && r == DDP_OK; i++) r = ddp__grad_ready(ctx, i);
        if (r == DDP_OK) r = ddp__finish(ctx);
        ctx->join.shadow = 0;
        if (r == DDP_OK && ddp__sharded(ctx)) r = ddp__join_shadow_adamw(ctx);   /* this rank's parts step too */
        if (r != DDP_OK) break;
    }
    /* sharded, every rank stepped its parts in every step: nothing to copy (and no rank holds all) */
    if (r == DDP_OK && ctx->join.uneven && !ddp__sharded(ctx)) r = ddp__join_sync_replicas(ctx);
    ctx->step.sync = sync;
    ctx->join.pending = 0;
    ctx->join.uneven = 0;
    ctx->join.step_uneven = 0;
    ctx->join.active = 0;
    return r;
}

/* --------------------------------------------------------------------------------------------
   >>outer  Replica groups and their outer synchronization (desc.outer; OUTER SYNC in the
   manual). Within a group every step is the data-parallel step of the sections above (a group
   of one rank averages nothing: ddp__outer_backend). Across groups only the parameters meet: the
   flat buffer is cut into F fragments (DiLoCo: F = 1), fragment p is sent every H inner steps,
   staggered by p * H / F steps, and merged delay_steps later. What a group sends is its outer
   gradient, the fp32 outer copy minus its parameters, encoded for the wire; every rank receives
   every group's (one broadcast from each group's first rank) and adds them decoded in group
   order, so every rank computes the same bits. Then an outer Nesterov SGD step on the outer
   copy, and the parameters take the new outer values (mixed with the local ones by mix).
   -------------------------------------------------------------------------------------------- */
static int ddp__outer_on(const ddp_context *ctx) { return ctx->desc.outer.mode != DDP_OUTER_OFF; }

/* lr 1, momentum 0 and an fp32 wire: the outer step is the mean of the groups' parameters, and
   the parameters themselves travel (one group: its own values exactly, as plain training). */
static int ddp__outer_plain_mean(const ddp_context *ctx) {
    const ddp_outer *o = &ctx->desc.outer;
    return o->lr == 1 && o->momentum == 0 && o->wire == DDP_WIRE_FP32;
}

/* The fp32 parameters [lo, lo + n) whole, into host memory `out`. With shard_optimizer and bf16
   parameters within a group the master is in parts across the group's ranks (packed), and with
   sharded parameters (ZeRO-3) and fp32 ones the parameters themselves (this rank's owner storage,
   flat-indexed): each member's pieces reach the group's other members (be->team_bcast, nothing
   leaves the group), so every rank computes the outer step on the whole range, as unsharded,
   with the same bits. */
static ddp_result ddp__outer_master_get(ddp_context *ctx, size_t lo, size_t n, float *out) {
    size_t plo, phi, a, z;
    ddp_result r = DDP_OK;
    int b, s, flat = ddp__z3_flat_parts(ctx);
    if (!ddp__master_parts(ctx) && !flat) return ctx->be->copy(ctx, out, ctx->flat.params + lo, n * sizeof(float), 1);
    for (b = 0; b < ctx->model.num_buckets && r == DDP_OK; b++)
        for (s = 0; s < ddp__team_world(ctx) && r == DDP_OK; s++) {
            ddp__shard_range(ctx, b, s, &plo, &phi);
            a = plo > lo ? plo : lo;
            z = phi < lo + n ? phi : lo + n;
            if (z <= a) continue;
            if (s == ddp__team_rank(ctx))
                memcpy(out + (a - lo), ctx->flat.params + (flat ? a : ctx->shard.base[b] + (a - plo)), (z - a) * sizeof(float));
            r = ctx->be->team_bcast(ctx, out + (a - lo), (z - a) * sizeof(float), s);
        }
    return r;
}

/* The fp32 parameters [lo, lo + n) from host memory `in` (the same on the group's ranks), the
   bf16 working copies rounded from them; the master in parts: this rank's parts of it (ZeRO-3:
   and of the working copies); fp32 parameters in parts (ZeRO-3): this rank's parts of them. */
static ddp_result ddp__outer_master_put(ddp_context *ctx, size_t lo, size_t n, const float *in) {
    ddp_bf16 *rounded;
    ddp_result r = DDP_OK;
    if (ddp__z3_flat_parts(ctx)) {
        size_t plo, phi, a, z;
        int b;
        for (b = 0; b < ctx->model.num_buckets && r == DDP_OK; b++) {
            ddp__shard_range(ctx, b, ddp__team_rank(ctx), &plo, &phi);
            a = plo > lo ? plo : lo;
            z = phi < lo + n ? phi : lo + n;
            if (z > a) r = ctx->be->copy(ctx, ctx->flat.params + a, in + (a - lo), (z - a) * sizeof(float), 0);
        }
        return r;
    }
    if (!ddp__master_parts(ctx)) {
        if ((r = ctx->be->copy(ctx, ctx->flat.params + lo, in, n * sizeof(float), 0)) != DDP_OK) return r;
        return ddp__bf16_op(ctx, DDP__BF16_ROUND_PARAMS, lo, n);
    }
    if (!(rounded = (ddp_bf16 *)DDP_MALLOC(n * sizeof(ddp_bf16) + 1)))
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for %zu bf16 working copies", n);
    r = ddp__master_parts_put(ctx, lo, in, n, rounded);
    DDP_FREE(rounded);
    return r;
}

/* Bytes one group's fragment of n floats takes on the wire: INT8 is every block's fp32 scale,
   then the values. */
static size_t ddp__outer_wire_bytes(const ddp_context *ctx, size_t n) {
    size_t block = (size_t)ctx->desc.outer.quant_block;
    switch (ctx->desc.outer.wire) {
    case DDP_WIRE_BF16: return n * sizeof(ddp_bf16);
    case DDP_WIRE_INT8: return (n + block - 1) / block * sizeof(float) + n;
    default: return n * sizeof(float);
    }
}

/* INT8, one block of n values: scale = max |x| / 127, q = x / scale rounded to nearest (even),
   in [-127, 127]. A block of zeros has scale 0 (all q 0); a non-finite value makes the scale
   NaN, and the block decodes to NaN, as an fp32 wire would carry it. */
static void ddp__quant_block(const float *x, size_t n, float *scale_out, int8_t *q) {
    float amax = 0, scale;
    size_t i;
    int bad = 0;
    for (i = 0; i < n; i++) {
        float a = x[i] < 0 ? -x[i] : x[i];
        if (!ddp__finite_f(x[i])) bad = 1;
        else if (a > amax) amax = a;
    }
    scale = amax / 127.0f;
    if (bad) { uint32_t nan = 0x7fc00000u; memcpy(&scale, &nan, 4); }
    for (i = 0; i < n; i++) {
        long v = bad || scale == 0 ? 0 : lrintf(x[i] / scale);
        q[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
    *scale_out = scale;
}

static void ddp__outer_encode(const ddp_context *ctx, const float *x, size_t n, unsigned char *out) {
    size_t i, block = (size_t)ctx->desc.outer.quant_block, nb = (n + block - 1) / block;
    switch (ctx->desc.outer.wire) {
    case DDP_WIRE_BF16:
        for (i = 0; i < n; i++) { ddp_bf16 h = ddp__to_bf16(x[i]); memcpy(out + i * sizeof h, &h, sizeof h); }
        return;
    case DDP_WIRE_INT8:
        for (i = 0; i < nb; i++) {
            float scale;
            size_t lo = i * block, m = n - lo < block ? n - lo : block;
            ddp__quant_block(x + lo, m, &scale, (int8_t *)(void *)(out + nb * sizeof(float) + lo));
            memcpy(out + i * sizeof(float), &scale, sizeof scale);
        }
        return;
    default: memcpy(out, x, n * sizeof(float)); return;
    }
}

/* sum (n floats) = the decoded values (first) or sum + them: the same adds on every rank. */
static void ddp__outer_decode_add(const ddp_context *ctx, const unsigned char *in, size_t n, float *sum, int first) {
    size_t i, block = (size_t)ctx->desc.outer.quant_block, nb = (n + block - 1) / block;
    for (i = 0; i < n; i++) {
        float v;
        if (ctx->desc.outer.wire == DDP_WIRE_BF16) { ddp_bf16 h; memcpy(&h, in + i * sizeof h, sizeof h); v = ddp__from_bf16(h); }
        else if (ctx->desc.outer.wire == DDP_WIRE_INT8) {
            float scale;
            memcpy(&scale, in + (i / block) * sizeof(float), sizeof scale);
            v = (float)((const int8_t *)(const void *)(in + nb * sizeof(float)))[i] * scale;
        } else memcpy(&v, in + i * sizeof v, sizeof v);
        sum[i] = first ? v : sum[i] + v;
    }
}

/* A group's slot: a head (what its first rank waited at the exchange's barrier), then the
   encoding. */
#define DDP__OUTER_HEAD 64

/* Fragment f: floats [frag[f], frag[f + 1]), equal to within DDP__ALIGN_FLOATS (the flat
   buffer's count is a multiple of it). */
static ddp_result ddp__outer_commit(ddp_context *ctx) {
    size_t n = ctx->flat.count, units = n / DDP__ALIGN_FLOATS, most = 0, bytes;
    int f, F = ctx->desc.outer.fragments;
    if (!ddp__outer_on(ctx)) return DDP_OK;
    if ((size_t)F > units)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc.outer: %d fragments, but the model's %zu floats make "
                         "only %zu blocks of %d (a fragment is at least one)", F, n, units, DDP__ALIGN_FLOATS);
    if (!(ctx->outer.frag = (size_t *)ddp__calloc(sizeof(size_t) * (size_t)(F + 1))))
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for the outer fragments");
    for (f = 0; f <= F; f++) ctx->outer.frag[f] = units * (size_t)f / (size_t)F * DDP__ALIGN_FLOATS;
    for (f = 0; f < F; f++) if (ctx->outer.frag[f + 1] - ctx->outer.frag[f] > most) most = ctx->outer.frag[f + 1] - ctx->outer.frag[f];
    bytes = ctx->outer.slot = DDP__OUTER_HEAD + ddp__round_up(ddp__outer_wire_bytes(ctx, most), 64);
    ctx->outer.theta = ddp__alloc_floats(n);
    ctx->outer.mom = ctx->desc.outer.momentum > 0 ? ddp__alloc_floats(n) : NULL;
    ctx->outer.sum = ddp__alloc_floats(most);
    ctx->outer.host = ddp__alloc_floats(most);
    ctx->outer.recv = (unsigned char *)ddp__calloc(bytes * (size_t)ctx->outer.groups);
    if (!ctx->outer.theta || (ctx->desc.outer.momentum > 0 && !ctx->outer.mom) || !ctx->outer.sum || !ctx->outer.host || !ctx->outer.recv)
        return ddp__fail(ctx, DDP_ERR_OUT_OF_MEMORY, "out of memory for the outer state (%zu floats of outer parameters%s, "
                         "%zu bytes of wire buffers)", n, ctx->outer.mom ? " and momentum" : "", bytes * (size_t)ctx->outer.groups);
    if (ctx->outer.mom) memset(ctx->outer.mom, 0, n * sizeof(float));
    /* rank 0's, as every rank's (commit) */
    return ddp__outer_master_get(ctx, 0, n, ctx->outer.theta);
}

/* Fragment f, sent: this group's outer gradient (or, ddp__outer_plain_mean, its parameters) as
   they are now, encoded into the group's slot. */
static ddp_result ddp__outer_pack(ddp_context *ctx, int f) {
    size_t lo = ctx->outer.frag[f], n = ctx->outer.frag[f + 1] - lo, i;
    const float *p = ctx->outer.host, *theta = ctx->outer.theta + lo;
    float *delta = ctx->outer.sum;   /* scratch until the sum replaces it */
    ddp_result r = ddp__outer_master_get(ctx, lo, n, ctx->outer.host);
    if (r != DDP_OK) return ddp__fatal(ctx, r);   /* the peers are about to exchange */
    if (ddp__outer_plain_mean(ctx)) memcpy(delta, p, n * sizeof(float));
    else for (i = 0; i < n; i++) delta[i] = theta[i] - p[i];
    ddp__outer_encode(ctx, delta, n, ctx->outer.recv + (size_t)ctx->outer.group * ctx->outer.slot + DDP__OUTER_HEAD);
    return DDP_OK;
}

/* Every group's slot to every rank (a broadcast from each group's first rank, through the
   backend's own collective), added into outer.sum in group order. Any thread: the main one, or
   the exchange's own while the inner steps run (nothing else uses the wire meanwhile). A barrier
   first: what each group's first rank waited in it travels in its slot's head, so every rank
   knows the group that arrived last (it waited least) and what it cost the others. */
static ddp_result ddp__outer_transfer(ddp_context *ctx, int f) {
    size_t n = ctx->outer.frag[f + 1] - ctx->outer.frag[f], wire = ddp__outer_wire_bytes(ctx, n), slot = ctx->outer.slot;
    unsigned char *mine = ctx->outer.recv + (size_t)ctx->outer.group * slot;
    ddp_result r = DDP_OK;
    double t0 = ddp__now(), w, least = 0;
    int g;
    ctx->outer.bg.slow_s = 0;
    ctx->outer.bg.slow_group = -1;
    if (ctx->outer.groups > 1) {
        r = ctx->outer.bg.collective(ctx, DDP__KIND_BARRIER, NULL, 0, 0);
        w = ddp__now() - t0;
        memcpy(mine, &w, sizeof w);
    }
    if (r == DDP_OK && ctx->outer.groups > 1 && ctx->outer.size == 1 && ctx->be->allgather)   /* every rank a group */
        r = ctx->be->allgather(ctx, ctx->outer.recv, DDP__OUTER_HEAD + wire, slot);
    else
        for (g = 0; g < ctx->outer.groups && r == DDP_OK && ctx->outer.groups > 1; g++)
            r = ctx->outer.bg.collective(ctx, DDP__KIND_BROADCAST, ctx->outer.recv + (size_t)g * slot, DDP__OUTER_HEAD + wire,
                                         g * ctx->outer.size);
    if (r != DDP_OK) return r;
    for (g = 0; g < ctx->outer.groups; g++) {
        memcpy(&w, ctx->outer.recv + (size_t)g * slot, sizeof w);
        if (ctx->outer.groups > 1 && (g == 0 || w < least)) { least = w; ctx->outer.bg.slow_group = g; }
        if (w > ctx->outer.bg.slow_s) ctx->outer.bg.slow_s = w;
        ddp__outer_decode_add(ctx, ctx->outer.recv + (size_t)g * slot + DDP__OUTER_HEAD, n, ctx->outer.sum, g == 0);
    }
    ctx->outer.bg.slow_s -= least;
    ctx->outer.bg.t0 = t0;
    ctx->outer.bg.t1 = ddp__now();
    ctx->outer.bg.seconds = ddp__now() - t0;
    return DDP_OK;
}

static void *ddp__outer_main(void *arg) {
    ddp_context *ctx = (ddp_context *)arg;
    ddp__mutex_lock(&ctx->outer.bg.lock);
    for (;;) {
        while (ctx->outer.bg.job < 0 && !ctx->outer.bg.stop) ddp__cond_wait(&ctx->outer.bg.cond, &ctx->outer.bg.lock);
        if (ctx->outer.bg.job < 0) break;   /* stopped */
        ddp__mutex_unlock(&ctx->outer.bg.lock);
        ctx->outer.bg.result = ddp__outer_transfer(ctx, ctx->outer.bg.job);
        ddp__mutex_lock(&ctx->outer.bg.lock);
        ctx->outer.bg.job = -1;
        ddp__cond_broadcast(&ctx->outer.bg.cond);
    }
    ddp__mutex_unlock(&ctx->outer.bg.lock);
    return NULL;
}

/* The exchange in flight, if any, done: its result (a failure is the group's already). */
static ddp_result ddp__outer_settle(ddp_context *ctx) {
    ddp_result r;
    double t0;
    if (!ctx->outer.bg.started) return DDP_OK;
    t0 = ddp__now();
    ddp__mutex_lock(&ctx->outer.bg.lock);
    while (ctx->outer.bg.job >= 0) ddp__cond_wait(&ctx->outer.bg.cond, &ctx->outer.bg.lock);
    r = ctx->outer.bg.result;
    ctx->outer.bg.result = DDP_OK;
    ddp__mutex_unlock(&ctx->outer.bg.lock);
    ctx->outer.wait_ms += 1e3 * (ddp__now() - t0);
    return r;
}

/* The settled exchange's times, for ddp_outer_state (main thread: the exchange's thread is idle). */
static void ddp__outer_times(ddp_context *ctx, int f) {
    ddp__record(ctx, ctx->tl.main, DDP__EV_OUTER, ctx->outer.bg.t0, ctx->outer.bg.t1, f,
                ddp__outer_wire_bytes(ctx, ctx->outer.frag[f + 1] - ctx->outer.frag[f]));
    ctx->outer.exchange_ms = 1e3 * ctx->outer.bg.seconds;
    ctx->outer.straggler_ms = 1e3 * ctx->outer.bg.slow_s;
    ctx->outer.slowest_group = ctx->outer.bg.slow_group;
}

/* Fragment f's exchange: at once, or (delay_steps > 0) handed to the exchange's thread. */
static ddp_result ddp__outer_exchange(ddp_context *ctx, int f) {
    ddp_result r;
    snprintf(ctx->what_buf, sizeof ctx->what_buf, "the outer exchange of fragment %d (%zu floats)", f,
             ctx->outer.frag[f + 1] - ctx->outer.frag[f]);
    ctx->what = ctx->what_buf;
    if ((r = ddp__outer_pack(ctx, f)) != DDP_OK) return r;
    /* the NCCL backend's collectives are ordered on the program's compute stream: no thread */
    if (!ctx->desc.outer.delay_steps || ctx->outer.groups == 1 || ctx->be->id == DDP_BACKEND_NCCL) {
        r = ddp__outer_transfer(ctx, f);
        if (r == DDP_OK) ddp__outer_times(ctx, f);
        return r;
    }
    if (!ctx->outer.bg.started) {
        ctx->outer.bg.job = -1;
        ddp__mutex_init(&ctx->outer.bg.lock);
        ddp__cond_init(&ctx->outer.bg.cond);
        if (ddp__thread_create(&ctx->outer.bg.thread, ddp__outer_main, ctx)) {
            ddp__mutex_destroy(&ctx->outer.bg.lock);
            ddp__cond_destroy(&ctx->outer.bg.cond);
            return ddp__fail_group(ctx, DDP_ERR_SYSTEM, "cannot start the outer exchange's thread");
        }
        ctx->outer.bg.started = 1;
    }
    ddp__mutex_lock(&ctx->outer.bg.lock);
    ctx->outer.bg.job = f;
    ddp__cond_signal(&ctx->outer.bg.cond);
    ddp__mutex_unlock(&ctx->outer.bg.lock);
    return DDP_OK;
}

/* The backend's slots that use the wire wait for the exchange in flight first. */
static ddp_result ddp__outer_collective(ddp_context *ctx, uint32_t kind, void *data, size_t count, int root) {
    ddp_result r = ddp__outer_settle(ctx);
    return r != DDP_OK ? r : ctx->outer.bg.collective(ctx, kind, data, count, root);
}

static ddp_result ddp__outer_launch(ddp_context *ctx, int bucket) {
    ddp_result r = ddp__outer_settle(ctx);
    return r != DDP_OK ? r : ctx->outer.bg.launch(ctx, bucket);
}

/* Shutdown: the exchange settled and its thread ended before the backend stops. */
static void ddp__outer_stop(ddp_context *ctx) {
    if (ctx->outer.bg.started) {
        (void)ddp__outer_settle(ctx);
        ddp__mutex_lock(&ctx->outer.bg.lock);
        ctx->outer.bg.stop = 1;
        ddp__cond_signal(&ctx->outer.bg.cond);
        ddp__mutex_unlock(&ctx->outer.bg.lock);
        ddp__thread_join(ctx->outer.bg.thread);
        ddp__mutex_destroy(&ctx->outer.bg.lock);
        ddp__cond_destroy(&ctx->outer.bg.cond);
        ctx->outer.bg.started = 0;
    }
    if (ctx->outer.bg.stop_backend) ctx->outer.bg.stop_backend(ctx);
}
/* Replica groups on the chosen backend (ddp_init). The inner steps average within a group, the
   team (ddp__team_*): the CPU backend's buckets wait for and add the team's members only (>>cpu:
   ddp__span_*), the MPI backend's go through a communicator of the team (>>mpi), the NCCL
   backend's through an NCCL communicator of the team (>>nccl: ddp__gpu_init_team). A group of
   one rank averages nothing, so its buckets take the single backend's launch and finish (the backend's collectives still reach every rank: the outer
   exchange uses them). The slots that use the wire are wrapped so that they wait for an
   exchange in flight first. */
static ddp_result ddp__outer_backend(ddp_context *ctx) {
    if (ctx->desc.outer.mode == DDP_OUTER_OFF) return DDP_OK;
    if (ctx->outer.size > 1 && ctx->outer.groups > 1 && ctx->be->id == DDP_BACKEND_NCCL && ctx->desc.shard_optimizer)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc.outer: groups of %d ranks with shard_optimizer are not "
                         "built (yet) on the %s backend: unsharded, or group_size 1 or %d", ctx->outer.size, ctx->be->name,
                         ctx->world);
    /* the master in parts (bf16 parameters, sharded within a group): the outer step gathers it
       among the group (be->team_bcast), which the NCCL backend has not */
    if (ctx->desc.shard_optimizer && ctx->desc.param_dtype == DDP_DTYPE_BF16 && ctx->outer.size > 1 && !ctx->be->team_bcast)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc.outer: shard_optimizer with bf16 parameters (param_dtype) "
                         "in groups of %d ranks is not built (yet) on the %s backend (the CPU and MPI backends have it): "
                         "turn one of them off", ctx->outer.size, ctx->be->name);
    /* sharded parameters: the parameters themselves are in parts within a group, gathered for the
       outer step the same way */
    if (ctx->desc.shard == DDP_SHARD_PARAMETERS && ctx->outer.size > 1 && !ctx->be->team_bcast)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_desc.outer: DDP_SHARD_PARAMETERS in replica groups of %d ranks is "
                         "not built (yet) on the %s backend (the CPU backend has it): group_size 1 (each rank its own "
                         "replica, nothing sharded), or DDP_SHARD_OPTIMIZER", ctx->outer.size, ctx->be->name);
    /* (the NCCL backend's buckets follow the wire plan, which moves nothing for a group of one) */
    if (ctx->outer.size == 1 && ctx->world > 1 && ctx->be->id != DDP_BACKEND_NCCL) {
        ctx->table.launch = ddp__single_launch;
        ctx->table.finish = ddp__single_finish;
    }
    ctx->outer.bg.collective = ctx->table.collective;
    ctx->outer.bg.launch = ctx->table.launch;
    ctx->outer.bg.stop_backend = ctx->table.stop;
    ctx->table.collective = ddp__outer_collective;
    if (ctx->outer.size > 1) ctx->table.launch = ddp__outer_launch;
    ctx->table.stop = ddp__outer_stop;
    return DDP_OK;
}

/* Fragment f lands: the averaged outer gradient (outer.sum / groups) takes an outer Nesterov SGD
   step on the outer copy (torch.optim.SGD(nesterov=True): buf = momentum * buf + g, then
   g + momentum * buf; the first buf is g), and the parameters become the outer values, keeping
   mix of their own (streaming). bf16 parameters: the working copies follow, rounded. */
static ddp_result ddp__outer_merge(ddp_context *ctx, int f) {
    const ddp_outer *o = &ctx->desc.outer;
    size_t lo = ctx->outer.frag[f], n = ctx->outer.frag[f + 1] - lo, i;
    float *theta = ctx->outer.theta + lo, *p = ctx->outer.host, *sum = ctx->outer.sum;
    ddp_result r;
    float G = (float)ctx->outer.groups, mu = o->momentum, mix = o->mix;
    if (ddp__outer_plain_mean(ctx))
        for (i = 0; i < n; i++) theta[i] = ctx->outer.groups == 1 ? sum[i] : sum[i] / G;
    else
        for (i = 0; i < n; i++) {
            float g = ctx->outer.groups == 1 ? sum[i] : sum[i] / G;
            if (ctx->outer.mom) { float *b = ctx->outer.mom + lo + i; *b = mu * *b + g; g = g + mu * *b; }
            theta[i] -= o->lr * g;
        }
    ctx->outer.syncs++;
    ctx->outer.flight = -1;
    if (mix == 0) p = theta;
    else {   /* the parameters as they are now, delay_steps after the send */
        if ((r = ddp__outer_master_get(ctx, lo, n, p)) != DDP_OK) return ddp__fatal(ctx, r);
        for (i = 0; i < n; i++) p[i] = mix * p[i] + (1 - mix) * theta[i];
    }
    if ((r = ddp__outer_master_put(ctx, lo, n, p)) != DDP_OK) return ddp__fatal(ctx, r);
    /* sharded parameters in groups: the group's members read this rank's parts at their next
       gather (>>zero3), so none gathers before every part is written (the exchange is settled:
       the wire is free) */
    if (ddp__z3(ctx) && ddp__team_world(ctx) > 1) {
        ctx->what = "the outer step's barrier (sharded parameters: every part merged before any is gathered)";
        return ctx->outer.bg.collective(ctx, DDP__KIND_BARRIER, NULL, 0, 0);
    }
    return DDP_OK;
}

/* The fragment whose send step is inner step t (1, 2, ...), or -1: fragment f is sent at the
   steps t with (t + f * H / F) % H == 0. */
static int ddp__outer_due(const ddp_context *ctx, int64_t t) {
    int f, H = ctx->desc.outer.inner_steps, F = ctx->desc.outer.fragments;
    for (f = 0; f < F; f++)
        if ((t + (int64_t)f * H / F) % H == 0) return f;
    return -1;
}

/* After an inner step's update: the count, the fragment in flight merged when its delay is
   over, and the fragment due sent (merged at once without a delay). */
static ddp_result ddp__outer_step(ddp_context *ctx) {
    ddp_result r;
    int f;
    if (!ddp__outer_on(ctx)) return DDP_OK;
    if (ddp__in_backward(ctx)) return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_outer_step while a backward is in flight");
    ctx->outer.inner++;
    if (ctx->outer.flight >= 0 && ctx->outer.inner >= ctx->outer.lands) {
        if ((r = ddp__outer_settle(ctx)) != DDP_OK) return r;
        ddp__outer_times(ctx, ctx->outer.flight);
        if ((r = ddp__outer_merge(ctx, ctx->outer.flight)) != DDP_OK) return r;
    }
    if ((f = ddp__outer_due(ctx, ctx->outer.inner)) < 0) return DDP_OK;
    if ((r = ddp__outer_exchange(ctx, f)) != DDP_OK) return r;
    ctx->outer.flight = f;
    ctx->outer.lands = ctx->outer.inner + ctx->desc.outer.delay_steps;
    return ctx->desc.outer.delay_steps ? DDP_OK : ddp__outer_merge(ctx, f);
}

/* The program wrote parameters (ddp_copy_from_host, ddp_scatter_from_host; the same values on
   every rank): the outer copy takes them too, or the next outer step would pull the parameters
   back towards the values they had at commit. */
static ddp_result ddp__outer_params_set(ddp_context *ctx, ddp_buffer which, size_t offset, size_t count, ddp_result r) {
    if (r != DDP_OK || which != DDP_PARAMS || !count || !ddp__outer_on(ctx) || !ctx->outer.theta) return r;
    return ddp__outer_master_get(ctx, offset, count, ctx->outer.theta + offset);
}

static ddp_outer_status ddp__outer_status(const ddp_context *ctx) {
    ddp_outer_status s;
    memset(&s, 0, sizeof s);
    s.groups = ctx->outer.groups;
    s.group = ctx->outer.group;
    s.group_size = ctx->outer.size;
    s.group_rank = ctx->outer.index;
    s.inner_steps = ctx->outer.inner;
    s.syncs = ctx->outer.syncs;
    s.in_flight = ctx->outer.flight;
    s.exchange_ms = ctx->outer.exchange_ms;
    s.wait_ms = ctx->outer.wait_ms;
    s.straggler_ms = ctx->outer.straggler_ms;
    s.slowest_group = ctx->outer.slowest_group;
    return s;
}

/* --------------------------------------------------------------------------------------------
   >>checkpoint  ddp_save / ddp_load / ddp_save_check. One file, written and read by rank 0: the
   state reaches it through ddp__gather_to_host / ddp__scatter_from_host in chunks of
   DDP__CKPT_CHUNK floats (no full host copy anywhere), so the file is the same whatever the
   world size or sharding of the run that wrote it, and any run loads it. (One file per rank plus
   an index would need a commit across files; one rename commits one file.) Format, little-endian,
   every integer at its stated width:
     "DDP-CKPT" u32 version u32 world u32 sharded u32 num_params i64 step u64 floats u64 user_bytes
     u32 num_shards u32 0 | num_shards x u64 the floats the shards before it hold (num_shards: world
     if sharded, else 1; version 2: a replica group's size; hybrid sharding: the shard group's; a
     divisor of world) | num_params x (u32 name
     length, name, u64 count, u32 flags) | parameters, then m, then v, each parameter's floats in
     registration order (no padding) | the user blob | u64 checksum of every byte before it
     (ddp__sum_add: FNV-1a's step on 64-bit words in four lanes, then FNV-1a of lanes and tail).
   Version 2 (written only with the outer sync on; version 1 otherwise, so an older ddp.h reads
   every file of a run without it; both are read) is version 1 plus the outer state, in two places:
     after the parameter table, the outer block: u32 groups u32 group_size u32 mode u32
       inner_steps u32 fragments u32 delay_steps u32 wire u32 quant_block f32 lr f32 momentum f32
       mix u32 flags (1: momentum stored; 2: the sum holds parameters, ddp__outer_plain_mean) i64
       inner i64 syncs i32 flight (-1: none) u32 0 i64 lands u64 flat_count u64 sum_lo u64
       sum_floats | num_params x u64 each parameter's offset in the flat buffer (the layout the
       in-flight sum's flat range refers to);
     after v, before the user blob: theta (the fp32 outer parameters), then momentum (flag 1),
       each in registration order like the parameters; then groups 1 .. groups - 1's parameters,
       m and v (the parameters, m, v above are group 0's, rank 0's own); then the in-flight
       fragment's sum of the groups' outer gradients, sum_floats floats of the flat buffer from
       sum_lo, padding included (as decoded, before the division by the groups).
   What a load makes of it (another group count, the outer sync off, a file without the outer
   state): CHECKPOINTS in the manual, and ddp__ckpt_outer_load.
   Writing: a path that is not a regular file or symlink is refused first (rename would replace
   a FIFO or device node); a temporary PATH.tmp.<pid>.<random> (O_CREAT|O_EXCL|O_NOFOLLOW), fsync, rename,
   fsync of the directory; temporaries of writers that died are swept first. Reading: the kind
   of file (a FIFO is refused, not waited on), the header against the file's length, the
   checksum, then the caller's check of the user blob, then the parameters against this model by
   name; only then a second pass puts the state in place, checksumming again (a file that
   changes in between fails the group: the state is partly overwritten). Rank 0's verdict and
   message reach every rank through a broadcast (ddp__ckpt_share), so no rank waits for ever and
   each names rank 0's reason.
   -------------------------------------------------------------------------------------------- */
#define DDP__CKPT_MAGIC "DDP-CKPT"
#define DDP__CKPT_VERSION 1u                /* without the outer state */
#define DDP__CKPT_VERSION_OUTER 2u          /* with it (the outer block and arrays) */
#define DDP__CKPT_FIXED 56u                 /* bytes before the shard table */
#define DDP__CKPT_OUTER_FIXED 104u          /* the outer block before its offset table */
#ifndef DDP__CKPT_CHUNK                     /* tests make it small, to stream in many chunks */
#define DDP__CKPT_CHUNK ((size_t)1 << 20)   /* floats per gather / scatter: 4 MiB on rank 0 */
#endif
#define DDP__FNV_INIT 1469598103934665603ull

/* The optimizer's sharding as a checkpoint records it (information only: the data is stored
   whole, so any world size and either mode loads it). Sharded, rank s holds a part of every
   bucket (ddp__shard_range); the table's entry s is the number of floats the ranks before s
   hold, so it starts at 0 and grows, and the difference of two entries is a rank's share. */
static int ddp__ckpt_sharded(const ddp_context *ctx) { return ddp__sharded(ctx); }
static uint64_t ddp__ckpt_shard_start(const ddp_context *ctx, int shard) {
    uint64_t before = 0;
    size_t lo, hi;
    int s, b;
    for (s = 0; s < shard; s++)
        for (b = 0; b < ctx->model.num_buckets; b++) { ddp__shard_range(ctx, b, s, &lo, &hi); before += hi - lo; }
    return before;
}

static uint64_t ddp__fnv1a(const void *data, size_t n, uint64_t h) {
    const unsigned char *p = (const unsigned char *)data;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void ddp__put_le(unsigned char *b, uint64_t x, int bytes) {
    int i;
    for (i = 0; i < bytes; i++) b[i] = (unsigned char)(x >> (8 * i));
}
static uint64_t ddp__get_le(const unsigned char *b, int bytes) {
    uint64_t x = 0;
    int i;
    for (i = bytes - 1; i >= 0; i--) x = (x << 8) | b[i];
    return x;
}

/* The checksum: FNV-1a's step on 64-bit little-endian words, four independent lanes (lane k
   takes word k of every 32-byte block), then FNV-1a over the four lanes, the bytes of the last
   partial block and the length. Any change to one word changes its lane (each step is a
   bijection), like FNV-1a on bytes, at ~15x its speed (a checkpoint is read twice). */
typedef struct ddp__ckpt_sum { uint64_t lane[4], total; unsigned char tail[32]; size_t ntail; } ddp__ckpt_sum;
static void ddp__sum_init(ddp__ckpt_sum *s) {
    int k;
    memset(s, 0, sizeof *s);
    for (k = 0; k < 4; k++) s->lane[k] = (uint64_t)DDP__FNV_INIT + (uint64_t)k;
}
static uint64_t ddp__le64(const unsigned char *p) {
    uint64_t x;
    memcpy(&x, p, 8);
#if defined(__BYTE_ORDER__) && defined(__ORDER_BIG_ENDIAN__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    x = __builtin_bswap64(x);
#endif
    return x;
}
static void ddp__sum_blocks(ddp__ckpt_sum *s, const unsigned char *p, size_t blocks) {
    uint64_t l0 = s->lane[0], l1 = s->lane[1], l2 = s->lane[2], l3 = s->lane[3];
    size_t i;
    for (i = 0; i < blocks; i++, p += 32) {
        l0 = (l0 ^ ddp__le64(p)) * 1099511628211ull;
        l1 = (l1 ^ ddp__le64(p + 8)) * 1099511628211ull;
        l2 = (l2 ^ ddp__le64(p + 16)) * 1099511628211ull;
        l3 = (l3 ^ ddp__le64(p + 24)) * 1099511628211ull;
    }
    s->lane[0] = l0; s->lane[1] = l1; s->lane[2] = l2; s->lane[3] = l3;
}
static void ddp__sum_add(ddp__ckpt_sum *s, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    s->total += n;
    if (s->ntail) {
        size_t take = 32 - s->ntail < n ? 32 - s->ntail : n;
        memcpy(s->tail + s->ntail, p, take);
        s->ntail += take; p += take; n -= take;
        if (s->ntail < 32) return;
        ddp__sum_blocks(s, s->tail, 1);
        s->ntail = 0;
    }
    ddp__sum_blocks(s, p, n / 32);
    memcpy(s->tail, p + n / 32 * 32, n % 32);
    s->ntail = n % 32;
}
static uint64_t ddp__sum_value(const ddp__ckpt_sum *s) {
    unsigned char b[40];
    int k;
    for (k = 0; k < 4; k++) ddp__put_le(b + 8 * k, s->lane[k], 8);
    ddp__put_le(b + 32, s->total, 8);
    return ddp__fnv1a(b + 32, 8, ddp__fnv1a(s->tail, s->ntail, ddp__fnv1a(b, 32, DDP__FNV_INIT)));
}

/* What rank 0 tells every rank: its verdict (code, message) and what the file holds. */
typedef struct ddp__ckpt_status {
    int32_t code, world, sharded, pad;
    int64_t step;
    uint64_t user_bytes;
    /* the outer block (groups 0: none in the file) and what this run makes of it */
    int32_t groups, group_size, flags, flight;
    int64_t inner, syncs, lands;
    uint64_t sum_lo, sum_floats, data_floats;   /* data_floats: every array's floats, rank 0's */
    int32_t keep, fragments;   /* keep: the fragment in flight stays in flight (same schedule and layout) */
    char msg[DDP__ERR_MAX - 64];
} ddp__ckpt_status;

static void ddp__ckpt_refuse(ddp__ckpt_status *st, ddp_result code, const char *fmt, ...) {
    va_list ap;
    if (st->code != DDP_OK) return;   /* the first reason is the one that counts */
    st->code = (int32_t)code;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
}

/* Rank 0's status to every rank; a refusal becomes each rank's error, naming rank 0 elsewhere.
   The ranks stay in step (everyone returns here), so the context stays usable. */
static ddp_result ddp__ckpt_share(ddp_context *ctx, ddp__ckpt_status *st, const char *verb, const char *path) {
    ddp_result r;
    if (ctx->world > 1) {
        ctx->what = "a checkpoint's verdict from rank 0";
        if ((r = ctx->be->collective(ctx, DDP__KIND_BROADCAST, st, sizeof *st, 0)) != DDP_OK) return r;
    }
    st->msg[sizeof st->msg - 1] = 0;
    if (st->code == DDP_OK) return DDP_OK;
    if (ctx->rank == 0) return ddp__fail(ctx, (ddp_result)st->code, "%s", st->msg);
    return ddp__fail(ctx, (ddp_result)st->code, "rank 0 could not %s the checkpoint '%s': %s", verb, path, st->msg);
}

/* The directory of `path` and the file's own name in it. */
static void ddp__ckpt_split(const char *path, char *dir, size_t n, const char **base) {
    const char *slash = ddp__last_sep(path);
    if (!slash) { snprintf(dir, n, "."); *base = path; return; }
    snprintf(dir, n, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    *base = slash + 1;
}

/* Temporaries PATH.tmp.<pid>.<16 hex> this user's dead writers left (a SIGKILL mid-write):
   removed. Another user's, a live writer's, and anything not a plain file stay. */
typedef struct ddp__ckpt_sweep_args { const char *dir; size_t plen; } ddp__ckpt_sweep_args;
static void ddp__ckpt_sweep_one(void *user, const char *name) {
    const ddp__ckpt_sweep_args *a = (const ddp__ckpt_sweep_args *)user;
    char *end;
    long pid;
    errno = 0;
    pid = strtol(name + a->plen, &end, 10);
    if (errno || pid <= 0 || *end != '.' || strlen(end + 1) != 16 || strspn(end + 1, "0123456789abcdef") != 16) return;
    if (pid == (long)ddp__getpid() || ddp__pid_alive((int)pid)) return;
    ddp__file_remove_plain(a->dir, name);
}
static void ddp__ckpt_sweep(const char *path) {
    char dir[PATH_MAX], prefix[PATH_MAX + 8];
    const char *base;
    ddp__ckpt_sweep_args a;
    ddp__ckpt_split(path, dir, sizeof dir, &base);
    snprintf(prefix, sizeof prefix, "%s.tmp.", base);
    a.dir = dir;
    a.plen = strlen(prefix);
    ddp__dir_each(dir, prefix, ddp__ckpt_sweep_one, &a);
}

/* Why the temporary could not be created, in words: a name too long for the file system is
   told with its numbers (the temporary's name is the checkpoint's plus DDP__CKPT_TMP_EXTRA). */
#define DDP__CKPT_TMP_EXTRA 29   /* ".tmp." + a pid of up to 7 digits + "." + 16 hex digits */
static const char *ddp__ckpt_temp_error(const char *path, int err, char *out, size_t n) {
    char dir[PATH_MAX];
    const char *base;
    long max;
    if (err != ENAMETOOLONG) return ddp__strerror(err);
    ddp__ckpt_split(path, dir, sizeof dir, &base);
    max = ddp__name_max(dir);
    if (max <= 0) max = 255;
    snprintf(out, n, "the file name '%s' is %zu bytes, and its temporary's (%d more) must fit the file system's "
             "limit of %ld: use a name of at most %ld bytes", base, strlen(base), DDP__CKPT_TMP_EXTRA, max,
             max - DDP__CKPT_TMP_EXTRA);
    return out;
}

/* A new temporary next to `path` under a name nobody can guess (so nobody plants a symlink
   there first; O_EXCL|O_NOFOLLOW refuse one anyway). -1 with errno set on failure. */
static int ddp__ckpt_create_temp(const char *path, char *tmp, size_t n) {
    int attempt;
    for (attempt = 0; attempt < 16; attempt++) {
        uint64_t rnd = 0;
        int fd = -1;
        if (ddp__os_random(&rnd, sizeof rnd)) { errno = EIO; return -1; }
        if ((size_t)snprintf(tmp, n, "%s.tmp.%ld.%016llx", path, (long)ddp__getpid(), (unsigned long long)rnd) >= n) {
            errno = ENAMETOOLONG;
            return -1;
        }
        fd = ddp__file_create_excl(tmp);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1;
}

/* fsync the directory holding `path`: a rename is durable only once its directory is. */
static int ddp__ckpt_sync_dir(const char *path) {
    char dir[PATH_MAX];
    const char *base;
    ddp__ckpt_split(path, dir, sizeof dir, &base);
    return ddp__dir_sync(dir);
}

typedef struct ddp__ckpt_file {
    int fd, err;        /* err: errno of the first failure (later writes are skipped) */
    uint64_t pos, size;
    ddp__ckpt_sum sum;
} ddp__ckpt_file;

static void ddp__ckpt_write(ddp__ckpt_file *f, const void *data, size_t n, int hashed) {
    const char *p = (const char *)data;
    if (f->err) return;
    if (hashed) ddp__sum_add(&f->sum, data, n);
    while (n > 0) {
        long w = ddp__file_write(f->fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) { f->err = w < 0 ? errno : ENOSPC; return; }
        p += w;
        n -= (size_t)w;
        f->pos += (uint64_t)w;
    }
}

/* n bytes at the reader's position, checksummed; 0 when the file ends first (f->err: EIO on a
   read error). */
static int ddp__ckpt_read(ddp__ckpt_file *f, void *data, size_t n, int hashed) {
    char *p = (char *)data;
    size_t left = n;
    if (f->err || n > f->size - f->pos) return 0;
    while (left > 0) {
        long got = ddp__file_pread(f->fd, p, left, f->pos);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) { f->err = got < 0 ? errno : EIO; return 0; }
        p += got;
        left -= (size_t)got;
        f->pos += (uint64_t)got;
    }
    if (hashed) ddp__sum_add(&f->sum, data, n);
    return 1;
}

/* The outer block (version 2) of this run's outer state, DDP__CKPT_OUTER_FIXED bytes and the
   parameters' offsets. Every rank holds the same outer state, so rank 0's is the one. */
static void ddp__ckpt_outer_block(const ddp_context *ctx, unsigned char *b) {
    const ddp_outer *o = &ctx->desc.outer;
    int flight = ctx->outer.flight, i;
    uint64_t lo = flight >= 0 ? ctx->outer.frag[flight] : 0, n = flight >= 0 ? ctx->outer.frag[flight + 1] - lo : 0;
    uint32_t bits[3];
    memcpy(&bits[0], &o->lr, 4);
    memcpy(&bits[1], &o->momentum, 4);
    memcpy(&bits[2], &o->mix, 4);
    ddp__put_le(b, (uint64_t)ctx->outer.groups, 4);
    ddp__put_le(b + 4, (uint64_t)ctx->outer.size, 4);
    ddp__put_le(b + 8, (uint64_t)o->mode, 4);
    ddp__put_le(b + 12, (uint64_t)o->inner_steps, 4);
    ddp__put_le(b + 16, (uint64_t)o->fragments, 4);
    ddp__put_le(b + 20, (uint64_t)o->delay_steps, 4);
    ddp__put_le(b + 24, (uint64_t)o->wire, 4);
    ddp__put_le(b + 28, (uint64_t)o->quant_block, 4);
    for (i = 0; i < 3; i++) ddp__put_le(b + 32 + 4 * i, bits[i], 4);
    ddp__put_le(b + 44, (uint64_t)((ctx->outer.mom ? 1 : 0) | (ddp__outer_plain_mean(ctx) ? 2 : 0)), 4);
    ddp__put_le(b + 48, (uint64_t)ctx->outer.inner, 8);
    ddp__put_le(b + 56, (uint64_t)ctx->outer.syncs, 8);
    ddp__put_le(b + 64, (uint64_t)(uint32_t)flight, 4);
    ddp__put_le(b + 68, 0, 4);
    ddp__put_le(b + 72, (uint64_t)(flight >= 0 ? ctx->outer.lands : 0), 8);
    ddp__put_le(b + 80, ctx->flat.count, 8);
    ddp__put_le(b + 88, lo, 8);
    ddp__put_le(b + 96, n, 8);
    for (i = 0; i < ctx->model.num_params; i++) ddp__put_le(b + DDP__CKPT_OUTER_FIXED + 8 * (size_t)i, ctx->model.params[i].offset, 8);
}

/* The header of this model's state as rank 0 writes it; NULL when out of memory. */
static unsigned char *ddp__ckpt_header(ddp_context *ctx, uint64_t user_bytes, size_t *len) {
    int i, shards = ddp__ckpt_sharded(ctx) ? ddp__team_world(ctx) : 1;   /* replica groups: a group's members */
    size_t n = DDP__CKPT_FIXED + 8 * (size_t)shards, at;
    uint64_t floats = 0;
    unsigned char *h;
    for (i = 0; i < ctx->model.num_params; i++) { n += 16 + strlen(ctx->model.params[i].name); floats += ctx->model.params[i].count; }
    if (ddp__outer_on(ctx)) n += DDP__CKPT_OUTER_FIXED + 8 * (size_t)ctx->model.num_params;
    if (!(h = (unsigned char *)DDP_MALLOC(n))) return NULL;
    memcpy(h, DDP__CKPT_MAGIC, 8);
    ddp__put_le(h + 8, ddp__outer_on(ctx) ? DDP__CKPT_VERSION_OUTER : DDP__CKPT_VERSION, 4);
    ddp__put_le(h + 12, (uint64_t)ctx->world, 4);
    ddp__put_le(h + 16, (uint64_t)ddp__ckpt_sharded(ctx), 4);
    ddp__put_le(h + 20, (uint64_t)ctx->model.num_params, 4);
    ddp__put_le(h + 24, (uint64_t)ctx->adam.step, 8);
    ddp__put_le(h + 32, floats, 8);
    ddp__put_le(h + 40, user_bytes, 8);
    ddp__put_le(h + 48, (uint64_t)shards, 4);
    ddp__put_le(h + 52, 0, 4);
    at = DDP__CKPT_FIXED;
    for (i = 0; i < shards; i++, at += 8) ddp__put_le(h + at, ddp__ckpt_shard_start(ctx, i), 8);
    for (i = 0; i < ctx->model.num_params; i++) {
        const ddp__param *p = &ctx->model.params[i];
        size_t l = strlen(p->name);
        ddp__put_le(h + at, l, 4);
        memcpy(h + at + 4, p->name, l);
        ddp__put_le(h + at + 4 + l, p->count, 8);
        ddp__put_le(h + at + 12 + l, p->flags, 4);
        at += 16 + l;
    }
    if (ddp__outer_on(ctx)) ddp__ckpt_outer_block(ctx, h + at);
    *len = n;
    return h;
}

/* Every parameter's floats of one buffer, in registration order, chunk by chunk: a gather
   (save) or scatter (load) on every rank; rank 0 writes or reads `f` (NULL elsewhere). A chunk
   rank 0 cannot read goes out as zeros and leaves f->err set. */
static ddp_result ddp__ckpt_stream(ddp_context *ctx, ddp_buffer which, ddp__ckpt_file *f, float *buf, int save) {
    int i;
    ddp_result r = DDP_OK;
    for (i = 0; i < ctx->model.num_params && r == DDP_OK; i++) {
        size_t done, n, count = ctx->model.params[i].count, offset = ctx->model.params[i].offset;
        for (done = 0; done < count && r == DDP_OK; done += n) {
            n = count - done < DDP__CKPT_CHUNK ? count - done : DDP__CKPT_CHUNK;
            if (save) {
                r = ddp__gather_to_host(ctx, which, offset + done, f ? buf : NULL, n, 0);
                if (r == DDP_OK && f) ddp__ckpt_write(f, buf, n * sizeof(float), 1);
            } else {
                if (f && !ddp__ckpt_read(f, buf, n * sizeof(float), 1)) memset(buf, 0, n * sizeof(float));
                r = ddp__scatter_from_host(ctx, which, offset + done, f ? buf : NULL, n, 0);
            }
        }
    }
    return r;
}

/* Flat elements [at, at + n) of `which` held in parts (shard_optimizer within replica groups:
   m and v; with bf16 parameters the master too), buf holding them. Save: member s of the group whose first rank is `src` holds
   piece s of each bucket and broadcasts it to rank 0 (every rank walks the same pieces). Load
   (every rank has buf): this rank takes its own pieces. */
static ddp_result ddp__ckpt_parts(ddp_context *ctx, ddp_buffer which, float *flat, float *buf, size_t at, size_t n, int src,
                                  int save) {
    size_t lo, hi, a, z;
    ddp_result r = DDP_OK;
    int b, s;
    for (b = 0; b < ctx->model.num_buckets && r == DDP_OK; b++)
        for (s = 0; s < ddp__team_world(ctx) && r == DDP_OK; s++) {
            float *local;
            ddp__shard_range(ctx, b, s, &lo, &hi);
            a = lo > at ? lo : at;
            z = hi < at + n ? hi : at + n;
            if (z <= a) continue;
            local = flat + (which == DDP_PARAMS && ddp__z3_flat_parts(ctx) ? a : ctx->shard.base[b] + (a - lo));   /* ZeRO-3: flat-indexed */
            if (!save) {   /* (the master: every working copy of the chunk too, below) */
                if (s == ddp__team_rank(ctx) && which != DDP_PARAMS) r = ddp__state_copy(ctx, which, local, a, buf + (a - at), z - a, 0);
                continue;
            }
            if (ctx->rank == src + s) r = ddp__state_copy(ctx, which, local, a, buf + (a - at), z - a, 1);
            if (r == DDP_OK && src + s != 0) {
                ctx->what = "ddp_save's broadcast of a replica group's state";
                r = ctx->be->collective(ctx, DDP__KIND_BROADCAST, buf + (a - at), (z - a) * sizeof(float), src + s);
            }
        }
    if (r == DDP_OK && !save && which == DDP_PARAMS) r = ddp__outer_master_put(ctx, at, n, buf);
    return r;
}

/* One array of the outer state, parameter by parameter (registration order, no padding), chunk
   by chunk; buf holds a chunk on every rank. Save: the values of rank `src`'s `which` (sent to
   rank 0 by a broadcast, the collective every backend has), or, host != NULL, of the host array
   every rank holds alike (rank 0's own: nothing is sent); rank 0 writes them. Load: rank 0 reads
   them (zeros for a chunk it cannot read, f->err set); unless `skip` (no rank takes them: read
   for the checksum only) every rank receives them, and a rank with `take` puts them into `host`,
   or into `which` (bf16 parameters: the working copies follow). */
static ddp_result ddp__ckpt_outer_stream(ddp_context *ctx, ddp__ckpt_file *f, float *buf, int save, ddp_buffer which,
                                         float *host, int src, int take, int skip) {
    float *flat = NULL;
    ddp_result r = DDP_OK;
    int i;
    if (!host && (r = ddp__state_buffer(ctx, which, 0, buf, 0, save ? "ddp_save" : "ddp_load", &flat)) != DDP_OK) return r;
    for (i = 0; i < ctx->model.num_params && r == DDP_OK; i++) {
        size_t done, n, count = ctx->model.params[i].count, offset = ctx->model.params[i].offset;
        for (done = 0; done < count && r == DDP_OK; done += n) {
            size_t at = offset + done;
            n = count - done < DDP__CKPT_CHUNK ? count - done : DDP__CKPT_CHUNK;
            if (save && !host && ddp__in_parts(ctx, which)) {
                r = ddp__ckpt_parts(ctx, which, flat, buf, at, n, src, 1);
                if (r == DDP_OK && f) ddp__ckpt_write(f, buf, n * sizeof(float), 1);
                continue;
            }
            if (save) {
                if (!host && ctx->rank == src) r = ddp__state_copy(ctx, which, flat ? flat + at : NULL, at, buf, n, 1);
                if (r == DDP_OK && !host && src != 0) {
                    ctx->what = "ddp_save's broadcast of a replica group's state";
                    r = ctx->be->collective(ctx, DDP__KIND_BROADCAST, buf, n * sizeof(float), src);
                }
                if (r == DDP_OK && f) ddp__ckpt_write(f, host ? host + at : buf, n * sizeof(float), 1);
                continue;
            }
            if (f && !ddp__ckpt_read(f, buf, n * sizeof(float), 1)) memset(buf, 0, n * sizeof(float));
            if (skip) continue;
            if (ctx->world > 1) {
                ctx->what = "ddp_load's broadcast of the outer state";
                if ((r = ctx->be->collective(ctx, DDP__KIND_BROADCAST, buf, n * sizeof(float), 0)) != DDP_OK) break;
            }
            if (!take) continue;
            if (host) memcpy(host + at, buf, n * sizeof(float));
            else if (ddp__in_parts(ctx, which)) r = ddp__ckpt_parts(ctx, which, flat, buf, at, n, 0, 0);
            else r = ddp__state_written(ctx, which, at, n, ddp__state_copy(ctx, which, flat ? flat + at : NULL, at, buf, n, 0));
        }
    }
    return r;
}

/* ddp_save with the outer sync on, after group 0's parameters, m and v (rank 0's own): theta,
   momentum, every other group's parameters, m and v (from the group's first rank: every rank of
   a group holds the same; held in parts, from each part's holder: ddp__ckpt_parts), the
   in-flight fragment's sum. The outer state is alike on every rank:
   rank 0 writes its own (ddp__save settled the exchange in flight first: outer.sum is whole). */
static ddp_result ddp__ckpt_outer_save(ddp_context *ctx, ddp__ckpt_file *f) {
    float *buf = (float *)DDP_MALLOC(DDP__CKPT_CHUNK * sizeof(float));
    ddp_result r = DDP_OK;
    int g, k, flight = ctx->outer.flight;
    static const ddp_buffer state[3] = { DDP_PARAMS, DDP_ADAM_M, DDP_ADAM_V };
    if (!buf) return ddp__fail_group(ctx, DDP_ERR_OUT_OF_MEMORY, "ddp_save: no memory for a chunk of the outer state (%zu floats)",
                                     (size_t)DDP__CKPT_CHUNK);
    r = ddp__ckpt_outer_stream(ctx, f, buf, 1, DDP_PARAMS, ctx->outer.theta, 0, 0, 0);
    if (r == DDP_OK && ctx->outer.mom) r = ddp__ckpt_outer_stream(ctx, f, buf, 1, DDP_PARAMS, ctx->outer.mom, 0, 0, 0);
    for (g = 1; g < ctx->outer.groups && r == DDP_OK; g++)
        for (k = 0; k < 3 && r == DDP_OK; k++) r = ddp__ckpt_outer_stream(ctx, f, buf, 1, state[k], NULL, g * ctx->outer.size, 0, 0);
    if (r == DDP_OK && f && flight >= 0)
        ddp__ckpt_write(f, ctx->outer.sum, (ctx->outer.frag[flight + 1] - ctx->outer.frag[flight]) * sizeof(float), 1);
    DDP_FREE(buf);
    return r;
}

/* A fragment that was in flight in the saved run but cannot stay in flight in this one (it cuts
   or schedules fragments otherwise): it lands at the load. n floats of its sum (sum, from flat
   element `at` of the saved layout: soff) are mapped parameter by parameter to this layout and
   take this run's outer step, as ddp__outer_merge does: the average outer gradient (the saved
   sum over the saved group count; a saved plain mean's parameters become theta minus them),
   Nesterov momentum, theta -= lr * g, the parameters to theta (mixed). The parameters go
   through `stage` (n floats of host memory: they may be device memory). */
static ddp_result ddp__ckpt_outer_land(ddp_context *ctx, const ddp__ckpt_status *st, const uint64_t *soff, uint64_t at,
                                       const float *sum, size_t n, float *stage) {
    const ddp_outer *o = &ctx->desc.outer;
    float Gs = (float)st->groups, mu = o->momentum, mix = o->mix;
    ddp_result r = DDP_OK;
    int i;
    for (i = 0; i < ctx->model.num_params && r == DDP_OK; i++) {
        uint64_t lo = soff[i], hi = soff[i] + ctx->model.params[i].count, a = lo > at ? lo : at, z = hi < at + n ? hi : at + n, j;
        size_t to, len;
        if (z <= a) continue;
        to = ctx->model.params[i].offset + (size_t)(a - lo);
        len = (size_t)(z - a);
        if ((r = ddp__outer_master_get(ctx, to, len, stage)) != DDP_OK) break;
        for (j = 0; j < len; j++) {
            float *theta = ctx->outer.theta + to + j;
            float avg = st->groups == 1 ? sum[a - at + j] : sum[a - at + j] / Gs;
            float g = st->flags & 2 ? *theta - avg : avg;
            if (ctx->outer.mom) { float *b = ctx->outer.mom + to + j; *b = mu * *b + g; g = g + mu * *b; }
            *theta -= o->lr * g;
            stage[j] = mix == 0 ? *theta : mix * stage[j] + (1 - mix) * *theta;
        }
        r = ddp__outer_master_put(ctx, to, len, stage);
    }
    return r;
}

/* ddp_load's outer part, after group 0's parameters, m and v reached every rank. What a file's
   outer state (st->groups > 0) becomes in this run:
   - the outer sync on: this run's group g takes the saved group g mod G_saved's parameters, m
     and v (the same group count: its own; more groups: some start alike and part with their
     data; fewer: the saved groups past them are dropped); theta and momentum are every rank's
     (momentum zeros where the file has none, ignored where this run keeps none); inner steps and
     syncs as saved; the fragment in flight stays in flight, landing when it would have, when this
     run cuts and schedules fragments alike (st->keep; its sum scaled to this group count), and
     lands at the load otherwise (ddp__ckpt_outer_land);
   - the outer sync off: group 0's state only, loaded already; the rest is read for the checksum.
   A file without outer state into a run with it: theta = the loaded parameters, momentum 0, the
   schedule from its start (inner step 0, nothing in flight). soff: the saved layout (rank 0's). */
static ddp_result ddp__ckpt_outer_load(ddp_context *ctx, ddp__ckpt_file *f, const ddp__ckpt_status *st, const uint64_t *soff) {
    static const ddp_buffer state[3] = { DDP_PARAMS, DDP_ADAM_M, DDP_ADAM_V };
    int on = ddp__outer_on(ctx), Gs = st->groups, G = ctx->outer.groups, s, k, land = on && Gs && st->flight >= 0 && !st->keep;
    uint64_t *offs = NULL, done, n;
    float *buf;
    ddp_result r = DDP_OK;
    if (!Gs) {
        if (!on) return DDP_OK;
        if (ctx->outer.mom) memset(ctx->outer.mom, 0, ctx->flat.count * sizeof(float));
        ctx->outer.inner = ctx->outer.syncs = ctx->outer.lands = 0;
        ctx->outer.flight = -1;
        return ddp__outer_master_get(ctx, 0, ctx->flat.count, ctx->outer.theta);
    }
    buf = (float *)DDP_MALLOC(2 * DDP__CKPT_CHUNK * sizeof(float));   /* a chunk, and the landing fragment's stage */
    if (land) offs = (uint64_t *)DDP_MALLOC(sizeof(uint64_t) * (size_t)ctx->model.num_params + 1);
    if (!buf || (land && !offs)) {
        DDP_FREE(buf);
        DDP_FREE(offs);
        return ddp__fail_group(ctx, DDP_ERR_OUT_OF_MEMORY, "ddp_load: no memory for a chunk of the outer state (%zu floats)",
                               (size_t)DDP__CKPT_CHUNK);
    }
    if (land) {   /* the saved layout, to map the landing fragment's floats */
        if (ctx->rank == 0) memcpy(offs, soff, sizeof(uint64_t) * (size_t)ctx->model.num_params);
        ctx->what = "ddp_load's broadcast of the saved layout";
        if (ctx->world > 1) r = ctx->be->collective(ctx, DDP__KIND_BROADCAST, offs, sizeof(uint64_t) * (size_t)ctx->model.num_params, 0);
    }
    if (r == DDP_OK) r = ddp__ckpt_outer_stream(ctx, f, buf, 0, DDP_PARAMS, ctx->outer.theta, 0, 1, !on);
    if (r == DDP_OK && (st->flags & 1)) r = ddp__ckpt_outer_stream(ctx, f, buf, 0, DDP_PARAMS, ctx->outer.mom, 0, 1, !ctx->outer.mom);
    else if (ctx->outer.mom) memset(ctx->outer.mom, 0, ctx->flat.count * sizeof(float));
    for (s = 1; s < Gs && r == DDP_OK; s++)   /* saved group s: this run's groups g with g % Gs == s take it */
        for (k = 0; k < 3 && r == DDP_OK; k++)
            r = ddp__ckpt_outer_stream(ctx, f, buf, 0, state[k], NULL, 0, on && ctx->outer.group % Gs == s, !on || s >= G);
    for (done = 0; done < st->sum_floats && r == DDP_OK; done += n) {
        n = st->sum_floats - done < DDP__CKPT_CHUNK ? st->sum_floats - done : DDP__CKPT_CHUNK;
        if (f && !ddp__ckpt_read(f, buf, (size_t)n * sizeof(float), 1)) memset(buf, 0, (size_t)n * sizeof(float));
        if (!on) continue;
        ctx->what = "ddp_load's broadcast of the outer sum in flight";
        if (ctx->world > 1 && (r = ctx->be->collective(ctx, DDP__KIND_BROADCAST, buf, (size_t)n * sizeof(float), 0)) != DDP_OK) break;
        if (land) r = ddp__ckpt_outer_land(ctx, st, offs, st->sum_lo + done, buf, (size_t)n, buf + DDP__CKPT_CHUNK);
        else {
            uint64_t j;
            for (j = 0; j < n; j++) ctx->outer.sum[done + j] = Gs == G ? buf[j] : buf[j] / (float)Gs * (float)G;
        }
    }
    if (r == DDP_OK && on) {
        ctx->outer.inner = st->inner;
        ctx->outer.syncs = st->syncs + (land ? 1 : 0);
        ctx->outer.flight = st->flight >= 0 && st->keep ? st->flight : -1;
        ctx->outer.lands = ctx->outer.flight >= 0 ? st->lands : 0;
    }
    DDP_FREE(buf);
    DDP_FREE(offs);
    return r;
}

/* Tests only (DDP_TEST_KILL_POINTS): DDP_TEST_DIE_IN_CHECKPOINT=S SIGKILLs rank 0 in the middle
   of writing the checkpoint of AdamW step S: header and parameters written, m and v not. */
static void ddp__ckpt_kill_point(const ddp_context *ctx) {
#ifdef DDP_TEST_KILL_POINTS
    const char *die = getenv("DDP_TEST_DIE_IN_CHECKPOINT");
    if (ctx->rank == 0 && die && *die && strtoll(die, NULL, 10) == (long long)ctx->adam.step) ddp__kill_self();
#else
    (void)ctx;
#endif
}

static ddp_result ddp__save(ddp_context *ctx, const char *path, const void *user, size_t user_bytes) {
    ddp__ckpt_status st;
    ddp__ckpt_file f;
    char tmp[PATH_MAX + 64];
    unsigned char *hdr = NULL, sum[8];
    float *buf = NULL;
    size_t hdr_len = 0;
    ddp_result r;
    int renamed = 0;
    if (ddp__in_backward(ctx)) return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_save while a backward is in flight (call it between steps)");
    if ((r = ddp__outer_settle(ctx)) != DDP_OK) return r;   /* the exchange in flight has landed in outer.sum */
    if ((r = ctx->be->adamw_state(ctx)) != DDP_OK) return ddp__fatal(ctx, r);   /* the peers are on their way to the broadcast */
    memset(&st, 0, sizeof st);
    memset(&f, 0, sizeof f);
    f.fd = -1;
    ddp__sum_init(&f.sum);
    tmp[0] = 0;
    if (ctx->rank == 0) {
        hdr = ddp__ckpt_header(ctx, user_bytes, &hdr_len);
        buf = (float *)DDP_MALLOC(DDP__CKPT_CHUNK * sizeof(float));
        if (!hdr || !buf) ddp__ckpt_refuse(&st, DDP_ERR_OUT_OF_MEMORY, "no memory to write the checkpoint '%s'", path);
        if (st.code == DDP_OK) {   /* rename would replace a FIFO or device node (as root: /dev/full) */
            const char *kind = ddp__path_kind(path);
            if (kind)
                ddp__ckpt_refuse(&st, DDP_ERR_INVALID_ARGUMENT, "the checkpoint path '%s' is %s, not a regular file; nothing "
                                 "written (name a file to write checkpoints to)", path, kind);
        }
        if (st.code == DDP_OK) {
            ddp__ckpt_sweep(path);
            if ((f.fd = ddp__ckpt_create_temp(path, tmp, sizeof tmp)) < 0) {
                char why[512];
                ddp__ckpt_refuse(&st, DDP_ERR_SYSTEM, "cannot create a temporary file next to the checkpoint '%s': %s",
                                 path, ddp__ckpt_temp_error(path, errno, why, sizeof why));
            }
        }
        if (st.code == DDP_OK) ddp__ckpt_write(&f, hdr, hdr_len, 1);
    }
    r = ddp__ckpt_share(ctx, &st, "save", path);
    if (r == DDP_OK) {
        ddp__ckpt_file *fp = ctx->rank == 0 ? &f : NULL;
        r = ddp__ckpt_stream(ctx, DDP_PARAMS, fp, buf, 1);
        ddp__ckpt_kill_point(ctx);
        if (r == DDP_OK) r = ddp__ckpt_stream(ctx, DDP_ADAM_M, fp, buf, 1);
        if (r == DDP_OK) r = ddp__ckpt_stream(ctx, DDP_ADAM_V, fp, buf, 1);
        if (r == DDP_OK && ddp__outer_on(ctx)) r = ddp__ckpt_outer_save(ctx, fp);
    }
    if (r == DDP_OK && ctx->rank == 0) {
        if (user_bytes) ddp__ckpt_write(&f, user, user_bytes, 1);
        ddp__put_le(sum, ddp__sum_value(&f.sum), 8);
        ddp__ckpt_write(&f, sum, 8, 0);
        if (!f.err && ddp__file_sync(f.fd) != 0) f.err = errno;
        if (ddp__file_close(f.fd) != 0 && !f.err) f.err = errno;
        f.fd = -1;
        if (f.err) ddp__ckpt_refuse(&st, DDP_ERR_SYSTEM, "cannot write the checkpoint '%s' (its temporary file '%s'): %s",
                                    path, tmp, ddp__strerror(f.err));
        else if (ddp__file_replace(tmp, path) != 0)
            ddp__ckpt_refuse(&st, DDP_ERR_SYSTEM, "cannot rename '%s' to the checkpoint '%s': %s", tmp, path, ddp__strerror(errno));
        else {
            renamed = 1;
            if (!ddp__ckpt_sync_dir(path))
                ddp__ckpt_refuse(&st, DDP_ERR_SYSTEM, "wrote the checkpoint '%s' but cannot sync its directory to disk: %s",
                                 path, ddp__strerror(errno));
        }
    }
    if (f.fd >= 0) ddp__file_close(f.fd);
    if (ctx->rank == 0 && tmp[0] && !renamed) ddp__file_unlink(tmp);
    DDP_FREE(hdr);
    DDP_FREE(buf);
    return r != DDP_OK ? r : ddp__ckpt_share(ctx, &st, "save", path);
}

/* With --save-like options: rank 0 looks at `path` before any training. A regular file there:
   *holds = 1; nothing: 0; a FIFO, directory or device, or a directory where no file can be
   created: refused, by name, on every rank. */
static ddp_result ddp__save_check(ddp_context *ctx, const char *path, int *holds) {
    ddp__ckpt_status st;
    ddp_result r;
    memset(&st, 0, sizeof st);
    if (ctx->rank == 0) {
        char tmp[PATH_MAX + 64];
        uint64_t size;
        const char *kind = NULL;
        int fd = ddp__file_open_read(path);
        if (fd >= 0 && ddp__file_stat(fd, &size, &kind) == 0 && kind)
            ddp__ckpt_refuse(&st, DDP_ERR_INVALID_ARGUMENT, "the checkpoint path '%s' is %s, not a regular file; name a "
                             "file to write checkpoints to", path, kind);
        else if (fd < 0 && errno != ENOENT)
            ddp__ckpt_refuse(&st, DDP_ERR_SYSTEM, "cannot look at the checkpoint path '%s': %s", path, ddp__strerror(errno));
        st.step = fd >= 0;   /* the status carries "a file is there" in its step */
        if (fd >= 0) ddp__file_close(fd);
        if (st.code == DDP_OK) {   /* the directory takes a new file (the save's temporary) */
            int t = ddp__ckpt_create_temp(path, tmp, sizeof tmp);
            if (t < 0) {
                char dir[PATH_MAX], why[512];
                const char *base;
                int err = errno;
                ddp__ckpt_split(path, dir, sizeof dir, &base);
                if (err == ENAMETOOLONG)
                    ddp__ckpt_refuse(&st, DDP_ERR_SYSTEM, "cannot write the checkpoint '%s': %s", path,
                                     ddp__ckpt_temp_error(path, err, why, sizeof why));
                else
                    ddp__ckpt_refuse(&st, DDP_ERR_SYSTEM, "cannot write the checkpoint '%s': no file can be created in "
                                     "the directory '%s': %s", path, dir, ddp__strerror(err));
            } else {
                ddp__file_close(t);
                ddp__file_unlink(tmp);
            }
        }
    }
    r = ddp__ckpt_share(ctx, &st, "write", path);
    if (r == DDP_OK && holds) *holds = (int)st.step;
    return r;
}

/* Rank 0's first pass over a checkpoint, ddp__ckpt_verify, is the steps below in file order;
   each returns 1 to go on, or 0 with st refused (the first reason counts). */
typedef struct ddp__ckpt_head {
    uint64_t floats, shards;   /* floats in each of parameters, m and v; entries of the shard table */
    uint64_t arrays;           /* model-sized arrays in the data: 3 (parameters, m, v), more with the outer state */
    uint32_t nparams, version;
    char mismatch[512];        /* the first difference from this model: refused after the program's check */
} ddp__ckpt_head;

static int ddp__ckpt_truncated(ddp__ckpt_status *st, const char *path, const ddp__ckpt_file *f) {
    ddp__ckpt_refuse(st, DDP_ERR_INVALID_ARGUMENT, "the checkpoint '%s' is truncated (%llu bytes%s)", path,
                     (unsigned long long)f->size, f->err && f->err != EIO ? ", and reading it failed" : "");
    return 0;
}

/* Open it, and refuse anything but a regular file (a FIFO does not block the open). */
static int ddp__ckpt_open_file(ddp__ckpt_file *f, const char *path, ddp__ckpt_status *st) {
    const char *kind;
    f->fd = ddp__file_open_read(path);
    if (f->fd < 0) { ddp__ckpt_refuse(st, DDP_ERR_SYSTEM, "cannot open the checkpoint '%s': %s", path, ddp__strerror(errno)); return 0; }
    if (ddp__file_stat(f->fd, &f->size, &kind) != 0) { ddp__ckpt_refuse(st, DDP_ERR_SYSTEM, "cannot look at the checkpoint '%s': %s", path, ddp__strerror(errno)); return 0; }
    if (kind) {
        ddp__ckpt_refuse(st, DDP_ERR_INVALID_ARGUMENT, "the checkpoint '%s' is %s, not a regular file; pass the checkpoint file "
                         "itself", path, kind);
        return 0;
    }
    return 1;
}

/* The magic, then the rest of the fixed header. */
static int ddp__ckpt_read_fixed(ddp__ckpt_file *f, const char *path, ddp__ckpt_status *st, unsigned char *fixed) {
    if (!ddp__ckpt_read(f, fixed, 8, 1) || memcmp(fixed, DDP__CKPT_MAGIC, 8) != 0) {
        ddp__ckpt_refuse(st, DDP_ERR_INVALID_ARGUMENT, "'%s' is not a ddp.h checkpoint (%s)", path,
                         f->err && f->err != EIO ? ddp__strerror(f->err) : "it does not begin with " DDP__CKPT_MAGIC);
        return 0;
    }
    if (!ddp__ckpt_read(f, fixed + 8, DDP__CKPT_FIXED - 8, 1)) {
        ddp__ckpt_refuse(st, DDP_ERR_INVALID_ARGUMENT, "the checkpoint '%s' is truncated (%llu bytes: not even its header)",
                         path, (unsigned long long)f->size);
        return 0;
    }
    return 1;
}

/* The fixed header's fields: the version, values that can be, tables the file's length can hold. */
static int ddp__ckpt_check_head(const ddp__ckpt_file *f, const char *path, ddp__ckpt_status *st, const unsigned char *fixed,
                                ddp__ckpt_head *h) {
    uint32_t version = (uint32_t)ddp__get_le(fixed + 8, 4), world = (uint32_t)ddp__get_le(fixed + 12, 4);
    uint32_t sharded = (uint32_t)ddp__get_le(fixed + 16, 4);
    h->nparams = (uint32_t)ddp__get_le(fixed + 20, 4);
    st->step = (int64_t)ddp__get_le(fixed + 24, 8);
    h->floats = ddp__get_le(fixed + 32, 8);
    st->user_bytes = ddp__get_le(fixed + 40, 8);
    h->shards = ddp__get_le(fixed + 48, 4);
    h->version = version;
    h->arrays = 3;
    if (version != DDP__CKPT_VERSION && version != DDP__CKPT_VERSION_OUTER) {
        ddp__ckpt_refuse(st, DDP_ERR_INVALID_ARGUMENT, "the checkpoint '%s' has format version %u; this ddp.h reads versions "
                         "%u and %u", path, version, DDP__CKPT_VERSION, DDP__CKPT_VERSION_OUTER);
        return 0;
    }
    /* sharded: a shard per rank, or with the outer sync (or hybrid sharding, version 1) a shard per
       member of a replica (or shard) group */
    if (world < 1 || world > INT32_MAX || sharded > 1 ||
        (sharded ? h->shards < 1 || h->shards > world || world % h->shards : h->shards != 1u) ||
        ddp__get_le(fixed + 52, 4) != 0 || st->step < 0) {
        ddp__ckpt_refuse(st, DDP_ERR_INVALID_ARGUMENT, "the checkpoint '%s' has an impossible header: world size %u, sharded %u, "
                         "%llu shards, reserved field %llu, AdamW step %lld", path, world, sharded, (unsigned long long)h->shards,
                         (unsigned long long)ddp__get_le(fixed + 52, 4), (long long)st->step);
        return 0;
    }
    st->world = (int32_t)world;
    st->sharded = (int32_t)sharded;
    if (h->shards > (f->size - f->pos) / 8 || (uint64_t)h->nparams > (f->size - f->pos - 8 * h->shards) / 17) {
        ddp__ckpt_refuse(st, DDP_ERR_INVALID_ARGUMENT, "the checkpoint '%s' is truncated (%llu bytes; its header lists %llu "
                         "shards and %u parameters)", path, (unsigned long long)f->size, (unsigned long long)h->shards, h->nparams);
        return 0;
    }
    return 1;
}

/* The shard table: starts at 0, never decreases, never passes the floats. */
static int ddp__ckpt_check_shards(ddp__ckpt_file *f, const char *path, ddp__ckpt_status *st, const ddp__ckpt_head *h) {
    unsigned char b[8];
    uint64_t i, start, prev = 0;
    for (i = 0; i < h->shards; i++) {
        if (!ddp__ckpt_read(f, b, 8, 1)) return ddp__ckpt_truncated(st, path, f);
        start = ddp__get_le(b, 8);
        if ((i == 0 && start != 0) || start < prev || start > h->floats) {
            ddp__ckpt_refuse(st, DDP_ERR_INVALID_ARGUMENT, "the checkpoint '%s' has an impossible shard layout: shard %llu "
                             "starts at float %llu (previous %llu, of %llu)", path, (unsigned long long)i,
                             (unsigned long long)start, (unsigned long long)prev, (unsigned long long)h->floats);
            return 0;
        }
        prev = start;
    }
    return 1;
}

/* Parameter i's entry (name, count, flags): well formed, within the header's floats (*sum: the
   entries' floats so far), and compared with this model's parameter i (the first difference kept). */
static int ddp__ckpt_check_param(const ddp_context *ctx, ddp__ckpt_file *f, const char *path, ddp__ckpt_status *st,
                                 ddp__ckpt_head *h, uint64_t i, uint64_t *sum) {
    unsigned char b[12];
    char name[DDP__NAME_MAX];
    uint64_t len, count;
    uint32_t flags;
    if (!ddp__ckpt_read(f, b, 4, 1)) return ddp__ckpt_truncated(st, path, f);
    len = ddp__get_le(b, 4);
    if (len < 1 || len >= DDP__NAME_MAX) {
        ddp__ckpt_refuse(st, DDP_ERR_INVALID_ARGUMENT, "the checkpoint '%s' is damaged: the name of its parameter %llu is "
                         "%llu bytes long (1 to %d)", path, (unsigned long long)i, (unsigned long long)len, DDP__NAME_MAX - 1);
        return 0;
    }
    if (!ddp__ckpt_read(f, name, (size_t)len, 1) || !ddp__ckpt_read(f, b, 12, 1)) return ddp__ckpt_truncated(st, path, f);
    name[len] = 0;
    count = ddp__get_le(b, 8);
    flags = (uint32_t)ddp__get_le(b + 8, 4);
    if (count > h->floats - *sum) {
        ddp__ckpt_refuse(st, DDP_ERR_INVALID_ARGUMENT, "the checkpoint '%s' is damaged: its parameters hold more than the "
                         "%llu floats its header counts", path, (unsigned long long)h->floats);
        return 0;
    }
    *sum += count;
    if (!h->mismatch[0] && i < (uint64_t)ctx->model.num_params) {
        const ddp__param *p = &ctx->model.params[i];
        if (strcmp(p->name, name) != 0 || p->count != count || p->flags != flags)
            snprintf(h->mismatch, sizeof h->mismatch, "the checkpoint '%s' is of another model: its parameter %llu is '%s' of "
                     "%llu floats (flags %u); this model's is '%s' of %zu floats (flags %u)", path,
                     (unsigned long long)i, name, (unsigned long long)count, flags, p->name, p->count, p->flags);
    }
    return 1;
}

/* The parameter table: every entry, then the count of parameters, then their floats' total. */
static int ddp__ckpt_check_params(const ddp_context *ctx, ddp__ckpt_file *f, const char *path, ddp__ckpt_status *st,
                                  ddp__ckpt_head *h) {
    uint64_t i, sum = 0;
    for (i = 0; i < h->nparams; i++)
        if (!ddp__ckpt_check_param(ctx, f, path, st, h, i, &sum)) return 0;
    if (!h->mismatch[0] && h->nparams != (uint32_t)ctx->model.num_params)
        snprintf(h->mismatch, sizeof h->mismatch, "the checkpoint '%s' is of another model: it holds %u parameters, this model "
                 "has %d (the first %d agree)", path, h->nparams, ctx->model.num_params, (int)(h->nparams < (uint32_t)ctx->model.num_params ?
                 h->nparams : (uint32_t)ctx->model.num_params));
    if (sum != h->floats) {
        ddp__ckpt_refuse(st, DDP_ERR_INVALID_ARGUMENT, "the checkpoint '%s' is damaged: its parameters hold %llu floats, its "
                         "header counts %llu", path, (unsigned long long)sum, (unsigned long long)h->floats);
        return 0;
    }
    return 1;
}

/* Version 2's outer block: the values it can hold, the offset table (rank 0 keeps it in
   *offsets: a fragment in flight that lands at the load is mapped through it), how many arrays
   the data holds, and whether the fragment in flight can stay in flight in this run (st->keep:
   the outer sync on, the same fragments, schedule, layout and kind of sum; outer.sum has room
   for it then). */
static int ddp__ckpt_check_outer(const ddp_context *ctx, ddp__ckpt_file *f, const char *path, ddp__ckpt_status *st,
                                 ddp__ckpt_head *h, uint64_t **offsets) {
    const ddp_outer *o = &ctx->desc.outer;
    unsigned char b[DDP__CKPT_OUTER_FIXED];
    uint64_t groups, gsize, mode, steps, frags, delay, flags, flat, i;
    int same;
    if (h->version != DDP__CKPT_VERSION_OUTER) return 1;
    if (!ddp__ckpt_read(f, b, sizeof b, 1)) return ddp__ckpt_truncated(st, path, f);
    groups = ddp__get_le(b, 4); gsize = ddp__get_le(b + 4, 4); mode = ddp__get_le(b + 8, 4); steps = ddp__get_le(b + 12, 4);
    frags = ddp__get_le(b + 16, 4); delay = ddp__get_le(b + 20, 4); flags = ddp__get_le(b + 44, 4);
    st->inner = (int64_t)ddp__get_le(b + 48, 8);
    st->syncs = (int64_t)ddp__get_le(b + 56, 8);
    st->flight = (int32_t)(uint32_t)ddp__get_le(b + 64, 4);
    st->lands = (int64_t)ddp__get_le(b + 72, 8);
    flat = ddp__get_le(b + 80, 8);
    st->sum_lo = ddp__get_le(b + 88, 8);
    st->sum_floats = ddp__get_le(b + 96, 8);
    if (groups < 1 || gsize < 1 || groups * gsize != (uint64_t)st->world || mode < DDP_OUTER_AVERAGE || mode > DDP_OUTER_STREAMING ||
        steps < 1 || steps > INT32_MAX || frags < 1 || frags > steps || delay >= steps || flags > 3 || st->inner < 0 ||
        st->syncs < 0 || st->lands < 0 || st->flight < -1 || (int64_t)st->flight >= (int64_t)frags || ddp__get_le(b + 68, 4) ||
        flat < h->floats || (st->flight < 0 ? st->sum_floats || st->sum_lo : !st->sum_floats || st->sum_lo > flat ||
                             st->sum_floats > flat - st->sum_lo)) {
        ddp__ckpt_refuse(st, DDP_ERR_INVALID_ARGUMENT, "the checkpoint '%s' has an impossible outer block: %llu groups of %llu "
                         "ranks (world %d), mode %llu, inner_steps %llu, %llu fragments, delay %llu, flags %llu, inner step "
                         "%lld, %lld syncs, fragment %d in flight (lands %lld; its sum: %llu floats from %llu of %llu)", path,
                         (unsigned long long)groups, (unsigned long long)gsize, st->world, (unsigned long long)mode,
                         (unsigned long long)steps, (unsigned long long)frags, (unsigned long long)delay,
                         (unsigned long long)flags, (long long)st->inner, (long long)st->syncs, st->flight, (long long)st->lands,
                         (unsigned long long)st->sum_floats, (unsigned long long)st->sum_lo, (unsigned long long)flat);
        return 0;
    }
    st->groups = (int32_t)groups;
    st->group_size = (int32_t)gsize;
    st->flags = (int32_t)flags;
    st->fragments = (int32_t)frags;
    if (h->nparams > (f->size - f->pos) / 8) return ddp__ckpt_truncated(st, path, f);
    if (!(*offsets = (uint64_t *)DDP_MALLOC(sizeof(uint64_t) * (size_t)h->nparams + 1))) {
        ddp__ckpt_refuse(st, DDP_ERR_OUT_OF_MEMORY, "no memory to read the checkpoint '%s' (its layout table)", path);
        return 0;
    }
    same = flat == ctx->flat.count && h->nparams == (uint32_t)ctx->model.num_params;
    for (i = 0; i < h->nparams; i++) {
        if (!ddp__ckpt_read(f, b, 8, 1)) return ddp__ckpt_truncated(st, path, f);
        (*offsets)[i] = ddp__get_le(b, 8);
        if (i < (uint64_t)ctx->model.num_params && ((*offsets)[i] > flat || ctx->model.params[i].count > flat - (*offsets)[i])) {
            ddp__ckpt_refuse(st, DDP_ERR_INVALID_ARGUMENT, "the checkpoint '%s' has an impossible layout: parameter %llu at "
                             "offset %llu of a flat buffer of %llu floats", path, (unsigned long long)i,
                             (unsigned long long)(*offsets)[i], (unsigned long long)flat);
            return 0;
        }
        if (same && (*offsets)[i] != ctx->model.params[i].offset) same = 0;
    }
    h->arrays = 4 + (flags & 1) + 3 * (groups - 1);
    st->keep = ddp__outer_on(ctx) && st->flight >= 0 && same && frags == (uint64_t)o->fragments && steps == (uint64_t)o->inner_steps &&
               delay == (uint64_t)o->delay_steps && !!(flags & 2) == ddp__outer_plain_mean(ctx) &&
               st->sum_lo == ctx->outer.frag[st->flight] && st->sum_floats == ctx->outer.frag[st->flight + 1] - st->sum_lo;
    return 1;
}

/* The file's length: the data (parameters, m, v; the outer state), the user blob and the
   checksum, nothing after. */
static int ddp__ckpt_check_length(const ddp__ckpt_file *f, const char *path, ddp__ckpt_status *st, const ddp__ckpt_head *h,
                                  uint64_t *data_at) {
    uint64_t left = f->size - f->pos, expect, data;
    *data_at = f->pos;
    if (h->floats && h->arrays > left / 4 / h->floats) return ddp__ckpt_truncated(st, path, f);
    data = h->floats * h->arrays;
    if (st->sum_floats > left / 4 - data) return ddp__ckpt_truncated(st, path, f);
    st->data_floats = data += st->sum_floats;
    if (st->user_bytes > left - 4 * data || left - 4 * data - st->user_bytes < 8)
        return ddp__ckpt_truncated(st, path, f);
    expect = f->pos + 4 * data + st->user_bytes + 8;
    if (expect != f->size) {
        ddp__ckpt_refuse(st, DDP_ERR_INVALID_ARGUMENT, "the checkpoint '%s' goes on after its checksum (%llu bytes; its header "
                         "describes %llu): not a file ddp_save wrote, or two files run together", path,
                         (unsigned long long)f->size, (unsigned long long)expect);
        return 0;
    }
    return 1;
}

/* The checksum, over the data in chunks (nothing is loaded yet) and the user blob, kept in *blob. */
static int ddp__ckpt_check_sum(ddp__ckpt_file *f, const char *path, ddp__ckpt_status *st, const ddp__ckpt_head *h, void **blob,
                               uint64_t *stored) {
    unsigned char b[8];
    uint64_t left;
    float *buf = (float *)DDP_MALLOC(DDP__CKPT_CHUNK * sizeof(float));
    int ok = 0;
    if (!buf || (st->user_bytes && !(*blob = DDP_MALLOC((size_t)st->user_bytes)))) {
        ddp__ckpt_refuse(st, DDP_ERR_OUT_OF_MEMORY, "no memory to read the checkpoint '%s' (its user blob: %llu bytes)", path,
                         (unsigned long long)st->user_bytes);
        goto out;
    }
    (void)h;
    for (left = 4 * st->data_floats; left > 0;) {
        size_t n = left < DDP__CKPT_CHUNK * sizeof(float) ? (size_t)left : DDP__CKPT_CHUNK * sizeof(float);
        if (!ddp__ckpt_read(f, buf, n, 1)) break;
        left -= n;
    }
    if (st->user_bytes) ddp__ckpt_read(f, *blob, (size_t)st->user_bytes, 1);
    if (!ddp__ckpt_read(f, b, 8, 0)) {
        ddp__ckpt_refuse(st, DDP_ERR_SYSTEM, "cannot read the checkpoint '%s': %s", path, ddp__strerror(f->err ? f->err : EIO));
        goto out;
    }
    *stored = ddp__get_le(b, 8);
    if (*stored != ddp__sum_value(&f->sum))
        ddp__ckpt_refuse(st, DDP_ERR_INVALID_ARGUMENT, "the checkpoint '%s' is corrupt (checksum mismatch): it holds %016llx, "
                         "its bytes give %016llx", path, (unsigned long long)*stored, (unsigned long long)ddp__sum_value(&f->sum));
    else ok = 1;
out:
    DDP_FREE(buf);
    return ok;
}

/* The user blob: it fits the caller's buffer, and the program's check takes it. */
static int ddp__ckpt_check_user(const char *path, ddp__ckpt_status *st, size_t user_capacity, ddp_checkpoint_check_fn check,
                                void *check_arg, const void *blob) {
    ddp_checkpoint_info info;
    char why[sizeof st->msg];
    if (st->user_bytes > user_capacity) {
        ddp__ckpt_refuse(st, DDP_ERR_INVALID_ARGUMENT, "the checkpoint '%s' holds a user blob of %llu bytes; the caller's "
                         "buffer takes %zu", path, (unsigned long long)st->user_bytes, user_capacity);
        return 0;
    }
    if (!check) return 1;
    memset(&info, 0, sizeof info);
    info.outer_groups = st->groups;
    info.outer_inner_steps = st->inner;
    info.outer_syncs = st->syncs;
    info.step = st->step;
    info.world_size = st->world;
    info.sharded = st->sharded;
    info.user_bytes = st->user_bytes;
    why[0] = 0;
    if (!check(check_arg, &info, blob, (size_t)st->user_bytes, why, sizeof why)) {
        why[sizeof why - 1] = 0;
        ddp__ckpt_refuse(st, DDP_ERR_MISMATCH, "%s", why[0] ? why : "the checkpoint was refused by the program's check "
                         "(it gave no reason)");
        return 0;
    }
    return 1;
}

/* Rank 0's first pass over a checkpoint: everything checked, nothing loaded. Returns the open
   file (positioned nowhere in particular) and the checksum it holds, or -1 with st refused.
   `blob` receives the user blob (st->user_bytes of it). A file of another model is refused
   last, after the program's check (whose reason, e.g. "another seed", says more). */
static int ddp__ckpt_verify(ddp_context *ctx, const char *path, size_t user_capacity, ddp_checkpoint_check_fn check,
                            void *check_arg, ddp__ckpt_status *st, void **blob, uint64_t *data_at, uint64_t *stored,
                            uint64_t **offsets) {
    ddp__ckpt_file f;
    ddp__ckpt_head h;
    unsigned char fixed[DDP__CKPT_FIXED];
    memset(&f, 0, sizeof f);
    memset(&h, 0, sizeof h);
    ddp__sum_init(&f.sum);
    *blob = NULL;
    if (ddp__ckpt_open_file(&f, path, st) && ddp__ckpt_read_fixed(&f, path, st, fixed) &&
        ddp__ckpt_check_head(&f, path, st, fixed, &h) && ddp__ckpt_check_shards(&f, path, st, &h) &&
        ddp__ckpt_check_params(ctx, &f, path, st, &h) && ddp__ckpt_check_outer(ctx, &f, path, st, &h, offsets) &&
        ddp__ckpt_check_length(&f, path, st, &h, data_at) &&
        ddp__ckpt_check_sum(&f, path, st, &h, blob, stored) &&
        ddp__ckpt_check_user(path, st, user_capacity, check, check_arg, *blob)) {
        if (!h.mismatch[0]) return f.fd;
        ddp__ckpt_refuse(st, DDP_ERR_MISMATCH, "%s", h.mismatch);
    }
    DDP_FREE(*blob);
    *blob = NULL;
    DDP_FREE(*offsets);
    *offsets = NULL;
    if (f.fd >= 0) ddp__file_close(f.fd);
    return -1;
}

static ddp_result ddp__load(ddp_context *ctx, const char *path, void *user, size_t user_capacity, ddp_checkpoint_check_fn check,
                            void *check_arg, ddp_checkpoint_info *info_out) {
    ddp__ckpt_status st;
    ddp__ckpt_file f;
    void *blob = NULL;
    float *buf = NULL;
    uint64_t data_at = 0, stored = 0, *offsets = NULL;
    ddp_result r;
    if (ddp__in_backward(ctx)) return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_load while a backward is in flight (call it between steps)");
    if ((r = ddp__outer_settle(ctx)) != DDP_OK) return r;   /* the exchange in flight has landed in outer.sum */
    if ((r = ctx->be->adamw_state(ctx)) != DDP_OK) return ddp__fatal(ctx, r);
    memset(&st, 0, sizeof st);
    memset(&f, 0, sizeof f);
    f.fd = -1;
    if (ctx->rank == 0) {
        f.fd = ddp__ckpt_verify(ctx, path, user_capacity, check, check_arg, &st, &blob, &data_at, &stored, &offsets);
        if (f.fd >= 0 && !(buf = (float *)DDP_MALLOC(DDP__CKPT_CHUNK * sizeof(float))))
            ddp__ckpt_refuse(&st, DDP_ERR_OUT_OF_MEMORY, "no memory to read the checkpoint '%s'", path);
    }
    if ((r = ddp__ckpt_share(ctx, &st, "load", path)) != DDP_OK) goto out;
    /* From here on every rank takes part to the end: the user blob, then the state. */
    if (ctx->rank != 0 && st.user_bytes && !(blob = DDP_MALLOC((size_t)st.user_bytes))) {
        r = ddp__fail_group(ctx, DDP_ERR_OUT_OF_MEMORY, "ddp_load: no memory for the checkpoint's user blob of %llu bytes",
                            (unsigned long long)st.user_bytes);
        goto out;
    }
    if (st.user_bytes && ctx->world > 1) {
        ctx->what = "ddp_load's broadcast of the user blob";
        if ((r = ctx->be->collective(ctx, DDP__KIND_BROADCAST, blob, (size_t)st.user_bytes, 0)) != DDP_OK) goto out;
    }
    if (st.user_bytes > user_capacity) {   /* rank 0's capacity took it; this rank's is smaller */
        r = ddp__fail_group(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_load: the checkpoint's user blob is %llu bytes, this rank's "
                            "buffer takes %zu (pass the same capacity on every rank)", (unsigned long long)st.user_bytes,
                            user_capacity);
        goto out;
    }
    if (ctx->rank == 0) {   /* the second pass checksums what it puts in place: header again, data, blob */
        unsigned char hb[4096];
        uint64_t at;
        ddp__sum_init(&f.sum);
        f.size = data_at + 4 * st.data_floats + st.user_bytes;   /* the length the first pass checked, less the checksum */
        for (at = 0; at < data_at;) {
            size_t n = data_at - at < sizeof hb ? (size_t)(data_at - at) : sizeof hb;
            if (!ddp__ckpt_read(&f, hb, n, 1)) break;
            at += n;
        }
    }
    {
        ddp__ckpt_file *fp = ctx->rank == 0 ? &f : NULL;
        r = ddp__ckpt_stream(ctx, DDP_PARAMS, fp, buf, 0);
        if (r == DDP_OK) r = ddp__ckpt_stream(ctx, DDP_ADAM_M, fp, buf, 0);
        if (r == DDP_OK) r = ddp__ckpt_stream(ctx, DDP_ADAM_V, fp, buf, 0);
        if (r == DDP_OK) r = ddp__ckpt_outer_load(ctx, fp, &st, offsets);
        if (r != DDP_OK) goto out;
    }
    if (ctx->rank == 0) {
        if (st.user_bytes) ddp__sum_add(&f.sum, blob, (size_t)st.user_bytes);
        if (f.err || ddp__sum_value(&f.sum) != stored)
            ddp__ckpt_refuse(&st, DDP_ERR_SYSTEM, "the checkpoint '%s' changed while it was loaded (%s); the parameters and "
                             "AdamW state are partly overwritten", path, f.err ? ddp__strerror(f.err) : "its second reading has "
                             "another checksum");
    }
    if ((r = ddp__ckpt_share(ctx, &st, "load", path)) != DDP_OK) { r = ddp__fatal(ctx, r); goto out; }
    ctx->adam.step = st.step;   /* adamw_state above: a GPU backend uploads it before its next step */
    if (st.user_bytes) memcpy(user, blob, (size_t)st.user_bytes);
    if (info_out) {
        info_out->step = st.step;
        info_out->world_size = st.world;
        info_out->sharded = st.sharded;
        info_out->user_bytes = st.user_bytes;
        info_out->outer_groups = st.groups;
        info_out->outer_inner_steps = st.inner;
        info_out->outer_syncs = st.syncs;
    }
out:
    if (f.fd >= 0) ddp__file_close(f.fd);
    DDP_FREE(offsets);
    DDP_FREE(blob);
    DDP_FREE(buf);
    return r;
}

/* --------------------------------------------------------------------------------------------
   >>public  The public functions: each checks its arguments and the context's state, then hands
   off to its section. A NULL context is refused with DDP_ERR_INVALID_ARGUMENT (accessors return
   the neutral value the manual lists), and the message goes to ddp_last_error(NULL), per thread.
   -------------------------------------------------------------------------------------------- */
#if defined(__GNUC__) || defined(__clang__)
#define DDP__THREAD_LOCAL __thread
#elif defined(_MSC_VER)
#define DDP__THREAD_LOCAL __declspec(thread)
#else
#define DDP__THREAD_LOCAL
#endif
static DDP__THREAD_LOCAL char ddp__no_context_err[256];

static ddp_result ddp__no_context(ddp_result code, const char *call, const char *why) {
    snprintf(ddp__no_context_err, sizeof ddp__no_context_err, "pid %d: %s: %s", ddp__getpid(), call, why);
    return code;
}

/* Every public call that takes a context starts here: not NULL, not failed, committed if asked. */
static ddp_result ddp__usable(ddp_context *ctx, int need_commit, const char *call) {
    if (!ctx) return ddp__no_context(DDP_ERR_INVALID_ARGUMENT, call, "the context is NULL");
    if (ddp__failed(ctx)) return ddp__failed(ctx);
    if (ddp__cancel_requested(ctx) && ctx->be)
        return ddp__check_cancel(ctx, call);
    if (need_commit && !ddp__is_committed(ctx))
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "%s needs ddp_commit first", call);
    return DDP_OK;
}

/* A call that uses the wire: an outer exchange in flight (>>outer) settles first, so that the
   exchange's thread and this one never share the wire, nor ctx->what. `buckets`: the call
   launches gradient buckets, which use the wire only in groups of several ranks. */
static ddp_result ddp__usable_wire(ddp_context *ctx, int need_commit, const char *call, int buckets) {
    ddp_result r = ddp__usable(ctx, need_commit, call);
    if (r != DDP_OK || (buckets && ctx->outer.size == 1)) return r;
    return ddp__outer_settle(ctx);
}

const char *ddp_result_string(ddp_result result) {
    switch (result) {
    case DDP_OK: return "ok";
    case DDP_ERR_INVALID_ARGUMENT: return "invalid argument";
    case DDP_ERR_INVALID_STATE: return "call out of order";
    case DDP_ERR_BAD_ENV: return "bad launcher environment";
    case DDP_ERR_NETWORK: return "rendezvous network error";
    case DDP_ERR_TIMEOUT: return "timed out waiting for a peer";
    case DDP_ERR_PEER_LOST: return "peer rank lost";
    case DDP_ERR_MISMATCH: return "ranks disagree";
    case DDP_ERR_UNUSED_PARAMETER: return "parameters got no gradient";
    case DDP_ERR_DOUBLE_READY: return "gradient marked ready twice";
    case DDP_ERR_OUT_OF_MEMORY: return "out of memory";
    case DDP_ERR_SYSTEM: return "operating-system call failed";
    case DDP_ERR_BACKEND: return "GPU backend failure";
    case DDP_ERR_NONFINITE: return "gradients are not finite";
    case DDP_ERR_CANCELLED: return "cancelled";
    }
    return "unknown ddp_result";
}

const char *ddp_last_error(const ddp_context *ctx) {
    ddp_context *c = (ddp_context *)(uintptr_t)ctx;   /* only the caller's copy changes */
    if (!ctx) return ddp__no_context_err[0] ? ddp__no_context_err : "no error (and no context: NULL was passed)";
    /* a copy, taken under the lock: a watchdog or the communication thread may record the
       group's failure while the caller reads it */
    ddp__mutex_lock(&c->err_lock);
    memcpy(c->err_shown, c->err, sizeof c->err_shown);
    ddp__mutex_unlock(&c->err_lock);
    return c->err_shown[0] ? c->err_shown : "no error";
}

ddp_result ddp_init(ddp_context **out, const ddp_desc *desc) {
    ddp_context *ctx;
    ddp_result r;
    if (!out) return ddp__no_context(DDP_ERR_INVALID_ARGUMENT, "ddp_init", "out is NULL (pass the address of a ddp_context *)");
    *out = ctx = (ddp_context *)ddp__calloc(sizeof *ctx);
    if (!ctx) return ddp__no_context(DDP_ERR_OUT_OF_MEMORY, "ddp_init", "out of memory for the context");
    ddp__mutex_init(&ctx->err_lock);
    ctx->rdv.store_fd = -1;
    ctx->rank = -1;
    ctx->step.sync = 1;
    ctx->tl.origin = ddp__now();
    if ((r = ddp__init(ctx, desc)) != DDP_OK) return ddp__set_failed(ctx, ddp__cancel_wins(ctx, r, "ddp_init"));
    return DDP_OK;
}

ddp_result ddp_shutdown(ddp_context *ctx) { return ctx ? ddp__shutdown(ctx) : DDP_OK; }

int ddp_rank(const ddp_context *ctx) { return ctx ? ctx->rank : -1; }
int ddp_world_size(const ddp_context *ctx) { return ctx ? ctx->world : 0; }
int ddp_local_rank(const ddp_context *ctx) { return ctx ? ctx->local_rank : -1; }
const ddp_desc *ddp_config(const ddp_context *ctx) { return ctx ? &ctx->desc : NULL; }
const char *ddp_backend_name(const ddp_context *ctx) { return ctx && ctx->be ? ctx->be->name : "none"; }

ddp_result ddp_register_param(ddp_context *ctx, const char *name, size_t count, unsigned flags,
                              const float *init, int *id_out) {
    ddp_result r = ddp__usable(ctx, 0, "ddp_register_param");
    if (r == DDP_OK) return ddp__register_param(ctx, name, count, flags, init, id_out);
    if (id_out) *id_out = -1;   /* no context, or a failed one: an id no call accepts */
    return r;
}

ddp_result ddp_register_unit(ddp_context *ctx, const char *name, int first_id, int num_params, int *unit_out) {
    ddp_result r = ddp__usable(ctx, 0, "ddp_register_unit");
    if (r == DDP_OK) return ddp__register_unit(ctx, name, first_id, num_params, unit_out);
    if (unit_out) *unit_out = -1;
    return r;
}

/* gather, prefetch, release: a unit index checked; below PARAMETERS nothing to do */
static ddp_result ddp__unit_call(ddp_context *ctx, int unit, const char *call) {
    ddp_result r = ddp__usable(ctx, 1, call);
    if (r != DDP_OK) return r;
    if (!ddp__is_committed(ctx)) return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "%s before ddp_commit", call);
    if (unit < 0 || unit >= ctx->z3.num_units)
        return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "%s: no unit %d (%d declared)", call, unit, ctx->z3.num_units);
    return DDP_OK;
}
ddp_result ddp_unit_gather(ddp_context *ctx, int unit) {
    ddp_result r = ddp__unit_call(ctx, unit, "ddp_unit_gather");
    return r != DDP_OK || !ddp__z3(ctx) ? r : ddp__z3_gather(ctx, unit);
}
ddp_result ddp_unit_prefetch(ddp_context *ctx, int unit) {
    ddp_result r = ddp__unit_call(ctx, unit, "ddp_unit_prefetch");
    /* shard_prefetch_off: the unit is gathered when it is needed */
    return r != DDP_OK || !ddp__z3(ctx) || ctx->desc.shard_prefetch_off ? r : ddp__z3_prefetch(ctx, unit);
}
ddp_result ddp_unit_release(ddp_context *ctx, int unit) {
    ddp_result r = ddp__unit_call(ctx, unit, "ddp_unit_release");
    return r != DDP_OK || !ddp__z3(ctx) ? r : ddp__z3_release(ctx, unit, 0);
}
int ddp_num_units(const ddp_context *ctx) { return ctx ? ctx->z3.num_units : 0; }
int ddp_unit_gathered(const ddp_context *ctx, int unit) {
    if (!ctx || unit < 0 || unit >= ctx->z3.num_units) return -1;
    if (!ddp__z3(ctx)) return 1;   /* below PARAMETERS every parameter is always there */
    return ddp__z3_state((ddp_context *)(uintptr_t)ctx, unit) == DDP__Z3_GATHERED;
}

ddp_result ddp_commit(ddp_context *ctx) {
    ddp_result r = ddp__usable(ctx, 0, "ddp_commit");
    if (r != DDP_OK) return r;
    /* committed, the outer state must exist: a rank without it cannot step (alike on every rank) */
    if ((r = ddp__commit(ctx)) == DDP_OK && (r = ddp__outer_commit(ctx)) != DDP_OK) r = ddp__fatal(ctx, r);
    return ddp__cancel_wins(ctx, r, "ddp_commit");
}

/* The views exist from ddp_commit on; before it, or for an id no parameter has, NULL with an error. */
static int ddp__committed(ddp_context *ctx, const char *call) {
    if (ctx && !ddp__is_committed(ctx))
        ddp__fail(ctx, DDP_ERR_INVALID_STATE, "%s before ddp_commit: the parameters have no memory until ddp_commit", call);
    return ctx && ddp__is_committed(ctx);
}
static int ddp__valid_id(ddp_context *ctx, int id, const char *call) {
    if (!ddp__committed(ctx, call)) return 0;
    if (id >= 0 && id < ctx->model.num_params) return 1;
    ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "%s: no parameter has id %d (ids 0..%d are registered)", call, id, ctx->model.num_params - 1);
    return 0;
}
/* An accessor of the other dtype: NULL, with an error that says which one to use. */
static int ddp__dtype_is(ddp_context *ctx, ddp_dtype want, const char *call) {
    char eb[DDP__ERR_MAX];
    if (!ctx || ctx->desc.param_dtype == want) return 1;
    if (want == DDP_DTYPE_BF16)
        ddp__fail(ctx, DDP_ERR_INVALID_STATE, "%s: the parameters are fp32 (param_dtype DDP_DTYPE_FP32%s), there "
                  "is no bf16 copy; use ddp_param / ddp_grad, or set param_dtype = DDP_DTYPE_BF16 on every rank", call,
                  ddp__env_set("DDP_PARAM_DTYPE") ? ", from DDP_PARAM_DTYPE" : "");
    else
        ddp__fail(ctx, DDP_ERR_INVALID_STATE, "%s: the parameters are bf16 (param_dtype DDP_DTYPE_BF16%s): use "
                  "ddp_param_bf16 / ddp_grad_bf16 (the fp32 master is ddp_flat_params, to read)", call,
                  ddp__env_set("DDP_PARAM_DTYPE") ? ", from DDP_PARAM_DTYPE, which wins over the program's setting" : "");
    /* The operator's variable changed the accessors a program was written for: a program that
       does not check the NULL would crash with no word, so the log says it (once, as an error). */
    if (ddp__env_set("DDP_PARAM_DTYPE") && !ctx->dtype_env_told) {
        ctx->dtype_env_told = 1;
        ddp__log(ctx, DDP_LOG_ERROR, "%s (this program reads %s parameters: unset DDP_PARAM_DTYPE, or set it to %s)",
                 ddp__err_body(ctx, eb), want == DDP_DTYPE_BF16 ? "bf16" : "fp32", want == DDP_DTYPE_BF16 ? "bf16" : "fp32");
    }
    return 0;
}
float *ddp_param(ddp_context *ctx, int id) {
    return ddp__valid_id(ctx, id, "ddp_param") && ddp__dtype_is(ctx, DDP_DTYPE_FP32, "ddp_param")
           ? (ddp__z3(ctx) ? (float *)(void *)ctx->z3.view : ctx->flat.params) + ctx->model.params[id].offset : NULL;
}
float *ddp_grad(ddp_context *ctx, int id) {
    return ddp__valid_id(ctx, id, "ddp_grad") && ddp__dtype_is(ctx, DDP_DTYPE_FP32, "ddp_grad") ? ctx->flat.grads + ctx->model.params[id].offset : NULL;
}
ddp_bf16 *ddp_param_bf16(ddp_context *ctx, int id) {
    return ddp__valid_id(ctx, id, "ddp_param_bf16") && ddp__dtype_is(ctx, DDP_DTYPE_BF16, "ddp_param_bf16")
           ? (ddp__z3(ctx) ? (ddp_bf16 *)(void *)ctx->z3.view : ctx->flat.params_bf16) + ctx->model.params[id].offset : NULL;
}
ddp_bf16 *ddp_grad_bf16(ddp_context *ctx, int id) {
    return ddp__valid_id(ctx, id, "ddp_grad_bf16") && ddp__dtype_is(ctx, DDP_DTYPE_BF16, "ddp_grad_bf16") ? ctx->flat.grads_bf16 + ctx->model.params[id].offset : NULL;
}
size_t ddp_param_count(const ddp_context *ctx, int id) { return ctx && id >= 0 && id < ctx->model.num_params ? ctx->model.params[id].count : 0; }
const char *ddp_param_name(const ddp_context *ctx, int id) { return ctx && id >= 0 && id < ctx->model.num_params ? ctx->model.params[id].name : NULL; }
int ddp_num_params(const ddp_context *ctx) { return ctx ? ctx->model.num_params : 0; }
int ddp_num_buckets(const ddp_context *ctx) { return ctx ? ctx->model.num_buckets : 0; }

float *ddp_flat_params(ddp_context *ctx, size_t *count_out) {
    if (count_out) *count_out = !ctx ? 0 : ddp__master_parts(ctx) ? ctx->shard.count : ctx->flat.count;
    if (!ddp__committed(ctx, "ddp_flat_params")) return NULL;
    return ddp__z3(ctx) && !ctx->flat.params_bf16 ? (float *)(void *)ctx->z3.view : ctx->flat.params;   /* bf16: the master, as below PARAMETERS */
}

float *ddp_flat_grads(ddp_context *ctx, size_t *count_out) {
    if (count_out) *count_out = ctx ? ctx->flat.count : 0;
    return ddp__committed(ctx, "ddp_flat_grads") && ddp__dtype_is(ctx, DDP_DTYPE_FP32, "ddp_flat_grads") ? ctx->flat.grads : NULL;
}

ddp_bf16 *ddp_flat_params_bf16(ddp_context *ctx, size_t *count_out) {
    if (count_out) *count_out = ctx ? ctx->flat.count : 0;
    return ddp__committed(ctx, "ddp_flat_params_bf16") && ddp__dtype_is(ctx, DDP_DTYPE_BF16, "ddp_flat_params_bf16")
           ? (ddp__z3(ctx) ? (ddp_bf16 *)(void *)ctx->z3.view : ctx->flat.params_bf16) : NULL;
}

ddp_bf16 *ddp_flat_grads_bf16(ddp_context *ctx, size_t *count_out) {
    if (count_out) *count_out = ctx ? ctx->flat.count : 0;
    return ddp__committed(ctx, "ddp_flat_grads_bf16") && ddp__dtype_is(ctx, DDP_DTYPE_BF16, "ddp_flat_grads_bf16") ? ctx->flat.grads_bf16 : NULL;
}

ddp_result ddp_bucket(const ddp_context *ctx, int index, ddp_bucket_info *out) {
    const ddp__bucket *b;
    ddp_context *c = (ddp_context *)(uintptr_t)ctx;   /* only its error message changes */
    if (!ctx) return ddp__no_context(DDP_ERR_INVALID_ARGUMENT, "ddp_bucket", "the context is NULL");
    if (!out) return ddp__fail(c, DDP_ERR_INVALID_ARGUMENT, "ddp_bucket: out is NULL");
    if (index < 0 || index >= ctx->model.num_buckets)
        return ddp__fail(c, DDP_ERR_INVALID_ARGUMENT, "ddp_bucket: no bucket %d (there are %d%s)", index, ctx->model.num_buckets,
                         ddp__is_committed(ctx) ? "" : "; buckets exist after ddp_commit");
    b = &ctx->model.buckets[index];
    out->offset = b->offset;
    out->count = b->count;
    out->first_param = b->first_param;
    out->last_param = b->last_param;
    return DDP_OK;
}

ddp_result ddp_tape_record(ddp_context *ctx, ddp_backward_fn backward, const void *args,
                           size_t args_size, const int *param_ids, int num_param_ids) {
    ddp_result r = ddp__usable(ctx, 1, "ddp_tape_record");
    if (r == DDP_OK && (r = ddp__tape_record(ctx, backward, args, args_size, param_ids, num_param_ids)) != DDP_OK)
        ddp__life_event(ctx, DDP__ON_TAPE_FAILED);   /* ddp_backward refuses the incomplete tape */
    return r;
}

ddp_result ddp_backward(ddp_context *ctx) {
    ddp_result r = ddp__usable_wire(ctx, 1, "ddp_backward", 1);
    return r != DDP_OK ? r : ddp__backward(ctx);
}

void ddp_tape_reset(ddp_context *ctx) { if (ctx) ddp__tape_reset(ctx); }

ddp_result ddp_grad_ready(ddp_context *ctx, int id) {
    ddp_result r = ddp__usable_wire(ctx, 1, "ddp_grad_ready", 1);
    return r != DDP_OK ? r : ddp__grad_ready(ctx, id);
}

ddp_result ddp_finish(ddp_context *ctx) {
    ddp_result r = ddp__usable_wire(ctx, 1, "ddp_finish", 1);
    return r != DDP_OK ? r : ddp__finish(ctx);
}

ddp_result ddp_zero_grad(ddp_context *ctx) {
    ddp_result r = ddp__usable(ctx, 1, "ddp_zero_grad");
    return r != DDP_OK ? r : ddp__zero_grad(ctx);
}

void ddp_set_sync(ddp_context *ctx, int enabled) {
    if (!ctx) return;
    if (ddp__in_backward(ctx)) { ddp__log(ctx, DDP_LOG_WARN, "ddp_set_sync ignored: a backward is in flight"); return; }
    ctx->step.sync = enabled != 0;
    /* shard_accumulate on device gradients: mapped again before the program's backward writes them
       (a failure is named in ddp_last_error and logged; the backward's start tries again) */
    if (ctx->be && ddp__is_committed(ctx) && !ddp__failed(ctx) && ddp__z2_acc_on(ctx) && ctx->be->grads_map &&
        ctx->be->grads_map(ctx) != DDP_OK) {
        char buf[DDP__ERR_MAX];
        ddp__log(ctx, DDP_LOG_ERROR, "ddp_set_sync: %s", ddp__err_body(ctx, buf));
    }
}

ddp_step_stats ddp_last_step_stats(const ddp_context *ctx) {
    ddp_step_stats none;
    if (!ctx) { memset(&none, 0, sizeof none); none.slowest_rank = -1; return none; }
    if (ctx->be && ctx->up && ctx->be->stats) ctx->be->stats((ddp_context *)(uintptr_t)ctx);   /* refreshes a cache only */
    if (!ctx->step.last_stats.step) { none = ctx->step.last_stats; none.slowest_rank = -1; return none; }   /* no step yet */
    return ctx->step.last_stats;
}

ddp_result ddp_adamw_step(ddp_context *ctx, const ddp_adamw *opt, float *grad_norm_out) {
    /* sharded, the step uses the wire (the norm's blocks, the gather): an outer exchange settles first */
    ddp_result r = ctx && ddp__is_committed(ctx) && ddp__sharded(ctx) ? ddp__usable_wire(ctx, 1, "ddp_adamw_step", 0)
                                                                      : ddp__usable(ctx, 1, "ddp_adamw_step");
    if (r == DDP_OK && (r = ddp__adamw_step(ctx, opt, grad_norm_out)) == DDP_OK) r = ddp__outer_step(ctx);
    return r;
}

ddp_result ddp_consume_grads(ddp_context *ctx) {
    ddp_result r = ddp__usable(ctx, 1, "ddp_consume_grads");
    if (r == DDP_OK && ddp__z3(ctx))
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_consume_grads: not with DDP_SHARD_PARAMETERS (each rank's parts of "
                         "the parameters live apart from the gathered views a program's own optimizer would write): use "
                         "ddp_adamw_step");
    if (r == DDP_OK && ctx->outer.owed)
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_consume_grads: the last update's ddp_outer_step is missing "
                         "(with desc.outer, a program's own optimizer calls ddp_outer_step after each update)");
    if (r == DDP_OK && (r = ddp__consume_grads(ctx)) == DDP_OK) ctx->outer.owed = ddp__outer_on(ctx);
    return r;
}

ddp_result ddp_outer_step(ddp_context *ctx) {
    ddp_result r = ddp__usable(ctx, 1, "ddp_outer_step");
    if (r != DDP_OK || !ddp__outer_on(ctx)) return r;
    if (!ctx->outer.owed)
        return ddp__fail(ctx, DDP_ERR_INVALID_STATE, "ddp_outer_step without an update since the last one: call it once "
                         "after each update of your own optimizer (ddp_consume_grads, then the update, then ddp_outer_step); "
                         "ddp_adamw_step takes the outer step itself");
    ctx->outer.owed = 0;
    return ddp__outer_step(ctx);
}

ddp_outer_status ddp_outer_state(const ddp_context *ctx) {
    ddp_outer_status s;
    if (ctx) return ddp__outer_status(ctx);
    memset(&s, 0, sizeof s);
    s.in_flight = s.slowest_group = -1;
    return s;
}

ddp_result ddp_adamw_state(ddp_context *ctx, float **m, float **v, int64_t **step) {
    ddp_result r = ddp__usable(ctx, 1, "ddp_adamw_state");
    if (m) *m = NULL;
    if (v) *v = NULL;
    if (step) *step = NULL;
    if (r != DDP_OK || (r = ctx->be->adamw_state(ctx)) != DDP_OK) return r;
    if (m) *m = ctx->adam.m;
    if (v) *v = ctx->adam.v;
    if (step) *step = &ctx->adam.step;
    return DDP_OK;
}

ddp_result ddp_copy_to_host(ddp_context *ctx, ddp_buffer which, size_t offset, float *dst, size_t count) {
    ddp_result r = ddp__usable(ctx, 1, "ddp_copy_to_host");
    float *at = NULL;
    if (r != DDP_OK || (r = ddp__state_at(ctx, which, offset, dst, count, "ddp_copy_to_host", 0, &at)) != DDP_OK) return r;
    return count ? ddp__state_copy(ctx, which, at, offset, dst, count, 1) : DDP_OK;
}

ddp_result ddp_copy_from_host(ddp_context *ctx, ddp_buffer which, size_t offset, const float *src, size_t count) {
    ddp_result r = ddp__usable(ctx, 1, "ddp_copy_from_host");
    float *at = NULL;
    if (r != DDP_OK || (r = ddp__state_at(ctx, which, offset, src, count, "ddp_copy_from_host", 1, &at)) != DDP_OK) return r;
    if (count) r = ddp__state_written(ctx, which, offset, count, ddp__state_copy(ctx, which, at, offset, (float *)(uintptr_t)src,
                                                                                count, 0));
    return ddp__outer_params_set(ctx, which, offset, count, r);
}

ddp_result ddp_gather_to_host(ddp_context *ctx, ddp_buffer which, size_t offset, float *dst, size_t count, int root) {
    ddp_result r = ddp__usable_wire(ctx, 1, "ddp_gather_to_host", 0);
    if (r == DDP_OK) r = ddp__check_root(ctx, root, "ddp_gather_to_host");
    return r != DDP_OK ? r : ddp__gather_to_host(ctx, which, offset, dst, count, root);
}

ddp_result ddp_scatter_from_host(ddp_context *ctx, ddp_buffer which, size_t offset, const float *src, size_t count, int root) {
    ddp_result r = ddp__usable_wire(ctx, 1, "ddp_scatter_from_host", 0);
    if (r == DDP_OK) r = ddp__check_root(ctx, root, "ddp_scatter_from_host");
    if (r == DDP_OK) r = ddp__scatter_from_host(ctx, which, offset, src, count, root);
    return ddp__outer_params_set(ctx, which, offset, count, r);
}

ddp_result ddp_save(ddp_context *ctx, const char *path, const void *user, size_t user_bytes) {
    ddp_result r = ddp__usable_wire(ctx, 1, "ddp_save", 0);
    if (r != DDP_OK) return r;
    if (!path || !*path) return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_save: no path (NULL or empty)");
    if (strlen(path) >= PATH_MAX - 64) return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_save: the path is %zu bytes long", strlen(path));
    if (user_bytes && !user) return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_save: NULL user blob of %zu bytes", user_bytes);
    return ddp__save(ctx, path, user, user_bytes);
}

ddp_result ddp_save_check(ddp_context *ctx, const char *path, int *holds_out) {
    ddp_result r = ddp__usable(ctx, 0, "ddp_save_check");
    if (holds_out) *holds_out = 0;
    if (r != DDP_OK) return r;
    if (!path || !*path) return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_save_check: no path (NULL or empty)");
    if (strlen(path) >= PATH_MAX - 64) return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_save_check: the path is %zu bytes long", strlen(path));
    return ddp__save_check(ctx, path, holds_out);
}

ddp_result ddp_load(ddp_context *ctx, const char *path, void *user, size_t user_capacity,
                    ddp_checkpoint_check_fn check, void *check_arg, ddp_checkpoint_info *info_out) {
    ddp_result r = ddp__usable_wire(ctx, 1, "ddp_load", 0);
    if (r != DDP_OK) return r;
    if (!path || !*path) return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_load: no path (NULL or empty)");
    if (user_capacity && !user) return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_load: NULL user buffer of %zu bytes", user_capacity);
    return ddp__load(ctx, path, user, user_capacity, check, check_arg, info_out);
}

ddp_result ddp_allreduce(ddp_context *ctx, float *data, size_t count, ddp_op op) {
    ddp_result r = ddp__usable_wire(ctx, 0, "ddp_allreduce", 0);
    if (r != DDP_OK) return r;
    if (op != DDP_AVG && op != DDP_SUM) return ddp__fail(ctx, DDP_ERR_INVALID_ARGUMENT, "ddp_allreduce: unknown op %d", (int)op);
    return ddp__user_collective(ctx, op == DDP_SUM ? DDP__KIND_SUM : DDP__KIND_AVG, data, count, 0, "ddp_allreduce");
}

ddp_result ddp_broadcast(ddp_context *ctx, void *data, size_t bytes, int root) {
    ddp_result r = ddp__usable_wire(ctx, 0, "ddp_broadcast", 0);
    return r != DDP_OK ? r : ddp__user_collective(ctx, DDP__KIND_BROADCAST, data, bytes, root, "ddp_broadcast");
}

ddp_result ddp_barrier(ddp_context *ctx) {
    ddp_result r = ddp__usable_wire(ctx, 0, "ddp_barrier", 0);
    return r != DDP_OK ? r : ddp__user_collective(ctx, DDP__KIND_BARRIER, NULL, 0, 0, "ddp_barrier");
}

ddp_result ddp_cancel(ddp_context *ctx) {
    if (!ctx) return ddp__no_context(DDP_ERR_INVALID_ARGUMENT, "ddp_cancel", "the context is NULL");
    __atomic_store_n(&ctx->embed.cancel, 1, __ATOMIC_RELEASE);
    return DDP_OK;
}

void ddp_cancel_token_set(ddp_cancel_token *token) {
    if (token) __atomic_store_n(&token->cancelled, 1, __ATOMIC_RELEASE);
}

int ddp_cancel_token_is_set(const ddp_cancel_token *token) {
    return token ? __atomic_load_n(&token->cancelled, __ATOMIC_ACQUIRE) : 0;
}

ddp_result ddp_progress_read(const ddp_context *ctx, ddp_progress *out) {
    if (!ctx) {
        if (out) memset(out, 0, sizeof *out);
        return ddp__no_context(DDP_ERR_INVALID_ARGUMENT, "ddp_progress_read", "the context is NULL");
    }
    if (!out) return ddp__no_context(DDP_ERR_INVALID_ARGUMENT, "ddp_progress_read", "out is NULL");
    ddp__progress_read(ctx, out);
    return DDP_OK;
}

ddp_result ddp_report_loss(ddp_context *ctx, float loss) {
    ddp_result r = ddp__usable(ctx, 0, "ddp_report_loss");
    if (r == DDP_OK) ddp__report_loss(ctx, loss);
    return r;
}

ddp_result ddp_join(ddp_context *ctx) {
    ddp_result r = ddp__usable_wire(ctx, 1, "ddp_join", 0);
    return r != DDP_OK ? r : ddp__join(ctx);
}

/* The sampler's entry points need no context: a bad field is named in ddp_last_error(NULL). */
static ddp_result ddp__sampler_valid(const ddp_sampler *s, const char *call) {
    char why[192];
    if (!s) return ddp__no_context(DDP_ERR_INVALID_ARGUMENT, call, "the sampler is NULL");
    if (s->n == 0) {
        snprintf(why, sizeof why, "rank %d: the sampler's dataset is empty (n = 0)", s->rank);
        return ddp__no_context(DDP_ERR_INVALID_ARGUMENT, call, why);
    }
    if ((s->shuffle != 0 && s->shuffle != 1) || (s->drop_last != 0 && s->drop_last != 1)) {
        snprintf(why, sizeof why, "ddp_sampler.%s is %d, not 0 or 1: %s", s->shuffle != 0 && s->shuffle != 1 ? "shuffle" : "drop_last",
                 s->shuffle != 0 && s->shuffle != 1 ? s->shuffle : s->drop_last, DDP__ZERO_INIT_HINT);
        return ddp__no_context(DDP_ERR_INVALID_ARGUMENT, call, why);
    }
    if (s->world < 1) {
        snprintf(why, sizeof why, "the sampler's world is %d; it must be >= 1 (the number of ranks that share the dataset)", s->world);
        return ddp__no_context(DDP_ERR_INVALID_ARGUMENT, call, why);
    }
    if (s->rank < 0 || s->rank >= s->world) {
        snprintf(why, sizeof why, "the sampler's rank %d is out of range for world %d (0 .. %d)", s->rank, s->world, s->world - 1);
        return ddp__no_context(DDP_ERR_INVALID_ARGUMENT, call, why);
    }
    return DDP_OK;
}

ddp_result ddp_sampler_count(const ddp_sampler *s, uint64_t *count_out) {
    ddp_result r = ddp__sampler_valid(s, "ddp_sampler_count");
    if (count_out) *count_out = 0;
    if (r != DDP_OK) return r;
    if (!count_out) return ddp__no_context(DDP_ERR_INVALID_ARGUMENT, "ddp_sampler_count", "count_out is NULL");
    *count_out = ddp__sampler_count(s);
    return DDP_OK;
}

ddp_result ddp_sample(const ddp_sampler *s, uint64_t epoch, uint64_t i, uint64_t *index_out) {
    ddp_result r = ddp__sampler_valid(s, "ddp_sample");
    uint64_t count;
    char why[192];   /* the longest message fits, and the call's name too in ddp_last_error(NULL)'s 256 */
    if (index_out) *index_out = UINT64_MAX;
    if (r != DDP_OK) return r;
    if (!index_out) return ddp__no_context(DDP_ERR_INVALID_ARGUMENT, "ddp_sample", "index_out is NULL");
    if (i >= (count = ddp__sampler_count(s))) {
        snprintf(why, sizeof why, "rank %d: position %llu is past this rank's %llu sample(s) an epoch (n = %llu, world %d, %s)",
                 s->rank, (unsigned long long)i, (unsigned long long)count, (unsigned long long)s->n, s->world,
                 s->drop_last ? "drop_last: floor(n/world)" : "padded: ceil(n/world)");
        return ddp__no_context(DDP_ERR_INVALID_ARGUMENT, "ddp_sample", why);
    }
    *index_out = ddp__sample(s, epoch, i);
    return DDP_OK;
}

#ifdef __cplusplus
}
#endif
#endif /* DDP__IMPLEMENTED */
#endif /* DDP_IMPLEMENTATION */

/*
   LICENSE (MIT)
   Copyright (c) 2026 the ddp.h authors

   Permission is hereby granted, free of charge, to any person obtaining a copy of this software
   and associated documentation files (the "Software"), to deal in the Software without
   restriction, including without limitation the rights to use, copy, modify, merge, publish,
   distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the
   Software is furnished to do so, subject to the following conditions:

   The above copyright notice and this permission notice shall be included in all copies or
   substantial portions of the Software.

   THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING
   BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
   NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
   DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
   OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
