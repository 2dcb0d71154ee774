#include "chain_json.h"

#include <ckpt/plan/excerpt.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unordered_set>
#include <vector>

namespace ckpt {
namespace cli {
namespace {

using nlohmann::json;

// A value named in an error message, bounded: never a dump of a whole array or object (a value
// nested 70,000 deep once overflowed the stack while being dumped).
std::string describe(const json& value) {
  switch (value.type()) {
    case json::value_t::array:
      return "an array of " + std::to_string(value.size()) +
             (value.size() == 1 ? " element" : " elements");
    case json::value_t::object:
      return "an object of " + std::to_string(value.size()) +
             (value.size() == 1 ? " key" : " keys");
    case json::value_t::string:
      return "the string " + plan::quote_excerpt(value.get_ref<const std::string&>());
    case json::value_t::null:
    case json::value_t::boolean:
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return value.dump();
    default:
      return value.type_name();
  }
}

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& message) const {
    throw std::invalid_argument(source_ + ": " + field + " " + message);
  }

  const json& require(const json& object, const std::string& key, const std::string& field) const {
    const auto it = object.find(key);
    if (it == object.end()) fail(field, "is missing");
    return *it;
  }

  // A time, or a number >= 0 of its kind (host_bandwidth).
  double time(const json& object, const std::string& key, const std::string& path) const {
    const std::string field = path.empty() ? key : path + "." + key;
    const json& value = require(object, key, field);
    if (!value.is_number()) fail(field, "must be a number, but got " + describe(value));
    const double result = value.get<double>();
    if (!std::isfinite(result) || result < 0) {
      fail(field, "must be a finite number >= 0, but got " + describe(value));
    }
    return result;
  }

  int64_t bytes(const json& object, const std::string& key, const std::string& path,
                bool optional) const {
    const std::string field = path.empty() ? key : path + "." + key;
    if (optional && object.find(key) == object.end()) return 0;
    const json& value = require(object, key, field);
    if (value.is_number_float()) {
      const double d = value.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && d >= 0 && d < 9.0e18) {
        return static_cast<int64_t>(d);
      }
    }
    if (value.is_number_unsigned()) {
      if (value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        fail(field, "is too large: " + describe(value));
      }
      return static_cast<int64_t>(value.get<uint64_t>());
    }
    if (value.is_number_integer() && value.get<int64_t>() >= 0) return value.get<int64_t>();
    fail(field, "must be an integer number of bytes >= 0, but got " + describe(value));
  }

 private:
  std::string source_;
};

// The DOM parser of nlohmann-json with three checks of its own: nesting deeper than a chain file
// needs (so that nothing recursive ever meets a deep value), and a key twice in one object (the
// library keeps the last silently). Errors name the place as a path ("stages[2]").
class CheckedParser : public nlohmann::json_sax<json> {
 public:
  // A chain file nests 5 deep (document, stages, a stage, its alternatives, an alternative).
  static constexpr size_t kMaxDepth = 32;

  explicit CheckedParser(json& result) : dom_(result) {}

  const std::string& error() const { return error_; }

  bool null() override { return value() && dom_.null(); }
  bool boolean(bool value) override { return this->value() && dom_.boolean(value); }
  bool number_integer(number_integer_t value) override {
    return this->value() && dom_.number_integer(value);
  }
  bool number_unsigned(number_unsigned_t value) override {
    return this->value() && dom_.number_unsigned(value);
  }
  bool number_float(number_float_t value, const string_t& text) override {
    return this->value() && dom_.number_float(value, text);
  }
  bool string(string_t& value) override { return this->value() && dom_.string(value); }
  bool binary(binary_t& value) override { return this->value() && dom_.binary(value); }
  bool start_object(size_t size) override { return open(false) && dom_.start_object(size); }
  bool start_array(size_t size) override { return open(true) && dom_.start_array(size); }
  bool end_object() override { return close() && dom_.end_object(); }
  bool end_array() override { return close() && dom_.end_array(); }
  bool key(string_t& key) override {
    Frame& frame = frames_.back();
    if (!frame.keys.insert(key).second) {
      return fail(path() + " has the key " + plan::quote_excerpt(key) +
                  " twice; each key may appear once in an object");
    }
    frame.key = key;
    return dom_.key(key);
  }
  bool parse_error(size_t position, const std::string& token,
                   const nlohmann::detail::exception& error) override {
    return dom_.parse_error(position, token, error);  // throws json::parse_error
  }

