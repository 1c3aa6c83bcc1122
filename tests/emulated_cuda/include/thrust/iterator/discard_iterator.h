// What the CUDA toolkit's <thrust/iterator/discard_iterator.h> gives gradcomp and its tests, emulated
// (emulated_cuda.hpp).
#pragma once
#include <emulated_cuda.hpp>
