#include "tools/mask_svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "compiler/pattern/pattern_stats.hpp"
#include "compiler/support/error.hpp"

namespace attnjit::cli {
namespace {

constexpr int kCellPx = 3;
// Cells of up to this many query rows are exact; taller ones sample this many rows, at phases
// that vary from sample to sample so dilated rows (every r-th) are not all skipped or all hit.
constexpr int64_t kRowsPerCell = 64;

// Fraction of attended pairs per cell (a key counted twice by two branches shows darker: the
// value is the mean count, clamped to 1 only for colouring).
std::vector<double> cell_density(const MaskContext& c, int64_t h, int64_t rows, int64_t cols) {
  const Shape& s = c.shape;
  std::vector<double> sum(static_cast<size_t>(rows * cols), 0.0);
  std::vector<int64_t> sampled(static_cast<size_t>(rows), 0);
  std::vector<double> row_bins(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i0 = r * s.seq_q / rows, i1 = (r + 1) * s.seq_q / rows;
    const int64_t step = std::max<int64_t>(1, (i1 - i0) / kRowsPerCell);
    for (int64_t n = 0; i0 + n * step < i1; ++n) {
      const int64_t i = std::min(i1 - 1, i0 + n * step + (n * 7919) % step);
      ++sampled[static_cast<size_t>(r)];
      for (size_t b = 0; b < c.pattern.branches.size(); ++b) {
        for_each_branch_key(c, b, h, i, [&](int64_t j) { sum[static_cast<size_t>(r * cols + j * cols / s.seq_k)] += 1.0; });
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t col = 0; col < cols; ++col) {
      const int64_t width = (col + 1) * s.seq_k / cols - col * s.seq_k / cols;
      sum[static_cast<size_t>(r * cols + col)] /= static_cast<double>(sampled[static_cast<size_t>(r)] * width);
    }
  }
  return sum;
}

std::string shade(double v) {
  // White (nothing) through blue (every pair); a pair counted twice saturates to dark blue.
  // 16 levels keep runs of equal colour long, and the file small.
  const double t = std::ceil(std::min(1.0, v) * 16.0) / 16.0;
  char buf[16];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", static_cast<int>(255 - 225 * t), static_cast<int>(255 - 165 * t),
                static_cast<int>(255 - 75 * t));
  return buf;
}

}  // namespace

void write_mask_svg(const MaskContext& c, const std::vector<int64_t>& heads, const std::string& path, int64_t max_cells) {
  const Shape& s = c.shape;
  const int64_t rows = std::min(s.seq_q, max_cells), cols = std::min(s.seq_k, max_cells);
  const int panel_w = static_cast<int>(cols) * kCellPx, panel_h = static_cast<int>(rows) * kCellPx;
  const int gap = 24, top = 40;
  const int width = static_cast<int>(heads.size()) * (panel_w + gap) + gap, height = panel_h + top + 36;
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg << "<text x=\"" << gap << "\" y=\"16\">attnjit mask: seq_q=" << s.seq_q << " seq_k=" << s.seq_k
      << " q_offset=" << s.q_offset << " k_offset=" << s.k_offset << " (rows: queries, columns: keys)</text>\n";
  const PatternStats stats = pattern_stats(c);
  for (size_t n = 0; n < heads.size(); ++n) {
    const int x0 = gap + static_cast<int>(n) * (panel_w + gap);
    const std::vector<double> d = cell_density(c, heads[n], rows, cols);
    svg << "<text x=\"" << x0 << "\" y=\"" << top - 6 << "\">head " << heads[n] << "</text>\n";
    svg << "<g transform=\"translate(" << x0 << "," << top << ")\">\n";
    for (int64_t r = 0; r < rows; ++r) {
      // Runs of equal shade become one rectangle, which keeps the file small.
      for (int64_t col = 0; col < cols;) {
        const double v = d[static_cast<size_t>(r * cols + col)];
        int64_t end = col + 1;
        while (end < cols && shade(d[static_cast<size_t>(r * cols + end)]) == shade(v)) ++end;
        if (v > 0.0) {
          svg << "<rect x=\"" << col * kCellPx << "\" y=\"" << r * kCellPx << "\" width=\"" << (end - col) * kCellPx
              << "\" height=\"" << kCellPx << "\" fill=\"" << shade(v) << "\"/>\n";
        }
        col = end;
      }
    }
    svg << "<rect width=\"" << panel_w << "\" height=\"" << panel_h << "\" fill=\"none\" stroke=\"#444\"/>\n</g>\n";
    char dens[64];
    const double pairs = static_cast<double>(stats.pairs_per_head[static_cast<size_t>(heads[n])]);
    std::snprintf(dens, sizeof dens, "density %.3f%%", 100.0 * pairs / (static_cast<double>(s.seq_q) * s.seq_k));
    svg << "<text x=\"" << x0 << "\" y=\"" << top + panel_h + 18 << "\">" << dens << "</text>\n";
  }
  svg << "</svg>\n";
  std::ofstream out(path);
  if (!out) throw UserError(path, "cannot write the picture; check that the directory exists and is writable");
  out << svg.str();
}

}  // namespace attnjit::cli
