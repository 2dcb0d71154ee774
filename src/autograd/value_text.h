#pragma once

// Operator arguments written down as bytes, so that two calls can be told apart: a tensor by its
// geometry (and whatever more a caller adds), other values by value. `ForwardRecord` writes a
// forward's operators with it; the modeled device keys what an operator without a meta kernel
// gave on the CPU by it.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstring>
#include <functional>
#include <string>

namespace ckpt {
namespace detail {

class ValueText {
 public:
  /// How a tensor argument is written; `geometry` by default.
  using TensorWriter = std::function<void(ValueText&, const at::Tensor&)>;

  explicit ValueText(TensorWriter tensor = nullptr) : tensor_(std::move(tensor)) {}

  /// Appends the bytes of a plain value (an integer, a double, a flag, a character).
  template <class T>
  void word(const T& value) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    text_.append(bytes, sizeof(T));
  }
  /// Appends a string, its length first.
  void string(const std::string& value);
  /// Appends an operator's argument or return: tensors through the writer, lists and tuples
  /// element by element, scalars, strings and devices by value. Any other kind (a generator, an
  /// object) makes the text incomplete: state it can't see into.
  void value(const c10::IValue& value);
  /// Appends a tensor's defined flag and, where it has strided storage, its dtype, device, sizes,
  /// strides, storage offset, storage bytes and requires_grad; a tensor without strided storage
  /// makes the text incomplete.
  void geometry(const at::Tensor& tensor);

  void mark_incomplete() { complete_ = false; }
  /// Whether every value written could be written in full.
  bool complete() const { return complete_; }
  const std::string& text() const { return text_; }
  std::string take() { return std::move(text_); }

 private:
  TensorWriter tensor_;
  std::string text_;
  bool complete_ = true;
};

}  // namespace detail
}  // namespace ckpt
