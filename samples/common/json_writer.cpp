#include "json_writer.h"

#include <cmath>
#include <cstdio>

namespace cbs {
namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if the bytes
// there do not start one.  *bad receives how many bytes to replace by one
// U+FFFD when invalid (the maximal valid prefix, at least 1).
size_t utf8_sequence(std::string_view s, size_t i, size_t* bad) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  *bad = 1;
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the 2nd byte
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;  // no overlong forms
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return 0;
  }
  for (size_t k = 1; k < len; ++k) {
    if (i + k >= s.size()) return 0;
    const unsigned char x = b(i + k);
    const bool ok = k == 1 ? (x >= lo && x <= hi) : (x >= 0x80 && x <= 0xBF);
    if (!ok) return 0;
    *bad = k + 1;
  }
  return len;
}

}  // namespace

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
    size_t bad = 1;
    const size_t len = utf8_sequence(s, i, &bad);
    if (len == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += bad;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
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
