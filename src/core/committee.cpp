/* ----------------------------------------------------------------------
   ML-TORCH: committee statistics and gating decisions (see committee.h)
------------------------------------------------------------------------- */

#include "mltorch/committee.h"

#include <cmath>

namespace MLTorch {

void committee_atom_deviation(int members, const double *forces, const double *energies,
                              double *out)
{
  out[0] = out[1] = 0.0;
  if (members < 2) return;
  const double w = 1.0 / members;
  double mean[3] = {0.0, 0.0, 0.0}, emean = 0.0;
  for (int m = 0; m < members; ++m) {
    for (int k = 0; k < 3; ++k) mean[k] += w * forces[3 * m + k];
    if (energies) emean += w * energies[m];
  }
  double vf = 0.0, ve = 0.0;
  for (int m = 0; m < members; ++m) {
    for (int k = 0; k < 3; ++k) {
      const double d = forces[3 * m + k] - mean[k];
      vf += d * d;
    }
    if (energies) ve += (energies[m] - emean) * (energies[m] - emean);
  }
  out[0] = std::sqrt(w * vf);
  out[1] = std::sqrt(w * ve);
}

double committee_std(int n, const double *values)
{
  if (n < 2) return 0.0;
  double mean = 0.0;
  for (int m = 0; m < n; ++m) mean += values[m] / n;
  double v = 0.0;
  for (int m = 0; m < n; ++m) v += (values[m] - mean) * (values[m] - mean);
  return std::sqrt(v / n);
}

Gate gate(double deviation, double low, double high)
{
  // NaN (a member gave non-finite output) is never labelled
  if (!(deviation == deviation)) return Gate::Skip;
  if (deviation < low) return Gate::Known;
  if (deviation >= high) return Gate::Skip;
  return Gate::Label;
}

bool average_gradient(double configurations, double *grad, long n)
{
  if (!(configurations > 0.0)) return false;
  for (long k = 0; k < n; ++k) grad[k] /= configurations;
  return true;
}

}    // namespace MLTorch
