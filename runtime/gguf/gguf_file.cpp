// GGUF parsing.  The file is untrusted input: a cursor reads every field
// through bounds-checked helpers, and every count is compared with the bytes
// that remain *before* anything is allocated for it, so a hostile header can
// neither read out of bounds nor make us reserve gigabytes.
#include "runtime/gguf/gguf_file.h"

#include <cstring>
#include <limits>
#include <map>
#include <unordered_set>
#include <utility>

#include "platform/error.h"
#include "platform/mapped_file.h"

namespace cb {
namespace {

// ggml's names of the tensor types a file may hold, for the error that
// names one this runtime does not decode.
std::string ggml_type_text(uint32_t type) {
  static constexpr std::pair<uint32_t, const char*> kNames[] = {
      {9, "Q8_1"},   {15, "Q8_K"},  {16, "IQ2_XXS"}, {17, "IQ2_XS"}, {18, "IQ3_XXS"}, {19, "IQ1_S"},
      {21, "IQ3_S"}, {22, "IQ2_S"}, {24, "I8"},      {25, "I16"},    {26, "I32"},     {27, "I64"},
      {28, "F64"},   {29, "IQ1_M"}, {34, "TQ1_0"},   {35, "TQ2_0"},  {39, "MXFP4"}};
  for (const auto& [id, name] : kNames)
    if (id == type) return std::string(name) + " (" + std::to_string(type) + ")";
  return std::to_string(type);
}

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;  // ggml tensors have at most 4 dimensions

[[noreturn]] void bad(const std::string& what) {
  fail(ErrorCode::kFormat, "malformed GGUF: " + what);
}

// Smallest encoded size of one value of `t`; used to bound array counts.
uint64_t min_value_size(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
    case GgufType::kString:  // length prefix
      return 8;
    case GgufType::kArray:  // element type + count
      return 12;
  }
  return 1;
}

bool valid_type(uint32_t t) {
  return t <= static_cast<uint32_t>(GgufType::kFloat64);
}

class Cursor {
 public:
  Cursor(const uint8_t* p, size_t n) : base_(p), size_(n) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, const char* what) const {
    if (n > remaining()) bad(std::string("truncated while reading ") + what);
  }
  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string_view read_string(const char* what) {
    uint64_t len = read<uint64_t>(what);
    need(len, what);
    std::string_view s(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return s;
  }
  void skip(uint64_t n, const char* what) {
    need(n, what);
    pos_ += n;
  }

 private:
  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
};

// Where a metadata value sits in the file; decoded only when asked for.
struct Value {
  GgufType type;
  GgufType elem_type = GgufType::kUint8;  // arrays only
  uint64_t count = 0;                     // arrays only
  size_t offset = 0;                      // of the value (arrays: of the first element)
};

void skip_value(Cursor& c, GgufType t, int depth);

void skip_array(Cursor& c, int depth, GgufType* elem_out, uint64_t* count_out, size_t* data_out) {
  uint32_t et = c.read<uint32_t>("array type");
  if (!valid_type(et)) bad("unknown array element type " + std::to_string(et));
  uint64_t count = c.read<uint64_t>("array length");
  GgufType elem = static_cast<GgufType>(et);
  // Even the smallest element takes bytes: reject counts the file cannot hold.
  if (count > c.remaining() / min_value_size(elem)) bad("array length exceeds file size");
  if (elem_out) *elem_out = elem;
  if (count_out) *count_out = count;
  if (data_out) *data_out = c.pos();
  if (elem == GgufType::kString || elem == GgufType::kArray) {
    for (uint64_t i = 0; i < count; ++i) skip_value(c, elem, depth + 1);
  } else {
    c.skip(count * min_value_size(elem), "array data");
  }
}

void skip_value(Cursor& c, GgufType t, int depth) {
  if (depth > 4) bad("arrays nested too deeply");
  if (t == GgufType::kString) {
    c.read_string("string");
  } else if (t == GgufType::kArray) {
    skip_array(c, depth, nullptr, nullptr, nullptr);
  } else {
    c.skip(min_value_size(t), "value");
  }
}

}  // namespace

int64_t GgufTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

struct GgufFile::Impl {
  std::unique_ptr<MappedFile> mapping;  // null for parse()
  const uint8_t* data = nullptr;
  size_t size = 0;
  uint32_t version = 0;
  std::string path;
  std::map<std::string, Value, std::less<>> kv;
  std::vector<GgufTensor> tensors;
  std::map<std::string, size_t, std::less<>> tensor_index;

  void parse_all();
  const Value* find(std::string_view key) const {
    auto it = kv.find(key);
    return it == kv.end() ? nullptr : &it->second;
  }
  template <typename T>
  T load(size_t off) const {
    T v;
    std::memcpy(&v, data + off, sizeof(T));
    return v;
  }
  // Reads a scalar integer of any width; false if `t` is not an integer type.
  bool scalar_int(GgufType t, size_t off, int64_t* out) const;
};

