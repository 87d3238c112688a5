#include "data/safetensors.h"

#include "data/data_error.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <tuple>

// The format is little-endian and we copy raw bytes in and out of tensors; a big-endian host
// would need byte swapping that nothing here does.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace flowtrain::data {
namespace {

// The reference implementation refuses headers above 100 MB; so do we, so that a corrupt length
// field cannot make us parse (or allocate for) gigabytes of garbage.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
  uint64_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {"F64", at::kDouble, 8},         {"F32", at::kFloat, 4},
    {"F16", at::kHalf, 2},           {"BF16", at::kBFloat16, 2},
    {"I64", at::kLong, 8},           {"I32", at::kInt, 4},
    {"I16", at::kShort, 2},          {"I8", at::kChar, 1},
    {"U8", at::kByte, 1},            {"BOOL", at::kBool, 1},
    {"F8_E4M3", at::kFloat8_e4m3fn, 1}, {"F8_E5M2", at::kFloat8_e5m2, 1},
};

std::string supported_dtype_list() {
  std::string out;
  for (const auto& d : kDtypes) {
    if (!out.empty()) out += ", ";
    out += d.name;
  }
  return out;
}

const DtypeInfo* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

const DtypeInfo* find_dtype(at::ScalarType type) {
  for (const auto& d : kDtypes)
    if (type == d.type) return &d;
  return nullptr;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string errno_text() { return std::strerror(errno); }

// --- writing -----------------------------------------------------------------------------------

// Appends `size` bytes to the file and folds them into `written` (size and running CRC-32).
void write_all(int fd, const void* data, uint64_t size, const std::string& tmp_path, WrittenFile& written) {
  const char* p = static_cast<const char*>(data);
  written.bytes += size;
  while (size > 0) {
    // write() may be partial (and is capped near 2 GiB per call on Linux), so loop.
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(size, 1u << 30));
    const ssize_t n = ::write(fd, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw DataError("safetensors: cannot write " + tmp_path + ": " + errno_text());
    }
    written.crc32 = static_cast<uint32_t>(
        ::crc32(written.crc32, reinterpret_cast<const Bytef*>(p), static_cast<uInt>(n)));  // n <= 1 GiB
    p += n;
    size -= static_cast<uint64_t>(n);
  }
}

// Owns the temporary file until it has been renamed into place; removes it on any failure.
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw DataError("safetensors: cannot create " + path_ + ": " + errno_text());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

  void commit_to(const std::string& final_path) {
    if (::fsync(fd_) != 0) throw DataError("safetensors: cannot fsync " + path_ + ": " + errno_text());
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw DataError("safetensors: cannot close " + path_ + ": " + errno_text());
    if (::rename(path_.c_str(), final_path.c_str()) != 0)
      throw DataError("safetensors: cannot rename " + path_ + " to " + final_path + ": " + errno_text());
    committed_ = true;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool committed_ = false;
};

// fsync of the file does not persist its directory entry; without this the rename can be lost.
// (Plain string handling rather than std::filesystem: the LibTorch wheel exports its own copies of
// std::filesystem symbols, which interpose the system libstdc++'s and are not all safe to call.)
void fsync_directory_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw DataError("safetensors: cannot open directory " + dir + " of " + path + ": " + errno_text());
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  if (rc != 0) {
    errno = saved;
    throw DataError("safetensors: cannot fsync directory " + dir + " of " + path + ": " + errno_text());
  }
}

// --- reading -----------------------------------------------------------------------------------

uint64_t read_le_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

}  // namespace

