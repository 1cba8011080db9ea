// Bad paths and a full disk: clear errors, and the store stays usable.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>

#include "cache/flash_store.h"
#include "cache_test_util.h"
#include "platform/error.h"

namespace cb::cache {
namespace {

using namespace testing;

std::string open_error(const std::string& path) {
  try {
    FlashStore::open(path);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    return e.what();
  }
  return "";
}

TEST(StoreErrors, PathThatIsAFile) {
  TempDir dir;
  std::ofstream(dir.sub("file")) << "x";
  const std::string msg = open_error(dir.sub("file"));
  EXPECT_NE(msg.find("not a directory"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir.sub("file")), std::string::npos) << msg;
  const std::string below = open_error(dir.sub("file/store"));
  EXPECT_NE(below.find("not a directory"), std::string::npos) << below;
}

TEST(StoreErrors, DirectoryWithoutPermission) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores permission bits";
  TempDir dir;
  std::filesystem::create_directory(dir.sub("ro"));
  std::filesystem::permissions(
      dir.sub("ro"), std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  const std::string msg = open_error(dir.sub("ro"));
  EXPECT_NE(msg.find("Permission denied"), std::string::npos) << msg;
  std::filesystem::permissions(dir.sub("ro"), std::filesystem::perms::owner_all);
}

// RLIMIT_FSIZE makes writes past a size fail with EFBIG, as a full disk fails
// with ENOSPC, without needing a small file system.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = signal(SIGXFSZ, SIG_IGN);
    rlimit lim = saved_;
    lim.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &lim);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit saved_{};
  sighandler_t old_handler_;
};

TEST(StoreErrors, FullDiskFailsThePutCleanlyAndTheStoreStaysUsable) {
  TempDir dir;
  auto store = FlashStore::open(dir.path());
  const ChunkKey before = make_key(make_tokens(40, 1));
  ASSERT_EQ(store->put(before, make_kv(small_shape(), 1).view()), PutResult::kStored);
  const KvShape big{8, 256, 3, 64};  // ~1.5 MB under f16
  const ChunkKey key = make_key(make_tokens(256, 2));
  {
    FileSizeLimit limit(64 * 1024);
    try {
      store->put(key, make_kv(big, 2).view());
      ADD_FAILURE() << "put succeeded past the file size limit";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kIo);
      EXPECT_NE(std::string(e.what()).find("pwrite"), std::string::npos) << e.what();
    }
    // Async: the failure is counted.
    ASSERT_TRUE(store->put_async(key, make_kv(big, 2)));
    store->flush();
    EXPECT_EQ(store->stats().async_failed, 1u);
    // Reads still work while the disk is "full".
    EXPECT_TRUE(fetch_all(*store, *store->lookup(before)));
  }
  EXPECT_FALSE(store->lookup(key));
  for (const auto& e : std::filesystem::directory_iterator(dir.sub("blobs"))) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << "temp file left behind";
  }
  EXPECT_EQ(store->stats().entries, 1u);
  // Space is back: the same put works.
  EXPECT_EQ(store->put(key, make_kv(big, 2).view()), PutResult::kStored);
  EXPECT_TRUE(fetch_all(*store, *store->lookup(key)));
}

// A full disk after the store was closed: reading its WAL index needs a
// -shm that cannot be written, yet answering needs no writes.  The store
// opens read-only, serves what it holds, refuses puts and says why.
TEST(StoreErrors, FullDiskOpensTheStoreReadOnly) {
  TempDir dir;
  const ChunkKey key = make_key(make_tokens(40, 1));
  {
    auto store = FlashStore::open(dir.path());
    ASSERT_EQ(store->put(key, make_kv(small_shape(), 1).view()), PutResult::kStored);
  }
  ASSERT_FALSE(std::filesystem::exists(dir.sub("index.sqlite-shm")));
  FileSizeLimit limit(0);
  std::unique_ptr<FlashStore> store;
  try {
    store = FlashStore::open(dir.path());
  } catch (const Error& e) {
    FAIL() << "open failed on a full disk: " << e.what();
  }
  EXPECT_TRUE(store->stats().read_only);
  EXPECT_EQ(store->stats().entries, 1u);
  const std::string report = store->open_report();
  EXPECT_NE(report.find("opened read-only"), std::string::npos) << report;
  EXPECT_NE(report.find(dir.path()), std::string::npos) << report;
  const auto handle = store->lookup(key);
  ASSERT_TRUE(handle);
  EXPECT_TRUE(fetch_all(*store, *handle));
  try {
    store->put(make_key(make_tokens(40, 2)), make_kv(small_shape(), 2).view());
    ADD_FAILURE() << "put succeeded in a read-only store";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find("read-only"), std::string::npos) << e.what();
  }
}

TEST(StoreErrors, BadOptions) {
  TempDir dir;
  StoreOptions opt;
  opt.busy_timeout_ms = -1;
  EXPECT_THROW(FlashStore::open(dir.path(), opt), Error);
  EXPECT_THROW(FlashStore::open(""), Error);
}

}  // namespace
}  // namespace cb::cache