 private:
  struct Frame {
    bool array = false;
    size_t index = 0;  // of the element being read, in an array
    std::string key;   // being read, in an object
    std::unordered_set<std::string> keys;
  };

  bool fail(std::string message) {
    error_ = std::move(message);
    return false;
  }

  // A scalar, or the end of a container, completes an element of the enclosing array.
  bool value() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return true;
  }
  bool open(bool array) {
    if (frames_.size() >= kMaxDepth) {
      return fail(path() + " nests arrays and objects more than " + std::to_string(kMaxDepth) +
                  " deep; a chain file needs 5 levels");
    }
    frames_.push_back(Frame{array, 0, {}, {}});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return value();
  }

  // Where the parser is: "stages[2].alternatives[0]", or "the document" at the top.
  std::string path() const {
    std::string path;
    for (size_t depth = 0; depth + 1 < frames_.size(); ++depth) {
      const Frame& frame = frames_[depth];
      if (frame.array) {
        path += "[" + std::to_string(frame.index) + "]";
      } else {
        path += (path.empty() ? "" : ".") + key_in_path(frame.key);
      }
    }
    return path.empty() ? "the document" : path;
  }

  // A key as written in a path: as it is when it is a short identifier, else quoted.
  static std::string key_in_path(const std::string& key) {
    const bool plain =
        !key.empty() && key.size() <= 40 && std::all_of(key.begin(), key.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
        });
    return plain ? key : plan::quote_excerpt(key, 40);
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  std::vector<Frame> frames_;
  std::string error_;
};

// One of a stage's extra storage options, at `path`; it keeps at least the stage's output.
plan::StorageOption read_alternative(const Reader& reader, const json& option,
                                     const std::string& path, int64_t output_bytes) {
  if (!option.is_object()) reader.fail(path, "must be an object");
  plan::StorageOption storage;
  storage.forward_time = reader.time(option, "forward_time", path);
  storage.backward_time = reader.time(option, "backward_time", path);
  storage.saved_bytes = reader.bytes(option, "saved_bytes", path, false);
  storage.forward_tmp_bytes = reader.bytes(option, "forward_tmp_bytes", path, true);
  storage.backward_tmp_bytes = reader.bytes(option, "backward_tmp_bytes", path, true);
  storage.offloaded_bytes = reader.bytes(option, "offloaded_bytes", path, true);
  const auto name = option.find("name");
  if (name != option.end()) {
    if (!name->is_string()) reader.fail(path + ".name", "must be a string");
    storage.name = name->get<std::string>();
  }
  if (storage.saved_bytes < output_bytes) {
    reader.fail(path + ".saved_bytes", "must be >= the stage's output_bytes (" +
                                           std::to_string(output_bytes) + "), but got " +
                                           std::to_string(storage.saved_bytes));
  }
  return storage;
}

