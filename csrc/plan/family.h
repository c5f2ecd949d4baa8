// A kernel family: one entry of the registry (plan/registry.cpp), defined
// in its own folder (cpu/family.cpp, cuda/families/<family>/family.cu).
// select() asks the families in registry order and takes the first that
// plans the problem; run(), workspace_size(), limits() and the kernel names
// read the entry of the plan's family.
#pragma once

#include "plan/plan.h"

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace softmax_ext {

// What a CUDA device offers the families, queried once per device
// (cuda/core/device.cu); CPU families get none.
struct DeviceFacts {
  int arch = 0;         // compute capability * 10
  int max_cluster = 1;  // largest cluster of 1024-thread blocks the kernels may use (1: none)
  int sms = 0;
  int shared_per_sm = 0;
  int shared_reserved_per_block = 0;
  // Dynamic shared memory a block may take with `blocks` blocks per SM: the
  // SM's share, less the hardware's reserve per block and a kilobyte for the
  // kernel's own (static) shared memory.
  int shared_bytes_per_block(int blocks) const;
};

// The thresholds select() applies, for softmax_ext.plan_limits(): (name,
// axis length up to which the family takes a problem, or another count).
using Limits = std::vector<std::pair<std::string, int64_t>>;

// The launcher of one direction: runs `plan` on the buffers (CUDA: on the
// current stream), with workspace_bytes of workspace.
using Launcher = void (*)(const Plan& plan, const Buffers& buffers, void* workspace);

struct Family {
  const char* name;  // "cuda.warp"; the backward's kernels are name + "_backward"
  c10::DeviceType device;
  // Reruns give bit-identical results; whether a kernel issues atomic
  // operations (family.cu says what for, and why the result stays
  // deterministic).
  bool deterministic;
  bool uses_atomics;
  // It reads a strided axis uncoalesced: select() runs a backward it takes
  // on grad_output copied into grad_input's layout where another family
  // then takes the problem.
  bool relayout_helps;
  // Whether the family takes `problem` (`device`: the facts of its CUDA
  // device, nullptr on CPU).
  bool (*takes)(const Problem& problem, const DeviceFacts* device);
  // For a problem it takes, with elements: fills plan.geometry (what its
  // launchers launch) and plan.workspace_bytes; nullptr: nothing to plan.
  void (*plan)(const Problem& problem, const DeviceFacts* device, Plan& plan);
  // The concrete buffers against the plan's geometry (pointer alignment it
  // assumed); nullptr: nothing to check beyond the common checks.
  Status (*can_implement)(const Plan& plan, const Buffers& buffers);
  Launcher forward;
  Launcher backward;
  // Appends the family's thresholds for an element type and direction;
  // nullptr: none.
  void (*limits)(c10::ScalarType dtype, bool backward, const DeviceFacts& device, Limits& out);
};

// The registry, in the order select() asks (plan/registry.cpp).
const std::vector<const Family*>& families();

#ifdef SOFTMAX_EXT_WITH_CUDA
namespace cuda {
// The facts of CUDA device `device`, cached (cuda/core/device.cu).
const DeviceFacts& device_facts(int device);

// Whether a kernel that takes over from the one before it in the stream
// (a cross-entropy forward's reductions, the merge of softmax_matmul's
// parts of d2) is launched to start before that one ends (programmatic
// dependent launch, cuda/core/launch.cuh): sm_90 on (arch: compute
// capability * 10), unless SOFTMAX_EXT_OVERLAP=0 (A/B runs; read at each call).
inline bool overlap_launches(int arch) {
  const char* env = std::getenv("SOFTMAX_EXT_OVERLAP");
  return arch >= 90 && !(env != nullptr && env[0] == '0');
}
}  // namespace cuda
#endif

}  // namespace softmax_ext
