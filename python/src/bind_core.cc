// Core bindings: version, info, settings.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "binding.h"
#include "molora/info.h"
#include "molora/settings.h"
#include "molora/version.h"

namespace molora::py {
namespace {
Binder bind_core([](nb::module_& m) {
  m.def(
      "version", [] { return std::string(molora::version()); }, "Library version string.");
  m.def("info_json", &molora::info_json,
        "Build and runtime report as JSON (schema molora.info/1).");
  m.def("info_text", &molora::info_text, "Build and runtime report as text (as `molora info`).");
  m.def("gpu_count", &molora::gpu_count, "Number of usable CUDA devices (0 without CUDA).");
  m.def("get_setting", &molora::get_setting, nb::arg("name"),
        "Effective value of a MOLORA_* switch (API override, else environment, else default).");
  m.def("set_setting", &molora::set_setting, nb::arg("name"), nb::arg("value").none(),
        "Override a MOLORA_* switch for this process; None removes the override.");
  m.def("setting_source", &molora::setting_source, nb::arg("name"),
        "Where the effective value comes from: 'api', 'env' or 'default'.");
});
}  // namespace
}  // namespace molora::py
