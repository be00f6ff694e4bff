/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#include "pair_torch.h"

#include "atom.h"
#include "citeme.h"
#include "comm.h"
#include "domain.h"
#include "error.h"
#include "force.h"
#include "lmp_compat.h"
#include "memory.h"
#include "mltorch_mpi.h"
#include "neigh_list.h"
#include "neighbor.h"
#include "platform.h"
#include "update.h"

#include "torch_committee.h"

#include "mltorch/model.h"
#include "mltorch/runtime.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>

using namespace LAMMPS_NS;

using MLTorchLmp::join_words;

static const char cite_ml_torch[] =
    "ML-TORCH package (pair_style torch, fix torch/finetune):\n\n"
    "@Misc{ML-TORCH,\n"
    " title = {{ML-TORCH}: machine-learned potentials in {PyTorch} on {LAMMPS}'s domain "
    "decomposition, with distributed online fine-tuning},\n"
    " note = {LAMMPS package, version 0.1.0}\n"
    "}\n\n";

PairTorch::PairTorch(LAMMPS *lmp) :
    Pair(lmp), graph(std::make_unique<TorchGraph>(lmp, this, comm_rows)),
    committee(std::make_unique<TorchCommittee>(lmp)), device_name("cpu"), nthreads(0),
    cutoff(0.0), cutghost_model(0.0), nlayers(1), output(std::make_unique<MLTorch::GraphOutput>())
{
  single_enable = 0;
  restartinfo = 0;
  one_coeff = 1;
  manybody_flag = 1;
  no_virial_fdotr_compute = 1;
  // the atomic (centroid) virial, exact for every model (compute()); a
  // variant without it (torch/kk) turns it off in derive_halo_mode()
  centroidstressflag = CENTROID_AVAIL;
  if (lmp->citeme) lmp->citeme->add(cite_ml_torch);
}

/* ---------------------------------------------------------------------- */

PairTorch::~PairTorch()
{
  if (allocated) {
    memory->destroy(setflag);
    memory->destroy(cutsq);
    memory->destroy(cutghost);
  }
  // older LAMMPS versions do not free map in ~Pair(); newer ones do (nullptr is safe)
  delete[] map;
  map = nullptr;
}

/* ---------------------------------------------------------------------- */

TorchStudent *TorchStudent::of(Force *force)
{
  return dynamic_cast<PairTorch *>(force->pair_match("^torch", 0));
}

TorchCommitteeView *TorchCommitteeView::of(Force *force)
{
  return TorchStudent::of(force);
}

/* ---------------------------------------------------------------------- */

void PairTorch::allocate()
{
  allocated = 1;
  const int n = atom->ntypes + 1;
  memory->create(setflag, n, n, "pair:setflag");
  memory->create(cutsq, n, n, "pair:cutsq");
  memory->create(cutghost, n, n, "pair:cutghost");
  map = new int[n];
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) setflag[i][j] = 0;
  graph->shape.type2species.assign(n, -1);
}

/* ----------------------------------------------------------------------
   pair_style torch [threads N] [device name]
------------------------------------------------------------------------- */

