/// \file detail/correct/compact.hpp
/// correct::compact's algorithm over the backend primitives, on every backend: the inner
/// corrector's passes (detail/correct/elementwise.hpp) reading the committed state from
/// its blocks, and one pass per step that stores the new state back into them
/// (docs/algorithms.md, "Compressed memory"). Not API.
#pragma once

#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/correct/compact.hpp>
#include <gradcomp/detail/core/bits.hpp>
#include <gradcomp/detail/core/fixed_order_sum.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/detail/correct/elementwise.hpp>
#include <gradcomp/held_memory.hpp>

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

namespace compact_blocks {

/// Exponents are int8 in [min_exponent, 127]: 2^-127 is the smallest power of two
/// whose multiples by the codes (|q| <= 127) are all floats, and L * 2^127 exceeds the
/// largest float for L >= 4.
inline constexpr int min_exponent = -127;
inline constexpr int max_exponent = 127;

/// 2^e as a float, for e in [-127, 127] (2^-127 is a subnormal).
GRADCOMP_HOST_DEVICE inline float power_of_two(int e) noexcept {
  // A subnormal 2^e is 2^(e + 149) of the smallest subnormal.
  return float_of(e >= -126 ? static_cast<std::uint32_t>(e + 127) << 23 : std::uint32_t{1} << (e + 149));
}

/// The largest code of `bits` bits: 127 or 7.
GRADCOMP_HOST_DEVICE inline int largest_code(std::uint32_t bits) noexcept { return (1 << (bits - 1)) - 1; }

/// floor(log2 m) for a finite m > 0.
GRADCOMP_HOST_DEVICE inline int floor_log2(float m) noexcept {
  const std::uint32_t bits = bits_of(m);
  if ((bits >> 23) != 0) return static_cast<int>(bits >> 23) - 127;
  int k = -150;  // a subnormal: the position of its highest set bit, from 2^-149
  for (std::uint32_t mantissa = bits; mantissa != 0; mantissa >>= 1) ++k;
  return k;
}

/// The smallest e in [-127, 127] with m <= L * 2^e (m = max |x| over a block, finite).
/// L * 2^e is exact in double.
GRADCOMP_HOST_DEVICE inline int exponent_for(float m, int largest) noexcept {
  if (!(m > 0.0f)) return min_exponent;
  // L < 2^7, so L * 2^(k - 7) < 2^k <= m: e > k - 7, and a few steps up find it.
  int e = floor_log2(m) - 7;
  const auto bound = [&](int x) {
    return static_cast<double>(largest) * __builtin_bit_cast(double, static_cast<std::uint64_t>(x + 1023) << 52);
  };
  while (e < max_exponent && bound(e) < static_cast<double>(m)) ++e;
  return e < min_exponent ? min_exponent : e;
}

/// Rounds to the nearest integer, ties to even.
GRADCOMP_HOST_DEVICE inline float round_half_even(float v) noexcept {
#if defined(__CUDA_ARCH__)
  return rintf(v);
#else
  return std::rint(v);
#endif
}

/// Code i of an array of `bits`-bit codes: a byte, or a nibble (the even index low).
GRADCOMP_HOST_DEVICE inline int code_at(const std::uint8_t* codes, std::size_t i, std::uint32_t bits) noexcept {
  if (bits == 8) return static_cast<std::int8_t>(codes[i]);
  const unsigned nibble = (codes[i / 2] >> ((i % 2) * 4)) & 0xFu;
  return nibble >= 8 ? static_cast<int>(nibble) - 16 : static_cast<int>(nibble);
}

/// Writes code i, as code_at reads it.
GRADCOMP_HOST_DEVICE inline void put_code(std::uint8_t* codes, std::size_t i, int code, std::uint32_t bits) noexcept {
  if (bits == 8) {
    codes[i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(code));
  } else {
    const unsigned shift = (i % 2) * 4;
    const auto nibble = static_cast<std::uint8_t>((static_cast<unsigned>(code) & 0xFu) << shift);
    codes[i / 2] = static_cast<std::uint8_t>((codes[i / 2] & ~(0xFu << shift)) | nibble);
  }
}

/// Bytes of `n` codes of `bits` bits.
GRADCOMP_HOST_DEVICE inline std::size_t code_bytes(std::size_t n, std::uint32_t bits) noexcept {
  return bits == 8 ? n : (n + 1) / 2;
}

/// log2 of a block size that is a power of two, else -1: a shift finds an entry's block
/// where a division would cost more than the rest of its read.
inline int shift_of(std::uint32_t block) noexcept {
  return (block & (block - 1)) == 0 ? static_cast<int>(std::countr_zero(block)) : -1;
}

/// Read access to the stored arrays: entry i of array a is q_i * 2^E of its block.
template <std::size_t Arrays>
struct stored {
  const std::uint8_t* codes[Arrays + 1];
  const std::int8_t* exponents[Arrays + 1];
  std::uint32_t bits;
  std::uint32_t block;
  int block_shift;  ///< shift_of(block)
  GRADCOMP_HOST_DEVICE float value(std::size_t a, std::size_t i) const {
    const std::size_t j = block_shift >= 0 ? i >> block_shift : i / block;
    return mul_rn(static_cast<float>(code_at(codes[a], i, bits)), power_of_two(exponents[a][j]));
  }
};

/// max |x_i| over `len` finite values (what a store reads: a step that met a NaN stores
/// nothing, and a checkpoint's values are checked finite), as the largest magnitude bits:
/// for finite floats those order as the magnitudes do, and an integer maximum is one the
/// compiler makes vectors of.
GRADCOMP_HOST_DEVICE inline float largest_magnitude(const float* x, std::size_t len) noexcept {
  std::uint32_t top = 0;
  for (std::size_t i = 0; i < len; ++i) {
    const std::uint32_t key = bits_of(x[i]) & 0x7FFFFFFFu;
    top = key > top ? key : top;
  }
  return float_of(top);
}

/// Stores `group` consecutive blocks of array a of the float32 state `from` (work item
/// a * groups() + g: blocks g * group on): each block's exponent, then its codes,
/// rounding in index order with the error carried. Each block's rounding is a chain
/// (every entry waits for the previous one's carry), so the group's blocks are rounded
/// side by side, entry t of each in turn, and a core overlaps their chains; a device
/// runs one block per work item. Writes nothing if the step met a NaN.
template <std::size_t Arrays>
struct store {
  static constexpr std::size_t max_group = 8;
  elementwise::arrays<Arrays> from;
  std::uint8_t* codes[Arrays + 1];
  std::int8_t* exponents[Arrays + 1];
  std::uint32_t bits;
  std::uint32_t block;
  std::size_t n;
  std::size_t blocks;
  std::size_t group;  ///< blocks per work item, in [1, max_group]
  const step_status* status;

