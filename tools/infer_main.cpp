// `infer`: runs a packed model on the CPU: generates text from a prompt (streamed as it comes),
// or computes perplexity of a text file; optional timing and a JSON stats file.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/mapping_guard.h"
#include "common/file_util.h"
#include "common/progress.h"
#include "loader/format/routing_log.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/model.h"
#include "runtime/engine/routing_replay.h"
#include "runtime/engine/run_stats.h"
#include "runtime/model/sampler.h"
#include "runtime/tokenizer/model_tokenizer.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tools/engine_cli.h"
#include "tools/infer_chat.h"
#include "tools/llama_flags.h"
#include "tools/option_cli.h"
#include "tools/tool_main.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

std::vector<int> parse_ids(const std::string& s) {
  std::vector<int> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size())
      throw ConfigError("--prompt-ids: '" + item + "' is not an integer token id");
    ids.push_back(v);
  }
  if (ids.empty()) throw ConfigError("--prompt-ids: no ids given");
  return ids;
}

// --logit-bias ID:BIAS, repeated.
std::vector<LogitBias> parse_logit_bias(const std::vector<std::string>& items) {
  std::vector<LogitBias> out;
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    size_t used_id = 0, used_bias = 0;
    LogitBias b{-1, 0};
    try {
      b.id = std::stoi(item.substr(0, colon), &used_id);
      b.bias = std::stof(item.substr(colon + 1), &used_bias);
    } catch (const std::exception&) {
      used_id = 0;
    }
    if (colon == std::string::npos || used_id != colon || used_id == 0 || used_bias != item.size() - colon - 1)
      throw ConfigError("--logit-bias: '" + item + "' is not ID:BIAS (e.g. 42:-1.5, or 42:-100 to ban token 42)");
    out.push_back(b);
  }
  return out;
}

Tokenizer load_tokenizer(const fs::path& dir, const ModelConfig& cfg) {
  std::optional<Tokenizer> tok = load_model_tokenizer(dir, cfg);
  if (!tok)
    throw ConfigError(dir.string() + "/model.json: field tokenizer.file is null: the model ships "
                      "no tokenizer; use --prompt-ids and --print-ids");
  return std::move(*tok);
}

// infer's own options (the table's rows for infer that are not engine options); their initial
// values are the defaults.
struct Args {
  std::string model, prompt, prompt_file, prompt_ids, stats_json, perplexity_file, system_prompt;
  int n_predict = GenerateOptions{}.n_new, stride = 0;
  EngineSettings engine;  // threads, ctx, batch, the store, cache-aware, GPU, sampling, routing logs
  std::vector<std::string> logit_bias;  // ID:BIAS
  bool timing = false, print_ids = false, ignore_eos = false, conversation = false;
  int parallel = 1;  // perplexity windows at once
};

// The prompt text: -p's, -p - reads stdin, -f a file; "" when none is given.
std::string read_prompt(const Args& a) {
  if (!a.prompt.empty() && !a.prompt_file.empty()) throw ConfigError("give -p or -f (--file), not both");
  if (!a.prompt_file.empty()) {
    std::string text = read_file(a.prompt_file);
    if (text.empty()) throw ConfigError("-f " + a.prompt_file + ": the file is empty");
    return text;
  }
  if (a.prompt != "-" || a.conversation) return a.prompt;
  std::string text;
  char buf[65536];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, stdin)) > 0) text.append(buf, n);
  if (std::ferror(stdin)) throw IoError(std::string("-p -: reading stdin: ") + std::strerror(errno));
  if (text.empty()) throw ConfigError("-p -: stdin is empty: no prompt");
  return text;
}

// Appends every layer's routing to a routing log; each prompt or perplexity window (a forward
// from an empty cache) is a new request.
void attach_routing_log(Model& model, RoutingLogWriter& log, bool inputs) {
  uint64_t request = 0;
  model.set_routing_callback([&log, inputs, request](const RoutingEvent& ev) mutable {
    if (ev.layer == 0 && ev.prefill && ev.position == 0) request = log.take_request_id();
    RoutingRecord r;
    r.request_id = request;
    r.phase = ev.prefill ? RoutingPhase::kPrefill : RoutingPhase::kDecode;
    r.layer = static_cast<uint16_t>(ev.layer);
    for (int t = 0; t < ev.n_tokens; ++t) {
      r.position = static_cast<uint32_t>(ev.position + t);
      const size_t k = size_t(ev.top_k);
      r.ids.assign(ev.ids + t * k, ev.ids + (t + 1) * k);
      r.weights.assign(ev.weights + t * k, ev.weights + (t + 1) * k);
      if (inputs) r.router_input.assign(ev.router_inputs + size_t(t) * size_t(ev.hidden),
                                        ev.router_inputs + size_t(t + 1) * size_t(ev.hidden));
      log.append(r);
    }
  });
}