void PairTorch::settings(int narg, char **arg)
{
  // re-issuing pair_style torch keeps the model (LAMMPS keeps coefficients)
  // but takes the new settings: omitted keywords get their defaults again
  const bool thick_before = halo_thick, fold_before = fold_images;
  nthreads = 0;
  device_name = "cpu";
  committee->mean = false;
  halo_thick = false;
  fold_images = true;
  int iarg = 0;
  while (iarg < narg) {
    if (strcmp(arg[iarg], "threads") == 0) {
      if (iarg + 2 > narg) MLTorchLmp::missing_args(FLERR, "pair_style torch threads", error);
      nthreads = utils::inumeric(FLERR, arg[iarg + 1], false, lmp);
      if (nthreads < 1)
        error->all(FLERR, "Illegal pair_style torch threads value {}: must be >= 1", nthreads);
      iarg += 2;
    } else if (strcmp(arg[iarg], "device") == 0) {
      if (iarg + 2 > narg) MLTorchLmp::missing_args(FLERR, "pair_style torch device", error);
      device_name = arg[iarg + 1];
      iarg += 2;
    } else if (strcmp(arg[iarg], "committee") == 0) {
      if (iarg + 2 > narg) MLTorchLmp::missing_args(FLERR, "pair_style torch committee", error);
      if (strcmp(arg[iarg + 1], "first") == 0)
        committee->mean = false;
      else if (strcmp(arg[iarg + 1], "mean") == 0)
        committee->mean = true;
      else
        error->all(FLERR, "Illegal pair_style torch committee value {}: must be first or mean",
                   arg[iarg + 1]);
      iarg += 2;
    } else if (strcmp(arg[iarg], "halo") == 0) {
      if (iarg + 2 > narg) MLTorchLmp::missing_args(FLERR, "pair_style torch halo", error);
      if (strcmp(arg[iarg + 1], "thick") == 0)
        halo_thick = true;
      else if (strcmp(arg[iarg + 1], "exchange") == 0)
        halo_thick = false;
      else
        error->all(FLERR, "Illegal pair_style torch halo value {}: must be exchange or thick",
                   arg[iarg + 1]);
      iarg += 2;
    } else if (strcmp(arg[iarg], "fold") == 0) {
      if (iarg + 2 > narg) MLTorchLmp::missing_args(FLERR, "pair_style torch fold", error);
      fold_images = utils::logical(FLERR, arg[iarg + 1], false, lmp) == 1;
      iarg += 2;
    } else {
      error->all(FLERR,
                 "Unknown pair_style torch keyword: {} (expected threads, device, committee, "
                 "halo or fold)",
                 arg[iarg]);
    }
  }
  // after pair_coeff: the next init() derives and logs the new halo mode
  if (model() && (halo_thick != thick_before || fold_images != fold_before))
    halo_settings_changed = true;
}

/* ----------------------------------------------------------------------
   pair_coeff * * model.pt [model2.pt ...] El1 El2 ... ElN   (NULL for
   uncovered types); several model files make a committee
------------------------------------------------------------------------- */

void PairTorch::coeff(int narg, char **arg)
{
  if (!allocated) allocate();
  const int ntypes = atom->ntypes;
  if (narg < 3) MLTorchLmp::missing_args(FLERR, "pair_coeff torch", error);
  // "* *" first: LAMMPS checks it for one_coeff styles (Input::pair_coeff,
  // PairHybrid::coeff) before this is called
  const int nfiles = narg - 2 - ntypes;
  if (nfiles < 1)
    error->all(FLERR,
               "Pair style torch: pair_coeff needs one element name (or NULL) per atom type: "
               "got {} name(s) for {} atom type(s)",
               narg - 3, ntypes);

  MLTorch::set_single_interop_thread();
  MLTorch::keep_large_allocations();
  MLTorch::cache_tensor_blocks();
  committee->load(std::vector<std::string>(arg + 2, arg + 2 + nfiles),
                  committee->rank_device(device_name), ntypes, narg - 2);
  committee_changed();
  arg += nfiles - 1;    // the element names follow the last file
  narg -= nfiles - 1;
  const auto &meta = model()->metadata();

  // element names -> model species
  for (int i = 3; i < narg; i++) {
    if (strcmp(arg[i], "NULL") == 0) continue;
    if (meta.species_of(arg[i]) < 0)
      error->all(FLERR, "Element {} is not in model file {} (it has: {})", arg[i], model_path(),
                 join_words(meta.elements));
  }
  map_element2type(narg - 3, arg + 3);
  for (int t = 1; t <= ntypes; t++)
    graph->shape.type2species[t] = (map[t] >= 0) ? meta.species_of(elements[map[t]]) : -1;

  cutoff = meta.cutoff;
  nlayers = meta.num_interaction_layers;
  derive_halo_mode();
  if (comm->me == 0)
    utils::logmesg(lmp,
                   "pair_style torch: loaded {} ({}, {} model, format {}, elements {}, cutoff {}, "
                   "{} interaction layer(s), units {}, device {}, {}, hash {})\n",
                   model_path(), meta.model_type.empty() ? "model" : meta.model_type, meta.dtype,
                   meta.format_version, join_words(meta.elements), meta.cutoff, nlayers,
                   meta.units, model()->device(),
                   model()->is_compiled()
                       ? fmt::format("compiled AOTInductor package, {} OpenMP thread(s) in its code",
                                     model()->compiled_threads())
                       : std::string("TorchScript"),
                   model_hash());
  if (comm->me == 0 && committee->size() > 1) {
    std::vector<std::string> files;
    for (int m = 0; m < committee->size(); ++m) files.push_back(committee->path(m));
    utils::logmesg(lmp, "pair_style torch: committee of {} models (MD on {}): {}\n",
                   committee->size(), committee->mean ? "their mean" : "the first",
                   join_words(files));
  }
  log_halo_mode();
}