bool GgufFile::Impl::scalar_int(GgufType t, size_t off, int64_t* out) const {
  switch (t) {
    case GgufType::kUint8:
      *out = load<uint8_t>(off);
      return true;
    case GgufType::kInt8:
      *out = load<int8_t>(off);
      return true;
    case GgufType::kUint16:
      *out = load<uint16_t>(off);
      return true;
    case GgufType::kInt16:
      *out = load<int16_t>(off);
      return true;
    case GgufType::kUint32:
      *out = load<uint32_t>(off);
      return true;
    case GgufType::kInt32:
      *out = load<int32_t>(off);
      return true;
    case GgufType::kUint64: {
      uint64_t v = load<uint64_t>(off);
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
      *out = static_cast<int64_t>(v);
      return true;
    }
    case GgufType::kInt64:
      *out = load<int64_t>(off);
      return true;
    default:
      return false;
  }
}

void GgufFile::Impl::parse_all() {
  Cursor c(data, size);
  if (size < 4 || load<uint32_t>(0) != kMagic) bad("not a GGUF file (wrong magic)");
  c.skip(4, "magic");
  version = c.read<uint32_t>("version");
  if (version != 2 && version != 3) {
    fail(ErrorCode::kUnsupported,
         "unsupported GGUF version " + std::to_string(version) + " (supported: 2, 3)");
  }
  uint64_t n_tensors = c.read<uint64_t>("tensor count");
  uint64_t n_kv = c.read<uint64_t>("metadata count");
  // A key is at least 8 (length) + 4 (type) + 1 byte; a tensor info at least
  // 8 + 4 + 8 + 4 + 8.  Counts the file cannot hold are rejected up front.
  if (n_kv > c.remaining() / 13)
    bad("metadata count " + std::to_string(n_kv) + " exceeds file size");
  if (n_tensors > c.remaining() / 32)
    bad("tensor count " + std::to_string(n_tensors) + " exceeds file size");

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key(c.read_string("metadata key"));
    uint32_t t = c.read<uint32_t>("metadata type");
    if (!valid_type(t)) bad("key '" + key + "' has unknown type " + std::to_string(t));
    Value v{static_cast<GgufType>(t)};
    if (v.type == GgufType::kArray) {
      skip_array(c, 0, &v.elem_type, &v.count, &v.offset);
    } else {
      v.offset = c.pos();
      skip_value(c, v.type, 0);
    }
    if (!kv.emplace(key, v).second) bad("duplicate metadata key '" + key + "'");
  }

  uint64_t alignment = kDefaultAlignment;
  if (const Value* a = find("general.alignment")) {
    int64_t al = 0;
    if (!scalar_int(a->type, a->offset, &al) || al <= 0 || (al & (al - 1)) != 0 || al > 65536)
      bad("general.alignment must be a power of two");
    alignment = static_cast<uint64_t>(al);
  }

  tensors.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = std::string(c.read_string("tensor name"));
    uint32_t nd = c.read<uint32_t>("tensor dims");
    if (nd == 0 || nd > kMaxDims)
      bad("tensor '" + t.name + "' has " + std::to_string(nd) + " dimensions");
    int64_t n = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      uint64_t dim = c.read<uint64_t>("tensor dim");
      if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / n))
        bad("tensor '" + t.name + "' has an invalid dimension");
      t.dims.push_back(static_cast<int64_t>(dim));
      n *= static_cast<int64_t>(dim);
    }
    uint32_t type = c.read<uint32_t>("tensor type");
    if (!dtype_supported(type)) {
      fail(ErrorCode::kUnsupported, "tensor '" + t.name + "' has unsupported type " +
                                        ggml_type_text(type) +
                                        " (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, "
                                        "Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS)");
    }
    t.type = static_cast<DType>(type);
    if (t.dims[0] % dtype_block_elems(t.type) != 0)
      bad("tensor '" + t.name + "' row length is not a multiple of its block size");
    t.offset = c.read<uint64_t>("tensor offset");
    if (t.offset % alignment != 0) bad("tensor '" + t.name + "' is misaligned");
    // Row bytes times rows, each step checked against overflow by the file
    // size bound below (rows <= n, row bytes <= file size).
    uint64_t row = dtype_row_bytes(t.type, t.dims[0]);
    uint64_t rows = static_cast<uint64_t>(n / t.dims[0]);
    if (row > size || (rows != 0 && row > size / rows))
      bad("tensor '" + t.name + "' is larger than the file");
    t.n_bytes = row * rows;
    if (!tensor_index.emplace(t.name, tensors.size()).second)
      bad("duplicate tensor name '" + t.name + "'");
    tensors.push_back(std::move(t));
  }

  uint64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
  if (data_start > size) {
    if (!tensors.empty()) bad("tensor data section is missing");
    data_start = size;
  }
  uint64_t data_size = size - data_start;
  for (GgufTensor& t : tensors) {
    if (t.offset > data_size || t.n_bytes > data_size - t.offset)
      bad("tensor '" + t.name + "' data lies outside the file");
    t.data = data + data_start + t.offset;
  }
}

