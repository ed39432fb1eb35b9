// pool bindings: _molora.Pool over molora::AdapterPool. Validation and conversion only.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "binding.h"
#include "molora/pool.h"

#if MOLORA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace molora::py {
namespace {

struct PyPool {
  std::unique_ptr<AdapterPool> pool;
};

DType parse_dtype(const std::string& s) {
  if (s == "bfloat16" || s == "bf16") return DType::kBF16;
  if (s == "float16" || s == "f16") return DType::kF16;
  if (s == "float32" || s == "f32") return DType::kF32;
  throw nb::type_error(
      ("dtype must be 'bfloat16', 'float16' or 'float32', got '" + s + "'").c_str());
}

nb::dict info_dict(const AdapterInfo& a) {
  nb::dict d;
  d["name"] = a.name;
  d["path"] = a.path;
  d["id"] = a.id;
  d["slot"] = a.slot;
  d["pinned"] = a.pinned;
  d["r"] = a.r;
  d["lora_alpha"] = a.lora_alpha;
  d["use_rslora"] = a.use_rslora;
  d["max_rank"] = a.max_rank;
  d["tensors"] = a.tensors;
  d["ignored_tensors"] = a.ignored_tensors;
  d["file_bytes"] = a.file_bytes;
  d["image_bytes"] = a.image_bytes;
  d["rank"] = a.rank;
  d["scale"] = a.scale;
  return d;
}

Binder bind_pool([](nb::module_& m) {
  nb::class_<PyPool>(m, "Pool")
      .def(
          "__init__",
          [](PyPool* self, int num_slots, int num_layers, int num_experts, int64_t hidden,
             int64_t intermediate, int r_max, const std::string& dtype, int device,
             bool pinned_images, int64_t staging_bytes) {
            PoolConfig c;
            c.num_slots = num_slots;
            c.num_layers = num_layers;
            c.num_experts = num_experts;
            c.hidden = hidden;
            c.intermediate = intermediate;
            c.r_max = r_max;
            c.dtype = parse_dtype(dtype);
            c.device = device;
            c.pinned_images = pinned_images;
            c.staging_bytes = staging_bytes;
            std::unique_ptr<AdapterPool> p;
            throw_if_error(AdapterPool::create(c, &p));
            new (self) PyPool{std::move(p)};
          },
          nb::arg("num_slots"), nb::arg("num_layers"), nb::arg("num_experts"), nb::arg("hidden"),
          nb::arg("intermediate"), nb::arg("r_max"), nb::arg("dtype"), nb::arg("device"),
          nb::arg("pinned_images"), nb::arg("staging_bytes"))
      .def("load",
           [](PyPool& p, const std::string& name, const std::string& path) {
             int32_t id = -1;
             Status s;
             {
               nb::gil_scoped_release release;
               s = p.pool->load(name, path, &id);
             }
             throw_if_error(s);
             return id;
           })
      .def("unload", [](PyPool& p, int32_t id) { throw_if_error(p.pool->unload(id)); })
      .def("find",
           [](PyPool& p, const std::string& name) {
             int32_t id = -1;
             throw_if_error(p.pool->find(name, &id));
             return id;
           })
      .def("pin", [](PyPool& p, int32_t id) { throw_if_error(p.pool->pin(id)); })
      .def("unpin", [](PyPool& p, int32_t id) { throw_if_error(p.pool->unpin(id)); })
      .def(
          "prepare",
          [](PyPool& p, nb::ndarray<> ids, nb::ndarray<> out, nb::object out_device,
             uintptr_t stream) {
            check_array(ids, "adapter_ids", {DType::kI32}, 1);
            check_array(out, "slot_ids", {DType::kI32}, 1);
            if (is_cuda(ids, "adapter_ids") || is_cuda(out, "slot_ids"))
              throw nb::value_error("adapter_ids and slot_ids must be host (CPU) arrays");
            check_dim(out, "slot_ids", 0, ids.shape(0), "len(adapter_ids)");
            int32_t* dev = nullptr;
            if (!out_device.is_none()) {
              nb::ndarray<> d = nb::cast<nb::ndarray<>>(out_device);
              check_array(d, "slot_ids_device", {DType::kI32}, 1);
              if (!is_cuda(d, "slot_ids_device"))
                throw nb::value_error("slot_ids_device must be a CUDA array");
              if (d.device_id() != p.pool->config().device)
                throw nb::value_error("slot_ids_device must be on the pool's device");
              check_dim(d, "slot_ids_device", 0, ids.shape(0), "len(adapter_ids)");
              dev = static_cast<int32_t*>(d.data());
            }
            Status s = p.pool->prepare(static_cast<const int32_t*>(ids.data()),
                                       static_cast<int64_t>(ids.shape(0)),
                                       static_cast<int32_t*>(out.data()), dev, as_stream(stream));
            throw_if_error(s);
            throw_if_error(p.pool->wait_ready(as_stream(stream)));
          },
          nb::arg("adapter_ids"), nb::arg("slot_ids"), nb::arg("slot_ids_device").none(),
          nb::arg("stream"))
      .def("synchronize", [](PyPool& p) { throw_if_error(p.pool->synchronize()); })
      .def("slot_adapter", [](PyPool& p, int slot) { return p.pool->slot_adapter(slot); })
      .def("info",
           [](PyPool& p, int32_t id) {
             AdapterInfo a;
             throw_if_error(p.pool->info(id, &a));
             return info_dict(a);
           })
      .def("adapters",
           [](PyPool& p) {
             nb::list l;
             for (const auto& a : p.pool->adapters()) l.append(info_dict(a));
             return l;
           })
      .def("stats",
           [](PyPool& p) {
             PoolStats s = p.pool->stats();
             nb::dict d;
             d["num_slots"] = s.num_slots;
             d["resident"] = s.resident;
             d["pinned"] = s.pinned;
             d["adapters"] = s.adapters;
             d["prepares"] = s.prepares;
             d["hits"] = s.hits;
             d["uploads"] = s.uploads;
             d["evictions"] = s.evictions;
             d["rejected"] = s.rejected;
             d["bytes_uploaded"] = s.bytes_uploaded;
             d["host_image_bytes"] = s.host_image_bytes;
             d["slot_bytes"] = s.slot_bytes;
             d["device_bytes"] = s.device_bytes;
             return d;
           })
      .def(
          "view",
          [](nb::handle self, int layer, const std::string& which, bool bf16_as_uint16) {
            PyPool& p = nb::cast<PyPool&>(self);
            const PoolConfig& c = p.pool->config();
            PoolLayerTensors t;
            throw_if_error(p.pool->layer_tensors(layer, &t));
            const size_t S = c.num_slots, E = c.num_experts, R = c.r_max, H = c.hidden,
                         I = c.intermediate;
            std::vector<size_t> shape;
            void* data = nullptr;
            nb::dlpack::dtype dt = nb::dtype<float>();
            if (c.dtype == DType::kF16) dt = {(uint8_t)nb::dlpack::dtype_code::Float, 16, 1};
            if (c.dtype == DType::kBF16)
              dt = bf16_as_uint16
                       ? nb::dlpack::dtype{(uint8_t)nb::dlpack::dtype_code::UInt, 16, 1}
                       : nb::dlpack::dtype{(uint8_t)nb::dlpack::dtype_code::Bfloat, 16, 1};
            if (which == "a_gate_up") {
              data = t.a_gate_up, shape = {2, S, E, R, H};
            } else if (which == "b_gate_up") {
              data = t.b_gate_up, shape = {2, S, E, I, R};
            } else if (which == "a_down") {
              data = t.a_down, shape = {S, E, R, I};
            } else if (which == "b_down") {
              data = t.b_down, shape = {S, E, H, R};
            } else if (which == "rank") {
              data = t.rank, shape = {3, S}, dt = nb::dtype<int32_t>();
            } else if (which == "scale") {
              data = t.scale, shape = {3, S}, dt = nb::dtype<float>();
            } else {
              throw nb::value_error(("unknown slot tensor '" + which +
                                     "' (a_gate_up, b_gate_up, a_down, b_down, rank, scale)")
                                        .c_str());
            }
            const bool dev = c.device >= 0;
            return nb::ndarray<nb::array_api>(
                data, shape.size(), shape.data(), self, nullptr, dt,
                dev ? nb::device::cuda::value : nb::device::cpu::value, dev ? c.device : 0);
          },
          nb::arg("layer"), nb::arg("which"), nb::arg("bf16_as_uint16"));
});

}  // namespace
}  // namespace molora::py
