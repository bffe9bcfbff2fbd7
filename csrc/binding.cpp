// The one binding of the clid_ops extension: torch tensors in, raw-pointer kernels out.
//
// Every op checks its arguments, then dispatches on the device: CPU kernels live in csrc/cpu/,
// CUDA kernels in csrc/cuda/ (compiled, and CLID_WITH_CUDA defined, only when PyTorch has CUDA).
// The Python wrappers and the plain PyTorch references are in clid/ops.py.
#include <torch/extension.h>

#include <string>

#ifdef CLID_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>  // at::cuda::getCurrentCUDAStream(), passed to launchers as void*
#endif

// Declarations of the sampler ops (owned by the sampler kernels' author), if present.
#if __has_include("common/sampler_ops.h")
#include "common/sampler_ops.h"
#endif

static std::string build_info() {
    std::string info = "clid_ops: cpu";
#ifdef CLID_WITH_CUDA
    info += "+cuda";
#endif
#ifdef _OPENMP
    info += ", openmp " + std::to_string(_OPENMP);
#endif
    return info;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "CLID fused kernels (see clid/ops.py for the documented Python API)";
    m.def("build_info", &build_info, "What this build contains");
    m.def("with_cuda", []() {
#ifdef CLID_WITH_CUDA
        return true;
#else
        return false;
#endif
    });

    // ---- score ops (C1) ----

    // ---- sampler ops (C2) ----
}
