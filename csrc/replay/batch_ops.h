// The batch operations of onebox.replay: its sum tree (a sum tree and a min tree in flat arrays:
// node i has children 2i and 2i+1, the leaves sit at [size, 2 * size)), each working on a whole
// batch one tree level at a time so that the memory loads of different items overlap, and the
// gather of sampled rows.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace onebox::replay {

// Items ahead whose tree nodes or rows are prefetched: a batch drawn at random from a large table
// is a chain of cache and TLB misses, and prefetching lets them overlap instead of waiting for
// each in turn.
constexpr int64_t kAhead = 16;

// Set leaves idx[i] to values[i] (a repeated leaf takes its last value; with skip_empty, a leaf
// that is zero stays zero), then recompute their ancestors from their children (no accumulated
// differences, so no drift).
inline void TreeSet(double* sums, double* mins, int64_t size, const int64_t* idx,
                    const double* values, int64_t n, bool skip_empty) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<int64_t> node(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    node[i] = size + idx[i];
    if (skip_empty && sums[node[i]] == 0) continue;
    sums[node[i]] = values[i];
    mins[node[i]] = values[i] > 0 ? values[i] : inf;
  }
  for (int64_t level = size; level > 1; level >>= 1) {
    for (int64_t i = 0; i < n; ++i) {
      if (i + kAhead < n) {
        const int64_t ahead = node[i + kAhead] & ~int64_t{1};
        __builtin_prefetch(sums + ahead);
        __builtin_prefetch(mins + ahead);
        __builtin_prefetch(sums + (ahead >> 1), 1);
        __builtin_prefetch(mins + (ahead >> 1), 1);
      }
      const int64_t p = node[i] >> 1;
      const double l = mins[2 * p], r = mins[2 * p + 1];
      sums[p] = sums[2 * p] + sums[2 * p + 1];
      mins[p] = l < r ? l : r;
      node[i] = p;
    }
  }
}

// For each target mass u, the leaf whose prefix-sum interval holds it, and its priority. Goes
// right only into a subtree of positive mass, so a zero leaf is never returned while the total is
// positive (a target at or past the total, from rounding, gives the last positive leaf).
inline void TreeFind(const double* sums, int64_t size, const double* targets, int64_t n,
                     int64_t* leaf, double* priority) {
  std::vector<double> u(targets, targets + n);
  std::vector<int64_t> node(static_cast<size_t>(n), 1);
  for (int64_t level = 1; level < size; level <<= 1) {
    for (int64_t i = 0; i < n; ++i) {
      if (i + kAhead < n) __builtin_prefetch(sums + 2 * node[i + kAhead]);
      const int64_t left = 2 * node[i];
      const double left_sum = sums[left];
      const bool right = u[i] >= left_sum && sums[left + 1] > 0;
      if (right) u[i] -= left_sum;
      node[i] = left + (right ? 1 : 0);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    leaf[i] = node[i] - size;
    priority[i] = sums[node[i]];
  }
}

// out[i] = table[rows[i]] for rows of `row_bytes` bytes (the first 4 cache lines of a row ahead
// prefetched; the hardware prefetcher follows longer rows).
inline void TakeRows(const uint8_t* table, int64_t row_bytes, const int64_t* rows, int64_t n,
                     uint8_t* out) {
  const int64_t lines = row_bytes < 256 ? (row_bytes + 63) / 64 : 4;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      const uint8_t* next = table + rows[i + kAhead] * row_bytes;
      for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(next + 64 * l);
    }
    std::memcpy(out + i * row_bytes, table + rows[i] * row_bytes, static_cast<size_t>(row_bytes));
  }
}

}  // namespace onebox::replay
