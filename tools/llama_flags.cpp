// Implementation of tools/llama_flags.h.
#include "tools/llama_flags.h"

#include <cctype>
#include <cstdio>
#include <string_view>

#include "common/error.h"

namespace moestream {

namespace {

struct Renamed {
  std::string_view from, to;
  unsigned tools;
};

// Lookalikes with the same meaning here. -c, --ctx-size's -c and -f are the table's own names.
constexpr Renamed kRenamed[] = {
    {"-cnv", "--conversation", kToolInfer},
    {"-sys", "--system-prompt", kToolInfer},
    {"--ctx-size", "--ctx", kToolInfer | kToolServer},
};

struct Refused {
  std::string_view names;  // comma-separated spellings
  std::string_view hint;   // what to do instead ("" when nothing does it)
};

constexpr Refused kRefused[] = {
    {"-hf,-hfr,--hf-repo,-hff,--hf-file,-hft,--hf-token,-mu,--model-url",
     "downloading models by name is not supported yet: download the GGUF and pass its path with -m"},
    {"-ngl,--gpu-layers,--n-gpu-layers",
     "moestream has no per-layer offload: --gpu runs the whole model on the GPU and streams experts into its cache"},
    {"-ot,--override-tensor,-cmoe,--cpu-moe,-ncmoe,--n-cpu-moe",
     "moestream places experts itself: see --gpu-cache-mb and --host-cache-mb"},
    {"-fa,--flash-attn", "moestream's attention has no switch"},
    {"-sm,--split-mode,-ts,--tensor-split,-mg,--main-gpu,-dev,--device", "moestream runs on one GPU (--gpu)"},
    {"-ctk,--cache-type-k,-ctv,--cache-type-v", "the KV cache's type is fixed"},
    {"--mlock,--no-mmap,--numa", ""},
    {"-i,--interactive,-if,--interactive-first,-r,--reverse-prompt,--in-prefix,--in-suffix,-mli,--multiline-input",
     "for a conversation use -cnv (each line of stdin is a turn)"},
    {"-no-cnv,--no-conversation,-st,--single-turn", "without -cnv infer answers one prompt and exits"},
    {"--jinja,--chat-template,--chat-template-file", "the model's own chat template is always used"},
    {"-co,--color,-e,--escape,--no-escape,-sp,--special,--verbose-prompt,--no-display-prompt,-lv,--verbosity,-v,--verbose,"
     "--log-file,--log-disable",
     ""},
    {"-s,-b,--batch-size,-ub,--ubatch-size,-np,-cb,--cont-batching,-kvu",
     "see --help for moestream's names (--seed, --batch, --parallel)"},
};

bool in_list(std::string_view list, std::string_view name) {
  while (!list.empty()) {
    const size_t comma = list.find(',');
    if (list.substr(0, comma) == name) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

bool is_number(std::string_view a) {
  size_t i = a[0] == '-' ? 1 : 0;
  if (i == a.size()) return false;
  for (; i < a.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(a[i])) && a[i] != '.' && a[i] != 'e' && a[i] != 'E') return false;
  return true;
}

}  // namespace

// True when `name` (-x or --xyz) is an option of `app` that takes a value.
bool takes_value(const CLI::App& app, const std::string& name) {
  const CLI::Option* o = app.get_option_no_throw(name);
  return o != nullptr && o->get_expected_max() > 0;
}

std::vector<std::string> translate_llama_flags(const CLI::App& app, int argc, const char* const* argv,
                                               OptionTool tool) {
  std::vector<std::string> out;
  bool after_dashdash = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (after_dashdash || a.size() < 2 || a[0] != '-' || is_number(a)) {
      out.push_back(std::move(a));
      continue;
    }
    if (a == "--") after_dashdash = true;
    const std::string name = a.substr(0, a.find('='));
    bool renamed = false;
    for (const Renamed& r : kRenamed)
      if (name == r.from) {
        if (!(r.tools & tool))
          throw ConfigError(std::string(r.from) + " (llama-cli's) is infer's only: this tool has no " +
                            std::string(r.to));
        out.push_back(std::string(r.to) + a.substr(name.size()));
        renamed = true;
        if (name.size() == a.size() && takes_value(app, std::string(r.to)) && i + 1 < argc) out.push_back(argv[++i]);
      }
    if (renamed) continue;
    for (const Refused& r : kRefused)
      if (in_list(r.names, name))
        throw ConfigError(name + " (llama-cli's flag) is not supported" +
                          (r.hint.empty() ? std::string() : ": " + std::string(r.hint)));
    // CLI11 reads -xyz as -x -y -z, or -x with the value yz: refuse a word that is neither
    // a short option with its value attached (-n128, -pHello, -mmodel.gguf).
    if (a[1] != '-' && a.size() > 2 && !takes_value(app, a.substr(0, 2)))
      throw ConfigError(a + " is not a flag (short flags are one letter and " + a.substr(0, 2) +
                        " takes no value; see --help)");
    const bool value_next = name.size() == a.size() && takes_value(app, name);
    out.push_back(std::move(a));
    if (value_next && i + 1 < argc) out.push_back(argv[++i]);
  }
  return out;
}

TranslatedArgs::TranslatedArgs(const char* tool_name, const CLI::App& app, int argc, char** argv, OptionTool tool) {
  try {
    words_ = translate_llama_flags(app, argc, argv, tool);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool_name, e.what());
    return;
  }
  words_.insert(words_.begin(), argv[0]);
  for (std::string& w : words_) ptrs_.push_back(w.data());
  ok_ = true;
}

}  // namespace moestream
