// comm bindings: _molora.Communicator over molora::Communicator, and the CPU references.
// Validation and conversion only; the Python layer (molora/comm.py) resolves streams, allocates
// outputs and handles strided tensors.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <vector>

#include "binding.h"
#include "molora/comm.h"

namespace molora::py {
namespace {

struct PyComm {
  std::unique_ptr<Communicator> c;
};

CommAlgo parse_algo(const std::string& s) {
  if (s == "auto") return CommAlgo::kAuto;
  if (s == "oneshot" || s == "one_shot") return CommAlgo::kOneShot;
  if (s == "twoshot" || s == "two_shot") return CommAlgo::kTwoShot;
  throw nb::value_error(("algo must be 'auto', 'oneshot' or 'twoshot', got '" + s + "'").c_str());
}

CommFallback parse_reason(const std::string& s) {
  for (int i = 0; i < static_cast<int>(CommFallback::kCount); ++i)
    if (s == comm_fallback_name(static_cast<CommFallback>(i))) return static_cast<CommFallback>(i);
  throw nb::value_error(("unknown fallback reason '" + s + "'").c_str());
}

CommOptions options(size_t max_bytes, long long timeout_ms, long long oneshot_max,
                    const std::string& algo, bool create_nccl, uintptr_t nccl_comm) {
  CommOptions o;
  o.max_bytes = max_bytes;
  o.timeout_ms = timeout_ms;
  o.oneshot_max = oneshot_max;
  o.algo = parse_algo(algo);
  o.create_nccl = create_nccl;
  o.nccl_comm = reinterpret_cast<void*>(nccl_comm);
  return o;
}

int64_t numel_of(const nb::ndarray<>& a) {
  int64_t n = 1;
  for (size_t i = 0; i < a.ndim(); ++i) n *= static_cast<int64_t>(a.shape(i));
  return n;
}

// A CUDA array on the communicator's device, contiguous, of one of `allowed`.
DType check_tensor(const PyComm& p, const nb::ndarray<>& a, const char* arg,
                   std::vector<DType> allowed) {
  DType dt = check_array(a, arg, allowed, -1);
  if (!is_cuda(a, arg))
    throw nb::value_error((std::string(arg) + " must be a CUDA tensor").c_str());
  if (static_cast<int>(a.device_id()) != p.c->device())
    throw nb::value_error((std::string(arg) + " must be on cuda:" + std::to_string(p.c->device()) +
                           " (the communicator's device)")
                              .c_str());
  return dt;
}

const std::vector<DType> kAnyDtype = {DType::kBF16, DType::kF16, DType::kF32, DType::kI32,
                                      DType::kI64};

void check_pair(const PyComm& p, const nb::ndarray<>& in, const nb::ndarray<>& out, DType* dt,
                int64_t* n) {
  *dt = check_tensor(p, in, "x", kAnyDtype);
  DType dto = check_tensor(p, out, "out", kAnyDtype);
  if (dto != *dt) throw nb::type_error("out must have the dtype of x");
  *n = numel_of(in);
  if (numel_of(out) != *n) throw nb::value_error("out must have as many elements as x");
}

nb::dict stats_dict(const CommStats& s) {
  nb::dict d;
  d["p2p_calls"] = s.p2p_calls;
  d["oneshot_calls"] = s.oneshot_calls;
  d["twoshot_calls"] = s.twoshot_calls;
  d["fused_calls"] = s.fused_calls;
  d["nccl_calls"] = s.nccl_calls;
  d["unavailable"] = s.unavailable;
  nb::dict f;
  for (int i = 0; i < static_cast<int>(CommFallback::kCount); ++i)
    f[comm_fallback_name(static_cast<CommFallback>(i))] = s.fallback[i];
  d["fallback"] = f;
  return d;
}

std::vector<const void*> host_inputs(const std::vector<nb::ndarray<>>& inputs, DType* dt,
                                     int64_t* n) {
  if (inputs.empty()) throw nb::value_error("inputs must hold one array per rank");
  std::vector<const void*> ptrs;
  for (size_t r = 0; r < inputs.size(); ++r) {
    DType d = check_array(inputs[r], "inputs", {DType::kBF16, DType::kF16, DType::kF32}, -1);
    if (is_cuda(inputs[r], "inputs")) throw nb::value_error("inputs must be CPU arrays");
    if (r == 0) *dt = d, *n = numel_of(inputs[r]);
    if (d != *dt || numel_of(inputs[r]) != *n)
      throw nb::value_error("inputs must share one dtype and size");
    ptrs.push_back(inputs[r].data());
  }
  return ptrs;
}

void check_host_out(const nb::ndarray<>& a, const char* arg, DType dt, int64_t n) {
  if (check_array(a, arg, {dt}, -1) != dt || is_cuda(a, arg))
    throw nb::value_error((std::string(arg) + " must be a CPU array").c_str());
  if (numel_of(a) != n)
    throw nb::value_error((std::string(arg) + " has the wrong number of elements").c_str());
}

Binder bind_comm([](nb::module_& m) {
  m.def("comm_fallback_names", [] {
    std::vector<std::string> v;
    for (int i = 0; i < static_cast<int>(CommFallback::kCount); ++i)
      v.push_back(comm_fallback_name(static_cast<CommFallback>(i)));
    return v;
  });
  m.def(
      "comm_all_reduce_reference",
      [](const std::vector<nb::ndarray<>>& inputs, nb::ndarray<> out) {
        DType dt = DType::kF32;
        int64_t n = 0;
        std::vector<const void*> ptrs = host_inputs(inputs, &dt, &n);
        check_host_out(out, "out", dt, n);
        throw_if_error(
            all_reduce_reference(ptrs.data(), static_cast<int>(ptrs.size()), out.data(), n, dt));
      },
      nb::arg("inputs"), nb::arg("out"));
  m.def(
      "comm_all_reduce_residual_rmsnorm_reference",
      [](const std::vector<nb::ndarray<>>& inputs, nb::ndarray<> residual, nb::ndarray<> weight,
         nb::ndarray<> out, int64_t hidden, float eps) {
        DType dt = DType::kF32;
        int64_t n = 0;
        std::vector<const void*> ptrs = host_inputs(inputs, &dt, &n);
        check_host_out(residual, "residual", dt, n);
        check_host_out(out, "out", dt, n);
        check_host_out(weight, "weight", dt, hidden);
        throw_if_error(all_reduce_residual_rmsnorm_reference(
            ptrs.data(), static_cast<int>(ptrs.size()), residual.data(), weight.data(), out.data(),
            n, hidden, eps, dt));
      },
      nb::arg("inputs"), nb::arg("residual"), nb::arg("weight"), nb::arg("out"), nb::arg("hidden"),
      nb::arg("eps"));

  nb::class_<PyComm>(m, "Communicator")
      .def_static(
          "create",
          [](int rank, int world, int device, nb::callable fn, size_t max_bytes,
             long long timeout_ms, long long oneshot_max, const std::string& algo, bool create_nccl,
             uintptr_t nccl_comm) {
            CommExchange ex = [fn](const std::vector<uint8_t>& mine,
                                   std::vector<uint8_t>* all) -> Status {
              try {
                nb::bytes arg(reinterpret_cast<const char*>(mine.data()), mine.size());
                nb::object r = fn(arg);
                if (!nb::isinstance<nb::bytes>(r))
                  return Status::InvalidArgument("exchange function must return bytes");
                nb::bytes b = nb::borrow<nb::bytes>(r);
                const uint8_t* p = reinterpret_cast<const uint8_t*>(b.c_str());
                all->assign(p, p + b.size());
                return Status::Ok();
              } catch (const nb::python_error& e) {
                return Status::Internal(std::string("exchange function raised: ") + e.what());
              }
            };
            std::unique_ptr<Communicator> c;
            throw_if_error(Communicator::create(
                rank, world, device, ex,
                options(max_bytes, timeout_ms, oneshot_max, algo, create_nccl, nccl_comm), &c));
            return new PyComm{std::move(c)};
          },
          nb::arg("rank"), nb::arg("world"), nb::arg("device"), nb::arg("exchange"),
          nb::arg("max_bytes"), nb::arg("timeout_ms"), nb::arg("oneshot_max"), nb::arg("algo"),
          nb::arg("create_nccl"), nb::arg("nccl_comm"))
      .def_static(
          "create_local_group",
          [](int world, int device, size_t max_bytes, long long timeout_ms, long long oneshot_max,
             const std::string& algo) {
            std::vector<std::unique_ptr<Communicator>> v;
            throw_if_error(Communicator::create_local_group(
                world, device, options(max_bytes, timeout_ms, oneshot_max, algo, false, 0), &v));
            nb::list l;
            for (auto& c : v)
              l.append(nb::cast(new PyComm{std::move(c)}, nb::rv_policy::take_ownership));
            return l;
          },
          nb::arg("world"), nb::arg("device"), nb::arg("max_bytes"), nb::arg("timeout_ms"),
          nb::arg("oneshot_max"), nb::arg("algo"))
      .def(
          "all_reduce",
          [](PyComm& p, nb::ndarray<> in, nb::ndarray<> out, uintptr_t stream) {
            DType dt;
            int64_t n;
            check_pair(p, in, out, &dt, &n);
            throw_if_error(p.c->all_reduce(in.data(), out.data(), n, dt, as_stream(stream)));
          },
          nb::arg("x"), nb::arg("out"), nb::arg("stream"))
      .def(
          "fallback_all_reduce",
          [](PyComm& p, nb::ndarray<> in, nb::ndarray<> out, const std::string& reason,
             uintptr_t stream) {
            DType dt;
            int64_t n;
            check_pair(p, in, out, &dt, &n);
            throw_if_error(p.c->fallback_all_reduce(in.data(), out.data(), n, dt,
                                                    parse_reason(reason), as_stream(stream)));
          },
          nb::arg("x"), nb::arg("out"), nb::arg("reason"), nb::arg("stream"))
      .def(
          "all_reduce_residual_rmsnorm",
          [](PyComm& p, nb::ndarray<> in, nb::ndarray<> residual, nb::ndarray<> weight,
             nb::ndarray<> out, float eps, uintptr_t stream) {
            const std::vector<DType> half = {DType::kBF16, DType::kF16};
            DType dt = check_tensor(p, in, "x", half);
            if (check_tensor(p, residual, "residual", half) != dt ||
                check_tensor(p, weight, "weight", half) != dt ||
                check_tensor(p, out, "out", half) != dt)
              throw nb::type_error("x, residual, weight and out must share one dtype");
            if (in.ndim() < 1) throw nb::value_error("x must have a last dimension (hidden)");
            const int64_t hidden = static_cast<int64_t>(in.shape(in.ndim() - 1)), n = numel_of(in);
            if (weight.ndim() != 1) throw nb::value_error("weight must have 1 dimension");
            check_dim(weight, "weight", 0, hidden, "x.shape[-1]");
            if (numel_of(residual) != n || numel_of(out) != n)
              throw nb::value_error("residual and out must have the shape of x");
            throw_if_error(p.c->all_reduce_residual_rmsnorm(in.data(), residual.data(),
                                                            weight.data(), out.data(), n, hidden,
                                                            eps, dt, as_stream(stream)));
          },
          nb::arg("x"), nb::arg("residual"), nb::arg("weight"), nb::arg("out"), nb::arg("eps"),
          nb::arg("stream"))
      .def("check", [](PyComm& p) { throw_if_error(p.c->check()); })
      .def("stats", [](PyComm& p) { return stats_dict(p.c->stats()); })
      .def("epoch",
           [](PyComm& p) {
             uint64_t e = 0;
             throw_if_error(p.c->epoch(&e));
             return e;
           })
      .def_prop_ro("rank", [](PyComm& p) { return p.c->rank(); })
      .def_prop_ro("world", [](PyComm& p) { return p.c->world(); })
      .def_prop_ro("device", [](PyComm& p) { return p.c->device(); })
      .def_prop_ro("p2p_enabled", [](PyComm& p) { return p.c->p2p_enabled(); })
      .def_prop_ro("p2p_disabled_reason", [](PyComm& p) { return p.c->p2p_disabled_reason(); })
      .def_prop_ro("capacity_bytes", [](PyComm& p) { return p.c->capacity_bytes(); })
      .def_prop_ro("max_bytes", [](PyComm& p) { return p.c->max_bytes(); })
      .def("set_max_bytes", [](PyComm& p, size_t b) { throw_if_error(p.c->set_max_bytes(b)); })
      .def("set_timeout_ms", [](PyComm& p, long long ms) { p.c->set_timeout_ms(ms); })
      .def("set_algo", [](PyComm& p, const std::string& a) { p.c->set_algo(parse_algo(a)); })
      .def_prop_ro("oneshot_max_bytes", [](PyComm& p) { return p.c->oneshot_max_bytes(); });
});

}  // namespace
}  // namespace molora::py
