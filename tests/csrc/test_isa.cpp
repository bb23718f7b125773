// Runtime ISA selection (isa.cpp): the variants the CPU reports, and the reason set_isa gives for one
// this build has but this CPU cannot run. Under qemu the CMake harness names what the emulated CPU must
// report (ENGINE_TEST_PRESENT_ISAS, e.g. vsx on a POWER9 model) and what its oldest CPU model must not
// (ENGINE_TEST_MISSING_ISAS, e.g. vsx on a POWER8 model: the VSX kernels are built for ISA 3.0).
#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "check.h"

using namespace engine_cpu;

namespace {

std::vector<std::string> names(const char* env) {
  std::vector<std::string> out;
  const char* v = std::getenv(env);
  std::stringstream ss(v ? v : "");
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

bool supported(const std::string& name) {
  for (Isa isa : supported_isas())
    if (name == isa_name(isa)) return true;
  return false;
}

Isa by_name(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(Isa::Rvv); ++i)
    if (name == isa_name(static_cast<Isa>(i))) return static_cast<Isa>(i);
  check::fail("unknown ISA name in the test environment: " + name);
  return Isa::Scalar;
}

}  // namespace

int main() {
  const std::vector<Isa> have = supported_isas();
  if (have.empty() || have.back() != Isa::Scalar) check::fail("supported_isas() must end with scalar");
  if (std::find(have.begin(), have.end(), current_isa()) == have.end()) check::fail("current_isa() is not supported");
  for (const std::string& name : names("ENGINE_TEST_PRESENT_ISAS")) {
    if (!supported(name)) check::fail("this CPU should run the '" + name + "' variant");
    else set_isa(name);
  }
  for (const std::string& name : names("ENGINE_TEST_MISSING_ISAS")) {
    if (supported(name)) check::fail("this CPU should not run the '" + name + "' variant");
    const std::string reason = isa_missing_reason(by_name(name));
    if (reason.empty()) check::fail("no reason given for the missing '" + name + "' variant");
    try {
      set_isa(name);
      check::fail("set_isa('" + name + "') should throw on this CPU");
    } catch (const std::runtime_error& e) {
      if (std::string(e.what()).find(reason) == std::string::npos)
        check::fail("set_isa's message lacks the reason: " + std::string(e.what()));
      std::printf("missing as expected: %s\n", e.what());
    }
  }
  try {
    set_isa("no-such-isa");
    check::fail("an unknown ISA name should throw");
  } catch (const std::invalid_argument&) {
  }
  for (Isa isa : have)
    if (!isa_missing_reason(isa).empty()) check::fail(std::string("a reason for the supported ") + isa_name(isa));
  std::printf("%zu ISA variant(s) supported, %d failure(s)\n", have.size(), check::failures());
  return check::failures() ? 1 : 0;
}