// The stage object at `path` (such as "stages[3]"), its alternatives included.
plan::Stage read_stage(const Reader& reader, const json& object, const std::string& path) {
  if (!object.is_object()) reader.fail(path, "must be an object, but got " + describe(object));
  plan::Stage stage;
  stage.forward_time = reader.time(object, "forward_time", path);
  stage.backward_time = reader.time(object, "backward_time", path);
  stage.output_bytes = reader.bytes(object, "output_bytes", path, false);
  stage.saved_bytes = reader.bytes(object, "saved_bytes", path, false);
  stage.forward_tmp_bytes = reader.bytes(object, "forward_tmp_bytes", path, true);
  stage.backward_tmp_bytes = reader.bytes(object, "backward_tmp_bytes", path, true);
  if (object.contains("forward_all_tmp_bytes")) {
    stage.forward_all_tmp_bytes = reader.bytes(object, "forward_all_tmp_bytes", path, true);
  }
  if (object.contains("forward_all_time")) {
    stage.forward_all_time = reader.time(object, "forward_all_time", path);
  }
  stage.gradient_bytes = reader.bytes(object, "gradient_bytes", path, true);
  stage.random_state_bytes = reader.bytes(object, "random_state_bytes", path, true);
  stage.buffer_bytes = reader.bytes(object, "buffer_bytes", path, true);
  stage.kept_buffer_bytes = reader.bytes(object, "kept_buffer_bytes", path, true);
  if (stage.saved_bytes < stage.output_bytes) {
    reader.fail(path + ".saved_bytes", "must be >= output_bytes (" +
                                           std::to_string(stage.output_bytes) +
                                           "): what a stage keeps includes its output, but got " +
                                           std::to_string(stage.saved_bytes));
  }
  const auto alternatives = object.find("alternatives");
  if (alternatives == object.end()) return stage;
  if (!alternatives->is_array()) reader.fail(path + ".alternatives", "must be an array");
  for (size_t k = 0; k < alternatives->size(); ++k) {
    stage.alternatives.push_back(read_alternative(reader, (*alternatives)[k],
                                                  path + ".alternatives[" + std::to_string(k) + "]",
                                                  stage.output_bytes));
  }
  return stage;
}

}  // namespace

plan::Chain chain_from_json(const json& document, const std::string& source) {
  const Reader reader(source);
  if (!document.is_object()) {
    reader.fail("the document", "must be a JSON object with \"input_bytes\" and \"stages\"");
  }
  plan::Chain chain;
  chain.input_bytes = reader.bytes(document, "input_bytes", "", /*optional=*/false);
  if (document.contains("host_bandwidth")) {
    chain.host_bandwidth = reader.time(document, "host_bandwidth", "");
  }
  chain.random_state_bytes = reader.bytes(document, "random_state_bytes", "", true);
  const json& stages = reader.require(document, "stages", "stages");
  if (!stages.is_array()) reader.fail("stages", "must be an array of stage objects");
  if (stages.empty()) reader.fail("stages", "must hold at least one stage");
  for (size_t i = 0; i < stages.size(); ++i) {
    chain.stages.push_back(read_stage(reader, stages[i], "stages[" + std::to_string(i) + "]"));
  }
  try {
    chain.validate();
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(source + ": " + error.what());
  }
  return chain;
}

plan::Chain chain_from_text(const std::string& text, const std::string& source) {
  // The parser stops at a NUL byte as at the end of the text: anything after it would be ignored.
  const size_t nul = text.find('\0');
  if (nul != std::string::npos) {
    throw std::invalid_argument(source + ": not valid JSON: a NUL byte at offset " +
                                std::to_string(nul) +
                                " (JSON text holds none: is the file truncated or padded?)");
  }
  json document;
  CheckedParser parser(document);
  try {
    if (!json::sax_parse(text, &parser)) {
      throw std::invalid_argument(source + ": not valid as a chain: " + parser.error());
    }
  } catch (const json::exception& error) {
    // The library's message quotes the token it stopped at, which may be most of the file.
    const std::string message = error.what();
    throw std::invalid_argument(
        source + ": not valid JSON: " +
        (message.size() <= 200 ? message : plan::quote_excerpt(message, 200)));
  }
  return chain_from_json(document, source);
}

