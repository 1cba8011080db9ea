#include "pull.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#if CB_HAVE_DOWNLOAD
#include <openssl/evp.h>

#include "download.h"
#endif

#include "app.h"
#include "json_writer.h"
#include "model_catalog.h"
#include "printable.h"
#include "progress.h"

namespace rag {
namespace {

// Size of a regular file, or -1 when there is none at `path`.
int64_t file_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return -1;
  return static_cast<int64_t>(st.st_size);
}

// What the models directory holds of one catalogue model.
struct Presence {
  std::string path;
  std::string status;  // present, size_differs, partial, missing
  int64_t bytes = 0;   // of the file, or of the partial download
};

Presence presence(const std::string& dir, const cbs::CatalogModel& m) {
  Presence p;
  p.path = dir + "/" + m.file;
  const int64_t size = file_size(p.path);
  const int64_t part = file_size(p.path + ".part");
  if (size >= 0) {
    p.status = static_cast<uint64_t>(size) == m.size_bytes ? "present" : "size_differs";
    p.bytes = size;
  } else if (part >= 0) {
    p.status = "partial";
    p.bytes = part;
  } else {
    p.status = "missing";
  }
  return p;
}

}  // namespace

int run_models(const ModelsOptions& options) {
  const std::string dir = cbs::models_dir(options.models_dir);
  const cbs::CatalogModel& def = cbs::default_catalog_model();
  if (options.json) {
    std::vector<cbs::JsonObject> rows;
    for (const cbs::CatalogModel& m : cbs::model_catalog()) {
      const Presence p = presence(dir, m);
      cbs::JsonObject row;
      row.add("name", m.name)
          .add("file", m.file)
          .add("size_bytes", static_cast<int64_t>(m.size_bytes))
          .add("sha256", m.sha256)
          .add("licence", m.licence)
          .add("url", m.url)
          .add("description", m.description)
          .add("default", &m == &def)
          .add("path", p.path)
          .add("present", p.status == "present")
          .add("status", p.status)
          .add("bytes_on_disk", p.bytes);
      rows.push_back(row);
    }
    cbs::JsonObject out;
    out.add("models_dir", dir).add("default", def.name).add("models", rows);
    std::printf("%s\n", out.str().c_str());
    return 0;
  }
  std::printf("models directory: %s (--models-dir DIR, else $CB_MODELS_DIR, else models/)\n\n",
              cbs::printable(dir).c_str());
  for (const cbs::CatalogModel& m : cbs::model_catalog()) {
    const Presence p = presence(dir, m);
    std::string status;
    if (p.status == "present") {
      status = "present";
    } else if (p.status == "size_differs") {
      status = "present, but " + std::to_string(p.bytes) + " bytes, not the catalogue's size";
    } else if (p.status == "partial") {
      status = "partly downloaded (" + std::to_string(p.bytes) + " of " +
               std::to_string(m.size_bytes) + " bytes; pull resumes it)";
    } else {
      status = "not downloaded";
    }
    std::printf("%s%s: %s\n", m.name, &m == &def ? " (default)" : "", status.c_str());
    std::printf("  %s\n", m.description);
    std::printf("  file     %s, %llu bytes (%s)\n", m.file,
                static_cast<unsigned long long>(m.size_bytes),
                human_bytes(static_cast<double>(m.size_bytes)).c_str());
    std::printf("  sha256   %s\n", m.sha256);
    std::printf("  licence  %s\n", m.licence);
    std::printf("  url      %s\n\n", m.url);
  }
  std::printf("rag_assistant pull NAME downloads one; --model NAME uses it.\n");
  return 0;
}

bool is_sha256_hex(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return false;
  return true;
}

