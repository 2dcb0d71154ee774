#pragma once

/// \file
/// Umbrella header of ckpt, activation checkpointing for LibTorch.

#include <ckpt/candidate.h>
#include <ckpt/checkpoint.h>
#include <ckpt/graph_exec_group.h>
#include <ckpt/memory_label.h>
#include <ckpt/memory_tracker.h>
#include <ckpt/model_profiler.h>
#include <ckpt/modeled_device.h>
#include <ckpt/modules.h>
#include <ckpt/offload.h>
#include <ckpt/options.h>
#include <ckpt/planned_model.h>
#include <ckpt/planned_sequential.h>
#include <ckpt/profiler.h>
#include <ckpt/recompute.h>
#include <ckpt/report.h>
#include <ckpt/resilient_step.h>
#include <ckpt/sequential.h>
#include <ckpt/storage_mode.h>
