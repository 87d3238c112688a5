#include "data/serial_thread.h"

#include <ATen/Parallel.h>

#include <dlfcn.h>

namespace flowtrain::data {

namespace {

// Looked up in the process rather than linked: the OpenMP runtime must be the one LibTorch
// loaded (the wheel ships its own libgomp); a second runtime would keep separate thread pools.
template <typename Fn>
Fn find(const char* symbol) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, symbol));
}

}  // namespace

void run_aten_serially_on_this_thread() {
  static const auto omp_set_num_threads = find<void (*)(int)>("omp_set_num_threads");
  // MKL's C entry point (mkl_service.h maps mkl_set_num_threads_local to it); the lower-case
  // symbol is the Fortran one, which takes a pointer.
  static const auto mkl_set_num_threads_local = find<int (*)(int)>("MKL_Set_Num_Threads_Local");
  // ATen initialises each thread's OpenMP thread count lazily, on its first parallel op, to the
  // process-wide count. Run that initialisation now so it cannot undo the override below.
  (void)at::get_num_threads();
  // Both settings are per thread (an OpenMP ICV of the calling thread; MKL's thread-local
  // count), so the training thread keeps its team. at::get_num_threads() is 1 here from now on,
  // which is what at::parallel_for checks before opening a parallel region.
  if (omp_set_num_threads) omp_set_num_threads(1);
  if (mkl_set_num_threads_local) mkl_set_num_threads_local(1);
}

}  // namespace flowtrain::data
