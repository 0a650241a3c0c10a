// Implementation of loader/format/dense_checksum.h: streamed through pread in 4 MiB pieces (no
// mapping: a file that fails to read is an IoError here, and the load has not mapped it yet).
#include "loader/format/dense_checksum.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "common/error.h"
#include "common/option_ref.h"
#include "common/file_util.h"

namespace moestream {

std::string dense_file_checksum(const std::filesystem::path& file) {
  uint64_t size = 0;
  const int fd = open_for_read(file, "dense weights file", &size);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), XXH3_freeState);
  if (!state || XXH3_64bits_reset(state.get()) != XXH_OK) {
    ::close(fd);
    throw std::bad_alloc();
  }
  constexpr size_t kPiece = size_t(4) << 20;  // large enough for full device bandwidth
  std::vector<uint8_t> buf(kPiece);
  uint64_t off = 0;
  while (off < size) {
    const ssize_t got = ::pread(fd, buf.data(), std::min<uint64_t>(kPiece, size - off), off_t(off));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const std::string why = got < 0 ? std::strerror(errno) : "end of file (the file shrank while it was hashed)";
      ::close(fd);
      throw IoError("cannot read " + file.string() + " at offset " + std::to_string(off) + " to verify its checksum: " + why);
    }
    XXH3_64bits_update(state.get(), buf.data(), size_t(got));
    off += uint64_t(got);
  }
  ::close(fd);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits_digest(state.get())));
  return hex;
}

void verify_dense_checksum(const std::filesystem::path& dir, const ModelConfig& cfg) {
  if (cfg.dense_xxh3.empty()) return;
  const std::filesystem::path file = dir / cfg.dense_file;
  const std::string actual = dense_file_checksum(file);
  if (actual != cfg.dense_xxh3)
    throw FormatError(file.string() + ": checksum (XXH3-64) " + actual + " does not match model.json's dense.xxh3 " +
                      cfg.dense_xxh3 + ": the dense weights are corrupt or were changed since the conversion "
                      "(" + option_ref("verify_checksums", "false") + " skips this check)");
}

}  // namespace moestream
