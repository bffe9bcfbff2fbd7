// The tile schedule of token_logprob_hidden_tc, the tensor-core fused head (csrc/cuda/fused_head.cu):
// its constants and the host-side plan of its launches, shared by the kernel, the op that launches it,
// and Python (torch.ops.clid.tc_head_tiling, tc_head_splits), whose tests emulate the schedule.
//
// A CTA owns kBlockRows positions and one contiguous range of vocabulary tiles of kBlockCols entries
// (its split). For each tile it computes the [kBlockRows, kBlockCols] logits on the tensor cores
// (mma.sync m16n8k16, float32 accumulation) over the hidden dimension in steps of kBlockK, staged in
// shared memory through a kStages-deep cp.async pipeline, then folds the tile into a running
// (max, sum of exp) per row. The warps form a kWarpsM x kWarpsN grid over the tile; in a warp,
// each thread holds, for each of its rows, the kWarpCols / 4 columns
//     wn * kWarpCols + 8 j + 2 q + e   (j < kWarpCols / 8, e < 2; q = lane % 4, wn the warp's column),
// which its own running state covers. At the end the 4 threads of a row (lanes q = 0..3: merged by
// xor-shuffles over 1, then 2) and the kWarpsN warps (in order) merge into the split's partial state;
// a second kernel merges the splits in order and writes the log-probability.
#pragma once

#include <stdint.h>

#include "common/macros.h"

namespace clid {
namespace tc_head {

constexpr int kBlockRows = 128;   // positions per CTA
constexpr int kBlockCols = 128;   // vocabulary entries per tile
constexpr int kBlockK = 32;       // hidden dimensions per pipeline stage (64 bytes of a row)
constexpr int kStages = 4;        // cp.async pipeline depth
constexpr int kWarpsM = 2;        // warps along the positions
constexpr int kWarpsN = 2;        // warps along the vocabulary
constexpr int kWarpRows = kBlockRows / kWarpsM;  // 64: 4 MMA tiles of 16 rows
constexpr int kWarpCols = kBlockCols / kWarpsN;  // 64: 8 MMA tiles of 8 columns
constexpr int kThreads = 32 * kWarpsM * kWarpsN;
constexpr int kStageBytes = (kBlockRows + kBlockCols) * kBlockK * 2;
constexpr int kSmemBytes = kStages * kStageBytes;  // 64 KiB: two CTAs fit an SM of sm_80 and sm_90
constexpr int kMaxSplits = 64;
// The hidden dimension is read in 16-byte pieces: rows hold a multiple of kHiddenAlign elements (the op
// pads H with zero columns otherwise, which leaves every product unchanged).
constexpr int kHiddenAlign = 8;

CLID_INLINE int64_t vocab_tiles(int64_t V) { return (V + kBlockCols - 1) / kBlockCols; }

// Split k of `splits` covers the vocabulary tiles [split_begin(k), split_begin(k + 1)): as equal as
// integers allow, none empty while splits <= tiles.
CLID_INLINE int64_t split_begin(int64_t k, int64_t splits, int64_t tiles) { return k * tiles / splits; }

// How many splits of the vocabulary for P positions on a GPU that runs `slots` CTAs at once (SMs times
// CTAs per SM): the count in 1 .. min(tiles, kMaxSplits) that minimises the modelled time, waves of
// CTAs times the tiles of the longest split plus one tile's worth of fixed cost per CTA (pipeline fill,
// final merge). Ties go to fewer splits (less merge work).
inline int64_t plan_splits(int64_t P, int64_t V, int64_t slots) {
    const int64_t tiles = vocab_tiles(V), row_tiles = (P + kBlockRows - 1) / kBlockRows;
    if (tiles <= 1 || row_tiles == 0) return 1;
    if (slots < 1) slots = 1;
    const int64_t most = tiles < kMaxSplits ? tiles : kMaxSplits;
    int64_t best = 1, best_cost = -1;
    for (int64_t s = 1; s <= most; ++s) {
        const int64_t waves = (row_tiles * s + slots - 1) / slots;
        const int64_t cost = waves * ((tiles + s - 1) / s + 1);
        if (best_cost < 0 || cost < best_cost) { best = s; best_cost = cost; }
    }
    return best;
}

}  // namespace tc_head
}  // namespace clid