namespace {

// The 8-byte length and the JSON header of a file holding `tensors`; `where` starts errors.
std::string safetensors_header(const std::string& where, const NamedTensors& tensors,
                               const std::map<std::string, std::string>& metadata) {
  // Sizes are known without copying, so CUDA tensors are staged one at a time after it instead
  // of all at once.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__")
      throw DataError(where + "'__metadata__' is reserved and cannot be a tensor name");
    if (!seen.insert(name).second) throw DataError(where + "duplicate tensor name '" + name + "'");
    if (!tensor.defined()) throw DataError(where + "tensor '" + name + "' is undefined");
    if (tensor.layout() != at::kStrided)
      throw DataError(where + "tensor '" + name + "' is not a dense (strided) tensor");
    const DtypeInfo* info = find_dtype(tensor.scalar_type());
    if (!info)
      throw DataError(where + "tensor '" + name + "' has dtype " +
                      std::string(c10::toString(tensor.scalar_type())) +
                      ", which safetensors cannot store here (supported: " + supported_dtype_list() + ")");
    const uint64_t nbytes = static_cast<uint64_t>(tensor.numel()) * info->size;
    header[name] = {{"dtype", info->name},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }

  std::string json;
  try {
    json = header.dump();
  } catch (const nlohmann::json::exception& e) {
    // Names and metadata must be valid UTF-8 for the header to be valid JSON.
    throw DataError(where + "cannot encode the header: " + e.what());
  }
  // Pad with spaces (valid JSON whitespace) so the data buffer starts 8-byte aligned.
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t{json.size()} >> (8 * i));
  return out + json;
}

}  // namespace

std::string safetensors_bytes(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  std::string out = safetensors_header("safetensors bytes: ", tensors, metadata);
  for (const auto& [name, tensor] : tensors) {
    const at::Tensor cpu = tensor.to(at::kCPU).contiguous();
    out.append(static_cast<const char*>(cpu.data_ptr()), static_cast<size_t>(cpu.numel()) * cpu.element_size());
  }
  return out;
}

WrittenFile write_safetensors(const std::string& path, const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata) {
  const std::string header = safetensors_header("safetensors file " + path + ": ", tensors, metadata);
  TempFile tmp(path + ".tmp");
  WrittenFile written;
  write_all(tmp.fd(), header.data(), header.size(), tmp.path(), written);
  for (const auto& [name, tensor] : tensors) {
    const at::Tensor cpu = tensor.to(at::kCPU).contiguous();
    const uint64_t nbytes = static_cast<uint64_t>(cpu.numel()) * cpu.element_size();
    if (nbytes > 0) write_all(tmp.fd(), cpu.data_ptr(), nbytes, tmp.path(), written);
  }
  tmp.commit_to(path);
  fsync_directory_of(path);
  return written;
}

// --- SafetensorsReader -------------------------------------------------------------------------

// The file's bytes: an mmap of a file, or a string held in memory (a tar member).
struct SafetensorsReader::Mapping {
  const unsigned char* data = nullptr;
  size_t size = 0;
  std::string owned;  // in-memory bytes; empty for an mmap
  bool mapped = false;
  Mapping(const void* d, size_t s) : data(static_cast<const unsigned char*>(d)), size(s), mapped(true) {}
  explicit Mapping(std::string bytes) : owned(std::move(bytes)) {
    data = reinterpret_cast<const unsigned char*>(owned.data());
    size = owned.size();
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (mapped) ::munmap(const_cast<unsigned char*>(data), size);
  }
};

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  const std::string where = "safetensors file " + path + ": ";

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError("cannot open safetensors file " + path + ": " + errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string err = errno_text();
    ::close(fd);
    throw DataError(where + "cannot stat: " + err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw DataError(where + "not a regular file");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    throw DataError(where + "file is " + std::to_string(file_size) +
                    " bytes, shorter than the 8-byte header length field (truncated?)");
  }
  void* addr = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const std::string mmap_err = addr == MAP_FAILED ? errno_text() : "";
  ::close(fd);  // the mapping keeps the file referenced
  if (addr == MAP_FAILED) throw DataError(where + "cannot mmap: " + mmap_err);
  mapping_ = std::make_shared<const Mapping>(addr, file_size);
  parse(where);
}

SafetensorsReader::SafetensorsReader(std::string bytes, const std::string& name) : path_(name) {
  const std::string where = "safetensors " + name + ": ";
  if (bytes.size() < 8)
    throw DataError(where + std::to_string(bytes.size()) +
                    " bytes, shorter than the 8-byte header length field (truncated?)");
  mapping_ = std::make_shared<const Mapping>(std::move(bytes));
  parse(where);
}

namespace {

// The header's JSON, refusing duplicate keys: nlohmann keeps the last of them silently, so the
// keys of every open object are tracked through the parser callback.
nlohmann::json parse_header_json(const std::string& where, const char* header_begin, const char* header_end) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  const auto callback = [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) {
      open_objects.emplace_back();
    } else if (event == E::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == E::key && !open_objects.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_begin, header_end, callback);
  } catch (const nlohmann::json::exception& e) {
    // Also covers invalid UTF-8, which nlohmann rejects inside strings.
    throw DataError(where + "header is not valid UTF-8 JSON: " + e.what());
  }
  if (!duplicate.empty()) throw DataError(where + "duplicate key '" + duplicate + "' in the header");
  return header;
}

