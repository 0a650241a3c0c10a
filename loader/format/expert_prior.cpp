// Implementation of loader/format/expert_prior.h.
#include "loader/format/expert_prior.h"

#include <xxhash.h>

#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/file_util.h"

namespace moestream {

namespace {
constexpr size_t kHeaderBytes = 40, kChecksumBytes = 8;
constexpr uint32_t kMaxDim = 65535;

template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (as every format here)
  out.append(b, sizeof(T));
}

template <class T>
T get(std::string_view bytes, size_t at) {
  T v;
  std::memcpy(&v, bytes.data() + at, sizeof(T));
  return v;
}
}  // namespace

ExpertPrior expert_prior_from_logs(std::span<const RoutingLog> logs) {
  if (logs.empty()) throw ConfigError("expert prior: no routing logs to learn from");
  ExpertPrior p;
  p.n_layers = logs[0].header.n_layers;
  p.n_experts = logs[0].header.n_experts;
  p.model_hash = logs[0].header.model_hash;
  std::vector<double> count(size_t(p.n_layers) * p.n_experts, 0), layer(p.n_layers, 0);
  for (size_t i = 0; i < logs.size(); ++i) {
    const RoutingLogHeader& h = logs[i].header;
    if (h.n_layers != p.n_layers || h.n_experts != p.n_experts)
      throw ConfigError("expert prior: routing log " + std::to_string(i + 1) + " has " +
                        std::to_string(h.n_layers) + " layers x " + std::to_string(h.n_experts) +
                        " experts, the first " + std::to_string(p.n_layers) + " x " +
                        std::to_string(p.n_experts));
    if (h.model_hash != p.model_hash) p.model_hash = 0;  // logs of several models: not bound
    for (const RoutingRecord& r : logs[i].records) {
      ++p.tokens;
      for (uint16_t id : r.ids) ++count[size_t(r.layer) * p.n_experts + id], ++layer[r.layer];
    }
  }
  p.share.resize(count.size());
  for (size_t k = 0; k < count.size(); ++k) {
    const double n = layer[k / p.n_experts];
    p.share[k] = n > 0 ? float(count[k] / n) : 0.0f;
  }
  return p;
}

std::string encode_expert_prior(const ExpertPrior& p) {
  MOE_ASSERT(p.share.size() == size_t(p.n_layers) * p.n_experts, "expert prior: share size");
  std::string out(kExpertPriorMagic, 8);
  put(out, kExpertPriorVersion);
  put(out, p.n_layers);
  put(out, p.n_experts);
  put(out, uint32_t{0});
  put(out, p.model_hash);
  put(out, p.tokens);
  for (float s : p.share) put(out, s);
  put(out, uint64_t(XXH64(out.data(), out.size(), 0)));
  return out;
}

ExpertPrior decode_expert_prior(std::string_view bytes, const std::filesystem::path& path) {
  auto bad = [&](const std::string& what) {
    return FormatError("expert prior " + path.string() + ": " + what);
  };
  if (bytes.size() < kHeaderBytes + kChecksumBytes)
    throw bad(std::to_string(bytes.size()) + " bytes, shorter than the " +
              std::to_string(kHeaderBytes + kChecksumBytes) + "-byte header and checksum");
  if (std::memcmp(bytes.data(), kExpertPriorMagic, 8) != 0) throw bad("bad magic (not MOEPRIOR)");
  if (const uint32_t v = get<uint32_t>(bytes, 8); v != kExpertPriorVersion)
    throw bad("version " + std::to_string(v) + ", this build reads " + std::to_string(kExpertPriorVersion));
  ExpertPrior p;
  p.n_layers = get<uint32_t>(bytes, 12);
  p.n_experts = get<uint32_t>(bytes, 16);
  if (p.n_layers == 0 || p.n_layers > kMaxDim || p.n_experts == 0 || p.n_experts > kMaxDim)
    throw bad("n_layers " + std::to_string(p.n_layers) + ", n_experts " + std::to_string(p.n_experts) +
              " (each must be 1.." + std::to_string(kMaxDim) + ")");
  if (get<uint32_t>(bytes, 20) != 0) throw bad("reserved field at offset 20 is not 0");
  const uint64_t n = uint64_t(p.n_layers) * p.n_experts;  // < 2^32: no overflow below
  const uint64_t want = kHeaderBytes + 4 * n + kChecksumBytes;
  if (bytes.size() != want)
    throw bad(std::to_string(bytes.size()) + " bytes, " + std::to_string(p.n_layers) + " x " +
              std::to_string(p.n_experts) + " experts need exactly " + std::to_string(want));
  if (get<uint64_t>(bytes, size_t(want - kChecksumBytes)) != XXH64(bytes.data(), size_t(want - kChecksumBytes), 0))
    throw bad("checksum mismatch (corrupt or truncated)");
  p.model_hash = get<uint64_t>(bytes, 24);
  p.tokens = get<uint64_t>(bytes, 32);
  p.share.resize(size_t(n));
  for (uint32_t l = 0; l < p.n_layers; ++l) {
    double sum = 0;
    for (uint32_t e = 0; e < p.n_experts; ++e) {
      const size_t k = size_t(l) * p.n_experts + e;
      const float s = get<float>(bytes, kHeaderBytes + 4 * k);
      if (!std::isfinite(s) || s < 0 || s > 1)
        throw bad("share of layer " + std::to_string(l) + " expert " + std::to_string(e) +
                  " is " + std::to_string(s) + " (must be in [0, 1])");
      p.share[k] = s;
      sum += s;
    }
    if (sum != 0 && std::fabs(sum - 1) > 1e-3)
      throw bad("layer " + std::to_string(l) + "'s shares sum to " + std::to_string(sum) + ", not 1 or 0");
  }
  return p;
}

void write_expert_prior(const std::filesystem::path& path, const ExpertPrior& p) {
  write_file_atomic(path, encode_expert_prior(p));
}

ExpertPrior read_expert_prior(const std::filesystem::path& path) {
  // read_file caps the read (1 GiB: 268M experts); the exact size is checked on decode.
  return decode_expert_prior(read_file(path), path);
}

}  // namespace moestream
