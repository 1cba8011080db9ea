#include "download.h"

#if CB_HAVE_DOWNLOAD

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <curl/curl.h>

#include "app.h"
#include "progress.h"

namespace rag {

std::string errno_text(int e) {
  return std::strerror(e);
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

std::string with_resume_hint(const std::string& part, uint64_t bytes) {
  if (bytes == 0) return "";
  return "; the " + std::to_string(bytes) + " bytes downloaded are kept in " + part +
         ": run the same pull again to resume";
}

}  // namespace

uint64_t download(const std::string& url, const std::string& label, PartFile& part,
                  const std::string& part_path, uint64_t have, int64_t& total) {
  curl_init_once();
  InterruptGuard interrupt_guard;
  CurlHandle curl;
  if (curl.h == nullptr) throw Error("cannot start libcurl");
  // At most two requests: a server that answers the resume request with
  // 416 (the range is past its file) or with another range is asked again
  // for the whole file.
  for (int attempt = 0;; ++attempt) {
    ByteProgress progress(label, have);
    Transfer t;
    t.fd = part.fd();
    t.offset = have;
    t.total = total;
    t.curl = curl.h;
    t.progress = &progress;
    char errbuf[CURL_ERROR_SIZE] = "";
    const std::string range = std::to_string(have) + "-";
    curl_easy_reset(curl.h);
    curl_easy_setopt(curl.h, CURLOPT_URL, url.c_str());
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
      throw Error("cannot download " + url + ": HTTP " + std::to_string(t.status) +
                  (t.reason.empty() ? "" : " " + t.reason) + with_resume_hint(part_path, have));
    }
    if (rc != CURLE_OK) {
      if (have == 0) ::unlink(part_path.c_str());
      throw Error("cannot download " + url + ": " + (errbuf[0] ? errbuf : curl_easy_strerror(rc)) +
                  with_resume_hint(part_path, have));
    }
    break;
  }
  if (total >= 0 && have != static_cast<uint64_t>(total))
    throw Error("cannot download " + url + ": the server sent " + std::to_string(have) + " of " +
                std::to_string(total) + " bytes" + with_resume_hint(part_path, have));
  return have;
}

}  // namespace rag

#endif  // CB_HAVE_DOWNLOAD
