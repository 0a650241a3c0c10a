// moestream-llama-oracle: runs a GGUF through libllama (the test tool built by
// scripts/llama_cpp_tool.sh) for the expected outputs beside the GGUF fixtures. Not part of the
// moestream build.
//
//   moestream-llama-oracle run MODEL.gguf PROMPT_FILE N_PREDICT TOP_K N_FULL
//     prints, as JSON on stdout, the prompt ids, the greedy continuation and the logits of every
//     position (top-k of each, plus the full rows of the first N_FULL positions).
//
// Determinism: one thread, f32 KV cache, no flash attention, the prompt as one batch and each
// generated token as its own batch; greedy = the first index of the largest logit.
#include <llama.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

namespace {

void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

[[noreturn]] void fail(const std::string& msg) {
  std::fprintf(stderr, "moestream-llama-oracle: %s\n", msg.c_str());
  std::exit(1);
}

void print_float(float v) {
  // %.9g round-trips a float exactly.
  std::printf("%.9g", static_cast<double>(v));
}

}  // namespace

int run(int argc, char** argv) {
  if (argc != 7) fail("usage: run MODEL.gguf PROMPT_FILE N_PREDICT TOP_K N_FULL");
  const std::string model_path = argv[2];
  std::ifstream pf(argv[3], std::ios::binary);
  if (!pf) fail(std::string("cannot read prompt file ") + argv[3]);
  std::stringstream ss;
  ss << pf.rdbuf();
  const std::string prompt = ss.str();
  const int n_predict = std::atoi(argv[4]);
  const int top_k = std::atoi(argv[5]);
  const int n_full = std::atoi(argv[6]);
  if (n_predict < 0 || n_predict > 256 || top_k <= 0 || n_full < 0) fail("bad numeric argument");

  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
  if (!model) fail("cannot load " + model_path);
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);

  std::vector<llama_token> ids(prompt.size() + 16);
  int n = llama_tokenize(vocab, prompt.data(), static_cast<int32_t>(prompt.size()), ids.data(),
                         static_cast<int32_t>(ids.size()), /*add_special=*/true,
                         /*parse_special=*/false);
  if (n <= 0) fail("tokenization of the prompt failed");
  ids.resize(static_cast<size_t>(n));
  const int n_prompt = n;

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(n_prompt + n_predict + 8);
  cp.n_batch = cp.n_ctx;
  cp.n_ubatch = cp.n_ctx;
  cp.n_seq_max = 1;
  cp.n_threads = 1;
  cp.n_threads_batch = 1;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.type_k = GGML_TYPE_F32;
  cp.type_v = GGML_TYPE_F32;
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) fail("cannot create a context");

  std::vector<std::vector<float>> rows;  // logits of every position, in order
  std::vector<llama_token> generated;
  auto run = [&](const std::vector<llama_token>& toks, int pos0) {
    llama_batch b = llama_batch_init(static_cast<int32_t>(toks.size()), 0, 1);
    for (size_t i = 0; i < toks.size(); ++i) {
      b.token[i] = toks[i];
      b.pos[i] = pos0 + static_cast<int>(i);
      b.n_seq_id[i] = 1;
      b.seq_id[i][0] = 0;
      b.logits[i] = 1;
    }
    b.n_tokens = static_cast<int32_t>(toks.size());
    if (llama_decode(ctx, b) != 0) fail("llama_decode failed");
    for (size_t i = 0; i < toks.size(); ++i) {
      const float* l = llama_get_logits_ith(ctx, static_cast<int32_t>(i));
      if (!l) fail("no logits");
      rows.emplace_back(l, l + n_vocab);
    }
    llama_batch_free(b);
  };
  auto argmax = [](const std::vector<float>& r) {
    return static_cast<llama_token>(std::max_element(r.begin(), r.end()) - r.begin());
  };

  run(ids, 0);
  for (int i = 0; i < n_predict; ++i) {
    const llama_token t = argmax(rows.back());
    generated.push_back(t);
    run({t}, n_prompt + i);  // its logits too: every position of prompt + continuation
  }

  std::printf("{\"n_vocab\":%d,\"prompt_ids\":[", n_vocab);
  for (int i = 0; i < n_prompt; ++i) std::printf("%s%d", i ? "," : "", ids[i]);
  std::printf("],\"generated_ids\":[");
  for (size_t i = 0; i < generated.size(); ++i) std::printf("%s%d", i ? "," : "", generated[i]);
  std::printf("],\"top_k\":%d,\"top\":[", top_k);
  const int k = std::min(top_k, n_vocab);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::vector<int> order(static_cast<size_t>(n_vocab));
    std::iota(order.begin(), order.end(), 0);
    // Stable: ties keep the lower id first, as greedy does.
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return rows[r][a] > rows[r][b]; });
    std::printf("%s[", r ? "," : "");
    for (int j = 0; j < k; ++j) {
      std::printf("%s[%d,", j ? "," : "", order[j]);
      print_float(rows[r][order[j]]);
      std::printf("]");
    }
    std::printf("]");
  }
  std::printf("],\"full_logits\":[");
  for (int r = 0; r < std::min<int>(n_full, static_cast<int>(rows.size())); ++r) {
    std::printf("%s[", r ? "," : "");
    for (int j = 0; j < n_vocab; ++j) {
      if (j) std::printf(",");
      print_float(rows[r][j]);
    }
    std::printf("]");
  }
  std::printf("]}\n");

  llama_free(ctx);
  llama_model_free(model);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) fail("usage: run MODEL.gguf PROMPT_FILE N_PREDICT TOP_K N_FULL");
  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  const std::string cmd = argv[1];
  if (cmd != "run") fail("unknown command " + cmd);
  const int rc = run(argc, argv);
  llama_backend_free();
  return rc;
}
