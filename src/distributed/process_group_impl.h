#pragma once

// The c10d objects behind a ckpt::ProcessGroup, for the distributed library's own files.

#include <ckpt/distributed.h>

#include <compat/c10d_compat.h>

#include <chrono>

namespace ckpt {

struct ProcessGroup::Impl {
  compat::StorePtr store;
  compat::GroupPtr group;
  int rank = 0;
  int world_size = 1;
  int port = 0;
  Backend backend = Backend::Gloo;
  std::chrono::milliseconds timeout{0};
};

}  // namespace ckpt
