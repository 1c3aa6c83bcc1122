// libFuzzer target: a whole compress -> decode -> accumulate round trip with fuzzed
// parameters and gradients (any float bit patterns: NaN, infinities, denormals, the
// largest values). Every step must either be refused with gradcomp::error, leaving the
// message buffer and the compressor's state as they were, or write a message its own
// decoder accepts, with finite values and the count compress reported, after which
// the memory is finite. Sanitizers catch the rest.
#include <gradcomp/gradcomp.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_support.hpp"

namespace gc = gradcomp;

namespace {

// Reads the fuzzer's bytes in order, with zeros past the end.
struct input {
  const std::uint8_t* data;
  std::size_t size;
  std::size_t at = 0;
  template <class T>
  T next() {
    T v{};
    const std::size_t take = std::min(sizeof(T), size - std::min(size, at));
    std::memcpy(&v, data + at, take);
    at += sizeof(T);
    return v;
  }
};

template <class Compressor>
void steps(Compressor& c, input& in) {
  const std::size_t n = c.size();
  std::vector<std::byte> buf(c.max_message_bytes(), std::byte{0x5A});
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g(n);
    for (auto& v : g) {
      // Mostly ordinary values, sometimes any bit pattern.
      const auto bits = in.next<std::uint32_t>();
      std::memcpy(&v, &bits, 4);
      if ((bits & 0x3) != 0) v = static_cast<float>(static_cast<std::int32_t>(bits) >> 8) * 1e-6f;
    }
    const std::string before = fuzz::state_of(c);
    const std::vector<std::byte> buf_before = buf;
    try {
      const gc::message m = c.compress(g, buf);
      const gc::sparse_vector s = gc::decode(m.bytes());
      if (s.indices.size() != m.count() || s.n != n) std::abort();
      for (const float v : s.values) {
        if (!std::isfinite(v)) std::abort();
      }
      std::vector<float> dense(n, 0.0f);
      gc::accumulate(gc::backend::host{}, m.bytes(), dense, 0.5f);
      if (!fuzz::memory_is_finite(c)) std::abort();
    } catch (const gc::error& e) {
      if (e.code() != gc::errc::non_finite) std::abort();  // parameters were valid: only the data may be refused
      if (fuzz::state_of(c) != before || buf != buf_before) std::abort();
    }
  }
}

template <class Selector, class Corrector>
void run(Selector s, Corrector corrector, std::size_t n, input& in) {
  const auto ic = static_cast<gc::index_coding>(in.next<std::uint8_t>() % 4);
  const auto vc = static_cast<gc::value_coding>(1 + in.next<std::uint8_t>() % 6);
  const gc::encode::index_value e{.index = ic,
                                  .value = vc,
                                  .levels = 1u + in.next<std::uint8_t>() % 16,
                                  .seed = in.next<std::uint8_t>(),
                                  .checksum = (in.next<std::uint8_t>() & 1) != 0};
  try {
    gc::compressor c{gc::backend::host{.threads = 1}, n, s, corrector, e};
    steps(c, in);
  } catch (const gc::error& err) {
    if (err.code() != gc::errc::invalid_argument) std::abort();  // a bad parameter, refused by name
  }
}

template <class Selector>
void with_corrector(Selector s, std::size_t n, input& in) {
  switch (in.next<std::uint8_t>() % 5) {
    case 0:
      run(s, gc::correct::none{}, n, in);
      break;
    case 1:
      run(s, gc::correct::error_feedback{.beta = in.next<float>(), .gamma = 1.0f}, n, in);
      break;
    case 2:
      run(s, gc::correct::momentum{.beta = in.next<float>()}, n, in);
      break;
    case 3:
      run(s, gc::correct::low_pass{.beta = in.next<float>()}, n, in);
      break;
    default:
      run(s,
          gc::correct::chain{gc::correct::clip_norm{.max_norm = in.next<float>()}, gc::correct::momentum{.beta = 0.9f}},
          n, in);
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  input in{data, size};
  const std::size_t n = 1 + in.next<std::uint16_t>() % 3000;
  const double density = in.next<double>();
  switch (in.next<std::uint8_t>() % 6) {
    case 0:
      with_corrector(gc::select::exact_topk{.density = density}, n, in);
      break;
    case 1:
      with_corrector(
          gc::select::sampled_threshold{.density = density, .sample_ratio = 0.05, .reuse_threshold = (size & 1) != 0},
          n, in);
      break;
    case 2:
      with_corrector(gc::select::chunk_local{.bin = in.next<std::uint64_t>()}, n, in);
      break;
    case 3:
      with_corrector(gc::select::random_k{.density = density, .unbiased = (size & 1) != 0}, n, in);
      break;
    case 4:
      with_corrector(gc::select::threshold{.tau = in.next<float>()}, n, in);
      break;
    default:
      with_corrector(gc::select::exact_topk{.count = in.next<std::uint16_t>()}, n, in);
      break;
  }
  return 0;
}
