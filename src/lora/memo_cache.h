// A small bounded memo of a pure function of a plain key (internal to the lora part): the stream
// kernels' tensor maps (lora_stream.cu), which depend only on a weight pointer, its dimensions
// and the box, are encoded on the host once per distinct key and then copied out of here.
//
// Why more than one entry: an engine running eager decode alternates layers, so consecutive
// calls of one op see different weight pointers. A cache of the last call's map alone re-encodes
// on every call there (bench/NOTES.md "lora v0.10"); this one holds `capacity` keys and evicts
// the least recently used. Thread-safe (one mutex; a lookup is a hash of the key's bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace molora::lora::detail {

// Key: trivially copyable without padding (compared and hashed as bytes). Value: copyable.
template <typename Key, typename Value>
class MemoCache {
  static_assert(std::is_trivially_copyable_v<Key> && std::has_unique_object_representations_v<Key>,
                "MemoCache keys are compared as bytes: no padding, no floats");

 public:
  explicit MemoCache(size_t capacity) : cap_(capacity > 0 ? capacity : 1) {}

  // The value of key, computed by make(Value*) on a miss (make's result is stored as well, so a
  // failure it reports in the value is not recomputed either). make runs under the lock.
  template <typename Make>
  Value get(const Key& key, Make&& make) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = index_.find(Bytes{key});
    if (it != index_.end()) {
      ++hits_;
      order_.splice(order_.begin(), order_, it->second);  // most recently used first
      return it->second->second;
    }
    ++misses_;
    Value v{};
    make(&v);
    if (index_.size() >= cap_) {  // evict the least recently used
      index_.erase(Bytes{order_.back().first});
      order_.pop_back();
    }
    order_.emplace_front(key, v);
    index_.emplace(Bytes{key}, order_.begin());
    return v;
  }

  struct Stats {
    uint64_t hits, misses;
    size_t size, capacity;
  };
  Stats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {hits_, misses_, index_.size(), cap_};
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    index_.clear();
    order_.clear();
    hits_ = misses_ = 0;
  }

 private:
  struct Bytes {
    Key k;
    bool operator==(const Bytes& o) const { return std::memcmp(&k, &o.k, sizeof(Key)) == 0; }
  };
  struct Hash {
    size_t operator()(const Bytes& b) const {  // FNV-1a over the key's bytes
      const auto* p = reinterpret_cast<const unsigned char*>(&b.k);
      uint64_t h = 1469598103934665603ull;
      for (size_t i = 0; i < sizeof(Key); ++i) h = (h ^ p[i]) * 1099511628211ull;
      return static_cast<size_t>(h);
    }
  };
  using Order = std::list<std::pair<Key, Value>>;
  const size_t cap_;
  mutable std::mutex mu_;
  Order order_;
  std::unordered_map<Bytes, typename Order::iterator, Hash> index_;
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace molora::lora::detail
