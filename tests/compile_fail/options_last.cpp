// Options passed last, as in Python: checkpoint(fn, x, options).
#include <ckpt/checkpoint.h>

at::Tensor misuse(const at::Tensor& x) {
  return ckpt::checkpoint([](const at::Tensor& t) { return t.mul(2); }, x,
                          ckpt::CheckpointOptions().use_reentrant(true));
}
