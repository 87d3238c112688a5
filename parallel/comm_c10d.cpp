// c10d-backed process groups (the only file that includes the c10d headers).
#define USE_C10D_GLOO 1
#include "parallel/c10d_backends.h"
#include "parallel/collective_watchdog.h"
#include "parallel/runtime.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>

namespace flowtrain::parallel {

namespace {

thread_local double t_collective_wait_s = 0;  // per thread: the checkpoint saver's votes are not the step's

// First line of a c10d error: their messages carry long C++ stack traces.
std::string first_line(const std::string& s) {
  const auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

class C10dWork : public Work {
 public:
  C10dWork(c10::intrusive_ptr<c10d::Work> work, std::string what, std::function<void()> then)
      : work_(std::move(work)), what_(std::move(what)), then_(std::move(then)) {}
  void wait() override {
    if (done_) return;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      work_->wait();
    } catch (const std::exception& e) {
      throw CommError(fmt::format("{} failed: {}", what_, first_line(e.what())));
    }
    t_collective_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    done_ = true;
    if (then_) then_();
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;
  std::function<void()> then_;
  bool done_ = false;
};

class C10dComm : public Comm {
 public:
  // `watchdog` (may be null): where collectives whose wait() does not block the host (NCCL) get
  // their host-side deadline.
  C10dComm(c10::intrusive_ptr<c10d::Backend> backend, std::string name, bool native_avg,
           CollectiveWatchdog* watchdog = nullptr)
      : backend_(std::move(backend)), name_(std::move(name)), native_avg_(native_avg), watchdog_(watchdog) {}
  int64_t rank() const override { return backend_->getRank(); }
  int64_t size() const override { return backend_->getSize(); }
  const std::string& name() const override { return name_; }

  WorkHandle all_gather(const at::Tensor& out, const at::Tensor& in) override {
    TORCH_CHECK(out.numel() == in.numel() * size(), name_, ": all_gather size mismatch");
    at::Tensor o = out, i = in;
    return run("all_gather", [&] { return backend_->_allgather_base(o, i); });
  }
  WorkHandle reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    TORCH_CHECK(in.numel() == out.numel() * size(), name_, ": reduce_scatter size mismatch");
    at::Tensor o = out, i = in;
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d_op(op);
    return run("reduce_scatter", [&] { return backend_->_reduce_scatter_base(o, i, opts); }, divide_after(op, out));
  }
  WorkHandle all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    std::vector<at::Tensor> ts{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d_op(op);
    return run("all_reduce", [&] { return backend_->allreduce(ts, opts); }, divide_after(op, tensor));
  }
  WorkHandle broadcast(const at::Tensor& tensor, int64_t root) override {
    std::vector<at::Tensor> ts{tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    return run("broadcast", [&] { return backend_->broadcast(ts, opts); });
  }
  WorkHandle all_to_all(const at::Tensor& out, const at::Tensor& in) override {
    TORCH_CHECK(out.numel() == in.numel() && in.size(0) % size() == 0, name_, ": all_to_all size mismatch");
    at::Tensor o = out, i = in;
    std::vector<int64_t> equal_splits;  // empty = equal chunks of dim 0
    return run("all_to_all", [&] { return backend_->alltoall_base(o, i, equal_splits, equal_splits); });
  }
  WorkHandle exchange(const at::Tensor& out, int64_t dst, const at::Tensor& in, int64_t src, int64_t tag) override {
    std::vector<at::Tensor> outs{out}, ins{in};
    if (backend_->supportsCoalescing()) {
      return run("exchange", [&] {
        backend_->startCoalescing();
        backend_->send(outs, static_cast<int>(dst), static_cast<int>(tag));
        backend_->recv(ins, static_cast<int>(src), static_cast<int>(tag));
        return backend_->endCoalescing();
      });
    }
    // Gloo: both are asynchronous and matched by tag; post the receive first.
    struct Both : Work {
      WorkHandle recv, send;
      void wait() override {
        recv->wait();
        send->wait();
      }
    };
    auto both = std::make_shared<Both>();
    both->recv = run("recv", [&] { return backend_->recv(ins, static_cast<int>(src), static_cast<int>(tag)); });
    both->send = run("send", [&] { return backend_->send(outs, static_cast<int>(dst), static_cast<int>(tag)); });
    return both;
  }
  void barrier() override { run("barrier", [&] { return backend_->barrier(); })->wait(); }

 private:
  // Gloo has no AVG: sum, then divide once the data has arrived.
  c10d::ReduceOp c10d_op(ReduceOp op) const {
    if (op == ReduceOp::Max) return c10d::ReduceOp::MAX;
    return op == ReduceOp::Avg && native_avg_ ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
  }
  std::function<void()> divide_after(ReduceOp op, const at::Tensor& t) const {
    if (op != ReduceOp::Avg || native_avg_ || size() == 1) return {};
    const double n = static_cast<double>(size());
    return [t, n]() mutable { t.div_(n); };
  }
  template <typename Issue>
  WorkHandle run(const char* op, Issue&& issue, std::function<void()> then = {}) {
    const std::string what = fmt::format("{} on group {}", op, name_);
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = issue();
    } catch (const std::exception& e) {
      throw CommError(fmt::format("{} failed: {}", what, first_line(e.what())));
    }
    if (watchdog_) watchdog_->watch(what, [work] { return work->isCompleted(); });
    return std::make_shared<C10dWork>(std::move(work), what, std::move(then));
  }

  c10::intrusive_ptr<c10d::Backend> backend_;
  std::string name_;
  bool native_avg_;
  CollectiveWatchdog* watchdog_;
};

std::string group_name(const char* kind, const std::vector<int64_t>& ranks) {
  return fmt::format("{}[{}]", kind, fmt::join(ranks, ","));
}

bool is_loopback(const std::string& addr) {
  return addr == "127.0.0.1" || addr == "localhost" || addr == "::1";
}

class C10dRuntime : public Runtime {
 public:
  explicit C10dRuntime(const RuntimeOptions& o) : env_(o.env), mesh_(o.mesh, o.env.world) {
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
    if (o.backend != "nccl" && o.backend != "gloo")  // the config's auto is resolved before (trainer/config/resolve.h)
      throw std::invalid_argument("Runtime: backend must be nccl or gloo, got '" + o.backend + "'");
    backend_ = o.backend;
    device_index_ = o.device;
    if (env_.world == 1) {
      store_ = c10::make_intrusive<c10d::HashStore>();
    } else {
      c10d::TCPStoreOptions so;
      so.port = static_cast<uint16_t>(env_.master_port);
      so.isServer = env_.rank == 0 && !env_.launcher_store;  // see DistEnv::launcher_store
      so.numWorkers = static_cast<size_t>(env_.world);
      so.waitWorkers = true;
      so.timeout = timeout;
      try {
        auto tcp = c10::make_intrusive<c10d::TCPStore>(env_.master_addr, so);
        // The key prefix PyTorch's workers use on an agent's store, so a mixed job would agree.
        if (env_.launcher_store)
          store_ = c10::make_intrusive<c10d::PrefixStore>(fmt::format("/worker/attempt_{}", env_.store_attempt), tcp);
        else
          store_ = tcp;
      } catch (const std::exception& e) {
        throw CommError(fmt::format("rendezvous at {}:{}{} as rank {} of WORLD_SIZE {} failed within {} s: {}",
                                    env_.master_addr, env_.master_port,
                                    env_.launcher_store ? " (the launcher's store)" : "", env_.rank, env_.world,
                                    o.timeout_s, first_line(e.what())));
      }
      check_world_agreement(timeout);
    }
    make_device(o);  // Gloo serves the checkpoint group under NCCL too
    if (backend_ == "nccl") {
      // NCCL's wait() does not block the host: give every collective a host-side deadline.
      watchdog_ = std::make_unique<CollectiveWatchdog>(timeout, [rank = env_.rank](const std::string& message) {
        std::fprintf(stderr, "flowtrain: distributed failure (a peer died, hung or disagreed) on rank %lld: %s\n",
                     static_cast<long long>(rank), message.c_str());
        std::fflush(stderr);
        std::_Exit(1);  // NCCL teardown with a collective in flight can block: leave now
      }, std::chrono::milliseconds(500), [device = o.device] {
        c10::impl::VirtualGuardImpl(device.type()).setDevice(device);
      });
    }
    world_ = make_group("world", all_ranks(), timeout);
    shard_ = make_group("shard", mesh_.shard_group(env_.rank), timeout);
    replicate_ = make_group("replicate", mesh_.replicate_group(env_.rank), timeout);
    context_ = make_group("context", mesh_.context_group(env_.rank), timeout);
    if (hybrid_context()) {
      context_ulysses_ = make_group("context_ulysses", mesh_.context_ulysses_group(env_.rank), timeout);
      context_ring_ = make_group("context_ring", mesh_.context_ring_group(env_.rank), timeout);
    }
    checkpoint_ = make_group("checkpoint", all_ranks(), timeout, /*gloo=*/true);
  }

