/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   Part of the LAMMPS-independent core (no LAMMPS, no MPI, no LibTorch):
   labelled configurations as extended XYZ, the format ASE reads
   (ase.io.read(FILE, ":")) and MACE's, NequIP's and SevenNet's trainers
   accept. fix torch/finetune's `labels FILE` writes one frame per label
   with LabelWriter; read_extxyz reads such files (and the user's own).

   A frame (units eV and Angstrom):

     64
     Lattice="ax ay az bx by bz cx cy cz" Properties=species:S:1:pos:R:3:forces:R:3
       energy=E stress="9 values" pbc="T T T" step=100 replica=0 teacher="sw ..."
       config_hash=0123456789abcdef [energy_shift=S] [deviation=D] ...
     Si x y z fx fy fz
     ...

   (the comment line is one line). `energy` is the teacher's as it gave it;
   `energy_shift` is the fitted per-element reference of that configuration
   (n . mu, eV), recorded and not applied. `stress` is ASE's: -virial /
   volume in eV/A^3 (positive under tension), 3x3 row-major.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_LABELS_H
#define MLTORCH_CORE_LABELS_H

#include <cstdint>
#include <istream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace MLTorch {

// a label file that cannot be written or read; the text names the file,
// the frame (1-based) and the line where that applies
class LabelsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// one labelled configuration, eV and Angstrom
struct LabelFrame {
  double cell[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};    // rows a, b, c
  bool pbc[3] = {true, true, true};
  std::vector<std::string> species;    // per atom
  std::vector<double> positions;       // [natoms][3]
  std::vector<double> forces;          // [natoms][3] (empty: none)
  bool has_energy = false, has_stress = false;
  double energy = 0.0;
  double stress[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};    // ASE's sign, eV/A^3
  // further comment-line keys, in order, as written (values without quotes)
  std::vector<std::pair<std::string, std::string>> info;

  std::size_t natoms() const { return species.size(); }
  const std::string *find(const std::string &key) const;
};

// a hash of a configuration (cell, species, positions) as 16 hex digits
std::string configuration_hash(const LabelFrame &f);

// the frame as text, every number as the shortest text that reads back
// bitwise (std::to_chars)
std::string format_frame(const LabelFrame &f);

// the complete frames at the start of an extended XYZ file: how many, and
// the bytes they take (a partial last frame, as a killed job may leave, is
// after them); LabelsError when a frame before the end is malformed
struct FramesOnDisk {
  int64_t frames = 0, bytes = 0, size = 0;    // size: the file's
};
FramesOnDisk scan_frames(const std::string &path);

// appends frames to a label file: each in one write(), then fdatasync, so
// that a killed job leaves its complete frames readable (at most the frame
// being written is partial, and the next writer cuts it off)
class LabelWriter {
 public:
  // open `path` for appending. `keep_bytes` >= 0: cut the file back to its
  // first `keep_bytes` bytes, which must hold exactly `keep_frames` complete
  // frames (a continued run: the frames written after its restart file are
  // written again). < 0: keep every complete frame and cut a partial last
  // one off (`repaired` then says how many bytes went)
  LabelWriter(const std::string &path, int64_t keep_bytes, int64_t keep_frames);
  ~LabelWriter();
  LabelWriter(const LabelWriter &) = delete;
  LabelWriter &operator=(const LabelWriter &) = delete;

  void write(const LabelFrame &f);
  int64_t frames() const { return nframes; }
  int64_t bytes() const { return nbytes; }
  int64_t repaired() const { return cut; }
  const std::string &path() const { return path_; }

 private:
  std::string path_;
  int fd = -1;
  int64_t nframes = 0, nbytes = 0, cut = 0;
};

// every frame of an extended XYZ file (ASE's dialect: Lattice, pbc,
// Properties with species/pos/forces columns in any order, energy, stress
// as 9 or 6 (Voigt) values or virial, quoted values); LabelsError naming
// the frame and line of anything malformed
std::vector<LabelFrame> read_extxyz(const std::string &path);
// the same from the text of such a file (`path` names it in messages)
std::vector<LabelFrame> parse_extxyz(const std::string &text, const std::string &path);
std::vector<LabelFrame> parse_extxyz(std::istream &in, const std::string &path);

}    // namespace MLTorch

#endif
