// `rag_assistant models` (the model catalogue and what the models directory
// holds) and `rag_assistant pull` (download a model, resumably, and install
// it only when its SHA-256 is right).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace rag {

struct ModelsOptions {
  std::string models_dir;  // --models-dir; empty: $CB_MODELS_DIR, else models/
  bool json = false;       // --json
};

struct PullOptions {
  std::string target;      // a catalogue name (or file name) or an http(s) URL
  std::string sha256;      // --sha256, lowercase hex; empty: the catalogue's
  std::string models_dir;  // --models-dir; empty: $CB_MODELS_DIR, else models/
  bool force = false;      // --force: download even when the file is there
};

// Lists the catalogue on stdout; returns the exit status.
int run_models(const ModelsOptions& options);

// Downloads options.target into the models directory; returns the exit
// status.  Throws Error on failure (and when built without libcurl).
int run_pull(const PullOptions& options);

// True when this build can download (it was built with libcurl and OpenSSL).
bool download_supported();

// True when `s` is 64 hexadecimal digits (either case).
bool is_sha256_hex(std::string_view s);

// The file name an http(s) URL names: its path's last segment, percent-
// decoded, without query or fragment.  "" when that is no usable file name
// (empty, "." or "..", hidden, or holding a slash, a backslash or a control
// character).
std::string url_file_name(std::string_view url);

// Lowercase hexadecimal of `n` bytes.
std::string to_hex(const unsigned char* bytes, size_t n);

// SHA-256 of `data` / of the file at `path`, as lowercase hex (OpenSSL).
// Throw Error when the build has no OpenSSL or the file cannot be read.
std::string sha256_hex(std::string_view data);
std::string sha256_file(const std::string& path);

}  // namespace rag
