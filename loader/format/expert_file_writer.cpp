// Implementation of loader/format/expert_file_writer.h: slots are pwritten in place (zero padding comes
// from the sparse, pre-sized temp file), the header last, then fsync and rename.
#include "loader/format/expert_file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "common/error.h"
#include "common/file_util.h"

namespace moestream {

ExpertFileWriter::ExpertFileWriter(std::filesystem::path path, QuantType quant, uint32_t layer,
                                   uint32_t n_experts, uint32_t hidden, uint32_t intermediate)
    : ExpertFileWriter(std::move(path), ExpertTypes::uniform(quant), layer, n_experts, hidden, intermediate) {}

ExpertFileWriter::ExpertFileWriter(std::filesystem::path path, const ExpertTypes& types, uint32_t layer,
                                   uint32_t n_experts, uint32_t hidden, uint32_t intermediate, uint64_t min_stride,
                                   PayloadHash hash)
    : path_(std::move(path)) {
  MOE_ASSERT(n_experts > 0 && hidden > 0 && intermediate > 0, "empty expert file");
  layout_ = ExpertLayout::make(types, hidden, intermediate);
  header_.payload_hash = hash;
  header_.set_types(types);
  header_.layer = layer;
  header_.n_experts = n_experts;
  header_.hidden = hidden;
  header_.intermediate = intermediate;
  header_.expert_bytes = layout_.bytes;
  const uint64_t stride_bytes = std::max<uint64_t>(layout_.bytes, min_stride);
  header_.expert_stride = (stride_bytes + kExpertAlign - 1) / kExpertAlign * kExpertAlign;
  header_.data_offset = expert_data_offset(header_.version, n_experts);
  header_.slot_checksums.assign(n_experts, 0);
  written_.assign(n_experts, false);
  tmp_ = path_;
  tmp_ += ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_errno("cannot create", tmp_);
  if (::ftruncate(fd_, static_cast<off_t>(header_.file_bytes())) != 0) {
    int saved = errno;
    ::close(fd_);
    fd_ = -1;
    ::unlink(tmp_.c_str());
    errno = saved;
    throw_errno("cannot size", tmp_);
  }
}

ExpertFileWriter::~ExpertFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) ::unlink(tmp_.c_str());
}

void ExpertFileWriter::write_expert(uint32_t slot, const uint8_t* payload) {
  MOE_ASSERT(slot < header_.n_experts && !written_[slot], "slot out of range or written twice");
  MOE_ASSERT(fd_ >= 0, "write_expert after finish");
  pwrite_all(fd_, payload, layout_.bytes, header_.slot_offset(slot), tmp_);
  header_.slot_checksums[slot] = expert_checksum(header_.payload_hash, payload, layout_.bytes);
  written_[slot] = true;
}

void ExpertFileWriter::finish() {
  for (uint32_t s = 0; s < header_.n_experts; ++s)
    MOE_ASSERT(written_[s], "expert slot " + std::to_string(s) + " never written");
  std::string h = encode_expert_header(header_);
  pwrite_all(fd_, h.data(), h.size(), 0, tmp_);
  if (::fsync(fd_) != 0) throw_errno("cannot fsync", tmp_);
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) throw_errno("cannot close", tmp_);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) throw_errno("cannot rename into", path_);
  finished_ = true;
  std::filesystem::path dir = path_.parent_path();  // the rename itself must survive a crash
  fsync_path(dir.empty() ? std::filesystem::path(".") : dir);
}

}  // namespace moestream
