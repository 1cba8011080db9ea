#include "pull.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#if CB_HAVE_DOWNLOAD
#include <curl/curl.h>
#include <openssl/evp.h>
#endif

#include "app.h"
#include "json_writer.h"
#include "model_catalog.h"
#include "printable.h"

namespace rag {
namespace {

// "1.1 GB", "98.4 MB", "512 B": sizes for people (powers of 1000, as disks
// and download pages count).
std::string human_bytes(double n) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (n >= 1000.0 && u < 4) {
    n /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", n, units[u]);
  return buf;
}

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

std::string errno_text(int e) {
  return std::strerror(e);
}

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

volatile std::sig_atomic_t g_interrupted = 0;

void on_interrupt(int) {
  g_interrupted = 1;
}

// SIGINT and SIGTERM set a flag that the transfer checks, so that Ctrl-C
// ends the download between two writes and the partial file stays whole.
class InterruptGuard {
 public:
  InterruptGuard() {
    g_interrupted = 0;
    struct sigaction sa {};
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~InterruptGuard() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

// Bytes, percent, rate and ETA on stderr: redrawn in place at most four
// times a second at a terminal; elsewhere (a log) only a final line.
class ByteProgress {
 public:
  ByteProgress(std::string label, uint64_t already)
      : label_(std::move(label)),
        already_(already),
        tty_(::isatty(STDERR_FILENO) != 0),
        start_(std::chrono::steady_clock::now()) {}

  void set_start(uint64_t already) { already_ = already; }

  // `have`: bytes of the file so far; `total`: its size, or -1.
  void update(uint64_t have, int64_t total) {
    have_ = have;
    total_ = total;
    if (!tty_) return;
    const auto now = std::chrono::steady_clock::now();
    if (drawn_ && now - last_draw_ < std::chrono::milliseconds(250)) return;
    last_draw_ = now;
    drawn_ = true;
    std::fprintf(stderr, "\r%s\x1b[K", line(false).c_str());
    std::fflush(stderr);
  }

  // Ends the display: the last state on its own line.
  void finish(bool complete) {
    if (tty_ && drawn_) {
      std::fprintf(stderr, "\r%s\x1b[K\n", line(complete).c_str());
    } else if (complete) {
      std::fprintf(stderr, "%s\n", line(true).c_str());
    }
    std::fflush(stderr);
  }

 private:
  std::string line(bool complete) const {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double fetched = static_cast<double>(have_ >= already_ ? have_ - already_ : 0);
    const double rate = s > 0.0 ? fetched / s : 0.0;
    std::string out = label_ + "  " + human_bytes(static_cast<double>(have_));
    if (total_ > 0) {
      char pct[16];
      std::snprintf(pct, sizeof pct, "%.0f%%", 100.0 * static_cast<double>(have_) / total_);
      out += " / " + human_bytes(static_cast<double>(total_)) + "  " + pct;
    }
    out += "  " + human_bytes(rate) + "/s";
    if (complete) {
      char t[32];
      std::snprintf(t, sizeof t, "  in %.1f s", s);
      out += t;
    } else if (total_ > 0 && rate > 0.0 && static_cast<uint64_t>(total_) > have_) {
      const long eta = static_cast<long>((static_cast<double>(total_) - have_) / rate + 0.5);
      char t[48];
      if (eta >= 3600)
        std::snprintf(t, sizeof t, "  ETA %ldh%02ldm", eta / 3600, eta / 60 % 60);
      else
        std::snprintf(t, sizeof t, "  ETA %ldm%02lds", eta / 60, eta % 60);
      out += t;
    }
    return out;
  }

  std::string label_;
  uint64_t already_;
  uint64_t have_ = 0;
  int64_t total_ = -1;
  bool tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// One HTTP request's state, shared with libcurl's callbacks.
struct Transfer {
  int fd = -1;
  uint64_t offset = 0;   // bytes of the .part this request continues from
  uint64_t written = 0;  // bytes this request wrote
  bool body_started = false;
  bool restarted = false;   // the server ignored the range: the .part was emptied
  bool http_error = false;  // a status other than 200/206: nothing written
  bool bad_range = false;   // a 206 for a range other than the one asked for
  long status = 0;
  std::string reason;
  int64_t range_start = -1, range_total = -1;  // Content-Range of a 206
  int64_t total = -1;                          // the whole file's size, when known
  int write_errno = 0;
  CURL* curl = nullptr;
  ByteProgress* progress = nullptr;
};

bool starts_with_nocase(const std::string& s, const char* prefix) {
  const size_t n = std::strlen(prefix);
  if (s.size() < n) return false;
  for (size_t i = 0; i < n; ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  return true;
}

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string line(data, size * n);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  if (starts_with_nocase(line, "http/")) {
    // A new response (after a redirect, or a 100 Continue): forget the last.
    t->range_start = t->range_total = -1;
    const size_t sp = line.find(' ');
    t->status = sp == std::string::npos ? 0 : std::strtol(line.c_str() + sp + 1, nullptr, 10);
    const size_t sp2 = sp == std::string::npos ? sp : line.find(' ', sp + 1);
    t->reason = sp2 == std::string::npos ? "" : line.substr(sp2 + 1);
  } else if (starts_with_nocase(line, "content-range:")) {
    unsigned long long first = 0, last = 0, total = 0;
    const char* v = line.c_str() + std::strlen("content-range:");
    while (*v == ' ' || *v == '\t') ++v;
    if (std::sscanf(v, "bytes %llu-%llu/%llu", &first, &last, &total) == 3) {
      t->range_start = static_cast<int64_t>(first);
      t->range_total = static_cast<int64_t>(total);
    } else if (std::sscanf(v, "bytes %llu-%llu/*", &first, &last) == 2) {
      t->range_start = static_cast<int64_t>(first);
    }
  }
  return size * n;
}

// The first bytes of the body decide where they go: after the .part's bytes
// (a 206 for the range asked for), or from its start (a 200: the server
// sends the whole file).  Any other status is an error, and its body is not
// written.
bool start_body(Transfer& t) {
  t.body_started = true;
  long code = 0;
  curl_easy_getinfo(t.curl, CURLINFO_RESPONSE_CODE, &code);
  t.status = code;
  if (code == 206) {
    if (t.range_start != static_cast<int64_t>(t.offset)) {
      t.bad_range = true;
      return false;
    }
    t.total = t.range_total;
    return true;
  }
  if (code == 200) {
    if (t.offset > 0) {
      if (::ftruncate(t.fd, 0) != 0 || ::lseek(t.fd, 0, SEEK_SET) != 0) {
        t.write_errno = errno;
        return false;
      }
      t.offset = 0;
      t.restarted = true;
      t.progress->set_start(0);
    }
    curl_off_t length = -1;
    curl_easy_getinfo(t.curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
    t.total = length >= 0 ? static_cast<int64_t>(length) : -1;
    return true;
  }
  t.http_error = true;
  return false;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t bytes = size * n;
  if (!t->body_started && !start_body(*t)) return 0;  // a write error for libcurl
  size_t done = 0;
  while (done < bytes) {
    const ssize_t w = ::write(t->fd, data + done, bytes - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      t->write_errno = errno;
      return 0;  // a write error for libcurl
    }
    done += static_cast<size_t>(w);
    t->written += static_cast<uint64_t>(w);
  }
  t->progress->update(t->offset + t->written, t->total);
  return bytes;
}

int on_progress(void*, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return g_interrupted ? 1 : 0;
}

// libcurl's global state, set up once per process.
void curl_init_once() {
  static const CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (rc != CURLE_OK) throw Error(std::string("cannot start libcurl: ") + curl_easy_strerror(rc));
}

struct CurlHandle {
  CURL* h = curl_easy_init();
  ~CurlHandle() {
    if (h) curl_easy_cleanup(h);
  }
};

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

// The .part file, open for writing at its end and locked against a second
// pull of the same file.
class PartFile {
 public:
  explicit PartFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error("cannot write " + path + ": " + errno_text(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0)
      throw Error("another pull is writing " + path + " (wait for it to end)");
    const off_t end = ::lseek(fd_, 0, SEEK_END);
    if (end < 0) throw Error("cannot write " + path + ": " + errno_text(errno));
    size_ = static_cast<uint64_t>(end);
  }
  ~PartFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  PartFile(const PartFile&) = delete;
  PartFile& operator=(const PartFile&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  void truncate() {
    if (::ftruncate(fd_, 0) != 0 || ::lseek(fd_, 0, SEEK_SET) != 0)
      throw Error("cannot write " + path_ + ": " + errno_text(errno));
    size_ = 0;
  }
  // Flushes to disk and closes; a full disk shows here at the latest.
  void close_synced() {
    const int fd = fd_;
    fd_ = -1;
    if (::fsync(fd) != 0) {
      const int e = errno;
      ::close(fd);
      throw Error("cannot write " + path_ + ": " + errno_text(e));
    }
    if (::close(fd) != 0) throw Error("cannot write " + path_ + ": " + errno_text(errno));
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

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

std::string with_resume_hint(const std::string& part, uint64_t bytes) {
  if (bytes == 0) return "";
  return "; the " + std::to_string(bytes) + " bytes downloaded are kept in " + part +
         ": run the same pull again to resume";
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

  curl_init_once();
  InterruptGuard interrupt_guard;
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
    CurlHandle curl;
    if (curl.h == nullptr) throw Error("cannot start libcurl");
    // At most two requests: a server that answers the resume request with
    // 416 (the range is past its file) or with another range is asked again
    // for the whole file.
    for (int attempt = 0;; ++attempt) {
      ByteProgress progress(plan.file, have);
      Transfer t;
      t.fd = part.fd();
      t.offset = have;
      t.total = total;
      t.curl = curl.h;
      t.progress = &progress;
      char errbuf[CURL_ERROR_SIZE] = "";
      const std::string range = std::to_string(have) + "-";
      curl_easy_reset(curl.h);
      curl_easy_setopt(curl.h, CURLOPT_URL, plan.url.c_str());
      curl_easy_setopt(curl.h, CURLOPT_FOLLOWLOCATION, 1L);
      curl_easy_setopt(curl.h, CURLOPT_MAXREDIRS, 10L);
      curl_easy_setopt(curl.h, CURLOPT_PROTOCOLS_STR, "http,https");
      curl_easy_setopt(curl.h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
      curl_easy_setopt(curl.h, CURLOPT_USERAGENT, "rag_assistant (cacheblend-rt)");
      curl_easy_setopt(curl.h, CURLOPT_NOSIGNAL, 1L);
      curl_easy_setopt(curl.h, CURLOPT_ERRORBUFFER, errbuf);
      // No answer within 30 s, or under 1 kB/s for a minute, is an error
      // (the .part is kept for the next pull).
      curl_easy_setopt(curl.h, CURLOPT_CONNECTTIMEOUT, 30L);
      curl_easy_setopt(curl.h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
      curl_easy_setopt(curl.h, CURLOPT_LOW_SPEED_TIME, 60L);
      curl_easy_setopt(curl.h, CURLOPT_HEADERFUNCTION, on_header);
      curl_easy_setopt(curl.h, CURLOPT_HEADERDATA, &t);
      curl_easy_setopt(curl.h, CURLOPT_WRITEFUNCTION, on_body);
      curl_easy_setopt(curl.h, CURLOPT_WRITEDATA, &t);
      curl_easy_setopt(curl.h, CURLOPT_XFERINFOFUNCTION, on_progress);
      curl_easy_setopt(curl.h, CURLOPT_NOPROGRESS, 0L);
      // A plain Range header, not CURLOPT_RESUME_FROM: libcurl fails a
      // resume that the server answers with the whole file, which is a
      // fine answer here (the .part starts over).
      if (have > 0) curl_easy_setopt(curl.h, CURLOPT_RANGE, range.c_str());
      const CURLcode rc = curl_easy_perform(curl.h);
      if (!t.body_started && rc == CURLE_OK) start_body(t);  // an empty body
      have = t.offset + t.written;
      if (t.total >= 0) total = t.total;
      progress.finish(rc == CURLE_OK && !t.http_error && !t.bad_range);
      if (t.restarted) warn("the server does not resume downloads: it sent the whole file again");

      if (g_interrupted) throw Error("interrupted" + with_resume_hint(part_path, have));
      if (t.write_errno != 0)
        throw Error("cannot write " + part_path + ": " + errno_text(t.write_errno) +
                    " (nothing was installed)" + with_resume_hint(part_path, have));
      if ((t.status == 416 || t.bad_range) && have > 0 && attempt == 0) {
        warn("the server cannot resume " + part_path + " (" +
             (t.status == 416 ? std::string("HTTP 416") : "another range") + "): starting again");
        part.truncate();
        have = 0;
        continue;
      }
      if (t.http_error || t.bad_range) {
        if (part.size() == 0 && have == 0) ::unlink(part_path.c_str());
        throw Error("cannot download " + plan.url + ": HTTP " + std::to_string(t.status) +
                    (t.reason.empty() ? "" : " " + t.reason) + with_resume_hint(part_path, have));
      }
      if (rc != CURLE_OK) {
        if (have == 0) ::unlink(part_path.c_str());
        throw Error("cannot download " + plan.url + ": " +
                    (errbuf[0] ? errbuf : curl_easy_strerror(rc)) +
                    with_resume_hint(part_path, have));
      }
      break;
    }
    if (total >= 0 && have != static_cast<uint64_t>(total))
      throw Error("cannot download " + plan.url + ": the server sent " + std::to_string(have) +
                  " of " + std::to_string(total) + " bytes" + with_resume_hint(part_path, have));
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