std::string url_file_name(std::string_view url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string_view::npos) return "";
  std::string_view rest = url.substr(scheme + 3);
  const size_t end = rest.find_first_of("?#");
  if (end != std::string_view::npos) rest = rest.substr(0, end);
  const size_t path = rest.find('/');
  if (path == std::string_view::npos) return "";  // no path: nothing names a file
  const std::string_view segment = rest.substr(rest.rfind('/') + 1);
  std::string name;
  for (size_t i = 0; i < segment.size(); ++i) {
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    if (segment[i] == '%' && i + 2 < segment.size() && hex(segment[i + 1]) >= 0 &&
        hex(segment[i + 2]) >= 0) {
      name.push_back(static_cast<char>(hex(segment[i + 1]) * 16 + hex(segment[i + 2])));
      i += 2;
    } else {
      name.push_back(segment[i]);
    }
  }
  if (name.empty() || name[0] == '.') return "";
  for (unsigned char c : name)
    if (c < 0x20 || c == 0x7f || c == '/' || c == '\\') return "";
  return name;
}

std::string to_hex(const unsigned char* bytes, size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(digits[bytes[i] >> 4]);
    out.push_back(digits[bytes[i] & 15]);
  }
  return out;
}

#if CB_HAVE_DOWNLOAD

namespace {

// An OpenSSL digest context, freed on every path.
struct Sha256 {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  Sha256() {
    if (ctx == nullptr || EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1)
      throw Error("cannot start a SHA-256 digest (OpenSSL)");
  }
  ~Sha256() { EVP_MD_CTX_free(ctx); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t n) {
    if (EVP_DigestUpdate(ctx, data, n) != 1) throw Error("SHA-256 digest failed (OpenSSL)");
  }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(ctx, md, &n) != 1) throw Error("SHA-256 digest failed (OpenSSL)");
    return to_hex(md, n);
  }
};

}  // namespace

std::string sha256_hex(std::string_view data) {
  Sha256 d;
  d.update(data.data(), data.size());
  return d.hex();
}

std::string sha256_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot read " + path + ": " + errno_text(errno));
  Sha256 d;
  std::vector<unsigned char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw Error("cannot read " + path + ": " + errno_text(e));
    }
    if (n == 0) break;
    d.update(buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return d.hex();
}

bool download_supported() {
  return true;
}