  int64_t rank() const override { return env_.rank; }
  int64_t world() const override { return env_.world; }
  const Mesh& mesh() const override { return mesh_; }
  const std::string& backend() const override { return backend_; }
  Comm& world_group() override { return *world_; }
  Comm& shard_group() override { return *shard_; }
  Comm& replicate_group() override { return *replicate_; }
  Comm& context_group() override { return *context_; }
  Comm& context_ulysses_group() override { return hybrid_part(context_ulysses_); }
  Comm& context_ring_group() override { return hybrid_part(context_ring_); }
  Comm& checkpoint_group() override { return *checkpoint_; }
  void shutdown() override {
    watchdog_.reset();  // stop polling before the communicators go
    for (auto& b : nccl_backends_) detail::shutdown_nccl_backend(b);
    nccl_backends_.clear();
    checkpoint_.reset();
    context_ring_.reset();
    context_ulysses_.reset();
    context_.reset();
    replicate_.reset();
    shard_.reset();
    world_.reset();
  }

 private:
  bool hybrid_context() const { return mesh_.shape().cp_ulysses > 1 && mesh_.shape().cp_ulysses < mesh_.shape().cp; }
  Comm& hybrid_part(const std::unique_ptr<Comm>& group) const {
    if (!group) throw std::logic_error("no hybrid context-parallel groups: the mesh has cp_ulysses 1 or = cp");
    return *group;
  }

