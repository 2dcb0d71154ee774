// Checkpoints one function through the installed package and checks the gradient.
#include <ckpt/ckpt.h>

#include <ATen/ATen.h>

#include <iostream>

int main() {
  auto x = at::randn({4}).requires_grad_();
  auto y = ckpt::checkpoint([](const at::Tensor& t) { return t.sin().exp(); }, x);
  y.sum().backward();
  const bool ok = at::allclose(x.grad(), (x.sin().exp() * x.cos()).detach());
  std::cout << (ok ? "consumer: gradient ok" : "consumer: WRONG gradient") << "\n";
  return ok ? 0 : 1;
}
