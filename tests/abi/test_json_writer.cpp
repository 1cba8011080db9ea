// The samples' JSON writer: escaping of quotes, backslashes and control
// characters, U+FFFD for invalid UTF-8, null for non-finite numbers.
#include <cmath>
#include <cstdio>
#include <string>

#include "json_writer.h"

namespace {

int g_failed = 0;
int g_passed = 0;

std::string esc(const std::string& s) {
  std::string out;
  cbs::json_escape(s, out);
  return out;
}

void expect(const std::string& got, const std::string& want, const char* what) {
  if (got == want) {
    ++g_passed;
  } else {
    ++g_failed;
    std::fprintf(stderr, "FAIL %s: got %s want %s\n", what, got.c_str(), want.c_str());
  }
}

}  // namespace

int main() {
  expect(esc("plain"), "\"plain\"", "plain");
  expect(esc("a\"b\\c"), "\"a\\\"b\\\\c\"", "quote and backslash");
  expect(esc("\n\r\t\b\f"), "\"\\n\\r\\t\\b\\f\"", "short escapes");
  expect(esc(std::string("\x01\x1f\x7f", 3)), "\"\\u0001\\u001f\\u007f\"", "control chars");
  expect(esc(std::string("a\0b", 3)), "\"a\\u0000b\"", "NUL");
  expect(esc("Caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80"),
         "\"Caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80\"", "valid UTF-8 kept");
  expect(esc("a\xff"
             "b"),
         "\"a\xef\xbf\xbd"
         "b\"",
         "invalid byte");
  expect(esc("\xc3"), "\"\xef\xbf\xbd\"", "truncated 2-byte sequence");
  expect(esc("\xe6\x97"), "\"\xef\xbf\xbd\"", "truncated 3-byte sequence (one U+FFFD)");
  expect(esc("\xc0\xaf"), "\"\xef\xbf\xbd\xef\xbf\xbd\"", "overlong");
  expect(esc("\xed\xa0\x80"), "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"", "surrogate");
  expect(esc("\xf4\x90\x80\x80"), "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"",
         "above U+10FFFF");
  expect(cbs::json_number(NAN), "null", "NaN");
  expect(cbs::json_number(INFINITY), "null", "inf");
  expect(cbs::json_number(1.5), "1.5", "number");
  cbs::JsonObject o;
  o.add("s", "x")
      .add("i", int64_t{-3})
      .add("d", 0.25)
      .add("b", true)
      .add("ids", std::vector<int32_t>{1, 2});
  expect(o.str(), "{\"s\": \"x\", \"i\": -3, \"d\": 0.25, \"b\": true, \"ids\": [1, 2]}", "object");
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
