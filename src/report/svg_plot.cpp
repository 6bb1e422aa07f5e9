// Inline-SVG charts. See svg_plot.h.
#include "report/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"

namespace moe::report::svg {

namespace {

constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                    "#9467bd", "#8c564b", "#e377c2", "#17becf"};
constexpr int kPaletteSize = 8;
// Plot area inside the svg: margins for tick labels (left, bottom), title (top), legend (right).
constexpr int kLeft = 72, kRight = 170, kTop = 30, kBottom = 46;

std::string num(double v) {  // coordinates: one decimal is enough at screen resolution
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return !(lo <= hi); }
  // A range of positive width: a flat series gets +-5% (or +-1 around 0).
  void widen() {
    if (hi > lo) return;
    const double d = lo == 0 ? 1 : std::fabs(lo) * 0.05;
    lo -= d;
    hi += d;
  }
};

// Tick positions at 1, 2 or 5 times a power of ten, about n of them over [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int n) {
  const double raw = (hi - lo) / std::max(1, n);
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  double step = p;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) {
      step = m * p;
      break;
    }
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9 && t.size() < 50; v += step)
    t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

// Maps data coordinates to the plot area.
struct Frame {
  Axes a;
  Range x, y;
  double px0() const { return kLeft; }
  double px1() const { return a.width - kRight; }
  double py0() const { return a.height - kBottom; }  // bottom
  double py1() const { return kTop; }
  double yv(double v) const { return a.log_y ? std::log10(v) : v; }
  double sx(double v) const { return px0() + (v - x.lo) / (x.hi - x.lo) * (px1() - px0()); }
  double sy(double v) const { return py0() - (yv(v) - y.lo) / (y.hi - y.lo) * (py0() - py1()); }
};

std::string open_svg(const Axes& a) {
  return str_cat("<svg class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"", a.width, "\" height=\"",
                 a.height, "\" viewBox=\"0 0 ", a.width, " ", a.height,
                 "\" font-family=\"sans-serif\" font-size=\"11\">\n<text x=\"", kLeft,
                 "\" y=\"18\" font-size=\"13\" font-weight=\"bold\">", escape(a.title), "</text>\n");
}

// Axes, grid lines, tick labels and axis labels of a frame (x ticks optional: bars label groups).
std::string axes(const Frame& f, bool x_ticks = true, bool y_ticks = true) {
  std::string s;
  const double pw = f.px1() - f.px0();
  if (x_ticks) {
    for (double t : nice_ticks(f.x.lo, f.x.hi, std::max(2, static_cast<int>(pw / 90)))) {
      const double X = f.sx(t);
      s += str_cat("<line x1=\"", num(X), "\" y1=\"", num(f.py0()), "\" x2=\"", num(X), "\" y2=\"", num(f.py0() + 4),
                   "\" stroke=\"#444\"/><text x=\"", num(X), "\" y=\"", num(f.py0() + 16),
                   "\" text-anchor=\"middle\">", format_number(t), "</text>\n");
    }
  }
  std::vector<double> yt;
  if (f.a.log_y) {
    for (double e = std::floor(f.y.lo); e <= std::ceil(f.y.hi); e += 1)
      if (e >= f.y.lo - 1e-9 && e <= f.y.hi + 1e-9) yt.push_back(std::pow(10.0, e));
    if (yt.size() < 2) yt.clear();
  }
  if (yt.empty() && y_ticks) {
    for (double t : nice_ticks(f.y.lo, f.y.hi, 5)) yt.push_back(f.a.log_y ? std::pow(10.0, t) : t);
  }
  for (double t : yt) {
    const double Y = f.sy(t);
    s += str_cat("<line x1=\"", num(f.px0()), "\" y1=\"", num(Y), "\" x2=\"", num(f.px1()), "\" y2=\"", num(Y),
                 "\" stroke=\"#e4e4e4\"/><text x=\"", num(f.px0() - 6), "\" y=\"", num(Y + 4),
                 "\" text-anchor=\"end\">", format_number(t), "</text>\n");
  }
  s += str_cat("<rect x=\"", num(f.px0()), "\" y=\"", num(f.py1()), "\" width=\"", num(pw), "\" height=\"",
               num(f.py0() - f.py1()), "\" fill=\"none\" stroke=\"#444\"/>\n");
  s += str_cat("<text x=\"", num((f.px0() + f.px1()) / 2), "\" y=\"", f.a.height - 8, "\" text-anchor=\"middle\">",
               escape(f.a.x_label), "</text>\n");
  s += str_cat("<text transform=\"translate(14,", num((f.py0() + f.py1()) / 2), ") rotate(-90)\" text-anchor=\"middle\">",
               escape(f.a.y_label), "</text>\n");
  return s;
}

