// The CPU families' registry entries (plan/registry.cpp): the axis
// contiguous (cpu.lastdim), a strided axis with a contiguous inner run
// (cpu.inner), anything else (cpu.strided). Each output is reduced by one
// thread in a fixed order, without atomics.

#include "cpu/softmax_cpu.h"
#include "plan/family.h"

namespace softmax_ext {
namespace {

bool takes_lastdim(const Problem& p, const DeviceFacts*) { return p.axis_contiguous(); }
bool takes_inner(const Problem& p, const DeviceFacts*) { return p.inner_size() > 1; }
bool takes_strided(const Problem&, const DeviceFacts*) { return true; }

void lastdim(const Plan& plan, const Buffers& b, void*) { cpu::run_lastdim(plan.problem, b); }
void inner(const Plan& plan, const Buffers& b, void*) { cpu::run_inner(plan.problem, b); }
void strided(const Plan& plan, const Buffers& b, void*) { cpu::run_strided(plan.problem, b); }

}  // namespace

extern const Family kCpuLastDim = {"cpu.lastdim", c10::DeviceType::CPU, true, false, false, takes_lastdim, nullptr, nullptr,
                                   lastdim, lastdim, nullptr};
extern const Family kCpuInner = {"cpu.inner", c10::DeviceType::CPU, true, false, false, takes_inner, nullptr, nullptr,
                                 inner, inner, nullptr};
extern const Family kCpuStrided = {"cpu.strided", c10::DeviceType::CPU, true, false, false, takes_strided, nullptr, nullptr,
                                   strided, strided, nullptr};

}  // namespace softmax_ext
