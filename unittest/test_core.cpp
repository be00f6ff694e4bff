/* ----------------------------------------------------------------------
   ML-TORCH core tests (no LAMMPS): model loading and metadata, forces and
   virial against central finite differences, invariances, float32 exports.
------------------------------------------------------------------------- */

#include "mltorch/committee.h"
#include "mltorch/layered.h"
#include "mltorch/model.h"
#include "mltorch/runtime.h"
#include "mltorch/training.h"
#include "core_fixtures.h"

#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <csignal>
#include <cstdint>
#include <fstream>
#include <functional>
#include <random>
#include <cstdlib>
#include <string>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>


/* ---------------------------------------------------------------------- */

TEST(Metadata, LennardJones)
{
  auto m = load(potentials + "/lj_Ar.pt");
  const auto &meta = m->metadata();
  EXPECT_EQ(meta.format_version, MLTorch::kFormatVersion);
  EXPECT_DOUBLE_EQ(meta.cutoff, 8.5);
  ASSERT_EQ(meta.elements.size(), 1u);
  EXPECT_EQ(meta.elements[0], "Ar");
  EXPECT_EQ(meta.num_interaction_layers, 1);
  EXPECT_EQ(meta.units, "metal");
  EXPECT_EQ(meta.dtype, "float64");
  EXPECT_EQ(meta.model_type, "lennard-jones");
  EXPECT_EQ(meta.species_of("Ar"), 0);
  EXPECT_EQ(meta.species_of("Xe"), -1);
  EXPECT_EQ(m->device(), "cpu");
}

TEST(Metadata, MessagePassingAndFloat32)
{
  EXPECT_EQ(load(potentials + "/toy_mp2_Si.pt")->metadata().num_interaction_layers, 2);
  EXPECT_EQ(load(potentials + "/sw_Si_f32.pt")->metadata().dtype, "float32");
}

TEST(Metadata, ContentHash)
{
  const auto bytes = MLTorch::read_file(potentials + "/lj_Ar.pt");
  EXPECT_EQ(MLTorch::content_hash(bytes), MLTorch::content_hash(bytes));
  EXPECT_EQ(MLTorch::content_hash(bytes).size(), 16u);
  EXPECT_NE(MLTorch::content_hash(bytes), MLTorch::content_hash(bytes + "x"));
  EXPECT_EQ(MLTorch::content_hash(""), "cbf29ce484222325");    // FNV-1a offset basis
  // known FNV-1a 64 values (computed independently), so that a hash compared
  // only with itself cannot pass
  EXPECT_EQ(MLTorch::content_hash("a"), "af63dc4c8601ec8c");
  EXPECT_EQ(MLTorch::content_hash("ML-TORCH"), "5aad0319740a9b27");
}

/* ----------------------------------------------------------------------
   'device cuda': the GPU of a rank from its node-local rank in the whole
   job (pair_style torch counts it in the universe, so two replicas on a
   node with 4 GPUs use GPUs 0-1 and 2-3, not both 0-1)
------------------------------------------------------------------------- */

TEST(DeviceMapping, NodeLocalRanksShareGpusInTurn)
{
  // 8 ranks on a node with 4 GPUs: two replicas of 4 ranks each, numbered
  // 0-3 and 4-7 in the universe, land on all four GPUs twice
  std::vector<std::string> got;
  for (int local = 0; local < 8; ++local) got.push_back(MLTorch::cuda_device_for_rank(local, 4));
  const std::vector<std::string> want{"cuda:0", "cuda:1", "cuda:2", "cuda:3",
                                      "cuda:0", "cuda:1", "cuda:2", "cuda:3"};
  EXPECT_EQ(got, want);
  EXPECT_EQ(MLTorch::cuda_device_for_rank(5, 1), "cuda:0");
  EXPECT_EQ(MLTorch::cuda_device_for_rank(2, 3), "cuda:2");
  EXPECT_EQ(MLTorch::cuda_device_for_rank(3, 0), "cuda");    // no GPU: the load reports it
}

