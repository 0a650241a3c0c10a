// convert_model SOURCE OUT_DIR [--quant q4|q8|bf16|f32] [--dense-quant bf16|q8|f32] [--force] [-t N]:
// packs a Hugging Face MoE checkpoint, or a GGUF (any shard of a split set) with its ggml block
// types kept, into a moestream model directory (runtime/convert/convert.h).
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "common/error.h"
#include "loader/format/gguf_model.h"
#include "runtime/convert/convert.h"
#include "tools/cli_range.h"
#include "tools/tool_main.h"

int main(int argc, char** argv) {
  CLI::App app{"Convert a Hugging Face MoE checkpoint (Qwen3-MoE, OLMoE, Mixtral, Qwen2-MoE, GLM-4.5, DeepSeek-V3 incl. its FP8 release, Kimi K2, DeepSeek-V2-Lite, gpt-oss) or a GGUF into a moestream model"};
  std::string hf_dir, out_dir, quant = "q4", dense_quant;
  bool force = false, quiet = false;
  int threads = 0;
  app.add_option("SOURCE", hf_dir,
                 "Hugging Face model directory (config.json, *.safetensors), or a GGUF file (any shard of a "
                 "split set; block types are kept as stored)")
      ->required();
  app.add_option("OUT_DIR", out_dir, "Packed model directory to create")->required();
  app.add_option("--quant", quant, "Expert encoding of a Hugging Face source (default q4)")
      ->check(CLI::IsMember({"q4", "q8", "bf16", "f32"}));
  // --dense-dtype: the flag's earlier name, still accepted.
  app.add_option("--dense-quant,--dense-dtype", dense_quant,
                 "Dense weights of a Hugging Face source: bf16 (default), q8 (ggml Q8_0 in dense.gguf) or f32")
      ->check(CLI::IsMember({"bf16", "q8", "f32"}));
  app.add_flag("--force", force, "Replace OUT_DIR if it exists");
  app.add_option("-t,--threads", threads, "Experts quantised in parallel, Hugging Face sources (default: all cores)")
      ->check(moestream::in_range(0, moestream::kMaxThreads));
  app.add_flag("-q,--quiet", quiet, "No progress bar");
  // run_tool: a bad flag exits 1 like every other tool, errors are one "convert_model: error:" line.
  return moestream::run_tool("convert_model", app, argc, argv, [&] {
    const bool gguf = moestream::is_gguf_file(hf_dir);
    if (gguf && app.count("--quant") > 0)
      throw moestream::ConfigError("--quant applies to Hugging Face checkpoints; a GGUF's experts keep their "
                                   "stored ggml types");
    moestream::ConvertOptions opts;
    opts.quant = moestream::parse_quant(quant);
    opts.dense_dtype = dense_quant;
    opts.overwrite = force;
    opts.progress = !quiet;
    opts.threads = threads;
    moestream::ModelConfig c = moestream::convert_model(hf_dir, out_dir, opts);
    std::fprintf(stderr, "convert_model: wrote %s (%s, %d layers, %d experts, experts %s%s, dense %s)\n",
                 out_dir.c_str(), std::string(moestream::arch_name(c.arch)).c_str(), c.n_layers,
                 c.n_experts, std::string(moestream::quant_name(c.expert_quant)).c_str(),
                 c.layer_expert_types.empty() ? "" : " (layer 0 gate; types per layer in model.json)",
                 c.dense_dtype.c_str());
    return 0;
  });
}
