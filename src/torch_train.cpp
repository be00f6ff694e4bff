/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   torch/train (torch_train.h, doc/torch_train.rst): offline training of
   the pair style's model on labelled configurations, on the engine of fix
   torch/finetune. Each configuration is held whole by one rank (its folded
   periodic graph, MLTorch::periodic_graph); each epoch every rank of every
   partition takes its DistributedSampler shard of the training set; an
   update takes `batch` configurations over all ranks (batch / ranks each),
   their loss gradients from MLTorch::configuration_gradient (the function
   the fix's own update uses), summed over all ranks and averaged over the
   configurations by MLTorch::DistributedTrainer, as the fix does over its
   replicas: DistributedDataParallel with one worker per MPI rank.
------------------------------------------------------------------------- */

#include "torch_train.h"

#include "comm.h"
#include "error.h"
#include "finetune_dataset.h"
#include "finetune_keywords.h"
#include "force.h"
#include "lmp_compat.h"
#include "mltorch_mpi.h"
#include "platform.h"
#include "torch_student.h"
#include "universe.h"
#include "update.h"

#include "mltorch/collectives.h"
#include "mltorch/dataset.h"
#include "mltorch/distributed.h"
#include "mltorch/finetune.h"
#include "mltorch/model.h"
#include "mltorch/restart_record.h"
#include "mltorch/runtime.h"
#include "mltorch/sampler.h"

#include "json.h"    // LAMMPS's copy of nlohmann/json

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

using namespace LAMMPS_NS;

namespace {

// the validation split's permutation is seeded apart from the epochs' ones
constexpr uint64_t kSplitSeed = 1000003;
constexpr const char *kCheckpointMagic = "ML-TORCH torch/train checkpoint ";

struct Options {
  std::string file;
  bigint epochs = 0, batch = 0;
  uint64_t seed = 0;
  bool drop_last = false;
  double valid = 0.0, memory_mb = 4096.0;
  int save_every = 0, checkpoint_every = 0, log_every = 1;
  std::string save_file, checkpoint_file, resume_file;
};

// the model's errors on one configuration (no gradient), as a round adds them
void add_errors(const MLTorch::Model &model, const MLTorch::LabelledConfiguration &c, double e_label,
                const MLTorch::FinetuneSettings &set, MLTorch::RoundStats &stats)
{
  MLTorch::GraphOutput out;
  model.evaluate(c.graph.input(), out, false);
  std::vector<double> f;
  double w[6];
  MLTorch::graph_forces_virial(c.graph, out.edge_grad, f, w);
  double se_f = 0.0;
  for (std::size_t k = 0; k < f.size(); ++k) se_f += (f[k] - c.fref[k]) * (f[k] - c.fref[k]);
  const auto terms = MLTorch::loss_terms(set.w_energy, set.w_force, set.w_stress, out.energy,
                                         e_label, w, c.w_ref, se_f, c.natoms());
  stats.add(terms, se_f, c.natoms());
}

// two rounds' statistics summed over every rank of `comm`
void sum_stats(MLTorch::RoundStats &a, MLTorch::RoundStats &b, MPI_Comm comm)
{
  std::vector<double> buf(2 * MLTorch::RoundStats::SIZE);
  a.pack(buf.data());
  b.pack(buf.data() + MLTorch::RoundStats::SIZE);
  const auto sum = MLTorch::sum_everywhere(buf, comm);
  a = MLTorch::RoundStats::unpack(sum.data());
  b = MLTorch::RoundStats::unpack(sum.data() + MLTorch::RoundStats::SIZE);
}

}    // namespace

/* ---------------------------------------------------------------------- */

void TorchTrain::command(int narg, char **arg)
{
  if (narg < 1) MLTorchLmp::missing_args(FLERR, "torch/train", error);
  Options o;
  o.file = arg[0];
  MLTorch::FinetuneSettings set;
  set.energy_shift = 0;
  set.log_every = 0;
  static const std::vector<std::string> keywords{
      "epochs", "batch", "seed", "drop_last", "valid", "save", "checkpoint", "resume", "log",
      "memory", "weights", "lr", "optimizer", "weight_decay", "anchor", "momentum", "schedule", "clip",
      "train", "freeze", "energy_shift"};
  auto is_keyword = [&](const char *w) {
    return std::find(keywords.begin(), keywords.end(), w) != keywords.end();
  };
  auto value = [&](int i, const char *what) {
    if (i >= narg) MLTorchLmp::missing_args(FLERR, std::string("torch/train ") + what, error);
    return arg[i];
  };
  int iarg = 1;
  while (iarg < narg) {
    const std::string kw = arg[iarg];
    const int next = parse_training_keyword(lmp, "torch/train", narg, arg, iarg, set, is_keyword);
    if (next > iarg) {
      iarg = next;
    } else if (kw == "epochs") {
      o.epochs = utils::bnumeric(FLERR, value(iarg + 1, "epochs"), false, lmp);
      if (o.epochs < 1) error->all(FLERR, "torch/train epochs must be >= 1");
      iarg += 2;
    } else if (kw == "batch") {
      o.batch = utils::bnumeric(FLERR, value(iarg + 1, "batch"), false, lmp);
      if (o.batch < 1) error->all(FLERR, "torch/train batch must be >= 1 configuration");
      iarg += 2;
    } else if (kw == "seed") {
      const bigint s = utils::bnumeric(FLERR, value(iarg + 1, "seed"), false, lmp);
      if (s < 0) error->all(FLERR, "torch/train seed must be >= 0");
      o.seed = static_cast<uint64_t>(s);
      iarg += 2;
    } else if (kw == "drop_last") {
      o.drop_last = utils::logical(FLERR, value(iarg + 1, "drop_last"), false, lmp) != 0;
      iarg += 2;
    } else if (kw == "valid") {
      o.valid = utils::numeric(FLERR, value(iarg + 1, "valid"), false, lmp);
      if (!(o.valid >= 0.0 && o.valid < 1.0))
        error->all(FLERR, "torch/train valid is the fraction of configurations kept for "
                          "validation, in [0,1), not {}", arg[iarg + 1]);
      iarg += 2;
    } else if (kw == "save" || kw == "checkpoint") {
      const int every = utils::inumeric(FLERR, value(iarg + 1, kw.c_str()), false, lmp);
      const std::string file = value(iarg + 2, kw.c_str());
      if (every < 0) error->all(FLERR, "torch/train {} interval must be >= 0 epochs", kw);
      if (kw == "save") {
        o.save_every = every;
        o.save_file = file;
      } else {
        o.checkpoint_every = every;
        o.checkpoint_file = file;
      }
      iarg += 3;
    } else if (kw == "resume") {
      o.resume_file = value(iarg + 1, "resume");
      iarg += 2;
    } else if (kw == "log") {
      o.log_every = utils::inumeric(FLERR, value(iarg + 1, "log"), false, lmp);
      if (o.log_every < 0) error->all(FLERR, "torch/train log interval must be >= 0 epochs");
      iarg += 2;
    } else if (kw == "memory") {
      o.memory_mb = utils::numeric(FLERR, value(iarg + 1, "memory"), false, lmp);
      if (!(o.memory_mb > 0)) error->all(FLERR, "torch/train memory must be > 0 MB");
      iarg += 2;
    } else {
      error->all(FLERR, "Unknown torch/train keyword: {}", kw);
    }
  }
  if (o.epochs < 1)
    error->all(FLERR, "torch/train needs the number of epochs: torch/train {} epochs N ...", o.file);

  // the log of each partition (its first rank)
  auto say = [&](const std::string &format, auto &&...args) {
    if (comm->me == 0) utils::logmesg(lmp, fmt::vformat(format, fmt::make_format_args(args...)));
  };
  MPI_Comm uw = universe->uworld;
  const int nranks = universe->nprocs, rank = universe->me;
  if (o.batch == 0) o.batch = nranks;
  if (o.batch % nranks != 0)
    error->all(FLERR, "torch/train batch {} must be a multiple of the {} MPI ranks of all "
                      "partitions: every rank takes batch / ranks configurations per update",
               o.batch, nranks);
  const bigint per_rank = o.batch / nranks;

  // the model of the pair style: one, the same everywhere
  TorchStudent *student = TorchStudent::of(force);
  if (!student || !student->model())
    error->all(FLERR, "torch/train trains the model of pair_style torch: define pair_style torch "
                      "and its pair_coeff before it");
  if (student->committee_size() != 1)
    error->all(FLERR, "torch/train trains one model, but pair_coeff lists a committee of {}; "
                      "train each member with its own pair_coeff", student->committee_size());
  auto model = student->shared_model();
  const auto &meta = model->metadata();
  {
    std::string first, other;
    const int bad = MLTorch::first_differing_rank(student->model_hash(), uw, first, other);
    if (bad >= 0)
      error->all(FLERR, "torch/train: universe rank {} loaded another model (file hash {}) than "
                        "rank 0 ({}); every partition must load the same model file",
                 bad, other, first);
  }
  try {
    model->set_trainable(MLTorch::select_trainable(model->parameter_names(), set.train_prefixes,
                                                    set.freeze_prefixes));
  } catch (MLTorch::SelectionError &e) {
    error->all(FLERR, "torch/train {}", e.what());
  }
  if (model->num_trainable() == 0)
    error->all(FLERR, "torch/train: nothing to train: the train/freeze keywords and the model "
                      "file's own frozen parameters leave none of the {} parameters of {} trainable",
               model->num_parameters(), student->model_path());

  // the dataset: every configuration on every rank
  std::string dataset_hash;
  auto configs = read_dataset(lmp, "torch/train", o.file, *model, set, o.memory_mb, &dataset_hash);
  const auto n = static_cast<int64_t>(configs.size());
  const int64_t nvalid = o.valid > 0 ? std::max<int64_t>(1, std::llround(o.valid * n)) : 0;
  const int64_t ntrain = n - nvalid;
  if (ntrain < 1)
    error->all(FLERR, "torch/train: valid {} leaves no training configuration of the {} in {}",
               o.valid, n, o.file);
  if (o.drop_last && ntrain < nranks)
    error->all(FLERR, "torch/train drop_last with {} training configurations and {} ranks leaves "
                      "every rank without one", ntrain, nranks);
  const auto split = MLTorch::distributed_shard(n, 1, 0, o.seed + kSplitSeed, 0);
  const std::vector<int64_t> train_set(split.begin(), split.begin() + ntrain);
  const std::vector<int64_t> valid_set(split.begin() + ntrain, split.end());

  // every rank a worker of its own: a configuration is whole on its rank
  std::unique_ptr<MLTorch::DistributedTrainer> trainer;
  try {
    set.energy_shift = set.energy_shift == 1 ? 1 : 0;
    trainer = std::make_unique<MLTorch::DistributedTrainer>(
        set, std::vector<std::shared_ptr<MLTorch::Model>>{model}, MPI_COMM_SELF, uw, rank);
  } catch (std::exception &e) {
    error->all(FLERR, "torch/train: {}", e.what());
  }

  // resume: the training state and where in which epoch it stood
  bigint epoch0 = 0, update0 = 0;
  if (!o.resume_file.empty()) {
    std::string bytes, failure;
    if (rank == 0) {
      try {
        bytes = MLTorch::read_file(o.resume_file);
      } catch (std::exception &e) {
        failure = e.what();
      }
    }
    MLTorchLmp::stop_collectively(error, uw, failure.empty(),
                                  "torch/train: cannot read the checkpoint " + o.resume_file + ": " +
                                      failure,
                                  false);
    MLTorch::broadcast_bytes(bytes, 0, uw);
    try {
      const std::size_t magic = std::strlen(kCheckpointMagic);
      const std::size_t eol = bytes.find('\n');
      if (bytes.compare(0, magic, kCheckpointMagic) != 0 || eol == std::string::npos)
        throw std::runtime_error("it is no torch/train checkpoint");
      const auto j = json::parse(bytes.substr(magic, eol - magic));
      auto expect = [&](const char *key, const std::string &want, const char *why) {
        const std::string got = j.at(key).is_string() ? j.at(key).get<std::string>() : j.at(key).dump();
        if (got != want)
          throw std::runtime_error(fmt::format("it was written with {} {} where this run has {} ({})",
                                               key, got, want, why));
      };
      expect("dataset", dataset_hash, "the dataset's content hash: train on the same file");
      expect("model", student->model_hash(), "the model file's hash: load the file the run started from");
      expect("ranks", std::to_string(nranks), "the shards depend on the rank count");
      expect("batch", std::to_string(o.batch), "batch");
      expect("seed", std::to_string(o.seed), "seed");
      expect("valid", std::to_string(nvalid), "validation configurations: the same valid");
      const std::string rec = bytes.substr(eol + 1);
      const auto r = MLTorch::unpack_record(rec.data(), MLTorch::record_size(rec.data(), rec.size()),
                                            MLTorch::DistributedTrainer::NSTATS);
      trainer->restore(r);
      epoch0 = j.at("epoch").get<bigint>();
      update0 = j.at("update").get<bigint>();
    } catch (std::exception &e) {
      error->all(FLERR, "torch/train: cannot resume from {}: {}", o.resume_file, e.what());
    }
  }

  // the energy labels, relative to a reference fitted once to the training
  // set (energy_shift fit): the residuals of the model it starts from
  std::vector<double> e_label(n);
  for (int64_t i = 0; i < n; ++i) e_label[i] = configs[i].e_ref;
  if (set.energy_shift == 1) {
    auto &shift = trainer->energy_shift[0];
    if (o.resume_file.empty()) {
      std::vector<double> d(ntrain, 0.0);
      for (int64_t k = rank; k < ntrain; k += nranks) {
        MLTorch::GraphOutput out;
        model->evaluate(configs[train_set[k]].graph.input(), out, false);
        d[k] = configs[train_set[k]].e_ref - out.energy;
      }
      d = MLTorch::sum_everywhere(d, uw);
      for (int64_t k = 0; k < ntrain; ++k) shift.add(configs[train_set[k]].counts, d[k]);
    }
    for (int64_t i = 0; i < n; ++i) e_label[i] -= shift.shift_of(configs[i].counts);
  }

  const bigint shard_size = MLTorch::distributed_shard_size(ntrain, nranks, o.drop_last);
  const bigint updates_per_epoch = (shard_size + per_rank - 1) / per_rank;
  double graph_mb = 0.0, natoms = 0.0;
  for (const auto &c : configs) {
    graph_mb += static_cast<double>(c.graph.bytes()) / 1e6;
    natoms += c.natoms();
  }
  say(
                 "torch/train: {} configurations ({:.0f} atoms) from {}: {} to train on, {} to "
                 "validate; graphs {:.1f} MB per rank\n"
                 "torch/train: training {} of {} parameters of {} with {} (lr {}) for {} epochs "
                 "on {} MPI ranks: {} configurations per update ({} per rank), {} updates per "
                 "epoch{}\n",
                 n, natoms, o.file, ntrain, nvalid, graph_mb, model->num_trainable(),
                 model->num_parameters(), student->model_path(), set.opt.kind, set.opt.lr, o.epochs,
                 nranks, o.batch, per_rank, updates_per_epoch,
                 epoch0 > 0 || update0 > 0
                     ? fmt::format("; resumed at epoch {} update {}", epoch0 + 1, update0)
                     : std::string());

  auto write_agreed = [&](const std::string &path, const std::function<std::string()> &bytes,
                          const char *what) {
    std::string why;
    if (rank == 0) {
      try {
        MLTorch::write_file_atomic(path, bytes());
      } catch (std::exception &e) {
        why = e.what();
      }
    }
    MLTorchLmp::stop_collectively(error, uw, why.empty(),
                                  fmt::format("torch/train: cannot write the {} {}: {}", what, path, why),
                                  false);
  };
  auto save_model = [&](const std::string &path) {
    write_agreed(path, [&] {
      return model->file_bytes(MLTorch::provenance_json(student->model_path(), student->model_hash(),
                                                        trainer->count.nupdates, 0,
                                                        "torch/train " + o.file));
    }, "model");
  };
  auto checkpoint = [&](bigint epoch, bigint upd) {
    write_agreed(o.checkpoint_file, [&] {
      json j;
      j["dataset"] = dataset_hash;
      j["model"] = student->model_hash();
      j["ranks"] = nranks;
      j["batch"] = o.batch;
      j["seed"] = o.seed;
      j["valid"] = nvalid;
      j["epoch"] = epoch;
      j["update"] = upd;
      return kCheckpointMagic + j.dump() + "\n" +
          MLTorch::pack_record(trainer->record(student->model_hash(), {student->model_hash()}));
    }, "checkpoint");
  };

  const double t_start = platform::walltime();
  bigint nseen = 0;
  for (bigint epoch = epoch0; epoch < o.epochs; ++epoch) {
    const auto shard = MLTorch::distributed_shard(ntrain, nranks, rank, o.seed, epoch, true, o.drop_last);
    MLTorch::RoundStats seen;
    const std::string prefix = fmt::format("torch/train epoch {}: ", epoch + 1);
    for (bigint u = epoch == epoch0 ? update0 : 0; u < updates_per_epoch; ++u) {
      std::string fail;
      const auto end = std::min<bigint>(static_cast<bigint>(shard.size()), (u + 1) * per_rank);
      for (bigint b = u * per_rank; b < end && fail.empty(); ++b) {
        const int64_t i = train_set[shard[b]];
        MLTorch::ConfigurationGradient g;
        fail = MLTorch::whole_configuration_gradient(*model, configs[i], e_label[i], set, prefix, g);
        if (!fail.empty()) {
          fail += " (" + configs[i].where + ")";
          break;
        }
        trainer->round.add(g.loss.terms, g.loss.se_f, g.loss.natoms);
        seen.add(g.loss.terms, g.loss.se_f, g.loss.natoms);
        ++trainer->count.nconfigs;
        ++nseen;
      }
      MLTorchLmp::stop_collectively(error, uw, fail.empty(), fail);
      const auto out = trainer->update(true, false, prefix);
      if (!out.failure.empty()) error->all(FLERR, out.failure);
      if (out.action != MLTorch::UpdateAction::Step)
        say( "torch/train: epoch {} update {}: {}\n", epoch + 1, u + 1,
                       MLTorch::describe(out.action));
    }
    const bool last = epoch + 1 == o.epochs;
    if ((o.log_every > 0 && ((epoch + 1) % o.log_every == 0 || epoch == epoch0)) || last) {
      // the validation configurations, each on one rank
      MLTorch::RoundStats check;
      for (int64_t k = rank; k < nvalid; k += nranks)
        add_errors(*model, configs[valid_set[k]], e_label[valid_set[k]], set, check);
      sum_stats(seen, check, uw);
      say(
                     "torch/train: epoch {} updates {} lr {:.6g} | train (during the epoch) loss "
                     "{:.6g} E_rmse {:.6g} F_rmse {:.6g} W_rmse {:.6g}{}\n",
                     epoch + 1, trainer->count.nupdates, trainer->stats[5],
                     seen.n > 0 ? seen.mean_loss() : 0.0, seen.energy_rmse(), seen.force_rmse(),
                     seen.virial_rmse(),
                     nvalid > 0 ? fmt::format(" | valid loss {:.6g} E_rmse {:.6g} F_rmse {:.6g} "
                                              "W_rmse {:.6g}",
                                              check.mean_loss(), check.energy_rmse(),
                                              check.force_rmse(), check.virial_rmse())
                                : std::string());
    }
    if (o.save_every > 0 && !o.save_file.empty() && ((epoch + 1) % o.save_every == 0 || last))
      save_model(o.save_file);
    if (o.checkpoint_every > 0 && !o.checkpoint_file.empty() &&
        ((epoch + 1) % o.checkpoint_every == 0 || last))
      checkpoint(epoch + 1, 0);
  }
  if (o.save_every == 0 && !o.save_file.empty()) save_model(o.save_file);
  if (o.checkpoint_every == 0 && !o.checkpoint_file.empty()) checkpoint(o.epochs, 0);
  // the pair style runs the trained parameters from now on
  student->committee_changed();
  const double wall = platform::walltime() - t_start;
  bigint all_seen = 0;
  MPI_Allreduce(&nseen, &all_seen, 1, MPI_LMP_BIGINT, MPI_SUM, uw);
  say("torch/train: {} epochs, {} updates, {} configurations in {:.3f} s: {:.4g} configurations "
      "per second over {} ranks\n",
      o.epochs - epoch0, trainer->count.nupdates, all_seen, wall, wall > 0 ? all_seen / wall : 0.0,
      nranks);
}
