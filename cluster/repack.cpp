// Implementation of cluster/repack.h: stage a complete new experts/ directory, then swap it in
// atomically. Per-file renames cannot keep a .bin and its .map in step; one directory exchange can.
#include "cluster/repack.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/expert_file.h"

namespace moestream::cluster {
namespace fs = std::filesystem;

namespace {

class Fd {
 public:
  Fd(const fs::path& p, int flags, mode_t mode = 0644) : fd_(::open(p.c_str(), flags | O_CLOEXEC, mode)) {
    if (fd_ < 0) throw_errno("cannot open", p);
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

void pread_all(int fd, void* dst, size_t n, uint64_t off, const fs::path& p) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, static_cast<char*>(dst) + done, n - done, off_t(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw_errno("cannot read at offset " + std::to_string(off + done) + " of", p);
    if (r == 0)
      throw IoError(p.string() + ": truncated: read at offset " + std::to_string(off + done) +
                    " hit the end of the file");
    done += size_t(r);
  }
}

void write_all(int fd, const void* src, size_t n, const fs::path& p) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::write(fd, static_cast<const char*>(src) + done, n - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw_errno("cannot write", p);
    done += size_t(r);
  }
}

void repack_layer(const fs::path& model_dir, int layer, const ExpertMap& new_map,
                  const fs::path& staging) {
  const fs::path src = expert_file_path(model_dir, layer);
  const ExpertFileHeader old_h = read_expert_header(src);
  if (new_map.size() != old_h.n_experts)
    throw ConfigError("new map for layer " + std::to_string(layer) + " has " +
                      std::to_string(new_map.size()) + " experts, " + src.string() + " has " +
                      std::to_string(old_h.n_experts));
  // The source's own map must describe it: an unbound one would be baked into the new file.
  const ExpertMap old_map = load_bound_expert_map(expert_map_path(model_dir, layer), old_h, src);
  ExpertFileHeader new_h = old_h;
  new_h.slot_checksums = repacked_checksums(old_h, old_map, new_map);
  const fs::path dst = staging / src.filename();
  Fd in(src, O_RDONLY);
  {
    Fd out(dst, O_WRONLY | O_CREAT | O_TRUNC);
    const std::string header = encode_expert_header(new_h);
    write_all(out.get(), header.data(), header.size(), dst);
    std::string slot(old_h.expert_stride, '\0');
    for (uint32_t s = 0; s < new_h.n_experts; ++s) {
      const uint32_t from = old_map.physical(new_map.logical(s));
      pread_all(in.get(), slot.data(), slot.size(), old_h.slot_offset(from), src);
      if (expert_checksum(old_h.payload_hash, slot.data(), old_h.expert_bytes) != old_h.slot_checksums[from])
        throw FormatError(src.string() + ": checksum mismatch in slot " + std::to_string(from) +
                          " (offset " + std::to_string(old_h.slot_offset(from)) +
                          "): refusing to repack a damaged file");
      write_all(out.get(), slot.data(), slot.size(), dst);
    }
    if (::fsync(out.get()) != 0) throw_errno("cannot fsync", dst);
  }
  // Read back what landed: header and every slot against the checksums it must carry.
  const ExpertFileHeader back = read_expert_header(dst);
  Fd check(dst, O_RDONLY);
  std::string slot(back.expert_bytes, '\0');
  for (uint32_t s = 0; s < back.n_experts; ++s) {
    pread_all(check.get(), slot.data(), slot.size(), back.slot_offset(s), dst);
    if (expert_checksum(back.payload_hash, slot.data(), slot.size()) != new_h.slot_checksums[s])
      throw FormatError(dst.string() + ": verification failed in slot " + std::to_string(s));
  }
  write_expert_map(staging / expert_map_path(model_dir, layer).filename(),
                   new_map.bound_to(slot_table_hash(new_h.slot_checksums)));
}

}  // namespace

std::vector<uint64_t> repacked_checksums(const ExpertFileHeader& h, const ExpertMap& old_map,
                                         const ExpertMap& new_map) {
  MOE_ASSERT(old_map.size() == h.n_experts && new_map.size() == h.n_experts, "map size");
  std::vector<uint64_t> out(h.n_experts);
  for (uint32_t s = 0; s < h.n_experts; ++s) out[s] = h.slot_checksums[old_map.physical(new_map.logical(s))];
  return out;
}

std::vector<ExpertMap> bind_for_repack(const fs::path& model_dir, const std::vector<ExpertMap>& new_maps) {
  std::vector<ExpertMap> out;
  for (size_t l = 0; l < new_maps.size(); ++l) {
    const fs::path file = expert_file_path(model_dir, int(l));
    const ExpertFileHeader h = read_expert_header(file);
    if (new_maps[l].size() != h.n_experts)
      throw ConfigError("map for layer " + std::to_string(l) + " has " + std::to_string(new_maps[l].size()) +
                        " experts, " + file.string() + " has " + std::to_string(h.n_experts));
    const ExpertMap old_map = load_bound_expert_map(expert_map_path(model_dir, int(l)), h, file);
    out.push_back(new_maps[l].bound_to(slot_table_hash(repacked_checksums(h, old_map, new_maps[l]))));
  }
  return out;
}

int bind_legacy_maps(const fs::path& model_dir) {
  int bound = 0;
  for (int l = 0; fs::exists(expert_file_path(model_dir, l)); ++l) {
    const fs::path file = expert_file_path(model_dir, l), map_path = expert_map_path(model_dir, l);
    const ExpertFileHeader h = read_expert_header(file);
    const ExpertMap m = load_expert_map_file(map_path, h.n_experts);
    if (!fs::exists(map_path)) continue;  // identity: nothing to bind
    if (m.file_binding()) {
      load_bound_expert_map(map_path, h, file);  // already bound: it must be bound to this file
      continue;
    }
    // Each map is rewritten on its own (atomically): a map only gains a binding, so a run stopped
    // half-way leaves every map either as it was or bound, and running again finishes the rest.
    write_expert_map(map_path, m.bound_to(slot_table_hash(h.slot_checksums)));
    ++bound;
  }
  return bound;
}

fs::path repack_staging_dir(const fs::path& model_dir) { return model_dir / "experts.repack"; }

void repack_experts(const fs::path& model_dir, int n_layers, const std::vector<ExpertMap>& new_maps,
                    const RepackOptions& opts) {
  if (int(new_maps.size()) != n_layers)
    throw ConfigError("repack: " + std::to_string(new_maps.size()) + " maps for " +
                      std::to_string(n_layers) + " layers");
  const fs::path experts = expert_file_path(model_dir, 0).parent_path();
  const fs::path staging = repack_staging_dir(model_dir);
  // A staging directory is never live: left by a crash on either side of the exchange, it holds
  // either an unfinished new copy or the old files; both are safe to drop.
  fs::remove_all(staging);
  fs::create_directory(staging);
  auto fault = [&](const std::string& point) {
    if (opts.fault) opts.fault(point);
  };
  try {
    for (int l = 0; l < n_layers; ++l) {
      repack_layer(model_dir, l, new_maps[size_t(l)], staging);
      if (opts.progress) opts.progress(l + 1, n_layers);
      fault("layer " + std::to_string(l) + " written");
    }
    for (const auto& entry : fs::directory_iterator(experts)) {
      const fs::path target = staging / entry.path().filename();
      if (fs::exists(target)) continue;  // a repacked layer file or map
      const std::string name = entry.path().filename().string();
      if (name.ends_with(".map")) continue;  // a map of a layer we did not rewrite cannot exist
      std::error_code ec;
      fs::create_hard_link(entry.path(), target, ec);
      if (ec) fs::copy(entry.path(), target, fs::copy_options::recursive);
    }
    fsync_path(staging);
    fault("before exchange");
  } catch (...) {
    if (!opts.keep_staging_on_failure) {
      std::error_code ec;
      fs::remove_all(staging, ec);
    }
    throw;
  }
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, experts.c_str(), RENAME_EXCHANGE) != 0) {
    const int err = errno;
    std::error_code ec;
    fs::remove_all(staging, ec);
    throw ConfigError("cannot exchange " + staging.string() + " and " + experts.string() +
                      " (renameat2 RENAME_EXCHANGE): " + std::strerror(err) +
                      "; the model is unchanged");
  }
  fsync_path(model_dir);
  fs::remove_all(staging);  // now the old files
}

}  // namespace moestream::cluster