std::string legend(const Axes& a, const std::vector<std::string>& names) {
  std::string s;
  const double x = a.width - kRight + 12;
  for (size_t i = 0; i < names.size() && i < 16; ++i) {
    const double y = kTop + 8 + 16.0 * static_cast<double>(i);
    s += str_cat("<rect x=\"", num(x), "\" y=\"", num(y - 8), "\" width=\"12\" height=\"10\" fill=\"",
                 kPalette[i % kPaletteSize], "\"/><text x=\"", num(x + 17), "\" y=\"", num(y + 1), "\">",
                 escape(names[i]), "</text>\n");
  }
  return s;
}

void require_finite_data(bool any, const Axes& a) {
  MOE_CHECK(any, "plot '", a.title, "': no finite data to draw");
}

}  // namespace

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string format_number(double v) {
  if (!std::isfinite(v)) return "n/a";
  const double a = std::fabs(v);
  char b[32];
  const char* suffix[] = {"", "k", "M", "G", "T", "P"};
  if (a >= 1e4) {
    int i = 0;
    double x = v;
    while (std::fabs(x) >= 1000 && i < 5) {
      x /= 1000;
      ++i;
    }
    std::snprintf(b, sizeof b, "%.3g%s", x, suffix[i]);
  } else {
    std::snprintf(b, sizeof b, "%.4g", v);
  }
  return b;
}

std::string line_chart(const Axes& a, const std::vector<Series>& series, const std::vector<Mark>& marks) {
  Frame f{a, {}, {}};
  bool any = false;
  for (const Series& s : series) {
    MOE_CHECK(s.x.size() == s.y.size(), "plot '", a.title, "': series '", s.name, "' has ", s.x.size(), " x and ",
              s.y.size(), " y values");
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i]) || (a.log_y && s.y[i] <= 0)) continue;
      f.x.add(s.x[i]);
      f.y.add(f.yv(s.y[i]));
      any = true;
    }
  }
  require_finite_data(any, a);
  for (const Mark& m : marks) f.x.add(m.x);
  if (a.y_from_zero && !a.log_y) f.y.add(0);
  f.x.widen();
  f.y.widen();
  if (!a.log_y) {  // 4% headroom so a line at the top of the range stays visible
    const double pad = (f.y.hi - f.y.lo) * 0.04;
    f.y.hi += pad;
    if (!(a.y_from_zero && f.y.lo == 0)) f.y.lo -= pad;
  }
  std::string out = open_svg(a) + axes(f);
  std::vector<std::string> names;
  for (size_t si = 0; si < series.size(); ++si) {
    const Series& s = series[si];
    const char* colour = kPalette[si % kPaletteSize];
    names.push_back(s.name);
    std::string path;
    bool pen_down = false;
    std::string dots;
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i]) || (a.log_y && s.y[i] <= 0)) {
        pen_down = pen_down && s.markers;  // a gap, except in a sparse series (dots joined)
        continue;
      }
      const double X = f.sx(s.x[i]), Y = f.sy(s.y[i]);
      path += str_cat(pen_down ? "L" : "M", num(X), " ", num(Y), " ");
      pen_down = true;
      if (s.markers) dots += str_cat("<circle class=\"d\" cx=\"", num(X), "\" cy=\"", num(Y), "\" r=\"4\" fill=\"", colour, "\"/>");
    }
    if (s.line && !path.empty())
      out += str_cat("<path class=\"d\" d=\"", path, "\" fill=\"none\" stroke=\"", colour,
                     "\" stroke-width=\"1.4\" stroke-linejoin=\"round\"/>\n");
    out += dots;
  }
  for (const Mark& m : marks) {
    const double X = f.sx(m.x);
    out += str_cat("<line x1=\"", num(X), "\" y1=\"", num(f.py1()), "\" x2=\"", num(X), "\" y2=\"", num(f.py0()),
                   "\" stroke=\"#333\" stroke-dasharray=\"4 3\"/><text x=\"", num(X + 3), "\" y=\"", num(f.py1() + 12),
                   "\">", escape(m.label), "</text>\n");
  }
  return out + legend(a, names) + "</svg>\n";
}

