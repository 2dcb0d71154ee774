#pragma once

namespace ckpt {

/// True while ckpt is recomputing a checkpointed region on the calling thread, during the
/// backward pass. Code with side effects (counters, logging, running statistics) can check it to
/// act only once; ckpt's own chain functions use it to keep buffers from being updated twice.
bool is_recomputing();

}  // namespace ckpt
