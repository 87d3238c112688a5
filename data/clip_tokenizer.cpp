#include "data/clip_tokenizer.h"

#include "data/data_error.h"

#include <nlohmann/json.hpp>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>
#include <zlib.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace flowtrain::data {
namespace {

constexpr int64_t kMerges = 49152 - 256 - 2;  // OpenAI's CLIP vocabulary: 48,894 merges

void append_utf8(std::string& out, UChar32 c) {
  char buffer[U8_MAX_LENGTH];
  int32_t length = 0;
  UBool error = false;
  U8_APPEND(buffer, length, U8_MAX_LENGTH, c, error);
  if (!error) out.append(buffer, static_cast<size_t>(length));
}

// GPT-2's reversible map from bytes to printable characters: the printable Latin-1 bytes stand for
// themselves, the other 68 (controls, space, 0x7f-0xa0, 0xad) for U+0100 on, in byte order. Index
// i of `order` is the byte of vocabulary id i (and of id 256 + i with "</w>").
struct ByteCharacters {
  std::array<std::string, 256> of_byte;
  std::array<uint8_t, 256> order;
  ByteCharacters() {
    std::array<bool, 256> printable{};
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      printable[b] = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
      if (printable[b]) order[n++] = static_cast<uint8_t>(b);
    }
    for (int b = 0, shifted = 0; b < 256; ++b) {
      if (!printable[b]) order[n++] = static_cast<uint8_t>(b);
      append_utf8(of_byte[b], printable[b] ? b : 256 + shifted++);
    }
  }
};

const ByteCharacters& byte_characters() {
  static const ByteCharacters table;
  return table;
}

std::string read_maybe_gzipped(const std::string& file) {
  gzFile in = gzopen(file.c_str(), "rb");  // reads plain files as they are
  if (in == nullptr) throw DataError(file + ": cannot open");
  std::string text;
  char buffer[1 << 16];
  int got = 0;
  while ((got = gzread(in, buffer, sizeof buffer)) > 0) text.append(buffer, static_cast<size_t>(got));
  int error = Z_OK;
  const std::string message = got < 0 ? gzerror(in, &error) : "";
  gzclose(in);
  if (got < 0) throw DataError(file + ": cannot read (" + message + ")");
  return text;
}

// "a b" of a merges line, or false when the line is not two symbols.
bool split_merge(const std::string& line, std::string& left, std::string& right) {
  std::istringstream parts(line);
  std::string extra;
  return static_cast<bool>(parts >> left >> right) && !(parts >> extra);
}

bool is_letter(UChar32 c) { return (U_GET_GC_MASK(c) & U_GC_L_MASK) != 0; }
bool is_number(UChar32 c) { return (U_GET_GC_MASK(c) & U_GC_N_MASK) != 0; }
bool is_space(UChar32 c) { return u_isUWhiteSpace(c); }

// NFC; each run of white space one space; each character lower-cased on its own (the full
// mapping of a character alone: "İ" is "i̇", "Σ" is "σ" wherever it stands).
std::vector<UChar32> normalized(const std::string& text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) throw DataError(std::string("ICU has no NFC data: ") + u_errorName(status));
  const icu::UnicodeString composed = nfc->normalize(icu::UnicodeString::fromUTF8(text), status);
  if (U_FAILURE(status)) throw DataError(std::string("NFC normalization failed: ") + u_errorName(status));
  std::vector<UChar32> out;
  out.reserve(static_cast<size_t>(composed.length()));
  for (int32_t i = 0; i < composed.length(); i = composed.moveIndex32(i, 1)) {
    const UChar32 c = composed.char32At(i);
    if (is_space(c)) {
      if (out.empty() || out.back() != ' ') out.push_back(' ');
      continue;
    }
    UChar one[2], lower[8];
    int32_t length = 0;
    U16_APPEND_UNSAFE(one, length, c);
    status = U_ZERO_ERROR;
    const int32_t lower_length = u_strToLower(lower, 8, one, length, "", &status);
    if (U_FAILURE(status)) {
      out.push_back(c);
      continue;
    }
    for (int32_t j = 0; j < lower_length;) {
      UChar32 lc;
      U16_NEXT(lower, j, lower_length, lc);
      out.push_back(lc);
    }
  }
  return out;
}

