// Implementation of runtime/server/cors.h.
#include "runtime/server/cors.h"

#include <httplib.h>

#include <algorithm>
#include <memory>

namespace moestream {

void enable_cors(httplib::Server& http, std::vector<std::string> origins) {
  const auto allowed = std::make_shared<const std::vector<std::string>>(std::move(origins));
  const auto ok = [allowed](const std::string& origin) {
    return !origin.empty() &&
           std::any_of(allowed->begin(), allowed->end(), [&](const std::string& o) { return o == "*" || o == origin; });
  };
  const bool any = std::find(allowed->begin(), allowed->end(), "*") != allowed->end();
  http.set_post_routing_handler([ok, any](const httplib::Request& req, httplib::Response& res) {
    const std::string origin = req.get_header_value("Origin");
    if (!ok(origin)) return;
    res.set_header("Access-Control-Allow-Origin", any ? "*" : origin);
    res.set_header("Vary", "Origin");
  });
  http.Options(".*", [ok](const httplib::Request& req, httplib::Response& res) {
    res.status = 204;
    res.set_header("Allow", "GET, POST, OPTIONS");
    if (!ok(req.get_header_value("Origin"))) return;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    const std::string asked = req.get_header_value("Access-Control-Request-Headers");
    res.set_header("Access-Control-Allow-Headers",
                   asked.empty() ? "Authorization, Content-Type, x-api-key, anthropic-version" : asked);
    res.set_header("Access-Control-Max-Age", "600");
  });
}

}  // namespace moestream
