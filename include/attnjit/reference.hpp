// The dense CPU reference: attention exactly as docs/spec.md defines it, accumulated in
// float64. It is the oracle for the plan executor and the GPU kernels, so it is written to be
// obviously right, not fast.
#pragma once

#include <vector>

#include "compiler/pattern/mask.hpp"
#include "compiler/pattern/pattern.hpp"

// Public API: exported from the shared libattnjit, built with hidden visibility (cmake/install.cmake).
#pragma GCC visibility push(default)
namespace attnjit {

struct ReferenceOutput {
  std::vector<double> o;    // [batch, seq_q, heads_q, head_dim_v]
  std::vector<double> lse;  // [batch, heads_q, seq_q]; -inf for rows that attend nothing
};

// q [batch, seq_q, heads_q, head_dim], k [batch, seq_k, heads_kv, head_dim],
// v [batch, seq_k, heads_kv, head_dim_v], all contiguous. Checks the shape against the pattern
// (and the dynamic table, if any) first. Uses up to `threads` threads (0: hardware concurrency).
// `documents`: cu_seqlens of packed documents (check_documents), each document a sequence of its own.
ReferenceOutput reference_attention(const Pattern& p, const Shape& s, const float* q, const float* k, const float* v,
                                    const DynamicLayout* dynamic = nullptr, unsigned threads = 0,
                                    const std::vector<int64_t>* documents = nullptr);
// The same on float64 inputs (finite-difference gradient checks perturb below float32's precision).
ReferenceOutput reference_attention(const Pattern& p, const Shape& s, const double* q, const double* k, const double* v,
                                    const DynamicLayout* dynamic = nullptr, unsigned threads = 0,
                                    const std::vector<int64_t>* documents = nullptr);

// The attention weights of the forward above: W [batch, heads_q, seq_q, seq_k], float64, with
// O = W V: each key's probability summed over the branches that attend it, times the head_groups
// "mean" factor; zero for keys not attended and for rows that attend nothing.
std::vector<double> reference_weights(const Pattern& p, const Shape& s, const float* q, const float* k,
                                      const DynamicLayout* dynamic = nullptr, unsigned threads = 0,
                                    const std::vector<int64_t>* documents = nullptr);
std::vector<double> reference_weights(const Pattern& p, const Shape& s, const double* q, const double* k,
                                      const DynamicLayout* dynamic = nullptr, unsigned threads = 0,
                                    const std::vector<int64_t>* documents = nullptr);

// The gradients of the forward above with respect to q, k and v, given dO
// [batch, seq_q, heads_q, head_dim_v] and, where given, the gradient with respect to the LSE
// output, dlse [batch, heads_q, seq_q] (null: zero; it adds P dlse to each row's dS): the exact gradient of the
// single softmax over every branch's keys (a key two branches attend counts twice), the
// head_groups "mean" factor included, dK/dV of a kv head summed over the query heads that read it,
// nothing from rows that attend nothing. Float64 throughout; same layouts as the inputs.
struct ReferenceGradients {
  std::vector<double> dq, dk, dv;
};
ReferenceGradients reference_attention_backward(const Pattern& p, const Shape& s, const float* q, const float* k,
                                                const float* v, const float* dout, const DynamicLayout* dynamic = nullptr,
                                                unsigned threads = 0, const std::vector<int64_t>* documents = nullptr,
                                                const float* dlse = nullptr);
ReferenceGradients reference_attention_backward(const Pattern& p, const Shape& s, const double* q, const double* k,
                                                const double* v, const double* dout, const DynamicLayout* dynamic = nullptr,
                                                unsigned threads = 0, const std::vector<int64_t>* documents = nullptr,
                                                const double* dlse = nullptr);

}  // namespace attnjit
#pragma GCC visibility pop
