// How much memory this process may still fill, page cache included: what decides whether a
// model's files can stay in the page cache or must be streamed (loader/store/store_options.h,
// StoreConfig::auto_direct).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace moestream {

struct MemoryRoom {
  uint64_t bytes = 0;  // what is left to fill
  std::string source;  // what bounds it, for messages: "MemAvailable" or "cgroup v1 /x (limit 1263 MiB)"
};

// The smallest of /proc/meminfo's MemAvailable and, for every memory cgroup from this process's
// up to the hierarchy's root that sets a limit (cgroup v2 memory.max, or v1 memory.limit_in_bytes),
// that limit less what the cgroup holds beyond reclaimable page cache (v2 memory.current less
// memory.stat's file; v1 usage_in_bytes less total_cache). `root` prefixes every path ("/" on a
// live system; tests give a fake tree). nullopt when none of these can be read.
std::optional<MemoryRoom> memory_room(const std::filesystem::path& root = "/");

// Whether `path` lies on a filesystem whose files are memory (tmpfs, ramfs): their pages count
// against no MemAvailable and cannot be evicted, so computing from them in place costs no I/O and
// no further memory, and streaming them would copy memory into memory. false when statfs fails.
bool on_memory_filesystem(const std::filesystem::path& path);

// The parsing parts (tests): MemAvailable in bytes from /proc/meminfo's text; a key's value from
// a memory.stat text; the cgroup path of this process from /proc/self/cgroup's text (v2: the
// "0::" line; v1: the line whose controllers include "memory").
std::optional<uint64_t> meminfo_available(std::string_view meminfo);
std::optional<uint64_t> memory_stat_value(std::string_view stat, std::string_view key);
std::optional<std::string> cgroup_of(std::string_view proc_self_cgroup, bool v2);

}  // namespace moestream
