/* ----------------------------------------------------------------------
   ML-TORCH core tests (no LAMMPS): atomic saves, compiled packages,
   metadata and file checks, committees, the training state.
------------------------------------------------------------------------- */

#include "mltorch/committee.h"
#include "mltorch/model.h"
#include "mltorch/runtime.h"
#include "mltorch/training.h"
#include "core_fixtures.h"

#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

/* ----------------------------------------------------------------------
   model files are written atomically: a writer killed at any moment, or a
   write that runs out of space, leaves the previous file whole and loadable
------------------------------------------------------------------------- */

namespace {
std::string slurp(const std::string &path)
{
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
}    // namespace

TEST(AtomicSave, KilledWriterLeavesAWholeFile)
{
  const std::string path = ::testing::TempDir() + "/atomic_kill.pt";
  const std::string a = MLTorch::read_file(potentials + "/si_local.pt");
  const std::string b = MLTorch::read_file(potentials + "/si_mp2.pt");
  MLTorch::write_file_atomic(path, a);
  int outcomes[2] = {0, 0};
  for (int trial = 0; trial < 20; ++trial) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {    // the writer: alternate the two models as fast as it can
      for (int k = 0;; ++k) MLTorch::write_file_atomic(path, (k % 2) ? a : b);
    }
    usleep(2000 + 1500 * trial);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status));
    std::remove((path + ".tmp." + std::to_string(static_cast<long>(pid))).c_str());    // the killed one's
    const std::string now = slurp(path);
    ASSERT_TRUE(now == a || now == b) << "trial " << trial << ": a torn file of " << now.size() << " bytes";
    ++outcomes[now == a ? 0 : 1];
    EXPECT_NO_THROW(load(path)) << "trial " << trial;
  }
  std::printf("[ atomic ] 20 writers killed mid-stream: file held the first model %d times, the "
              "second %d times, never a torn file\n", outcomes[0], outcomes[1]);
  std::remove(path.c_str());
}

TEST(AtomicSave, FullDiskKeepsThePreviousFile)
{
  // RLIMIT_FSIZE stands in for a full disk: with SIGXFSZ ignored, a write
  // past the limit fails with EFBIG as one past the disk's end fails with ENOSPC
  const std::string path = ::testing::TempDir() + "/atomic_full.pt";
  const std::string a = MLTorch::read_file(potentials + "/lj_Ar.pt");
  const std::string big = MLTorch::read_file(potentials + "/si_mp2.pt");
  ASSERT_GT(big.size(), 4 * a.size());
  MLTorch::write_file_atomic(path, a);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {static_cast<rlim_t>(2 * a.size()), static_cast<rlim_t>(2 * a.size())};
    setrlimit(RLIMIT_FSIZE, &lim);
    try {
      MLTorch::write_file_atomic(path, big);
    } catch (MLTorch::ModelError &e) {
      const bool clear = std::string(e.what()).find("Cannot write") != std::string::npos;
      _exit(clear ? 3 : 4);
    }
    _exit(5);    // no error: wrong
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3) << "4: unclear message, 5: no error";
  EXPECT_EQ(slurp(path), a);
  EXPECT_NO_THROW(load(path));
  // and no temporary file is left beside it
  const std::string tmp = path + ".tmp." + std::to_string(static_cast<long>(pid));
  EXPECT_FALSE(std::ifstream(tmp).good()) << tmp;
  std::remove(path.c_str());
}

/* ----------------------------------------------------------------------
   metadata that is malformed or out of range: one ERROR text each
------------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   compiled packages (potentials/*.pt2 from tools/compile_models.sh)
------------------------------------------------------------------------- */

// the package with record `edit` (name without the archive folder) replaced
// by `content`, or dropped when `content` is "<drop>"
static std::string edited_package(const std::string &edit, const std::string &content)
{
  const std::string bytes = MLTorch::read_file(potentials + "/si_local.pt2");
  std::istringstream in(bytes);
  caffe2::serialize::PyTorchStreamReader reader(&in);
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&out](const void *p, size_t n) {
    out.append(static_cast<const char *>(p), n);
    return n;
  });
  for (const auto &name : reader.getAllRecords()) {
    // the writer adds its own version records
    if (name.rfind(".data/", 0) == 0 || name == "byteorder") continue;
    if (name == edit) {
      if (content != "<drop>") writer.writeRecord(name, content.data(), content.size());
      continue;
    }
    auto [data, size] = reader.getRecord(name);
    writer.writeRecord(name, data.get(), size);
  }
  writer.writeEndOfFile();
  return out;
}

