// What the CUDA toolkit's <cuda_runtime_api.h> gives gradcomp and its tests, emulated (emulated_cuda.hpp).
#pragma once
#include <emulated_cuda.hpp>
