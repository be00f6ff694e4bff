#!/usr/bin/env bash
# The batch scripts of examples/slurm, submitted to a real one-node Slurm
# (slurmctld + slurmd + munged, tools/slurm-local.sh) and checked:
#
#   md           md.sbatch on 2 ranks (srun --mpi=pmix) completes
#   chain        finetune.sbatch on 2 replicas: one job of 4 chunks, and a
#                chain of 2 jobs of 2 chunks (chain.sh, --dependency=afterok,
#                the second reads the first's restart files); the chain's
#                atoms (x, v), thermo lines (loss, force error, updates) and
#                saved model file are bitwise those of the single job
#   committee    committee.sbatch as a job array of 3 members, then
#                committee-md.sbatch (afterok on the array) runs the committee
#   preemption   finetune.sbatch with --time=2 --signal=B:USR1@60: Slurm's
#                signal stops both replicas after the same chunk, the job ends
#                COMPLETED before its limit with restart files and model
#                written, and a next job continues from them
#   kills        finetune.sbatch cancelled (scancel: SIGTERM) and killed
#                (scancel --signal=KILL --full) at random moments: the model
#                file loads, and a next job continues from the last restart set
#   dft          dft_teacher.sbatch: LAMMPS and an i-PI client (LAMMPS with
#                sw) each in its own srun step, one replica (2 CPUs here)
#   gpu          md-gpu.sbatch parses and advises what unittest/kokkos/gpu_advice.py
#                checks (it cannot run: no GPU)
#
#   unittest/test_slurm.sh [LMP [PYTHON]]    (needs root; exit 77 = skipped)
#
# A Slurm that is already up (tools/slurm-local.sh up) is used and left up;
# otherwise the test brings one up and takes it down at the end, also when a
# check fails. Outputs are kept in a /tmp folder when a check fails.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lmp=${1:-$here/build/lmp}
python=${2:-$here/.venv/bin/python}
slurm=$here/tools/slurm-local.sh
ex=$here/examples/slurm
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root (a Slurm in a root of its own)"; exit 77; }
[ -x "$lmp" ] || { echo "FAIL: no LAMMPS at $lmp"; exit 1; }

t_start=$SECONDS
work=$(mktemp -d /tmp/mltorch-slurm.XXXXXX)
ours=0
failed=0
finish() {
  local rc=$?
  [ "$failed" = 0 ] || rc=1
  if [ "$ours" = 1 ]; then "$slurm" down || rc=1; fi
  if [ "$rc" = 0 ]; then rm -rf "$work"; echo "PASS ($((SECONDS - t_start)) s)"
  else echo "FAIL: outputs kept in $work"; fi
  exit "$rc"
}
trap finish EXIT
trap 'echo "FAIL: line $LINENO: $BASH_COMMAND"; failed=1' ERR

S() { "$slurm" exec "$@"; }
fail() { echo "FAIL: $*"; failed=1; }
ok() { echo "ok: $*"; }

if "$slurm" status >/dev/null 2>&1; then
  echo "using the local Slurm that is up (it stays up)"
else
  t0=$SECONDS
  ours=1
  "$slurm" up
  echo "bring-up: $((SECONDS - t0)) s"
fi

cd "$work"
export MLTORCH=$here LMP=$lmp