// Where a tensor's bytes lie in the data buffer.
struct Span {
  uint64_t begin, end;
  std::string name;
};

// The tensors' names in buffer order, after checking that their offsets tile [0, buffer_size)
// exactly: no overlaps (two tensors aliasing bytes), no gaps (unaccounted bytes a writer could
// hide anything in), as the reference validates.
std::vector<std::string> names_in_buffer_order(const std::string& where, std::vector<Span> spans, uint64_t buffer_size) {
  std::vector<std::string> names;
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name); });
  uint64_t covered = 0;
  const std::string* previous = nullptr;
  for (const auto& s : spans) {
    if (s.begin < covered)
      throw DataError(where + "tensor '" + s.name + "' at data_offsets [" + std::to_string(s.begin) + ", " +
                      std::to_string(s.end) + "] overlaps tensor '" + *previous + "' (which ends at " +
                      std::to_string(covered) + ")");
    if (s.begin > covered)
      throw DataError(where + "gap of " + std::to_string(s.begin - covered) + " bytes in the data buffer at [" +
                      std::to_string(covered) + ", " + std::to_string(s.begin) + ") before tensor '" + s.name +
                      "' (offsets must tile the buffer)");
    covered = s.end;
    previous = &s.name;
    names.push_back(s.name);
  }
  if (covered != buffer_size)
    throw DataError(where + "gap of " + std::to_string(buffer_size - covered) +
                    " bytes at the end of the data buffer not covered by any tensor (offsets must tile the buffer of " +
                    std::to_string(buffer_size) + " bytes)");
  return names;
}

}  // namespace

// One tensor's entry of the header: its dtype, shape and data offsets, each checked against
// the reference's rules and the data buffer of `buffer_size` bytes.
SafetensorsReader::Entry SafetensorsReader::parse_entry(const std::string& where, const std::string& name,
                                                        const nlohmann::json& value, uint64_t buffer_size) {
  // Reads a non-negative integer of a tensor entry; floats and negatives are errors.
  const auto unsigned_field = [&](const nlohmann::json& v, const std::string& what) -> uint64_t {
    if (!v.is_number_unsigned()) throw DataError(where + what + " must be a non-negative integer, got " + v.dump());
    return v.get<uint64_t>();
  };

  const std::string tensor = "tensor '" + name + "'";
  if (!value.is_object()) throw DataError(where + tensor + " must be an object, got " + value.dump());
  // Unknown extra fields are ignored, as the reference (serde without deny_unknown_fields) does.
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!value.contains(field)) throw DataError(where + tensor + " has no \"" + field + "\" field");

  const auto& dtype_json = value["dtype"];
  if (!dtype_json.is_string()) throw DataError(where + tensor + " dtype must be a string, got " + dtype_json.dump());
  const DtypeInfo* info = find_dtype(dtype_json.get<std::string>());
  if (!info)
    throw DataError(where + tensor + " has unknown dtype " + dtype_json.dump() + " (supported: " +
                    supported_dtype_list() + ")");

  const auto& shape_json = value["shape"];
  if (!shape_json.is_array()) throw DataError(where + tensor + " shape must be an array, got " + shape_json.dump());
  Entry entry;
  entry.dtype = info->type;
  uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : shape_json) {
    const uint64_t dim = unsigned_field(d, tensor + " shape entry");
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) || !checked_mul(numel, dim, &numel))
      overflow = true;
    entry.shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t nbytes = 0;
  if (overflow || !checked_mul(numel, info->size, &nbytes))
    throw DataError(where + tensor + " shape " + shape_json.dump() + " is too large");

  const auto& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2)
    throw DataError(where + tensor + " data_offsets must be [begin, end], got " + offsets.dump());
  entry.begin = unsigned_field(offsets[0], tensor + " data_offsets begin");
  entry.end = unsigned_field(offsets[1], tensor + " data_offsets end");
  if (entry.end < entry.begin)
    throw DataError(where + tensor + " data_offsets " + offsets.dump() + " end before they begin");
  if (entry.end > buffer_size)
    throw DataError(where + tensor + " data_offsets " + offsets.dump() + " are out of the data buffer of " +
                    std::to_string(buffer_size) + " bytes (truncated?)");
  if (entry.end - entry.begin != nbytes)
    throw DataError(where + tensor + " shape " + shape_string(entry.shape) + " of dtype " + info->name + " needs " +
                    std::to_string(nbytes) + " bytes, but data_offsets " + offsets.dump() + " span " +
                    std::to_string(entry.end - entry.begin));
  return entry;
}

