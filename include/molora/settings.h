// molora/settings.h — runtime switches.
//
// Every runtime switch is an environment variable MOLORA_<NAME>, read when it is used (never
// cached at load time). set_setting() overrides the environment for this process; clearing the
// override (an empty optional) falls back to the environment again. `molora info` and
// molora.info() print the effective value of every registered switch.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace molora {

struct SettingInfo {
  std::string name;           // e.g. "MOLORA_LOG"
  std::string default_value;  // value used when neither override nor environment set it
  std::string help;           // one line
};

// Every switch the library reads, in a stable order.
const std::vector<SettingInfo>& registered_settings();

// Effective value: API override, else the environment, else the registered default
// (or "" when `name` is not registered).
std::string get_setting(const std::string& name);
// Same, parsed as an integer; `fallback` when unset or unparsable.
long long get_setting_int(const std::string& name, long long fallback);
// Overrides a switch for this process (std::nullopt removes the override).
void set_setting(const std::string& name, std::optional<std::string> value);
// Where the effective value comes from: "api", "env" or "default".
std::string setting_source(const std::string& name);

// True when MOLORA_LOG names `category` (comma-separated list; "all" enables every category).
bool log_enabled(const std::string& category);
// Writes "[molora:<category>] message" to stderr when the category is enabled.
void log(const std::string& category, const std::string& message);
// Logs `message` the first time `key` is seen in this process, whatever MOLORA_LOG says
// (used for fallbacks and numerics changes, which must never be silent).
void log_once(const std::string& key, const std::string& message);

}  // namespace molora
