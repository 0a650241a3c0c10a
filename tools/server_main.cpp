// `moestream-server`: serves one packed model over an OpenAI-compatible HTTP API (loopback by
// default); the engine, expert store and KV cache stay warm across requests.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <pthread.h>
#include <thread>

#include "common/checked.h"
#include "common/error.h"
#include "common/mapping_guard.h"
#include "loader/format/gguf_file.h"
#include "loader/format/gguf_model.h"
#include "loader/format/routing_log.h"
#include "runtime/tokenizer/model_tokenizer.h"
#include "runtime/engine/model.h"
#include "runtime/engine/routing_replay.h"
#include "runtime/chat/chat_prompt.h"
#include "runtime/server/http_api.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tools/engine_cli.h"
#include "tools/llama_flags.h"
#include "tools/option_cli.h"
#include "tools/tool_main.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

// The server's own options (the table's rows for the server that are not engine options); their
// initial values (ServerOptions') are the defaults.
struct Args {
  std::string model, reply_format = "auto";
  EngineSettings engine;  // threads, ctx, the store, cache-aware, GPU, routing logs
  uint64_t max_body_kb = 4096;
  ServerOptions server;
};

// --collect-routing: every request's routing under its own request id, with --parallel too: the
// runner names the model sequence a request starts on (ServerOptions::on_request_start) and the
// batch's routing events carry their sequence, so concurrent requests' records stay apart.
// Positions before the prompt's length are prefill, the rest decode (as infer writes them).
class ServerRoutingLog {
 public:
  ServerRoutingLog(const fs::path& path, const fs::path& dir, Model& model)
      : model_(model), log_(path, header(dir, model.config())) {
    if (!log_.warning().empty()) std::fprintf(stderr, "moestream-server: warning: %s\n", log_.warning().c_str());
    model_.set_routing_callback([this](const RoutingEvent& ev) { record(ev); });
  }
  ~ServerRoutingLog() { model_.set_routing_callback({}); }  // the writer flushes as it goes
  ServerRoutingLog(const ServerRoutingLog&) = delete;
  ServerRoutingLog& operator=(const ServerRoutingLog&) = delete;

  uint64_t start(int sequence, int prompt_tokens) {
    std::lock_guard<std::mutex> lk(mu_);
    Open& o = open_[sequence];
    o.id = log_.take_request_id();
    o.prompt_tokens = prompt_tokens;
    return o.id;
  }
  void close() {
    model_.set_routing_callback({});
    std::lock_guard<std::mutex> lk(mu_);
    log_.close();
  }

 private:
  struct Open {
    uint64_t id = 0;
    int prompt_tokens = 0;
  };
  static RoutingLogHeader header(const fs::path& dir, const ModelConfig& c) {
    return RoutingLogHeader{model_identity_hash(dir), uint32_t(c.n_moe_layers()), uint32_t(c.n_experts),
                            uint32_t(c.n_experts_per_tok), uint32_t(c.hidden_size)};
  }
  void record(const RoutingEvent& ev) {
    std::lock_guard<std::mutex> lk(mu_);
    const auto it = open_.find(ev.sequence);
    MOE_ASSERT(it != open_.end(), "routing of a sequence no request started on");
    RoutingRecord r;
    r.request_id = it->second.id;
    r.layer = static_cast<uint16_t>(ev.layer);
    const size_t k = size_t(ev.top_k);
    for (int t = 0; t < ev.n_tokens; ++t) {
      r.position = static_cast<uint32_t>(ev.position + t);
      r.phase = ev.position + t < it->second.prompt_tokens ? RoutingPhase::kPrefill : RoutingPhase::kDecode;
      r.ids.assign(ev.ids + size_t(t) * k, ev.ids + size_t(t + 1) * k);
      r.weights.assign(ev.weights + size_t(t) * k, ev.weights + size_t(t + 1) * k);
      log_.append(r);
    }
    if (ev.layer + 1 == model_.config().n_moe_layers()) log_.flush();  // whole steps on disk
  }

  Model& model_;
  std::mutex mu_;
  RoutingLogWriter log_;
  std::map<int, Open> open_;  // by model sequence (-1: forward()'s)
};

