#include "json_writer.h"

#include <cmath>
#include <cstdio>

#include "platform/utf8.h"

namespace cbs {

void json_escape(std::string_view s, std::string& out) {
  out.push_back('"');
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        default:
          if (c < 0x20 || c == 0x7F) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
          } else {
            out.push_back(static_cast<char>(c));
          }
      }
      ++i;
      continue;
    }
    // An invalid sequence's maximal subpart becomes one U+FFFD.
    const cb::Utf8Char u = cb::utf8_char(s, i);
    if (!u.valid) {
      out += "\xEF\xBF\xBD";
    } else {
      out.append(s.substr(i, u.len));
    }
    i += u.len;
  }
  out.push_back('"');
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

void JsonObject::key(std::string_view k) {
  if (!body_.empty()) body_ += ", ";
  json_escape(k, body_);
  body_ += ": ";
}

JsonObject& JsonObject::add(std::string_view k, std::string_view value) {
  key(k);
  json_escape(value, body_);
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, int64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, double value) {
  key(k);
  body_ += json_number(value);
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, bool value) {
  key(k);
  body_ += value ? "true" : "false";
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, const std::vector<int32_t>& values) {
  key(k);
  body_ += "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) body_ += ", ";
    body_ += std::to_string(values[i]);
  }
  body_ += "]";
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, const std::vector<double>& values) {
  key(k);
  body_ += "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) body_ += ", ";
    body_ += json_number(values[i]);
  }
  body_ += "]";
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, const JsonObject& nested) {
  key(k);
  body_ += nested.str();
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, const std::vector<JsonObject>& objects) {
  key(k);
  body_ += "[";
  for (size_t i = 0; i < objects.size(); ++i) {
    if (i) body_ += ", ";
    body_ += objects[i].str();
  }
  body_ += "]";
  return *this;
}

JsonObject& JsonObject::add_null(std::string_view k) {
  key(k);
  body_ += "null";
  return *this;
}

}  // namespace cbs