std::string stacked_bars(const Axes& a, const std::vector<std::string>& part_names, const std::vector<Bar>& bars) {
  Frame f{a, {}, {}};
  bool any = false;
  f.y.add(0);
  for (const Bar& b : bars) {
    double sum = 0;
    for (double p : b.parts)
      if (std::isfinite(p) && p > 0) sum += p, any = true;
    f.y.add(sum);
  }
  require_finite_data(any, a);
  f.y.widen();
  f.y.hi *= 1.04;
  f.x = Range{0, static_cast<double>(bars.size())};
  std::string out = open_svg(a) + axes(f, /*x_ticks=*/false);
  const double slot = (f.px1() - f.px0()) / static_cast<double>(bars.size());
  for (size_t i = 0; i < bars.size(); ++i) {
    const double X = f.px0() + slot * (static_cast<double>(i) + 0.15), W = slot * 0.7;
    double base = 0;
    for (size_t p = 0; p < bars[i].parts.size(); ++p) {
      const double v = bars[i].parts[p];
      if (!std::isfinite(v) || v <= 0) continue;
      const double y_top = f.sy(base + v), y_bot = f.sy(base);
      out += str_cat("<rect class=\"d\" x=\"", num(X), "\" y=\"", num(y_top), "\" width=\"", num(W), "\" height=\"",
                     num(std::max(0.5, y_bot - y_top)), "\" fill=\"", kPalette[p % kPaletteSize], "\"><title>",
                     escape(bars[i].label), " ", escape(p < part_names.size() ? part_names[p] : ""), ": ",
                     format_number(v), "</title></rect>\n");
      base += v;
    }
    out += str_cat("<text x=\"", num(X + W / 2), "\" y=\"", num(f.py0() + 16), "\" text-anchor=\"middle\">",
                   escape(bars[i].label), "</text>\n");
  }
  return out + legend(a, part_names) + "</svg>\n";
}

std::string histogram(const Axes& a, const std::vector<double>& values, int bins, const std::vector<Mark>& marks) {
  Range r;
  for (double v : values) r.add(v);
  require_finite_data(!r.empty() && bins > 0, a);
  r.widen();
  std::vector<double> count(static_cast<size_t>(bins), 0);
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    int b = static_cast<int>((v - r.lo) / (r.hi - r.lo) * bins);
    count[static_cast<size_t>(std::clamp(b, 0, bins - 1))] += 1;
  }
  Frame f{a, r, {}};
  f.y.add(0);
  for (double c : count) f.y.add(c);
  f.y.hi *= 1.06;
  std::string out = open_svg(a) + axes(f);
  const double w = (r.hi - r.lo) / bins;
  for (int b = 0; b < bins; ++b) {
    const double c = count[static_cast<size_t>(b)];
    if (c <= 0) continue;
    const double X0 = f.sx(r.lo + w * b), X1 = f.sx(r.lo + w * (b + 1));
    out += str_cat("<rect class=\"d\" x=\"", num(X0), "\" y=\"", num(f.sy(c)), "\" width=\"", num(std::max(0.5, X1 - X0 - 1)),
                   "\" height=\"", num(f.py0() - f.sy(c)), "\" fill=\"", kPalette[0], "\"/>\n");
  }
  for (const Mark& m : marks) {
    if (!(m.x >= r.lo && m.x <= r.hi)) continue;
    const double X = f.sx(m.x);
    out += str_cat("<line x1=\"", num(X), "\" y1=\"", num(f.py1()), "\" x2=\"", num(X), "\" y2=\"", num(f.py0()),
                   "\" stroke=\"#d62728\" stroke-dasharray=\"4 3\"/><text x=\"", num(X + 3), "\" y=\"", num(f.py1() + 12),
                   "\" fill=\"#d62728\">", escape(m.label), "</text>\n");
  }
  return out + "</svg>\n";
}

