// simdjson On-Demand over one piece of the traceEvents array. On-Demand is header code compiled
// for the target of this translation unit, so the file is built twice (parse_piece_avx2.cc with
// -mavx2 ..., this one for the baseline ISA) and parse_piece() picks one at run time.
#ifndef MOLORA_PROF_PARSE_NS
#define MOLORA_PROF_PARSE_NS generic
#endif
#include "prof/parse_piece.h"

#include <simdjson.h>

#include <cmath>
#include <functional>

namespace molora::prof::detail {
namespace MOLORA_PROF_PARSE_NS {

namespace od = simdjson::ondemand;

namespace {

enum Cat { kNone, kKernel, kMemcpy, kMemset, kRuntime, kAnnotation };

Cat cat_of(std::string_view c) {
  if (c == "kernel") return kKernel;
  if (c == "gpu_memcpy") return kMemcpy;
  if (c == "gpu_memset") return kMemset;
  if (c == "cuda_runtime" || c == "cuda_driver") return kRuntime;
  if (c == "user_annotation") return kAnnotation;
  return kNone;
}

int64_t to_ns(double us) { return std::isfinite(us) ? std::llround(us * 1000.0) : 0; }

// A number (int or double) or a string (hashed: "stream 7", "Spans", ...).
simdjson::error_code get_id(od::value v, int64_t* out) {
  od::json_type t;
  if (auto e = v.type().get(t)) return e;
  if (t == od::json_type::number) {
    od::number n;
    if (auto e = v.get_number().get(n)) return e;
    *out = n.is_int64() ? n.get_int64() : static_cast<int64_t>(n.as_double());
    return simdjson::SUCCESS;
  }
  if (t == od::json_type::string) {
    std::string_view s;
    if (auto e = v.get_string().get(s)) return e;
    *out = static_cast<int64_t>(std::hash<std::string_view>{}(s) >> 1);
    return simdjson::SUCCESS;
  }
  *out = 0;
  return simdjson::SUCCESS;  // null or other: ignored
}

simdjson::error_code get_dim3(od::value v, int32_t* d) {
  od::array a;
  if (auto e = v.get_array().get(a)) return e;
  int i = 0;
  for (auto x : a) {
    int64_t k = 0;
    if (auto e = x.get_int64().get(k)) return e;
    if (i < 3) d[i] = static_cast<int32_t>(k);
    ++i;
  }
  return simdjson::SUCCESS;
}

struct Ev {
  std::string_view ph, cat, name;
  double ts = 0, dur = 0;
  int64_t pid = 0, tid = 0, correlation = -1, device = -1, stream = -1;
  int32_t grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};
  bool has_ts = false;
};

simdjson::error_code parse_args(od::value v, Ev* ev) {
  od::object o;
  if (auto e = v.get_object().get(o)) return e;
  for (auto f : o) {
    std::string_view k;
    if (auto e = f.unescaped_key().get(k)) return e;
    od::value fv;
    if (auto e = f.value().get(fv)) return e;
    simdjson::error_code e = simdjson::SUCCESS;
    if (k == "correlation") {
      e = get_id(fv, &ev->correlation);
    } else if (k == "device") {
      e = get_id(fv, &ev->device);
    } else if (k == "stream") {
      e = get_id(fv, &ev->stream);
    } else if (k == "grid") {
      e = get_dim3(fv, ev->grid);
    } else if (k == "block") {
      e = get_dim3(fv, ev->block);
    }
    if (e) return e;
  }
  return simdjson::SUCCESS;
}

simdjson::error_code parse_event(od::object o, Ev* ev) {
  for (auto f : o) {
    std::string_view k;
    if (auto e = f.unescaped_key().get(k)) return e;
    od::value v;
    if (auto e = f.value().get(v)) return e;
    simdjson::error_code e = simdjson::SUCCESS;
    switch (k.size()) {
      case 2:
        if (k == "ph") {
          e = v.get_string().get(ev->ph);
        } else if (k == "ts") {
          e = v.get_double().get(ev->ts);
          ev->has_ts = true;
        }
        break;
      case 3:
        if (k == "cat") {
          e = v.get_string().get(ev->cat);
        } else if (k == "dur") {
          e = v.get_double().get(ev->dur);
        } else if (k == "pid") {
          e = get_id(v, &ev->pid);
        } else if (k == "tid") {
          e = get_id(v, &ev->tid);
        }
        break;
      case 4:
        if (k == "name") {
          e = v.get_string().get(ev->name);
        } else if (k == "args") {
          e = parse_args(v, ev);
        }
        break;
      default:
        break;
    }
    if (e) return e;
  }
  return simdjson::SUCCESS;
}

void keep(const Ev& ev, PieceResult* r) {
  if (!ev.ph.empty() && ev.ph != "X") return;  // complete events only (flows, metadata, ...)
  Cat c = cat_of(ev.cat);
  if (c == kNone || !ev.has_ts) return;
  if (c == kKernel || c == kMemcpy || c == kMemset) {
    GpuEvent g;
    g.ts_ns = to_ns(ev.ts);
    g.dur_ns = to_ns(ev.dur);
    g.name = r->names.intern(ev.name);
    g.device = static_cast<int32_t>(ev.device >= 0 ? ev.device : ev.pid);
    g.stream = static_cast<int32_t>(ev.stream >= 0 ? ev.stream : ev.tid);
    g.correlation = ev.correlation;
    for (int i = 0; i < 3; ++i) g.grid[i] = ev.grid[i], g.block[i] = ev.block[i];
    (c == kKernel ? r->kernels : c == kMemcpy ? r->memcpys : r->memsets).push_back(g);
    return;
  }
  CpuSpan s;
  s.ts_ns = to_ns(ev.ts);
  s.dur_ns = to_ns(ev.dur);
  s.pid = ev.pid;
  s.tid = ev.tid;
  if (c == kRuntime) {
    if (ev.correlation < 0) return;
    s.correlation = ev.correlation;
    r->runtime.push_back(s);
  } else {
    s.name = r->names.intern(ev.name);
    r->annotations.push_back(s);
  }
}

}  // namespace

void parse_piece_impl(const char* data, size_t len, uint64_t base, PieceResult* out) {
  thread_local od::parser parser;
  od::document doc;
  auto fail = [&](simdjson::error_code e, const char* where) {
    uint64_t off = base;
    const char* loc = nullptr;
    if (doc.current_location().get(loc) == simdjson::SUCCESS && loc >= data && loc < data + len)
      off = base + static_cast<uint64_t>(loc - data) - (loc > data ? 1 : 0);
    out->status = Status::ParseError("byte " + std::to_string(off) + ": " + where + ": " +
                                     simdjson::error_message(e));
  };
  simdjson::padded_string_view view(data, len, len + simdjson::SIMDJSON_PADDING);
  if (auto e = parser.iterate(view).get(doc)) return fail(e, "traceEvents");
  od::array arr;
  if (auto e = doc.get_array().get(arr)) return fail(e, "traceEvents");
  for (auto elem : arr) {
    od::object o;
    if (auto e = elem.get_object().get(o)) return fail(e, "trace event");
    Ev ev;
    if (auto e = parse_event(o, &ev)) return fail(e, "trace event");
    ++out->events;
    keep(ev, out);
  }
}

}  // namespace MOLORA_PROF_PARSE_NS
}  // namespace molora::prof::detail