static std::string package_error(const std::string &bytes)
{
  try {
    MLTorch::Model m(bytes, "edited.pt2", "cpu");
  } catch (MLTorch::ModelError &e) {
    return e.what();
  }
  return "no error";
}

static std::string compiled_info(const std::string &key, const std::string &value)
{
  const std::string bytes = MLTorch::read_file(potentials + "/si_local.pt2");
  std::istringstream in(bytes);
  caffe2::serialize::PyTorchStreamReader reader(&in);
  auto [data, size] = reader.getRecord("extra/mltorch_compiled.json");
  std::string json(static_cast<const char *>(data.get()), size);
  const auto at = json.find("\"" + key + "\"");
  const auto colon = json.find(':', at);
  const auto first = json.find_first_not_of(" \n", colon + 1);
  const auto end = json[first] == '[' ? json.find(']', first) + 1 : json.find_first_of(",\n}", colon);
  return json.substr(0, colon + 1) + " " + value + json.substr(end);
}

TEST(CompiledPackage, MatchesItsTorchScriptModel)
{
  auto compiled = load(potentials + "/si_local.pt2");
  auto script = load(potentials + "/si_local.pt");
  EXPECT_TRUE(compiled->is_compiled());
  EXPECT_FALSE(script->is_compiled());
  EXPECT_EQ(compiled->compiled_threads(), 1);
  EXPECT_EQ(compiled->metadata().json, script->metadata().json);
  const auto c = lattice(diamond, 5.431, 2, 0.1, 17);
  const auto a = eval(*compiled, c), b = eval(*script, c);
  ASSERT_EQ(a.forces.size(), b.forces.size());
  double df = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.forces.size(); ++i) {
    df = std::max(df, std::fabs(a.forces[i] - b.forces[i]));
    scale = std::max(scale, std::fabs(b.forces[i]));
  }
  EXPECT_NEAR(a.energy, b.energy, 1e-12 * std::fabs(b.energy));
  EXPECT_LE(df, 1e-12 * scale);
  // a compiled model saves (fix torch/finetune) as its TorchScript twin
  MLTorch::Model saved(compiled->file_bytes(""), "saved", "cpu");
  EXPECT_FALSE(saved.is_compiled());
  EXPECT_EQ(saved.state_bytes(), script->state_bytes());
}

TEST(CompiledPackage, BadPackagesAreRefused)
{
  struct Bad {
    std::string record, content, expected;
  };
  const std::vector<Bad> cases{
      {"extra/mltorch_compiled.json", "<drop>", "package without ML-TORCH data"},
      {"mltorch/model.pt", "<drop>", "package without ML-TORCH data"},
      {"extra/mltorch_compiled.json", "{not json", "unreadable extra/mltorch_compiled.json"},
      {"extra/mltorch_compiled.json", compiled_info("torch_version", "\"2.1.0\""),
       "was compiled with torch 2.1.0 but this LAMMPS links LibTorch"},
      {"extra/mltorch_compiled.json", compiled_info("compiled_format", "99"),
       "has compiled_format 99; this build reads 1"},
      {"extra/mltorch_compiled.json", compiled_info("device", "\"cuda\""),
       "was compiled for cuda but device cpu is requested"},
      {"extra/mltorch_compiled.json", compiled_info("state_names", "[\"descriptor.mix\", \"nope\"]"),
       "needs the tensor 'nope'"},
      {"mltorch/model.pt", "not a model", "as a TorchScript model"},
  };
  for (const auto &c : cases) {
    const auto what = package_error(edited_package(c.record, c.content));
    EXPECT_NE(what.find(c.expected), std::string::npos) << c.record << ": " << what;
  }
  // the unedited copy loads: the edits, not the copying, are refused
  EXPECT_EQ(package_error(edited_package("none", "")), "no error");
  // a truncated package is a clear error, not a crash
  const std::string whole = MLTorch::read_file(potentials + "/si_local.pt2");
  const auto what = package_error(whole.substr(0, whole.size() / 2));
  EXPECT_NE(what.find("edited.pt2"), std::string::npos) << what;
}

