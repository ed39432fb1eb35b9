// The trace reader: streams the input, finds the traceEvents array and its event boundaries with
// a small structural scanner (strings, brackets), and hands pieces of whole events to parser
// threads. Pieces are parsed by simdjson (parse_piece.cc) and merged in input order.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <regex>
#include <thread>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "molora/prof.h"
#include "molora/settings.h"
#include "prof/input.h"
#include "prof/parse_piece.h"

namespace molora::prof {
namespace {

using detail::PieceResult;

constexpr size_t kPad = 64;  // simdjson padding

struct Piece {
  std::shared_ptr<std::vector<char>> buf;
  size_t off = 0, len = 0;  // "[" ... "]" inside *buf
  uint64_t base = 0;        // stream offset of buf[off + 1]
  size_t seq = 0;
};

// Parser threads fed through a bounded queue; results kept by piece number.
class Pool {
 public:
  explicit Pool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { run(); });
    max_queue_ = static_cast<size_t>(workers) + 1;
  }
  ~Pool() { finish(); }
  void submit(Piece p) {
    if (threads_.empty()) {
      results_.emplace_back(std::make_unique<PieceResult>());
      detail::parse_piece(p.buf->data() + p.off, p.len, p.base, results_.back().get());
      return;
    }
    std::unique_lock<std::mutex> lk(mu_);
    space_.wait(lk, [&] { return queue_.size() < max_queue_; });
    p.seq = results_.size();
    results_.emplace_back(std::make_unique<PieceResult>());
    queue_.push_back(std::move(p));
    ready_.notify_one();
  }
  void finish() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    ready_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  std::vector<std::unique_ptr<PieceResult>>& results() { return results_; }

 private:
  void run() {
    for (;;) {
      Piece p;
      PieceResult* r = nullptr;
      {
        std::unique_lock<std::mutex> lk(mu_);
        ready_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        p = std::move(queue_.front());
        queue_.pop_front();
        r = results_[p.seq].get();
        space_.notify_one();
      }
      detail::parse_piece(p.buf->data() + p.off, p.len, p.base, r);
    }
  }
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable ready_, space_;
  std::deque<Piece> queue_;
  size_t max_queue_ = 1;
  bool stop_ = false;
  std::vector<std::unique_ptr<PieceResult>> results_;
};

// Structural scanner state, carried across buffers.
struct Scanner {
  std::vector<char> stack;  // open brackets
  bool in_string = false, escape = false;
  bool in_events = false, events_seen = false, top_done = false;
  size_t events_depth = 0;
  bool piece_has_event = false;  // an event started since the current piece began
  // At the events array's level, what came last: 0 its '[', 1 an event, 2 a comma. The
  // commas are checked here, on the whole input, not by the piece parser: a piece boundary
  // drops the commas before a piece's first event, so ",," or "}{" would otherwise be an error
  // or not depending on where the pieces fall (found by tests/extra/prof_fuzz.sh).
  int ev_prev = 0;
  std::string key, last_key;  // strings at depth 1 (the top object's keys)
  std::string outside;        // bytes outside the events array (first 1 MB)
};

// Index of the first byte of p[0, n) that is one of the `k` bytes in `set` (k <= 5), or n.
// SSE2: 16 bytes a step; `p` may be read up to 15 bytes past n (the buffers carry kPad).
template <int K>
inline size_t find_any(const char* p, size_t n, const char (&set)[K]) {
  size_t i = 0;
#if defined(__SSE2__)
  __m128i v[K];
  for (int j = 0; j < K; ++j) v[j] = _mm_set1_epi8(set[j]);
  for (; i < n; i += 16) {
    __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
    __m128i m = _mm_cmpeq_epi8(x, v[0]);
    for (int j = 1; j < K; ++j) m = _mm_or_si128(m, _mm_cmpeq_epi8(x, v[j]));
    unsigned bits = static_cast<unsigned>(_mm_movemask_epi8(m));
    if (bits) {
      size_t k = i + static_cast<size_t>(__builtin_ctz(bits));
      return k < n ? k : n;
    }
  }
  return n;
#else
  for (; i < n; ++i)
    for (int j = 0; j < K; ++j)
      if (p[i] == set[j]) return i;
  return n;
#endif
}

constexpr char kStringStops[2] = {'"', '\\'};
constexpr char kEventStops[6] = {'"', '{', '}', '[', ']', '\\'};  // '\\': an error outside strings

