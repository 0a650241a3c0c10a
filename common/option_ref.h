// How library code names a user option in a message without spelling a front end's syntax:
// option_ref("io_qd") is "`io_qd`", option_ref("gpu", "true") "`gpu=true`". Each front end turns
// the marks into its own spelling (infer's flag, Python's keyword "io_qd", the server's JSON field)
// with render_option_refs and the option table (runtime/engine/options.h).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace moestream {

// "`name`" or "`name=value`"; name is an option's canonical snake_case name.
std::string option_ref(std::string_view name);
std::string option_ref(std::string_view name, std::string_view value);

// Returns `text` with every mark replaced by spell(name, value); a mark whose spell returns
// nullopt keeps its backquotes. value is nullopt for "`name`".
using OptionSpeller = std::function<std::optional<std::string>(std::string_view name,
                                                                std::optional<std::string_view> value)>;
std::string render_option_refs(std::string_view text, const OptionSpeller& spell);

// One mark as a flag by the plain rule: the name with dashes (`io_qd` -> io-qd) made a flag by
// cli_flag, then its value; `gpu=true` is the flag alone, `auto_direct=false` the flag of
// no-auto-direct. Also how front ends spell a mark of another tool's flag (convert_model's
// `force`), which no option table row holds.
std::string option_flag_by_rule(std::string_view name, std::optional<std::string_view> value);

// A CLI name as typed: one dash before a letter ("t"), two before a word ("io-qd"). The one
// place a flag's dashes are written; the option table's names carry none.
std::string cli_flag(std::string_view name);

// The marks as command-line flags by the plain rule, for tools without the option table:
// each mark through option_flag_by_rule. infer and the server spell them from the table
// (render_options).
std::string render_option_refs_as_flags(std::string_view text);

}  // namespace moestream