plan::Chain load_chain_file(const std::string& path) {
  // A bounded read of a regular file: never /dev/zero or a pipe until memory runs out.
  constexpr std::uintmax_t kMaxChainFileBytes = std::uintmax_t{64} << 20;
  std::error_code status;
  if (std::filesystem::exists(path, status) && !std::filesystem::is_regular_file(path, status)) {
    throw std::invalid_argument(path + ": the chain file must be a regular file");
  }
  const std::uintmax_t size = std::filesystem::file_size(path, status);
  if (!status && size > kMaxChainFileBytes) {
    throw std::invalid_argument(path + ": the chain file holds " + std::to_string(size) +
                                " bytes, above the limit of " + std::to_string(kMaxChainFileBytes) +
                                " bytes");
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::invalid_argument(path + ": cannot open the chain file");
  std::stringstream text;
  text << file.rdbuf();
  return chain_from_text(text.str(), path);
}

json chain_to_json(const plan::Chain& chain) {
  json stages = json::array();
  for (const plan::Stage& stage : chain.stages) {
    json object = {{"forward_time", stage.forward_time},
                   {"backward_time", stage.backward_time},
                   {"output_bytes", stage.output_bytes},
                   {"saved_bytes", stage.saved_bytes},
                   {"forward_tmp_bytes", stage.forward_tmp_bytes},
                   {"backward_tmp_bytes", stage.backward_tmp_bytes}};
    if (stage.forward_all_tmp_bytes >= 0) {
      object["forward_all_tmp_bytes"] = stage.forward_all_tmp_bytes;
    }
    if (stage.forward_all_time >= 0) object["forward_all_time"] = stage.forward_all_time;
    if (stage.gradient_bytes > 0) object["gradient_bytes"] = stage.gradient_bytes;
    if (stage.random_state_bytes > 0) object["random_state_bytes"] = stage.random_state_bytes;
    if (stage.buffer_bytes > 0) object["buffer_bytes"] = stage.buffer_bytes;
    if (stage.kept_buffer_bytes > 0) object["kept_buffer_bytes"] = stage.kept_buffer_bytes;
    if (!stage.alternatives.empty()) {
      json alternatives = json::array();
      for (const plan::StorageOption& option : stage.alternatives) {
        json written = {{"forward_time", option.forward_time},
                        {"backward_time", option.backward_time},
                        {"saved_bytes", option.saved_bytes},
                        {"forward_tmp_bytes", option.forward_tmp_bytes},
                        {"backward_tmp_bytes", option.backward_tmp_bytes}};
        if (!option.name.empty()) written["name"] = option.name;
        if (option.offloaded_bytes > 0) written["offloaded_bytes"] = option.offloaded_bytes;
        alternatives.push_back(written);
      }
      object["alternatives"] = alternatives;
    }
    stages.push_back(object);
  }
  json document = {{"input_bytes", chain.input_bytes}, {"stages", stages}};
  if (chain.host_bandwidth > 0) document["host_bandwidth"] = chain.host_bandwidth;
  if (chain.random_state_bytes > 0) document["random_state_bytes"] = chain.random_state_bytes;
  return document;
}

json schedule_to_json(const plan::Schedule& schedule) {
  json ops = json::array();
  for (const plan::Op& op : schedule.ops) {
    json object = {{"op", plan::to_string(op.kind)}, {"stage", op.stage}};
    if (op.option != 0) object["option"] = op.option;
    ops.push_back(object);
  }
  return ops;
}

json schedule_to_json(const plan::Schedule& schedule, const plan::Chain& chain) {
  json ops = schedule_to_json(schedule);
  for (size_t k = 0; k < schedule.ops.size(); ++k) {
    const plan::Op& op = schedule.ops[k];
    if (op.option == 0) continue;
    const plan::StorageOption option =
        chain.stages[static_cast<size_t>(op.stage)].option(op.option);
    if (!option.name.empty()) ops[k]["name"] = option.name;
    if (option.offloaded_bytes > 0) ops[k]["offloaded_bytes"] = option.offloaded_bytes;
  }
  return ops;
}

}  // namespace cli
}  // namespace ckpt