TEST(Metadata, RejectsBadValues)
{
  const std::string good = R"("format_version": 1, "elements": ["Si"], "units": "metal", "dtype": "float64")";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "metadata is not valid JSON"},
      {"[1, 2]", "metadata is not a JSON object"},
      {"{" + good + R"(, "num_interaction_layers": 1})", "lacks the required key 'cutoff'"},
      {"{" + good + R"(, "cutoff": -1, "num_interaction_layers": 1})", "'cutoff' must be a positive finite number"},
      {"{" + good + R"(, "cutoff": 1e400, "num_interaction_layers": 1})", "number overflow parsing '1e400'"},
      {"{" + good + R"(, "cutoff": "5", "num_interaction_layers": 1})", "'cutoff' must be a positive finite number"},
      {"{" + good + R"(, "cutoff": 5, "num_interaction_layers": 0})", "'num_interaction_layers' must be an integer from 1 to 16"},
      {"{" + good + R"(, "cutoff": 5, "num_interaction_layers": 99999999999999999999})", "'num_interaction_layers' must be an integer from 1 to 16"},
      {"{" + good + R"(, "cutoff": 5, "num_interaction_layers": 4294967297})", "'num_interaction_layers' must be an integer from 1 to 16"},
      {R"({"format_version": "1", "cutoff": 5})", "'format_version' must be an integer"},
      {R"({"format_version": 4294967297, "cutoff": 5})", "has format version 4294967297, this ML-TORCH build reads version 1"},
      {R"({"format_version": 1, "cutoff": 5, "elements": [], "units": "metal", "dtype": "float64", "num_interaction_layers": 1})", "'elements' must be a non-empty list"},
      {R"({"format_version": 1, "cutoff": 5, "elements": ["Si", "Si"], "units": "metal", "dtype": "float64", "num_interaction_layers": 1})", "lists 'Si' twice"},
      {R"({"format_version": 1, "cutoff": 5, "elements": [""], "units": "metal", "dtype": "float64", "num_interaction_layers": 1})", "must hold non-empty strings"},
      {R"({"format_version": 1, "cutoff": 5, "elements": ["Si"], "units": "", "dtype": "float64", "num_interaction_layers": 1})", "'units' must be a LAMMPS unit style"},
      {R"({"format_version": 1, "cutoff": 5, "elements": ["Si"], "units": "metal", "dtype": "float16", "num_interaction_layers": 1})", "'dtype' must be \"float32\" or \"float64\""},
      {"{" + good + R"(, "cutoff": 5, "num_interaction_layers": 2, "layered": {"feature_widths": [8, 8]}})", "'layered' lists 2 feature widths for 2 interaction layers"},
      {"{" + good + R"(, "cutoff": 5, "num_interaction_layers": 2, "layered": {"feature_widths": [0]}})", "'layered' feature widths must be integers from 1 to 65536"},
      {"{" + good + R"(, "cutoff": 5, "num_interaction_layers": 2, "layered": [24]})", "'layered' must be an object with a list 'feature_widths'"},
  };
  for (const auto &c : cases) {
    std::string msg;
    try {
      MLTorch::parse_metadata(c.first, "m.pt");
    } catch (MLTorch::ModelError &e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find(c.second), std::string::npos) << c.first << " -> '" << msg << "'";
    EXPECT_NE(msg.find("m.pt"), std::string::npos) << msg;
  }
}

TEST(LoadErrors, EmptyFile)
{
  try {
    MLTorch::Model m("", "empty.pt", "cpu");
    FAIL() << "no error";
  } catch (MLTorch::ModelError &e) {
    EXPECT_NE(std::string(e.what()).find("empty.pt is empty (0 bytes)"), std::string::npos) << e.what();
  }
}

/* ----------------------------------------------------------------------
   committee statistics and the trained state, without LAMMPS
------------------------------------------------------------------------- */