/* ----------------------------------------------------------------------
   what follows from the model and the halo keywords: exchange or thick
   ghosts, ghost neighbour lists, the centroid virial, communication sizes.
   pair_coeff derives it, and so does the next init() after a re-issued
   pair_style torch changed 'halo' or 'fold' (settings() marks it)
------------------------------------------------------------------------- */

void PairTorch::derive_halo_mode()
{
  use_exchange = false;
  feature_width = 0;
  // every member layered (the committee check made their depths equal)
  if (nlayers > 1 && !halo_thick) use_exchange = committee->all_layered(feature_width);
  // thick ghosts: edges around ghost centres too (ghost neighbor lists)
  ghostneigh = (nlayers > 1 && !use_exchange) ? 1 : 0;
  graph->shape.cutoff = cutoff;
  graph->shape.nlayers = nlayers;
  graph->shape.ghost_lists = ghostneigh;
  graph->shape.exchange = use_exchange;
  graph->shape.fold = fold_supported && fold_images;
  // the atomic (centroid) virial: every model and halo mode (compute()); a
  // variant may not provide it (torch/kk)
  centroidstressflag = centroid_supported ? CENTROID_AVAIL : CENTROID_NOTAVAIL;

  // per-member forces travel to their owners in one reverse communication;
  // the exchange moves feature_width values per atom both ways
  comm_forward = use_exchange ? feature_width : 0;
  comm_reverse = std::max(committee->size() > 1 ? 3 * committee->size() : 0,
                          use_exchange ? feature_width : 0);
  halo_settings_changed = false;
}

void PairTorch::log_halo_mode()
{
  const auto &meta = model()->metadata();
  if (comm->me == 0 && nlayers > 1)
    utils::logmesg(lmp,
                   "pair_style torch: {}\n",
                   use_exchange
                       ? fmt::format("layered model: per-layer halo exchange of {} features per atom "
                                     "between its {} layers, ghost atoms one cutoff deep{}",
                                     join_words(meta.feature_widths), nlayers,
                                     graph->fold_possible() ? "; on this single rank ghosts are folded "
                                                       "onto their owners and the model runs in "
                                                       "one call ('fold no' keeps the exchange)"
                                     : (comm->nprocs == 1 && !fold_images
                                            ? "; 'fold no': the exchange runs on this single rank"
                                            : ""))
                       : fmt::format("{} message-passing layers on thick ghosts ({} x cutoff){}",
                                     nlayers, nlayers,
                                     halo_thick ? " ('halo thick')"
                                                : ": the model is not layered (see mltorch.export)"));
  if (comm->me == 0 && use_exchange && model()->is_compiled())
    utils::logmesg(lmp, "pair_style torch: {}\n",
                   model()->compiled_stages()
                       ? fmt::format("{}: compiled stages, chained with the halo exchange", model_path())
                       : fmt::format("{} holds no compiled stages (made by an older mltorch-compile): "
                                     "under the halo exchange its stages run as TorchScript; compile "
                                     "it again, or use 'halo thick' for its single-call code",
                                     model_path()));
}

/* ---------------------------------------------------------------------- */

