// Must not compile: this encoder lacks max_bytes(n, count). The diagnostic names the member.
#include <gradcomp/gradcomp.hpp>

struct incomplete_encoder {
  std::string name() const { return "incomplete"; }
  void validate() const {}
};

int main() {
  gradcomp::compressor c{gradcomp::backend::host{}, 10, gradcomp::select::exact_topk{.density = 0.5},
                         gradcomp::correct::none{}, incomplete_encoder{}};
  (void)c;
}