  /// Work items per array.
  GRADCOMP_HOST_DEVICE std::size_t groups() const noexcept { return (blocks + group - 1) / group; }

  GRADCOMP_HOST_DEVICE void operator()(std::size_t work) const {
    if (status != nullptr && status->non_finite != 0) return;
    const std::size_t a = work / groups();
    const std::size_t first = (work % groups()) * group;
    const std::size_t count = first + group < blocks ? group : blocks - first;
    const float* x = from.at[a];
    const int largest = largest_code(bits);
    const float limit = static_cast<float>(largest);
    float carry[max_group], step[max_group], inverse[max_group];
    std::size_t end[max_group];
    for (std::size_t b = 0; b < count; ++b) {
      const std::size_t begin = (first + b) * block;
      end[b] = begin + block < n ? begin + block : n;
      const int e = exponent_for(largest_magnitude(x + begin, end[b] - begin), largest);
      exponents[a][first + b] = static_cast<std::int8_t>(e);
      step[b] = power_of_two(e);
      inverse[b] = power_of_two(-e);
      carry[b] = 0.0f;
    }
    for (std::size_t t = 0; t < block; ++t) {
      for (std::size_t b = 0; b < count; ++b) {
        const std::size_t i = (first + b) * block + t;
        if (i >= end[b]) continue;  // the array's last block may be shorter
        const float y = x[i] + carry[b];
        float q = round_half_even(mul_rn(y, inverse[b]));
        q = q > limit ? limit : (q < -limit ? -limit : q);
        carry[b] = y - mul_rn(q, step[b]);
        put_code(codes[a], i, static_cast<int>(q), bits);
      }
    }
  }
};

/// to[i] = value of entry i of array a (dequantized).
template <std::size_t Arrays>
struct load {
  stored<Arrays> from;
  std::size_t a;
  float* to;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const { to[i] = from.value(a, i); }
};

}  // namespace compact_blocks

