// clid._C: the schemas of the CLID fused ops (TORCH_LIBRARY), implemented per device in
// csrc/cpu/ops.cpp and csrc/cuda/ops.cpp (TORCH_LIBRARY_IMPL). Importing the module registers
// them as torch.ops.clid.*; the documented Python API, with the plain PyTorch references and the
// fake (meta) implementations, is clid/ops/.
#include <Python.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "common/fused_head.h"
#include "common/score_ops.h"
#include "cpu/isa.h"

extern "C" {
// An empty Python module: its import loads this library, whose static initialisers register the ops.
PyObject* PyInit__C(void) {
    static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
    return PyModule_Create(&module_def);
}
}

namespace {

bool with_cuda() {
#ifdef CLID_WITH_CUDA
    return true;
#else
    return false;
#endif
}

// What this build contains, and the CPU kernels' instruction set on this machine.
std::string build_info() {
    std::string info = with_cuda() ? "clid._C: cpu+cuda" : "clid._C: cpu";
    info += std::string(", cpu kernels ") + clid::isa_name(clid::cpu_isa());
#ifdef _OPENMP
    info += ", openmp " + std::to_string(_OPENMP);
#endif
    return info;
}

}  // namespace

TORCH_LIBRARY(clid, m) {
    // Scoring (Eq. 2): float32 results; inputs float32, float16 or bfloat16.
    m.def("seq_logprob(Tensor logits, Tensor targets, Tensor mask) -> Tensor");
    m.def("token_logprob(Tensor logits, Tensor targets) -> Tensor");
    m.def("segment_mean(Tensor values, Tensor lengths) -> Tensor");
    m.def("token_logprob_hidden(Tensor hidden, Tensor weight, Tensor? bias, Tensor targets) -> Tensor");
    // The tensor-core fused head (CUDA only; hidden and weight both float16 or both bfloat16); splits = 0:
    // the planned count of vocabulary splits.
    m.def("token_logprob_hidden_tc(Tensor hidden, Tensor weight, Tensor? bias, Tensor targets, int splits=0) -> Tensor");
    // Step 6: the k-th value (0-dim, u's dtype) and the smooth-step draws. Seed and iteration are
    // uint64 values passed as int64 bits.
    m.def("kth_value(Tensor u, int k, bool force_radix=False) -> Tensor");
    m.def("smoothstep_successive(Tensor u, float threshold, float s, int k, int seed, int iteration, "
          "int force_path=0) -> (Tensor, Tensor)");
    m.def("smoothstep_bernoulli(Tensor u, float threshold, float s, int seed, int iteration) -> Tensor");
    m.def("smoothstep_keys(Tensor u, float threshold, float s, int seed, int iteration) -> Tensor");
    // The build (no tensors: every backend).
    m.def("with_cuda() -> bool", &with_cuda);
    m.def("hidden_tiling() -> int[]", []() -> std::vector<int64_t> {  // (row block, vocabulary tile, slab rows)
        return {clid::cpu::kHiddenRowBlock, clid::cpu::kHiddenVocabTile, clid::cpu::kHiddenSlabRows};
    });
    // token_logprob_hidden_tc's schedule (csrc/common/fused_head.h): (rows, vocabulary columns, k-step,
    // stages, warps along the rows, warps along the vocabulary, most splits), and its planned split count
    // for P positions, V entries and `slots` CTAs at once.
    m.def("tc_head_tiling() -> int[]", []() -> std::vector<int64_t> {
        using namespace clid::tc_head;
        return {kBlockRows, kBlockCols, kBlockK, kStages, kWarpsM, kWarpsN, kMaxSplits};
    });
    m.def("tc_head_splits(int P, int V, int slots) -> int",
          [](int64_t P, int64_t V, int64_t slots) -> int64_t { return clid::tc_head::plan_splits(P, V, slots); });
    m.def("build_info() -> str", &build_info);
}
