#!/usr/bin/env python3
"""An i-PI client for the tests of fix torch/finetune's `teacher ipi`: ASE's
SocketClient around an ASE calculator (Lennard-Jones), optionally plus known
per-element energy constants, and the faulty clients the fault tests need.

  ipi_client.py NAME NATOMS [--shift E] [--die-after K] [--bad nan|count]
                [--record FILE] [--symbols Si|SiC] [--port P] [--after S]

NAME is the Unix socket's name (/tmp/ipi_NAME), or with --port the TCP
host. --after waits S seconds once the server listens (so that other peers
come first). --record writes every
calculation (energy, forces, virial in eV and Angstrom, as the calculator
gave them) to FILE as JSON lines, so that a test compares the labels the
server made of them with what the client computed.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
from ase import Atoms
from ase.calculators.calculator import Calculator, all_changes
from ase.calculators.lj import LennardJones
from ase.calculators.socketio import SocketClient


class Teacher(Calculator):
    """Lennard-Jones (sigma 2.1 A, epsilon 0.5 eV, cutoff 5 A), plus `shift`
    eV per atom of the first element and 2 x `shift` per atom of the second;
    the faults on request"""

    implemented_properties = ["energy", "forces", "stress"]

    def __init__(self, shift=0.0, die_after=0, bad="", record=None):
        super().__init__()
        self.lj = LennardJones(sigma=2.1, epsilon=0.5, rc=5.0, smooth=True)
        self.shift, self.die_after, self.bad, self.record = shift, die_after, bad, record
        self.calls = 0

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        self.calls += 1
        if self.die_after and self.calls > self.die_after:
            os._exit(3)    # a crash: no goodbye on the socket
        a = self.atoms.copy()
        a.calc = self.lj
        numbers = a.get_atomic_numbers()
        first = numbers[0]
        energy = a.get_potential_energy() + self.shift * float(
            np.sum(np.where(numbers == first, 1.0, 2.0)))
        forces = a.get_forces()
        stress = a.get_stress()
        if self.bad == "nan" and self.calls >= 2:
            energy = float("nan")
        if self.bad == "count" and self.calls >= 2:
            forces = forces[:-1]
        self.results = {"energy": energy, "free_energy": energy, "forces": forces,
                        "stress": stress}
        if self.record:
            virial = -a.get_volume() * np.array(
                [[stress[0], stress[5], stress[4]], [stress[5], stress[1], stress[3]],
                 [stress[4], stress[3], stress[2]]])
            with open(self.record, "a") as f:
                f.write(json.dumps({"energy": energy, "forces": forces.tolist(),
                                    "virial": virial.tolist(),
                                    "positions": a.get_positions().tolist(),
                                    "cell": a.get_cell().tolist()}) + "\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("name")
    p.add_argument("natoms", type=int)
    p.add_argument("--shift", type=float, default=0.0)
    p.add_argument("--die-after", type=int, default=0)
    p.add_argument("--bad", default="")
    p.add_argument("--record")
    p.add_argument("--symbols", default="Si")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the server")
    p.add_argument("--port", type=int, default=0, help="TCP on host NAME, this port")
    p.add_argument("--after", type=float, default=0.0)
    args = p.parse_args()

    if args.symbols == "SiC":
        symbols = ["Si", "C"] * (args.natoms // 2)
    else:
        symbols = ["Si"] * args.natoms
    atoms = Atoms(symbols, positions=np.zeros((args.natoms, 3)), cell=np.eye(3) * 10.0, pbc=True)
    atoms.calc = Teacher(args.shift, args.die_after, args.bad, args.record)
    # the server may start after the client: retry until it listens
    deadline = time.time() + args.wait
    where = dict(host=args.name, port=args.port) if args.port else dict(unixsocket=args.name)
    if args.after > 0:
        while not args.port and not os.path.exists("/tmp/ipi_" + args.name):
            if time.time() > deadline:
                sys.exit(f"ipi_client.py: no server on /tmp/ipi_{args.name}")
            time.sleep(0.02)
        time.sleep(args.after)
    while True:
        try:
            client = SocketClient(**where)
            break
        except OSError:
            if time.time() > deadline:
                sys.exit(f"ipi_client.py: no server on /tmp/ipi_{args.name}")
            time.sleep(0.1)
    try:
        client.run(atoms, use_stress=True)
    except Exception as e:    # the server's EXIT, or the server gone
        print(f"ipi_client.py: {type(e).__name__}: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
