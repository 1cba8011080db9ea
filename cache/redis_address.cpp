// The Redis address syntax (redis_store.h), apart from the store: it needs
// no hiredis, so every build parses and checks an address, also one without
// the Redis tier (CB_REDIS=OFF), which then refuses it by name.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "cache/redis_store.h"
#include "platform/error.h"

namespace cb::cache {

std::string redacted_redis_address(const std::string& text) {
  const size_t scheme = text.find("://");
  const size_t from = scheme == std::string::npos ? 0 : scheme + 3;
  if (const size_t at = text.rfind('@'); at != std::string::npos && at >= from)
    return text.substr(0, from) + "***" + text.substr(at);
  // No '@': a "port" that is not a number may be a password typed without it.
  const size_t end = std::min(text.size(), text.find('/', from));
  const size_t colon = end == 0 ? std::string::npos : text.rfind(':', end - 1);
  if (colon == std::string::npos || colon < from) return text;
  const std::string port = text.substr(colon + 1, end - colon - 1);
  if (!port.empty() && port.find_first_not_of("0123456789") == std::string::npos) return text;
  return text.substr(0, colon + 1) + "***" + text.substr(end);
}

void parse_redis_address(const std::string& text, RedisOptions& options) {
  // Every message names the address without its credentials.
  const std::string shown = redacted_redis_address(text);
  std::string rest = text;
  const std::string scheme = "redis://";
  if (rest.rfind("rediss://", 0) == 0)
    fail(ErrorCode::kInvalidArgument, "redis address '" + shown +
                                          "': TLS (rediss://) is not supported by this build's "
                                          "hiredis");
  const bool url = rest.rfind(scheme, 0) == 0;
  if (url) {
    rest = rest.substr(scheme.size());
    if (const size_t at = rest.rfind('@'); at != std::string::npos) {
      const std::string userinfo = rest.substr(0, at);
      rest = rest.substr(at + 1);
      if (const size_t colon = userinfo.find(':'); colon != std::string::npos) {
        options.username = userinfo.substr(0, colon);
        options.password = userinfo.substr(colon + 1);
      } else {
        options.password = userinfo;
      }
    }
    if (const size_t slash = rest.find('/'); slash != std::string::npos) {
      const std::string db = rest.substr(slash + 1);
      rest = rest.substr(0, slash);
      if (!db.empty()) {
        char* end = nullptr;
        const long n = std::strtol(db.c_str(), &end, 10);
        if (*end != '\0' || n < 0 || n > 65535)
          fail(ErrorCode::kInvalidArgument, "redis address '" + shown + "': bad database number");
        options.db = static_cast<int>(n);
      }
    }
  }
  if (const size_t colon = rest.rfind(':'); colon != std::string::npos) {
    const std::string port = rest.substr(colon + 1);
    char* end = nullptr;
    const long n = std::strtol(port.c_str(), &end, 10);
    if (port.empty() || *end != '\0' || n <= 0 || n > 65535)
      fail(ErrorCode::kInvalidArgument, "redis address '" + shown + "': bad port");
    options.port = static_cast<int>(n);
    rest = rest.substr(0, colon);
  }
  if (rest.empty()) fail(ErrorCode::kInvalidArgument, "redis address '" + shown + "': no host");
  options.host = rest;
}

}  // namespace cb::cache
