// The problem descriptor: everything a kernel choice and its launch
// geometry depend on, with no pointers (only their offsets from a grid). Built once per call by describe() (problem.cpp), shared by the CPU
// and CUDA paths, and read by select() to pick a kernel.
//
// Shapes are coalesced before they get here: size-1 dimensions are dropped,
// the non-axis ("batch") dimensions are ordered by the output's strides
// (outermost first) and merged wherever every operand allows it. A row is one
// slice along the axis; row r's batch index is r decomposed over batch_size.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace softmax_ext {

constexpr int kMaxRank = 8;                  // axis included, after coalescing
constexpr int kMaxBatchRank = kMaxRank - 1;  // non-axis dimensions

enum class Kind : uint8_t { Softmax, LogSoftmax };
enum class Direction : uint8_t { Forward, Backward };

// The largest alignment of a data pointer that a launch geometry depends on
// (the row tile's 32-byte sectors).
constexpr int kBaseAlign = 32;

// Operand slots. Forward uses kIn0 = x and kOut = y; backward uses
// kIn0 = grad_output (dy), kIn1 = output (y) and kOut = grad_input (dx).
enum Operand : int { kIn0 = 0, kIn1 = 1, kOut = 2, kNumOperands = 3 };

struct Problem {
  Kind kind = Kind::Softmax;
  Direction direction = Direction::Forward;
  c10::DeviceType device_type = c10::DeviceType::CPU;
  int device_index = -1;  // CUDA: the device the kernels run on (its arch picks families)
  // Forward: in_dtype is x's dtype, out_dtype is y's (the `dtype=` argument).
  // Backward: both are the dtype shared by dy, y and dx.
  c10::ScalarType in_dtype = c10::ScalarType::Float;
  c10::ScalarType out_dtype = c10::ScalarType::Float;

  int64_t axis_size = 0;
  int64_t axis_stride[kNumOperands] = {0, 0, 0};  // in elements

  int batch_rank = 0;                       // 0 .. kMaxBatchRank
  int64_t batch_size[kMaxBatchRank] = {};   // outermost first
  int64_t batch_stride[kNumOperands][kMaxBatchRank] = {};
  int64_t rows = 1;                         // product of batch_size
  // Each operand's data pointer's offset from the kBaseAlign-byte grid, in bytes.
  int base_offset[kNumOperands] = {0, 0, 0};

  bool is_backward() const { return direction == Direction::Backward; }
  int num_inputs() const { return is_backward() ? 2 : 1; }
  int64_t numel() const { return rows * axis_size; }
  int rank() const { return batch_rank + 1; }

  // The accumulator: float32 for f16/bf16/f32, float64 for f64. It follows
  // the compute dtype, which is the output dtype (the input is treated as if
  // cast to it first).
  c10::ScalarType acc_dtype() const {
    return out_dtype == c10::ScalarType::Double ? c10::ScalarType::Double
                                                : c10::ScalarType::Float;
  }

  // Whether operand k's data pointer is a multiple of `align` bytes (a power
  // of two up to kBaseAlign).
  bool base_aligned(Operand k, int64_t align) const { return base_offset[k] % align == 0; }

  // True when every operand walks the axis with unit stride.
  bool axis_contiguous() const;
  // Length of the contiguous inner run when the axis is not the fastest
  // dimension: the innermost batch dimension's size when it has unit stride
  // in every operand, otherwise 1.
  int64_t inner_size() const;

  std::string to_string() const;
};

// The backward problem with grad_output (kIn0) in grad_input's layout, as a
// new allocation: what a copy of grad_output into that layout runs.
Problem with_in0_as_out(const Problem& p);

// Short dtype tags used in kernel names: f16, bf16, f32, f64.
const char* dtype_tag(c10::ScalarType t);

// The dtypes every kernel family supports, and how error messages list them.
bool is_supported_dtype(c10::ScalarType t);
constexpr const char* kAcceptedDtypes = "accepted: float32, float16, bfloat16, float64";

}  // namespace softmax_ext
