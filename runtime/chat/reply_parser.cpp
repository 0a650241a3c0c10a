// Implementation of runtime/chat/reply_parser.h for the families whose markup is <think> plus a
// tool-call region (Hermes, GLM-4.5, Kimi K2, DeepSeek-V3.1); harmony is in harmony_reply.cpp.
#include "runtime/chat/reply_parser.h"

#include <cctype>
#include <functional>

#include "runtime/chat/reply_machine.h"

namespace moestream {

namespace reply {

size_t marker_prefix_tail(std::string_view buf, std::initializer_list<std::string_view> markers) {
  size_t hold = 0;
  for (std::string_view m : markers)
    for (size_t n = std::min(m.size() - 1, buf.size()); n > hold; --n)
      if (buf.substr(buf.size() - n) == m.substr(0, n)) {
        hold = n;
        break;
      }
  return hold;
}

Found find_first(std::string_view buf, std::initializer_list<std::string_view> markers) {
  Found f;
  int i = 0;
  for (std::string_view m : markers) {
    const size_t p = buf.find(m);
    if (p < f.pos) f = Found{p, i};
    ++i;
  }
  return f;
}

static bool space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string Trimmed::push(std::string_view s) {
  size_t i = 0;
  if (!started_) {
    while (i < s.size() && space(s[i])) ++i;
    if (i == s.size()) return "";
    started_ = true;
  }
  size_t end = s.size();
  while (end > i && space(s[end - 1])) --end;
  if (end == i) {
    ws_.append(s.substr(i));
    return "";
  }
  std::string out = ws_;
  out.append(s.substr(i, end - i));
  ws_.assign(s.substr(end));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

std::optional<std::string> json_object_text(std::string_view text) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace reply

namespace {
using OJ = nlohmann::ordered_json;
using reply::Found;
using reply::trim;
constexpr size_t npos = std::string_view::npos;

// A tool-call region's body -> its calls; false when it is not well formed (then its text is
// content). `next_id` names the calls of formats whose model gives no id.
using RegionParser = std::function<bool(std::string_view body, const ReplyParserOptions&,
                                        const std::function<std::string()>& next_id, std::vector<ToolCall>& out)>;

struct Markup {
  std::string_view calls_open, calls_close;
  RegionParser parse;
};

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";

// <tool_call>{"name": N, "arguments": {..}}</tool_call>, one call per region.
bool parse_hermes(std::string_view body, const ReplyParserOptions&, const std::function<std::string()>& next_id,
                  std::vector<ToolCall>& out) {
  const OJ j = OJ::parse(trim(body), nullptr, false);
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  std::string args = "{}";
  if (j.contains("arguments")) {
    const OJ& a = j["arguments"];
    if (a.is_object()) args = a.dump();
    else if (a.is_string()) {
      auto t = reply::json_object_text(a.get<std::string>());
      if (!t) return false;
      args = *t;
    } else {
      return false;
    }
  }
  out.push_back({next_id(), j["name"].get<std::string>(), args});
  return true;
}

// The declared JSON type of a tool's parameter ("" when the tools do not say).
std::string param_type(const OJ& tools, const std::string& fn, const std::string& key) {
  if (!tools.is_array()) return "";
  for (const OJ& t : tools) {
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
    const OJ& f = t["function"];
    if (f.value("name", OJ("")) != fn || !f.contains("parameters") || !f["parameters"].is_object()) continue;
    const OJ& props = f["parameters"].value("properties", OJ::object());
    if (!props.is_object() || !props.contains(key) || !props[key].is_object()) return "";
    const OJ& ty = props[key].value("type", OJ(""));
    return ty.is_string() ? ty.get<std::string>() : "";
  }
  return "";
}

// <tool_call>N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>..</tool_call>: a string value is
// written raw, any other as JSON (GLM-4.5's template), so the tool's schema decides.
bool parse_glm45(std::string_view body, const ReplyParserOptions& o, const std::function<std::string()>& next_id,
                 std::vector<ToolCall>& out) {
  const size_t first = body.find("<arg_key>");
  const std::string name(trim(body.substr(0, first)));
  if (name.empty() || name.find_first_of(" \n\t<>{}") != std::string::npos) return false;
  OJ args = OJ::object();
  std::string_view rest = first == npos ? std::string_view() : body.substr(first);
  while (!trim(rest).empty()) {
    rest = trim(rest);
    if (rest.substr(0, 9) != "<arg_key>") return false;
    const size_t ke = rest.find("</arg_key>");
    if (ke == npos) return false;
    const std::string key(trim(rest.substr(9, ke - 9)));
    rest = trim(rest.substr(ke + 10));
    if (rest.substr(0, 11) != "<arg_value>") return false;
    const size_t ve = rest.find("</arg_value>");
    if (ve == npos) return false;
    const std::string value(rest.substr(11, ve - 11));
    rest = rest.substr(ve + 12);
    const std::string type = param_type(o.tools, name, key);
    OJ v = type == "string" ? OJ(nullptr) : OJ::parse(value, nullptr, false);
    args[key] = v.is_discarded() || type == "string" ? OJ(value) : v;
  }
  out.push_back({next_id(), name, args.dump()});
  return true;
}

// Calls `begin NAME sep ARGS end` repeated, whitespace between; `name_of` turns the text between
// begin and sep into (id, name).
bool parse_sequence(std::string_view body, std::string_view begin, std::string_view sep, std::string_view end,
                    const std::function<bool(std::string_view, ToolCall&)>& name_of, std::vector<ToolCall>& out) {
  std::string_view rest = trim(body);
  std::vector<ToolCall> calls;
  while (!rest.empty()) {
    if (rest.substr(0, begin.size()) != begin) return false;
    rest.remove_prefix(begin.size());
    const size_t s = rest.find(sep), e = rest.find(end);
    if (s == npos || e == npos || e < s) return false;
    ToolCall c;
    if (!name_of(trim(rest.substr(0, s)), c)) return false;
    auto args = reply::json_object_text(trim(rest.substr(s + sep.size(), e - s - sep.size())));
    if (!args) return false;
    c.arguments = *args;
    calls.push_back(std::move(c));
    rest = trim(rest.substr(e + end.size()));
  }
  if (calls.empty()) return false;
  for (auto& c : calls) out.push_back(std::move(c));
  return true;
}

bool parse_kimi(std::string_view body, const ReplyParserOptions&, const std::function<std::string()>&,
                std::vector<ToolCall>& out) {
  // The id is functions.NAME:INDEX; the template renders it back as the call's id.
  return parse_sequence(body, "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                        [](std::string_view id, ToolCall& c) {
                          const size_t colon = id.rfind(':');
                          std::string_view name = id.substr(0, colon);
                          if (name.substr(0, 10) == "functions.") name.remove_prefix(10);
                          if (name.empty()) return false;
                          c.id = std::string(id);
                          c.name = std::string(name);
                          return true;
                        }, out);
}

bool parse_deepseek(std::string_view body, const ReplyParserOptions&, const std::function<std::string()>& next_id,
                    std::vector<ToolCall>& out) {
  return parse_sequence(body, "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
                        [&](std::string_view name, ToolCall& c) {
                          if (name.empty()) return false;
                          c.id = next_id();
                          c.name = std::string(name);
                          return true;
                        }, out);
}

Markup markup_of(ReplyFormat f) {
  switch (f) {
    case ReplyFormat::kHermes: return {"<tool_call>", "</tool_call>", parse_hermes};
    case ReplyFormat::kGlm45: return {"<tool_call>", "</tool_call>", parse_glm45};
    case ReplyFormat::kKimiK2: return {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", parse_kimi};
    case ReplyFormat::kDeepSeekV31: return {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", parse_deepseek};
    default: return {};
  }
}

// Content, <think> reasoning (recognised only before any content or call), and tool-call regions.
class MarkupMachine : public BufferedReplyMachine {
 public:
  MarkupMachine(Markup m, ReplyParserOptions o) : m_(m), o_(std::move(o)) {
    mode_ = o_.starts_in_reasoning ? Mode::kReasoning : Mode::kContent;
  }

  ReplyDelta finish() override {
    ReplyDelta d;
    if (mode_ == Mode::kRegion) {
      if (!parse_region(buf_, d)) d.content += seg_.push(std::string(m_.calls_open) + buf_);
    } else if (mode_ == Mode::kReasoning) {
      d.reasoning += seg_.push(buf_);
    } else {
      d.content += seg_.push(buf_);
    }
    buf_.clear();
    return d;
  }

 private:
  enum class Mode { kContent, kReasoning, kRegion };

  // One transition or one emission; true while there may be more to do in buf_.
  bool step(ReplyDelta& d) override {
    if (mode_ == Mode::kRegion) {
      const size_t e = buf_.find(m_.calls_close);
      if (e == npos) return false;
      const std::string body = buf_.substr(0, e);
      buf_.erase(0, e + m_.calls_close.size());
      mode_ = Mode::kContent;
      if (parse_region(body, d)) seg_.restart();
      else d.content += seg_.push(std::string(m_.calls_open) + body + std::string(m_.calls_close));
      return true;
    }
    if (mode_ == Mode::kReasoning)
      return emit_until({kThinkClose}, d.reasoning, [&](int) {
        content_seen_ = true;  // one reasoning block, at the start
        enter(Mode::kContent);
      });
    // <think> opens reasoning only as the reply's first text.
    if (!content_seen_) {
      const size_t first = buf_.find_first_not_of(" \n\t\r");
      if (first != npos && !kThinkOpen.starts_with(std::string_view(buf_).substr(first, kThinkOpen.size())))
        content_seen_ = true;
    }
    const bool think = !content_seen_, tools = o_.parse_tool_calls;
    // The markers looked for in content; an absent one is an empty view that never matches.
    const std::string_view open_think = think ? kThinkOpen : std::string_view(),
                           open_calls = tools ? m_.calls_open : std::string_view();
    return emit_until({open_think, open_calls}, d.content, [&](int which) {
      if (which == 0) enter(Mode::kReasoning);
      else mode_ = Mode::kRegion;  // the segment goes on if the region is not a call
    });
  }

  // Emits buf_ up to the first marker (then calls `then`), or all of it but a possible marker's
  // start. True when a marker was found.
  template <typename Then>
  bool emit_until(std::initializer_list<std::string_view> markers, std::string& out, Then then) {
    std::vector<std::string_view> live;
    Found f;
    int i = 0;
    for (std::string_view m : markers) {
      if (!m.empty()) {
        const size_t p = buf_.find(m);
        if (p < f.pos) f = Found{p, i};
        live.push_back(m);
      }
      ++i;
    }
    if (f.which >= 0) {
      const std::string_view marker = *(markers.begin() + f.which);
      push(out, std::string_view(buf_).substr(0, f.pos));
      buf_.erase(0, f.pos + marker.size());
      then(f.which);
      return true;
    }
    size_t hold = 0;
    for (std::string_view m : live) hold = std::max(hold, reply::marker_prefix_tail(buf_, {m}));
    push(out, std::string_view(buf_).substr(0, buf_.size() - hold));
    buf_.erase(0, buf_.size() - hold);
    return false;
  }

  void push(std::string& out, std::string_view s) {
    const std::string t = seg_.push(s);
    if (!t.empty() && mode_ == Mode::kContent) content_seen_ = true;
    out += t;
  }

  void enter(Mode m) {
    mode_ = m;
    seg_.restart();
  }

  bool parse_region(std::string_view body, ReplyDelta& d) {
    std::vector<ToolCall> calls;
    auto next_id = [this] { return o_.id_prefix + std::to_string(n_calls++); };
    const int before = n_calls;
    if (!m_.parse(body, o_, next_id, calls)) {
      n_calls = before;
      return false;
    }
    content_seen_ = true;  // no <think> after a call
    for (auto& c : calls) d.calls.push_back(std::move(c));
    if (n_calls == before) n_calls += int(calls.size());  // formats with the model's own ids
    return true;
  }

  Markup m_;
  ReplyParserOptions o_;
  Mode mode_;
  reply::Trimmed seg_;
  bool content_seen_ = false;
};

// Plain text: everything is content, as generated.
class PlainMachine : public ReplyParser::Machine {
 public:
  ReplyDelta feed(std::string_view text) override {
    ReplyDelta d;
    d.content = std::string(text);
    return d;
  }
  ReplyDelta finish() override { return {}; }
};

constexpr std::pair<ReplyFormat, std::string_view> kNames[] = {
    {ReplyFormat::kPlain, "plain"},         {ReplyFormat::kHermes, "hermes"},   {ReplyFormat::kGlm45, "glm45"},
    {ReplyFormat::kHarmony, "harmony"},     {ReplyFormat::kKimiK2, "kimi_k2"}, {ReplyFormat::kDeepSeekV31, "deepseek_v31"},
};
}  // namespace

void ReplyDelta::append(ReplyDelta d) {
  reasoning += d.reasoning;
  content += d.content;
  for (auto& c : d.calls) calls.push_back(std::move(c));
}

ReplyFormat detect_reply_format(std::string_view src) {
  if (src.find("<|channel|>") != npos) return ReplyFormat::kHarmony;
  if (src.find("<|tool_calls_section_begin|>") != npos) return ReplyFormat::kKimiK2;
  if (src.find("<｜tool▁calls▁begin｜>") != npos) return ReplyFormat::kDeepSeekV31;
  if (src.find("<arg_key>") != npos) return ReplyFormat::kGlm45;
  // Qwen3-Coder's <tool_call><function=N> is another format: not taken for Hermes.
  if (src.find("<tool_call>") != npos && src.find("<function=") == npos) return ReplyFormat::kHermes;
  return ReplyFormat::kPlain;
}

std::optional<ReplyFormat> reply_format_named(std::string_view name) {
  for (const auto& [f, n] : kNames)
    if (n == name) return f;
  return std::nullopt;
}

std::string_view reply_format_name(ReplyFormat f) {
  for (const auto& [g, n] : kNames)
    if (g == f) return n;
  return "?";
}

bool prompt_opens_reasoning(std::string_view prompt) {
  prompt = trim(prompt);
  return prompt.size() >= kThinkOpen.size() && prompt.substr(prompt.size() - kThinkOpen.size()) == kThinkOpen;
}

ReplyParser::ReplyParser(ReplyFormat format, ReplyParserOptions opts) {
  if (format == ReplyFormat::kPlain) m_ = std::make_unique<PlainMachine>();
  else if (format == ReplyFormat::kHarmony) m_ = reply::harmony_machine(opts);
  else m_ = std::make_unique<MarkupMachine>(markup_of(format), std::move(opts));
}
ReplyParser::~ReplyParser() = default;
ReplyParser::ReplyParser(ReplyParser&&) noexcept = default;
ReplyParser& ReplyParser::operator=(ReplyParser&&) noexcept = default;

ReplyDelta ReplyParser::feed(std::string_view text) { return m_->feed(text); }
ReplyDelta ReplyParser::finish() { return m_->finish(); }
int ReplyParser::n_calls() const { return m_->n_calls; }

}  // namespace moestream
