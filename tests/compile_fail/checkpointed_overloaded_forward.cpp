// A module whose forward is overloaded and takes no single tensor: Checkpointed cannot call it.
#include <ckpt/modules.h>

struct PairImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& a, const at::Tensor& b) { return a + b; }
  at::Tensor forward(const at::Tensor& a, double scale) { return a * scale; }
};
TORCH_MODULE(Pair);

void misuse() {
  ckpt::Checkpointed wrapped(Pair{});
}
