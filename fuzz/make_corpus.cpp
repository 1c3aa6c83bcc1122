// Writes the seed corpora: one valid message per index and value coding, with and
// without checksum, of a few shapes (fuzz/corpus, for decode_fuzzer), and the
// checkpoint records of load_state_fuzzer's compressors after a few steps, behind the
// byte that picks the compressor (fuzz/corpus_load_state). Run once; the output is
// committed.
#include <gradcomp/gradcomp.hpp>

#include <fstream>
#include <sstream>
#include <string>

int main(int argc, char** argv) {
  namespace gc = gradcomp;
  const std::string dir = argc > 1 ? argv[1] : "fuzz/corpus";
  const std::string state_dir = argc > 2 ? argv[2] : "fuzz/corpus_load_state";
  int file = 0;
  for (const std::size_t n : {std::size_t{1}, std::size_t{9}, std::size_t{300}, std::size_t{4099}}) {
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>((i * 37) % 23) - 11.0f;
    for (const auto ic : {gc::index_coding::raw32, gc::index_coding::delta_bitpack, gc::index_coding::bitmap}) {
      for (const auto vc :
           {gc::value_coding::f32, gc::value_coding::f16, gc::value_coding::bf16, gc::value_coding::int8,
            gc::value_coding::ternary, gc::value_coding::qsgd, gc::value_coding::int4}) {
        for (const bool checksum : {false, true}) {
          gc::compressor c{gc::backend::host{}, n, gc::select::exact_topk{.density = 0.1}, gc::correct::none{},
                           gc::encode::index_value{.index = ic, .value = vc, .levels = 7, .checksum = checksum}};
          std::vector<std::byte> buf(c.max_message_bytes());
          const auto m = c.compress(g, buf);
          std::ofstream(dir + "/seed_" + std::to_string(file++) + ".bin", std::ios::binary)
              .write(reinterpret_cast<const char*>(m.bytes().data()), static_cast<std::streamsize>(m.bytes().size()));
        }
      }
    }
  }
  // Checkpoints of the compressors load_state_fuzzer loads into (n = 257), after 3 steps.
  const std::size_t n = 257;
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>((i * 37) % 23) - 11.0f;
  int record = 0;
  auto write_state = [&](auto c, std::uint8_t pick) {
    std::vector<std::byte> buf(c.max_message_bytes());
    for (int t = 0; t < 3; ++t) (void)c.compress(g, buf);
    std::ostringstream out;
    c.save_state(out);
    for (const std::uint8_t sealed : {std::uint8_t{0}, std::uint8_t{0x80}}) {
      std::ofstream f(state_dir + "/state_" + std::to_string(record++) + ".bin", std::ios::binary);
      const char first = static_cast<char>(pick | sealed);
      f.write(&first, 1);
      f << out.str();
    }
  };
  write_state(gc::presets::topk_ef(gc::backend::host{}, n, {.density = 0.05}), 0);
  write_state(gc::presets::dgc(gc::backend::host{}, n, {.density = 0.05, .max_norm = 1.0f, .reuse_threshold = true}),
              1);
  write_state(gc::presets::scalecom(gc::backend::host{}, n, {.density = 0.05, .beta = 0.5f}), 2);
  write_state(gc::compressor{gc::backend::host{}, n, gc::select::chunk_local{.bin = 7}, gc::correct::momentum{}}, 3);
}
