// Implementation of common/option_ref.h.
#include "common/option_ref.h"

namespace moestream {

namespace {
bool name_char(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; }
}  // namespace

std::string option_ref(std::string_view name) { return "`" + std::string(name) + "`"; }

std::string option_ref(std::string_view name, std::string_view value) {
  return "`" + std::string(name) + "=" + std::string(value) + "`";
}

std::string render_option_refs(std::string_view text, const OptionSpeller& spell) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const size_t open = text.find('`', i);
    if (open == std::string_view::npos) break;
    const size_t close = text.find('`', open + 1);
    if (close == std::string_view::npos) break;
    const std::string_view mark = text.substr(open + 1, close - open - 1);
    const size_t eq = mark.find('=');
    const std::string_view name = mark.substr(0, eq);
    bool is_name = !name.empty() && name[0] >= 'a' && name[0] <= 'z';
    for (char c : name) is_name = is_name && name_char(c);
    std::optional<std::string> spelled;
    if (is_name)
      spelled = spell(name, eq == std::string_view::npos ? std::nullopt
                                                         : std::optional<std::string_view>(mark.substr(eq + 1)));
    out.append(text.substr(i, open - i));
    if (spelled) {
      out += *spelled;
      i = close + 1;
    } else {  // not a mark: the backquote stays and the scan goes on after it
      out += '`';
      i = open + 1;
    }
  }
  out.append(text.substr(i));
  return out;
}

std::string option_flag_by_rule(std::string_view name, std::optional<std::string_view> v) {
  std::string flag(name);
  for (char& c : flag)
    if (c == '_') c = '-';
  if (v && *v == "true") return cli_flag(flag);
  if (v && *v == "false") return cli_flag("no-" + flag);
  return cli_flag(flag) + (v ? " " + std::string(*v) : std::string());
}

std::string cli_flag(std::string_view name) {
  return (name.size() == 1 ? "-" : "--") + std::string(name);
}

std::string render_option_refs_as_flags(std::string_view text) {
  return render_option_refs(text, [](std::string_view name, std::optional<std::string_view> v) {
    return std::optional<std::string>(option_flag_by_rule(name, v));
  });
}

}  // namespace moestream