namespace {

// mkdir -p.
void make_dirs(const std::string& dir) {
  std::string path;
  size_t i = 0;
  while (i <= dir.size()) {
    const size_t slash = dir.find('/', i);
    path = dir.substr(0, slash == std::string::npos ? dir.size() : slash);
    i = slash == std::string::npos ? dir.size() + 1 : slash + 1;
    if (path.empty()) continue;
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
      throw Error("cannot create the models directory " + path + ": " + errno_text(errno));
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw Error("the models directory " + dir + " is not a directory");
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// What to fetch and how to check it.
struct PullPlan {
  std::string url;
  std::string file;
  std::string sha256;           // expected, lowercase; empty: unverified
  int64_t size = -1;            // expected size, when the catalogue knows it
  const char* sha_source = "";  // where the expected hash comes from
};

PullPlan plan_pull(const PullOptions& o) {
  PullPlan plan;
  const cbs::CatalogModel* m = nullptr;
  if (o.target.find("://") != std::string::npos) {
    if (o.target.rfind("http://", 0) != 0 && o.target.rfind("https://", 0) != 0)
      throw Error("only http:// and https:// URLs can be pulled: " + o.target);
    plan.url = o.target;
    plan.file = url_file_name(o.target);
    if (plan.file.empty())
      throw Error("the URL " + o.target + " does not end in a file name to save the model as");
    m = cbs::find_catalog_file(plan.file);
  } else {
    m = cbs::find_catalog_model(o.target);
    if (m == nullptr)
      throw Error("unknown model '" + o.target +
                  "' (rag_assistant models lists the known ones; pull URL --sha256 HEX "
                  "fetches any other)");
    plan.url = m->url;
    plan.file = m->file;
  }
  std::string given = o.sha256;
  for (char& c : given) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!given.empty()) {
    plan.sha256 = given;
    plan.sha_source = "--sha256";
    if (m != nullptr && given == m->sha256) plan.size = static_cast<int64_t>(m->size_bytes);
  } else if (m != nullptr) {
    plan.sha256 = m->sha256;
    plan.sha_source = "the model catalogue";
    plan.size = static_cast<int64_t>(m->size_bytes);
  }
  return plan;
}

}  // namespace

int run_pull(const PullOptions& options) {
  const PullPlan plan = plan_pull(options);
  const std::string dir = cbs::models_dir(options.models_dir);
  make_dirs(dir);
  const std::string dest = dir + "/" + plan.file;
  const std::string part_path = dest + ".part";
  const std::string shown_dest = cbs::printable(dest);

  if (file_size(dest) >= 0 && !options.force) {
    if (plan.sha256.empty()) {
      std::printf(
          "%s is already there (not verified: no SHA-256 is known for it); --force "
          "downloads it again\n",
          shown_dest.c_str());
      return 0;
    }
    const std::string have = sha256_file(dest);
    if (have == plan.sha256) {
      std::printf("%s is already there, SHA-256 verified: nothing to do\n", shown_dest.c_str());
      return 0;
    }
    warn(dest + " has SHA-256 " + have + ", not " + plan.sha256 +
         "; downloading it again (it is replaced only by a verified file)");
  }

  PartFile part(part_path);
  if (options.force && part.size() > 0) part.truncate();
  if (plan.size >= 0 && part.size() > static_cast<uint64_t>(plan.size)) {
    warn(part_path + " is larger than the model (" + std::to_string(plan.size) +
         " bytes): starting again");
    part.truncate();
  }
  // A partial download that is already whole (a pull stopped while
  // verifying) needs no request when its hash is right.
  bool complete = false;
  if (plan.size > 0 && part.size() == static_cast<uint64_t>(plan.size)) {
    if (sha256_file(part_path) == plan.sha256) {
      complete = true;
    } else {
      warn(part_path + " is complete but its SHA-256 is wrong: starting again");
      part.truncate();
    }
  }

  uint64_t have = part.size();
  int64_t total = plan.size;
  if (!complete) {
    std::fprintf(stderr, "downloading %s\n  to %s%s\n", cbs::printable(plan.url).c_str(),
                 shown_dest.c_str(),
                 have > 0 ? (" (resuming after " + std::to_string(have) + " bytes)").c_str() : "");
    have = download(plan.url, plan.file, part, part_path, have, total);
  }
  part.close_synced();

  const std::string got = sha256_file(part_path);
  if (!plan.sha256.empty() && got != plan.sha256) {
    ::unlink(part_path.c_str());
    throw Error("SHA-256 mismatch for " + plan.file + ": expected " + plan.sha256 + " (from " +
                plan.sha_source + "), got " + got + "; the download was deleted" +
                (file_size(dest) >= 0 ? " and " + dest + " left as it was" : ""));
  }
  if (::rename(part_path.c_str(), dest.c_str()) != 0)
    throw Error("cannot move " + part_path + " to " + dest + ": " + errno_text(errno));
  sync_dir(dir);
  if (plan.sha256.empty()) {
    warn("no SHA-256 is known for " + plan.url + ": " + dest + " is unverified (its SHA-256 is " +
         got + "; pass --sha256 HEX to check a download)");
    std::printf("%s: downloaded, %llu bytes, SHA-256 %s (unverified)\n", shown_dest.c_str(),
                static_cast<unsigned long long>(have), got.c_str());
  } else {
    std::printf("%s: downloaded, %llu bytes, SHA-256 verified\n", shown_dest.c_str(),
                static_cast<unsigned long long>(have));
  }
  return 0;
}

#else  // no libcurl or no OpenSSL

bool download_supported() {
  return false;
}

std::string sha256_hex(std::string_view) {
  throw Error("built without download support (no OpenSSL)");
}

std::string sha256_file(const std::string&) {
  throw Error("built without download support (no OpenSSL)");
}

int run_pull(const PullOptions&) {
  throw Error(
      "pull: built without download support (libcurl or OpenSSL was missing at build time: "
      "install libcurl4-openssl-dev and libssl-dev, e.g. with scripts/setup.sh packages, and "
      "build again)");
}

#endif

}  // namespace rag
