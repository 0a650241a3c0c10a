// cpu_decode: decode tokens/s of q4 and q8 packed models whose files sit in the page cache,
// beside the floor set by memory bandwidth (active bytes per token / measured memcpy bandwidth).
#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/mapping_guard.h"
#include "common/file_util.h"
#include <nlohmann/json.hpp>

#include "loader/store/store_options.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/model.h"
#include "kernels/cpu/quant.h"
#include "runtime/convert/synthetic_model.h"
#include "common/thread_pool.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Bytes copied per second by memcpy on all threads (each copies its own 1/n of a buffer far
// larger than the caches), best of 3. Measured right before each decode run: on a shared machine
// the bandwidth moves with the load, and the ratio must compare like with like.
class CopyBandwidth {
 public:
  CopyBandwidth(ThreadPool& pool, size_t bytes)
      : pool_(pool), part_(bytes / size_t(pool.size()) / 64 * 64),
        src_(new char[part_ * size_t(pool.size())]), dst_(new char[part_ * size_t(pool.size())]) {
    pool_.parallel_for(size_t(pool_.size()), [&](size_t i) {  // fault every page in up front
      std::memset(src_.get() + i * part_, int(i + 1), part_);
      std::memset(dst_.get() + i * part_, 0, part_);
    });
  }
  double measure() {
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const double t0 = now_s();
      pool_.parallel_for(size_t(pool_.size()), [&](size_t i) {
        std::memcpy(dst_.get() + i * part_, src_.get() + i * part_, part_);
      });
      best = std::max(best, double(part_ * size_t(pool_.size())) / (now_s() - t0));
    }
    return best;
  }

 private:
  ThreadPool& pool_;
  size_t part_;
  std::unique_ptr<char[]> src_, dst_;
};

// Reads every file under dir once so it is in the page cache, as the benchmark promises.
void warm_page_cache(const fs::path& dir) {
  std::vector<char> buf(1 << 20);
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw_errno("cannot open", e.path());
    while (::read(fd, buf.data(), buf.size()) > 0) {
    }
    ::close(fd);
  }
}

struct Row {
  std::string name;
  double active_mb = 0, tok_s = 0, floor_tok_s = 0, bw = 0, ratio_min = 0, ratio_max = 0;
  ForwardTimes per_token;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cpu_decode: CPU decode speed against the memory-bandwidth floor"};
  int layers = 4, experts = 64, hidden = 2048, ffn = 768, top_k = 8, vocab = 16384;
  int heads = 32, kv_heads = 4, head_dim = 128, tokens = 24, threads = 0, reps = 5;
  bool verify = false;
  std::string dir_arg, io = "simple";
  app.add_option("--layers", layers)->capture_default_str();
  app.add_option("--experts", experts, "experts per layer")->capture_default_str();
  app.add_option("--top-k", top_k, "active experts per token")->capture_default_str();
  app.add_option("--hidden", hidden)->capture_default_str();
  app.add_option("--ffn", ffn, "expert intermediate size")->capture_default_str();
  app.add_option("--heads", heads)->capture_default_str();
  app.add_option("--kv-heads", kv_heads)->capture_default_str();
  app.add_option("--head-dim", head_dim)->capture_default_str();
  app.add_option("--vocab", vocab)->capture_default_str();
  app.add_option("--tokens", tokens, "decode steps timed per run")->capture_default_str();
  app.add_option("-t,--threads", threads, "0 = all cores")->capture_default_str();
  app.add_option("--reps", reps, "timed runs per model, each after its own bandwidth measurement")
      ->capture_default_str()->check(CLI::Range(1, 100));
  app.add_flag("--verify", verify, "verify expert checksums on every read (as infer does by default)");
  app.add_option("--io", io, "expert store: simple|auto|uring|pread|mmap (as infer --io)")
      ->capture_default_str();
  app.add_option("--dir", dir_arg, "where to write the models (default: a temp dir, removed)");
  CLI11_PARSE(app, argc, argv);

