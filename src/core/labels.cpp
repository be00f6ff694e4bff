/* ----------------------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   Labelled configurations as extended XYZ (mltorch/labels.h). Written
   here rather than through a library: no C++ library of extended XYZ is
   packaged for Debian or PyPI's C++ world, and the dialect ASE writes is
   a dozen lines of text per frame header.
------------------------------------------------------------------------- */

#include "mltorch/labels.h"

#include "mltorch/runtime.h"    // content_hash

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <tuple>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace MLTorch {

const std::string *LabelFrame::find(const std::string &key) const
{
  for (const auto &kv : info)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

// the shortest text that reads back as the same double (std::to_chars:
// six times faster than printf's %.17g, which writing a frame spent most of
// its time in)
static void put_number(std::string &out, double v)
{
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr);
}

std::string configuration_hash(const LabelFrame &f)
{
  std::string bytes(reinterpret_cast<const char *>(f.cell), sizeof(f.cell));
  for (const auto &s : f.species) bytes += s + '\0';
  bytes.append(reinterpret_cast<const char *>(f.positions.data()),
               f.positions.size() * sizeof(double));
  return content_hash(bytes);
}

// a value as the comment line holds it: quoted when it has a space or is empty
static std::string quoted(const std::string &v)
{
  if (!v.empty() && v.find_first_of(" \t\"=") == std::string::npos) return v;
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') out += '\\';
    out += (c == '\n' ? ' ' : c);
  }
  return out + "\"";
}

std::string format_frame(const LabelFrame &f)
{
  const std::size_t n = f.natoms();
  const bool with_forces = f.forces.size() == 3 * n;
  std::string out = std::to_string(n) + "\nLattice=\"";
  for (int k = 0; k < 9; ++k) {
    if (k) out += ' ';
    put_number(out, f.cell[k]);
  }
  out += "\" Properties=species:S:1:pos:R:3";
  if (with_forces) out += ":forces:R:3";
  if (f.has_energy) {
    out += " energy=";
    put_number(out, f.energy);
  }
  if (f.has_stress) {
    out += " stress=\"";
    for (int k = 0; k < 9; ++k) {
      if (k) out += ' ';
      put_number(out, f.stress[k]);
    }
    out += '"';
  }
  out += " pbc=\"";
  for (int d = 0; d < 3; ++d) out += std::string(d ? " " : "") + (f.pbc[d] ? "T" : "F");
  out += '"';
  for (const auto &kv : f.info) out += ' ' + kv.first + '=' + quoted(kv.second);
  out += '\n';
  for (std::size_t i = 0; i < n; ++i) {
    out += f.species[i];
    for (int k = 0; k < 3; ++k) {
      out += ' ';
      put_number(out, f.positions[3 * i + k]);
    }
    if (with_forces)
      for (int k = 0; k < 3; ++k) {
        out += ' ';
        put_number(out, f.forces[3 * i + k]);
      }
    out += '\n';
  }
  return out;
}

/* ----------------------------------------------------------------------
   complete frames: a count line, a comment line and that many atom lines,
   each ending in a newline
------------------------------------------------------------------------- */

static bool count_line(const std::string &line, long long &n)
{
  std::size_t a = line.find_first_not_of(" \t\r");
  if (a == std::string::npos) return false;
  std::size_t b = line.find_last_not_of(" \t\r");
  const std::string w = line.substr(a, b - a + 1);
  if (w.empty() || w.find_first_not_of("0123456789") != std::string::npos || w.size() > 12)
    return false;
  n = std::stoll(w);
  return true;
}

