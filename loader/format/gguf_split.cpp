// GgufModelFiles (loader/format/gguf_file.h): a single GGUF or a split set found from any of its
// shards, with the split.* metadata of every shard checked against the file names and each other.
#include <cstdio>
#include <regex>

#include "common/error.h"
#include "loader/format/gguf_file.h"

namespace moestream {

std::optional<GgufSplitName> parse_gguf_split_name(const std::filesystem::path& p) {
  static const std::regex kPattern("^(.*)-([0-9]{5})-of-([0-9]{5})\\.gguf$");
  const std::string name = p.filename().string();
  std::smatch m;
  if (!std::regex_match(name, m, kPattern)) return std::nullopt;
  GgufSplitName s;
  s.index = static_cast<uint32_t>(std::stoul(m[2].str()));
  s.count = static_cast<uint32_t>(std::stoul(m[3].str()));
  if (s.count == 0 || s.index == 0 || s.index > s.count) return std::nullopt;
  s.prefix = p.parent_path() / m[1].str();
  return s;
}

std::filesystem::path gguf_split_path(const std::filesystem::path& prefix, uint32_t index, uint32_t count) {
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, "-%05u-of-%05u.gguf", index, count);
  return prefix.string() + suffix;
}

GgufModelFiles::GgufModelFiles(const std::filesystem::path& any_file) {
  const auto split = parse_gguf_split_name(any_file);
  if (!split) {
    name_ = any_file.string();
    paths_.push_back(any_file);
    files_.emplace_back(any_file);
    const auto count = files_[0].metadata().find_u32("split.count");
    if (count && *count > 1)
      throw FormatError(name_ + ": metadata key 'split.count': the file is one shard of a set of " +
                        std::to_string(*count) + ", but its name does not follow NAME-0000K-of-0000N.gguf");
  } else {
    const uint32_t n = split->count;
    name_ = "split set " + gguf_split_path(split->prefix, 1, n).string();
    for (uint32_t k = 1; k <= n; ++k) {
      paths_.push_back(gguf_split_path(split->prefix, k, n));
      std::error_code ec;
      if (!std::filesystem::exists(paths_.back(), ec))
        throw FormatError(name_ + ": shard " + std::to_string(k) + " of " + std::to_string(n) + " (" +
                          paths_.back().string() + ") is missing");
    }
    for (const auto& p : paths_) files_.emplace_back(p);
    // split.no is 0-based; split.count and split.tensors.count are the set's, the same in every
    // shard. A set of one may omit them (a plain file with a split-style name).
    const uint64_t total = [&] {
      uint64_t t = 0;
      for (const auto& f : files_) t += f.tensors().size();
      return t;
    }();
    for (uint32_t i = 0; i < n; ++i) {
      const GgufMetadata& md = files_[i].metadata();
      const std::string where = paths_[i].string() + ": ";
      const auto no = md.find_u32("split.no");
      const auto count = md.find_u32("split.count");
      const auto tensors = md.find_u64("split.tensors.count");
      if (n == 1 && !no && !count && !tensors) continue;
      if (!no || !count || !tensors)
        throw FormatError(where + "missing split metadata (split.no, split.count, split.tensors.count): not a shard of " +
                          name_);
      if (*count != n)
        throw FormatError(where + "metadata key 'split.count' is " + std::to_string(*count) + " but the name says " +
                          std::to_string(n) + " shards (a shard of another set?)");
      if (*no != i)
        throw FormatError(where + "metadata key 'split.no' is " + std::to_string(*no) + ", expected " + std::to_string(i) +
                          " (0-based) for shard " + std::to_string(i + 1) + " of " + std::to_string(n) +
                          " (a shard of another set?)");
      if (*tensors != total)
        throw FormatError(where + "metadata key 'split.tensors.count' is " + std::to_string(*tensors) + " but the " +
                          std::to_string(n) + " shards hold " + std::to_string(total) +
                          " tensors (a shard of another set, or one missing?)");
    }
  }
  for (uint32_t s = 0; s < files_.size(); ++s) {
    for (const GgufTensor& t : files_[s].tensors()) {
      auto [it, fresh] = index_.emplace(t.name, tensors_.size());
      if (!fresh)
        throw FormatError(name_ + ": tensor '" + t.name + "' is in shard " + std::to_string(tensors_[it->second].shard + 1) +
                          " (" + paths_[tensors_[it->second].shard].string() + ") and in shard " + std::to_string(s + 1) +
                          " (" + paths_[s].string() + ")");
      tensors_.push_back(t);
      tensors_.back().shard = s;
    }
  }
}

const GgufTensor* GgufModelFiles::find_tensor(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufModelFiles::tensor(std::string_view name) const {
  const GgufTensor* t = find_tensor(name);
  if (!t) throw FormatError(name_ + ": no tensor '" + std::string(name) + "'");
  return *t;
}

}  // namespace moestream