void SafetensorsReader::parse(const std::string& where) {
  const unsigned char* base = mapping_->data;
  const uint64_t file_size = mapping_->size;

  // Header length: bounded, and within the file.
  const uint64_t header_len = read_le_u64(base);
  if (header_len > kMaxHeaderBytes)
    throw DataError(where + "header length " + std::to_string(header_len) + " exceeds the limit of " +
                    std::to_string(kMaxHeaderBytes) + " bytes (not a safetensors file, or corrupt)");
  if (header_len > file_size - 8)
    throw DataError(where + "header length " + std::to_string(header_len) + " extends beyond the file size of " +
                    std::to_string(file_size) + " bytes (truncated?)");
  buffer_offset_ = 8 + header_len;
  const uint64_t buffer_size = file_size - buffer_offset_;
  const char* header_begin = reinterpret_cast<const char*>(base + 8);
  const char* header_end = header_begin + header_len;

  // The reference requires the header to start with '{' (no leading whitespace).
  if (header_len == 0 || header_begin[0] != '{')
    throw DataError(where + "header is not a JSON object (expected it to start with '{')");

  const nlohmann::json header = parse_header_json(where, header_begin, header_end);
  if (!header.is_object()) throw DataError(where + "header is not a JSON object");

  std::vector<Span> spans;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (value.is_null()) continue;  // the reference writes `Option<…>`, which may serialize as null
      if (!value.is_object()) throw DataError(where + "__metadata__ must be an object of strings, got " + value.dump());
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string())
          throw DataError(where + "__metadata__ value of '" + k + "' must be a string, got " + v.dump());
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    Entry entry = parse_entry(where, name, value, buffer_size);
    spans.push_back({entry.begin, entry.end, name});
    entries_.emplace(name, std::move(entry));
  }

  keys_ = names_in_buffer_order(where, std::move(spans), buffer_size);
}

const std::vector<std::string>& SafetensorsReader::keys() const { return keys_; }

bool SafetensorsReader::contains(const std::string& name) const { return entries_.count(name) > 0; }

const SafetensorsReader::Entry& SafetensorsReader::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) throw DataError("safetensors file " + path_ + ": no tensor named '" + name + "'");
  return it->second;
}

at::Tensor SafetensorsReader::get(const std::string& name) const {
  const Entry& e = entry(name);
  at::Tensor out = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  const uint64_t nbytes = e.end - e.begin;
  const unsigned char* src = mapping_->data + buffer_offset_ + e.begin;
  if (e.dtype == at::kBool) {
    // A byte other than 0/1 is not a valid bool for LibTorch (undefined behaviour in kernels).
    for (uint64_t i = 0; i < nbytes; ++i)
      if (src[i] > 1)
        throw DataError("safetensors file " + path_ + ": BOOL tensor '" + name + "' holds byte " +
                        std::to_string(src[i]) + " (expected 0 or 1)");
  }
  if (nbytes > 0) std::memcpy(out.data_ptr(), src, nbytes);
  return out;
}

std::vector<int64_t> SafetensorsReader::shape(const std::string& name) const { return entry(name).shape; }

at::ScalarType SafetensorsReader::dtype(const std::string& name) const { return entry(name).dtype; }

const std::map<std::string, std::string>& SafetensorsReader::metadata() const { return metadata_; }

const std::string& SafetensorsReader::path() const { return path_; }

NamedTensors read_safetensors(const std::string& path) {
  SafetensorsReader reader(path);
  NamedTensors out;
  out.reserve(reader.keys().size());
  for (const auto& name : reader.keys()) out.emplace_back(name, reader.get(name));
  return out;
}

}  // namespace flowtrain::data
