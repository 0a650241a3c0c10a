// gpt-oss's experts, from the two layouts its checkpoints come in, into expert files with the
// f32 bias section (loader/format/expert_file.h):
//   bf16/f32 (transformers' own):  mlp.experts.gate_up_proj [E, D, 2F] (x @ W; columns 2i gate,
//     2i+1 up), gate_up_proj_bias [E, 2F] (same interleave), down_proj [E, F, D], down_proj_bias [E, D];
//     quantised to the pack's expert type like every other architecture.
//   MXFP4 (the released checkpoints): gate_up_proj_blocks U8 [E, 2F, D/32, 16] and _scales U8
//     [E, 2F, D/32] (rows are outputs, 2i gate and 2i+1 up), down_proj_blocks [E, D, F/32, 16] and
//     _scales [E, D, F/32], the same two biases. Kept as ggml MXFP4, bit for bit: each 32-element
//     block becomes its E8M0 scale byte followed by its 16 nibble bytes reordered from the
//     checkpoint's order (byte j: element 2j low, 2j+1 high) to ggml's (byte j: element j low,
//     j+16 high). The pack's expert type is then MXFP4 whatever --quant says.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "common/thread_pool.h"
#include "loader/format/expert_file_writer.h"
#include "loader/format/model_config.h"
#include "runtime/convert/hf_checkpoint.h"

namespace moestream {

// Checks every layer's expert tensors (presence, shapes, dtypes: one layout for the whole
// checkpoint) before anything is written; FormatError naming the tensor. True for MXFP4.
bool check_gpt_oss_experts(const HfCheckpoint& ck, const ModelConfig& c);

// Writes layer `layer`'s experts into `w` (whose layout has the bias section), experts spread over
// `pool`; `on_expert` is called under the writer's lock after each one.
void write_gpt_oss_layer(const HfCheckpoint& ck, const ModelConfig& c, bool mxfp4, int layer, ExpertFileWriter& w,
                         ThreadPool& pool, const std::function<void(int64_t expert)>& on_expert);

// One MXFP4 block of the checkpoint (16 bytes, element 2j in byte j's low nibble, 2j+1 in its high
// one) and its E8M0 scale as a ggml block_mxfp4 (17 bytes: scale, then byte j holding element j
// low and j+16 high).
void mxfp4_block_to_ggml(uint8_t scale, const uint8_t* hf_block, uint8_t* ggml_block);

// Encodes a row-major R x C float matrix (C a multiple of 32) as ggml MXFP4 rows: per block the
// smallest power-of-two scale that brings its largest magnitude within 6, each element the nearest
// E2M1 level. For synthetic models of gpt-oss's shape (real ones keep their stored blocks).
void encode_mxfp4_matrix(const float* src, size_t rows, size_t cols, uint8_t* dst);

}  // namespace moestream
