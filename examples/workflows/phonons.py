"""The phonon frequencies of the supercell from in.phonons' dynmat.bin (THz)."""
import sys

import numpy as np

# the matrix is mass-weighted, in eV/A^2/amu: sqrt(eigenvalue) / 2 pi in THz
THZ = 15.633302


def frequencies(path):
    m = np.fromfile(path, dtype=np.float64)
    n = int(round(np.sqrt(m.size)))
    w2 = np.linalg.eigvalsh(0.5 * (m.reshape(n, n) + m.reshape(n, n).T))
    return np.sign(w2) * np.sqrt(np.abs(w2)) * THZ


if __name__ == "__main__":
    thz = frequencies(sys.argv[1] if len(sys.argv) > 1 else "dynmat.bin")
    print(f"{thz.size // 3} atoms, {thz.size} modes; three acoustic at Gamma: {np.sort(np.abs(thz))[:3]} THz")
    print(f"highest frequency {thz.max():.4f} THz")
