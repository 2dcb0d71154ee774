// Precompiled for the ckpt program's LibTorch files (torch/torch.h costs ~35 s per file).
#pragma once
#include <torch/torch.h>
