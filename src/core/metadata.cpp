/* ----------------------------------------------------------------------
   ML-TORCH core: the model metadata (JSON) and its validation. No LibTorch
   here, so the parser can be fuzzed on its own (fuzz/fuzz_metadata.cpp).
------------------------------------------------------------------------- */

#include "mltorch/model.h"
#include "mltorch/runtime.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <set>

namespace MLTorch {

std::string content_hash(const std::string &bytes)
{
  std::uint64_t h = 14695981039346656037ULL;    // FNV-1a 64-bit offset basis
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

int Metadata::species_of(const std::string &element) const
{
  for (std::size_t i = 0; i < elements.size(); ++i)
    if (elements[i] == element) return static_cast<int>(i);
  return -1;
}

Metadata parse_metadata(const std::string &text, const std::string &source)
{
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (std::exception &e) {
    throw ModelError("Model file " + source + ": metadata is not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw ModelError("Model file " + source + ": metadata is not a JSON object");

  auto require = [&](const char *key) -> const nlohmann::json & {
    if (!j.contains(key))
      throw ModelError("Model file " + source + ": metadata lacks the required key '" + key +
                       "'; re-export the model with the ML-TORCH exporter");
    return j.at(key);
  };
  auto bad = [&](const char *key, const std::string &why) {
    return ModelError("Model file " + source + ": metadata key '" + key + "' " + why);
  };

  Metadata m;
  m.json = text;
  // integers are compared as 64-bit values (an unsigned one above 2^63 reads
  // as negative), so no large value wraps into the accepted range
  const auto &ver = require("format_version");
  if (!ver.is_number_integer()) throw bad("format_version", "must be an integer");
  if (ver.get<int64_t>() != kFormatVersion)
    throw ModelError("Model file " + source + " has format version " + ver.dump() +
                     ", this ML-TORCH build reads version " +
                     std::to_string(kFormatVersion) + "; re-export the model or update ML-TORCH");
  m.format_version = kFormatVersion;

  const auto &cut = require("cutoff");
  if (!cut.is_number() || !(cut.get<double>() > 0.0) || !std::isfinite(cut.get<double>()))
    throw bad("cutoff", "must be a positive finite number");
  m.cutoff = cut.get<double>();

  const auto &el = require("elements");
  if (!el.is_array() || el.empty()) throw bad("elements", "must be a non-empty list of names");
  std::set<std::string> seen;
  for (const auto &e : el) {
    if (!e.is_string() || e.get<std::string>().empty())
      throw bad("elements", "must hold non-empty strings");
    if (!seen.insert(e.get<std::string>()).second)
      throw bad("elements", "lists '" + e.get<std::string>() + "' twice");
    m.elements.push_back(e.get<std::string>());
  }

  const auto &nl = require("num_interaction_layers");
  if (!nl.is_number_integer() || nl.get<int64_t>() < 1 || nl.get<int64_t>() > kMaxLayers)
    throw bad("num_interaction_layers", "must be an integer from 1 to " + std::to_string(kMaxLayers));
  m.num_interaction_layers = static_cast<int>(nl.get<int64_t>());

  const auto &un = require("units");
  if (!un.is_string() || un.get<std::string>().empty()) throw bad("units", "must be a LAMMPS unit style");
  m.units = un.get<std::string>();

  const auto &dt = require("dtype");
  if (!dt.is_string() || (dt.get<std::string>() != "float32" && dt.get<std::string>() != "float64"))
    throw bad("dtype", "must be \"float32\" or \"float64\"");
  m.dtype = dt.get<std::string>();

  // a layered model (mltorch.export): its stages stage_embed / stage_interaction /
  // stage_readout, with the widths of the per-atom features exchanged between them
  if (j.contains("layered")) {
    const auto &ly = j.at("layered");
    if (!ly.is_object() || !ly.contains("feature_widths") || !ly.at("feature_widths").is_array())
      throw bad("layered", "must be an object with a list 'feature_widths'");
    const auto &fw = ly.at("feature_widths");
    if (static_cast<int64_t>(fw.size()) != m.num_interaction_layers - 1)
      throw bad("layered", "lists " + std::to_string(fw.size()) + " feature widths for " +
                               std::to_string(m.num_interaction_layers) +
                               " interaction layers; a layered model exchanges features "
                               "num_interaction_layers - 1 times");
    for (const auto &w : fw) {
      if (!w.is_number_integer() || w.get<int64_t>() < 1 || w.get<int64_t>() > kMaxFeatureWidth)
        throw bad("layered", "feature widths must be integers from 1 to " +
                                 std::to_string(kMaxFeatureWidth));
      m.feature_widths.push_back(static_cast<int>(w.get<int64_t>()));
    }
    m.layered = true;
  }

  if (j.contains("model_type") && j.at("model_type").is_string())
    m.model_type = j.at("model_type").get<std::string>();
  return m;
}

std::string provenance_json(const std::string &parent, const std::string &parent_hash,
                            int64_t updates, int64_t step, const std::string &teacher)
{
  // the JSON library writes the strings: a path or teacher with quotes,
  // backslashes or control characters stays valid JSON
  nlohmann::json j;
  j["parent_model"] = parent;
  j["parent_file_hash"] = parent_hash;
  j["updates"] = updates;
  j["step"] = step;
  j["teacher"] = teacher;
  return j.dump();
}

}    // namespace MLTorch