void PairTorch::init_style()
{
  time_pair = time_model = graph->time_halo = 0.0;
  if (!model()) error->all(FLERR, "Pair style torch: pair_coeff * * model.pt ... must come first");
  if (force->newton_pair == 0)
    error->all(FLERR, "Pair style torch requires newton pair on (use 'newton on')");
  if (atom->tag_enable == 0) error->all(FLERR, "Pair style torch requires atom IDs");
  // the model's energy is used as it is: a shift or a tail correction
  // LAMMPS would add for a pairwise style has no meaning for it
  if (offset_flag || tail_flag)
    error->all(FLERR, "Pair style torch does not support pair_modify {}: the model's energy is "
                      "used as it is (energy shifts belong in the model); remove the pair_modify "
                      "keyword or set it to no",
               offset_flag ? "shift yes" : "tail yes");

  // LAMMPS's init() restarts the neighbor build count: the ghost owners of
  // a fold are found again on the first build of this run
  graph->new_run();
  if (halo_settings_changed) {
    derive_halo_mode();
    log_halo_mode();
  }
  const auto &meta = model()->metadata();
  if (meta.units != update->unit_style)
    error->all(FLERR,
               "Pair style torch: model {} uses '{}' units but this run uses 'units {}'; "
               "use 'units {}' or a model exported for {} units",
               model_path(), meta.units, update->unit_style, meta.units, update->unit_style);

  MLTorchLmp::request_full_list(neighbor, this, nlayers > 1 && !use_exchange, instance_me);

  // pair_style hybrid(/overlay), e.g. a D3 correction on top of the model
  // (compute() checks that a message-passing model has every type pair),
  // took its sub-styles' communication sizes and ghost-neighbor flag in its
  // settings, before pair_coeff gave this style its committee (3 values per
  // member and atom) and its depth (thick ghosts need ghost lists); Comm
  // and Neighbor take them from the hybrid style
  if (force->pair && force->pair != this && !private_instance) {
    force->pair->comm_forward = std::max(force->pair->comm_forward, comm_forward);
    force->pair->comm_reverse = std::max(force->pair->comm_reverse, comm_reverse);
    if (ghostneigh) force->pair->ghostneigh = 1;
  }

  // a model with L message-passing layers sees atoms L cutoffs away:
  // make LAMMPS keep ghost atoms out to L*rc (+ skin for atom motion).
  // comm_modify mode multi takes per-type cutoffs and ignores that setting
  // (cutghostuser is for mode single): the model would miss ghosts silently
  if (nlayers > 1 && !use_exchange && comm->mode != Comm::SINGLE)
    error->all(FLERR,
               "Pair style torch: message-passing model {} ({} layers) needs ghost atoms out to "
               "{} x cutoff + skin, which comm_modify mode multi does not provide; use "
               "'comm_modify mode single'",
               model_path(), nlayers, nlayers);
  log_ghosts = nlayers > 1;
  // thick ghosts given up by a re-issued pair_style: the user's ghost cutoff again
  if (use_exchange && cutghost_user_before >= 0.0) {
    comm->cutghostuser = cutghost_user_before;
    cutghost_user_before = -1.0;
  }
  if (nlayers > 1 && !use_exchange) {
    cutghost_model = nlayers * cutoff + neighbor->skin;
    if (comm->cutghostuser < cutghost_model) {
      if (cutghost_user_before < 0.0) cutghost_user_before = comm->cutghostuser;
      comm->cutghostuser = cutghost_model;
      if (comm->me == 0)
        utils::logmesg(lmp,
                       "pair_style torch: model has {} message-passing layers; ghost cutoff set "
                       "to {} = {} x {} (cutoff) + {} (skin)\n",
                       nlayers, cutghost_model, nlayers, cutoff, neighbor->skin);
    }
  }

  // torch threads: keyword, else LAMMPS's OpenMP setting, else OMP_NUM_THREADS, else 1
  int nt = nthreads;
  if (nt < 1 && comm->nthreads > 1) nt = comm->nthreads;
  if (nt < 1) {
    const char *env = getenv("OMP_NUM_THREADS");
    if (env) nt = std::atoi(env);
  }
  if (nt < 1) nt = 1;
  torch_threads = nt;
  MLTorch::set_num_threads(nt);
  if (comm->me == 0)
    utils::logmesg(lmp, "pair_style torch: {} LibTorch thread(s) per MPI rank\n", nt);

  // a re-issued pair_style may name another device: the models follow
  committee->to_device(committee->rank_device(device_name));
}

/* ---------------------------------------------------------------------- */

double PairTorch::init_one(int i, int j)
{
  if (setflag[i][j] == 0) error->all(FLERR, "All pair coeffs are not set");
  cutghost[i][j] = cutghost[j][i] = cutoff;
  return cutoff;
}

/* ---------------------------------------------------------------------- */

