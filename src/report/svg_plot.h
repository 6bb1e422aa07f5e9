// Small inline-SVG charts for `moetrain report`: line charts, stacked bars, a histogram and a
// heatmap, each returned as one <svg class="plot"> element with no script, font or link outside
// it. Every drawn data element carries class="d", so a check of the page can tell a plot that
// drew something from an empty frame; a chart with no finite data throws instead of drawing an
// empty frame (the report says in a line that the section has no data).
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace moe::report::svg {

struct Axes {
  std::string title, x_label, y_label;
  bool y_from_zero = false;  // include 0 in the y range (rates, shares, counts)
  bool log_y = false;        // log10 y axis (positive values only)
  int width = 900, height = 300;
};

struct Series {
  std::string name;
  std::vector<double> x, y;  // same length; non-finite points are left out (a gap in the line)
  bool markers = false;      // draw a dot per point (sparse series such as validation loss)
  bool line = true;
};

// A vertical marker line at x with a label (e.g. p50 / p95 on a histogram).
struct Mark {
  std::string label;
  double x = 0;
};

std::string line_chart(const Axes& a, const std::vector<Series>& series, const std::vector<Mark>& marks = {});

// One bar per group, its parts stacked in the order of part_names.
struct Bar {
  std::string label;
  std::vector<double> parts;
};
std::string stacked_bars(const Axes& a, const std::vector<std::string>& part_names, const std::vector<Bar>& bars);

// Histogram of values over `bins` equal bins between their min and max.
std::string histogram(const Axes& a, const std::vector<double>& values, int bins, const std::vector<Mark>& marks = {});

// Heatmap: cell (r, c) coloured by value_RC[r][c] on a diverging scale centred on `centre`
// (log2 of value/centre clamped to +-1: blue below, white at, red above). Rows are labelled by
// row_labels (every label drawn when they fit, else every n-th); the columns span [x0, x1] on the
// x axis. Rows in groups: a thin line is drawn above every row index in group_starts.
struct Heatmap {
  std::vector<std::string> row_labels;
  std::vector<std::vector<double>> value_RC;
  double x0 = 0, x1 = 1;
  double centre = 1;
  std::vector<int> group_starts;
  std::string legend_low, legend_high;  // words at the ends of the colour bar
};
std::string heatmap(const Axes& a, const Heatmap& h);

std::string escape(const std::string& s);  // & < > " for text and attributes
// Numbers as a reader wants them on an axis: 1234567 -> "1.23M", 0.000123 -> "0.000123".
std::string format_number(double v);

}  // namespace moe::report::svg
