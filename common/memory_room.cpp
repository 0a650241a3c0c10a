// Implementation of common/memory_room.h.
#include "common/memory_room.h"

#include <linux/magic.h>
#include <sys/vfs.h>

#include <algorithm>
#include <charconv>

#include "common/error.h"
#include "common/file_util.h"

namespace moestream {

namespace fs = std::filesystem;

namespace {

// The whole of a small kernel file, or nullopt (absent, unreadable): a missing file only means
// that hierarchy or limit is not there.
std::optional<std::string> slurp(const fs::path& p) {
  try {
    return read_file(p, uint64_t(1) << 20);
  } catch (const IoError&) {
    return std::nullopt;
  }
}

std::optional<uint64_t> parse_u64(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

std::optional<uint64_t> read_u64(const fs::path& p) {
  const auto s = slurp(p);
  return s ? parse_u64(*s) : std::nullopt;
}

// The value after `key` at the start of a line of "key value" lines (memory.stat, meminfo).
std::optional<std::string_view> field(std::string_view text, std::string_view key) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string_view line = text.substr(pos, eol - pos);
    if (line.size() > key.size() && line.substr(0, key.size()) == key &&
        (line[key.size()] == ' ' || line[key.size()] == ':' || line[key.size()] == '\t')) {
      std::string_view v = line.substr(key.size() + 1);
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      return v;
    }
    pos = eol + 1;
  }
  return std::nullopt;
}

std::string mib(uint64_t b) { return std::to_string(b >> 20) + " MiB"; }

// One cgroup hierarchy: from `dir` (this process's cgroup) up to `base`, the tightest room of a
// cgroup that sets a limit. v2 reads memory.max/current and memory.stat's "file"; v1 reads
// memory.limit_in_bytes/usage_in_bytes and memory.stat's "total_cache".
std::optional<MemoryRoom> cgroup_room(const fs::path& base, const std::string& rel, bool v2) {
  std::optional<MemoryRoom> best;
  fs::path dir = base;
  for (const auto& part : fs::path(rel).relative_path()) dir /= part;
  for (;;) {
    std::optional<uint64_t> limit;
    if (v2) {
      const auto max = slurp(dir / "memory.max");
      if (max && max->rfind("max", 0) != 0) limit = parse_u64(*max);
    } else {
      limit = read_u64(dir / "memory.limit_in_bytes");
      if (limit && *limit >= (uint64_t(1) << 60)) limit.reset();  // "unlimited" is PAGE_COUNTER_MAX
    }
    if (limit) {
      const auto used = read_u64(dir / (v2 ? "memory.current" : "memory.usage_in_bytes"));
      const auto stat = slurp(dir / "memory.stat");
      // v1 without hierarchical accounting has "cache" only.
      std::optional<uint64_t> cache;
      if (stat) cache = memory_stat_value(*stat, v2 ? "file" : "total_cache");
      if (stat && !cache && !v2) cache = memory_stat_value(*stat, "cache");
      const uint64_t held = used ? *used - std::min(*used, cache.value_or(0)) : 0;
      const uint64_t room = *limit > held ? *limit - held : 0;
      if (!best || room < best->bytes) {
        std::string name(1, '/');  // appended, not `"/" + ...`: GCC 12 -Wrestrict false positive
        if (dir != base) name += fs::relative(dir, base).generic_string();
        best = MemoryRoom{room, std::string("cgroup ") + (v2 ? "v2 " : "v1 ") + name + " (" +
                                    (v2 ? "memory.max " : "memory.limit_in_bytes ") + mib(*limit) + ")"};
      }
    }
    if (dir.native().size() <= base.native().size()) break;  // base itself (or above it) done
    dir = dir.parent_path();
  }
  return best;
}

}  // namespace

std::optional<uint64_t> meminfo_available(std::string_view meminfo) {
  const auto v = field(meminfo, "MemAvailable");
  if (!v) return std::nullopt;
  std::string_view s = *v;
  const size_t kb = s.find(" kB");
  if (kb != std::string_view::npos) s = s.substr(0, kb);
  const auto n = parse_u64(s);
  if (!n || *n > (uint64_t(1) << 53)) return std::nullopt;
  return *n * 1024;
}

std::optional<uint64_t> memory_stat_value(std::string_view stat, std::string_view key) {
  const auto v = field(stat, key);
  return v ? parse_u64(*v) : std::nullopt;
}

std::optional<std::string> cgroup_of(std::string_view text, bool v2) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    const size_t c1 = line.find(':');
    const size_t c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    const std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1), path = line.substr(c2 + 1);
    if (path.empty() || path.front() != '/') continue;
    if (v2) {
      if (line.substr(0, c1) == "0" && controllers.empty()) return std::string(path);
      continue;
    }
    for (size_t a = 0; a <= controllers.size();) {
      size_t b = controllers.find(',', a);
      if (b == std::string_view::npos) b = controllers.size();
      if (controllers.substr(a, b - a) == "memory") return std::string(path);
      a = b + 1;
    }
  }
  return std::nullopt;
}

std::optional<MemoryRoom> memory_room(const fs::path& root) {
  std::optional<MemoryRoom> best;
  const auto keep = [&best](std::optional<MemoryRoom> r) {
    if (r && (!best || r->bytes < best->bytes)) best = std::move(r);
  };
  if (const auto meminfo = slurp(root / "proc/meminfo"))
    if (const auto avail = meminfo_available(*meminfo)) keep(MemoryRoom{*avail, "MemAvailable"});
  if (const auto self = slurp(root / "proc/self/cgroup")) {
    if (const auto rel = cgroup_of(*self, true)) keep(cgroup_room(root / "sys/fs/cgroup", *rel, true));
    if (const auto rel = cgroup_of(*self, false)) keep(cgroup_room(root / "sys/fs/cgroup/memory", *rel, false));
  }
  return best;
}

bool on_memory_filesystem(const fs::path& path) {
  struct statfs st {};
  if (::statfs(path.c_str(), &st) != 0) return false;
  return st.f_type == TMPFS_MAGIC || st.f_type == RAMFS_MAGIC;
}

}  // namespace moestream