int run(Args& a, const OptionCli& cli) {
  // SIGINT/SIGTERM are taken by one thread (sigwait) so the shutdown runs outside a handler;
  // blocked before any thread starts (the engine's pools inherit the mask).
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up must not kill the server
  const fs::path dir = a.model;
  require_model_location(dir);
  cli.check_rules();
  if (a.reply_format != "auto" && !reply_format_named(a.reply_format))
    throw ConfigError("--reply-format: unknown '" + a.reply_format +
                      "' (expected auto, plain, hermes, glm45, harmony, kimi_k2 or deepseek_v31)");
  const ModelConfig cfg = ModelConfig::load(dir);
  // A model without a tokenizer (synth_model's) is still served: token-id prompts in, ids out.
  std::optional<Tokenizer> tok;
  std::optional<ChatPrompt> chat;
  tok = load_model_tokenizer(dir, cfg);
  if (!tok) {
    std::fprintf(stderr, "moestream-server: %s/model.json has no tokenizer: /v1/completions takes prompts as token-id "
                 "lists and answers choices[].token_ids; text prompts and chat answer 400\n", dir.c_str());
  } else {
    chat = load_model_chat_prompt(dir, cfg, *tok);
  }
  if (tok && (!chat || !chat->has_template()))
    std::fprintf(stderr, "moestream-server: the model has no chat template: /v1/chat/completions answers 400\n");

  ModelOptions mo = engine_model_options(a.engine);
  mo.max_batch = ModelOptions{}.max_batch;  // the server has no --batch: 64-token steps, with --gpu too
  // The GPU's batches (runtime/gpu/gpu_forward_batch.cpp) have standard attention only.
  if (a.server.parallel > 1 && mo.gpu && cfg.has_mla())
    throw ConfigError("--parallel " + std::to_string(a.server.parallel) + " with --gpu: " +
                      std::string(arch_name(cfg.arch)) +
                      "'s multi-head latent attention (MLA) batches sequences on the CPU path only; "
                      "drop --gpu or --parallel");
  mo.max_sequences = std::max(mo.max_sequences, a.server.parallel);
  // The log (cheap) before the weights (slow): a bad log is reported at once.
  std::shared_ptr<const RoutingReplay> replay;
  if (!a.engine.replay_routing.empty()) {
    replay = std::make_shared<const RoutingReplay>(RoutingReplay::load(a.engine.replay_routing, cfg));
    std::fprintf(stderr, "moestream-server: routing: %s; request i replays log request i mod %zu (or its "
                 "replay_request); prefix reuse off\n", replay->describe().c_str(), replay->n_requests());
  }
  if (a.server.parallel > mo.max_batch)
    throw ConfigError("--parallel " + std::to_string(a.server.parallel) + " exceeds the " +
                      std::to_string(mo.max_batch) + " tokens of one step");
  const MappingOwnerScope owner(new_mapping_owner());  // the store's and the model's mappings
  auto model = Model::load(dir, mo, open_engine_store(a.engine, mo, dir, cfg, "moestream-server"));

  ServerOptions opts = a.server;
  if (a.reply_format != "auto") opts.reply_format = reply_format_named(a.reply_format);
  if (chat && chat->has_template())
    std::fprintf(stderr, "moestream-server: chat replies parsed as %s (tool calls, reasoning)\n",
                 std::string(reply_format_name(opts.reply_format.value_or(chat->reply_format()))).c_str());
  if (opts.model_id.empty()) opts.model_id = fs::absolute(dir).lexically_normal().filename().string();
  if (opts.model_id.empty()) opts.model_id = "moestream";
  opts.max_body_bytes = size_t(kib_to_bytes(a.max_body_kb, "--max-body-kb"));

  opts.replay = replay;
  std::optional<ServerRoutingLog> routing;
  if (!a.engine.collect_routing.empty()) {
    routing.emplace(a.engine.collect_routing, dir, *model);
    opts.on_request_start = [&routing](int sequence, int prompt_tokens) { return routing->start(sequence, prompt_tokens); };
  }


  ApiServer server(opts, *model, tok ? &*tok : nullptr, std::move(chat));
  const int port = server.bind();
  std::printf("moestream-server: listening on http://%s:%d (model %s, context %d, queue %zu, parallel %d)\n",
              opts.host.c_str(), port, opts.model_id.c_str(), model->max_context(), opts.queue_size,
              opts.parallel);
  std::fflush(stdout);
  std::atomic<bool> done{false};
  std::thread signals([&] {
    const timespec tick{0, 200'000'000};
    while (!done) {
      const int sig = sigtimedwait(&sigs, nullptr, &tick);
      if (sig == SIGINT || sig == SIGTERM) {
        std::fprintf(stderr, "moestream-server: signal %d: finishing the running request, then exiting\n", sig);
        server.stop();
        return;
      }
    }
  });
  try {
    server.serve();  // throws when its HTTP threads cannot start
  } catch (...) {
    done = true;
    signals.join();  // a joinable std::thread destroyed would terminate the process
    throw;
  }
  done = true;
  signals.join();
  server.stop();
  if (routing) routing->close();  // throws IoError when the log cannot be written whole
  std::fprintf(stderr, "moestream-server: stopped\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moestream-server: an OpenAI-compatible HTTP server over a packed MoE model"};
  Args a;
  OptionCli cli(kToolServer);
  cli.bind("model", a.model);
  cli.bind("host", a.server.host);
  cli.bind("port", a.server.port);
  cli.bind("api_key", a.server.api_key);
  cli.bind("model_id", a.server.model_id);
  cli.bind("queue_size", a.server.queue_size);
  cli.bind("parallel", a.server.parallel);
  cli.bind("http_threads", a.server.http_threads);
  cli.bind("max_waiting_connections", a.server.max_waiting_connections);
  cli.bind("max_body_kb", a.max_body_kb);
  cli.bind("default_max_tokens", a.server.default_max_tokens);
  cli.bind("prefix_reuse", a.server.prefix_reuse);
  cli.bind("reply_format", a.reply_format);
  cli.bind("cors_origin", a.server.cors_origins);
  cli.bind("test_forced_output", a.server.allow_forced_output);
  cli.add_to(app, a.engine);  // as infer's; residency persists across requests
  TranslatedArgs args("moestream-server", app, argc, argv, kToolServer);  // llama-server's spellings
  if (!args.ok()) return 1;
  return run_tool("moestream-server", app, args.argc(), args.argv(), [&] {
    if (cli.markdown_asked()) return std::fputs(cli.markdown().c_str(), stdout) < 0 ? 1 : 0;
    if (a.model.empty()) throw ConfigError("--model is required");
    return run(a, cli);
  }, [](std::string_view text) { return render_options(text, OptionCaller::kCli); });
}
