// Must not compile: this corrector lacks state_arrays. The diagnostic names the member.
#include <gradcomp/gradcomp.hpp>

struct incomplete_corrector {
  std::string name() const { return "incomplete"; }
  void validate() const {}
};

int main() {
  gradcomp::compressor c{gradcomp::backend::host{}, 10, gradcomp::select::exact_topk{.density = 0.5},
                         incomplete_corrector{}};
  (void)c;
}
