// What the CUDA toolkit's <thrust/device_vector.h> gives gradcomp and its tests, emulated (emulated_cuda.hpp).
#pragma once
#include <emulated_cuda.hpp>
