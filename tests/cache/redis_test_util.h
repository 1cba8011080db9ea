// A real redis-server for the remote-tier tests: started on a free loopback
// port with persistence off in a temporary directory, killed at teardown.
// The binary comes from the redis-server package (scripts/setup.sh); the
// tests fail, not skip, without it.
#pragma once

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cache/blob_format.h"
#include "cache_test_util.h"

namespace cb::cache::testing {

// The redis-server binary: $CB_REDIS_SERVER, else the first on PATH or in
// /usr/bin and /usr/sbin; "" when there is none.
inline std::string find_redis_server() {
  if (const char* env = std::getenv("CB_REDIS_SERVER"); env && *env)
    return access(env, X_OK) == 0 ? env : "";
  std::vector<std::string> dirs = {"/usr/bin", "/usr/sbin", "/usr/local/bin"};
  if (const char* path = std::getenv("PATH")) {
    std::string p = path;
    size_t start = 0;
    while (start <= p.size()) {
      const size_t end = p.find(':', start);
      dirs.insert(dirs.end() - 3, p.substr(start, end == std::string::npos ? end : end - start));
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
  for (const std::string& d : dirs) {
    const std::string candidate = d + "/redis-server";
    if (!d.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// A loopback port nothing listens on right now.
inline int free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

// A server of our own that answers PING and then misbehaves on the first
// GETRANGE: `reply` is sent at once, then `drip` one byte every drip_ms,
// or `flood` bytes as fast as the client reads them.
class FakeServer {
 public:
  FakeServer(std::string reply, size_t drip, int drip_ms, size_t flood)
      : reply_(std::move(reply)), drip_(drip), drip_ms_(drip_ms), flood_(flood) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    listen(listener_, 4);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeServer() {
    stop_ = true;
    thread_.join();
    close(listener_);
  }
  int port() const { return port_; }
  size_t sent() const { return sent_; }
  bool asked() const { return asked_ns_ != 0; }  // a GETRANGE arrived
  // Seconds since the first GETRANGE arrived (0 before).
  double seconds_since_asked() const {
    const int64_t at = asked_ns_;
    return at == 0 ? 0.0 : (now_ns() - at) * 1e-9;
  }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{listener_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int fd = accept(listener_, nullptr, nullptr);
      if (fd >= 0) {
        talk(fd);
        close(fd);
      }
    }
  }
  bool send_all(int fd, const char* data, size_t n) {
    while (n > 0 && !stop_) {
      const ssize_t w = send(fd, data, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      sent_ += static_cast<size_t>(w);
      data += w;
      n -= static_cast<size_t>(w);
    }
    return n == 0;
  }
  void talk(int fd) {
    std::string in;
    char buf[4096];
    while (!stop_) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return;
      in.append(buf, static_cast<size_t>(n));
      if (in.find("PING") != std::string::npos) {
        in.clear();
        if (!send_all(fd, "+PONG\r\n", 7)) return;
      } else if (in.find("GETRANGE") != std::string::npos) {
        if (asked_ns_ == 0) asked_ns_ = now_ns();
        if (!send_all(fd, reply_.data(), reply_.size())) return;
        for (size_t i = 0; i < drip_ && !stop_; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(drip_ms_));
          if (!send_all(fd, "x", 1)) return;
        }
        const std::string block(1 << 16, 'y');
        for (size_t left = flood_; left > 0 && !stop_;) {
          const size_t n = std::min(left, block.size());
          if (!send_all(fd, block.data(), n)) return;
          left -= n;
        }
        return;
      }
    }
  }

  std::string reply_;
  size_t drip_;
  int drip_ms_;
  size_t flood_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> sent_{0};
  std::atomic<int64_t> asked_ns_{0};
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  std::thread thread_;
};

// A value of the remote tier with its header rewritten to claim `shape`,
// its header checksum recomputed: what anyone who can write to the server
// can build (the checksums guard against damage, not against a writer).
inline std::string forge_redis_shape(std::string value, const KvShape& shape) {
  std::memcpy(value.data() + 20, &shape.n_layers, 4);
  std::memcpy(value.data() + 24, &shape.n_tokens, 4);
  std::memcpy(value.data() + 28, &shape.n_head_kv, 4);
  std::memcpy(value.data() + 32, &shape.head_dim, 4);
  uint32_t header_bytes = 0;
  std::memcpy(&header_bytes, value.data() + 12, 4);
  std::string header = value.substr(0, header_bytes);
  std::memset(header.data() + 56, 0, 8);
  const uint64_t sum = segment_checksum(header.data(), header.size());
  std::memcpy(value.data() + 56, &sum, 8);
  return value;
}

class RedisServer {
 public:
  // extra: more redis-server arguments, e.g. {"--requirepass", "secret"}.
  explicit RedisServer(std::vector<std::string> extra = {}) : extra_(std::move(extra)) {}
  ~RedisServer() { stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Starts the server (on a new free port unless it ran before: then on
  // the same one) and waits until it answers.  "" on success, else why not.
  std::string start() {
    binary_ = find_redis_server();
    if (binary_.empty())
      return "redis-server not found (the redis-server package): run scripts/setup.sh";
    for (int attempt = 0; attempt < 5; ++attempt) {
      if (port_ == 0 || attempt > 0) port_ = free_loopback_port();
      if (launch() && wait_ready()) return "";
      stop();
    }
    return "redis-server " + binary_ + " did not start; see " + dir_.sub("redis.log");
  }

  // SIGKILL: the server vanishes mid-conversation.
  void stop() {
    if (pid_ > 0) {
      kill(pid_, SIGCONT);
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = 0;
    }
  }
  // SIGSTOP / SIGCONT: a server that accepts nothing and answers nothing.
  void pause() { kill(pid_, SIGSTOP); }
  void resume() { kill(pid_, SIGCONT); }

  int port() const { return port_; }

  // A direct hiredis connection for the test's own commands.
  redisContext* connect(const std::string& password = "") const {
    timeval tv{2, 0};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    if (c && !c->err && !password.empty()) {
      auto* r = static_cast<redisReply*>(redisCommand(c, "AUTH %s", password.c_str()));
      if (r) freeReplyObject(r);
    }
    return c;
  }

 private:
  bool launch() {
    std::vector<std::string> args = {binary_,
                                     "--port",
                                     std::to_string(port_),
                                     "--bind",
                                     "127.0.0.1",
                                     "--dir",
                                     dir_.path(),
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--logfile",
                                     dir_.sub("redis.log")};
    args.insert(args.end(), extra_.begin(), extra_.end());
    pid_ = fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(binary_.c_str(), argv.data());
      _exit(127);
    }
    return true;
  }

  bool wait_ready() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = 0;  // exited: the port was taken, or bad arguments
        return false;
      }
      redisContext* c = connect();
      if (c && !c->err) {
        auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
        // A password-protected server answers NOAUTH: it is up all the same.
        const bool up = r != nullptr;
        if (r) freeReplyObject(r);
        redisFree(c);
        if (up) return true;
      } else if (c) {
        redisFree(c);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  std::vector<std::string> extra_;
  TempDir dir_;
  std::string binary_;
  int port_ = 0;
  pid_t pid_ = 0;
};

}  // namespace cb::cache::testing
