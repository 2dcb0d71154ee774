#include "autograd/value_text.h"

#include <c10/core/Layout.h>

namespace ckpt {
namespace detail {

void ValueText::string(const std::string& value) {
  word(value.size());
  text_.append(value);
}

void ValueText::geometry(const at::Tensor& tensor) {
  word('T');
  word(tensor.defined());
  if (!tensor.defined()) return;
  if (tensor.layout() != c10::kStrided || !tensor.has_storage()) {
    complete_ = false;
    return;
  }
  word(static_cast<int>(tensor.scalar_type()));
  word(static_cast<int>(tensor.device().type()));
  word(static_cast<int>(tensor.device().index()));
  word(tensor.dim());
  for (const int64_t size : tensor.sizes()) word(size);
  for (const int64_t stride : tensor.strides()) word(stride);
  word(tensor.storage_offset());
  word(static_cast<int64_t>(tensor.storage().nbytes()));
  word(tensor.requires_grad());
}

void ValueText::value(const c10::IValue& value) {
  if (value.isTensor()) {
    if (tensor_) {
      tensor_(*this, value.toTensor());
    } else {
      geometry(value.toTensor());
    }
  } else if (value.isNone()) {
    word('n');
  } else if (value.isBool()) {
    word('b');
    word(value.toBool());
  } else if (value.isInt()) {
    word('i');
    word(value.toInt());
  } else if (value.isDouble()) {
    word('d');
    word(value.toDouble());
  } else if (value.isComplexDouble()) {
    word('c');
    word(value.toComplexDouble().real());
    word(value.toComplexDouble().imag());
  } else if (value.isString()) {
    word('s');
    string(value.toStringRef());
  } else if (value.isDevice()) {
    word('v');
    word(static_cast<int>(value.toDevice().type()));
    word(static_cast<int>(value.toDevice().index()));
  } else if (value.isList()) {
    word('L');
    word(value.toListRef().size());
    for (const c10::IValue& element : value.toListRef()) this->value(element);
  } else if (value.isTuple()) {
    word('U');
    word(value.toTupleRef().elements().size());
    for (const c10::IValue& element : value.toTupleRef().elements()) this->value(element);
  } else {
    complete_ = false;
  }
}

}  // namespace detail
}  // namespace ckpt