/// The committed state stored in blocks (correct::compact): codes and exponents are
/// what stays between steps; the float32 arrays a step writes are allocated by update()
/// and given back once the step is accepted, once the step's work is done (backend::cuda:
/// in stream order, nothing waited for).
template <class Backend, std::size_t Arrays>
class compact_state {
  using pointers = elementwise::arrays<Arrays>;
  template <class T>
  using buffer = typename Backend::template buffer<T>;

 public:
  compact_state(const Backend& be, std::size_t n, std::uint32_t bits, std::uint32_t block)
      : backend_(be), n_(n), bits_(bits), block_(block), blocks_((n + block - 1) / block) {
    for (std::size_t a = 0; a != Arrays; ++a) {
      codes_[a] = be.template allocate<std::uint8_t>(compact_blocks::code_bytes(n, bits));
      exponents_[a] = be.template allocate<std::int8_t>(blocks_);
      be.clear(codes_[a].data(), compact_blocks::code_bytes(n, bits));  // the state starts at 0
      be.clear(exponents_[a].data(), blocks_);
    }
  }

  /// How the passes read the committed state.
  [[nodiscard]] compact_blocks::stored<Arrays> reader() const {
    compact_blocks::stored<Arrays> r{};
    for (std::size_t a = 0; a != Arrays; ++a) {
      r.codes[a] = codes_[a].data();
      r.exponents[a] = exponents_[a].data();
    }
    r.bits = bits_;
    r.block = block_;
    r.block_shift = compact_blocks::shift_of(block_);
    return r;
  }
  /// The float32 arrays the step writes, allocated for the step's work on `be` (its
  /// update pass writes every element before anything reads them: on a device, nothing
  /// zeroed and nothing waited for).
  [[nodiscard]] pointers next(const Backend& be) {
    pointers p{};
    for (std::size_t a = 0; a != Arrays; ++a) {
      if (static_cast<std::size_t>(next_[a].size()) != n_) next_[a] = allocate_for_stream<float>(be, n_);
      p.at[a] = next_[a].data();
    }
    last_ = be;
    return p;
  }
  /// After the step's commit: its state stored into the blocks, unless it met a NaN.
  void store(const Backend& on, const step_status* status) {
    compact_blocks::store<Arrays> pass = store_pass(status);
    for (std::size_t a = 0; a != Arrays; ++a) {
      pass.from.at[a] = next_[a].data();
      pass.codes[a] = codes_[a].data();
      pass.exponents[a] = exponents_[a].data();
    }
    on.for_each(Arrays * pass.groups(), pass);
    last_ = on;
  }
  /// The blocks hold the step's state already: the float32 arrays go back.
  void accept() noexcept {
    // The step's passes are queued on last_: its arrays go back once they are done, in
    // stream order where the backend can (kept if waiting fails: they may still be read).
    if (!release_after_stream(last_, std::span<buffer<float>>(next_))) return;
    decoded_ = buffer<float>{};
    staging_ = std::vector<float>{};
  }

  /// Gives back the step's arrays (still held after a preview, a rejected or a dropped
  /// step) and a checkpoint's copy.
  void release_workspace() noexcept {
    for (auto& b : next_) b = buffer<float>{};
    decoded_ = buffer<float>{};
    staging_ = std::vector<float>{};
  }

