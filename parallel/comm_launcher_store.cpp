// LauncherStore over a c10d TCPStore server (one of the files allowed the c10d headers).
#include "parallel/launcher_store.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fmt/format.h>

#include <stdexcept>

namespace flowtrain::parallel {

struct LauncherStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

LauncherStore::LauncherStore(int port) : impl_(std::make_unique<Impl>()) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = true;
  so.waitWorkers = false;  // ranks arrive later; the ranks' own rendezvous checks that all do
  try {
    // The server listens on every interface; the address is only for the object's own client.
    impl_->store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw std::runtime_error(fmt::format("cannot host the rendezvous store on port {}: {}",
                                         port == 0 ? std::string("(any)") : std::to_string(port),
                                         what.substr(0, what.find('\n'))));
  }
}

LauncherStore::~LauncherStore() = default;

int LauncherStore::port() const { return impl_->store->getPort(); }

}  // namespace flowtrain::parallel
