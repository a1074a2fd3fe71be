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

// `path` ends in ".png" (any case).
bool is_png_path(const std::string& path);
// Throws lockstep::Error naming the fix unless `rsvg-convert` (Debian: librsvg2-bin, installed by
// scripts/setup.sh) runs: a PNG plot is the SVG rasterized by it. Called before a long run.
void check_png_plot_tool(const char* op);
// The same chart as a PNG at `path`: the SVG rasterized by rsvg-convert, written to a temporary
// file and renamed (atomic); throws lockstep::Error if the tool fails.
void write_png_plot(const std::string& path, const std::string& title,
                    const std::vector<PlotPanel>& panels);

}  // namespace lockstep::tools
