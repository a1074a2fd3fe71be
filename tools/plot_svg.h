// A small SVG line chart for `lockstep grpo --plot`: one panel per metric (reward, mismatches),
// one line per run (lockstep, and a second run such as --baseline's), axes with tick labels.
#pragma once

#include <string>
#include <vector>

namespace lockstep::tools {

struct PlotSeries {
  std::string label;
  std::vector<double> x, y;
};

struct PlotPanel {
  std::string title;
  std::vector<PlotSeries> series;
};

// Writes the panels side by side as an SVG document to `path` (atomically); throws
// lockstep::Error on a write error.
void write_svg_plot(const std::string& path, const std::string& title,
                    const std::vector<PlotPanel>& panels);

}  // namespace lockstep::tools