namespace {
// Diverging colour for t in [-1, 1]: blue (-1) .. white (0) .. red (+1).
std::string diverging(double t) {
  t = std::clamp(t, -1.0, 1.0);
  int r, g, b;
  if (t >= 0) {
    r = 255;
    g = static_cast<int>(255 - t * (255 - 40));
    b = static_cast<int>(255 - t * (255 - 40));
  } else {
    r = static_cast<int>(255 + t * (255 - 30));
    g = static_cast<int>(255 + t * (255 - 90));
    b = 255;
  }
  char s[8];
  std::snprintf(s, sizeof s, "#%02x%02x%02x", r, g, b);
  return s;
}
}  // namespace

std::string heatmap(const Axes& a, const Heatmap& h) {
  const size_t R = h.value_RC.size();
  const size_t C = R ? h.value_RC[0].size() : 0;
  bool any = false;
  for (const auto& row : h.value_RC) {
    MOE_CHECK(row.size() == C, "plot '", a.title, "': heatmap rows of different lengths");
    for (double v : row) any = any || std::isfinite(v);
  }
  require_finite_data(any && C > 0, a);
  Axes a2 = a;
  // Rows at least 3 px (labels readable from 10 px up), the plot grows to fit them.
  const double row_px = std::max(3.0, std::min(14.0, 600.0 / static_cast<double>(R)));
  a2.height = static_cast<int>(kTop + kBottom + row_px * static_cast<double>(R));
  Frame f{a2, {h.x0, h.x1}, {0, static_cast<double>(R)}};
  f.x.widen();
  std::string out = open_svg(a2) + axes(f, /*x_ticks=*/true, /*y_ticks=*/false);
  const double cw = (f.px1() - f.px0()) / static_cast<double>(C);
  for (size_t r = 0; r < R; ++r) {
    const double Y = f.py1() + row_px * static_cast<double>(r);
    for (size_t c = 0; c < C; ++c) {
      const double v = h.value_RC[r][c];
      if (!std::isfinite(v)) continue;
      const double t = v > 0 && h.centre > 0 ? std::log2(v / h.centre) : -1.0;
      out += str_cat("<rect class=\"d\" x=\"", num(f.px0() + cw * static_cast<double>(c)), "\" y=\"", num(Y),
                     "\" width=\"", num(cw + 0.3), "\" height=\"", num(row_px + 0.3), "\" fill=\"", diverging(t), "\"/>");
    }
    out += "\n";
  }
  const size_t every = static_cast<size_t>(std::ceil(10.0 / row_px));
  for (size_t r = 0; r < R && r < h.row_labels.size(); r += every)
    out += str_cat("<text x=\"", num(f.px0() - 4), "\" y=\"", num(f.py1() + row_px * (static_cast<double>(r) + 0.5) + 3.5),
                   "\" text-anchor=\"end\" font-size=\"9\">", escape(h.row_labels[r]), "</text>\n");
  for (int g : h.group_starts) {
    if (g <= 0 || static_cast<size_t>(g) >= R) continue;
    const double Y = f.py1() + row_px * g;
    out += str_cat("<line x1=\"", num(f.px0()), "\" y1=\"", num(Y), "\" x2=\"", num(f.px1()), "\" y2=\"", num(Y),
                   "\" stroke=\"#000\" stroke-width=\"1\"/>\n");
  }
  // Colour bar: value/centre from 1/2 to 2.
  const double bx = a2.width - kRight + 20, by = kTop + 10, bh = 120;
  for (int i = 0; i < 24; ++i) {
    const double t = 1.0 - 2.0 * i / 23.0;
    out += str_cat("<rect x=\"", num(bx), "\" y=\"", num(by + bh * i / 24.0), "\" width=\"14\" height=\"", num(bh / 24.0 + 0.5),
                   "\" fill=\"", diverging(t), "\"/>");
  }
  out += str_cat("<rect x=\"", num(bx), "\" y=\"", num(by), "\" width=\"14\" height=\"", num(bh),
                 "\" fill=\"none\" stroke=\"#444\"/>\n<text x=\"", num(bx + 18), "\" y=\"", num(by + 8), "\">",
                 escape(h.legend_high), "</text><text x=\"", num(bx + 18), "\" y=\"", num(by + bh / 2 + 4),
                 "\">", format_number(h.centre), " (even)</text><text x=\"", num(bx + 18), "\" y=\"", num(by + bh), "\">",
                 escape(h.legend_low), "</text>\n");
  return out + "</svg>\n";
}

}  // namespace moe::report::svg
