// Test support: a fixture folder's manifest.json (tests/fixtures/gguf, tests/fixtures/gguf_hf),
// which lists its fixtures under "fixtures", each with a "name". Header-only.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/file_util.h"

namespace moestream::test {

// The folder's manifest, or an empty object when it has none (a test then skips or, in strict
// mode, fails: tests/support/strict_skip.h).
inline nlohmann::json fixture_manifest(const std::filesystem::path& dir) {
  const std::filesystem::path p = dir / "manifest.json";
  return std::filesystem::exists(p) ? nlohmann::json::parse(read_file(p)) : nlohmann::json::object();
}

// The names of its fixtures, in the manifest's order; none without a manifest.
inline std::vector<std::string> fixture_names(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  const nlohmann::json m = fixture_manifest(dir);
  if (m.contains("fixtures"))
    for (const auto& f : m["fixtures"]) names.push_back(f["name"].get<std::string>());
  return names;
}

}  // namespace moestream::test
