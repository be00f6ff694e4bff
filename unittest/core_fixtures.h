/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH core tests: what test_core.cpp and test_core_files.cpp share
   (model loading, perturbed lattices, the reference evaluation)
------------------------------------------------------------------------- */

#ifndef MLTORCH_TEST_CORE_FIXTURES_H
#define MLTORCH_TEST_CORE_FIXTURES_H

#include "mltorch/model.h"
#include "mltorch/runtime.h"
#include "reference_graph.h"

#include <array>
#include <memory>
#include <random>
#include <string>
#include <vector>

using MLTorchTest::evaluate_reference;
using MLTorchTest::max_rel_dev;
using Cell = std::array<std::array<double, 3>, 3>;

static const std::string potentials = ML_TORCH_POTENTIALS_DIR;
static const std::string test_models = ML_TORCH_TEST_MODELS_DIR;

static std::unique_ptr<MLTorch::Model> load(const std::string &path, const std::string &dev = "cpu")
{
  return std::make_unique<MLTorch::Model>(MLTorch::read_file(path), path, dev);
}

static std::string load_error(const std::string &path, const std::string &dev = "cpu")
{
  try {
    load(path, dev);
  } catch (MLTorch::ModelError &e) {
    return e.what();
  }
  return "no error";
}

// a perturbed lattice with a basis, `nrep` cells per direction
struct Config {
  std::vector<double> pos;
  std::vector<int64_t> species;
  Cell cell{};
  std::array<bool, 3> periodic{true, true, true};
};

static Config lattice(const std::vector<std::array<double, 3>> &basis, double a, int nrep,
                      double jitter, unsigned seed, double tilt = 0.0)
{
  Config c;
  c.cell = {{{nrep * a, 0.0, 0.0}, {tilt, nrep * a, 0.0}, {0.0, 0.0, nrep * a}}};
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-jitter, jitter);
  for (int i = 0; i < nrep; i++)
    for (int j = 0; j < nrep; j++)
      for (int k = 0; k < nrep; k++)
        for (const auto &b : basis) {
          const double f[3] = {(i + b[0]) / nrep, (j + b[1]) / nrep, (k + b[2]) / nrep};
          for (int d = 0; d < 3; d++)
            c.pos.push_back(f[0] * c.cell[0][d] + f[1] * c.cell[1][d] + f[2] * c.cell[2][d] + u(gen));
          c.species.push_back(0);
        }
  return c;
}

static const std::vector<std::array<double, 3>> fcc = {
    {0, 0, 0}, {0.5, 0.5, 0}, {0.5, 0, 0.5}, {0, 0.5, 0.5}};
static const std::vector<std::array<double, 3>> diamond = {
    {0, 0, 0},          {0.5, 0.5, 0},      {0.5, 0, 0.5},      {0, 0.5, 0.5},
    {0.25, 0.25, 0.25}, {0.75, 0.75, 0.25}, {0.75, 0.25, 0.75}, {0.25, 0.75, 0.75}};

static MLTorchTest::Result eval(const MLTorch::Model &m, const Config &c)
{
  return evaluate_reference(m, c.pos, c.species, c.cell, c.periodic, 1);
}

#endif
