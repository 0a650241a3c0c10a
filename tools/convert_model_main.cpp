// convert_model HF_DIR OUT_DIR [--quant q4|q8|bf16|f32] [--dense-dtype bf16|f32] [--force] [-t N]:
// packs a Hugging Face MoE checkpoint into a moestream model directory (runtime/convert/convert.h).
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "common/error.h"
#include "runtime/convert/convert.h"
#include "tools/cli_range.h"
#include "tools/tool_main.h"

int main(int argc, char** argv) {
  CLI::App app{"Convert a Hugging Face MoE checkpoint (Qwen3-MoE, OLMoE, Mixtral) into a moestream model"};
  std::string hf_dir, out_dir, quant = "q4", dense_dtype;
  bool force = false, quiet = false;
  int threads = 0;
  app.add_option("HF_DIR", hf_dir, "Hugging Face model directory (config.json, *.safetensors)")->required();
  app.add_option("OUT_DIR", out_dir, "Packed model directory to create")->required();
  app.add_option("--quant", quant, "Expert encoding")->check(CLI::IsMember({"q4", "q8", "bf16", "f32"}));
  app.add_option("--dense-dtype", dense_dtype, "Dense weights dtype (default: f32 for f32 checkpoints, else bf16)")
      ->check(CLI::IsMember({"bf16", "f32"}));
  app.add_flag("--force", force, "Replace OUT_DIR if it exists");
  app.add_option("-t,--threads", threads, "Experts quantised in parallel (default: all cores)")
      ->check(moestream::in_range(0, moestream::kMaxThreads));
  app.add_flag("-q,--quiet", quiet, "No progress bar");
  // run_tool: a bad flag exits 1 like every other tool, errors are one "convert_model: error:" line.
  return moestream::run_tool("convert_model", app, argc, argv, [&] {
    moestream::ConvertOptions opts;
    opts.quant = moestream::parse_quant(quant);
    opts.dense_dtype = dense_dtype;
    opts.overwrite = force;
    opts.progress = !quiet;
    opts.threads = threads;
    moestream::ModelConfig c = moestream::convert_model(hf_dir, out_dir, opts);
    std::fprintf(stderr, "convert_model: wrote %s (%s, %d layers, %d experts, experts %s, dense %s)\n",
                 out_dir.c_str(), std::string(moestream::arch_name(c.arch)).c_str(), c.n_layers,
                 c.n_experts, std::string(moestream::quant_name(c.expert_quant)).c_str(), c.dense_dtype.c_str());
    return 0;
  });
}