# wait_for ID... : until squeue no longer lists them (at most 600 s)
wait_for() {
  local t0=$SECONDS left
  while :; do
    left=$(S squeue -h -o %A -j "$(IFS=,; echo "$*")" 2>/dev/null || true)
    [ -z "$left" ] && return 0
    if [ $((SECONDS - t0)) -gt 600 ]; then
      S squeue; fail "jobs $* still queued or running after 600 s"; exit 1
    fi
    sleep 1
  done
}
# state ID: the states of a job (one per line for an array's tasks)
state() { S scontrol show job -o "$1" | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
field() { S scontrol show job -o "$1" | grep -o "$2=[^ ]*" | head -n1 | cut -d= -f2; }
expect_state() {
  local id=$1 want=$2 what=$3 got
  got=$(state "$id" | sort -u | tr '\n' ' ')
  if [ "$got" = "$want " ]; then ok "$what: job $id $want"
  else fail "$what: job $id is '$got', expected $want"; fi
}
# thermo lines of LAMMPS logs (the 7 numbers of in.finetune's thermo_style)
thermo() { awk '/^ +Step/ {on = 1; next} /^Loop time/ {on = 0} on && NF == 7' "$@"; }
seconds() { awk -F: '{s = 0; for (i = 1; i <= NF; i++) s = 60 * s + $i; print s}' <<< "${1#*-}"; }

# --- submit everything that needs no interaction; Slurm runs it as CPUs free
md=$(S sbatch --parsable -o md.%j.out "$ex/md.sbatch")
ref=$(S sbatch --parsable -o ref.%j.out --export=ALL,WORK="$work/ref" "$ex/finetune.sbatch")
mapfile -t chain < <(SBATCH="$slurm exec sbatch" "$ex/chain.sh" 2 -o 'chain.%j.out' \
                       --export=ALL,WORK="$work/chain",JOB_CHUNKS=2)
arr=$(S sbatch --parsable -o 'member.%A_%a.out' --export=ALL,WORK="$work/committee" "$ex/committee.sbatch")
cmd=$(S sbatch --parsable -o committee-md.%j.out --dependency=afterok:"$arr" \
        --export=ALL,WORK="$work/committee" "$ex/committee-md.sbatch")
pre=$(S sbatch --parsable -o preempt.%j.out --time=2 --signal=B:USR1@60 \
        --export=ALL,WORK="$work/preempt",STEPS=100000000 "$ex/finetune.sbatch")
# (one replica and its client: the local node has this machine's 2 CPUs)
dft=$(S sbatch --parsable -o dft.%j.out --ntasks=2 --export=ALL,WORK="$work/dft",CLIENT=lammps,STEPS=20,R=1 "$ex/dft_teacher.sbatch")
echo "submitted: md $md, uninterrupted $ref, chain ${chain[*]}, committee array $arr then $cmd, preemption $pre, dft teacher $dft"
wait_for "$md" "$ref" "${chain[@]}" "$arr" "$cmd" "$pre" "$dft"

# --- dft_teacher.sbatch: LAMMPS and its i-PI client (LAMMPS with sw) in one allocation
expect_state "$dft" COMPLETED "dft_teacher.sbatch"
if grep -q "^replica 0 at 600 K: 4 updates" "dft.$dft.out"; then
  ok "dft_teacher: LAMMPS and its i-PI client (LAMMPS with sw) in their own srun steps, 4 updates"
else
  fail "dft_teacher: no summary line"
fi
sock=$(sed -n 's/^i-PI sockets: \(\S*\) .*/\1/p' "dft.$dft.out")
[ -n "$sock" ] || fail "dft_teacher: no socket name in its output"
S sh -c "ls ${sock}*" >/dev/null 2>&1 && fail "dft_teacher: socket files left ($sock)" \
  || ok "dft_teacher: socket files removed ($sock)"

# --- md
expect_state "$md" COMPLETED "md.sbatch"
grep -q "^md: 64 atoms, 20 steps" "md.$md.out" && ok "md: 64 atoms, 20 steps on 2 ranks" || fail "md: no summary line"

# --- chain == uninterrupted
expect_state "$ref" COMPLETED "uninterrupted fine-tuning"
expect_state "${chain[0]}" COMPLETED "chain job 1"
expect_state "${chain[1]}" COMPLETED "chain job 2"
grep -q "continuing from step 20" "chain.${chain[1]}.out" && ok "chain job 2 continued from step 20" \
  || fail "chain job 2 did not continue from job 1's restart files"
# the dependency held: job 2 started when job 1 had ended
[ "$(field "${chain[1]}" StartTime)" \< "$(field "${chain[0]}" EndTime)" ] && fail "chain job 2 started before job 1 ended"
for p in 0 1; do
  if cmp -s "ref/state.$p.40.dump" "chain/state.$p.40.dump"; then
    ok "chain: replica $p's positions and velocities at step 40 bitwise equal the uninterrupted run's"
  else fail "chain: replica $p's state at step 40 differs from the uninterrupted run's"; fi
  if [ -n "$(thermo "ref/log.$ref.$p")" ] && \
     diff <(thermo "ref/log.$ref.$p") <(thermo "chain/log.${chain[0]}.$p" "chain/log.${chain[1]}.$p") >/dev/null; then
    ok "chain: replica $p's $(thermo "ref/log.$ref.$p" | wc -l) thermo lines (T, pe, etotal, loss, force RMSE, updates) bitwise equal"
  else fail "chain: replica $p's thermo lines differ"; fi
done
cmp -s ref/model.pt chain/model.pt && ok "chain: the saved model file is bitwise the uninterrupted run's" \
  || fail "chain: model.pt differs from the uninterrupted run's"
if cmp -s ref/restart.0.40 chain/restart.0.40; then echo "note: the restart files are bytewise equal too"
else echo "note: restart files differ in bytes, as expected (LibTorch keys the optimizer state by memory addresses)"; fi

# --- committee
expect_state "$arr" COMPLETED "committee array (3 tasks)"
[ "$(state "$arr" | wc -l)" = 3 ] || fail "the array did not have 3 tasks"
for k in 0 1 2; do
  [ -f "committee/member.$k/model.pt" ] || fail "committee member $k has no model"
done
if cmp -s committee/member.0/model.pt committee/member.1/model.pt || \
   cmp -s committee/member.1/model.pt committee/member.2/model.pt; then
  fail "committee members are identical"
else ok "committee: 3 members, all different"; fi
expect_state "$cmd" COMPLETED "committee MD"
rows=$(grep -vc '^#' committee/model_devi.out || true)
maxf=$(awk '!/^#/ {print $5; exit}' committee/model_devi.out)
if [ "$rows" = 5 ] && awk -v f="$maxf" 'BEGIN {exit !(f > 0)}' && grep -q "committee of 3 models" "committee-md.$cmd.out"; then
  ok "committee MD: 3 models, model_devi.out with 5 rows, max_devi_f $maxf eV/A"
else fail "committee MD: model_devi.out has $rows rows, max_devi_f '$maxf'"; fi

# --- preemption
expect_state "$pre" COMPLETED "preemption (time limit 120 s, SIGUSR1 60 s before)"
run_s=$(seconds "$(field "$pre" RunTime)")
grep -q "SIGUSR1" "preempt.$pre.out" || fail "preemption: the batch script saw no SIGUSR1"
stopped=$(grep -h "^replica [01]: stopped on request after step [0-9]" preempt/log."$pre".[01] || true)
stops=$(awk '{print $NF}' <<< "$stopped" | sort -u)
if [ "$(grep -c . <<< "$stopped")" = 2 ] && [ "$(echo "$stops" | wc -w)" = 1 ] \
   && [ "$run_s" -lt 120 ]; then
  t_sig=$(sed -n 's/^\([0-9:]*\) SIGUSR1.*/\1/p' "preempt.$pre.out" | head -n1)
  t_beg=$(field "$pre" StartTime); t_beg=${t_beg#*T}
  ok "preemption: SIGUSR1 $(( $(seconds "$t_sig") - $(seconds "$t_beg") )) s into the job, both replicas stopped after step $stops, job COMPLETED after $run_s s of its 120"
else fail "preemption: replicas stopped at '$stops', run time $run_s s"; fi
for p in 0 1; do [ -f "preempt/restart.$p.$stops" ] || fail "preemption: no restart.$p.$stops"; done
mstep=$("$python" -m mltorch.info preempt/model.pt 2>/dev/null | sed -n "s/.*'step': \([0-9]*\).*/\1/p")
[ "$mstep" = "$stops" ] && ok "preemption: model.pt loads and is the model of step $stops" \
  || fail "preemption: model.pt is of step '$mstep', expected $stops"

# --- kills at random moments, then a job continues from what is left
last_step() { { ls "$1" 2>/dev/null || true; } | sed -n 's/^restart\.1\.\([0-9][0-9]*\)$/\1/p' | sort -n | tail -n1; }
kill_at_random() {   # kill_at_random TERM|KILL: a long job, killed at a random moment after it wrote restart files
  local how=$1 id before t0=$SECONDS
  before=$(last_step kill); before=${before:--1}
  id=$(S sbatch --parsable -o "kill.%j.out" --export=ALL,WORK="$work/kill",STEPS=100000000,CHUNK=5 "$ex/finetune.sbatch")
  until [ "$(last_step kill)" ] && [ "$(last_step kill)" -gt "$before" ]; do
    if [ $((SECONDS - t0)) -gt 120 ] || [ -z "$(S squeue -h -o %A -j "$id" 2>/dev/null)" ]; then
      fail "kills: job $id ended or ran 120 s without a new restart file ($(state "$id")): $(tail -n 3 "kill.$id.out" 2>/dev/null)"
      return
    fi
    sleep 0.2
  done
  sleep "$((RANDOM % 3)).$((RANDOM % 10))"
  if [ "$how" = TERM ]; then S scancel "$id"; else S scancel --full --signal=KILL "$id"; fi
  wait_for "$id"
  echo "job $id: $how at a random moment, last restart file of step $(last_step kill), state $(state "$id"), $(ls kill | grep -c '\.tmp\.' || true) temporary file(s) of interrupted writes left"
  "$python" -m mltorch.info kill/model.pt >/dev/null 2>&1 && ok "kills: after $how, model.pt loads" \
    || fail "kills: after $how, model.pt does not load"
}
kill_at_random TERM
kill_at_random KILL
kill_at_random TERM
last=$(last_step kill)
cont=$(S sbatch --parsable -o "cont.%j.out" --export=ALL,WORK="$work/kill",STEPS=100000000,CHUNK=5,JOB_CHUNKS=1 "$ex/finetune.sbatch")
cont2=$(S sbatch --parsable -o "cont.%j.out" --export=ALL,WORK="$work/preempt",STEPS=100000000,JOB_CHUNKS=1 "$ex/finetune.sbatch")
wait_for "$cont" "$cont2"
expect_state "$cont" COMPLETED "continuation after the kills"
ls kill | grep -q '\.tmp\.' && fail "kills: temporary files left after the next job" \
  || ok "kills: no temporary file of an interrupted write is left after the next job"
expect_state "$cont2" COMPLETED "continuation after the preemption"
grep -q "continuing from step " "cont.$cont.out" && ok "kills: the next job continued from step $(sed -n 's/^continuing from step \([0-9]*\).*/\1/p' "cont.$cont.out") (last restart seen: $last)" \
  || fail "kills: the next job did not continue"
grep -q "continuing from step $stops" "cont.$cont2.out" && ok "preemption: the next job continued from step $stops" \
  || fail "preemption: the next job did not continue from step $stops"

# --- the GPU script: it cannot run here; it parses and gives the advice that is tested
bash -n "$ex/md-gpu.sbatch" || fail "md-gpu.sbatch does not parse"
advice=$(cd "$here" && "$python" -c "
import sys; sys.path.insert(0, 'unittest/kokkos'); import gpu_advice as g, re
(pk,) = g.advice()['-pk']
found = set(' '.join(m.split()) for m in re.findall(r'-pk kokkos' + g.OPTION_WORDS, open('examples/slurm/md-gpu.sbatch').read()))
print('ok' if found == {pk} else 'advises %s, the project %s' % (found, pk))")
[ "$advice" = ok ] && ok "md-gpu.sbatch: parses, advises -pk kokkos as the project does (not run: no GPU)" \
  || fail "md-gpu.sbatch: $advice"
