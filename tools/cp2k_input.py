#!/usr/bin/env python3
"""Write a CP2K input from a LAMMPS data file, atoms in atom-ID order, so that
CP2K as an i-PI client of fix torch/finetune (`teacher ipi`) describes the
run's atoms in the order the server sends them (doc/dft_teacher.md).

    tools/cp2k_input.py system.data --elements Si [--driver NAME] [-o cp2k.inp]

--elements gives the element of each LAMMPS atom type (1, 2, ...). With
--driver NAME the input runs CP2K in driver mode on the Unix socket
/tmp/ipi_NAME (RUN_TYPE DRIVER); without it, a single ENERGY_FORCE
calculation of the data file's configuration (what a test compares the
labels with). Positions are written relative to the box's lower corner,
as the server sends them. Settings: PBE, GTH pseudopotentials, MOLOPT
basis sets, Gamma point; --cutoff/--rel-cutoff/--basis/--eps-scf change
them. Reads orthogonal and triclinic boxes (xy xz yz) of atom styles
atomic, charge and full (the coordinates are the last three columns before
optional image flags).

--project names CP2K's own files (PROJECT-RESTART.wfn and its backups); it
defaults to the output's name without its extension (cp2k.0.inp: cp2k.0),
so inputs written to different files can run at the same time in one
folder. Two CP2K runs with one project in one folder rotate the same
backups, and one of them can abort.
"""

import argparse
import os
import sys

# valence electrons of the GTH-PBE pseudopotentials CP2K's GTH_POTENTIALS
# lists for each element (the q in GTH-PBE-qN)
GTH_Q = {"H": 1, "He": 2, "Li": 3, "Be": 4, "B": 3, "C": 4, "N": 5, "O": 6, "F": 7, "Ne": 8,
         "Na": 9, "Mg": 10, "Al": 3, "Si": 4, "P": 5, "S": 6, "Cl": 7, "Ar": 8, "Ti": 12,
         "Fe": 16, "Ni": 18, "Cu": 11, "Zn": 12, "Ga": 13, "Ge": 4, "As": 5}


def read_data(path):
    """box (lo, hi, xy, xz, yz), and [(id, type, x, y, z)] sorted by atom ID"""
    lo, hi, tilt = [0.0] * 3, [0.0] * 3, [0.0, 0.0, 0.0]
    atoms, section, style = [], None, "atomic"
    with open(path) as f:
        lines = f.readlines()
    for line in lines:
        words = line.split("#")[0].split()
        comment = line.split("#")[1].strip() if "#" in line else ""
        if not words:
            continue
        if len(words) >= 4 and words[2] in ("xlo", "ylo", "zlo"):
            d = "xyz".index(words[2][0])
            lo[d], hi[d] = float(words[0]), float(words[1])
        elif len(words) >= 6 and words[3] == "xy":
            tilt = [float(w) for w in words[:3]]
        elif words[0] in ("Atoms", "Velocities", "Masses", "Bonds", "Angles", "Pair", "PairIJ"):
            section = words[0]
            if section == "Atoms" and comment:
                style = comment.split()[0]
        elif section == "Atoms" and words[0].lstrip("-").isdigit():
            n = len(words)
            # image flags: three trailing integers
            if n >= 8 and all(w.lstrip("-").isdigit() for w in words[-3:]):
                xyz = words[-6:-3]
            else:
                xyz = words[-3:]
            atoms.append((int(words[0]), int(words[2] if style == "full" else words[1]),
                          *(float(v) for v in xyz)))
    atoms.sort()
    ids = [a[0] for a in atoms]
    if ids != list(range(1, len(atoms) + 1)):
        sys.exit("cp2k_input.py: atom IDs must be 1..N (use reset_atoms id before write_data)")
    return lo, hi, tilt, atoms


def write_output(text, output):
    """an input file's text to `output` ("-": standard output)"""
    if output == "-":
        sys.stdout.write(text)
    else:
        with open(output, "w") as f:
            f.write(text)


def project_of(path):
    """the CP2K project of an input written to `path`: its name without its
    extension (one project per input file, so that runs can share a folder)"""
    return os.path.splitext(os.path.basename(path))[0]


