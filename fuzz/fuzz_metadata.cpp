/* ----------------------------------------------------------------------
   libFuzzer target: the model-metadata parser (MLTorch::parse_metadata).
   Any input must either parse into valid metadata or throw ModelError
   with a message; nothing else (a crash, another exception, a sanitizer
   report, metadata that breaks its own invariants) is allowed.
   Built and run by tools/fuzz.sh.
------------------------------------------------------------------------- */

#include "mltorch/contract.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  const std::string text(reinterpret_cast<const char *>(data), size);
  try {
    const MLTorch::Metadata m = MLTorch::parse_metadata(text, "fuzz");
    if (m.format_version != MLTorch::kFormatVersion || !(m.cutoff > 0.0) || !std::isfinite(m.cutoff) ||
        m.elements.empty() || m.num_interaction_layers < 1 ||
        m.num_interaction_layers > MLTorch::kMaxLayers || m.units.empty() ||
        (m.dtype != "float32" && m.dtype != "float64"))
      std::abort();    // accepted metadata that the styles could not use
    for (std::size_t i = 0; i < m.elements.size(); ++i)
      if (m.species_of(m.elements[i]) != static_cast<int>(i)) std::abort();    // duplicate names
  } catch (MLTorch::ModelError &e) {
    if (std::string(e.what()).find("fuzz") == std::string::npos) std::abort();    // names the file
  }
  return 0;
}
