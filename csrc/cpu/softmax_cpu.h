// CPU kernels. Pure C++ over raw pointers: the plan (plan/plan.h) has already
// coalesced the problem and picked the family; these only run it.
//
// Forward:  y  = softmax(x) or log_softmax(x) along the axis, x read as
//           problem.in_dtype, treated as if cast to problem.out_dtype, y
//           written as problem.out_dtype; accumulation in problem.acc_dtype().
// Backward: dx = y * (dy - sum(y * dy))       (softmax)
//           dx = dy - exp(y) * sum(dy)         (log_softmax)
//           dy, y, dx all of problem.in_dtype.
// Threading: at::parallel_for over rows (or row x inner blocks).
#pragma once

#include "plan/plan.h"

namespace softmax_ext::cpu {

void run_lastdim(const Problem& problem, const Buffers& buffers);   // cpu.lastdim
void run_inner(const Problem& problem, const Buffers& buffers);     // cpu.inner
void run_strided(const Problem& problem, const Buffers& buffers);   // cpu.strided

}  // namespace softmax_ext::cpu