// Where the piece that starts at `i` ends: 's|'t|'re|'ve|'m|'ll|'d, a run of letters, one digit,
// or a run of anything else but white space (the alternation of CLIP's pattern, tried in order).
size_t piece_end(const std::vector<UChar32>& text, size_t i) {
  const size_t n = text.size();
  if (text[i] == '\'' && i + 1 < n) {
    const UChar32 next = text[i + 1];
    if (next == 's' || next == 't' || next == 'm' || next == 'd') return i + 2;
    if (i + 2 < n && ((next == 'r' && text[i + 2] == 'e') || (next == 'v' && text[i + 2] == 'e') ||
                      (next == 'l' && text[i + 2] == 'l')))
      return i + 3;
  }
  if (is_letter(text[i])) {
    while (i < n && is_letter(text[i])) ++i;
    return i;
  }
  if (is_number(text[i])) return i + 1;
  while (i < n && !is_space(text[i]) && !is_letter(text[i]) && !is_number(text[i])) ++i;
  return i;
}

}  // namespace

ClipTokenizer::ClipTokenizer(const std::string& path) : path_(path) {
  if (std::filesystem::is_directory(path))
    load_hugging_face(path);
  else
    load_open_clip(path);
}

void ClipTokenizer::load_open_clip(const std::string& file) {
  const std::string text = read_maybe_gzipped(file);
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  if (static_cast<int64_t>(lines.size()) < kMerges + 1)
    throw DataError(file + ": not CLIP's BPE vocabulary (" + std::to_string(lines.size()) + " lines; open_clip's " +
                    "bpe_simple_vocab_16e6.txt has a header line and at least " + std::to_string(kMerges) + " merges)");
  const ByteCharacters& bytes = byte_characters();
  int64_t id = 0;
  for (const uint8_t b : bytes.order) vocab_[bytes.of_byte[b]] = id++;
  for (const uint8_t b : bytes.order) vocab_[bytes.of_byte[b] + "</w>"] = id++;
  std::string left, right;
  for (int64_t rank = 0; rank < kMerges; ++rank) {
    const std::string& line = lines[static_cast<size_t>(rank + 1)];
    if (!split_merge(line, left, right))
      throw DataError(file + ": line " + std::to_string(rank + 2) + " is not a merge of two symbols: '" + line + "'");
    merge_rank_[left + " " + right] = rank;
    vocab_[left + right] = id++;
  }
  start_id_ = vocab_["<start_of_text>"] = id++;
  end_id_ = vocab_["<end_of_text>"] = id++;
}

void ClipTokenizer::load_hugging_face(const std::string& folder) {
  const std::string vocab_file = folder + "/vocab.json", merges_file = folder + "/merges.txt";
  std::ifstream vocab_in(vocab_file);
  if (!vocab_in) throw DataError(vocab_file + ": cannot open (a CLIP tokenizer folder holds vocab.json and merges.txt)");
  try {
    const nlohmann::json vocab = nlohmann::json::parse(vocab_in);
    for (const auto& [token, id] : vocab.items()) vocab_[token] = id.get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw DataError(vocab_file + ": not a token -> id map (" + e.what() + ")");
  }
  std::ifstream merges_in(merges_file);
  if (!merges_in) throw DataError(merges_file + ": cannot open");
  int64_t rank = 0, line_number = 0;
  std::string left, right;
  for (std::string line; std::getline(merges_in, line);) {
    ++line_number;
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    if (!split_merge(line, left, right))
      throw DataError(merges_file + ": line " + std::to_string(line_number) + " is not a merge of two symbols: '" + line +
                      "'");
    merge_rank_[left + " " + right] = rank++;
  }
  const auto start = vocab_.find("<|startoftext|>"), end = vocab_.find("<|endoftext|>");
  if (start == vocab_.end() || end == vocab_.end())
    throw DataError(vocab_file + ": has no <|startoftext|> or <|endoftext|> token");
  start_id_ = start->second;
  end_id_ = end->second;
}