static std::string file_text(const std::string &path)
{
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// the complete frames at the start of `text`
static FramesOnDisk scan_text(const std::string &text, const std::string &path)
{
  FramesOnDisk out;
  out.size = static_cast<int64_t>(text.size());
  std::size_t p = 0;
  int64_t line_no = 0;
  while (p < text.size()) {
    const std::size_t start = p;
    auto next_line = [&](std::string &line) {
      const std::size_t e = text.find('\n', p);
      if (e == std::string::npos) return false;    // no newline: a partial line
      line.assign(text, p, e - p);
      p = e + 1;
      ++line_no;
      return true;
    };
    std::string line;
    if (!next_line(line)) break;
    long long n = 0;
    if (!count_line(line, n)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos && p == text.size()) break;
      throw LabelsError(path + ": line " + std::to_string(line_no) + " (frame " +
                        std::to_string(out.frames + 1) + ") should give the atom count of a frame, "
                        "not '" + line.substr(0, 60) + "'");
    }
    bool whole = next_line(line);
    for (long long i = 0; whole && i < n; ++i) whole = next_line(line);
    if (!whole) {
      p = start;    // the partial frame a killed writer left
      break;
    }
    out.frames++;
    out.bytes = static_cast<int64_t>(p);
  }
  return out;
}

FramesOnDisk scan_frames(const std::string &path)
{
  return scan_text(file_text(path), path);
}

/* ---------------------------------------------------------------------- */

LabelWriter::LabelWriter(const std::string &path, int64_t keep_bytes, int64_t keep_frames) :
    path_(path)
{
  const std::string text = file_text(path);
  const FramesOnDisk disk = scan_text(text, path);
  int64_t keep = disk.bytes;
  if (keep_bytes >= 0) {
    // the frames the restart file counted must be there, whole
    if (disk.size < keep_bytes)
      throw LabelsError("the label file " + path + " has " + std::to_string(disk.size) +
                        " bytes, but the restart file was written when it had " +
                        std::to_string(keep_frames) + " frames in " + std::to_string(keep_bytes) +
                        " bytes: it is not this run's file, or it was cut; name another file");
    const FramesOnDisk head = scan_text(text.substr(0, static_cast<std::size_t>(keep_bytes)), path);
    if (head.frames != keep_frames || head.bytes != keep_bytes)
      throw LabelsError("the label file " + path + " does not start with the " +
                        std::to_string(keep_frames) + " frames the restart file counted (its first " +
                        std::to_string(keep_bytes) + " bytes hold " + std::to_string(head.frames) +
                        " whole frames): it is not this run's file; name another file");
    keep = keep_bytes;
    nframes = keep_frames;
  } else {
    nframes = disk.frames;
  }
  fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw LabelsError("cannot open the label file " + path + ": " + std::strerror(errno));
  if (disk.size > keep) {
    if (::ftruncate(fd, keep) != 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw LabelsError("cannot cut the label file " + path + " back to its whole frames: " + why);
    }
    cut = disk.size - keep;
  }
  if (::lseek(fd, keep, SEEK_SET) < 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    throw LabelsError("cannot append to the label file " + path + ": " + why);
  }
  nbytes = keep;
}

LabelWriter::~LabelWriter()
{
  if (fd >= 0) ::close(fd);
}

void LabelWriter::write(const LabelFrame &f)
{
  const std::string text = format_frame(f);
  const char *p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t k = ::write(fd, p, left);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      const std::string why = k < 0 ? std::strerror(errno) : "no byte written";
      // the partial frame is cut off, so the file keeps whole frames only
      if (::ftruncate(fd, nbytes) == 0) ::lseek(fd, nbytes, SEEK_SET);
      throw LabelsError("cannot write to the label file " + path_ + ": " + why);
    }
    p += k;
    left -= static_cast<std::size_t>(k);
  }
  if (::fdatasync(fd) != 0)
    throw LabelsError("cannot sync the label file " + path_ + ": " + std::strerror(errno));
  nbytes += static_cast<int64_t>(text.size());
  ++nframes;
}

/* ----------------------------------------------------------------------
   reading: ASE's extended XYZ dialect
------------------------------------------------------------------------- */

