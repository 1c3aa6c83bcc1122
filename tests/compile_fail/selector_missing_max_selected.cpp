// Must not compile: this selector lacks max_selected(n). The diagnostic names the member.
#include <gradcomp/gradcomp.hpp>

struct incomplete_selector {
  std::string name() const { return "incomplete"; }
  void validate(std::size_t) const {}
};

int main() {
  gradcomp::compressor c{gradcomp::backend::host{}, 10, incomplete_selector{}};
  (void)c;
}
