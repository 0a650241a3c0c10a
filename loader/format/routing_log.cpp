// Encoding, validating reads and crash-tolerant appends of the routing log (loader/format/routing_log.h).
#include "loader/format/routing_log.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/file_util.h"
#include "common/load_le.h"
#include "loader/format/gguf_file.h"
#include "loader/format/gguf_model.h"

namespace moestream {
namespace {

constexpr char kRecordTag[4] = {'R', 'R', 'E', 'C'};
constexpr size_t kRecordFixed = 24;  // tag .. layer
constexpr uint8_t kFlagRouterInput = 1;

uint16_t load_u16(const char* p) { return load_le<uint16_t>(p); }
uint32_t load_u32(const char* p) { return load_le<uint32_t>(p); }
uint64_t load_u64(const char* p) { return load_le<uint64_t>(p); }
template <class T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

uint64_t record_bytes(const RoutingLogHeader& h, bool with_input) {
  return kRecordFixed + 6ull * h.top_k + (with_input ? 4ull * h.hidden : 0) + 8;
}

std::string at(const std::filesystem::path& path, uint64_t offset) {
  return path.string() + " at offset " + std::to_string(offset);
}

// Why a record at `off` is bad, or empty when it is fine. `*len` gets its length when readable.
std::string check_record(std::string_view b, uint64_t off, const RoutingLogHeader& h,
                         uint64_t* len) {
  const uint64_t left = b.size() - off;
  if (left < 8) return "record header cut short (" + std::to_string(left) + " bytes left)";
  const char* p = b.data() + off;
  if (std::memcmp(p, kRecordTag, 4) != 0) return "bad record tag";
  const uint32_t claimed = load_u32(p + 4);
  if (claimed != record_bytes(h, false) && claimed != record_bytes(h, true))
    return "record_bytes " + std::to_string(claimed) + " matches neither " +
           std::to_string(record_bytes(h, false)) + " nor " + std::to_string(record_bytes(h, true));
  *len = claimed;
  if (*len > left) return "record of " + std::to_string(*len) + " bytes runs past the end";
  if (XXH64(p, *len - 8, 0) != load_u64(p + *len - 8)) return "record checksum mismatch";
  return {};
}

// Is b[off, end) what an append cut off before its record's tag and length were written?
bool torn_start(std::string_view b, uint64_t off, const RoutingLogHeader& h) {
  const uint64_t left = b.size() - off;
  if (left > record_bytes(h, true)) return false;  // at most one record's worth
  const std::string_view rest = b.substr(off);
  if (rest.find_first_not_of('\0') == std::string_view::npos) return true;
  return left < 8 && std::string_view(kRecordTag, 4).starts_with(rest.substr(0, std::min<uint64_t>(left, 4)));
}

}  // namespace

uint64_t model_identity_hash(const std::filesystem::path& model_dir) {
  if (is_gguf_file(model_dir)) {
    // A GGUF's identity is its first shard's bytes before the data section: header, metadata
    // and tensor table (what model.json is to a pack), the same from any shard of a set.
    const GgufModelFiles files(model_dir);
    const GgufFile& f = files.shard(0);
    uint64_t size = 0;
    const int fd = open_for_read(f.path(), "GGUF file", &size);
    std::string s(f.data_offset(), '\0');
    uint64_t done = 0;
    while (done < s.size()) {
      const ssize_t r = ::pread(fd, s.data() + done, s.size() - done, off_t(done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) close_and_throw_errno(fd, "cannot read the header of", f.path());
      if (r == 0) {
        ::close(fd);
        throw IoError(f.path().string() + ": file shrank while its header was read");
      }
      done += uint64_t(r);
    }
    ::close(fd);
    return XXH64(s.data(), s.size(), 0);
  }
  const std::string s = read_file(model_dir / "model.json");
  return XXH64(s.data(), s.size(), 0);
}

std::string encode_routing_header(const RoutingLogHeader& h) {
  std::string s(kRoutingLogMagic, 8);
  put<uint32_t>(s, kRoutingLogVersion);
  put<uint32_t>(s, 0);
  put<uint64_t>(s, h.model_hash);
  put<uint32_t>(s, h.n_layers);
  put<uint32_t>(s, h.n_experts);
  put<uint32_t>(s, h.top_k);
  put<uint32_t>(s, h.hidden);
  s.append(16, '\0');
  put<uint64_t>(s, XXH64(s.data(), s.size(), 0));
  MOE_ASSERT(s.size() == kRoutingLogHeaderBytes);
  return s;
}

RoutingLogHeader decode_routing_header(std::string_view b, const std::filesystem::path& path) {
  const std::string f = path.string();
  if (b.size() < kRoutingLogHeaderBytes)
    throw FormatError(f + ": routing log header needs " + std::to_string(kRoutingLogHeaderBytes) +
                      " bytes, file has " + std::to_string(b.size()));
  if (std::memcmp(b.data(), kRoutingLogMagic, 8) != 0)
    throw FormatError(f + ": not a routing log (bad magic at offset 0)");
  const uint32_t version = load_u32(b.data() + 8);
  if (version != kRoutingLogVersion)
    throw FormatError(f + ": routing log version " + std::to_string(version) + " (offset 8), expected " +
                      std::to_string(kRoutingLogVersion));
  if (XXH64(b.data(), 56, 0) != load_u64(b.data() + 56))
    throw FormatError(f + ": routing log header checksum mismatch (offset 56)");
  RoutingLogHeader h;
  h.model_hash = load_u64(b.data() + 16);
  h.n_layers = load_u32(b.data() + 24);
  h.n_experts = load_u32(b.data() + 28);
  h.top_k = load_u32(b.data() + 32);
  h.hidden = load_u32(b.data() + 36);
  if (h.n_layers == 0 || h.n_layers > 65535)
    throw FormatError(f + ": n_layers " + std::to_string(h.n_layers) + " (offset 24) not in [1, 65535]");
  if (h.n_experts == 0 || h.n_experts > 65535)
    throw FormatError(f + ": n_experts " + std::to_string(h.n_experts) + " (offset 28) not in [1, 65535]");
  if (h.top_k == 0 || h.top_k > h.n_experts)
    throw FormatError(f + ": top_k " + std::to_string(h.top_k) + " (offset 32) not in [1, n_experts]");
  return h;
}

void encode_routing_record(const RoutingLogHeader& h, const RoutingRecord& r, std::string& out) {
  const bool with_input = !r.router_input.empty();
  MOE_ASSERT(r.ids.size() == h.top_k && r.weights.size() == h.top_k);
  MOE_ASSERT(!with_input || r.router_input.size() == h.hidden);
  MOE_ASSERT(r.layer < h.n_layers);
  const size_t start = out.size();
  out.append(kRecordTag, 4);
  put<uint32_t>(out, static_cast<uint32_t>(record_bytes(h, with_input)));
  put<uint64_t>(out, r.request_id);
  put<uint32_t>(out, r.position);
  put<uint8_t>(out, static_cast<uint8_t>(r.phase));
  put<uint8_t>(out, with_input ? kFlagRouterInput : 0);
  put<uint16_t>(out, r.layer);
  for (uint16_t id : r.ids) {
    MOE_ASSERT(id < h.n_experts);
    put<uint16_t>(out, id);
  }
  out.append(reinterpret_cast<const char*>(r.weights.data()), 4 * r.weights.size());
  out.append(reinterpret_cast<const char*>(r.router_input.data()), 4 * r.router_input.size());
  put<uint64_t>(out, XXH64(out.data() + start, out.size() - start, 0));
}

RoutingLog read_routing_log(const std::filesystem::path& path) {
  const std::string b = read_file(path);
  RoutingLog log;
  log.header = decode_routing_header(b, path);
  const RoutingLogHeader& h = log.header;
  uint64_t off = kRoutingLogHeaderBytes;
  while (off < b.size()) {
    uint64_t len = 0;
    std::string why = check_record(b, off, h, &len);
    if (!why.empty()) {
      // Only the last record may be bad: a crash mid-append. Anything after it means the bytes
      // in the middle of the file changed, which is corruption, not a crash.
      // Without a trustworthy length (a bad tag or length), only what an interrupted append
      // leaves is a tail: at most one record long and either a cut-off start of a record
      // (under 8 bytes, its tag so far right) or zeros (a file extended but never written). A
      // flipped tag or length before the last record would otherwise drop the records after it.
      const bool tail = len ? off + len >= b.size() : torn_start(b, off, h);
      if (!tail) throw FormatError(at(path, off) + ": corrupt routing record: " + why);
      log.truncated_bytes = b.size() - off;
      log.warning = at(path, off) + ": skipped a truncated tail of " +
                    std::to_string(log.truncated_bytes) + " bytes (" + why + ")";
      break;
    }
    const char* p = b.data() + off;
    RoutingRecord r;
    r.request_id = load_u64(p + 8);
    r.position = load_u32(p + 16);
    const uint8_t phase = static_cast<uint8_t>(p[20]);
    const uint8_t flags = static_cast<uint8_t>(p[21]);
    r.layer = load_u16(p + 22);
    if (phase > 1) throw FormatError(at(path, off + 20) + ": phase " + std::to_string(phase) + " not 0 or 1");
    if (r.layer >= h.n_layers)
      throw FormatError(at(path, off + 22) + ": layer " + std::to_string(r.layer) + " >= n_layers " +
                        std::to_string(h.n_layers));
    const bool with_input = flags & kFlagRouterInput;
    if (len != record_bytes(h, with_input))
      throw FormatError(at(path, off + 4) + ": record_bytes " + std::to_string(len) +
                        " disagrees with flags " + std::to_string(flags));
    r.phase = static_cast<RoutingPhase>(phase);
    r.ids.resize(h.top_k);
    r.weights.resize(h.top_k);
    for (uint32_t j = 0; j < h.top_k; ++j) {
      r.ids[j] = load_u16(p + kRecordFixed + 2 * j);
      if (r.ids[j] >= h.n_experts)
        throw FormatError(at(path, off + kRecordFixed + 2 * j) + ": expert id " +
                          std::to_string(r.ids[j]) + " >= n_experts " + std::to_string(h.n_experts));
    }
    std::memcpy(r.weights.data(), p + kRecordFixed + 2 * h.top_k, 4 * h.top_k);
    if (with_input) {
      r.router_input.resize(h.hidden);
      std::memcpy(r.router_input.data(), p + kRecordFixed + 6 * h.top_k, 4ull * h.hidden);
    }
    log.records.push_back(std::move(r));
    off += len;
  }
  log.valid_bytes = off;
  return log;
}

RoutingLogWriter::RoutingLogWriter(const std::filesystem::path& path, const RoutingLogHeader& header)
    : path_(path), header_(header) {
  std::error_code ec;
  const bool exists = std::filesystem::exists(path, ec) && std::filesystem::file_size(path, ec) > 0;
  uint64_t keep = 0;
  if (exists) {
    RoutingLog old = read_routing_log(path);
    if (!(old.header == header))
      throw ConfigError(path.string() + ": routing log of another model or shape (model_hash " +
                        std::to_string(old.header.model_hash) + ", " +
                        std::to_string(old.header.n_layers) + " layers, " +
                        std::to_string(old.header.n_experts) + " experts, top-" +
                        std::to_string(old.header.top_k) + ", hidden " +
                        std::to_string(old.header.hidden) + "); this model has model_hash " +
                        std::to_string(header.model_hash) + ", " + std::to_string(header.n_layers) +
                        " layers, " + std::to_string(header.n_experts) + " experts, top-" +
                        std::to_string(header.top_k) + ", hidden " + std::to_string(header.hidden) +
                        ": use another file");
    for (const RoutingRecord& r : old.records)
      next_request_id_ = std::max(next_request_id_, r.request_id + 1);
    keep = old.valid_bytes;
    if (old.truncated_bytes) warning_ = old.warning + "; cut off before appending";
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_errno("cannot open routing log", path);
  // Cut a torn tail so new records never follow garbage (which a reader would call corruption).
  if (::ftruncate(fd_, static_cast<off_t>(keep)) != 0 ||
      ::lseek(fd_, static_cast<off_t>(keep), SEEK_SET) < 0) {
    int saved = errno;
    ::close(fd_);
    fd_ = -1;
    errno = saved;
    throw_errno("cannot position routing log", path);
  }
  if (!exists) buf_ = encode_routing_header(header_);
}

RoutingLogWriter::~RoutingLogWriter() {
  if (fd_ < 0) return;
  try {
    flush();
  } catch (const Error&) {
    // Destructors never throw; a caller that cares calls close() and sees the error.
  }
  ::close(fd_);
}

void RoutingLogWriter::append(const RoutingRecord& r) {
  encode_routing_record(header_, r, buf_);
  if (buf_.size() >= (1u << 20)) flush();
}

void RoutingLogWriter::flush() {
  MOE_ASSERT(fd_ >= 0, "routing log already closed");
  size_t done = 0;
  while (done < buf_.size()) {
    ssize_t n = ::write(fd_, buf_.data() + done, buf_.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      buf_.erase(0, done);
      throw_errno("cannot write routing log", path_);
    }
    done += static_cast<size_t>(n);
  }
  buf_.clear();
}

void RoutingLogWriter::close() {
  if (fd_ < 0) return;
  flush();
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0) {
    int saved = errno;
    ::close(fd);
    errno = saved;
    throw_errno("cannot fsync routing log", path_);
  }
  if (::close(fd) != 0) throw_errno("cannot close routing log", path_);
}

}  // namespace moestream
