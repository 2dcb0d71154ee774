#pragma once

// The training text of `ckpt train`: the licence texts every Debian system carries, or a file
// or folder given with --corpus, or the text shipped under data/corpus/.

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace ckpt {
namespace cli {

/// A character-level corpus: the text as token ids over its distinct bytes.
struct Corpus {
  /// Where the text came from (a folder or a file).
  std::string source;
  /// Number of files read.
  int file_count = 0;
  /// The distinct bytes of the text, sorted; token id = index in this string.
  std::string vocabulary;
  /// The text as token ids.
  std::vector<int64_t> tokens;
};

/// Loads `path` (a file, or every regular file of a folder, in name order, symbolic links
/// skipped). With an empty path: /usr/share/common-licenses, else data/corpus/ of the source
/// tree or share/ckpt/corpus of the installation. Throws std::runtime_error when nothing is found
/// or the text is too short for `min_tokens`.
Corpus load_corpus(const std::string& path, int64_t min_tokens);

/// Draws `batch` random windows of `context + 1` tokens: inputs (the first `context`) and
/// targets (the next token of each), both row-major [batch, context].
void sample_batch(const Corpus& corpus, int64_t batch, int64_t context, std::mt19937_64& rng,
                  std::vector<int64_t>& inputs, std::vector<int64_t>& targets);

}  // namespace cli
}  // namespace ckpt
