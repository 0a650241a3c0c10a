// CORS for the HTTP API (`cors_origin`): which browser origins may read the answers, and the
// preflight (OPTIONS) answer. Off (no Access-Control-* headers) while no origin is allowed.
#pragma once

#include <string>
#include <vector>

namespace httplib {
class Server;
}

namespace moestream {

// Allowed origins ("*" = any) get Access-Control-Allow-Origin and Vary: Origin on every answer; an
// OPTIONS request to any path is answered 204 (Allow), plus the allowed methods, the headers it
// asked for and Max-Age when its origin is allowed. The caller lets OPTIONS pass without an API
// key: browsers send none with a preflight.
void enable_cors(httplib::Server& http, std::vector<std::string> origins);

}  // namespace moestream