namespace {

struct Where {
  const std::string &path;
  int64_t frame, line;
  [[noreturn]] void fail(const std::string &what) const
  {
    throw LabelsError(path + ": frame " + std::to_string(frame) + " (line " + std::to_string(line) +
                      "): " + what);
  }
};

// key=value pairs of a comment line (values quoted with "" or {}, or bare)
std::vector<std::pair<std::string, std::string>> split_pairs(const std::string &s, const Where &w)
{
  std::vector<std::pair<std::string, std::string>> out;
  std::size_t p = 0;
  const std::size_t n = s.size();
  while (true) {
    while (p < n && std::isspace(static_cast<unsigned char>(s[p]))) ++p;
    if (p >= n) break;
    std::size_t k0 = p;
    while (p < n && s[p] != '=' && !std::isspace(static_cast<unsigned char>(s[p]))) ++p;
    std::string key = s.substr(k0, p - k0);
    std::string value;
    if (p < n && s[p] == '=') {
      ++p;
      if (p < n && (s[p] == '"' || s[p] == '{')) {
        const char close = s[p] == '"' ? '"' : '}';
        ++p;
        while (p < n && s[p] != close) {
          if (s[p] == '\\' && p + 1 < n) ++p;
          value += s[p++];
        }
        if (p >= n) w.fail("the value of '" + key + "' has no closing " + std::string(1, close));
        ++p;
      } else {
        const std::size_t v0 = p;
        while (p < n && !std::isspace(static_cast<unsigned char>(s[p]))) ++p;
        value = s.substr(v0, p - v0);
      }
    } else {
      value = "T";    // a bare key is a true flag
    }
    if (key.empty()) w.fail("a comment-line entry without a key");
    out.emplace_back(key, value);
  }
  return out;
}

std::vector<double> numbers(const std::string &v, const std::string &key, const Where &w)
{
  std::istringstream in(v);
  std::vector<double> out;
  std::string t;
  while (in >> t) {
    char *end = nullptr;
    const double x = std::strtod(t.c_str(), &end);
    if (end == t.c_str() || *end != '\0') w.fail("'" + key + "' holds '" + t + "', not a number");
    if (!std::isfinite(x)) w.fail("'" + key + "' holds a non-finite value (" + t + ")");
    out.push_back(x);
  }
  return out;
}

bool truth(const std::string &t)
{
  return t == "T" || t == "True" || t == "true" || t == "1";
}

}    // namespace

std::vector<LabelFrame> read_extxyz(const std::string &path)
{
  std::ifstream in(path);
  if (!in) throw LabelsError("cannot open " + path + ": " + std::strerror(errno));
  return parse_extxyz(in, path);
}

std::vector<LabelFrame> parse_extxyz(const std::string &text, const std::string &path)
{
  std::istringstream in(text);
  return parse_extxyz(in, path);
}

