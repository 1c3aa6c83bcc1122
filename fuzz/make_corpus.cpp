// Writes the seed corpus: one valid message per index and value coding, with and
// without checksum, of a few shapes. Run once; the output is committed in fuzz/corpus.
#include <gradcomp/gradcomp.hpp>

#include <fstream>
#include <string>

int main(int argc, char** argv) {
  namespace gc = gradcomp;
  const std::string dir = argc > 1 ? argv[1] : "fuzz/corpus";
  int file = 0;
  for (const std::size_t n : {std::size_t{1}, std::size_t{9}, std::size_t{300}, std::size_t{4099}}) {
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>((i * 37) % 23) - 11.0f;
    for (const auto ic : {gc::index_coding::raw32, gc::index_coding::delta_bitpack, gc::index_coding::bitmap}) {
      for (const auto vc : {gc::value_coding::f32, gc::value_coding::f16, gc::value_coding::bf16, gc::value_coding::int8,
                            gc::value_coding::ternary, gc::value_coding::qsgd}) {
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
}