// Byte-level BPE of one piece: its bytes as characters, "</w>" on the last, then the pair of
// lowest rank merged everywhere, until no pair has a rank. (A merge's result only takes part in
// merges of higher rank, so this equals merging one pair at a time by rank and position.)
void ClipTokenizer::append_bpe(const std::string& piece, std::vector<int64_t>& ids) const {
  const ByteCharacters& bytes = byte_characters();
  std::vector<std::string> word;
  for (const char ch : piece) word.push_back(bytes.of_byte[static_cast<uint8_t>(ch)]);
  if (word.empty()) return;
  word.back() += "</w>";
  while (word.size() > 1) {
    int64_t best = std::numeric_limits<int64_t>::max();
    size_t at = 0;
    for (size_t j = 0; j + 1 < word.size(); ++j) {
      const auto rank = merge_rank_.find(word[j] + " " + word[j + 1]);
      if (rank != merge_rank_.end() && rank->second < best) best = rank->second, at = j;
    }
    if (best == std::numeric_limits<int64_t>::max()) break;
    const std::string first = word[at], second = word[at + 1];
    std::vector<std::string> merged;
    for (size_t j = 0; j < word.size(); ++j) {
      if (j + 1 < word.size() && word[j] == first && word[j + 1] == second) {
        merged.push_back(first + second);
        ++j;
      } else {
        merged.push_back(word[j]);
      }
    }
    word.swap(merged);
  }
  for (const std::string& symbol : word) {
    const auto id = vocab_.find(symbol);
    ids.push_back(id == vocab_.end() ? end_id_ : id->second);  // unknown is <|endoftext|>, as transformers'
  }
}

std::vector<int64_t> ClipTokenizer::pieces_of(const std::string& text, size_t limit) const {
  const std::vector<UChar32> chars = normalized(text);
  std::vector<int64_t> ids;
  for (size_t i = 0; i < chars.size() && ids.size() < limit;) {
    if (is_space(chars[i])) {
      ++i;
      continue;
    }
    const size_t end = piece_end(chars, i);
    std::string piece;
    for (size_t j = i; j < end; ++j) append_utf8(piece, chars[j]);
    append_bpe(piece, ids);
    i = end;
  }
  return ids;
}

std::vector<int64_t> ClipTokenizer::encode(const std::string& text, int64_t max_length) const {
  if (max_length < 2) throw std::invalid_argument("ClipTokenizer: max_length must be >= 2 (start and end)");
  std::vector<int64_t> ids{start_id_};
  const std::vector<int64_t> pieces = pieces_of(text, static_cast<size_t>(max_length - 2));  // the rest is cut
  ids.insert(ids.end(), pieces.begin(), pieces.begin() + std::min<int64_t>(pieces.size(), max_length - 2));
  ids.push_back(end_id_);
  return ids;
}

ClipTokenizer::Batch ClipTokenizer::encode_batch(const std::vector<std::string>& texts, int64_t max_length,
                                                 int64_t pad_id) const {
  if (max_length < 2) throw std::invalid_argument("ClipTokenizer: max_length must be >= 2 (start and end)");
  const int64_t n = static_cast<int64_t>(texts.size());
  Batch batch{at::full({n, max_length}, pad_id < 0 ? end_id_ : pad_id, at::kLong), at::zeros({n, max_length}, at::kBool),
              {}};
  auto ids = batch.ids.accessor<int64_t, 2>();
  auto mask = batch.mask.accessor<bool, 2>();
  for (int64_t row = 0; row < n; ++row) {
    const std::vector<int64_t> kept = encode(texts[row], max_length + 1);  // one over tells a cut
    const int64_t length = std::min<int64_t>(kept.size(), max_length);
    if (static_cast<int64_t>(kept.size()) > max_length) batch.truncated.push_back(row);
    for (int64_t i = 0; i + 1 < length; ++i) {
      ids[row][i] = kept[static_cast<size_t>(i)];
      mask[row][i] = true;
    }
    ids[row][length - 1] = end_id_;  // the end id stays last
    mask[row][length - 1] = true;
  }
  return batch;
}

}  // namespace flowtrain::data
