#!/usr/bin/env python3
"""The mutation check: does the test suite catch real defects?

Applies a curated list of mutants (a sign flipped, a term dropped, a
restore skipped, an exchange left out, an off-by-one in a pack, a unit
constant changed, ...) one at a time to the checkout, rebuilds build/
incrementally, runs the tests that should catch it (its "killer"), and
restores the file. A mutant is killed when its killer fails (a non-zero
exit, or its timeout: a hang is caught too); it survives when the killer
passes. Writes the table to bench/mutants.md.

  .venv/bin/python tools/mutants.py [--only NAME ...] [--list] [--check] [--report FILE]

--check builds and runs nothing: it says whether every mutant's text is
found exactly once in its file (ctest MutantsApply runs it, so a moved or
renamed line cannot leave a mutant stale unnoticed).

Mutants of kokkos/ (lane "kokkos") need the KOKKOS lane built
(tools/setup.sh --kokkos): they rebuild build/kokkos-current inside its
Debian 13 root and run its test program there.

Not part of CI: every mutant rebuilds part of LAMMPS and runs real tests
(about 1 to 3 minutes each on 2 cores; the whole list took the time the
report gives). It edits the working tree in place, one file at a time, and
puts every file back (also on Ctrl-C); do not edit the tree while it runs.

Adding a mutant when adding a feature: append a Mutant(...) below with a
unique `find` text of the new code, the defect as `replace`, and the
narrowest test command that must fail; run `tools/mutants.py --only NAME`
and see it killed before committing the feature.
"""

import argparse
import dataclasses
import os
import signal
import subprocess
import sys
import time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
build = os.path.join(root, "build")
py = os.path.join(root, ".venv", "bin", "python")
ENV = dict(os.environ, OMP_NUM_THREADS="1", ML_TORCH_LMP=os.path.join(build, "lmp"),
           ML_TORCH_MPIEXEC="mpirun", ML_TORCH_PYTHON_EXE=py,
           LAMMPS_POTENTIALS=os.path.join(build, "lammps-potentials"))
MPI = "mpirun --allow-run-as-root --oversubscribe"


def gtest(binary, filt, np=1):
    cmd = f"./unittest/{binary} --gtest_filter='{filt}'"
    return f"{MPI} -np {np} {cmd}" if np > 1 else cmd


@dataclasses.dataclass
class Mutant:
    name: str
    file: str
    find: str
    replace: str
    killer: str          # shell command, run in build/
    what: str
    timeout: int = 900
    lane: str = "main"   # "kokkos": rebuilt and killed in build/kokkos-current


# the KOKKOS lane (tools/setup.sh --kokkos): built and run inside its Debian 13 root
KDIR = os.path.join(build, "kokkos-current")
IN_ROOT = os.path.join(KDIR, "in-root")
KOKKOS_BUILD = (f"{IN_ROOT} env CCACHE_DIR={os.path.expanduser('~/.cache/ml-torch/ccache-debian13')} "
                f"CCACHE_BASEDIR={root} cmake --build {KDIR} -j 2")


def kk_gtest(filt, np=1):
    cmd = (f"{IN_ROOT} env OMP_NUM_THREADS=1 ML_TORCH_KOKKOS_THREADS=1 "
           f"{KDIR}/unittest/kokkos/test_pair_kokkos --gtest_filter='{filt}'")
    if np > 1:
        cmd = (f"{IN_ROOT} env OMP_NUM_THREADS=1 ML_TORCH_KOKKOS_THREADS=1 {MPI} -np {np} "
               f"{KDIR}/unittest/kokkos/test_pair_kokkos --gtest_filter='{filt}'")
    return cmd


