// The examples of docs/ and the README run in one process, and those of docs/emulated-device.md
// need the emulated accelerator, which must be installed before the process's first backward
// pass (any example's): here, before main().

#include <ckpt/emulated_device.h>

namespace {
const bool installed = (ckpt::emulated_device::install(), true);
}  // namespace
