// run(): hands a selected plan to its family's launcher.

#include "plan/family.h"
#include "plan/plan.h"

#include <c10/util/Exception.h>

namespace softmax_ext {

void run(const Plan& plan, const Buffers& buffers, void* workspace) {
  if (plan.problem.numel() == 0) return;
  TORCH_INTERNAL_ASSERT(plan.family != nullptr, "softmax_ext: the plan of ", plan.kernel, " names no family");
  const Launcher launch = plan.problem.is_backward() ? plan.family->backward : plan.family->forward;
  launch(plan, buffers, workspace);
}

}  // namespace softmax_ext