// the provenance JSON of a saved model: strings with quotes, backslashes
// and control characters are escaped (a path like that broke the save
// when the JSON was made by string formatting)
TEST(Metadata, ProvenanceIsValidJson)
{
  const std::string p = MLTorch::provenance_json("dir \"a\"\\b\n.pt", "0123456789abcdef", 3, 40,
                                                 "sw \"* * Si.sw Si\"");
  EXPECT_EQ(p, "{\"parent_file_hash\":\"0123456789abcdef\",\"parent_model\":\"dir \\\"a\\\"\\\\b\\n.pt\","
               "\"step\":40,\"teacher\":\"sw \\\"* * Si.sw Si\\\"\",\"updates\":3}");
}

TEST(LoadErrors, MissingFile)
{
  EXPECT_NE(load_error("/nonexistent/model.pt").find("Cannot open model file /nonexistent/model.pt"),
            std::string::npos);
}

TEST(LoadErrors, CorruptFile)
{
  const std::string path = ::testing::TempDir() + "/corrupt.pt";
  std::ofstream(path) << "this is not a TorchScript archive";
  EXPECT_NE(load_error(path).find("as a TorchScript model"), std::string::npos) << load_error(path);
}

TEST(LoadErrors, BadMetadata)
{
  EXPECT_NE(load_error(test_models + "/no_metadata.pt").find("has no ML-TORCH metadata"),
            std::string::npos);
  EXPECT_NE(load_error(test_models + "/bad_version.pt")
                .find("has format version 99, this ML-TORCH build reads version 1"),
            std::string::npos);
  EXPECT_NE(load_error(test_models + "/no_cutoff.pt").find("lacks the required key 'cutoff'"),
            std::string::npos);
  EXPECT_THROW(MLTorch::parse_metadata("{", "x"), MLTorch::ModelError);
  EXPECT_THROW(MLTorch::parse_metadata(R"({"format_version":1,"cutoff":-1})", "x"),
               MLTorch::ModelError);
}

TEST(LoadErrors, Device)
{
  EXPECT_NE(load_error(potentials + "/lj_Ar.pt", "banana").find("Unknown torch device 'banana'"),
            std::string::npos);
  const auto cuda = load_error(potentials + "/lj_Ar.pt", "cuda:7");
  EXPECT_TRUE(cuda.find("sees no CUDA device") != std::string::npos ||
              cuda.find("CUDA device(s) exist") != std::string::npos)
      << cuda;
}

/* ---------------------------------------------------------------------- */

struct FDCase {
  std::string model;
  Config config;
};

static void check_finite_differences(const std::string &file, Config c, double tol)
{
  auto m = load(potentials + "/" + file);
  const auto ref = eval(*m, c);
  ASSERT_TRUE(std::isfinite(ref.energy));

  // forces: central differences of the energy, for every 7th atom
  const double h = 1e-5;
  std::vector<double> fd, an;
  const int n = static_cast<int>(c.species.size());
  for (int a = 0; a < n; a += 7)
    for (int d = 0; d < 3; d++) {
      Config p = c, q = c;
      p.pos[3 * a + d] += h;
      q.pos[3 * a + d] -= h;
      fd.push_back(-(eval(*m, p).energy - eval(*m, q).energy) / (2 * h));
      an.push_back(ref.forces[3 * a + d]);
    }
  const double ferr = max_rel_dev(an, fd);
  EXPECT_LE(ferr, tol) << file << " forces";

  // virial: W_ab = -dE/d(eps_ab) for x -> (1 + eps) x applied to atoms and cell
  std::vector<double> wfd, wan;
  const int comp[6][2] = {{0, 0}, {1, 1}, {2, 2}, {0, 1}, {0, 2}, {1, 2}};
  for (int k = 0; k < 6; k++) {
    const int a = comp[k][0], b = comp[k][1];
    double e[2];
    for (int s = 0; s < 2; s++) {
      Config p = c;
      const double eps = (s == 0 ? h : -h);
      for (int i = 0; i < n; i++) p.pos[3 * i + a] += eps * c.pos[3 * i + b];
      for (int v = 0; v < 3; v++) p.cell[v][a] += eps * c.cell[v][b];
      e[s] = eval(*m, p).energy;
    }
    wfd.push_back(-(e[0] - e[1]) / (2 * h));
    wan.push_back(ref.virial[k]);
  }
  const double werr = max_rel_dev(wan, wfd);
  EXPECT_LE(werr, tol) << file << " virial";
  std::printf("[ FD       ] %-16s max relative deviation: forces %.2e, virial %.2e\n", file.c_str(),
              ferr, werr);
}

