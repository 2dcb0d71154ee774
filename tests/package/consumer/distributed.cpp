// Consumes ckpt::distributed from the installed package: a world of one process on a free port.

#include <ckpt/distributed.h>

#include <torch/nn/modules/linear.h>

#include <iostream>

int main() {
  const auto group =
      ckpt::ProcessGroup::join(ckpt::RendezvousOptions().world_size(1).master_port(0));
  torch::nn::Linear model(4, 2);
  ckpt::DataParallel parallel(model.ptr(), group);
  parallel.begin_step();
  model(torch::ones({3, 4})).sum().backward();
  std::cout << "ckpt::distributed: " << group.world_size() << " rank, "
            << parallel.reductions().size() << " parameters reduced\n";
  return 0;
}
