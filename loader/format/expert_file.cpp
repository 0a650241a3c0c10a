// Implementation of loader/format/expert_file.h: byte layout of an expert, header encode/decode with
// validation of every field (overflow-safe), checksums and paths.
#include "loader/format/expert_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <xxhash.h>

#include "common/enum_names.h"
#include "common/error.h"
#include "common/file_util.h"

namespace moestream {
namespace {

constexpr size_t kFixedHeaderBytes = 64;       // version 1; also where version 2's extra fields start
constexpr size_t kFixedHeaderBytesTyped = 80;  // version 2
constexpr size_t kChecksumFieldOffset = 56;
constexpr uint32_t kFlagBias = 1;              // version-2 flags bit 0: f32 expert biases after down
constexpr uint32_t kFlagXxh3 = 2;              // version-2 flags bit 1: slot checksums are XXH3-64
// Sanity bounds: far above any published MoE (Qwen3-235B: 128 experts, D 4096, F 1536) but low
// enough that no size computed from them can overflow 64 bits.
constexpr uint32_t kMaxExperts = 1u << 16;
constexpr uint32_t kMaxDim = 1u << 20;

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

template <typename T>
void put(std::string& out, size_t off, T v) {
  std::memcpy(out.data() + off, &v, sizeof v);  // little-endian host (x86-64, aarch64)
}

template <typename T>
T get(std::string_view in, size_t off) {
  T v;
  std::memcpy(&v, in.data() + off, sizeof v);
  return v;
}

uint64_t fixed_bytes(uint32_t version) {
  return version == kExpertFileVersion ? kFixedHeaderBytes : kFixedHeaderBytesTyped;
}

// Covers everything but the checksum field itself: [0, 56) and [64, table end).
uint64_t header_checksum(std::string_view bytes, uint32_t version, uint32_t n_experts) {
  XXH64_state_t* st = XXH64_createState();
  MOE_ASSERT(st != nullptr, "XXH64_createState");
  XXH64_reset(st, 0);
  XXH64_update(st, bytes.data(), kChecksumFieldOffset);
  XXH64_update(st, bytes.data() + kFixedHeaderBytes, fixed_bytes(version) - kFixedHeaderBytes + size_t{8} * n_experts);
  uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

[[noreturn]] void bad_field(const std::filesystem::path& path, const char* field, size_t offset,
                            const std::string& detail) {
  throw FormatError(path.string() + ": expert file header field '" + field + "' at offset " +
                    std::to_string(offset) + ": " + detail);
}

void pread_exact(int fd, void* buf, size_t n, uint64_t off, const std::filesystem::path& path) {
  auto* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(off + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      int saved = errno;
      ::close(fd);
      throw IoError("cannot read " + path.string() + " at offset " + std::to_string(off + done) +
                    ": " + std::strerror(saved));
    }
    if (r == 0) {
      ::close(fd);
      throw IoError(path.string() + ": truncated: wanted " + std::to_string(n) +
                    " bytes at offset " + std::to_string(off) + ", file ends after " +
                    std::to_string(done));
    }
    done += static_cast<size_t>(r);
  }
}

}  // namespace

namespace {
constexpr EnumName<QuantType> kQuantNames[] = {
    {QuantType::kF32, "f32"}, {QuantType::kBF16, "bf16"}, {QuantType::kQ8, "q8"}, {QuantType::kQ4, "q4"}};
}  // namespace

std::optional<GgmlType> quant_ggml_type(QuantType q) {
  const uint32_t v = static_cast<uint32_t>(q);
  if (v < kGgmlQuantBase) return std::nullopt;
  const auto info = ggml_type_info(v - kGgmlQuantBase);
  if (!info) return std::nullopt;
  return info->type;
}

std::string_view quant_name(QuantType q) {
  if (const auto g = quant_ggml_type(q)) return ggml_type_name(*g);
  return enum_name(kQuantNames, q, "unknown");
}

QuantType parse_stored_quant(std::string_view name) {
  if (auto q = enum_from_name(kQuantNames, name)) return *q;
  if (const auto g = ggml_type_info_by_name(name)) return ggml_quant(g->type);
  throw ConfigError("unknown quant type '" + std::string(name) + "' (expected " + enum_name_list(kQuantNames) +
                    " or a ggml type name such as Q4_K)");
}

void ExpertFileHeader::set_types(const ExpertTypes& t) {
  const bool uniform_pack = is_pack_quant(t.gate) && t.up == t.gate && t.down == t.gate && !t.bias;
  version = uniform_pack && payload_hash == PayloadHash::kXxh64 ? kExpertFileVersion : kExpertFileVersionTyped;
  bias = t.bias;
  quant = t.gate;
  up_quant = t.up;
  down_quant = t.down;
}

uint64_t ExpertFileHeader::table_offset() const { return fixed_bytes(version); }

uint64_t expert_data_offset(uint32_t version, uint32_t n_experts) {
  return align_up(fixed_bytes(version) + 8 * uint64_t{n_experts}, kExpertAlign);
}

QuantType parse_quant(std::string_view name) {
  if (auto q = enum_from_name(kQuantNames, name)) return *q;
  throw ConfigError("unknown quant type '" + std::string(name) + "' (expected " + enum_name_list(kQuantNames) +
                    ")");
}

size_t quant_matrix_bytes(QuantType q, size_t rows, size_t cols) {
  if (const auto g = quant_ggml_type(q)) {
    const auto row = ggml_row_bytes(*g, cols);
    if (!row || (rows != 0 && *row > SIZE_MAX / rows))
      throw ConfigError(std::to_string(rows) + " x " + std::to_string(cols) + " " +
                        std::string(ggml_type_name(*g)) + " matrix: the row length is not a whole " +
                        "number of blocks, or the size overflows");
    return rows * size_t(*row);
  }
  size_t nb = (cols + kQuantBlock - 1) / kQuantBlock;
  switch (q) {
    case QuantType::kF32: return rows * cols * 4;
    case QuantType::kBF16: return rows * cols * 2;
    case QuantType::kQ8: return rows * nb * (2 + kQuantBlock);
    case QuantType::kQ4: return rows * nb * (2 + kQuantBlock / 2);
  }
  MOE_ASSERT(false, "bad QuantType " + std::to_string(static_cast<uint32_t>(q)));
  return 0;
}

ExpertLayout ExpertLayout::make(QuantType q, size_t hidden, size_t intermediate) {
  return make(ExpertTypes::uniform(q), hidden, intermediate);
}

ExpertLayout ExpertLayout::make(const ExpertTypes& t, size_t hidden, size_t intermediate) {
  ExpertLayout l;
  l.types = t;
  l.gate_offset = 0;
  l.up_offset = align_up(quant_matrix_bytes(t.gate, intermediate, hidden), kMatrixAlign);
  l.down_offset = l.up_offset + align_up(quant_matrix_bytes(t.up, intermediate, hidden), kMatrixAlign);
  l.bytes = l.down_offset + quant_matrix_bytes(t.down, hidden, intermediate);
  if (t.bias) {  // gpt-oss: the biases travel with the expert they belong to
    l.bias_offset = align_up(l.bytes, kMatrixAlign);
    l.bytes = l.bias_offset + (2 * intermediate + hidden) * sizeof(float);
  }
  return l;
}

std::string encode_expert_header(const ExpertFileHeader& h) {
  MOE_ASSERT(h.slot_checksums.size() == h.n_experts, "one checksum per slot");
  MOE_ASSERT(h.version == kExpertFileVersion || h.version == kExpertFileVersionTyped, "expert file version");
  MOE_ASSERT(h.data_offset == expert_data_offset(h.version, h.n_experts),
             "data_offset must be align_up(table offset + 8*n_experts, 4096)");
  MOE_ASSERT(h.version == kExpertFileVersionTyped || is_pack_quant(h.quant), "a ggml type needs version 2");
  MOE_ASSERT(h.version == kExpertFileVersionTyped || h.payload_hash == PayloadHash::kXxh64, "XXH3 checksums need version 2");
  std::string out(h.data_offset, '\0');
  std::memcpy(out.data(), kExpertFileMagic, 8);
  put<uint32_t>(out, 8, h.version);
  put<uint32_t>(out, 12, static_cast<uint32_t>(h.quant));
  put<uint32_t>(out, 16, h.layer);
  put<uint32_t>(out, 20, h.n_experts);
  put<uint32_t>(out, 24, h.hidden);
  put<uint32_t>(out, 28, h.intermediate);
  put<uint64_t>(out, 32, h.expert_bytes);
  put<uint64_t>(out, 40, h.expert_stride);
  put<uint64_t>(out, 48, h.data_offset);
  if (h.version == kExpertFileVersionTyped) {
    put<uint32_t>(out, 64, static_cast<uint32_t>(h.up_quant));
    put<uint32_t>(out, 68, static_cast<uint32_t>(h.down_quant));
    put<uint32_t>(out, 72, (h.bias ? kFlagBias : 0u) | (h.payload_hash == PayloadHash::kXxh3 ? kFlagXxh3 : 0u));
  }
  const uint64_t table = h.table_offset();
  for (uint32_t i = 0; i < h.n_experts; ++i) put<uint64_t>(out, table + 8 * i, h.slot_checksums[i]);
  put<uint64_t>(out, kChecksumFieldOffset, header_checksum(out, h.version, h.n_experts));
  return out;
}

ExpertFileHeader decode_expert_header(std::string_view bytes, uint64_t file_size,
                                      const std::filesystem::path& path) {
  if (bytes.size() < kFixedHeaderBytes || file_size < kFixedHeaderBytes)
    throw FormatError(path.string() + ": expert file is " + std::to_string(file_size) +
                      " bytes, shorter than its 64-byte header (truncated)");
  if (std::memcmp(bytes.data(), kExpertFileMagic, 8) != 0)
    bad_field(path, "magic", 0, "expected \"MOEXPRT\\0\", this is not a moestream expert file");
  ExpertFileHeader h;
  h.payload_hash = PayloadHash::kXxh64;  // version 1, and version 2 without flags bit 1
  h.version = get<uint32_t>(bytes, 8);
  if (h.version != kExpertFileVersion && h.version != kExpertFileVersionTyped)
    bad_field(path, "version", 8, "expected " + std::to_string(kExpertFileVersion) + " or " +
                                      std::to_string(kExpertFileVersionTyped) + ", got " + std::to_string(h.version));
  if (h.version == kExpertFileVersionTyped && (bytes.size() < kFixedHeaderBytesTyped || file_size < kFixedHeaderBytesTyped))
    throw FormatError(path.string() + ": expert file is " + std::to_string(file_size) +
                      " bytes, shorter than its 80-byte version-2 header (truncated)");
  // A type must be one this build knows; whether the kernels compute it is the forward pass's check.
  auto type_at = [&](const char* field, size_t off) {
    const uint32_t v = get<uint32_t>(bytes, off);
    const QuantType q = static_cast<QuantType>(v);
    if (h.version == kExpertFileVersion) {
      if (!is_pack_quant(q)) bad_field(path, field, off, "expected 0..3, got " + std::to_string(v));
    } else if (!is_pack_quant(q) && !quant_ggml_type(q)) {
      bad_field(path, field, off, "expected 0..3 or 256 + a known ggml type id, got " + std::to_string(v));
    }
    return q;
  };
  h.quant = type_at("quant", 12);
  h.up_quant = h.down_quant = h.quant;
  if (h.version == kExpertFileVersionTyped) {
    h.up_quant = type_at("up_quant", 64);
    h.down_quant = type_at("down_quant", 68);
    const uint32_t flags = get<uint32_t>(bytes, 72);
    if ((flags & ~(kFlagBias | kFlagXxh3)) != 0)
      bad_field(path, "flags", 72, "has unknown bits set: " + std::to_string(flags) +
                                       " (bit 0, biases, and bit 1, XXH3 checksums, are defined)");
    h.bias = (flags & kFlagBias) != 0;
    h.payload_hash = (flags & kFlagXxh3) != 0 ? PayloadHash::kXxh3 : PayloadHash::kXxh64;
    if (get<uint32_t>(bytes, 76) != 0) bad_field(path, "reserved", 76, "expected 0");
  }
  h.layer = get<uint32_t>(bytes, 16);
  h.n_experts = get<uint32_t>(bytes, 20);
  if (h.n_experts == 0 || h.n_experts > kMaxExperts)
    bad_field(path, "n_experts", 20, "expected 1.." + std::to_string(kMaxExperts) + ", got " +
                                         std::to_string(h.n_experts));
  h.hidden = get<uint32_t>(bytes, 24);
  if (h.hidden == 0 || h.hidden > kMaxDim)
    bad_field(path, "hidden", 24, "expected 1.." + std::to_string(kMaxDim) + ", got " +
                                      std::to_string(h.hidden));
  h.intermediate = get<uint32_t>(bytes, 28);
  if (h.intermediate == 0 || h.intermediate > kMaxDim)
    bad_field(path, "intermediate", 28, "expected 1.." + std::to_string(kMaxDim) + ", got " +
                                            std::to_string(h.intermediate));
  h.expert_bytes = get<uint64_t>(bytes, 32);
  const ExpertTypes types = h.types();
  uint64_t want_bytes = 0;
  try {
    want_bytes = ExpertLayout::make(types, h.hidden, h.intermediate).bytes;
  } catch (const ConfigError& e) {
    bad_field(path, "quant", 12, std::string("the types do not fit the sizes: ") + e.what());
  }
  const std::string type_names = types.gate == types.up && types.up == types.down
                                     ? std::string(quant_name(types.gate))
                                     : std::string(quant_name(types.gate)) + "/" + std::string(quant_name(types.up)) +
                                           "/" + std::string(quant_name(types.down));
  if (h.expert_bytes != want_bytes)
    bad_field(path, "expert_bytes", 32, "expected " + std::to_string(want_bytes) + " for quant " +
                                            type_names + " D=" +
                                            std::to_string(h.hidden) + " F=" +
                                            std::to_string(h.intermediate) + ", got " +
                                            std::to_string(h.expert_bytes));
  h.expert_stride = get<uint64_t>(bytes, 40);
  if (h.expert_stride % kExpertAlign != 0 || h.expert_stride < h.expert_bytes ||
      h.expert_stride - h.expert_bytes >= (uint64_t{1} << 40))
    bad_field(path, "expert_stride", 40, "expected a multiple of 4096 >= expert_bytes " +
                                             std::to_string(h.expert_bytes) + ", got " +
                                             std::to_string(h.expert_stride));
  h.data_offset = get<uint64_t>(bytes, 48);
  const uint64_t table = h.table_offset();
  uint64_t table_end = table + 8 * uint64_t{h.n_experts};
  if (h.data_offset != align_up(table_end, kExpertAlign))
    bad_field(path, "data_offset", 48, "expected " + std::to_string(align_up(table_end, kExpertAlign)) +
                                           ", got " + std::to_string(h.data_offset));
  if (bytes.size() < table_end)
    throw FormatError(path.string() + ": expert file header needs " + std::to_string(table_end) +
                      " bytes for " + std::to_string(h.n_experts) + " slot checksums, got " +
                      std::to_string(bytes.size()) + " (truncated)");
  uint64_t stored = get<uint64_t>(bytes, kChecksumFieldOffset);
  uint64_t actual = header_checksum(bytes, h.version, h.n_experts);
  if (stored != actual) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "stored %016llx, computed %016llx (header corrupted)",
                  static_cast<unsigned long long>(stored), static_cast<unsigned long long>(actual));
    bad_field(path, "header_checksum", kChecksumFieldOffset, buf);
  }
  h.slot_checksums.resize(h.n_experts);
  for (uint32_t i = 0; i < h.n_experts; ++i) h.slot_checksums[i] = get<uint64_t>(bytes, table + 8 * i);
  // Bounds above make this product fit: 2^16 slots * < 2^41 bytes.
  uint64_t want_size = h.file_bytes();
  if (file_size != want_size)
    throw FormatError(path.string() + ": expert file is " + std::to_string(file_size) +
                      " bytes, header says data_offset + n_experts*expert_stride = " +
                      std::to_string(want_size) + (file_size < want_size ? " (truncated)" : ""));
  return h;
}

