// Collective communication for one process group, behind a narrow interface. The c10d headers
// (ProcessGroupGloo/NCCL, TCPStore) are confined to comm_c10d.cpp: they are slow to compile and
// nothing else needs them.
//
// Every collective is asynchronous and returns a Work handle. wait() blocks the calling thread
// on CPU (Gloo); on CUDA (NCCL) it makes the current stream wait for the communication stream
// without blocking the host — that is what lets FSDP overlap gathers with compute. Failures
// (a dead peer, a timeout) surface from wait() or the call itself as CommError naming the
// group and the collective.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace flowtrain::parallel {

struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};
using WorkHandle = std::shared_ptr<Work>;

enum class ReduceOp { Sum, Avg, Max };

// Host seconds the calling thread has spent blocked in Work::wait() (barriers included), over
// the process's life. The training thread's share of a step is its collective wait: time spent
// waiting for peers (and the transfer itself) rather than computing. On NCCL wait() does not block
// the host, so there it counts only the host-side waits (the straggler report is coarser).
double collective_wait_seconds();

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int64_t rank() const = 0;  // rank within this group
  virtual int64_t size() const = 0;
  virtual const std::string& name() const = 0;  // "shard[0,1]" in error messages

  // out (contiguous, size·in.numel() elements) = concatenation of every member's `in`.
  virtual WorkHandle all_gather(const at::Tensor& out, const at::Tensor& in) = 0;
  // out (in.numel()/size elements) = this rank's chunk of the element-wise reduction of `in`.
  virtual WorkHandle reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) = 0;
  virtual WorkHandle all_reduce(const at::Tensor& tensor, ReduceOp op) = 0;
  virtual WorkHandle broadcast(const at::Tensor& tensor, int64_t root) = 0;
  // Equal chunks along dim 0 (both contiguous, same size): chunk j of `in` goes to member j,
  // chunk i of `out` comes from member i (its chunk number rank()).
  virtual WorkHandle all_to_all(const at::Tensor& out, const at::Tensor& in) = 0;
  // Point-to-point within the group, the hop of a ring: sends `out` to member `dst` and
  // receives member `src`'s message (same shape) into `in`. `tag` tells apart messages in flight
  // between the same pair. On NCCL the send and the receive are issued as one group (c10d
  // coalescing, what batch_isend_irecv does): issued separately, a send and a recv between the
  // same or cyclic peers can wait on each other forever.
  virtual WorkHandle exchange(const at::Tensor& out, int64_t dst, const at::Tensor& in, int64_t src, int64_t tag) = 0;
  virtual void barrier() = 0;
};

}  // namespace flowtrain::parallel