TEST(FiniteDifferences, LennardJones)
{
  check_finite_differences("lj_Ar.pt", lattice(fcc, 5.26, 2, 0.25, 1, 0.7), 1e-8);
}

TEST(FiniteDifferences, Morse)
{
  check_finite_differences("morse_Cu.pt", lattice(fcc, 3.615, 2, 0.15, 2, 0.4), 1e-8);
}

TEST(FiniteDifferences, StillingerWeber)
{
  check_finite_differences("sw_Si.pt", lattice(diamond, 5.431, 2, 0.2, 3, 0.5), 1e-8);
}

TEST(FiniteDifferences, MessagePassingToy)
{
  check_finite_differences("toy_mp2_Si.pt", lattice(diamond, 5.431, 2, 0.2, 4), 1e-8);
}

TEST(FiniteDifferences, OpenCluster)
{
  Config c = lattice(diamond, 5.431, 1, 0.15, 5);
  c.periodic = {false, false, false};
  check_finite_differences("sw_Si.pt", c, 1e-8);
}

/* ---------------------------------------------------------------------- */

static Config rotated(const Config &c, double ax, double ay)
{
  const double R[3][3] = {{std::cos(ay), 0, std::sin(ay)},
                          {std::sin(ax) * std::sin(ay), std::cos(ax), -std::sin(ax) * std::cos(ay)},
                          {-std::cos(ax) * std::sin(ay), std::sin(ax), std::cos(ax) * std::cos(ay)}};
  Config r = c;
  auto rot = [&](const double *in, double *out) {
    for (int i = 0; i < 3; i++) out[i] = R[i][0] * in[0] + R[i][1] * in[1] + R[i][2] * in[2];
  };
  for (std::size_t a = 0; a < c.species.size(); a++) rot(&c.pos[3 * a], &r.pos[3 * a]);
  for (int v = 0; v < 3; v++) rot(c.cell[v].data(), r.cell[v].data());
  r.pos.resize(c.pos.size());
  return r;
}

TEST(Invariance, TranslationAndRotation)
{
  for (const char *file : {"sw_Si.pt", "toy_mp2_Si.pt"}) {
    auto m = load(potentials + "/" + file);
    const Config c = lattice(diamond, 5.431, 2, 0.2, 6);
    const auto ref = eval(*m, c);

    Config t = c;
    for (std::size_t i = 0; i < t.pos.size(); i++) t.pos[i] += 1.2345 * (1 + i % 3);
    const auto tr = eval(*m, t);
    EXPECT_NEAR(tr.energy, ref.energy, 1e-12 * std::fabs(ref.energy)) << file;
    EXPECT_LE(max_rel_dev(tr.forces, ref.forces), 1e-11) << file;

    const double ax = 0.3, ay = -1.1;
    const Config r = rotated(c, ax, ay);
    const auto rr = eval(*m, r);
    EXPECT_NEAR(rr.energy, ref.energy, 1e-12 * std::fabs(ref.energy)) << file;
    // forces rotate with the configuration
    const Config fref = [&] {
      Config f;
      f.pos = ref.forces;
      f.species = c.species;
      return rotated(f, ax, ay);
    }();
    EXPECT_LE(max_rel_dev(rr.forces, fref.pos), 1e-11) << file;
  }
}

TEST(Float32, AgreesWithFloat64)
{
  auto m64 = load(potentials + "/sw_Si.pt");
  auto m32 = load(potentials + "/sw_Si_f32.pt");
  const Config c = lattice(diamond, 5.431, 2, 0.2, 7);
  const auto r64 = eval(*m64, c), r32 = eval(*m32, c);
  EXPECT_NEAR(r32.energy, r64.energy, 1e-5 * std::fabs(r64.energy));
  EXPECT_LE(max_rel_dev(r32.forces, r64.forces), 1e-4);
  EXPECT_GT(max_rel_dev(r32.forces, r64.forces), 0.0);    // it really ran in float32
}

