// Implementation of tools/infer_chat.h.
#include "tools/infer_chat.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>

#include "common/error.h"

namespace moestream {

namespace {

std::atomic<bool> g_replying{false};
std::atomic<bool> g_stop_reply{false};

void on_sigint(int) {
  // During a reply: stop it. At the prompt the blocked read returns EINTR (no SA_RESTART) and
  // the chat ends.
  if (g_replying.load()) g_stop_reply.store(true);
}

// Installs on_sigint for the chat's lifetime, the previous handler back after.
class SigintScope {
 public:
  SigintScope() {
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: a read at the prompt is interrupted
    sigaction(SIGINT, &sa, &old_);
  }
  ~SigintScope() { sigaction(SIGINT, &old_, nullptr); }
  SigintScope(const SigintScope&) = delete;
  SigintScope& operator=(const SigintScope&) = delete;

 private:
  struct sigaction old_ {};
};

// One line of `in` without its newline; nullopt at the end of input or on Ctrl-C.
std::optional<std::string> read_line(std::FILE* in) {
  char* buf = nullptr;
  size_t cap = 0;
  const ssize_t n = getline(&buf, &cap, in);
  std::optional<std::string> line;
  if (n >= 0) {
    line.emplace(buf, size_t(n));
    while (!line->empty() && (line->back() == '\n' || line->back() == '\r')) line->pop_back();
  }
  std::free(buf);
  return line;
}

}  // namespace

std::optional<GenerateStats> run_chat(Model& model, const Tokenizer& tok, const ChatPrompt& chat,
                                      const ChatSettings& s, std::FILE* in) {
  if (!chat.has_template())
    throw ConfigError("the model has no chat template (tokenizer_config.json's chat_template or the GGUF's "
                      "tokenizer.chat_template): conversation mode needs one; use a plain prompt without it");
  const SigintScope sigint;
  const bool interactive = isatty(fileno(in));
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!s.system_prompt.empty()) messages.push_back({{"role", "system"}, {"content", s.system_prompt}});
  std::vector<int> cached;  // the tokens in the KV cache
  model.reset();
  std::optional<GenerateStats> last;
  std::optional<std::string> pending;
  if (!s.first_message.empty()) pending = s.first_message;
  for (int turn = 1;; ++turn) {
    std::optional<std::string> line = pending;
    pending.reset();
    if (!line) {
      if (interactive) std::fputs("> ", stderr);
      std::fflush(stderr);
      line = read_line(in);
      if (!line) break;  // end of input, or Ctrl-C at the prompt
      if (line->empty()) {
        --turn;
        continue;
      }
    }
    messages.push_back({{"role", "user"}, {"content", *line}});
    const std::string text = chat.render(messages, true);
    std::vector<int> prompt;
    for (int32_t id : tok.encode(text, /*add_special_tokens=*/false)) prompt.push_back(id);
    Sampler sampler(s.sampling);
    GenerateOptions go;
    go.n_new = s.max_tokens;
    go.end_tokens = s.end_tokens;
    go.interrupted = [] { return g_stop_reply.load(); };
    StreamDecoder stream(tok, /*skip_special_tokens=*/true);
    std::vector<int> reply_ids;
    g_stop_reply.store(false);
    g_replying.store(true);
    try {
      last = generate_continued(model, prompt, cached, go, sampler, [&](int id) {
        const std::string piece = stream.push(id);
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      }, &reply_ids);
    } catch (...) {
      g_replying.store(false);
      throw;
    }
    g_replying.store(false);
    const std::string rest = stream.flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    const bool stopped = g_stop_reply.exchange(false);
    if (!reply_ids.empty() &&
        std::find(s.end_tokens.begin(), s.end_tokens.end(), reply_ids.back()) != s.end_tokens.end())
      reply_ids.pop_back();
    std::vector<int32_t> reply32(reply_ids.begin(), reply_ids.end());
    messages.push_back({{"role", "assistant"}, {"content", tok.decode(reply32, /*skip_special_tokens=*/true)}});
    if (s.timing || stopped) {
      const int run = last->prefill.tokens;
      std::fprintf(stderr, "chat: turn %d: prompt %zu tokens, %zu reused from the KV cache, %d run; reply %zu tokens%s\n",
                   turn, prompt.size(), prompt.size() - size_t(run), run, reply_ids.size(),
                   stopped ? " (stopped by Ctrl-C)" : "");
    }
  }
  if (interactive) std::fputc('\n', stderr);
  return last;
}

}  // namespace moestream