std::vector<LabelFrame> parse_extxyz(std::istream &in, const std::string &path)
{
  std::vector<LabelFrame> frames;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    Where w{path, static_cast<int64_t>(frames.size()) + 1, line_no};
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    long long n = 0;
    if (!count_line(line, n)) w.fail("expected the atom count of a frame, got '" + line.substr(0, 60) + "'");
    if (n == 0) w.fail("a frame of 0 atoms");
    LabelFrame f;
    if (!std::getline(in, line)) w.fail("the file ends before the comment line");
    ++line_no;
    w.line = line_no;
    bool have_lattice = false;
    // the columns: name, kind, count
    std::vector<std::tuple<std::string, char, int>> cols;
    for (const auto &kv : split_pairs(line, w)) {
      const std::string &k = kv.first, &v = kv.second;
      if (k == "Lattice") {
        const auto x = numbers(v, k, w);
        if (x.size() != 9) w.fail("Lattice has " + std::to_string(x.size()) + " values, not 9");
        std::copy(x.begin(), x.end(), f.cell);
        have_lattice = true;
      } else if (k == "Properties") {
        std::istringstream ps(v);
        std::string part;
        std::vector<std::string> parts;
        while (std::getline(ps, part, ':')) parts.push_back(part);
        if (parts.size() % 3 != 0) w.fail("Properties='" + v + "' is not name:type:count triples");
        for (std::size_t i = 0; i < parts.size(); i += 3) {
          int count = 0;
          try {
            count = std::stoi(parts[i + 2]);
          } catch (...) {
            w.fail("Properties column '" + parts[i] + "' has the count '" + parts[i + 2] + "'");
          }
          if (count < 1 || parts[i + 1].size() != 1)
            w.fail("Properties column '" + parts[i] + "' is malformed");
          cols.emplace_back(parts[i], parts[i + 1][0], count);
        }
      } else if (k == "energy") {
        const auto x = numbers(v, k, w);
        if (x.size() != 1) w.fail("energy has " + std::to_string(x.size()) + " values");
        f.energy = x[0];
        f.has_energy = true;
      } else if (k == "stress" || k == "virial") {
        const auto x = numbers(v, k, w);
        double full[9];
        if (x.size() == 9) {
          std::copy(x.begin(), x.end(), full);
        } else if (x.size() == 6) {    // Voigt: xx yy zz yz xz xy
          const double a[9] = {x[0], x[5], x[4], x[5], x[1], x[3], x[4], x[3], x[2]};
          std::copy(a, a + 9, full);
        } else {
          w.fail(k + " has " + std::to_string(x.size()) + " values, not 9 or 6");
        }
        if (k == "stress") {
          std::copy(full, full + 9, f.stress);
        } else {
          // virial (eV): stress = -virial / volume, once the cell is known
          f.info.emplace_back("__virial", v);
          std::copy(full, full + 9, f.stress);
        }
        f.has_stress = true;
      } else if (k == "pbc") {
        std::istringstream ps(v);
        std::string t;
        int d = 0;
        while (ps >> t && d < 3) f.pbc[d++] = truth(t);
        if (d != 3) w.fail("pbc has " + std::to_string(d) + " values, not 3");
      } else {
        f.info.emplace_back(k, v);
      }
    }
    if (!have_lattice) w.fail("no Lattice: a periodic cell is needed");
    if (cols.empty()) cols = {{"species", 'S', 1}, {"pos", 'R', 3}};
    int species_col = -1, pos_col = -1, forces_col = -1, ncols = 0;
    std::vector<int> start;
    for (std::size_t c = 0; c < cols.size(); ++c) {
      start.push_back(ncols);
      const auto &[name, kind, count] = cols[c];
      if (name == "species" && count == 1) species_col = static_cast<int>(c);
      if (name == "pos" && count == 3 && kind == 'R') pos_col = static_cast<int>(c);
      if ((name == "forces" || name == "force") && count == 3 && kind == 'R')
        forces_col = static_cast<int>(c);
      ncols += count;
    }
    if (species_col < 0) w.fail("Properties has no species:S:1 column");
    if (pos_col < 0) w.fail("Properties has no pos:R:3 column");
    f.species.resize(static_cast<std::size_t>(n));
    f.positions.resize(3 * static_cast<std::size_t>(n));
    if (forces_col >= 0) f.forces.resize(3 * static_cast<std::size_t>(n));
    for (long long i = 0; i < n; ++i) {
      if (!std::getline(in, line))
        w.fail("the file ends after " + std::to_string(i) + " of the frame's " + std::to_string(n) +
               " atoms");
      ++line_no;
      w.line = line_no;
      std::istringstream ls(line);
      std::vector<std::string> t;
      std::string x;
      while (ls >> x) t.push_back(x);
      if (static_cast<int>(t.size()) < ncols)
        w.fail("an atom line has " + std::to_string(t.size()) + " columns where Properties has " +
               std::to_string(ncols));
      f.species[i] = t[start[species_col]];
      for (int k = 0; k < 3; ++k) {
        f.positions[3 * i + k] = numbers(t[start[pos_col] + k], "pos", w)[0];
        if (forces_col >= 0) f.forces[3 * i + k] = numbers(t[start[forces_col] + k], "forces", w)[0];
      }
    }
    // a virial given instead of a stress: stress = -virial / volume
    for (auto it = f.info.begin(); it != f.info.end(); ++it)
      if (it->first == "__virial") {
        const double *h = f.cell;
        const double vol = std::fabs(h[0] * (h[4] * h[8] - h[5] * h[7]) -
                                     h[1] * (h[3] * h[8] - h[5] * h[6]) +
                                     h[2] * (h[3] * h[7] - h[4] * h[6]));
        if (!(vol > 0)) w.fail("a virial with a cell of zero volume");
        for (double &s : f.stress) s = -s / vol;
        f.info.erase(it);
        break;
      }
    frames.push_back(std::move(f));
  }
  return frames;
}

}    // namespace MLTorch
