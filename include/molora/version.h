// molora/version.h — library version.
#pragma once

#define MOLORA_VERSION_MAJOR 0
#define MOLORA_VERSION_MINOR 1
#define MOLORA_VERSION_PATCH 0
#define MOLORA_VERSION_STRING "0.1.0"

namespace molora {
// The version string of the linked library (may differ from the header in a mixed install).
const char* version() noexcept;
}  // namespace molora