M = Mutant
MUTANTS = [
    # --- the core: loss, gradient, training state -------------------------
    M("loss_sign", "src/core/finetune.cpp", "t.de = (e - e_ref) / natoms;",
      "t.de = (e_ref - e) / natoms;", gtest("test_core", "Loss.*"),
      "energy residual with the wrong sign"),
    M("loss_no_stress", "src/core/finetune.cpp", "+ wS * t.se_w / 6.0;", ";",
      gtest("test_core", "Loss.*"), "stress term dropped from the loss"),
    M("train_force_sign", "src/core/training_pass.cpp",
      "forces = forces.index_add(0, edge_index[0], g).index_add(0, edge_index[1], -g);",
      "forces = forces.index_add(0, edge_index[0], g).index_add(0, edge_index[1], g);",
      gtest("test_finetune", "Systems/Gradient.MatchesIndependentReference*"),
      "training-pass force on the neighbour with + sign"),
    M("train_virial_sign", "src/core/training_pass.cpp",
      "auto rg = -(r.unsqueeze(2) * g.unsqueeze(1)).sum(0);",
      "auto rg = (r.unsqueeze(2) * g.unsqueeze(1)).sum(0);",
      gtest("test_finetune", "Systems/Gradient.MatchesIndependentReference*"),
      "training-pass virial sign flipped"),
    M("train_pass_not_closed", "src/core/training_pass.cpp",
      "  set_params_require_grad(false);\n}", "}",
      gtest("test_core", "TrainingErrors.*"), "a failed training pass leaves parameters requiring gradients"),
    M("replay_residual_sign", "src/mpi/distributed.cpp",
      "owned[k] = t.cf * (F[k] - fref[k]);", "owned[k] = t.cf * (fref[k] - F[k]);",
      gtest("test_finetune", "Systems/Gradient.*"), "the force residual of the distributed gradient (fresh and replayed) with the wrong sign"),
    M("agreed_exchange_off", "src/mpi/distributed.cpp",
      "  const std::string f = first_failure(comm_, true, \"\");\n  if (!f.empty()) {",
      "  const std::string f;\n  if (!f.empty()) {",
      gtest("test_library_failures", "*Between*", 2), "exchanges of a training pass no longer agree first",
      timeout=150),
    M("exchange_backward_doubled", "src/core/layered.cpp",
      "    return {g, torch::Tensor(), torch::Tensor(), torch::Tensor()};",
      "    return {2 * g, torch::Tensor(), torch::Tensor(), torch::Tensor()};",
      gtest("test_core", "LayeredModel.*"), "the exchange operator's backward returns 2 X^T"),
    M("content_hash_seed", "src/core/metadata.cpp", "14695981039346656037ULL", "14695981039346656036ULL",
      gtest("test_core", "Metadata.ContentHash"), "the hash's offset basis changed"),
    M("restore_no_good_state", "src/mpi/distributed.cpp",
      "  training->load_good(r.good_parameters, r.good_optimizer);\n  count = r;", "  count = r;",
      gtest("test_finetune", "Restart.RollbackState*"), "restart forgets the last good parameters"),
    M("restore_no_loss_average", "src/mpi/distributed.cpp",
      "  policy.set_loss_average(r.loss_ema);", "",
      gtest("test_finetune", "Restart.RollbackState*"), "restart forgets the loss average"),
    M("rollback_restores_nothing", "src/core/training.cpp",
      "  load_parameters(good_params);\n  load_optimizer_state(good_optimizer);", "",
      gtest("test_finetune", "Decisions.*"), "a rollback restores nothing"),
    M("restore_no_energy_shift", "src/mpi/distributed.cpp",
      "    e.unpack(r.energy_shift.substr(at, static_cast<std::size_t>(n)));", "",
      gtest("test_finetune_ipi", "IpiEnergyShift.Restart*"), "restart forgets the energy reference"),
    M("record_no_energy_shift", "src/core/restart_record.cpp",
      "  put_bytes(payload, r.energy_shift);    // version 4", "  put_bytes(payload, std::string());",
      "./unittest/test_restart_record", "restart record drops the energy reference"),
    M("energy_shift_minimum_norm_off", "src/core/finetune.cpp",
      "torch::linalg_pinv(A, 1e-12, /*hermitian=*/true)", "torch::linalg_pinv(A, 0.5, /*hermitian=*/true)",
      gtest("test_core", "EnergyShift.*"), "the shift fit drops well-determined directions"),
    M("committee_population_std", "src/core/committee.cpp", "  out[0] = std::sqrt(w * vf);",
      "  out[0] = std::sqrt(vf / (members - 1));",
      gtest("test_core", "Committee.*"), "committee deviation with the sample (n-1) std"),
    M("record_version_check", "src/core/restart_record.cpp",
      "if (version < 3 || version > TrainingRecord::VERSION)", "if (false)",
      "./unittest/test_restart_record", "restart record accepts unknown versions"),
    M("provenance_key", "src/core/metadata.cpp", 'j["teacher"] = teacher;', 'j["teachr"] = teacher;',
      gtest("test_core", "Metadata.*"), "provenance JSON loses its teacher key"),
    M("gpu_map", "src/core/runtime.cpp", 'return "cuda:" + std::to_string(node_local_rank % ngpu);',
      'return "cuda:" + std::to_string(node_local_rank % (ngpu + 1));',
      gtest("test_core", "DeviceMapping.*"), "ranks mapped onto a GPU that does not exist"),
    M("ipi_stale_socket", "src/core/ipi.cpp", "    ::unlink(path.c_str());    // stale: a crashed server's\n",
      "", gtest("test_finetune_ipi", "IpiFaults.Stale*"),
      "a stale socket file is not removed"),
    M("ipi_handshake", "src/core/ipi.cpp", '            if (status == "READY") {',
      '            if (status == "READY" || status == "HELLO") {',
      gtest("test_finetune_ipi", "IpiProtocol.PeersThatAreNoClientsHoldUpNoOne"),
      "a peer that answers no i-PI header becomes the client"),
    M("ipi_tcp_peer_user", "src/core/ipi.cpp", "        if (uid != me) refused", "        if (false) refused",
      gtest("test_finetune_ipi", "IpiProtocol.OtherUsersCannotFeedLabels"),
      "a TCP loopback peer of another user is served"),
    M("sampler_padding", "src/core/sampler.cpp",
      "indices.push_back(indices[static_cast<std::size_t>(k % n)]);", "indices.push_back(indices[0]);",
      gtest("test_finetune", "CoreSampler.*"), "DistributedSampler's padding repeats the wrong indices"),
    M("graph_images", "src/core/periodic_graph.cpp",
      "layers[d] = static_cast<int>(std::ceil(cutoff / spacing + (hi - lo)));",
      "layers[d] = static_cast<int>(std::ceil(cutoff / spacing + (hi - lo))) - 1;",
      gtest("test_finetune", "CoreGraph.*"), "the periodic graph misses the outermost images"),
    M("labels_restart_cut", "src/core/labels.cpp", "    keep = keep_bytes;\n", "",
      gtest("test_finetune", "Labels.RestartContinuesTheFileExactly"),
      "a continued run keeps the frames written after its restart file"),
    M("ipi_atom_count", "src/core/ipi.cpp", "  if (n != natoms)\n", "  if (false)\n",
      gtest("test_finetune_ipi", "IpiFaults.WrongAtomCount"), "atom count of the reply not checked"),
    M("first_failure_silent", "src/mpi/collectives.cpp",
      "  MPI_Allreduce(&first_bad, &bad_rank, 1, MPI_INT, MPI_MIN, comm);\n  if (bad_rank == nprocs) return {};",
      "  if (ok) return {};", gtest("test_library_failures", "LibraryFailures.OneRankFails", 2),
      "a failure on one rank is not shared", timeout=150),
    # --- the styles ------------------------------------------------------------
    M("md_force_sign", "src/torch_graph.cpp", "      fj[k] -= ge[k];",
      "      fj[k] += ge[k];", gtest("test_finetune", "Deferred.*"),
      "the refreshed MD force on the neighbour with + sign (the fix's force path after an update)"),
    M("fold_owner_lost", "src/torch_graph.cpp",
      "  for (int i = 0; i < nlocal; ++i) halo_buf[i] = static_cast<double>(i);", "",
      gtest("test_pair_lammps", "*FoldedGhosts*"), "ghost owners not sent: folding silently off"),
    M("fold_owners_kept_across_runs", "src/pair_torch.cpp", "  graph->new_run();\n", "",
      gtest("test_pair_lammps", "FoldAcrossRuns.*"), "ghost owners of the last run reused in the next"),
    M("halo_pack_off_by_one", "src/torch_graph.cpp",
      "  for (int n = 0; n < ncounted; ++n)\n    std::memcpy(halo_buf.data() + node2atom[n] * w, owned + n * w, sizeof(double) * w);",
      "  for (int n = 0; n + 1 < ncounted; ++n)\n    std::memcpy(halo_buf.data() + node2atom[n] * w, owned + n * w, sizeof(double) * w);",
      gtest("test_pair_lammps", "*HaloExchange*", 2),
      "the last owned atom's features not packed (on 2 ranks: one rank folds, no exchange)"),
    M("thick_without_ghost_lists", "src/pair_torch.cpp", "  ghostneigh = (nlayers > 1 && !use_exchange) ? 1 : 0;",
      "  ghostneigh = 0;", gtest("test_pair_lammps", "*HaloExchange*"),
      "thick ghosts without ghost neighbour lists"),
    M("reissue_ignored", "src/pair_torch.cpp", "    halo_settings_changed = true;", "    ;",
      gtest("test_pair_lammps", "ReissuedPairStyle.*"), "a re-issued halo/fold is ignored"),
    M("pair_modify_ignored", "src/pair_torch.cpp", "  if (offset_flag || tail_flag)", "  if (false)",
      gtest("test_pair_errors", "*PairModify*"), "pair_modify shift/tail silently ignored"),
    M("committee_mean_energy", "src/torch_committee.cpp", "    out.energy += w * member_out[m].energy;",
      "    out.energy = member_out[0].energy;", gtest("test_pair_lammps", "*Committee*"),
      "committee mean reports member 0's energy"),
    M("fix_no_residual_to_ghosts", "src/fix_torch_finetune_step.cpp", "  fix.copy_to_ghosts(COMM_RESID);\n",
      "", gtest("test_finetune", "Systems/Gradient.*"),
      "residual weights not copied to ghost images"),
    M("fix_no_forces_to_owners", "src/fix_torch_finetune_step.cpp", "  fix.sum_to_owners(COMM_FPART);\n", "",
      gtest("test_finetune", "Systems/Gradient.*"), "partial forces not summed onto owners"),
    M("hybrid_share_sign", "src/finetune_teacher.cpp", "fref[i][k] -= fothers[3 * i + k];",
      "fref[i][k] += fothers[3 * i + k];", gtest("test_finetune", "*Hybrid*"),
      "the other hybrid sub-styles' forces added, not removed"),
    M("energy_shift_sign", "src/fix_torch_finetune_step.cpp", "if (comm->me == 0) e_ref_m -= shift.shift_of(counts);",
      "if (comm->me == 0) e_ref_m += shift.shift_of(counts);",
      gtest("test_finetune_ipi", "IpiEnergyShift.Constants*"), "energy reference added, not removed"),
    M("rerun_silent", "src/fix_torch_finetune.cpp", 'strcmp(input->command, "rerun") == 0', "false",
      gtest("test_finetune", "FinetuneErrors.Rerun*"), "rerun trains nothing without a warning"),
    M("checksum_guard_blind", "src/finetune_replicas.cpp", "void FinetuneReplicas::checksum_guard(MLTorch::TrainingState &training, bigint nupdates)\n{",
      "void FinetuneReplicas::checksum_guard(MLTorch::TrainingState &training, bigint nupdates)\n{\n  return;",
      gtest("test_finetune", "ChecksumGuard.*", 2), "the replicas' parameter checksums never compared"),
    # --- the i-PI teacher --------------------------------------------------------
    M("ipi_hartree", "src/mltorch_units.h", "kHartreeEv = 27.211386245988;",
      "kHartreeEv = 27.21139;", gtest("test_finetune_ipi", "IpiAse.*"), "Hartree in eV off by 1.4e-7"),
    M("ipi_bohr", "src/mltorch_units.h", "kBohrAngstrom = 0.529177210903;",
      "kBohrAngstrom = 0.52918;", gtest("test_finetune_ipi", "IpiAse.*"), "Bohr in Angstrom off by 5e-6"),
    M("ipi_virial_lower", "src/finetune_teacher_ipi.cpp", "const int upper[6] = {0, 4, 8, 1, 2, 5};",
      "const int upper[6] = {0, 4, 8, 3, 6, 7};", gtest("test_finetune_ipi", "*IpiLammps*triclinic_client_np1"),
      "the virial read from the lower triangle (LAMMPS clients send the upper)"),
    M("ipi_force_components", "src/finetune_teacher_ipi.cpp", "for (int k = 0; k < 3; ++k) fref[i][k] = labels[7 + 3 * t + k];",
      "for (int k = 0; k < 3; ++k) fref[i][k] = labels[7 + 3 * t + (2 - k)];",
      gtest("test_finetune_ipi", "IpiAse.*"), "x and z force components swapped in the scatter"),
    M("ipi_finite_check", "src/finetune_teacher_ipi.cpp", "        if (!finite)\n", "        if (false)\n",
      gtest("test_finetune_ipi", "IpiFaults.NonFinite*"), "non-finite labels accepted"),
    M("ipi_tilt", "src/finetune_teacher_ipi.cpp", "domain->xy / bohr_, domain->xz / bohr_,", "0.0, 0.0,",
      gtest("test_finetune_ipi", "*IpiLammps*triclinic_client_np1"), "a triclinic cell sent without its tilt"),
    # --- the Python tooling ---------------------------------------------------------
    M("py_allow_list", "python/mltorch/rebuild.py",
      "    if parts[0] != OWN_PACKAGE or len(parts) < 2 or not all(q.isidentifier() for q in parts):\n        raise",
      "    if False:\n        raise", f"cd ../unittest && {py} test_python_export.py ModelFilesAreData",
      "model-file metadata may name any class"),
    M("py_small_bmm", "python/mltorch/graph_passes.py", "def unroll_small_bmm(gm, max_inner=8):",
      "def unroll_small_bmm(gm, max_inner=2):",
      f"cd ../unittest && {py} test_python_compiler.py SmallProducts", "small batched products not unrolled"),
    # --- torch/kk (the KOKKOS lane, OpenMP host build) ----------------------
    M("kk_force_sign", "kokkos/torch_graph_kokkos.cpp",
      "Kokkos::atomic_add(&lf(j, k), static_cast<acc_t>(-grad(e, k)));",
      "Kokkos::atomic_add(&lf(j, k), static_cast<acc_t>(grad(e, k)));",
      kk_gtest("*KokkosVsCpu*"), "torch/kk: the neighbour's force with + sign", lane="kokkos"),
    M("kk_virial_component", "kokkos/torch_graph_kokkos.cpp",
      "acc.v[3] -= vec(e, 0) * grad(e, 1);", "acc.v[3] -= vec(e, 1) * grad(e, 1);",
      kk_gtest("*KokkosVsCpu*"), "torch/kk: the xy virial from the wrong component", lane="kokkos"),
    M("kk_committee_sum", "kokkos/pair_torch_kokkos.cpp",
      "  const double w = 1.0 / nm;\n", "  const double w = 1.0;\n",
      kk_gtest("KokkosCommittee.*"), "torch/kk: committee mean summed, not averaged", lane="kokkos"),
    M("kk_nonfinite_unchecked", "kokkos/torch_graph_kokkos.cpp",
      "          if (!(grad(e, k) - grad(e, k) == 0.0)) ++bad;\n", "",
      kk_gtest("KokkosErrors.NonFinite*"), "torch/kk: non-finite forces not caught", lane="kokkos"),
    # --- the atomic (centroid) virial of the heat flux ----------------------
    M("centroid_on_centre", "src/torch_graph.cpp",
      "for (int k = 0; k < 9; k++) cv[j][k] -= re[ca[k]] * ge[cb[k]];",
      "for (int k = 0; k < 9; k++) cv[i][k] -= re[ca[k]] * ge[cb[k]];",
      f"{py} ../unittest/test_heatflux.py CentroidVirial.test_local_many_body_models",
      "a local model's edge terms on the centre (the per-atom split, not the heat flux's)"),
    M("centroid_frame_unconverted", "src/core/model.cpp",
      "      if (s == 0.0) continue;", "      continue;",
      f"{py} ../unittest/test_heatflux.py CentroidVirial.test_message_passing_every_halo_mode",
      "ghost gradients of the moment passes reach their owners in the ghost's frame"),
    M("centroid_folded", "src/pair_torch.cpp",
      "  graph->build(list, !moments);\n", "  graph->build(list);\n",
      f"{py} ../unittest/test_heatflux.py CentroidVirial.test_message_passing_every_halo_mode",
      "a folded rank computes the moments on its folded graph"),
    M("centroid_moment_sign", "src/torch_graph.cpp",
      "          cv[i][k] -= p - x[i][ca[k]] * ge[cb[k]];",
      "          cv[i][k] += p - x[i][ca[k]] * ge[cb[k]];",
      f"{py} ../unittest/test_heatflux.py CentroidVirial.test_message_passing_every_halo_mode",
      "the centre's moment term with the wrong sign"),
    M("block_cache_no_sweep", "src/core/runtime.cpp",
      "      if (++steps_ % kIdleSteps) return;\n",
      "      if (++steps_ % kIdleSteps || true) return;\n",
      gtest("test_pair_lammps", "TensorBlocks.*"),
      "the tensor block cache keeps every outgrown block of a growing system"),
    M("exchange_padding_uninitialised", "src/core/layered.cpp",
      "    auto dst = forward ? torch::zeros({rows_out, width}, buf_opts) : torch::empty({rows_out, width}, buf_opts);",
      "    auto dst = torch::empty({rows_out, width}, buf_opts);",
      gtest("test_core", "TensorBlockCache.ExchangePaddingRowsAreZero"),
      "the rows a host-space exchange does not write (torch/kk's padding) keep a recycled block's values"),
    M("sgd_momentum_dropped", "src/core/optimizer.cpp",
      ".momentum(s.momentum)", ".momentum(0.0)",
      gtest("test_finetune", "Optimizers.SgdSchedulesAndMomentum"),
      "the momentum keyword reaches no optimizer"),
    M("schedule_exp_off_by_one", "src/core/training.cpp",
      "return base * std::pow(a, t);", "return base * std::pow(a, t + 1);",
      gtest("test_finetune", "Optimizers.SgdSchedulesAndMomentum"),
      "the exp schedule one update ahead"),
    M("committee_clip_shared", "src/core/training.cpp",
      "norms.push_back(trainers[m]->step(slice, lr, max_norm));",
      "norms.push_back(trainers[m]->step(slice, lr, m == 0 ? max_norm : 2 * max_norm));",
      gtest("test_finetune", "Optimizers.ClipScalesEachMemberByItsOwnNorm"),
      "a committee member clipped to another bound than the first"),
    M("adam_eps_dropped", "src/core/optimizer.cpp",
      "impl->params, torch::optim::AdamOptions(s.lr).betas({s.beta1, s.beta2}).eps(s.eps)",
      "impl->params, torch::optim::AdamOptions(s.lr).betas({s.beta1, s.beta2}).eps(1e-3 * s.lr)",
      gtest("test_finetune", "Optimizers.AdamAndAdamWFollowTheirFormulas"),
      "Adam's eps not the documented 1e-8"),
    M("md_vatom_on_centre", "src/torch_graph.cpp",
      "        t->vatom[j][k] += 0.5 * v[k];",
      "        t->vatom[i][k] += 0.5 * v[k];",
      gtest("test_pair_lammps", "CentroidStress.LocalModelGivesAtomicVirialOnNeighbours"),
      "the per-atom virial's half on the neighbour given to the centre"),
    M("committee_units_unchecked", "src/torch_committee.cpp",
      "      else if (a.units != b.units)", "      else if (false)",
      f"cd ../unittest && {py} test_python_lammps.py CommitteeUnits",
      "committee members in different units accepted (or named as another mismatch)"),
    M("committee_depth_unchecked", "src/torch_committee.cpp",
      "      else if (a.num_interaction_layers != b.num_interaction_layers)", "      else if (false)",
      gtest("test_pair_errors", "*CommitteeMembersMustShareCutoffAndDepth*"),
      "committee members of different depth accepted"),
    M("deviation_group_ignored", "src/compute_torch_deviation.cpp",
      "    if (!(mask[i] & groupbit) || pair->species_of_type(type[i]) < 0) continue;",
      "    if (pair->species_of_type(type[i]) < 0) continue;",
      gtest("test_pair_lammps", "CommitteeDeviation.GroupRestrictsPerAtomOutputs"),
      "compute torch/deviation's statistics over all atoms whatever the group"),
    M("deviation_members_every_call", "src/torch_committee.cpp",
      "  if (stamp_members != call || call == 0) {",
      "  if (true) {",
      gtest("test_pair_lammps", "CommitteeDeviation.MembersEvaluatedOncePerStepThatAsks"),
      "the members evaluated again by every compute that asks on a step"),
    M("user_ghost_cutoff_lowered", "src/pair_torch.cpp",
      "    if (comm->cutghostuser < cutghost_model) {",
      "    if (comm->cutghostuser != cutghost_model) {",
      gtest("test_pair_lammps", "HaloGhosts.LargerUserGhostCutoffKept"),
      "thick ghosts lower a user's larger comm_modify cutoff"),
]


