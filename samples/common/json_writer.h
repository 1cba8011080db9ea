// A small JSON writer for the samples: one flat-or-nested object built in
// order, printed as a single line.  Strings are escaped per RFC 8259
// (quotes, backslash, control characters); bytes that are not valid UTF-8
// are replaced by U+FFFD so the output always parses.  Non-finite numbers
// are written as null.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cbs {

// Appends `s` to `out` as a quoted JSON string.
void json_escape(std::string_view s, std::string& out);

class JsonObject {
 public:
  JsonObject& add(std::string_view key, std::string_view value);
  JsonObject& add(std::string_view key, const char* value) {
    return add(key, std::string_view(value));
  }
  JsonObject& add(std::string_view key, int64_t value);
  JsonObject& add(std::string_view key, int32_t value) {
    return add(key, static_cast<int64_t>(value));
  }
  JsonObject& add(std::string_view key, double value);
  JsonObject& add(std::string_view key, bool value);
  JsonObject& add(std::string_view key, const std::vector<int32_t>& values);
  JsonObject& add(std::string_view key, const std::vector<double>& values);
  JsonObject& add(std::string_view key, const JsonObject& nested);
  JsonObject& add(std::string_view key, const std::vector<JsonObject>& objects);
  JsonObject& add_null(std::string_view key);

  // The object as one line of JSON (no trailing newline).
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void key(std::string_view k);
  std::string body_;
};

// A number as JSON text (null when not finite).
std::string json_number(double v);

}  // namespace cbs
