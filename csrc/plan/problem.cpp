// describe(): tensors' geometry -> coalesced Problem. The one place where
// dimensions are dropped, reordered and merged, for CPU and CUDA alike.

#include "plan/plan.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <sstream>
#include <vector>

namespace softmax_ext {

const char* dtype_tag(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return "f32";
    case c10::ScalarType::Double: return "f64";
    case c10::ScalarType::Half: return "f16";
    case c10::ScalarType::BFloat16: return "bf16";
    default: return c10::toString(t);
  }
}

bool is_supported_dtype(c10::ScalarType t) {
  return t == c10::ScalarType::Float || t == c10::ScalarType::Double ||
         t == c10::ScalarType::Half || t == c10::ScalarType::BFloat16;
}

bool Problem::axis_contiguous() const {
  if (axis_stride[kOut] != 1 || axis_stride[kIn0] != 1) return false;
  return !is_backward() || axis_stride[kIn1] == 1;
}

int64_t Problem::inner_size() const {
  if (batch_rank == 0) return 1;
  const int d = batch_rank - 1;
  const bool unit = batch_stride[kOut][d] == 1 && batch_stride[kIn0][d] == 1 &&
                    (!is_backward() || batch_stride[kIn1][d] == 1);
  return unit ? batch_size[d] : 1;
}

std::string Problem::to_string() const {
  std::ostringstream s;
  s << "rows=" << rows << " axis=" << axis_size << " axis_stride=" << axis_stride[kIn0]
    << " batch=[";
  for (int d = 0; d < batch_rank; ++d) s << (d ? "," : "") << batch_size[d];
  s << "] in=" << dtype_tag(in_dtype) << " out=" << dtype_tag(out_dtype);
  return s.str();
}

Status describe(Kind kind, Direction direction, c10::DeviceType device,
                c10::ScalarType in_dtype, c10::ScalarType out_dtype,
                c10::IntArrayRef sizes, const c10::IntArrayRef (&strides)[kNumOperands],
                const void* const (&bases)[kNumOperands], int64_t axis, Problem& p) {
  p = Problem{};
  p.kind = kind;
  p.direction = direction;
  p.device_type = device;
  p.in_dtype = in_dtype;
  p.out_dtype = out_dtype;
  const int ndim = static_cast<int>(sizes.size());
  const bool backward = direction == Direction::Backward;
  const int slots[] = {kIn0, kIn1, kOut};
  auto used = [&](int k) { return k != kIn1 || backward; };
  // 0-dim tensors arrive as sizes {1}; their stride lists are empty.
  auto stride_of = [&](int k, int d) -> int64_t {
    return strides[k].empty() ? 1 : strides[k][d];
  };

  for (int k : slots) p.base_offset[k] = static_cast<int>(reinterpret_cast<uintptr_t>(bases[k]) % kBaseAlign);
  p.axis_size = sizes[axis];
  for (int k : slots) p.axis_stride[k] = used(k) ? stride_of(k, axis) : 0;

  // Non-axis dimensions of size > 1, outermost first by the output's strides
  // (ties: larger size outside, then original order), so writes coalesce and
  // transposed/permuted/channels_last tensors merge back into long runs.
  std::vector<int> dims;
  for (int d = 0; d < ndim; ++d)
    if (d != axis && sizes[d] != 1) dims.push_back(d);
  std::stable_sort(dims.begin(), dims.end(), [&](int a, int b) {
    const int64_t sa = stride_of(kOut, a), sb = stride_of(kOut, b);
    if (sa != sb) return sa > sb;
    return sizes[a] > sizes[b];
  });

  // Merge an outer dimension into the next inner one when every operand
  // steps over the pair as one run: stride[outer] == stride[inner] * size[inner].
  std::vector<int64_t> merged_size;
  std::vector<std::array<int64_t, kNumOperands>> merged_stride;
  for (int d : dims) {
    std::array<int64_t, kNumOperands> st{};
    for (int k : slots) st[k] = used(k) ? stride_of(k, d) : 0;
    if (!merged_size.empty()) {
      auto& last = merged_stride.back();
      bool mergeable = true;
      for (int k : slots)
        if (last[k] != st[k] * sizes[d]) mergeable = false;
      if (mergeable) {
        merged_size.back() *= sizes[d];
        last = st;
        continue;
      }
    }
    merged_size.push_back(sizes[d]);
    merged_stride.push_back(st);
  }

  const int batch_rank = static_cast<int>(merged_size.size());
  if (batch_rank > kMaxBatchRank) {
    std::ostringstream m;
    m << "the tensor has " << batch_rank + 1
      << " dimensions after merging the ones its strides allow (axis included); at most "
      << kMaxRank << " are supported";
    return Status::unsupported(m.str());
  }
  p.batch_rank = batch_rank;
  p.rows = 1;
  for (int d = 0; d < batch_rank; ++d) {
    p.batch_size[d] = merged_size[d];
    for (int k : slots) p.batch_stride[k][d] = merged_stride[d][k];
    p.rows *= merged_size[d];
  }
  return Status::success();
}

Problem with_in0_as_out(const Problem& p) {
  Problem q = p;
  q.axis_stride[kIn0] = p.axis_stride[kOut];
  q.base_offset[kIn0] = 0;
  for (int d = 0; d < p.batch_rank; ++d) q.batch_stride[kIn0][d] = p.batch_stride[kOut][d];
  // The dims keep their order (the output's strides); merge the neighbours
  // that every operand now steps over as one run, as describe() does.
  int rank = 0;
  for (int d = 0; d < p.batch_rank; ++d) {
    if (rank > 0) {
      bool mergeable = true;
      for (int k = 0; k < kNumOperands; ++k)
        if (q.batch_stride[k][rank - 1] != q.batch_stride[k][d] * q.batch_size[d]) mergeable = false;
      if (mergeable) {
        q.batch_size[rank - 1] *= q.batch_size[d];
        for (int k = 0; k < kNumOperands; ++k) q.batch_stride[k][rank - 1] = q.batch_stride[k][d];
        continue;
      }
    }
    q.batch_size[rank] = q.batch_size[d];
    for (int k = 0; k < kNumOperands; ++k) q.batch_stride[k][rank] = q.batch_stride[k][d];
    ++rank;
  }
  for (int d = rank; d < p.batch_rank; ++d) {
    q.batch_size[d] = 0;
    for (int k = 0; k < kNumOperands; ++k) q.batch_stride[k][d] = 0;
  }
  q.batch_rank = rank;
  return q;
}

}  // namespace softmax_ext