def sh(cmd, timeout, cwd=build):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, shell=True, cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout, start_new_session=True)
        return p.returncode, time.time() - t0, p.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        return "timeout", time.time() - t0, (e.stdout or b"").decode(errors="replace")


def run(mutants, report):
    rows, t_all = [], time.time()
    # every killer must pass on the unmutated tree, or a failure would prove nothing
    baseline = {}
    for m in mutants:
        if m.killer not in baseline:
            rc, t, out = sh(m.killer, m.timeout)
            baseline[m.killer] = rc
            if rc != 0:
                print(f"killer of {m.name} fails on the original tree ({rc}): {m.killer}", flush=True)
    for m in mutants:
        if baseline[m.killer] != 0:
            rows.append((m, "invalid: its killer fails on the original tree", 0.0))
            continue
        path = os.path.join(root, m.file)
        original = open(path).read()
        count = original.count(m.find)
        if count != 1:
            rows.append((m, f"stale ({count} matches of its text)", 0.0))
            print(f"{m.name}: stale ({count} matches)", flush=True)
            continue
        try:
            with open(path, "w") as f:
                f.write(original.replace(m.find, m.replace))
            if m.file.endswith(".py"):
                rc_b = 0
            elif m.lane == "kokkos":
                rc_b, tb, out = sh(KOKKOS_BUILD, 1800)
            else:
                rc_b, tb, out = sh("cmake --build . -j 2", 1800)
            if rc_b != 0:
                result = "killed by the compiler"
                t = 0.0
            else:
                rc, t, out = sh(m.killer, m.timeout)
                result = "killed" if rc != 0 else "SURVIVED"
                if rc == "timeout":
                    result = "killed (timeout: a hang)"
        finally:
            with open(path, "w") as f:
                f.write(original)
        rows.append((m, result, t))
        print(f"{m.name}: {result} ({t:.0f} s)", flush=True)
    if any(not r[0].file.endswith(".py") and r[0].lane == "main" for r in rows):
        sh("cmake --build . -j 2", 1800)    # the original again
    if any(r[0].lane == "kokkos" for r in rows):
        sh(KOKKOS_BUILD, 1800)
    total = time.time() - t_all
    # the report keeps the rows of mutants not run this time (a partial run
    # with --only updates its rows), in the order of the list
    fresh = {m.name: f"| {m.name} | `{m.file}` | {m.what} | `{m.killer.replace('|', '/')}` "
                     f"| {result} | {t:.0f} s |" for m, result, t in rows}
    kept, notes = {}, ""
    if os.path.exists(report):
        text = open(report).read()
        # the report's hand-written notes (from "## Notes" on) are kept
        if "\n## Notes" in text:
            notes = text[text.index("\n## Notes"):]
        for line in open(report):
            cells = [c.strip() for c in line.split("|")]
            if len(cells) > 6 and cells[1] in {m.name for m in MUTANTS}:
                kept[cells[1]] = line.rstrip("\n")
    kept.update(fresh)
    table = [kept[m.name] for m in MUTANTS if m.name in kept]
    results = [line.split("|")[5].strip() for line in table]
    killed = sum(1 for r in results if r.startswith("killed"))
    lines = [f"# Mutation check (tools/mutants.py), {time.strftime('%Y-%m-%d')}", "",
             f"{killed} of {len(table)} mutants killed ({len(MUTANTS)} in the list); the last "
             f"run took {total / 60:.0f} minutes on {os.cpu_count()} cores (incremental rebuilds "
             "of build/ and the killers).", "",
             "| mutant | file | defect | killer | result | killer time |",
             "| --- | --- | --- | --- | --- | --- |"] + table
    with open(report, "w") as f:
        f.write("\n".join(lines) + "\n" + notes)
    this_run = sum(1 for r in rows if r[1].startswith("killed"))
    print(f"{this_run} of {len(rows)} killed in this run; report in {report}")
    return this_run == len(rows)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", nargs="+")
    p.add_argument("--list", action="store_true")
    p.add_argument("--check", action="store_true")
    p.add_argument("--report", default=os.path.join(root, "bench", "mutants.md"))
    a = p.parse_args()
    chosen = [m for m in MUTANTS if not a.only or m.name in a.only]
    if a.check:
        stale = [(m, open(os.path.join(root, m.file)).read().count(m.find)) for m in chosen]
        stale = [(m, c) for m, c in stale if c != 1]
        for m, c in stale:
            print(f"{m.name}: its text is found {c} times in {m.file} (must be once)")
        print(f"{len(chosen) - len(stale)} of {len(chosen)} mutants apply")
        return 1 if stale else 0
    if a.list:
        for m in chosen:
            print(f"{m.name:32s} {m.file:40s} {m.what}")
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    return 0 if run(chosen, a.report) else 1


if __name__ == "__main__":
    sys.exit(main())
