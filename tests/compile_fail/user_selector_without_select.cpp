// Must not compile: the engine of a user's selector lacks select(), part of the step
// protocol. The diagnostic names it.
#define USER_SELECTOR_NO_SELECT
#include "user_selector.hpp"

int main() {
  gradcomp::compressor c{gradcomp::backend::host{}, 10, first_entries{}};
  (void)c;
}