void PairTorch::compute(int eflag, int vflag)
{
  const double t_start = platform::walltime();
  ev_init(eflag, vflag);
  // LibTorch's thread count is per process: another torch style (a teacher)
  // may have set its own since our last step
  MLTorch::set_num_threads(torch_threads);
  // the tensor block cache's clock: blocks a growing system outgrew go back
  MLTorch::tensor_blocks_step();
  // the atomic virial of a message-passing model (the edge moments) on the
  // steps a compute asks for it; under the exchange it needs the ghost
  // nodes, so no fold on those steps
  const bool moments = cvflag_atom && nlayers > 1;
  require_all_type_pairs();
  graph->build(list, !moments);
  if (log_ghosts) graph->log_ghost_counts(graph->size[0]);
  log_ghosts = false;

  ++ncompute;
  // fix torch/finetune replaces the model's share of this step after its
  // update (complete_deferred); per-atom tallies are not deferred
  const bool defer = defer_request && !eflag_atom && !vflag_atom && !cvflag_atom;
  defer_request = false;
  if (defer) {
    deferred_at = ncompute;
    model_calls[1] += 1.0;
    time_pair += platform::walltime() - t_start;
    return;
  }

  model_calls[0] += 1.0;
  MLTorch::GraphInput in;
  graph->input(in);
  // the edge moments need every node's position in this rank's frame
  if (moments) {
    in.centroid_positions = graph->node_positions();
    in.atomic_virial = true;
  }
  const double t_model = platform::walltime();
  committee->evaluate_md(in, *output, ncompute);
  stamp_output = ncompute;
  time_model += platform::walltime() - t_model;
  std::string where;
  if (!graph->finite(*output, where)) nonfinite_error(where);

  if (eflag_global) eng_vdwl += output->energy;
  const std::vector<int> &node2atom = graph->node_atoms();
  if (eflag_atom)
    for (int n = 0; n < graph->n_counted(); n++) eatom[node2atom[n]] += output->node_energy[n];

  // forces, and the virial tallies this step asks for
  TorchGraph::Tallies tallies;
  tallies.virial = vflag_global ? virial : nullptr;
  tallies.vatom = vflag_atom ? vatom : nullptr;
  tallies.cvatom = cvflag_atom ? cvatom : nullptr;
  tallies.moments = moments ? output->edge_moment.data() : nullptr;
  tallies.x = atom->x;
  const bool tally = vflag_global || vflag_atom || cvflag_atom;
  graph->scatter(output->edge_grad.data(), atom->f[0], 3, tally ? &tallies : nullptr);
  time_pair += platform::walltime() - t_start;
}

/* ----------------------------------------------------------------------
   the deferred force call of this step is complete: fix torch/finetune
   added the updated model's forces itself; the step's energy and virial
------------------------------------------------------------------------- */

void PairTorch::complete_deferred(double energy, const double *w)
{
  if (!model_deferred())
    error->all(FLERR, "Pair style torch: complete_deferred() without a deferred force call");
  if (eflag_global) eng_vdwl += energy;
  if (vflag_global)
    for (int k = 0; k < 6; k++) virial[k] += w[k];
  deferred_at = -1;
}

/* ----------------------------------------------------------------------
   the rows the graph or the committee communicates (CommRows): copied
   from owners to ghost copies, and summed from ghost copies into owners
------------------------------------------------------------------------- */

int PairTorch::pack_forward_comm(int n, int *list, double *buf, int /*pbc_flag*/, int * /*pbc*/)
{
  const std::size_t w = comm_rows.width;
  for (int i = 0; i < n; ++i) std::memcpy(buf + i * w, comm_rows.data + list[i] * w, sizeof(double) * w);
  return n * comm_rows.width;
}

void PairTorch::unpack_forward_comm(int n, int first, double *buf)
{
  const std::size_t w = comm_rows.width;
  std::memcpy(comm_rows.data + first * w, buf, sizeof(double) * w * n);
}

int PairTorch::pack_reverse_comm(int n, int first, double *buf)
{
  const std::size_t w = comm_rows.width;
  std::memcpy(buf, comm_rows.data + first * w, sizeof(double) * w * n);
  return n * comm_rows.width;
}