/* ----------------------------------------------------------------------
   distributed training gradient (doc/fix_torch_finetune.rst, "Exact distributed gradient"): a configuration split over two
   "domains" (each owns half the atoms and sees every other atom or image as
   a ghost) gives, after summing partial forces on owners, forwarding the
   owners' residuals to ghost copies and adding the two parameter gradients,
   exactly the gradient of the same loss computed on one domain
------------------------------------------------------------------------- */

namespace {
struct Domain {
  std::vector<int> node_atom;    // owner atom of each node
  std::vector<double> ev;
  std::vector<int64_t> index, species;
  int64_t n_local = 0, n_edges = 0;
};

// nodes: the domain's own atoms first, then every other atom and periodic image
Domain make_domain(const std::vector<double> &x, const std::vector<int> &owner, int natoms,
                   const std::vector<bool> &mine, double rc)
{
  Domain d;
  std::vector<int> order;
  for (int a = 0; a < natoms; a++)
    if (mine[a]) order.push_back(a);
  d.n_local = static_cast<int64_t>(order.size());
  for (int k = 0; k < static_cast<int>(owner.size()); k++)
    if (k >= natoms || !mine[k]) order.push_back(k);
  std::vector<int64_t> ci, cj;
  for (int64_t c = 0; c < d.n_local; c++)
    for (int64_t m = 0; m < static_cast<int64_t>(order.size()); m++) {
      if (m == c) continue;
      const int p = order[c], q = order[m];
      const double dx = x[3 * q] - x[3 * p], dy = x[3 * q + 1] - x[3 * p + 1], dz = x[3 * q + 2] - x[3 * p + 2];
      if (dx * dx + dy * dy + dz * dz >= rc * rc) continue;
      d.ev.insert(d.ev.end(), {dx, dy, dz});
      ci.push_back(c);
      cj.push_back(m);
    }
  d.index = ci;
  d.index.insert(d.index.end(), cj.begin(), cj.end());
  d.n_edges = static_cast<int64_t>(ci.size());
  for (int k : order) {
    d.node_atom.push_back(owner[k]);
    d.species.push_back(0);
  }
  return d;
}

MLTorch::GraphInput input_of(const Domain &d, MLTorch::HaloExchange *halo = nullptr)
{
  MLTorch::GraphInput in;
  in.halo = halo;
  in.n_nodes = static_cast<int64_t>(d.node_atom.size());
  in.n_local = d.n_local;
  in.n_edges = d.n_edges;
  in.edge_vectors = d.ev.data();
  in.edge_index = d.index.data();
  in.species = d.species.data();
  return in;
}

// gradient of L = sum_i |F_i - Fref_i|^2 + (E - Eref)^2 over the given domains
std::vector<double> loss_gradient(MLTorch::Model &m, const std::vector<Domain> &domains, int natoms,
                                  const std::vector<double> &fref, double eref, std::vector<double> &forces,
                                  MLTorch::HaloExchange *halo = nullptr)
{
  std::vector<std::vector<double>> partial(domains.size());
  forces.assign(3 * natoms, 0.0);
  double energy = 0.0;
  std::vector<double> grad(m.num_parameters(), 0.0);
  // stage 1 on every domain: partial forces, summed on the owners ("reverse comm")
  // (each domain keeps its autograd graph until its own stage 2, so run them in turn)
  std::vector<double> energies(domains.size());
  for (std::size_t k = 0; k < domains.size(); k++) {
    m.forward_train(input_of(domains[k], halo), energies[k], partial[k]);
    for (std::size_t n = 0; n < domains[k].node_atom.size(); n++)
      for (int c = 0; c < 3; c++) forces[3 * domains[k].node_atom[n] + c] += partial[k][3 * n + c];
    energy += energies[k];
    m.backward_train(std::vector<double>(partial[k].size(), 0.0), 0.0);    // release
  }
  // residuals on owners, "forward comm" to every copy, stage 2 on every domain
  for (std::size_t k = 0; k < domains.size(); k++) {
    double e_k;
    std::vector<double> f_k;
    m.zero_grad();
    m.forward_train(input_of(domains[k], halo), e_k, f_k);
    std::vector<double> w(f_k.size());
    for (std::size_t n = 0; n < domains[k].node_atom.size(); n++)
      for (int c = 0; c < 3; c++) {
        const int a = domains[k].node_atom[n];
        w[3 * n + c] = 2.0 * (forces[3 * a + c] - fref[3 * a + c]);
      }
    m.backward_train(w, 2.0 * (energy - eref));
    const auto g = m.flat_gradient();
    for (std::size_t p = 0; p < g.size(); p++) grad[p] += g[p];    // "all-reduce"
  }
  return grad;
}
}    // namespace

