// `synth_model`: writes a packed model with a released model's architecture and byte sizes
// (runtime/convert/model_shapes.h) and seeded random weights, for streaming benchmarks at true scale.
#include <CLI/CLI.hpp>

#include <climits>
#include <cstdint>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "common/error.h"
#include "common/file_util.h"
#include "common/progress.h"
#include "common/timing.h"
#include "runtime/convert/model_shapes.h"
#include "runtime/convert/synthetic_model.h"
#include "tools/cli_range.h"
#include "tools/tool_main.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

struct Args {
  std::string shape, out, quant;  // empty: the shape's own (q4; gpt-oss: MXFP4, as released)
  int layers = 0, max_context = 0, threads = 0, scale_down = 1;
  uint64_t seed = 1;
  bool force = false, quiet = false;
  std::string hash = "xxh3";
};

double gb(uint64_t b) { return double(b) / 1e9; }
std::string gb_text(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", gb(b));
  return buf;
}

// Bytes beyond the tensors and expert slots: model.json, the safetensors JSON header, rounding.
constexpr uint64_t kSlackBytes = 16u << 20;

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw_errno("cannot fsync directory", dir);
}

int run(const Args& a) {
  const PayloadHash hash = a.hash == "xxh64" ? PayloadHash::kXxh64 : PayloadHash::kXxh3;
  ModelConfig cfg = known_shape(a.shape);
  const int real_layers = cfg.n_layers;
  if (a.layers > 0) set_layer_count(cfg, a.layers);
  if (cfg.first_k_dense_replace >= cfg.n_layers)  // GLM-4.5-Air's layer 0 has no experts
    throw ConfigError("--layers " + std::to_string(cfg.n_layers) + ": " + a.shape + "'s first " +
                      std::to_string(cfg.first_k_dense_replace) + " layer(s) are dense; ask for at least " +
                      std::to_string(cfg.first_k_dense_replace + 1));
  if (!a.quant.empty()) {
    cfg.expert_quant = parse_stored_quant(a.quant);
    if (cfg.expert_quant != QuantType::kQ4 && cfg.expert_quant != QuantType::kQ8 &&
        !(cfg.arch == Arch::kGptOss && cfg.expert_quant == ggml_quant(GgmlType::kMXFP4)))
      throw ConfigError("--quant must be q4 or q8 (or MXFP4 for gpt-oss), got " + a.quant);
  }
  if (a.max_context > 0) cfg.max_position_embeddings = a.max_context;
  cfg = scaled_down(cfg, a.scale_down);

  const fs::path out = fs::absolute(a.out).lexically_normal();
  const fs::path parent = out.parent_path();
  if (fs::exists(out) && !(fs::is_directory(out) && fs::is_empty(out)) && !a.force)
    throw ConfigError(out.string() + " exists and is not empty; pass --force to replace it");
  fs::create_directories(parent);

  const uint64_t total = synthetic_model_bytes(cfg, hash), dense = synthetic_dense_bytes(cfg);
  const uint64_t per_layer = cfg.n_moe_layers() > 0 ? (total - dense) / uint64_t(cfg.n_moe_layers()) : 0;
  const uint64_t avail = fs::space(parent).available;
  if (total + kSlackBytes > avail) {
    // What would fit: the dense file grows with layers too, so count it per layer.
    const ModelConfig one = [&] { ModelConfig c = cfg; c.n_layers = 1; return c; }();
    const uint64_t per_layer_all = synthetic_model_bytes(one, hash);
    const uint64_t fits = avail > kSlackBytes ? (avail - kSlackBytes) / per_layer_all : 0;
    throw IoError("not enough disk space on " + parent.string() + ": " + a.shape + " with " +
                  std::to_string(cfg.n_layers) + " layers needs " + gb_text(total) +
                  ", " + gb_text(avail) + " available; about " +
                  std::to_string(fits) + " layers fit (--layers)");
  }
  std::fprintf(stderr,
               "synth_model: %s (%d of %d layers, %d experts top-%d, hidden %d, expert width %d, "
               "vocab %d, experts %s, dense %s%s): %.3f GB to %s\n",
               a.shape.c_str(), cfg.n_layers, real_layers, cfg.n_experts, cfg.n_experts_per_tok,
               cfg.hidden_size, cfg.moe_intermediate_size, cfg.vocab_size,
               std::string(quant_name(cfg.expert_quant)).c_str(), cfg.dense_dtype.c_str(),
               a.scale_down > 1 ? (", widths / " + std::to_string(a.scale_down)).c_str() : "",
               gb(total), out.c_str());

  const fs::path tmp = parent / (out.filename().string() + ".tmp." + std::to_string(::getpid()));
  fs::remove_all(tmp);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    // A bar on a terminal, a line every few seconds into a log (common/progress.h).
    Progress progress("synth_model", !a.quiet);
    const auto show = [&](uint64_t done, uint64_t all) {
      const double s = seconds_since(t0);
      char detail[96];
      std::snprintf(detail, sizeof detail, "%.2f / %.2f GB, %.0f MB/s", gb(done), gb(all),
                    s > 0 ? double(done) / s / 1e6 : 0.0);
      progress.update(done, all, detail);
    };
    write_synthetic_model(tmp, cfg, a.seed, a.threads, show, hash);
    show(total, total);  // the last line, whatever the last callback reported
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // never leave a half-written model behind
    throw;
  }
  fsync_dir(tmp);
  fsync_dir(tmp / cfg.experts_dir);
  if (fs::exists(out)) {
    const fs::path old = parent / (out.filename().string() + ".old." + std::to_string(::getpid()));
    fs::rename(out, old);
    fs::rename(tmp, out);
    fs::remove_all(old);
  } else {
    fs::rename(tmp, out);
  }
  fsync_dir(parent);
  const double s = seconds_since(t0);
  const uint64_t expert_bytes = cfg.expert_layout(0).bytes;
  std::printf("model %s\nshape %s\nlayers %d\nquant %s\ndense_bytes %llu\nexpert_file_bytes %llu\n"
              "expert_bytes %llu\nexpert_bytes_per_token %llu\ntotal_bytes %llu\nseconds %.1f\n",
              out.c_str(), a.shape.c_str(), cfg.n_layers, std::string(quant_name(cfg.expert_quant)).c_str(),
              (unsigned long long)dense, (unsigned long long)per_layer, (unsigned long long)expert_bytes,
              (unsigned long long)(expert_bytes * uint64_t(cfg.n_experts_per_tok) * uint64_t(cfg.n_moe_layers())),
              (unsigned long long)total, s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moestream synth_model: a packed model of a released architecture with random "
               "weights, at its true byte size. It ships no tokenizer (no released vocabulary "
               "matches the demo's): run it with infer --prompt-ids ... --print-ids"};
  Args a;
  std::string names;
  for (const std::string& n : known_shape_names()) names += (names.empty() ? "" : "|") + n;
  app.add_option("--shape", a.shape, names)->required();
  app.add_option("--layers", a.layers, "decoder layers to write (default: the model's; fewer fit a smaller disk)")
      ->check(in_range(1, 1000));
  app.add_option("--quant", a.quant, "expert quantisation: q4 or q8 (default q4; gpt-oss: MXFP4, as released)");
  app.add_option("--seed", a.seed, "weight seed")->capture_default_str()->check(in_range<uint64_t>(0, UINT64_MAX));
  app.add_option("--max-context", a.max_context,
                 "max_position_embeddings written to model.json (bounds infer's default KV cache)")
      ->check(in_range(1, kMaxContext));
  app.add_option("-t,--threads", a.threads, "encoding threads; 0 = all cores")->capture_default_str()
      ->check(in_range(0, kMaxThreads));
  app.add_option("--payload-hash", a.hash,
                 "the expert files' slot checksums: xxh3 (what every writer uses) or xxh64 (the files "
                 "builds before 2026-12-04 wrote and read)")
      ->capture_default_str()->check(CLI::IsMember({"xxh3", "xxh64"}));
  app.add_flag("--force", a.force, "replace OUT_DIR when it exists");
  app.add_flag("-q,--quiet", a.quiet, "no progress line");
  // Tests only: divides hidden, expert width and vocab, keeping every count, so a CI test can
  // write a real shape's structure in a few MB.
  app.add_option("--scale-down", a.scale_down, "")->group("")->check(in_range(1, 1 << 16));
  app.add_option("OUT_DIR", a.out, "model directory to write (via OUT_DIR.tmp.<pid> and a rename)")->required();
  return run_tool("synth_model", app, argc, argv, [&] { return run(a); });
}
