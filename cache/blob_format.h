// A chunk's blob file: a fixed header, then one segment per layer in layer
// order (see codec.h for a segment).  Where each segment starts, its size and
// checksum live in the index, so fetching layer l of a chunk is a single
// pread of exactly that segment.  The header lets a human or a repair tool
// tell what a stray file holds; reads never depend on it.
//
//   0  "CBKVBLOB"        8 bytes
//   8  u32 version (1)
//  12  u8 codec, 3 bytes zero
//  16  i32 n_layers, i32 n_tokens, i32 n_head_kv, i32 head_dim
//  32  u64 key hash
//  40  zero up to 64
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cache/chunk_kv.h"

namespace cb::cache {

constexpr size_t kBlobHeaderBytes = 64;

struct SegmentRef {
  uint64_t offset = 0;  // from the start of the blob file
  uint32_t size = 0;
  uint64_t checksum = 0;  // XXH3-64 of the segment's bytes
};

struct EncodedBlob {
  std::vector<uint8_t> bytes;  // the whole file
  std::vector<SegmentRef> segments;
};

// Encodes every layer of kv.  Throws kInvalidArgument for a malformed view or
// values the codec cannot hold.
EncodedBlob encode_blob(Codec codec, const ChunkKVView& kv, uint64_t key_hash, int zstd_level);

uint64_t segment_checksum(const void* data, size_t n);

// File names inside the store's blob directory.  A blob is named by its key
// hash plus a random part, so two writers of the same chunk never collide.
std::string new_blob_name(uint64_t key_hash);
std::string temp_name_for(const std::string& blob_name);
// Exactly the names new_blob_name() and temp_name_for() make: the store
// deletes no other file.
bool is_blob_name(const std::string& name);
bool is_temp_name(const std::string& name);

}  // namespace cb::cache
