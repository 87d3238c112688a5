// ProcessGroupNCCL (GPU): one process per GPU, the device picked by LOCAL_RANK. Compiled against
// the nccl.h of the nvidia-nccl wheel that torch links (ProcessGroupNCCL's Options layout depends
// on the NCCL version macros). Without NCCL in the build, asking for it is a clear error.
#include "parallel/c10d_backends.h"
#include "parallel/comm.h"

#ifdef FLOWTRAIN_WITH_NCCL
#define USE_C10D_NCCL 1
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>

namespace flowtrain::parallel::detail {

#ifdef FLOWTRAIN_WITH_NCCL

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout, c10::Device device) {
  if (!device.is_cuda()) throw CommError("parallel.backend nccl needs run.device cuda");
  // A failed or timed-out collective must end the process, not leave it waiting forever: the
  // watchdog tears the process down (mode 3 = tear down after logging). Users may override.
  setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3", /*overwrite=*/0);
  c10::cuda::set_device(device.index());
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
  // Bound to this rank's device and connected now (what init_process_group(device_id=…) does):
  // NCCL never has to guess the device from a tensor, and the communicator is created
  // collectively here, while every rank is in the same place, instead of lazily inside the first
  // collective of each group.
  pg->setBoundDeviceId(device);
  pg->eagerConnectSingleDevice(device);
  return pg;
}

void shutdown_nccl_backend(const c10::intrusive_ptr<c10d::Backend>& backend) {
  if (auto* nccl = dynamic_cast<c10d::ProcessGroupNCCL*>(backend.get())) nccl->shutdown();
}

#else

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                    std::chrono::milliseconds, c10::Device) {
  throw CommError("this flowtrain was built without NCCL (FLOWTRAIN_CUDA=OFF or nccl.h not found); use parallel.backend gloo");
}

void shutdown_nccl_backend(const c10::intrusive_ptr<c10d::Backend>&) {}

#endif

}  // namespace flowtrain::parallel::detail