#if defined(__SSE2__)
// Bit i set where p[i] == c, for the 64 bytes at p.
inline uint64_t eq64(const char* p, char c) {
  __m128i v = _mm_set1_epi8(c);
  uint64_t m = 0;
  for (int j = 0; j < 4; ++j) {
    __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * j));
    m |= static_cast<uint64_t>(static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(x, v))))
         << (16 * j);
  }
  return m;
}
#endif

// Bits of the bytes escaped by a backslash (backslashes are rare in traces: a scalar walk over
// them); `prev` carries "the first byte of this block is escaped" across blocks.
inline uint64_t escaped_bits(uint64_t backslash, uint64_t* prev) {
  uint64_t escaped = 0, m = backslash;
  if (*prev) escaped = 1, m &= ~uint64_t{1};
  *prev = 0;
  while (m) {
    int i = __builtin_ctzll(m);
    if (i == 63) {
      *prev = 1;
      break;
    }
    escaped |= uint64_t{1} << (i + 1);
    m &= ~(uint64_t{3} << i);
  }
  return escaped;
}

// Bit i set when byte i is inside a string (from the opening quote up to, not including, the
// closing one), given the unescaped quote bits and whether the block starts inside a string.
inline uint64_t string_bits(uint64_t quotes, bool* in_string) {
  uint64_t x = quotes;
  x ^= x << 1, x ^= x << 2, x ^= x << 4, x ^= x << 8, x ^= x << 16, x ^= x << 32;
  if (*in_string) x = ~x;
  *in_string = (x >> 63) & 1;
  return x;
}

Status scan_error(uint64_t off, const std::string& what) {
  return Status::ParseError("byte " + std::to_string(off) + ": " + what);
}

int worker_count(const ReadOptions& o) {
  long long n = o.threads;
  if (n <= 0) n = get_setting_int("MOLORA_PROF_THREADS", 0);
  if (n <= 0) n = std::max(1u, std::thread::hardware_concurrency());
  return n <= 1 ? 0 : static_cast<int>(std::min<long long>(n, 64));
}

void merge(std::vector<std::unique_ptr<PieceResult>>& results, Trace* t) {
  detail::NameTable names;
  for (auto& n : t->names) names.intern(n);
  size_t nk = t->kernels.size(), nc = t->memcpys.size(), ns = t->memsets.size();
  size_t nr = t->runtime.size(), na = t->annotations.size();
  for (auto& r : results) {
    nk += r->kernels.size(), nc += r->memcpys.size(), ns += r->memsets.size();
    nr += r->runtime.size(), na += r->annotations.size();
  }
  t->kernels.reserve(nk), t->memcpys.reserve(nc), t->memsets.reserve(ns);
  t->runtime.reserve(nr), t->annotations.reserve(na);
  for (auto& r : results) {
    std::vector<int32_t> map(r->names.names.size());
    for (size_t i = 0; i < map.size(); ++i) map[i] = names.intern(r->names.names[i]);
    auto add_gpu = [&](std::vector<GpuEvent>& from, std::vector<GpuEvent>& to) {
      for (auto& g : from) {
        g.name = map[g.name];
        to.push_back(g);
      }
      std::vector<GpuEvent>().swap(from);
    };
    add_gpu(r->kernels, t->kernels);
    add_gpu(r->memcpys, t->memcpys);
    add_gpu(r->memsets, t->memsets);
    t->runtime.insert(t->runtime.end(), r->runtime.begin(), r->runtime.end());
    for (auto a : r->annotations) {
      a.name = map[a.name];
      t->annotations.push_back(a);
    }
    t->events += r->events;
    r.reset();
  }
  t->names = std::move(names.names);
}

