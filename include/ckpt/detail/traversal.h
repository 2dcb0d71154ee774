#pragma once

// Finds the tensors inside arguments and results of checkpointed functions, and puts replacements
// back in the same places. Tensors, optionals, vectors, tuples, pairs, std::map values and types
// with a `ckpt_tensors` function (found by argument-dependent lookup; see docs/user-types.md) are
// looked into; every other type passes through untouched.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace ckpt {
namespace detail {

/// Reads replacement tensors in traversal order.
class TensorCursor {
 public:
  explicit TensorCursor(const std::vector<at::Tensor>& tensors) : tensors_(tensors) {}
  const at::Tensor& next() { return tensors_.at(position_++); }

 private:
  const std::vector<at::Tensor>& tensors_;
  std::size_t position_ = 0;
};

/// The primary template: a type that holds no tensor.
template <class T, class Enable = void>
struct TensorTraversal {
  static constexpr bool kHasTensors = false;
  static void collect(const T& /*value*/, std::vector<at::Tensor>& /*out*/) {}
  static void replace(T& /*value*/, TensorCursor& /*cursor*/) {}
};

template <>
struct TensorTraversal<at::Tensor> {
  static constexpr bool kHasTensors = true;
  static void collect(const at::Tensor& value, std::vector<at::Tensor>& out) {
    out.push_back(value);
  }
  static void replace(at::Tensor& value, TensorCursor& cursor) { value = cursor.next(); }
};

// std::optional and c10::optional (the same type in newer LibTorch) alike.
template <class T, class = void>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<T,
                  std::void_t<typename T::value_type, decltype(std::declval<T&>().has_value()),
                              decltype(*std::declval<T&>()), decltype(std::declval<T&>().reset())>>
    : std::true_type {};

template <class T>
struct TensorTraversal<T, std::enable_if_t<IsOptional<T>::value>> {
  using Inner = TensorTraversal<typename T::value_type>;
  static constexpr bool kHasTensors = Inner::kHasTensors;
  static void collect(const T& value, std::vector<at::Tensor>& out) {
    if (value.has_value()) Inner::collect(*value, out);
  }
  static void replace(T& value, TensorCursor& cursor) {
    if (value.has_value()) Inner::replace(*value, cursor);
  }
};

template <class T, class A>
struct TensorTraversal<std::vector<T, A>> {
  using Inner = TensorTraversal<T>;
  static constexpr bool kHasTensors = Inner::kHasTensors;
  static void collect(const std::vector<T, A>& value, std::vector<at::Tensor>& out) {
    if constexpr (kHasTensors) {
      for (const auto& element : value) Inner::collect(element, out);
    }
  }
  static void replace(std::vector<T, A>& value, TensorCursor& cursor) {
    if constexpr (kHasTensors) {
      for (auto& element : value) Inner::replace(element, cursor);
    }
  }
};

// Keys are looked up in the map's (sorted) order; only the values may hold tensors.
template <class K, class V, class C, class A>
struct TensorTraversal<std::map<K, V, C, A>> {
  using Inner = TensorTraversal<V>;
  static constexpr bool kHasTensors = Inner::kHasTensors;
  static void collect(const std::map<K, V, C, A>& value, std::vector<at::Tensor>& out) {
    if constexpr (kHasTensors) {
      for (const auto& entry : value) Inner::collect(entry.second, out);
    }
  }
  static void replace(std::map<K, V, C, A>& value, TensorCursor& cursor) {
    if constexpr (kHasTensors) {
      for (auto& entry : value) Inner::replace(entry.second, cursor);
    }
  }
};

template <class... T>
struct TensorTraversal<std::tuple<T...>> {
  static constexpr bool kHasTensors = (TensorTraversal<T>::kHasTensors || ...);
  static void collect(const std::tuple<T...>& value, std::vector<at::Tensor>& out) {
    std::apply(
        [&](const auto&... e) {
          (TensorTraversal<std::decay_t<decltype(e)>>::collect(e, out), ...);
        },
        value);
  }
  static void replace(std::tuple<T...>& value, TensorCursor& cursor) {
    std::apply(
        [&](auto&... e) { (TensorTraversal<std::decay_t<decltype(e)>>::replace(e, cursor), ...); },
        value);
  }
};

template <class A, class B>
struct TensorTraversal<std::pair<A, B>> {
  static constexpr bool kHasTensors =
      TensorTraversal<A>::kHasTensors || TensorTraversal<B>::kHasTensors;
  static void collect(const std::pair<A, B>& value, std::vector<at::Tensor>& out) {
    TensorTraversal<A>::collect(value.first, out);
    TensorTraversal<B>::collect(value.second, out);
  }
  static void replace(std::pair<A, B>& value, TensorCursor& cursor) {
    TensorTraversal<A>::replace(value.first, cursor);
    TensorTraversal<B>::replace(value.second, cursor);
  }
};

// The customisation point for users' types: `auto ckpt_tensors(T& value)` in T's namespace,
// returning `std::tie(...)` of the members that hold tensors. This declaration only makes the
// name known here; the users' overloads are found by argument-dependent lookup.
void ckpt_tensors() = delete;

template <class T, class = void>
struct HasCkptTensors : std::false_type {};
template <class T>
struct HasCkptTensors<T, std::void_t<decltype(ckpt_tensors(std::declval<T&>()))>> : std::true_type {
};

template <class Tuple>
struct FieldsTraversal;
template <class... Field>
struct FieldsTraversal<std::tuple<Field...>> {
  static constexpr bool kHasTensors = (TensorTraversal<std::decay_t<Field>>::kHasTensors || ...);
};

template <class T>
struct TensorTraversal<T, std::enable_if_t<HasCkptTensors<T>::value>> {
  using Fields = decltype(ckpt_tensors(std::declval<T&>()));
  static constexpr bool kHasTensors = FieldsTraversal<Fields>::kHasTensors;
  static void collect(const T& value, std::vector<at::Tensor>& out) {
    // ckpt_tensors takes a mutable reference (it serves replace too); collect only reads.
    std::apply(
        [&](auto&... field) {
          (TensorTraversal<std::decay_t<decltype(field)>>::collect(field, out), ...);
        },
        ckpt_tensors(const_cast<T&>(value)));
  }
  static void replace(T& value, TensorCursor& cursor) {
    std::apply(
        [&](auto&... field) {
          (TensorTraversal<std::decay_t<decltype(field)>>::replace(field, cursor), ...);
        },
        ckpt_tensors(value));
  }
};

// Results made only of numbers, strings and tuples of them: ckpt can be sure that they hold no
// tensor. Any other type without tensors ckpt can see may be a user's struct that hides some.
template <class T>
struct IsPlainValue : std::bool_constant<std::is_arithmetic_v<T> || std::is_enum_v<T> ||
                                         std::is_same_v<T, std::string>> {};
template <class... T>
struct IsPlainValue<std::tuple<T...>> : std::bool_constant<(IsPlainValue<T>::value && ...)> {};
template <class A, class B>
struct IsPlainValue<std::pair<A, B>>
    : std::bool_constant<IsPlainValue<A>::value && IsPlainValue<B>::value> {};

/// Appends every tensor inside `value` (undefined ones included) to `out`, in traversal order.
template <class T>
void collect_tensors(const T& value, std::vector<at::Tensor>& out) {
  TensorTraversal<T>::collect(value, out);
}

/// Replaces every tensor inside `value` with the next one of `cursor`, in traversal order.
template <class T>
void replace_tensors(T& value, TensorCursor& cursor) {
  TensorTraversal<T>::replace(value, cursor);
}

}  // namespace detail
}  // namespace ckpt
