#include "corpus.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

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

}  // namespace

Corpus load_corpus(const std::string& path, int64_t min_tokens) {
  std::vector<fs::path> candidates;
  if (!path.empty()) {
    candidates.emplace_back(path);
  } else {
    candidates.emplace_back("/usr/share/common-licenses");
    if (std::string(CKPT_SOURCE_DIR).size() > 0) {
      candidates.emplace_back(fs::path(CKPT_SOURCE_DIR) / "data" / "corpus");
    }
    candidates.push_back(executable_dir().parent_path() / "share" / "ckpt" / "corpus");
  }
  std::string skipped;  // why each default candidate was passed over
  for (const fs::path& candidate : candidates) {
    std::error_code error;
    Corpus corpus;
    corpus.source = candidate.string();
    std::string text;
    if (fs::is_regular_file(candidate, error)) {
      text = read_file(candidate);
      corpus.file_count = 1;
    } else if (fs::is_directory(candidate, error)) {
      std::vector<fs::path> files;
      for (const auto& entry : fs::directory_iterator(candidate, error)) {
        if (entry.is_symlink() || !entry.is_regular_file()) continue;
        files.push_back(entry.path());
      }
      std::sort(files.begin(), files.end());
      std::uintmax_t total = 0;
      for (const fs::path& file : files) {
        const std::uintmax_t size = fs::file_size(file, error);
        if (!error) total += size;
      }
      check_size(candidate, total);
      for (const fs::path& file : files) text += read_file(file) + "\n";
      corpus.file_count = static_cast<int>(files.size());
    } else {
      const std::string why =
          fs::exists(candidate, error) ? "is not a regular file or a folder" : "does not exist";
      if (!path.empty()) throw std::runtime_error("--corpus: '" + path + "' " + why);
      skipped += "; " + candidate.string() + " " + why;
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