void PairTorch::unpack_reverse_comm(int n, int *list, double *buf)
{
  const std::size_t w = comm_rows.width;
  for (int i = 0; i < n; ++i) {
    double *row = comm_rows.data + list[i] * w;
    for (std::size_t k = 0; k < w; ++k) row[k] += buf[i * w + k];
  }
}

/* ----------------------------------------------------------------------
   end of a run: the share of the pair time the model took (the rest is
   graph build, copies and the force scatter), averaged over the ranks
------------------------------------------------------------------------- */

void PairTorch::finish()
{
  double mine[3] = {time_pair, time_model, graph->time_halo}, sum[3] = {0.0, 0.0, 0.0};
  MPI_Allreduce(mine, sum, 3, MPI_DOUBLE, MPI_SUM, world);
  if (comm->me == 0 && sum[0] > 0.0)
    utils::logmesg(lmp,
                   "pair_style torch: model evaluation {:.1f}% of the pair time (graph build, copies "
                   "and force scatter {:.1f}%), {:.4g} s per rank{}\n",
                   100.0 * sum[1] / sum[0], 100.0 * (1.0 - sum[1] / sum[0]), sum[0] / comm->nprocs,
                   use_exchange ? fmt::format("; the halo exchange (inside the model evaluation, "
                                              "waits included) {:.1f}%",
                                              100.0 * sum[2] / sum[0])
                                : std::string());
}

/* ----------------------------------------------------------------------
   pair_style hybrid: a message-passing model owns every type pair
------------------------------------------------------------------------- */

void PairTorch::require_all_type_pairs()
{
  // pair_style hybrid gives a sub-style that covers only some type pairs a
  // skip list: a layer's messages through the skipped atoms would be lost
  if (nlayers > 1 && list->iskip)
    error->all(FLERR,
               "Pair style torch: message-passing model {} ({} layers) inside pair_style hybrid "
               "must be given every type pair (its layers pass messages through all atoms); use "
               "pair_style hybrid/overlay with 'pair_coeff * * torch {} <element of each type>' "
               "and put the other styles on top of it",
               model_path(), nlayers, model_path());
}

/* ----------------------------------------------------------------------
   a model can return NaN/Inf (e.g. atoms far outside its training data):
   stop with the step and the atoms involved instead of integrating garbage
------------------------------------------------------------------------- */

void PairTorch::nonfinite_error(const std::string &where)
{
  error->one(FLERR, "Pair style torch: model {} returned a non-finite energy or force on step {}{}",
             model_path(), update->ntimestep, where);
}

/* ----------------------------------------------------------------------
   "graph_size": nodes and edges of this rank's last graph (1-dim, 2 values)
   "model_calls": this rank's force calls that ran the model and those that
   left it to fix torch/finetune (1-dim, 2 values); the third value counts
   the member evaluations made for the committee deviation
------------------------------------------------------------------------- */

void *PairTorch::extract(const char *name, int &dim)
{
  if (strcmp(name, "graph_size") == 0) {
    dim = 1;
    return (void *) graph->size;
  }
  if (strcmp(name, "model_calls") == 0) {
    dim = 1;
    model_calls[2] = committee->evaluations;
    return (void *) model_calls;
  }
  return nullptr;
}

/* ---------------------------------------------------------------------- */

double PairTorch::memory_usage()
{
  double bytes = Pair::memory_usage() + graph->memory_usage();
  bytes += (double) (output->edge_grad.capacity() + output->node_energy.capacity()) * sizeof(double);
  return bytes;
}

/* ----------------------------------------------------------------------
   TorchStudent: the graph and the committee of this style
------------------------------------------------------------------------- */

void PairTorch::training_graph(MLTorch::GraphInput &in)
{
  graph->host_graph(list, in);
}

/* ----------------------------------------------------------------------
   committee deviation of the current configuration (TorchCommittee), on
   the graph of the current neighbor list and positions (the same as the
   last force call's, unless atoms moved since)
------------------------------------------------------------------------- */

const PairTorch::Deviation &PairTorch::committee_deviation()
{
  if (const Deviation *known = committee->known_deviation(ncompute)) return *known;
  MLTorch::GraphInput in;
  deviation_graph(in);
  return committee->deviation(*graph, in, ncompute, md_output());
}
