// Implementation of loader/io/io_profile.h.
#include "loader/io/io_profile.h"

#include <nlohmann/json.hpp>

#include <cmath>

#include "common/error.h"
#include "common/option_ref.h"
#include "common/file_util.h"

namespace moestream {
namespace {

struct Field {
  const char* name;
  double IoProfile::*member;
};
constexpr Field kFields[] = {{"op_latency_us", &IoProfile::op_latency_us},
                             {"iops_limit", &IoProfile::iops_limit},
                             {"queue_depth", &IoProfile::queue_depth},
                             {"bandwidth_gbps", &IoProfile::bandwidth_gbps},
                             {"single_read_gbps", &IoProfile::single_read_gbps}};

void check_value(const std::string& where, const char* field, double v) {
  if (!std::isfinite(v)) throw FormatError(where + ": " + field + " is not a finite number");
  if (v <= 0) throw FormatError(where + ": " + field + " is " + std::to_string(v) + ", must be > 0");
}

}  // namespace

void validate_io_profile(const IoProfile& p, const std::string& where) {
  for (const Field& f : kFields) check_value(where, f.name, p.*f.member);
}

std::string io_profile_json(const IoProfile& p, const std::string& source_json) {
  validate_io_profile(p, "io profile");
  nlohmann::ordered_json j;
  j["format"] = kIoProfileFormat;
  j["version"] = kIoProfileVersion;
  for (const Field& f : kFields) j[f.name] = p.*f.member;
  if (!source_json.empty()) j["source"] = nlohmann::ordered_json::parse(source_json);
  return j.dump(1) + "\n";
}

IoProfile parse_io_profile(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(where + ": not JSON: " + e.what());
  }
  if (j.is_object() && !j.contains("format") && j.contains("profile")) j = j["profile"];
  if (!j.is_object()) throw FormatError(where + ": not a JSON object");
  if (!j.contains("format")) {
    throw FormatError(where + ": no \"format\": \"" + kIoProfileFormat + "\" (" +
                      (j.contains("sweep") ? "a bench_io results file without a profile: rerun bench_io, which "
                                             "now writes one (" + option_ref("profile_out") + ")"
                                           : "not an I/O profile") + ")");
  }
  if (!j["format"].is_string() || j["format"].get<std::string>() != kIoProfileFormat)
    throw FormatError(where + ": format is " + j["format"].dump() + ", expected \"" + kIoProfileFormat + "\"");
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int64_t>() != kIoProfileVersion)
    throw FormatError(where + ": version is " + (j.contains("version") ? j["version"].dump() : "missing") +
                      ", expected " + std::to_string(kIoProfileVersion));
  IoProfile p;
  for (const Field& f : kFields) {
    if (!j.contains(f.name)) throw FormatError(where + ": " + f.name + " is missing");
    const nlohmann::json& v = j[f.name];
    // JSON has no NaN or infinity; nlohmann writes them as null, so null is "not finite".
    if (v.is_null()) throw FormatError(where + ": " + f.name + " is not a finite number (null)");
    if (!v.is_number()) throw FormatError(where + ": " + f.name + " is " + v.dump() + ", not a number");
    p.*f.member = v.get<double>();
  }
  validate_io_profile(p, where);
  return p;
}

IoProfile load_io_profile(const std::filesystem::path& path) {
  return parse_io_profile(read_file(path), path.string());
}

void save_io_profile(const std::filesystem::path& path, const IoProfile& p, const std::string& source_json) {
  validate_io_profile(p, path.string());
  write_file_atomic(path, io_profile_json(p, source_json));
}

}  // namespace moestream