Status read_input(detail::Input& in, const std::string& label, const ReadOptions& opts, Trace* t) {
  Scanner sc;
  const int workers = worker_count(opts);
  Pool pool(workers);
  // Pieces of at most 4 MiB: they stay in cache between the scanner and the parser and keep
  // simdjson's per-thread index small (measured: 32 MiB pieces were 1.3-1.7x slower and
  // doubled the RSS). ReadOptions::piece_bytes only lowers it.
  const size_t piece = std::clamp<size_t>(opts.piece_bytes, 256, 4u << 20);
  // buf[0] is reserved for the '[' of a continuation piece; data starts at index 1.
  // Buffers are recycled once no parser holds them (fresh ones cost page faults).
  std::vector<std::shared_ptr<std::vector<char>>> spare;
  auto new_buf = [&](size_t n) {
    for (auto& s : spare)
      if (s.use_count() == 1 && s->size() >= n) return s;
    auto s = std::make_shared<std::vector<char>>(n);
    if (spare.size() < static_cast<size_t>(workers) + 4) spare.push_back(s);
    return s;
  };
  auto held = [&](const std::shared_ptr<std::vector<char>>& b) {
    bool spared = std::find(spare.begin(), spare.end(), b) != spare.end();
    return b.use_count() > (spared ? 2 : 1);
  };
  auto buf = new_buf(piece + 1 + kPad);
  size_t len = 1, pos = 1;   // bytes valid, bytes scanned
  size_t piece_begin = 0;    // index of the first content byte of the current piece (0: none)
  size_t last_boundary = 0;  // index just past the last complete event's '}' (0: none)
  uint64_t buf_base = 0;     // stream offset of buf[1]
  uint64_t last_progress = 0;
  bool eof = false;
  Status status;

  auto emit = [&](size_t end) {  // submit [piece_begin, end) as "[...]"; keeps buf intact
    Piece p;
    p.buf = buf;
    p.off = piece_begin - 1;
    p.len = end - piece_begin + 2;
    p.base = buf_base + (piece_begin - 1);
    (*buf)[p.off] = '[';
    (*buf)[end] = ']';
    pool.submit(std::move(p));
  };

  while (status.ok()) {
    // Scan buf[pos, len).
    char* b = buf->data();
    size_t outside_from = sc.in_events ? len : pos;
    while (pos < len) {
#if defined(__SSE2__)
      // Fast path inside an event (outside the events array's own level): 64 bytes a step,
      // strings and escapes by bit masks, only brackets looked at one by one. Leaves when the
      // event closes (the gap to the next event goes through the byte loop below, which checks
      // it) or near the end of the data.
      if (sc.in_events && !sc.in_string && !sc.escape && sc.stack.size() > sc.events_depth &&
          pos + 64 <= len) {
        uint64_t prev_esc = 0;
        bool in_str = false, left = false;
        while (pos + 64 <= len) {
          const char* p = b + pos;
          uint64_t bs = eq64(p, '\\');
          uint64_t esc = escaped_bits(bs, &prev_esc);
          uint64_t quotes = eq64(p, '"') & ~esc;
          uint64_t inside = string_bits(quotes, &in_str);
          if (bs & ~inside) {  // invalid JSON; also keeps the masks exact (escapes only in strings)
            size_t i = pos + static_cast<size_t>(__builtin_ctzll(bs & ~inside));
            status = scan_error(buf_base + i - 1, "backslash outside a string");
            break;
          }
          uint64_t br = (eq64(p, '{') | eq64(p, '}') | eq64(p, '[') | eq64(p, ']')) & ~inside;
          while (br) {
            size_t i = pos + static_cast<size_t>(__builtin_ctzll(br));
            br &= br - 1;
            char c = b[i];
            if (c == '{' || c == '[') {
              sc.stack.push_back(c);
              continue;
            }
            if (sc.stack.back() != (c == '}' ? '{' : '[')) {
              status = scan_error(buf_base + i - 1, std::string("unexpected '") + c + "'");
              pos = i;
              left = true;
              break;
            }
            sc.stack.pop_back();
            if (sc.stack.size() == sc.events_depth) {  // the event is complete
              last_boundary = i + 1;
              sc.ev_prev = 1;
              pos = i + 1;
              left = true;
              break;
            }
          }
          if (left) break;
          pos += 64;
        }
        if (!status.ok()) break;
        if (left) continue;  // at the events level, outside strings
        sc.in_string = in_str;
        sc.escape = prev_esc != 0;
        if (pos >= len) break;
        continue;
      }
#endif
      if (sc.in_string && !sc.escape && sc.in_events) {  // fast path: a string inside an event
        size_t k = pos + find_any(b + pos, len - pos, kStringStops);
        if (k >= len) {
          pos = len;
        } else if (b[k] == '"') {
          sc.in_string = false;
          pos = k + 1;
        } else if (k + 1 >= len) {
          sc.escape = true;
          pos = len;
        } else {
          pos = k + 2;
        }
        continue;
      }
      if (sc.in_string) {
        if (sc.escape) {  // the previous buffer ended on a backslash
          sc.escape = false;
          ++pos;
          continue;
        }
        const char* q = static_cast<const char*>(std::memchr(b + pos, '"', len - pos));
        size_t stop = q ? static_cast<size_t>(q - b) : len;
        const char* bs = static_cast<const char*>(std::memchr(b + pos, '\\', stop - pos));
        if (bs) {
          size_t k = static_cast<size_t>(bs - b);
          if (sc.stack.size() == 1 && !sc.in_events) sc.key.append(b + pos, k - pos);
          if (k + 1 >= len) {
            sc.escape = true;
            pos = len;
          } else {
            pos = k + 2;
          }
          continue;
        }
        if (sc.stack.size() == 1 && !sc.in_events && sc.key.size() < 64)
          sc.key.append(b + pos, stop - pos);
        pos = stop;
        if (q) {
          sc.in_string = false;
          ++pos;
          if (sc.stack.size() == 1) sc.last_key = sc.key;
        }
        continue;
      }
      if (sc.in_events && sc.stack.size() > sc.events_depth) {  // inside an event: skip to the
        pos += find_any(b + pos, len - pos, kEventStops);       // next quote, bracket, backslash
        if (pos >= len) break;
      }
      char c = b[pos];
      switch (c) {
        case '"':
          if (sc.in_events && sc.stack.size() == sc.events_depth) {
            status = scan_error(buf_base + pos - 1, "trace event is not an object");
            break;
          }
          sc.in_string = true;
          sc.key.clear();
          break;
        case '{':
        case '[':
          if (sc.top_done) {
            status = scan_error(buf_base + pos - 1, "content after the end of the JSON document");
            break;
          }
          if (sc.in_events && sc.stack.size() == sc.events_depth) {
            if (c != '{') {
              status = scan_error(buf_base + pos - 1, "trace event is not an object");
              break;
            }
            if (sc.ev_prev == 1) {
              status = scan_error(buf_base + pos - 1, "missing ',' between trace events");
              break;
            }
            if (piece_begin == 0) piece_begin = pos;
            sc.piece_has_event = true;
          }
          sc.stack.push_back(c);
          if (c == '[' && !sc.events_seen &&
              ((sc.stack.size() == 1) || (sc.stack.size() == 2 && sc.last_key == "traceEvents"))) {
            sc.in_events = sc.events_seen = true;
            sc.events_depth = sc.stack.size();
            sc.ev_prev = 0;
            if (outside_from < pos && sc.outside.size() < (1u << 20))
              sc.outside.append(b + outside_from, pos - outside_from);
            outside_from = len;
            piece_begin = 0;
            last_boundary = 0;
            sc.piece_has_event = false;
          }
          break;
        case '}':
        case ']':
          if (sc.stack.empty() || sc.stack.back() != (c == '}' ? '{' : '[')) {
            status = scan_error(buf_base + pos - 1, std::string("unexpected '") + c + "'");
            break;
          }
          sc.stack.pop_back();
          if (sc.in_events) {
            if (c == '}' && sc.stack.size() == sc.events_depth) {
              last_boundary = pos + 1;
              sc.ev_prev = 1;
            } else if (c == ']' && sc.stack.size() + 1 == sc.events_depth) {
              sc.in_events = false;  // the array is complete
              if (last_boundary > piece_begin && piece_begin > 0) emit(last_boundary);
              piece_begin = last_boundary = 0;
              outside_from = pos;
            }
          }
          if (sc.stack.empty()) sc.top_done = true;
          break;
        case ',':
          if (sc.in_events && sc.stack.size() == sc.events_depth) {
            if (sc.ev_prev != 1) {
              status = scan_error(buf_base + pos - 1, "unexpected ',' in traceEvents");
              break;
            }
            sc.ev_prev = 2;
            // A comma before this piece's first event (carried from the previous buffer).
            if (!sc.piece_has_event) b[pos] = ' ';
          }
          break;
        case '\\':
          status = scan_error(buf_base + pos - 1, "backslash outside a string");
          break;
        case ' ':
        case '\n':
        case '\r':
        case '\t':
          break;
        default:
          if (sc.in_events && sc.stack.size() == sc.events_depth) {
            status = scan_error(buf_base + pos - 1, "trace event is not an object");
          } else if (sc.stack.empty()) {
            status = scan_error(
                buf_base + pos - 1,
                sc.top_done ? "content after the end of the JSON document" : "expected '{' or '['");
          }
          break;
      }
      if (!status.ok()) break;
      ++pos;
    }
    if (!status.ok()) break;
    if (!sc.in_events && outside_from < len && sc.outside.size() < (1u << 20))
      sc.outside.append(b + outside_from, len - outside_from);
    if (eof) break;

    // Buffer full (or first pass): emit the complete events, carry the rest.
    if (len == buf->size() - kPad) {
      if (sc.in_events && last_boundary > piece_begin && piece_begin > 0) {
        auto next = new_buf(std::max(piece, len - last_boundary + piece / 2) + 1 + kPad);
        size_t tail = len - last_boundary;
        std::memcpy(next->data() + 1, b + last_boundary, tail);
        emit(last_boundary);
        buf_base += last_boundary - 1;
        buf = next;
        len = 1 + tail;
        piece_begin = last_boundary = 0;
        sc.piece_has_event = false;
        // The tail holds no complete event: rescan it from the boundary's state (depth =
        // the events array, outside strings) to find its first event and blank its comma.
        sc.stack.resize(sc.events_depth);
        sc.in_string = sc.escape = false;
        sc.ev_prev = 1;  // (the boundary follows an event)
        pos = 1;
      } else if (sc.in_events) {  // one event larger than the buffer: grow it
        buf->resize(buf->size() * 2);
      } else {  // outside the events array: drop what was scanned
        buf_base += len - 1;
        len = pos = 1;
      }
    }
    if (!sc.in_events && held(buf)) {  // a parser still reads this buffer
      buf_base += len - 1;
      buf = new_buf(piece + 1 + kPad);
      len = pos = 1;
    }
    size_t got = 0;
    status = in.read(buf->data() + len, buf->size() - kPad - len, &got);
    if (!status.ok()) break;
    if (got == 0) eof = true;
    len += got;
    t->bytes = buf_base + len - 1;
    if (opts.progress && in.consumed() - last_progress > (8u << 20)) {
      last_progress = in.consumed();
      opts.progress(in.consumed(), in.total());
    }
  }

  if (status.ok() && sc.in_events && piece_begin > 0 && last_boundary > piece_begin)
    emit(last_boundary);  // truncated: keep the complete events
  pool.finish();
  for (auto& r : pool.results())
    if (!r->status.ok()) {
      status = Status::ParseError(label + ": " + r->status.message());
      break;
    }
  if (!status.ok()) {
    if (status.code() == StatusCode::kParseError && status.message().rfind(label, 0) != 0)
      return Status::ParseError(label + ": " + status.message());
    return status;
  }
  merge(pool.results(), t);
  if (opts.progress) opts.progress(in.total(), in.total());

  if (!sc.events_seen)
    return Status::ParseError(label + ": byte " + std::to_string(t->bytes) +
                              ": no traceEvents array found");
  if (in.truncated) {
    t->truncated = true;
    t->warnings.push_back(in.warning);
  }
  if (!sc.stack.empty() || sc.in_string) {
    t->truncated = true;
    t->warnings.push_back(
        "input ends at byte " + std::to_string(t->bytes) +
        (sc.in_events ? " inside the traceEvents array" : " before the JSON end") +
        ": the result is partial (" + std::to_string(t->events) + " events)");
  }
  static const std::regex rank_re(R"re("distributedInfo"\s*:\s*\{[^}]*"rank"\s*:\s*(\d+))re");
  std::smatch m;
  if (std::regex_search(sc.outside, m, rank_re)) t->rank = std::stoi(m[1].str());
  return Status::Ok();
}

}  // namespace

Status read_trace(const std::string& path, const ReadOptions& opts, Trace* out) {
  if (!out) return Status::InvalidArgument("out is null");
  *out = Trace{};
  out->path = path;
  std::unique_ptr<detail::Input> in;
  MOLORA_RETURN_IF_ERROR(detail::open_file(path, &in));
  return read_input(*in, path, opts, out);
}

Status read_trace_buffer(const void* data, size_t size, const ReadOptions& opts, Trace* out) {
  if (!out) return Status::InvalidArgument("out is null");
  if (!data && size) return Status::InvalidArgument("data is null");
  *out = Trace{};
  out->path = "<memory>";
  auto in = detail::open_memory(data, size);
  return read_input(*in, out->path, opts, out);
}

}  // namespace molora::prof