namespace {
// the halo exchange of one domain holding every atom: ghost rows are the
// owners' rows (periodic images), the adjoint sums them back
struct OwnerHalo : public MLTorch::HaloExchange {
  explicit OwnerHalo(const Domain &d) : owner(d.node_atom), n_local(d.n_local) {}
  void forward(const double *owned, double *all, int w) override
  {
    ++calls;
    for (std::size_t n = 0; n < owner.size(); ++n)
      for (int k = 0; k < w; ++k) all[n * w + k] = owned[owner[n] * w + k];
  }
  void reverse(const double *all, double *owned, int w) override
  {
    ++calls;
    std::fill(owned, owned + n_local * w, 0.0);
    for (std::size_t n = 0; n < owner.size(); ++n)
      for (int k = 0; k < w; ++k) owned[owner[n] * w + k] += all[n * w + k];
  }
  std::vector<int> owner;
  int64_t n_local;
  int calls = 0;
};

// the atoms of a periodic cell, then their images one shell deep, and the
// owner (original atom) of each
void one_shell(const Config &c, std::vector<double> &x, std::vector<int> &owner)
{
  const int n = static_cast<int>(c.species.size());
  x = c.pos;
  owner.resize(n);
  for (int a = 0; a < n; a++) owner[a] = a;
  for (int i = -1; i <= 1; i++)
    for (int j = -1; j <= 1; j++)
      for (int k = -1; k <= 1; k++) {
        if (!i && !j && !k) continue;
        for (int a = 0; a < n; a++) {
          for (int d = 0; d < 3; d++)
            x.push_back(c.pos[3 * a + d] + i * c.cell[0][d] + j * c.cell[1][d] + k * c.cell[2][d]);
          owner.push_back(a);
        }
      }
}

// a domain with every atom of a periodic cell: its images one shell deep
Domain whole_cell(const Config &c, double rc)
{
  const int n = static_cast<int>(c.species.size());
  std::vector<double> x;
  std::vector<int> owner;
  one_shell(c, x, owner);
  return make_domain(x, owner, n, std::vector<bool>(n, true), rc);
}

// the thick-ghost graph of the reference builder, as a Domain
Domain thick_cell(const Config &c, double rc, int nshell)
{
  const auto g = MLTorchTest::build_reference_graph(c.pos, c.species, c.cell, c.periodic, nshell, rc);
  Domain d;
  d.node_atom = g.owner;
  d.ev = g.edge_vectors;
  d.index = g.edge_index;
  d.species = g.species;
  d.n_local = g.n_local;
  d.n_edges = static_cast<int64_t>(g.centre.size());
  return d;
}
}    // namespace

/* ----------------------------------------------------------------------
   a layered model with the halo exchange (the exchange an autograd
   operator) equals its single call on thick ghosts: energy, forces, virial
   (first derivatives) and the fine-tuning loss gradient by the parameters
   (second derivatives), 2 and 4 layers
------------------------------------------------------------------------- */