  try {
    ThreadPool pool(threads);
    CopyBandwidth copy(pool, size_t(512) << 20);
    std::printf("machine: %d threads, memcpy bandwidth %.2f GB/s (512 MiB copied, best of 3), "
                "expert matvec %s\n",
                pool.size(), copy.measure() / 1e9, quant_simd_available() ? "AVX2/FMA" : "scalar");
    std::printf("model: %d layers, hidden %d, %d heads x %d (kv %d), %d experts of width %d, top-%d, "
                "vocab %d, dense f32; checksums %s; expert store --io %s\n",
                layers, hidden, heads, head_dim, kv_heads, experts, ffn, top_k, vocab,
                verify ? "verified" : "not verified", io.c_str());

    std::unique_ptr<TempDir> tmp;
    fs::path root = dir_arg;
    if (root.empty()) {
      tmp = std::make_unique<TempDir>("cpu_decode");
      root = tmp->path();
    }
    std::vector<Row> rows;
    for (QuantType q : {QuantType::kQ4, QuantType::kQ8}) {
      ModelConfig cfg = make_model_config(
          Arch::kQwen3Moe,
          {.vocab = vocab, .hidden = hidden, .layers = layers, .heads = heads, .kv_heads = kv_heads,
           .head_dim = head_dim, .expert_width = ffn, .experts = experts, .top_k = top_k, .max_positions = 4096},
          QkNorm::kPerHead, q);
      cfg.rope_theta = 1e6;
      const fs::path dir = root / std::string(quant_name(q));
      const double tw = now_s();
      // A model left by an earlier run with --dir and the same shapes is reused.
      const bool reuse = fs::exists(dir / "model.json") &&
                         ModelConfig::load(dir).to_json() == cfg.to_json();
      if (!reuse) write_synthetic_model(dir, cfg, 1234, threads);
      warm_page_cache(dir);
      std::fprintf(stderr, "%s %s in %.1f s\n", reuse ? "reused" : "wrote", dir.c_str(), now_s() - tw);

      ModelOptions mo;
      mo.n_threads = threads;
      mo.max_context = 512;
      mo.verify_checksums = verify;
      StoreConfig sc;
      sc.io = io;
      sc.verify_checksums = verify;
      const MappingOwnerScope owner(new_mapping_owner());
      auto model = Model::load(dir, mo, open_store_for(dir, ModelConfig::load(dir), sc));
      Sampler greedy(SamplerParams{0.0f, 0, 1.0f, 0});
      std::vector<int> prompt{1, 2, 3, 4, 5, 6, 7, 8};
      GenerateOptions go;
      go.n_new = tokens + 1;  // n_new - 1 decode forward passes are timed
      const double active = double(model->active_bytes_per_token());
      generate(*model, prompt, go, greedy, nullptr);  // warm-up: caches, buffers, page tables
      std::vector<Row> runs;
      for (int rep = 0; rep < reps; ++rep) {
        Row r;
        r.bw = copy.measure();
        GenerateStats st = generate(*model, prompt, go, greedy, nullptr);
        r.name = std::string(quant_name(q));
        r.active_mb = active / 1e6;
        r.tok_s = st.decode.tokens_per_s();
        r.floor_tok_s = r.bw / active;
        r.per_token = st.decode.times;
        for (double* d : {&r.per_token.attention_s, &r.per_token.router_s, &r.per_token.expert_io_s,
                          &r.per_token.expert_compute_s, &r.per_token.other_s})
          *d /= st.decode.tokens;
        runs.push_back(r);
      }
      std::sort(runs.begin(), runs.end(), [](const Row& a, const Row& b) {
        return a.tok_s / a.floor_tok_s < b.tok_s / b.floor_tok_s;
      });
      Row med = runs[runs.size() / 2];
      med.ratio_min = runs.front().tok_s / runs.front().floor_tok_s;
      med.ratio_max = runs.back().tok_s / runs.back().floor_tok_s;
      rows.push_back(med);
    }
    std::printf("\nmedian of %d runs by ratio (each run: copy bandwidth, then %d decode steps)\n", reps,
                tokens);
    std::printf("%-5s %12s %8s %10s %11s %7s %11s | per token, ms: %9s %7s %10s %14s %7s\n", "quant",
                "active MB/tok", "copy GB/s", "decode t/s", "floor t/s", "ratio", "ratio range",
                "attention", "router", "expert I/O", "expert compute", "other");
    for (const Row& r : rows)
      std::printf("%-5s %12.1f %8.2f %10.2f %11.2f %7.2f %5.2f-%5.2f | %24.2f %7.2f %10.2f %14.2f %7.2f\n",
                  r.name.c_str(), r.active_mb, r.bw / 1e9, r.tok_s, r.floor_tok_s,
                  r.tok_s / r.floor_tok_s, r.ratio_min, r.ratio_max,
                  r.per_token.attention_s * 1e3, r.per_token.router_s * 1e3,
                  r.per_token.expert_io_s * 1e3, r.per_token.expert_compute_s * 1e3,
                  r.per_token.other_s * 1e3);
    std::printf("floor = memcpy bandwidth / active bytes per token (dense f32 weights read per token, "
                "incl. lm_head, + top-%d experts per layer in their packed size); goal ratio >= 0.5.\n"
                "memcpy reads and writes each byte it counts, decode mostly reads: a ratio above 1 "
                "is possible.\n",
                top_k);
  } catch (const Error& e) {
    std::fprintf(stderr, "cpu_decode: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
