#pragma once

// Finds the tensors inside arguments and results of checkpointed functions, and puts replacements
// back in the same places. Tensors, optionals, vectors, tuples and pairs are looked into; every
// other type passes through untouched (std::map values are looked into too). Specialise
// `ckpt::detail::TensorTraversal` for a type of your own to make ckpt look into it.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <map>
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
