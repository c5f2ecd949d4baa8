// The reference family's registry entry (plan/registry.cpp): it takes every
// CUDA problem that reaches it, the last of the registry.

#include "cuda/families/reference/policy.h"
#include "plan/family.h"

namespace softmax_ext {
namespace {

bool takes_reference(const Problem&, const DeviceFacts*) { return true; }

}  // namespace

// One block per row reads a strided axis uncoalesced: a backward whose
// grad_output alone has another layout runs faster on a copy of it in
// grad_input's layout, where another family takes the problem.
extern const Family kCudaReference = {
    "cuda.reference", c10::DeviceType::CUDA, /*deterministic=*/true, /*uses_atomics=*/false,
    /*relayout_helps=*/true, takes_reference, nullptr, nullptr, cuda::reference_forward, cuda::reference_backward, nullptr};

}  // namespace softmax_ext
