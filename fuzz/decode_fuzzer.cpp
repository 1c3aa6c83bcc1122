// libFuzzer target: decode and accumulate arbitrary bytes. Any input must either be
// accepted, with every index below n and every value finite, or raise gradcomp::error
// and leave the destination bit-for-bit unchanged. Sanitizers catch the rest.
#include <gradcomp/gradcomp.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  std::uint64_t n = 0;
  bool decoded = false;
  try {
    const gradcomp::sparse_vector s = gradcomp::decode(bytes);
    decoded = true;
    n = s.n;
    if (s.indices.size() != s.values.size()) std::abort();
    for (std::size_t j = 0; j < s.indices.size(); ++j) {
      if (s.indices[j] >= s.n || (j > 0 && s.indices[j] <= s.indices[j - 1]) || !std::isfinite(s.values[j]))
        std::abort();
    }
  } catch (const gradcomp::error&) {
  }
  // Accumulate into a destination of the message's n when it is small, else of 64.
  if (size >= 24) std::memcpy(&n, data + 16, sizeof n);
  std::vector<float> dense(n >= 1 && n <= (1u << 16) ? n : 64, 0.25f);
  const std::vector<float> before = dense;
  try {
    gradcomp::accumulate(gradcomp::backend::host{}, bytes, dense, 0.5f);
    if (!decoded) std::abort();  // accumulate accepted what decode refused
  } catch (const gradcomp::error&) {
    if (std::memcmp(dense.data(), before.data(), dense.size() * sizeof(float)) != 0) std::abort();
  }
  return 0;
}
