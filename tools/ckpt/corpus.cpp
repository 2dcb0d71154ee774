#include "corpus.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#ifndef CKPT_SOURCE_DIR
#define CKPT_SOURCE_DIR ""
#endif

namespace ckpt {
namespace cli {
namespace {

namespace fs = std::filesystem;

// ckpt train holds the whole text as token ids (8 bytes a character): a larger text is refused
// before it is read.
constexpr std::uintmax_t kMaxCorpusBytes = std::uintmax_t{256} << 20;

void check_size(const fs::path& path, std::uintmax_t bytes) {
  if (bytes > kMaxCorpusBytes) {
    throw std::runtime_error("--corpus: '" + path.string() + "' holds " + std::to_string(bytes) +
                             " bytes; ckpt train reads at most " + std::to_string(kMaxCorpusBytes) +
                             " bytes of text");
  }
}

std::string read_file(const fs::path& path) {
  std::error_code error;
  const std::uintmax_t size = fs::file_size(path, error);
  if (!error) check_size(path, size);
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("--corpus: cannot read '" + path.string() + "'");
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// The folder of the running executable (for share/ckpt/corpus next to an installed binary).
fs::path executable_dir() {
  std::array<char, 4096> buffer{};
  const ssize_t length = readlink("/proc/self/exe", buffer.data(), buffer.size() - 1);
  if (length <= 0) return {};
  return fs::path(std::string(buffer.data(), static_cast<size_t>(length))).parent_path();
}

// Where to look: `path` alone when given, else the licence texts, the source tree's
// data/corpus and the installation's share/ckpt/corpus, in that order.
std::vector<fs::path> corpus_candidates(const std::string& path) {
  if (!path.empty()) return {fs::path(path)};
  std::vector<fs::path> candidates{"/usr/share/common-licenses"};
  if (std::string(CKPT_SOURCE_DIR).size() > 0) {
    candidates.emplace_back(fs::path(CKPT_SOURCE_DIR) / "data" / "corpus");
  }
  candidates.push_back(executable_dir().parent_path() / "share" / "ckpt" / "corpus");
  return candidates;
}

// Every regular file of `folder` in name order, symbolic links skipped, one newline after each;
// the total size is checked before anything is read.
std::string read_folder(const fs::path& folder, int& file_count) {
  std::error_code error;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    if (entry.is_symlink() || !entry.is_regular_file()) continue;
    files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  std::uintmax_t total = 0;
  for (const fs::path& file : files) {
    const std::uintmax_t size = fs::file_size(file, error);
    if (!error) total += size;
  }
  check_size(folder, total);
  std::string text;
  for (const fs::path& file : files) text += read_file(file) + "\n";
  file_count = static_cast<int>(files.size());
  return text;
}

// The text of a file or a folder; false, with why in `why_not`, for anything else.
bool read_candidate(const fs::path& candidate, Corpus& corpus, std::string& text,
                    std::string& why_not) {
  std::error_code error;
  if (fs::is_regular_file(candidate, error)) {
    text = read_file(candidate);
    corpus.file_count = 1;
    return true;
  }
  if (fs::is_directory(candidate, error)) {
    text = read_folder(candidate, corpus.file_count);
    return true;
  }
  why_not = fs::exists(candidate, error) ? "is not a regular file or a folder" : "does not exist";
  return false;
}

// Character-level tokens: each distinct byte of the text gets an id, in byte order.
void tokenize(const std::string& text, Corpus& corpus) {
  std::array<bool, 256> seen{};
  for (unsigned char c : text) seen[c] = true;
  std::array<int64_t, 256> id{};
  for (int c = 0; c < 256; ++c) {
    if (seen[c]) {
      id[c] = static_cast<int64_t>(corpus.vocabulary.size());
      corpus.vocabulary.push_back(static_cast<char>(c));
    }
  }
  corpus.tokens.reserve(text.size());
  for (unsigned char c : text) corpus.tokens.push_back(id[c]);
}

}  // namespace

// A path given with --corpus must be usable; the default candidates are tried in turn, and the
// error says why each one was passed over.
Corpus load_corpus(const std::string& path, int64_t min_tokens) {
  std::string skipped;
  for (const fs::path& candidate : corpus_candidates(path)) {
    Corpus corpus;
    corpus.source = candidate.string();
    std::string text, why_not;
    if (!read_candidate(candidate, corpus, text, why_not)) {
      if (!path.empty()) throw std::runtime_error("--corpus: '" + path + "' " + why_not);
      skipped += "; " + candidate.string() + " " + why_not;
      continue;
    }
    if (static_cast<int64_t>(text.size()) < min_tokens) {
      const std::string why = "holds " + std::to_string(text.size()) +
                              " characters, fewer than the " + std::to_string(min_tokens) +
                              " that one batch window needs";
      if (!path.empty()) {
        throw std::runtime_error("--corpus: '" + path + "' " + why +
                                 "; use a longer text or a smaller --context");
      }
      skipped += "; " + candidate.string() + " " + why;
      continue;
    }
    tokenize(text, corpus);
    return corpus;
  }
  throw std::runtime_error("no usable training text" + skipped +
                           "; pass --corpus FILE or a smaller --context");
}

void sample_batch(const Corpus& corpus, int64_t batch, int64_t context, std::mt19937_64& rng,
                  std::vector<int64_t>& inputs, std::vector<int64_t>& targets) {
  const int64_t size = static_cast<int64_t>(corpus.tokens.size());
  std::uniform_int_distribution<int64_t> start(0, size - context - 1);
  inputs.resize(static_cast<size_t>(batch * context));
  targets.resize(inputs.size());
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t offset = start(rng);
    for (int64_t t = 0; t < context; ++t) {
      inputs[static_cast<size_t>(b * context + t)] = corpus.tokens[static_cast<size_t>(offset + t)];
      targets[static_cast<size_t>(b * context + t)] =
          corpus.tokens[static_cast<size_t>(offset + t + 1)];
    }
  }
}

}  // namespace cli
}  // namespace ckpt
