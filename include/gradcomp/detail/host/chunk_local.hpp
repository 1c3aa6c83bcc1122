/// \file detail/host/chunk_local.hpp
/// select::chunk_local on backend::host, inside the corrector's pass: each chunk
/// handles the bins that lie wholly in it; the few bins that straddle two chunks are
/// handled in select() as their lists are concatenated.
#pragma once

#include <gradcomp/backend/host.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/host/slices.hpp>
#include <gradcomp/detail/radix_select.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/select/chunk_local.hpp>

#include <algorithm>
#include <cmath>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// For one bin of `len` entries starting at tensor index `first` (acc and g point at
/// the bin), appends to `out` the indices with |acc_i + g_i| >= max |acc| of the bin;
/// returns the new end of `out`.
inline std::uint32_t* select_bin(const float* acc, const float* g, std::size_t len, std::size_t first,
                                 std::uint32_t* out) noexcept {
  std::uint32_t largest = 0;
  for (std::size_t j = 0; j < len; ++j) largest = std::max(largest, magnitude_key(acc[j]));
  for (std::size_t j = 0; j < len; ++j) {
    *out = static_cast<std::uint32_t>(first + j);
    // |H| may overflow to infinity, which still compares correctly as a key.
    out += magnitude_key(acc[j] + g[j]) >= largest ? 1 : 0;
  }
  return out;
}

template <>
class engine<select::chunk_local, backend::host> {
 public:
  engine(const backend::host& be, const select::chunk_local&, std::size_t n) : threads_(be.concurrency()), n_(n), slices_(n) {}

  void begin_observe(const select::chunk_local& policy, std::uint64_t) noexcept {
    bin_ = policy.bin;
    observed_ = true;
  }
  // acc and g are the chunk's; bins are aligned to multiples of bin_ in the tensor.
  void observe(int, std::size_t begin, std::span<const float> acc, std::span<const float> g) noexcept {
    const std::size_t end = begin + acc.size();
    std::uint32_t* out = slices_.slice(begin / host_chunk);
    std::uint32_t* const first = out;
    for (std::size_t b = (begin + bin_ - 1) / bin_ * bin_; b < end; b += bin_) {
      const std::size_t stop = std::min(b + bin_, n_);
      if (stop > end) break;  // straddles into the next chunk: select() does it
      out = select_bin(acc.data() + (b - begin), g.data() + (b - begin), stop - b, b, out);
    }
    slices_.set_count(begin / host_chunk, static_cast<std::size_t>(out - first));
  }

  selection select(const select::chunk_local& policy, const select_input& in, std::span<std::uint32_t> out) {
    if (!observed_) {
      begin_observe(policy, in.step);
      for_each_chunk(threads_, n_, [&](int t, std::size_t, std::size_t begin, std::size_t end) {
        observe(t, begin, in.acc.subspan(begin, end - begin), in.grad.subspan(begin, end - begin));
      });
    }
    observed_ = false;
    std::uint32_t* w = out.data();
    for (std::size_t c = 0; c < slices_.chunks(); ++c) {
      std::copy_n(slices_.slice(c), slices_.count(c), w);
      w += slices_.count(c);
      // The bin that starts in this chunk and ends in the next one.
      const std::size_t chunk_end = std::min(n_, (c + 1) * host_chunk);
      const std::size_t b = (chunk_end - 1) / bin_ * bin_;
      if (b >= c * host_chunk && std::min(b + bin_, n_) > chunk_end) {
        w = select_bin(in.acc.data() + b, in.grad.data() + b, std::min(b + bin_, n_) - b, b, w);
      }
    }
    return {static_cast<std::size_t>(w - out.data())};
  }
  void accept() noexcept {}

 private:
  int threads_;
  std::size_t n_;
  host_slices slices_;
  std::size_t bin_ = 1;
  bool observed_ = false;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
