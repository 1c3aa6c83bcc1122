// What gradcomp._C accepts of a torch tensor, checked before any call reads or writes
// one: a 1-D, contiguous, strided (not sparse) tensor of the expected dtype on a CPU or
// CUDA device, read as the values it holds (a negation bit resolved), written only where
// autograd allows it (and its version counter bumped after). Every refusal is a
// gradcomp::error (invalid_argument) naming the call, the argument and what it got.
#pragma once

#include <torch/extension.h>

#include <gradcomp/error.hpp>

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

#include "api.hpp"

namespace gradcomp_py {

template <class... Parts>
[[noreturn]] void invalid(Parts&&... parts) {
  gradcomp::detail::fail(gradcomp::errc::invalid_argument, std::forward<Parts>(parts)...);
}

inline std::string describe(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.scalar_type() << " tensor of shape " << t.sizes() << " on " << t.device();
  if (t.layout() != torch::kStrided) out << " (layout " << t.layout() << ")";
  return out.str();
}

/// A 1-D contiguous strided tensor of `dtype` on `device` (of `numel` elements unless < 0).
inline void check_tensor(const char* who, const char* name, const torch::Tensor& t, torch::ScalarType dtype,
                         const torch::Device& device, std::int64_t numel = -1) {
  if (!t.defined()) invalid(who, ": ", name, " is undefined");
  if (t.layout() != torch::kStrided) {
    invalid(who, ": ", name, " must be a dense (strided) tensor, got a ", describe(t), " (call .to_dense())");
  }
  if (!t.device().is_cpu() && !t.device().is_cuda()) {
    invalid(who, ": ", name, " is on ", t.device(), "; gradcomp reads tensors on cpu and cuda devices");
  }
  if (t.scalar_type() != dtype) {
    invalid(who, ": ", name, " must be a ", dtype, " tensor, got a ", describe(t),
            dtype == torch::kFloat && t.is_floating_point() ? " (convert it with .float())" : "");
  }
  if (t.dim() != 1) invalid(who, ": ", name, " must be 1-D, got a ", describe(t), " (flatten it with .view(-1))");
  if (!t.is_contiguous()) invalid(who, ": ", name, " must be contiguous (call .contiguous())");
  if (t.device() != device) invalid(who, ": ", name, " is on ", t.device(), ", expected ", device);
  if (numel >= 0 && t.numel() != numel) invalid(who, ": ", name, " has ", t.numel(), " elements, expected ", numel);
}

/// The tensor to read for `t`: itself, or a copy holding its values where a negation
/// bit (a view such as x.conj().imag) says that its memory holds them negated.
inline torch::Tensor values_of(const torch::Tensor& t) { return t.is_neg() ? t.resolve_neg() : t; }

/// A gradient: a 1-D contiguous float32, float16 or bfloat16 tensor of `numel`
/// elements on `device`. Returns its element type.
inline element check_gradient(const char* who, const char* name, const torch::Tensor& t, const torch::Device& device,
                              std::int64_t numel) {
  if (t.defined() && t.layout() == torch::kStrided) {
    const torch::ScalarType type = t.scalar_type();
    if (type != torch::kFloat && type != torch::kHalf && type != torch::kBFloat16) {
      invalid(who, ": ", name, " must be a float32, float16 or bfloat16 tensor, got a ", describe(t),
              t.is_floating_point() ? " (convert it with .float())" : "");
    }
  }
  check_tensor(who, name, t, t.defined() ? t.scalar_type() : torch::kFloat, device, numel);
  return t.scalar_type() == torch::kHalf       ? element::f16
         : t.scalar_type() == torch::kBFloat16 ? element::bf16
                                               : element::f32;
}

/// A tensor that a call writes in place (`dense` of accumulate): refused where torch
/// would refuse an in-place write (a tensor that requires grad while grad mode is on,
/// an inference tensor outside inference mode) and where the write would not land as
/// meant (a negation bit).
inline void check_written(const char* who, const char* name, const torch::Tensor& t) {
  if (t.requires_grad() && at::GradMode::is_enabled()) {
    invalid(who, ": ", name, " requires grad and grad mode is on; ", who,
            " writes it in place and is not differentiable (call it under torch.no_grad(), or on ", name, ".detach())");
  }
  if (t.is_inference() && !c10::InferenceMode::is_enabled()) {
    invalid(who, ": ", name, " is an inference tensor, which torch does not let change outside inference mode");
  }
  if (t.is_neg()) {
    invalid(who, ": ", name, " has its negation bit set (a view such as x.conj().imag); write into ", name,
            ".resolve_neg() instead");
  }
}

/// After a call wrote `t` in place: autograd sees the change (a tensor saved for
/// backward and written since makes backward raise, as after any in-place op).
inline void bump_version(const torch::Tensor& t) {
  if (!t.is_inference()) torch::autograd::impl::bump_version(t);
}

}  // namespace gradcomp_py
