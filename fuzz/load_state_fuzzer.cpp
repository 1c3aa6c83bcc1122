// libFuzzer target: checkpoint records into load_state. The first byte picks the
// compressor and whether the record is sealed with a correct CRC-32C first (as an
// attacker who knows the format would); the rest is the record. Any record must either
// be refused with gradcomp::error, leaving the state byte for byte as it was, or be
// accepted with finite memory, after which compress still works: no record bricks a
// compressor. Sanitizers catch the rest.
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

constexpr std::size_t n = 257;

std::vector<float> gradient() {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>((i * 37) % 23) - 11.0f;
  return g;
}

template <class Compressor>
void load(Compressor c, const std::string& record) {
  std::vector<std::byte> buf(c.max_message_bytes());
  (void)c.compress(gradient(), buf);  // some memory to lose
  const std::string before = fuzz::state_of(c);
  std::istringstream in(record);
  try {
    c.load_state(in);
  } catch (const gc::error&) {
    if (fuzz::state_of(c) != before) std::abort();
    return;
  }
  if (!fuzz::memory_is_finite(c)) std::abort();
  buf.resize(c.max_message_bytes());  // a saved density may be larger than the one constructed
  // An accepted record must leave a working compressor: its next step succeeds, or, where
  // the record's finite memory overflows in the corrector's update (values near
  // FLT_MAX), that step is refused as non-finite and changes nothing.
  const std::string loaded = fuzz::state_of(c);
  try {
    const auto m = c.compress(std::vector<float>(n, 0.0f), buf);
    (void)gc::decode(m.bytes());
  } catch (const gc::error& e) {
    if (e.code() != gc::errc::non_finite || fuzz::state_of(c) != loaded) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  std::string record(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((data[0] & 0x80) != 0 && record.size() >= 4) {  // seal it: a correct checksum over the rest
    const std::uint32_t crc = gc::detail::crc32c(reinterpret_cast<const std::byte*>(record.data()), record.size() - 4);
    std::memcpy(record.data() + record.size() - 4, &crc, 4);
  }
  switch (data[0] % 4) {
    case 0:
      load(gc::presets::topk_ef(gc::backend::host{}, n, {.density = 0.05}), record);
      break;
    case 1:
      load(gc::presets::dgc(gc::backend::host{}, n, {.density = 0.05, .max_norm = 1.0f, .reuse_threshold = true}),
           record);
      break;
    case 2:
      load(gc::presets::scalecom(gc::backend::host{}, n, {.density = 0.05, .beta = 0.5f}), record);
      break;
    default:
      load(gc::compressor{gc::backend::host{}, n, gc::select::chunk_local{.bin = 7}, gc::correct::momentum{}}, record);
      break;
  }
  return 0;
}
