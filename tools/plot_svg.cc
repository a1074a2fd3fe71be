// tools/plot_svg.h.
#include "tools/plot_svg.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "engine/file_io.h"
#include "lockstep/error.h"

extern char** environ;

namespace lockstep::tools {
namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else
      o += c;
  }
  return o;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};

}  // namespace

void write_svg_plot(const std::string& path, const std::string& title,
                    const std::vector<PlotPanel>& panels) {
  const double pw = 420, ph = 300, ml = 60, mr = 20, mt = 40, mb = 45;
  const double W = pw * double(panels.size()), H = ph + 30;
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
       "fill=\"white\"/>\n<text x=\""
    << W / 2 << "\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">" << esc(title) << "</text>\n";
  for (size_t p = 0; p < panels.size(); ++p) {
    const PlotPanel& pan = panels[p];
    const double x0 = pw * double(p) + ml, x1 = pw * double(p + 1) - mr, y0 = ph - mb + 30,
                 y1 = mt + 20;
    double xmin = 1e300, xmax = -1e300, ymin = 0, ymax = -1e300;
    for (const PlotSeries& s : pan.series)
      for (size_t i = 0; i < s.x.size(); ++i) {
        xmin = std::min(xmin, s.x[i]);
        xmax = std::max(xmax, s.x[i]);
        ymin = std::min(ymin, s.y[i]);
        ymax = std::max(ymax, s.y[i]);
      }
    if (!(xmax > xmin)) xmax = xmin + 1;
    if (!(ymax > ymin)) ymax = ymin + 1;
    auto X = [&](double v) { return x0 + (v - xmin) / (xmax - xmin) * (x1 - x0); };
    auto Y = [&](double v) { return y0 - (v - ymin) / (ymax - ymin) * (y0 - y1); };
    o << "<text x=\"" << (x0 + x1) / 2 << "\" y=\"" << y1 - 12
      << "\" text-anchor=\"middle\" font-weight=\"bold\">" << esc(pan.title) << "</text>\n";
    o << "<line x1=\"" << x0 << "\" y1=\"" << y0 << "\" x2=\"" << x1 << "\" y2=\"" << y0
      << "\" stroke=\"black\"/><line x1=\"" << x0 << "\" y1=\"" << y0 << "\" x2=\"" << x0
      << "\" y2=\"" << y1 << "\" stroke=\"black\"/>\n";
    for (int t = 0; t <= 4; ++t) {
      const double yv = ymin + (ymax - ymin) * t / 4, xv = xmin + (xmax - xmin) * t / 4;
      o << "<text x=\"" << x0 - 6 << "\" y=\"" << Y(yv) + 4 << "\" text-anchor=\"end\">" << num(yv)
        << "</text><line x1=\"" << x0 << "\" y1=\"" << Y(yv) << "\" x2=\"" << x1 << "\" y2=\""
        << Y(yv) << "\" stroke=\"#ddd\"/>\n";
      o << "<text x=\"" << X(xv) << "\" y=\"" << y0 + 16 << "\" text-anchor=\"middle\">"
        << num(std::round(xv)) << "</text>\n";
    }
    o << "<text x=\"" << (x0 + x1) / 2 << "\" y=\"" << y0 + 32
      << "\" text-anchor=\"middle\">step</text>\n";
    for (size_t k = 0; k < pan.series.size(); ++k) {
      const PlotSeries& s = pan.series[k];
      const char* c = kColors[k % 4];
      o << "<polyline fill=\"none\" stroke=\"" << c << "\" stroke-width=\"2\" points=\"";
      for (size_t i = 0; i < s.x.size(); ++i) o << X(s.x[i]) << "," << Y(s.y[i]) << " ";
      o << "\"/>\n<text x=\"" << x1 - 4 << "\" y=\"" << y1 + 14 + 14 * double(k)
        << "\" text-anchor=\"end\" fill=\"" << c << "\">" << esc(s.label) << "</text>\n";
    }
  }
  o << "</svg>\n";
  const std::string svg = o.str();
  engine::write_file_atomic(path, svg.data(), svg.size());
}

namespace {

// Runs argv (searched in PATH) with stdin / stdout / stderr inherited; its exit status, or -1 when
// it could not be started.
int run_tool(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  // Quiet: the tool's own messages are replaced by ours.
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  const int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

bool is_png_path(const std::string& path) {
  if (path.size() < 4) return false;
  std::string ext = path.substr(path.size() - 4);
  for (char& c : ext) c = char(std::tolower(static_cast<unsigned char>(c)));
  return ext == ".png";
}

void check_png_plot_tool(const char* op) {
  LS_CHECK(run_tool({"rsvg-convert", "--version"}) == 0, op,
           "a .png plot is rasterized by rsvg-convert, which is not installed (apt-get install "
           "librsvg2-bin, or scripts/setup.sh); or write an SVG: --plot FILE.svg");
}

void write_png_plot(const std::string& path, const std::string& title,
                    const std::vector<PlotPanel>& panels) {
  const std::string svg = path + ".tmp.svg", png = path + ".tmp.png";
  write_svg_plot(svg, title, panels);
  const int rc = run_tool({"rsvg-convert", "--format", "png", "--output", png, svg});
  std::error_code ec;
  std::filesystem::remove(svg, ec);
  if (rc != 0) std::filesystem::remove(png, ec);
  LS_CHECK(rc == 0, "write_png_plot", "rsvg-convert failed (exit ", rc,
           ") rasterizing the plot for ", path);
  std::filesystem::rename(png, path, ec);
  LS_CHECK(!ec, "write_png_plot", "cannot rename ", png, " to ", path, ": ", ec.message());
}

}  // namespace lockstep::tools