  std::vector<int64_t> all_ranks() const {
    std::vector<int64_t> r(env_.world);
    for (int64_t i = 0; i < env_.world; ++i) r[i] = i;
    return r;
  }

  // Every rank records the world size it was started with; a rank started with another value
  // (one node's WORLD_SIZE wrong) or a rank number claimed twice stops the job at start.
  void check_world_agreement(std::chrono::milliseconds timeout) {
    const std::string mine = std::to_string(env_.world);
    store_->set(fmt::format("flowtrain/world_size/{}", env_.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    if (store_->add(fmt::format("flowtrain/rank_claims/{}", env_.rank), 1) != 1)
      throw CommError(fmt::format("rank {} was claimed by two processes: check RANK / SLURM_PROCID", env_.rank));
    std::vector<std::string> keys;
    for (int64_t r = 0; r < env_.world; ++r) keys.push_back(fmt::format("flowtrain/world_size/{}", r));
    try {
      store_->wait(keys, timeout);
    } catch (const std::exception& e) {
      // Name the absent ranks: their hosts are where to look.
      std::vector<int64_t> missing;
      try {
        for (int64_t r = 0; r < env_.world; ++r)
          if (!store_->check({keys[r]})) missing.push_back(r);
      } catch (const std::exception&) {  // the store itself is gone: the wait's error says so
      }
      throw CommError(fmt::format("rendezvous at {}:{}: {} of WORLD_SIZE {} did not arrive within {} s ({})",
                                  env_.master_addr, env_.master_port,
                                  missing.empty() ? std::string("not every rank")
                                                  : fmt::format("rank {}", fmt::join(missing, ", ")),
                                  env_.world, timeout.count() / 1000.0, first_line(e.what())));
    }
    for (int64_t r = 0; r < env_.world; ++r) {
      auto v = store_->get(keys[r]);
      const std::string theirs(v.begin(), v.end());
      if (theirs != mine)
        throw CommError(fmt::format("WORLD_SIZE disagrees: rank {} was started with WORLD_SIZE={}, rank {} with {}",
                                    env_.rank, mine, r, theirs));
    }
  }

  void make_device(const RuntimeOptions& o) {
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
      device_ = c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
    } else if (env_.world == 1 || is_loopback(env_.master_addr)) {
      device_ = c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    } else {
      device_ = c10d::ProcessGroupGloo::createDefaultDevice();
    }
  }

  std::unique_ptr<Comm> make_group(const char* kind, const std::vector<int64_t>& ranks,
                                   std::chrono::milliseconds timeout, bool gloo = false) {
    const std::string name = group_name(kind, ranks);
    int64_t my_index = -1;
    for (size_t i = 0; i < ranks.size(); ++i)
      if (ranks[i] == env_.rank) my_index = static_cast<int64_t>(i);
    TORCH_CHECK(my_index >= 0, "rank ", env_.rank, " is not in group ", name);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("flowtrain/group/" + name, store_);
    if (backend_ == "nccl" && !gloo) {
      c10::intrusive_ptr<c10d::Backend> pg;
      try {
        pg = detail::make_nccl_backend(prefixed, static_cast<int>(my_index), static_cast<int>(ranks.size()), timeout,
                                       device_index_);
      } catch (const CommError&) {
        throw;
      } catch (const std::exception& e) {
        throw CommError(fmt::format("creating NCCL process group {} failed: {}", name, first_line(e.what())));
      }
      nccl_backends_.push_back(pg);
      return std::make_unique<C10dComm>(pg, name, /*native_avg=*/true, watchdog_.get());
    }
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    opts->devices.push_back(device_);
    c10::intrusive_ptr<c10d::Backend> pg;
    try {
      pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, static_cast<int>(my_index),
                                                       static_cast<int>(ranks.size()), opts);
      // One barrier now, on the constructing thread. torch 2.11's flight recorder (one per
      // process for every Gloo group) adds a group to a std::map on that group's first collective
      // without holding its lock, while every other collective reads the map: the checkpoint
      // group's first all-reduce, from the saver's thread, could rebalance the map under a
      // training collective's lookup (a segfault; seen with in-process ranks). After this,
      // collectives only read it.
      pg->barrier()->wait();
    } catch (const std::exception& e) {
      throw CommError(fmt::format("creating process group {} failed: {}", name, first_line(e.what())));
    }
    return std::make_unique<C10dComm>(pg, name, /*native_avg=*/false);
  }

  DistEnv env_;
  Mesh mesh_;
  std::string backend_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::shared_ptr<::gloo::transport::Device> device_;
  c10::Device device_index_{c10::kCPU};
  std::vector<c10::intrusive_ptr<c10d::Backend>> nccl_backends_;
  // NCCL only. Stopped first at shutdown (the groups, released right after, issue nothing more);
  // declared before the groups, so destroyed after them otherwise.
  std::unique_ptr<CollectiveWatchdog> watchdog_;
  std::unique_ptr<Comm> world_, shard_, replicate_, context_, context_ulysses_, context_ring_, checkpoint_;
};

}  // namespace

double collective_wait_seconds() { return t_collective_wait_s; }

std::unique_ptr<Runtime> Runtime::create(const RuntimeOptions& options) {
  return std::make_unique<C10dRuntime>(options);
}

}  // namespace flowtrain::parallel