  /// Committed array `a` as float32 values, on the host (a copy, given back at the next
  /// accepted step).
  std::span<const float> committed(std::size_t a) const {
    if (static_cast<std::size_t>(decoded_.size()) != n_) decoded_ = backend_.template allocate<float>(n_);
    backend_.for_each(n_, compact_blocks::load<Arrays>{reader(), a, decoded_.data()});
    if constexpr (Backend::host_accessible) {
      return {decoded_.data(), n_};
    } else {
      staging_.resize(n_);
      backend_.to_host(decoded_.data(), n_, staging_.data());
      return staging_;
    }
  }
  /// Replaces committed array `a` by `values` (host memory, n finite ones), stored in
  /// blocks as a step stores its state.
  void load(std::size_t a, std::span<const float> values) {
    buffer<float> wide = backend_.template allocate<float>(n_);
    backend_.to_device(values.data(), n_, wide.data());
    compact_blocks::store<Arrays> pass = store_pass(nullptr);
    pass.from.at[0] = wide.data();
    pass.codes[0] = codes_[a].data();
    pass.exponents[0] = exponents_[a].data();
    backend_.for_each(pass.groups(), pass);
    if constexpr (!Backend::host_accessible) (void)backend_.read(exponents_[a].data());  // before `wide` goes
  }

  /// The codes and exponents are state; the float32 arrays of a step (or of a
  /// checkpoint's read) that are still held, workspace.
  void add_held(held_memory& use) const {
    for (std::size_t a = 0; a != Arrays; ++a) {
      use.state += bytes_held(codes_[a], exponents_[a]);
      use.workspace += bytes_held(next_[a]);
    }
    use.workspace += bytes_held(decoded_, staging_);
  }

 private:
  // The store pass's sizes, its arrays to be set.
  compact_blocks::store<Arrays> store_pass(const step_status* status) const {
    compact_blocks::store<Arrays> pass{};
    pass.bits = bits_;
    pass.block = block_;
    pass.n = n_;
    pass.blocks = blocks_;
    pass.group = Backend::host_accessible ? compact_blocks::store<Arrays>::max_group : 1;
    pass.status = status;
    return pass;
  }

  Backend backend_;
  Backend last_ = backend_;  // where the step in progress is queued
  std::size_t n_;
  std::uint32_t bits_;
  std::uint32_t block_;
  std::size_t blocks_;
  std::array<buffer<std::uint8_t>, Arrays + 1> codes_{};
  std::array<buffer<std::int8_t>, Arrays + 1> exponents_{};
  std::array<buffer<float>, Arrays + 1> next_{};
  mutable buffer<float> decoded_{};
  mutable std::vector<float> staging_;
};

/// correct::compact on any backend: the inner corrector's algorithm over a compact_state.
template <class Inner, class Backend>
class engine<correct::compact<Inner>, Backend> {
  using policy_type = correct::compact<Inner>;
  using state_type = compact_state<Backend, Inner::state_arrays>;

 public:
  engine(const Backend& be, const policy_type& policy, std::size_t n)
      : run_(be, n, state_type(be, n, policy.bits, policy.block)) {}

  template <gradient_element G>
  void update(const Backend& be, const policy_type& policy, std::span<const G> g, step_status* status) {
    run_.update(be, policy.inner, g, status);
  }
  template <gradient_element G>
  auto update_pass(const Backend& be, const policy_type& policy, std::span<const G> g) {
    return run_.update_pass(be, policy.inner, g);
  }
  std::span<const float> acc(std::span<const float> g) const noexcept { return run_.acc(g); }
  template <gradient_element G>
  void preview(const Backend& be, const policy_type& policy, std::span<const G> g, std::span<float> out,
               step_status* status) {
    run_.preview(be, policy.inner, g, out, status);
  }
  void commit(const Backend& be, const policy_type& policy, std::span<const std::uint32_t> index,
              std::span<const float> sent, const step_status* status) {
    run_.commit(be, policy.inner, index, sent, status);
  }
  void accept() noexcept { run_.accept(); }
  void release_workspace() noexcept { run_.release_workspace(); }
  std::span<const float> committed(std::size_t a) const { return run_.committed(a); }
  void load_committed(std::size_t a, std::span<const float> values) { run_.load_committed(a, values); }
  void add_held(held_memory& use) const { run_.add_held(use); }

 private:
  correction<Inner, Backend, state_type> run_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