int run(const Args& a, const OptionCli& cli) {
  const fs::path dir = a.model;
  require_model_location(dir);
  cli.check_rules();  // the table's cross-option rules, before any slow work
  ModelOptions mo = engine_model_options(a.engine);
  if (a.parallel > 1) {  // perplexity over a batch of windows
    mo.max_sequences = std::max(mo.max_sequences, a.parallel);
    mo.max_batch = std::max(mo.max_batch, a.parallel);
  }
  const bool want_ppl = !a.perplexity_file.empty();
  const std::string prompt_text = read_prompt(a);
  const bool want_chat = a.conversation;
  const bool want_gen = !want_chat && (!prompt_text.empty() || !a.prompt_ids.empty());
  if (!want_gen && !want_ppl && !want_chat)
    throw ConfigError("nothing to do: give -p, -f, --prompt-ids, --perplexity or -cnv (--conversation)");
  if (want_chat && (want_ppl || !a.prompt_ids.empty() || a.print_ids))
    throw ConfigError("--conversation chats in text: it takes no --perplexity, --prompt-ids or --print-ids");
  if (want_chat && a.prompt == "-")
    throw ConfigError("--conversation reads its turns from stdin: -p - cannot read a prompt from it too");
  if (!a.system_prompt.empty() && !want_chat)
    throw ConfigError("--system-prompt (-sys) is for --conversation (-cnv)");
  SamplerParams sp = a.engine.sampling;
  sp.logit_bias = parse_logit_bias(a.logit_bias);
  Sampler sampler(sp);  // validates the sampling options (NaN included) before the (slow) model load

  std::vector<int> prompt;
  if (!a.prompt_ids.empty()) prompt = parse_ids(a.prompt_ids);
  // The tokenizer (cheap) before the weights (slow): a missing one is reported at once.
  const ModelConfig header_cfg = ModelConfig::load(dir);
  std::optional<Tokenizer> tok;
  const bool need_tok = !prompt_text.empty() || want_ppl || want_chat || (want_gen && !a.print_ids);
  if (need_tok) tok.emplace(load_tokenizer(dir, header_cfg));

  // The log (cheap) before the weights (slow): a bad log is reported at once.
  std::optional<RoutingReplay> replay;
  if (!a.engine.replay_routing.empty()) {
    replay.emplace(RoutingReplay::load(a.engine.replay_routing, header_cfg));
    std::fprintf(stderr, "infer: routing: %s\n", replay->describe().c_str());
  }
  const MappingOwnerScope owner(new_mapping_owner());  // the store's and the model's mappings
  auto model = Model::load(dir, mo, open_engine_store(a.engine, mo, dir, header_cfg, "infer"));
  const ModelConfig& cfg = model->config();
  if (replay) {
    model->set_routing_override([&replay](int layer, uint64_t ordinal, int n, int* ids, float* w) {
      replay->route(layer, ordinal, n, ids, w);
    });
    // Stdout says it too: generated ids of a replay are not the model's own choice of experts.
    std::printf("# replay: %s\n", replay->describe().c_str());
  }
  std::optional<RoutingLogWriter> routing;
  if (!a.engine.collect_routing.empty()) {
    RoutingLogHeader rh{model_identity_hash(dir), uint32_t(cfg.n_moe_layers()), uint32_t(cfg.n_experts),
                        uint32_t(cfg.n_experts_per_tok), uint32_t(cfg.hidden_size)};
    routing.emplace(a.engine.collect_routing, rh);
    if (!routing->warning().empty()) std::fprintf(stderr, "infer: warning: %s\n", routing->warning().c_str());
    attach_routing_log(*model, *routing, a.engine.collect_router_inputs);
  }
  RunInfo info{dir.string(), std::string(arch_name(cfg.arch)), std::string(quant_name(cfg.expert_quant)),
               model->n_threads(), model->max_context(), model->expert_store().describe(), "", ""};
  if (replay) info.routing = replay->describe();
  if (const GpuForwardInfo* g = model->gpu_info()) {
    info.gpu = render_options(g->describe(), OptionCaller::kCli);
    std::fprintf(stderr, "infer: gpu: %s\n", info.gpu.c_str());
  }
  std::optional<GenerateStats> gen;
  std::optional<PerplexityResult> ppl;

  if (want_gen) {
    if (!prompt_text.empty())
      for (int32_t id : tok->encode(prompt_text, true)) prompt.push_back(id);
    GenerateOptions go;
    go.n_new = a.n_predict;
    if (!a.ignore_eos) {
      if (cfg.eos_token_id) go.stop_token = *cfg.eos_token_id;
      else if (tok && tok->eos_id()) go.stop_token = *tok->eos_id();
    }
    std::vector<int> out_ids;
    std::optional<StreamDecoder> stream;
    if (!a.print_ids) {
      stream.emplace(*tok);
      std::fputs(prompt_text.c_str(), stdout);
      std::fflush(stdout);
    }
    gen = generate(*model, prompt, go, sampler, [&](int id) {
      if (!stream) return;
      std::string piece = stream->push(id);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }, &out_ids);
    if (stream) {
      std::string rest = stream->flush();
      std::fwrite(rest.data(), 1, rest.size(), stdout);
      std::fputc('\n', stdout);
    } else {
      for (size_t i = 0; i < out_ids.size(); ++i) std::printf(i ? ",%d" : "%d", out_ids[i]);
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  if (want_chat) {
    const std::optional<ChatPrompt> chat = load_model_chat_prompt(dir, header_cfg, *tok);
    if (!chat) throw ConfigError(dir.string() + ": the model has no chat template: --conversation needs one");
    ChatSettings cs;
    cs.system_prompt = a.system_prompt;
    cs.first_message = prompt_text;
    cs.max_tokens = a.n_predict;
    cs.sampling = sp;
    if (!a.ignore_eos) cs.end_tokens = end_of_turn_ids(cfg.eos_token_id, &*tok);
    cs.timing = a.timing;
    gen = run_chat(*model, *tok, *chat, cs, stdin);
  }
  if (want_ppl) {
    const std::string text = read_file(a.perplexity_file);
    std::vector<int> ids;
    for (int32_t id : tok->encode(text, true)) ids.push_back(id);
    const int ctx = a.engine.model.max_context > 0 ? a.engine.model.max_context : std::min(model->max_context(), 512);
    if (a.parallel > 1 && a.stride > 0 && a.stride != ctx)
      throw ConfigError("--parallel " + std::to_string(a.parallel) + " scores disjoint windows: give no --stride, "
                        "or --stride equal to the context (" + std::to_string(ctx) + ")");
    const int stride = a.parallel > 1 ? ctx : a.stride > 0 ? a.stride : std::max(1, ctx / 2);
    // A bar on a terminal; into a pipe a line every few seconds, and nothing for a short run.
    Progress progress("perplexity", true, stderr, {.brief = true});
    const auto report = [&](size_t done, size_t total) {
      progress.update(done, total, std::to_string(done) + "/" + std::to_string(total) + " tokens");
    };
    ppl = a.parallel > 1 ? perplexity_batched(*model, ids, ctx, a.parallel, report)
                         : perplexity(*model, ids, ctx, stride, report);
    std::printf("perplexity %.4f over %zu tokens of %s (ctx %d, stride %d)\n", ppl->perplexity,
                ppl->n_scored, a.perplexity_file.c_str(), ctx, stride);
  }
  if (routing) {
    model->set_routing_callback({});
    routing->close();
  }
  if (a.timing) std::fputs(run_stats_text(info, gen, ppl).c_str(), stderr);
  if (!a.stats_json.empty()) write_file_atomic(a.stats_json, run_stats_json(info, gen, ppl).dump(2) + "\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moestream infer: run a packed Mixture-of-Experts model on the CPU (or the GPU: --gpu)"};
  Args a;
  OptionCli cli(kToolInfer);
  cli.bind("model", a.model);
  cli.bind("prompt", a.prompt);
  cli.bind("prompt_file", a.prompt_file);
  cli.bind("prompt_ids", a.prompt_ids);
  cli.bind("conversation", a.conversation);
  cli.bind("system_prompt", a.system_prompt);
  cli.bind("max_tokens", a.n_predict);
  cli.bind("print_ids", a.print_ids);
  cli.bind("ignore_eos", a.ignore_eos);
  cli.bind("perplexity", a.perplexity_file);
  cli.bind("stride", a.stride);
  cli.bind("parallel", a.parallel);
  cli.bind("logit_bias", a.logit_bias);
  cli.bind("timing", a.timing);
  cli.bind("stats_json", a.stats_json);
  cli.add_to(app, a.engine);
  TranslatedArgs args("infer", app, argc, argv, kToolInfer);  // llama-cli's spellings
  if (!args.ok()) return 1;
  return run_tool("infer", app, args.argc(), args.argv(), [&] {
    if (cli.markdown_asked()) return std::fputs(cli.markdown().c_str(), stdout) < 0 ? 1 : 0;
    if (a.model.empty()) throw ConfigError("--model is required");
    return run(a, cli);
  }, [](std::string_view text) { return render_options(text, OptionCaller::kCli); });
}