TEST(LayeredModel, ExchangeEqualsThickGhosts)
{
  for (const std::string path : {potentials + "/si_mp2.pt", test_models + "/si_mp4_layered.pt"}) {
    auto m = load(path);
    const auto &meta = m->metadata();
    ASSERT_TRUE(meta.layered) << path;
    const int layers = meta.num_interaction_layers;
    ASSERT_EQ(static_cast<int>(meta.feature_widths.size()), layers - 1);
    const double rc = meta.cutoff;
    Config c = lattice(diamond, 5.431, 2, 0.2, 17, 0.7);    // triclinic
    const int n = static_cast<int>(c.species.size());
    const Domain ex = whole_cell(c, rc), thick = thick_cell(c, rc, layers <= 2 ? 1 : 2);
    OwnerHalo halo(ex);

    // first derivatives: per-owner forces and the virial from the edge gradients
    auto forces_virial = [&](const Domain &d, MLTorch::HaloExchange *h, double &e, std::vector<double> &f,
                             std::vector<double> &w) {
      MLTorch::GraphOutput out;
      m->evaluate(input_of(d, h), out, true);
      e = out.energy;
      f.assign(3 * n, 0.0);
      w.assign(9, 0.0);
      for (int64_t k = 0; k < d.n_edges; ++k)
        for (int a = 0; a < 3; ++a) {
          f[3 * d.node_atom[d.index[k]] + a] += out.edge_grad[3 * k + a];
          f[3 * d.node_atom[d.index[d.n_edges + k]] + a] -= out.edge_grad[3 * k + a];
          for (int b = 0; b < 3; ++b) w[3 * a + b] -= d.ev[3 * k + a] * out.edge_grad[3 * k + b];
        }
    };
    double e_ex, e_th;
    std::vector<double> f_ex, f_th, w_ex, w_th;
    forces_virial(ex, &halo, e_ex, f_ex, w_ex);
    EXPECT_EQ(halo.calls, 2 * (layers - 1)) << "one exchange and one reverse exchange per layer";
    forces_virial(thick, nullptr, e_th, f_th, w_th);
    EXPECT_LE(std::fabs(e_ex - e_th), 1e-12 * std::fabs(e_th)) << path;
    EXPECT_LE(max_rel_dev(f_ex, f_th), 1e-12) << path;
    EXPECT_LE(max_rel_dev(w_ex, w_th), 1e-12) << path;
    EXPECT_LT(2 * ex.n_edges, thick.n_edges) << "edges around owned atoms only";

    // second derivatives: the loss gradient by the parameters
    std::mt19937 gen(9);
    std::normal_distribution<double> noise(0.0, 0.3);
    std::vector<double> fref(3 * n), fa, fb;
    for (auto &v : fref) v = noise(gen);
    const auto g_ex = loss_gradient(*m, {ex}, n, fref, e_th + 1.0, fa, &halo);
    const auto g_th = loss_gradient(*m, {thick}, n, fref, e_th + 1.0, fb);
    const double dgrad = max_rel_dev(g_ex, g_th);
    EXPECT_LE(dgrad, 1e-12) << path;
    double gmax = 0.0;
    for (double v : g_th) gmax = std::max(gmax, std::fabs(v));
    EXPECT_GT(gmax, 0.0);
    std::printf("[ layered  ] %d layers, %d atoms: %lld edges (exchange) vs %lld (thick); energy %.2e, "
                "forces %.2e, virial %.2e, loss gradient %.2e\n", layers, n, (long long) ex.n_edges,
                (long long) thick.n_edges, std::fabs(e_ex - e_th) / std::fabs(e_th),
                max_rel_dev(f_ex, f_th), max_rel_dev(w_ex, w_th), dgrad);
  }
}

/* ----------------------------------------------------------------------
   the production exchange operator (MLTorch::halo_exchange_op, what
   run_layered uses): its backward is the reverse exchange X^T, and the
   backward of that is X again, so that the double backward of a training
   pass is exact. Checked against the exchange's own forward/reverse (this
   test's OwnerHalo, itself checked to be an adjoint pair)
------------------------------------------------------------------------- */

