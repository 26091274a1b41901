// Python bindings of onebox.replay's batch operations: module onebox._replay. onebox.replay
// checks arguments with friendly messages; this layer checks again what would be unsafe.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "replay/batch_ops.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

template <typename T>
using In = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
template <typename T>
using Out = nb::ndarray<T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

int64_t LeafCount(const Out<double>& sums, const Out<double>& mins) {
  const int64_t nodes = static_cast<int64_t>(sums.shape(0));
  if (nodes < 2 || (nodes & (nodes - 1)) != 0 || static_cast<int64_t>(mins.shape(0)) != nodes) {
    throw std::invalid_argument("sums and mins must have the same power-of-two length >= 2");
  }
  return nodes / 2;
}

}  // namespace

NB_MODULE(_replay, m) {
  m.doc() = "Batch operations of onebox.replay (see csrc/replay/batch_ops.h).";
  m.def(
      "tree_set",
      [](Out<double> sums, Out<double> mins, In<int64_t> indices, In<double> values,
         int64_t capacity, bool skip_empty) {
        const int64_t size = LeafCount(sums, mins);
        const int64_t n = static_cast<int64_t>(indices.shape(0));
        if (static_cast<int64_t>(values.shape(0)) != n) {
          throw std::invalid_argument("indices and values must have the same length");
        }
        if (capacity < 1 || capacity > size) throw std::invalid_argument("bad capacity");
        for (int64_t i = 0; i < n; ++i) {
          if (indices(i) < 0 || indices(i) >= capacity) {
            throw std::out_of_range("indices must be slots in [0, " + std::to_string(capacity) + ")");
          }
          if (!(values(i) >= 0) || !std::isfinite(values(i))) {
            throw std::invalid_argument("priorities must be finite and >= 0");
          }
        }
        nb::gil_scoped_release release;
        onebox::replay::TreeSet(sums.data(), mins.data(), size, indices.data(), values.data(), n,
                                skip_empty);
      },
      "sums"_a, "mins"_a, "indices"_a, "values"_a, "capacity"_a, "skip_empty"_a);
  m.def(
      "tree_find",
      [](Out<double> sums, In<double> targets, Out<int64_t> leaf, Out<double> priority) {
        const int64_t size = LeafCount(sums, sums);
        const int64_t n = static_cast<int64_t>(targets.shape(0));
        if (static_cast<int64_t>(leaf.shape(0)) != n || static_cast<int64_t>(priority.shape(0)) != n) {
          throw std::invalid_argument("targets, leaf and priority must have the same length");
        }
        nb::gil_scoped_release release;
        onebox::replay::TreeFind(sums.data(), size, targets.data(), n, leaf.data(), priority.data());
      },
      "sums"_a, "targets"_a, "leaf"_a, "priority"_a);
  m.def(
      "take_rows",
      [](nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> table,
         In<int64_t> rows, nb::ndarray<uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> out) {
        const int64_t count = static_cast<int64_t>(table.shape(0));
        const int64_t row_bytes = static_cast<int64_t>(table.shape(1));
        const int64_t n = static_cast<int64_t>(rows.shape(0));
        if (static_cast<int64_t>(out.shape(0)) != n || static_cast<int64_t>(out.shape(1)) != row_bytes) {
          throw std::invalid_argument("out must have shape (len(rows), table.shape[1])");
        }
        for (int64_t i = 0; i < n; ++i) {
          if (rows(i) < 0 || rows(i) >= count) {
            throw std::out_of_range("indices must be in [0, " + std::to_string(count) + ")");
          }
        }
        nb::gil_scoped_release release;
        onebox::replay::TakeRows(table.data(), row_bytes, rows.data(), n, out.data());
      },
      "table"_a, "rows"_a, "out"_a);
}