ExpertFileHeader read_expert_header(const std::filesystem::path& path) {
  uint64_t file_size = 0;
  const int fd = open_for_read(path, "expert file", &file_size);
  std::string bytes(std::min<uint64_t>(file_size, kFixedHeaderBytes), '\0');
  pread_exact(fd, bytes.data(), bytes.size(), 0, path);
  if (bytes.size() == kFixedHeaderBytes) {
    // Read the checksum table too when version and n_experts are plausible; decode reports it otherwise.
    const uint32_t version = get<uint32_t>(bytes, 8);
    uint32_t n = get<uint32_t>(bytes, 20);
    if (n > 0 && n <= kMaxExperts && (version == kExpertFileVersion || version == kExpertFileVersionTyped)) {
      uint64_t table_end = fixed_bytes(version) + 8 * uint64_t{n};
      bytes.resize(std::min(file_size, table_end));
      pread_exact(fd, bytes.data() + kFixedHeaderBytes, bytes.size() - kFixedHeaderBytes,
                  kFixedHeaderBytes, path);
    }
  }
  ::close(fd);
  return decode_expert_header(bytes, file_size, path);
}

uint64_t expert_checksum(PayloadHash hash, const void* data, size_t bytes) {
  return hash == PayloadHash::kXxh3 ? XXH3_64bits(data, bytes) : XXH64(data, bytes, 0);
}

uint64_t slot_table_hash(const std::vector<uint64_t>& slot_checksums) {
  // The table as stored: little-endian hosts only, as the format states.
  return XXH64(slot_checksums.data(), slot_checksums.size() * sizeof(uint64_t), 0);
}

std::filesystem::path expert_file_path(const std::filesystem::path& model_dir, int layer) {
  char name[32];
  std::snprintf(name, sizeof name, "layer_%03d.bin", layer);
  return model_dir / "experts" / name;
}

}  // namespace moestream