TEST(Committee, AtomDeviationIsThePopulationStd)
{
  // three members: forces (1,0,0), (3,0,0), (2,3,0); energies 1, 2, 6
  const double f[9] = {1, 0, 0, 3, 0, 0, 2, 3, 0};
  const double e[3] = {1, 2, 6};
  double out[2];
  MLTorch::committee_atom_deviation(3, f, e, out);
  // mean force (2,1,0): squared distances 2, 2, 4 -> sqrt(8/3); energies: mean 3, var 14/3
  EXPECT_NEAR(out[0], std::sqrt(8.0 / 3.0), 1e-15);
  EXPECT_NEAR(out[1], std::sqrt(14.0 / 3.0), 1e-15);
  EXPECT_NEAR(MLTorch::committee_std(3, e), std::sqrt(14.0 / 3.0), 1e-15);
  MLTorch::committee_atom_deviation(1, f, e, out);
  EXPECT_EQ(out[0], 0.0);
}

TEST(Committee, GateAndCountWeightedMean)
{
  using MLTorch::Gate;
  EXPECT_EQ(MLTorch::gate(0.05, 0.1, 1.0), Gate::Known);
  EXPECT_EQ(MLTorch::gate(0.1, 0.1, 1.0), Gate::Label);
  EXPECT_EQ(MLTorch::gate(1.0, 0.1, 1.0), Gate::Skip);
  EXPECT_EQ(MLTorch::gate(std::nan(""), 0.1, 1.0), Gate::Skip);
  std::vector<double> g{3.0, 6.0};
  EXPECT_TRUE(MLTorch::average_gradient(3.0, g.data(), 2));
  EXPECT_EQ(g[0], 1.0);
  EXPECT_EQ(g[1], 2.0);
  EXPECT_FALSE(MLTorch::average_gradient(0.0, g.data(), 2));
  EXPECT_EQ(g[0], 1.0);
}

TEST(TrainingState, MembersStepOnTheirSlicesAndRollBack)
{
  std::vector<std::shared_ptr<MLTorch::Model>> members;
  for (const std::string &f : {potentials + "/si_local.pt", test_models + "/si_local_perturbed.pt"})
    members.push_back(std::make_shared<MLTorch::Model>(MLTorch::read_file(f), f, "cpu"));
  for (auto &m : members) m->set_trainable(std::vector<bool>(m->parameter_names().size(), true));
  MLTorch::OptimizerSettings sgd;
  sgd.kind = "sgd";
  MLTorch::TrainingState ts(members, sgd);
  const long long n = members[0]->num_trainable();
  ASSERT_EQ(ts.gradient_size(), 2 * n);
  const std::string p0 = ts.parameters();
  ts.keep_good();
  // a gradient of 1 on member 1's slice only: member 0 stays, member 1 moves by -lr
  std::vector<double> grad(2 * n, 0.0);
  for (long long k = n; k < 2 * n; ++k) grad[k] = 1.0;
  const std::string m0 = members[0]->state_bytes(), m1 = members[1]->state_bytes();
  const auto norms = ts.step(grad, 0.5, 0.0);
  ASSERT_EQ(norms.size(), 2u);
  EXPECT_EQ(norms[0], 0.0);
  EXPECT_NEAR(norms[1], std::sqrt(static_cast<double>(n)), 1e-9);
  EXPECT_EQ(members[0]->state_bytes(), m0);
  EXPECT_NE(members[1]->state_bytes(), m1);
  // the whole state packs and unpacks; rollback restores it
  const std::string p1 = ts.parameters();
  ts.restore_good();
  EXPECT_EQ(ts.parameters(), p0);
  ts.load_parameters(p1);
  EXPECT_EQ(ts.parameters(), p1);
  EXPECT_THROW(ts.load_parameters(m0), MLTorch::ModelError);    // one member's bytes
  EXPECT_THROW(ts.step(std::vector<double>(n, 0.0), 0.1, 0.0), MLTorch::ModelError);
  // one member: the single-model formats, unchanged
  EXPECT_EQ(MLTorch::pack_strings({"abc"}), "abc");
  EXPECT_EQ(MLTorch::unpack_strings(MLTorch::pack_strings({"a", "", "bc"}), 3),
            (std::vector<std::string>{"a", "", "bc"}));
  MLTorch::Schedule s;
  s.kind = "step";
  s.a = 2;
  s.b = 0.5;
  EXPECT_EQ(s.lr(1.0, 5), 0.25);
}
