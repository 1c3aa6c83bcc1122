// Must not compile: the engine of a user's selector lacks reserve(policy), which
// set_density needs. The diagnostic names it.
#define USER_SELECTOR_NO_RESERVE
#include "user_selector.hpp"

int main() {
  gradcomp::compressor c{gradcomp::backend::host{}, 10, first_entries{}};
  (void)c;
}
