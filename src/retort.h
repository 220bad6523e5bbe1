// retort: a tensor engine with reverse-mode autodiff, CPU and CUDA backends, and fused distillation losses.
// Include this one header to use the library.
#pragma once
#include "retort_config.h"
#include "core/backend.h"
#include "core/context.h"
#include "core/cpu_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/tensor.h"
#include "cuda/cuda_backend.h"
#include "nn/optim.h"
#include "nn/transformer.h"
#include "ops/ops.h"
#include "ops/loss/losses.h"