def cp2k_input(data, elements, driver=None, cutoff=200.0, rel_cutoff=40.0,
               basis="DZVP-MOLOPT-SR-GTH", eps_scf=1e-6, project="lammps"):
    lo, hi, (xy, xz, yz), atoms = read_data(data)
    lx, ly, lz = (hi[d] - lo[d] for d in range(3))
    kinds = sorted({elements[t - 1] for _, t, *_ in atoms})
    out = ["&GLOBAL", f"  PROJECT {project}",
           f"  RUN_TYPE {'DRIVER' if driver else 'ENERGY_FORCE'}", "  PRINT_LEVEL LOW", "&END GLOBAL"]
    if driver:
        out += ["&MOTION", "  &DRIVER", f"    HOST {driver}", "    UNIX", "  &END DRIVER",
                "&END MOTION"]
    out += ["&FORCE_EVAL", "  METHOD QS", "  STRESS_TENSOR ANALYTICAL",
            "  &DFT", "    BASIS_SET_FILE_NAME BASIS_MOLOPT",
            "    POTENTIAL_FILE_NAME GTH_POTENTIALS",
            "    &MGRID", f"      CUTOFF {cutoff}", f"      REL_CUTOFF {rel_cutoff}", "    &END MGRID",
            "    &QS", "      EPS_DEFAULT 1.0E-12", "    &END QS",
            "    &SCF", "      SCF_GUESS ATOMIC", f"      EPS_SCF {eps_scf}", "      MAX_SCF 50",
            "      &OT", "        MINIMIZER DIIS", "        PRECONDITIONER FULL_SINGLE_INVERSE",
            "      &END OT", "      &OUTER_SCF", f"        EPS_SCF {eps_scf}", "        MAX_SCF 20",
            "      &END OUTER_SCF", "    &END SCF",
            "    &XC", "      &XC_FUNCTIONAL PBE", "      &END XC_FUNCTIONAL", "    &END XC",
            "  &END DFT", "  &SUBSYS", "    &CELL",
            f"      A {lx:.12f} 0.0 0.0", f"      B {xy:.12f} {ly:.12f} 0.0",
            f"      C {xz:.12f} {yz:.12f} {lz:.12f}", "      PERIODIC XYZ", "    &END CELL",
            "    &COORD"]
    for _, t, x, y, z in atoms:
        out.append(f"      {elements[t - 1]} {x - lo[0]:.12f} {y - lo[1]:.12f} {z - lo[2]:.12f}")
    out.append("    &END COORD")
    for el in kinds:
        if el not in GTH_Q:
            sys.exit(f"cp2k_input.py: no GTH-PBE valence known for {el}; add it to GTH_Q")
        out += [f"    &KIND {el}", f"      BASIS_SET {basis}",
                f"      POTENTIAL GTH-PBE-q{GTH_Q[el]}", "    &END KIND"]
    out += ["  &END SUBSYS", "  &PRINT", "    &FORCES ON", "      NDIGITS 15", "    &END FORCES",
            "    &STRESS_TENSOR ON", "    &END STRESS_TENSOR", "  &END PRINT",
            "&END FORCE_EVAL"]
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data")
    p.add_argument("--elements", nargs="+", required=True)
    p.add_argument("--driver", help="i-PI socket name: /tmp/ipi_NAME")
    p.add_argument("--cutoff", type=float, default=200.0)
    p.add_argument("--rel-cutoff", type=float, default=40.0)
    p.add_argument("--basis", default="DZVP-MOLOPT-SR-GTH")
    p.add_argument("--eps-scf", type=float, default=1e-6)
    p.add_argument("--project", help="CP2K's project name (default: the output's name "
                   "without extension; lammps when writing to stdout)")
    p.add_argument("-o", "--output", default="-")
    a = p.parse_args()
    if a.project is None:
        a.project = "lammps" if a.output == "-" else project_of(a.output)
    write_output(cp2k_input(a.data, a.elements, a.driver, a.cutoff, a.rel_cutoff, a.basis,
                            a.eps_scf, a.project), a.output)


if __name__ == "__main__":
    main()
