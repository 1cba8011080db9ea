#include "cache/blob_format.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "cache_test_util.h"

namespace cb::cache {
namespace {

TEST(BlobFormat, SegmentsFollowTheHeaderInLayerOrderWithChecksums) {
  const KvShape s = testing::small_shape();
  const ChunkKV kv = testing::make_kv(s, 1);
  const EncodedBlob b = encode_blob(Codec::kQ8, kv.view(), 0xabcdef, 1);
  ASSERT_EQ(b.segments.size(), static_cast<size_t>(s.n_layers));
  uint64_t at = kBlobHeaderBytes;
  for (const SegmentRef& seg : b.segments) {
    EXPECT_EQ(seg.offset, at);
    EXPECT_EQ(seg.checksum, segment_checksum(b.bytes.data() + seg.offset, seg.size));
    at += seg.size;
  }
  EXPECT_EQ(at, b.bytes.size());
  EXPECT_EQ(std::memcmp(b.bytes.data(), "CBKVBLOB", 8), 0);
  uint64_t hash;
  std::memcpy(&hash, b.bytes.data() + 32, 8);
  EXPECT_EQ(hash, 0xabcdefu);
}

TEST(BlobFormat, NamesAreUniqueAndRecognized) {
  const std::string a = new_blob_name(7), b = new_blob_name(7);
  EXPECT_NE(a, b);
  EXPECT_TRUE(is_blob_name(a));
  EXPECT_FALSE(is_temp_name(a));
  EXPECT_TRUE(is_temp_name(temp_name_for(a)));
  EXPECT_FALSE(is_blob_name(temp_name_for(a)));
  // Nothing a user might keep next to the blobs looks like one.
  for (const char* other :
       {"notes.txt", "a.kv", "my.kv.tmp", ".kv", "0123456789abcdef-0123456789abcdef.kvx",
        "0123456789ABCDEF-0123456789abcdef.kv", "0123456789abcdef_0123456789abcdef.kv",
        "0123456789abcdef-0123456789abcdef0.kv"}) {
    EXPECT_FALSE(is_blob_name(other)) << other;
    EXPECT_FALSE(is_temp_name(other)) << other;
  }
}

// A forked child must not draw the same "random" names as its parent: two
// processes writing one store would collide on temp files.
TEST(BlobFormat, NamesDifferAcrossFork) {
  new_blob_name(1);  // the parent's generator is now seeded and in use
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string name = new_blob_name(1);
    const ssize_t w = write(fds[1], name.data(), name.size());
    _exit(w == static_cast<ssize_t>(name.size()) ? 0 : 1);
  }
  close(fds[1]);
  const std::string mine = new_blob_name(1);
  char buf[128] = {};
  const ssize_t n = read(fds[0], buf, sizeof buf - 1);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_GT(n, 0);
  EXPECT_NE(std::string(buf, n), mine);
}

}  // namespace
}  // namespace cb::cache
