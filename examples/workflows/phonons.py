"""The phonon frequencies of the supercell from in.phonons' dynmat.bin (THz)."""
import sys

import numpy as np

path = sys.argv[1] if len(sys.argv) > 1 else "dynmat.bin"
m = np.fromfile(path, dtype=np.float64)
n = int(round(np.sqrt(m.size)))
# mass-weighted, eV/A^2/amu: sqrt(eigenvalue) / 2 pi in THz
w2 = np.linalg.eigvalsh(0.5 * (m.reshape(n, n) + m.reshape(n, n).T))
thz = np.sign(w2) * np.sqrt(np.abs(w2)) * 15.633302
print(f"{n // 3} atoms, {n} modes; three acoustic at Gamma: {np.sort(np.abs(thz))[:3]} THz")
print(f"highest frequency {thz.max():.4f} THz")