GgufFile::GgufFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

GgufFile GgufFile::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->mapping = std::make_unique<MappedFile>(path);
  impl->data = static_cast<const uint8_t*>(impl->mapping->data());
  impl->size = impl->mapping->size();
  impl->path = path;
  try {
    impl->parse_all();
  } catch (const Error& e) {
    throw Error(e.code(), path + ": " + e.what());
  }
  return GgufFile(std::move(impl));
}

GgufFile GgufFile::parse(const void* data, size_t size) {
  auto impl = std::make_unique<Impl>();
  impl->data = static_cast<const uint8_t*>(data);
  impl->size = size;
  impl->parse_all();
  return GgufFile(std::move(impl));
}

uint32_t GgufFile::version() const {
  return impl_->version;
}
const std::string& GgufFile::path() const {
  return impl_->path;
}
const void* GgufFile::base() const {
  return impl_->data;
}
size_t GgufFile::size() const {
  return impl_->size;
}
bool GgufFile::has(std::string_view key) const {
  return impl_->find(key) != nullptr;
}

std::optional<GgufType> GgufFile::type_of(std::string_view key) const {
  const Value* v = impl_->find(key);
  if (!v) return std::nullopt;
  return v->type;
}

std::vector<std::string> GgufFile::keys() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : impl_->kv) out.push_back(k);
  return out;
}

static std::string wrong_type(std::string_view key, const char* want) {
  return "metadata '" + std::string(key) + "' is not " + want;
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const Value* v = impl_->find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::kString) bad(wrong_type(key, "a string"));
  Cursor c(impl_->data + v->offset, impl_->size - v->offset);
  return std::string(c.read_string("string"));
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const Value* v = impl_->find(key);
  if (!v) return std::nullopt;
  int64_t out = 0;
  if (!impl_->scalar_int(v->type, v->offset, &out)) bad(wrong_type(key, "an integer"));
  return out;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const Value* v = impl_->find(key);
  if (!v) return std::nullopt;
  if (v->type == GgufType::kFloat32) return impl_->load<float>(v->offset);
  if (v->type == GgufType::kFloat64) return impl_->load<double>(v->offset);
  int64_t i = 0;
  if (impl_->scalar_int(v->type, v->offset, &i)) return static_cast<double>(i);
  bad(wrong_type(key, "a number"));
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const Value* v = impl_->find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::kBool) bad(wrong_type(key, "a bool"));
  return impl_->load<uint8_t>(v->offset) != 0;
}

std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
  const Value* v = impl_->find(key);
  if (!v) return {};
  if (v->type != GgufType::kArray || v->elem_type != GgufType::kString)
    bad(wrong_type(key, "an array of strings"));
  // Strings were validated during parsing; the array's element count was
  // bounded by the file size, so this reservation is bounded too.
  std::vector<std::string> out;
  out.reserve(v->count);
  Cursor c(impl_->data + v->offset, impl_->size - v->offset);
  for (uint64_t i = 0; i < v->count; ++i) out.emplace_back(c.read_string("string"));
  return out;
}

std::vector<float> GgufFile::get_float_array(std::string_view key) const {
  const Value* v = impl_->find(key);
  if (!v) return {};
  if (v->type != GgufType::kArray) bad(wrong_type(key, "an array"));
  std::vector<float> out(v->count);
  for (uint64_t i = 0; i < v->count; ++i) {
    if (v->elem_type == GgufType::kFloat32) {
      out[i] = impl_->load<float>(v->offset + 4 * i);
    } else if (v->elem_type == GgufType::kFloat64) {
      out[i] = static_cast<float>(impl_->load<double>(v->offset + 8 * i));
    } else {
      bad(wrong_type(key, "an array of floats"));
    }
  }
  return out;
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
  const Value* v = impl_->find(key);
  if (!v) return {};
  if (v->type != GgufType::kArray) bad(wrong_type(key, "an array"));
  std::vector<int64_t> out(v->count);
  uint64_t w = min_value_size(v->elem_type);
  for (uint64_t i = 0; i < v->count; ++i) {
    if (!impl_->scalar_int(v->elem_type, v->offset + w * i, &out[i]))
      bad(wrong_type(key, "an array of integers"));
  }
  return out;
}

const std::vector<GgufTensor>& GgufFile::tensors() const {
  return impl_->tensors;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  auto it = impl_->tensor_index.find(name);
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}

}  // namespace cb
