// Must not compile: the engine of a user's selector begins to watch the corrector's pass
// (begin_observe) but cannot see its tiles (observe). The diagnostic names both.
#define USER_SELECTOR_NO_OBSERVE
#include "user_selector.hpp"

int main() {
  gradcomp::compressor c{gradcomp::backend::host{}, 10, first_entries{}};
  (void)c;
}