TEST(LayeredModel, ExchangeOperatorBackwardIsTheReverse)
{
  const Config c = lattice(diamond, 5.431, 1, 0.1, 3);
  const Domain d = whole_cell(c, 4.0);
  OwnerHalo halo(d);
  std::mt19937 gen(1);
  std::normal_distribution<double> z(0.0, 1.0);
  const int64_t w = 5;
  const int64_t nn = static_cast<int64_t>(d.node_atom.size()), nl = d.n_local;
  ASSERT_GT(nn, nl);
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  auto u = torch::randn({nl, w}, opts).requires_grad_(true);
  auto v = torch::randn({nn, w}, opts).requires_grad_(true);
  auto q = torch::randn({nl, w}, opts);

  // the helper pair is adjoint: <X u, v> = <u, X^T v>
  auto xu = MLTorch::halo_exchange_rows(u.detach(), &halo, nn, true, true);
  auto xtv = MLTorch::halo_exchange_rows(v.detach(), &halo, nl, false, true);
  EXPECT_NEAR((xu * v.detach()).sum().item<double>(), (u.detach() * xtv).sum().item<double>(),
              1e-12 * std::fabs((u.detach() * xtv).sum().item<double>()));

  // first derivative: d<X u, v>/du = X^T v, exactly what the reverse exchange gives
  auto y = MLTorch::halo_exchange_op(u, &halo, nn, true);
  EXPECT_EQ(torch::max(torch::abs(y - xu)).item<double>(), 0.0);
  auto g = torch::autograd::grad({(y * v).sum()}, {u}, {}, true, true)[0];
  EXPECT_EQ(torch::max(torch::abs(g - xtv)).item<double>(), 0.0) << "backward is not X^T";
  // second derivative through the backward: d<X^T v, q>/dv = X q
  auto h = torch::autograd::grad({(g * q).sum()}, {v}, {}, false, false)[0];
  auto xq = MLTorch::halo_exchange_rows(q, &halo, nn, true, true);
  EXPECT_EQ(torch::max(torch::abs(h - xq)).item<double>(), 0.0) << "double backward is not X";
}

TEST(TrainingErrors, WrongNumberOfForceWeights)
{
  // the size is checked before the weights are read (review defect)
  auto m = load(potentials + "/si_local.pt");
  const Domain d = make_domain({0, 0, 0, 2.3, 0, 0, 0, 2.3, 0}, {0, 1, 2}, 3, {true, true, true},
                               m->metadata().cutoff);
  double e = 0.0;
  std::vector<double> f;
  m->forward_train(input_of(d), e, f);
  ASSERT_GT(f.size(), 3u);
  try {
    m->backward_train(std::vector<double>(3, 1.0), 1.0);
    FAIL() << "no error for 3 weights";
  } catch (MLTorch::ModelError &err) {
    EXPECT_NE(std::string(err.what()).find("3 force weights for " + std::to_string(f.size())),
              std::string::npos)
        << err.what();
  }
  // the failed pass is over: MD runs without parameter gradients again
  EXPECT_FALSE(m->parameters_require_grad());
  EXPECT_THROW(m->backward_train(f, 1.0), MLTorch::ModelError);    // no pass is open
}

TEST(DistributedGradient, TwoDomainsEqualOne)
{
  auto m = load(potentials + "/si_local.pt");
  ASSERT_GT(m->num_parameters(), 0);
  const Config c = lattice(diamond, 5.431, 2, 0.2, 11);
  const int n = static_cast<int>(c.species.size());
  const double rc = m->metadata().cutoff;
  // explicit images (one shell) of the periodic cell
  std::vector<double> x;
  std::vector<int> owner;
  one_shell(c, x, owner);
  std::vector<bool> all(n, true), left(n), right(n);
  for (int a = 0; a < n; a++) {
    left[a] = c.pos[3 * a] < 0.5 * c.cell[0][0];
    right[a] = !left[a];
  }
  std::mt19937 gen(5);
  std::normal_distribution<double> noise(0.0, 0.3);
  std::vector<double> f_single, f_split, fref(3 * n);
  for (auto &v : fref) v = noise(gen);
  const double eref = -270.0;

  const auto g1 = loss_gradient(*m, {make_domain(x, owner, n, all, rc)}, n, fref, eref, f_single);
  const auto g2 = loss_gradient(*m, {make_domain(x, owner, n, left, rc), make_domain(x, owner, n, right, rc)},
                                n, fref, eref, f_split);
  const double dforce = max_rel_dev(f_split, f_single);
  const double dgrad = max_rel_dev(g2, g1);
  EXPECT_LE(dforce, 1e-12);
  EXPECT_LE(dgrad, 1e-10);
  double gmax = 0.0;
  for (double v : g1) gmax = std::max(gmax, std::fabs(v));
  EXPECT_GT(gmax, 0.0);
  std::printf("[ DDP      ] 2 domains vs 1: forces %.2e, parameter gradient %.2e (%lld parameters)\n",
              dforce, dgrad, static_cast<long long>(g1.size()));
}
