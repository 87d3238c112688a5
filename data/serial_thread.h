// Background threads (data workers, checkpoint writers) that run ATen ops must run them on
// their own thread only, never as the master of an OpenMP team.
//
// Why it matters: LibTorch's CPU ops parallelise with OpenMP, and every thread that enters a
// parallel region gets a team of its own. Once the process holds more OpenMP threads than it
// has cores, libgomp stops spinning between regions (its "throttled" spin count) and puts the
// training step's team to sleep on a futex after every op: ~2,300 wake-ups a step for the
// Flux t2i model on 2 cores, 0.44 s/step against 0.34 s without loader threads (docs/perf.md).
// c10::ParallelGuard does not prevent it: under OpenMP at::parallel_for asks omp_in_parallel(),
// not the guard, whether it is already inside a parallel region.
#pragma once

namespace flowtrain::data {

// Makes at::parallel_for (and MKL) on the calling thread run serially, for the thread's life.
// Call first thing in the thread's body; a no-op where LibTorch was built without OpenMP.
void run_aten_serially_on_this_thread();

}  // namespace flowtrain::data
